"""The predictor interface and its registry.

A predictor forecasts each worker's speed (samples/s) one iteration ahead. It is vectorised
over workers: the coordinator holds one predictor for the whole job and calls
:meth:`Predictor.observe` once per iteration with every worker's observation, then
:meth:`Predictor.predict`. Trace replay (``mxlbbsp predict``) uses ``num_workers=1`` per rank.

Inputs per iteration t:
    speed[i]    observed speed of worker i at t (samples/s of its compute phase)
    exog[i, :]  exogenous inputs observed at the end of t on worker i's host, at least
                (cpu_percent, mem_percent), possibly more columns
Output:
    predict()[i]  forecast of speed[i] at t+1; NaN before the first observation
"""
from __future__ import annotations

import abc
from typing import Callable, ClassVar, Dict, List, Sequence, Tuple, Type

import numpy as np

from mxlbbsp.core.store import load_object_state, object_state


class Predictor(abc.ABC):
    """One-step-ahead speed forecaster for ``num_workers`` workers."""

    name: ClassVar[str] = ""
    #: worker i's forecasts never depend on worker j's inputs, bit for bit: a predictor over
    #: some of the workers forecasts for them what one over all of them does, so a host's
    #: relay may forecast its own workers (tests/test_predictors.py checks it for each)
    separable: ClassVar[bool] = False

    def __init__(self, num_workers: int, num_exog: int = 2):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.num_workers = int(num_workers)
        self.num_exog = int(num_exog)
        #: per worker: how many predictions fell back to a simpler rule (NaN, absurd value)
        self.fallbacks = np.zeros(self.num_workers, dtype=np.int64)

    @abc.abstractmethod
    def observe(self, speed: np.ndarray, exog: np.ndarray) -> None:
        """Record iteration t: ``speed`` has shape (n,), ``exog`` shape (n, num_exog)."""

    @abc.abstractmethod
    def predict(self) -> np.ndarray:
        """Forecast of each worker's speed at t+1, shape (n,)."""

    def learn(self) -> None:
        """Work that may wait until the forecast has been used (e.g. a training step).

        The coordinator calls it after it has sent the split, so that training is off
        the path from the last report to the broadcast. A predictor must give the same
        forecasts whether or not its caller calls it (the next ``observe`` does what is left).
        """

    def state_dict(self) -> dict:
        """The learned state, JSON-serialisable (checkpoints): every numpy array, number and
        random generator among the attributes. A predictor with other state overrides this
        and :meth:`load_state_dict`."""
        return object_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (same class, same number of workers)."""
        load_object_state(self, state)

    def _check(self, speed, exog):
        speed = np.asarray(speed, dtype=float).reshape(self.num_workers)
        exog = np.asarray(exog, dtype=float).reshape(self.num_workers, -1)
        return speed, exog


# ---- a separable predictor's state, cut by workers and joined again -----------------------

_AXES: Dict[Tuple[str, int], Dict[str, int]] = {}


def worker_axes(name: str, num_exog: int) -> Dict[str, int]:
    """Per array of predictor ``name``'s state that is per worker, the axis of the workers:
    the axis whose length differs between a predictor of one and one of two workers (the
    other arrays and numbers are the same for every worker: counters, the memory's ages)."""
    key = (name, num_exog)
    got = _AXES.get(key)
    if got is None:
        one, two = create(name, 1, num_exog), create(name, 2, num_exog)
        got = {}
        for attr, value in vars(one).items():
            if isinstance(value, np.ndarray):
                other = getattr(two, attr)
                axes = [i for i, (a, b) in enumerate(zip(value.shape, other.shape)) if a != b]
                if axes:
                    got[attr] = axes[0]
        got = _AXES[key] = got
    return got


def state_of_workers(name: str, num_exog: int, state: dict, index: Sequence[int]) -> dict:
    """The part of a separable predictor's :meth:`~Predictor.state_dict` (over n workers)
    that is workers ``index``'s: what a predictor over those workers alone would hold."""
    axes = worker_axes(name, num_exog)
    out = {}
    for attr, entry in state.items():
        if attr in axes and "array" in entry:
            part = np.array(entry["array"], dtype=np.dtype(entry["dtype"]))
            entry = {"array": part.take(np.asarray(index, dtype=np.intp), axes[attr]).tolist(),
                     "dtype": entry["dtype"]}
        elif attr == "num_workers":
            entry = {"value": len(index)}
        out[attr] = entry
    return out


def join_states(name: str, num_exog: int, n: int,
                parts: List[Tuple[Sequence[int], dict]]) -> dict:
    """The state of one predictor over n workers from its parts ``(index, state)``
    (:func:`state_of_workers` undone); the per-worker arrays must cover every worker once,
    the rest is taken from the first part (every part holds the same)."""
    axes = worker_axes(name, num_exog)
    covered = np.zeros(n, dtype=np.int64)
    for index, _ in parts:
        covered[np.asarray(index, dtype=np.intp)] += 1
    if len(parts) == 0 or not (covered == 1).all():
        raise ValueError("the parts of a predictor's state do not cover every worker once")
    out = dict(parts[0][1])
    out["num_workers"] = {"value": n}
    for attr, axis in axes.items():
        if attr not in out or "array" not in out[attr]:
            continue
        dtype = out[attr]["dtype"]
        pieces = [np.array(state[attr]["array"], dtype=np.dtype(dtype)) for _, state in parts]
        shape = list(pieces[0].shape)
        shape[axis] = n
        whole = np.empty(shape, dtype=np.dtype(dtype))
        for (index, _), piece in zip(parts, pieces):
            where = [slice(None)] * len(shape)
            where[axis] = np.asarray(index, dtype=np.intp)
            whole[tuple(where)] = piece
        out[attr] = {"array": whole.tolist(), "dtype": dtype}
    return out


_REGISTRY: Dict[str, Type[Predictor]] = {}


def register(name: str) -> Callable[[Type[Predictor]], Type[Predictor]]:
    """Class decorator: make a predictor available under ``name``."""
    def wrap(cls: Type[Predictor]) -> Type[Predictor]:
        if name in _REGISTRY:
            raise ValueError(f"predictor {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap


def available() -> list:
    """Names of the registered predictors."""
    return sorted(_REGISTRY)


def predictor_class(name: str) -> Type[Predictor]:
    """The class registered under ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown predictor {name!r}; choose from {', '.join(available())}") from None


def create(name: str, num_workers: int, num_exog: int = 2, **options) -> Predictor:
    """A new predictor by name."""
    return predictor_class(name)(num_workers, num_exog, **options)
