"""The sync-mode interface and its registry: one module per mode.

A sync mode says how the workers of a job keep in step. It has two sides:

coordinator side (:class:`CoordinatorPolicy`, one instance per job, inside the coordinator,
which it sees through :class:`Control`)
    ``validate``     extra checks of the workers' hellos (after the common ones)
    ``ahead``        0: the reports of t split iteration t+1; 1 (lbbsp and the modes built
                     on it): they split t+2, so that a worker never waits for its slice
                     unless the coordinator is a whole iteration late
    ``first_split``  the split of the first iteration (sent in ``welcome``)
    ``opening``      with ``ahead``: the split of each of the next ``ahead`` iterations,
                     before any report (sent right after ``welcome``)
    ``global_batch`` the global batch of the iteration the reports of t split (a mode that
                     chooses it: the most it may be), from rank 0's report
    ``warmup``       what to do with iteration t's reports while warming up (t < warmup)
    ``plan``         once all n reports of t are in: the split of iteration t+1+``ahead``
                     (a ``windowed`` policy: of the iterations :attr:`Control.planning`
                     names, a lease). A policy that ``sends`` splits sends it itself
                     (:meth:`Control.send_split`), and may choose its total, that
                     iteration's global batch, itself: the workers follow ``total`` of the
                     ``slice`` message
    ``windowed``     the coordinator may decide once per control period rather than per
                     iteration (fast iterations): a split then holds for several
                     iterations, learnt from their reports' mean; only for a policy whose
                     global batch follows the DataLoader's epochs (lbbsp, bsp, asp)
    ``on_report``    one worker's report, as it arrives
    ``on_message``   messages of the mode's own (e.g. r2sp's ``request``)
    ``on_done`` / ``on_bye``  a worker finished an iteration / its training loop

worker side (:class:`SyncMode`, methods taking the worker's session as :class:`WorkerSession`)
    ``kvstore``             the MXNet kvstore type (dist_sync or dist_async)
    ``follows_splits`` whether the worker waits for the coordinator's split from
                            its second iteration on (else it cuts the equal split by
                            itself)
    ``normalisers``         (N(t), N0): the gradient normaliser of this step and the nominal
                            one baked into the servers' optimizer (see :mod:`mxlbbsp.worker.trainer`)
    ``before_push``         anything to wait for between the gradients and the push
    ``lr_factor``           the learning-rate factor of the current iteration the coordinator
                            sent (goodput's ``--lr-scaling adascale``), or None: the rule's

The split: the per-worker batch sizes of one iteration (they sum to its global batch B(t));
the one word for it everywhere. Nothing here imports MXNet: the trainer (which does) calls
the worker side.
"""
from __future__ import annotations

import dataclasses
from typing import (
    Callable,
    ClassVar,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Type,
)

import numpy as np

from mxlbbsp.core import env as _env
from mxlbbsp.core import split as _split
from mxlbbsp.core import timemodel as _tm


class ControlConfig(Protocol):
    """The job's settings a policy reads (the coordinator's ``CoordinatorConfig``)."""
    num_workers: int
    #: iterations before the predictor and the fit are learnt from
    warmup: int
    sync: str


class Control(Protocol):
    """The coordinator as a mode's policy sees it: what it may read and what it may do.

    :class:`mxlbbsp.control.coordinator.Coordinator` implements it; a policy imports neither
    that class nor anything of the control layer.
    """
    config: ControlConfig
    #: the job's fatal problem, once there is one (then the policy stops granting)
    failure: Optional[str]
    #: the split solver with the job's bounds: ``split(model, B, in_force)``,
    #: ``scale(split, B)``, ``max_batch``
    balancer: _split.Balancer

    @property
    def current_split(self) -> Optional[np.ndarray]:
        """The split of the latest iteration planned (None before the first)."""

    @property
    def measured(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """(batch sizes, compute seconds) per worker, as reported, of the iteration being
        decided (during ``plan``; None before the first)."""

    @property
    def planning(self) -> Tuple[int, int]:
        """(first, last): the iterations the split being planned is for (during ``plan``
        and ``warmup``): first = last = t+1+``ahead``, or a lease of a ``windowed``
        policy."""

    def send_split(self, iteration: int, split, until: Optional[int] = None) -> None:
        """Send every worker its slice of ``split``, the split of ``iteration`` (with
        ``until``: of every iteration up to it)."""

    def send(self, rank: int, msg: dict) -> None:
        """Send one protocol message (:mod:`mxlbbsp.core.protocol`) to worker ``rank``."""

    def broadcast(self, msg: dict) -> None:
        """Send one protocol message to every worker (encoded once; one frame per relay)."""


class WorkerSession(Protocol):
    """The worker's session as a mode's worker half sees it
    (:class:`mxlbbsp.worker.session.Session` implements it)."""
    num_workers: int
    global_batch_size: int
    #: the global batch B(t) and this worker's local batch b_i(t) of the current iteration
    batch_global: int
    batch_local: int
    iteration: int
    #: connected to a job's coordinator (False in a single process)
    coordinated: bool
    #: what :meth:`SyncMode.attach` returned for this session
    mode_half: object

    def next_global_batch(self) -> Optional[int]:
        """B(t+1) as the loader sees it (None: the data ends)."""

    def on(self, kind: str, handler: Callable[[dict], None]) -> None:
        """Call ``handler(msg)`` on the receiving thread for each message of type ``kind``."""

    def set_slice(self, iteration: int, part: _split.Slice) -> None:
        """This worker's slice of ``iteration``'s global batch has come."""

    def update(self, change: Callable[[], None]) -> None:
        """Run ``change()`` under the session's lock and wake :meth:`wait_until`."""

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Block until ``ready()``; raises when the job failed."""

    def send(self, msg: dict) -> None:
        """One protocol message to the coordinator."""


class UnknownMode(ValueError):
    """A sync mode name that no module registered."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One command-line option of a sync mode: ``mxlbbsp launch`` gets the flag, and the
    mode's policy the value under ``key`` (None: not given, the mode's default).

    ``type``: str, int, float, or a tuple of the allowed strings. Two modes may declare the
    same flag (e.g. ``--batch-range``) with the same type: it is one option of both.
    """
    key: str
    flag: str
    help: str
    type: object = str
    metavar: Optional[str] = None


class CoordinatorPolicy:
    """A mode's coordinator side. The default: equal split, no messages of its own."""

    #: whether this policy sends ``slice`` messages (then the workers wait for them)
    sends = False
    #: the reports of t split iteration t + 1 + ahead: 0, or 1 (lbbsp: the split of t+1
    #: went out an iteration before, while the workers computed t, and the first
    #: ``1 + ahead`` splits come before any report: ``first_split``, then ``opening``)
    ahead = 0
    #: decisions once per control period on fast iterations (see the module docstring);
    #: None: when the policy sends no splits (bsp, asp: it only forecasts, as well once
    #: per period), as a policy that sends them must send each lease whole
    windowed: Optional[bool] = None

    @property
    def decides_per_period(self) -> bool:
        return (not self.sends) if self.windowed is None else bool(self.windowed)

    def __init__(self, coordinator: Control, options: Optional[dict] = None):
        self.coordinator = coordinator
        self.num_workers = coordinator.config.num_workers
        self.options = dict(options or {})

    def resolved(self, defaults: dict, check) -> dict:
        """This policy's options with ``defaults`` for those not given, passed through the
        mode's ``check_options`` (ValueError with its one line when they fail it)."""
        opts = dict(defaults, **{k: v for k, v in self.options.items() if v is not None})
        problem = check(opts)
        if problem:
            raise ValueError(problem)
        return opts

    def validate(self, hellos: Sequence[dict]) -> Optional[str]:
        """The first problem with the hellos for this mode, or None."""
        return None

    def first_split(self, global_batch: int) -> np.ndarray:
        return _split.equal_split(global_batch, self.num_workers)

    def opening(self, iteration: int, in_force: np.ndarray) -> np.ndarray:
        """With ``ahead``: the split of ``iteration``, one of the ``ahead`` iterations after
        the first, decided before any report (``in_force``: the split before it). A policy
        that ``sends`` splits sends it itself."""
        return in_force

    def global_batch(self, t: int, next_B: Optional[int],
                     after_B: Optional[int]) -> Optional[int]:
        """The global batch of iteration t+1+``ahead``, the one the reports of t split,
        from rank 0's report of t: ``next_B`` is B(t+1), ``after_B`` B(t+2) when its loader
        knows it (a worker whose B differs from the split's total rescales its slice).
        None: the data ends, nothing to split."""
        if self.ahead and after_B is not None:
            return after_B
        return next_B

    def warmup(self, t: int, next_B: int, in_force: np.ndarray) -> np.ndarray:
        """Iteration t < warmup: not learnt from. Returns the split of t+1+``ahead``, of
        ``next_B`` samples (:meth:`global_batch`; ``in_force``: the split in force, scaled
        to it); a policy that ``sends`` splits sends it itself."""
        return in_force

    def plan(self, t: int, model: _tm.TimeModel, next_B: int,
             in_force: Optional[np.ndarray]) -> np.ndarray:
        """The split of iteration t+1+``ahead`` (all n reports of t are in), of ``next_B``
        samples (:meth:`global_batch`; ``in_force``: the split in force, scaled to it).

        May raise :class:`~mxlbbsp.core.split.SplitError` (the job fails with its text).
        """
        return _split.equal_split(next_B, self.num_workers)

    def after_split(self, t: int) -> None:
        """After :meth:`plan` of the reports of t returned and its split went out (its
        latency taken): a policy's own work that the workers need not wait for."""

    def on_report(self, rank: int, msg: dict) -> None:
        """Worker ``rank``'s report of ``msg['iteration']`` (its gradients are ready)."""

    def on_message(self, rank: int, msg: dict) -> bool:
        """A message the coordinator does not know; True when this policy handled it."""
        return False

    def on_done(self, rank: int, msg: dict) -> None:
        """Worker ``rank`` finished its push/pull of ``msg['iteration']``."""

    def on_bye(self, rank: int) -> None:
        """Worker ``rank`` ended its training loop."""

    def record_fields(self, t: int) -> dict:
        """Extra fields of the mode for the metrics records of iteration ``t``."""
        return {}


class SyncMode:
    """One sync mode: its names, its worker side and its coordinator policy class."""

    name: ClassVar[str] = ""
    #: the name people read (report, progress)
    label: ClassVar[str] = ""
    #: one sentence for ``mxlbbsp launch --help``
    help: ClassVar[str] = ""
    kvstore: ClassVar[str] = "dist_sync"
    #: every worker waits for all at each iteration's push/pull (else each push is applied
    #: on its own: gradients may be stale, workers may end at different iterations)
    barrier: ClassVar[bool] = True
    #: iteration t is the same step on every worker (report: per-iteration sums make sense)
    aligned: ClassVar[bool] = True
    #: the predictor's forecasts drive the split (report: else they are only recorded)
    uses_predictor: ClassVar[bool] = False
    policy: ClassVar[Type[CoordinatorPolicy]] = CoordinatorPolicy
    #: the coordinator chooses the global batch B(t) (the workers follow ``total``)
    sets_batch: ClassVar[bool] = False
    #: a job in this mode can be checkpointed and resumed exactly (mxlbbsp.core.store)
    checkpoints: ClassVar[bool] = False
    #: the workers report |their gradient sum|^2 (and rank 0 the global one's): goodput's
    #: noise scale (mxlbbsp.core.noise); an extra pass over the gradients, so off elsewhere
    grad_norms: ClassVar[bool] = False
    #: the mode's own options (``mxlbbsp launch`` flags, generated from this declaration)
    options: ClassVar[Tuple[Option, ...]] = ()

    @property
    def follows_splits(self) -> bool:
        return self.policy.sends

    @staticmethod
    def check_options(options: dict) -> Optional[str]:
        """The first problem with this mode's options (a one-line message), or None."""
        return None

    def check_workers(self, options: dict, num_workers: int) -> Optional[str]:
        """The first problem with these options for ``num_workers`` workers, or None."""
        return None

    def misplaced(self, flags: List[str], sync: str) -> str:
        """The error when ``flags``, options of this mode, are given with ``--sync sync``."""
        what = "options" if len(flags) > 1 else "an option"
        return (f"{' and '.join(flags)}: {what} of --sync {self.name}, not of --sync {sync}; "
                f"drop {'them' if len(flags) > 1 else 'it'} or use --sync {self.name}")

    def normalisers(self, sess: WorkerSession) -> Tuple[float, float]:
        """(N(t), N0): synchronous modes normalise by the global batch B(t)."""
        return float(sess.batch_global), float(sess.global_batch_size)

    def worker_env(self, options: dict) -> dict:
        """Extra environment variables of the mode for every worker (from its options)."""
        return {}

    def attach(self, sess: WorkerSession) -> object:
        """Once per worker session of a job, before any message arrives: register handlers
        of the mode's own messages (``sess.on``). Returns what the mode keeps per session
        (``sess.mode_half``)."""
        return None

    def before_push(self, sess: WorkerSession) -> None:
        """Called once the gradients are ready and reported, before the push."""

    def lr_factor(self, sess: WorkerSession) -> Optional[float]:
        """The learning-rate factor of ``sess.iteration`` as the coordinator sent it (None:
        the worker computes its ``--lr-scaling`` rule of B(t) / B0 itself)."""
        return None


_REGISTRY: Dict[str, SyncMode] = {}


def register(cls: Type[SyncMode]) -> Type[SyncMode]:
    """Class decorator: make a sync mode available under ``cls.name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"sync mode {cls.name!r} is unnamed or already registered")
    _REGISTRY[cls.name] = cls()
    return cls


def all_options() -> Dict[str, Tuple[Option, List[str]]]:
    """Every mode's option by flag, with the modes that declare it (registration order)."""
    out: Dict[str, Tuple[Option, List[str]]] = {}
    for name, mode in _REGISTRY.items():
        for opt in mode.options:
            if opt.flag in out and out[opt.flag][0].type != opt.type:
                raise ValueError(f"{opt.flag}: modes {out[opt.flag][1]} and {name} declare it "
                                 "with different types")
            out.setdefault(opt.flag, (opt, []))[1].append(name)
    return out


def available() -> list:
    """Names of the registered sync modes, in registration order (the first is the default)."""
    return list(_REGISTRY)


def get(name: str) -> SyncMode:
    """The mode registered under ``name``; :class:`UnknownMode` (one line) otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownMode(f"unknown sync mode {name!r}; choose one of "
                          f"{', '.join(available())}") from None


def from_env(env: Optional[Mapping[str, str]] = None) -> SyncMode:
    """The mode of this worker: ``MXLBBSP_SYNC`` (default: the first registered mode).

    Raises :class:`~mxlbbsp.core.env.EnvError` (one line) for a name no module registered."""
    name = _env.get(env, _env.SYNC) or available()[0]
    if name not in _REGISTRY:
        raise _env.EnvError(f"{_env.SYNC}={name!r}: not a sync mode; expected one of "
                            f"{', '.join(available())} (`mxlbbsp launch --sync` sets it)")
    return _REGISTRY[name]


def labels() -> Dict[str, str]:
    """{name: label} of every mode."""
    return {name: mode.label for name, mode in _REGISTRY.items()}
