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
from typing import Callable, ClassVar, Dict, Type

import numpy as np

from mxlbbsp.core.store import load_object_state, object_state


class Predictor(abc.ABC):
    """One-step-ahead speed forecaster for ``num_workers`` workers."""

    name: ClassVar[str] = ""

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

        The coordinator calls it after it has sent the allocation, so that training is off
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
