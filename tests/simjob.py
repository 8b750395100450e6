"""A job of simulated workers around a real coordinator, in milliseconds: the property tests'
model of a whole job (tests/test_props_*.py).

The coordinator is :class:`mxlbbsp.control.coordinator.Coordinator` itself, built but not
started: its handlers are called as its inbox calls them (a hello per worker, then each
iteration's reports and dones as one batch, as a relay sends them), with the job's
configuration as the launcher builds it (:class:`CoordinatorConfig`), and what it writes to a
worker (welcome, slice, error) is read back from that worker's writer. Each worker's loader
walks its epochs with the functions :class:`mxlbbsp.DataLoader` uses
(:mod:`mxlbbsp.core.epochs`) and takes its slice as its session does (``Session.slice``: the
welcome's split at its first iteration, the equal split in modes whose coordinator sends
none, else the coordinator's split of that iteration; then scaled to the loader's global
batch with :func:`mxlbbsp.core.split.rescale_slice`). Nothing is mocked but the clock of the
compute: each worker reports the time its time model gives its slice.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from mxlbbsp import modes
from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
from mxlbbsp.control.registration import auto_min_batch
from mxlbbsp.core import epochs
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.core import split

TOKEN = "props"
#: the modes whose jobs the simulation runs: the synchronous ones (r2sp grants its slices
#: through messages of its own, asp has no barrier per iteration)
SYNCS = ("lbbsp", "bsp", "courier", "goodput")
SLICE = re.compile(rb'\{"type":"slice","iteration":(\d+),"offset":(\d+),"size":(\d+),'
                   rb'"total":(\d+)\}')


class Writer:
    """A worker's end of the coordinator's writes: its slices by iteration, and the other
    messages (decoded when read: a welcome to 1024 workers is 1024 copies of the split)."""

    def __init__(self):
        self.lines: List[bytes] = []
        self.slices: Dict[int, split.Slice] = {}
        self.closed = False

    def write(self, data: bytes) -> None:
        for line in data.splitlines():
            part = SLICE.fullmatch(line)     # P.slice_line's, read without json (n a split)
            if part:
                t, offset, size, total = map(int, part.groups())
                self.slices[t] = split.Slice(offset, size, total)
            else:
                self.lines.append(line)

    @property
    def messages(self) -> List[dict]:
        return [P.decode(line) for line in self.lines]

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


@dataclasses.dataclass
class Setup:
    """One job: its data and loader, its workers, and its command line."""

    n: int
    N: int                            # data set size
    B: int                            # the DataLoader's global_batch_size
    sync: str = "lbbsp"
    last_batch: str = "keep"
    shuffle: bool = True
    seed: int = 0
    #: each worker's DataLoader max_batch_size (None: none), rank order
    hello_caps: Optional[Sequence[Optional[int]]] = None
    max_batch: Optional[int] = None   # --max-batch-size
    min_batch: Optional[int] = None   # --min-batch-size (None: the default)
    batchnorm: bool = False           # the model has BatchNorm layers
    batch_range: Optional[str] = None  # courier, goodput: --batch-range
    #: the coordinator's --time-model (speed.TIME_MODELS)
    time_model: str = "linear"
    #: each worker's time model, t_i(b) = intercept_i + b / speed_i (seconds)
    speed: Optional[Sequence[float]] = None
    intercept: Optional[Sequence[float]] = None
    #: courier and goodput: the global batch their planner chooses at each plan, in turn
    #: (each then goes through the policy's cut by the rest of the epoch and the caps)
    choices: Sequence[int] = ()

    def __repr__(self) -> str:
        """The fields that differ from the defaults; a per-worker list of more than 8
        workers in brief (a failing example is read, and a small one pasted into a test)."""
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            if isinstance(value, (list, tuple, np.ndarray)) and len(value) > 8:
                values = [v for v in value if v is not None]
                value = (f"<{len(value)} values, {len(value) - len(values)} None, "
                         f"{min(values, default=None)}..{max(values, default=None)}>")
            elif isinstance(value, np.ndarray):
                value = value.tolist()
            shown.append(f"{f.name}={value!r}" if not str(value).startswith("<")
                         else f"{f.name}={value}")
        return f"Setup({', '.join(shown)})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))

    def caps(self) -> List[Optional[int]]:
        """Each worker's cap, as registration combines the hello's with the command line's."""
        hello = list(self.hello_caps) if self.hello_caps is not None else [None] * self.n
        if self.max_batch is None:
            return hello
        return [self.max_batch if c is None else min(c, self.max_batch) for c in hello]

    def least_batch(self) -> int:
        """The per-worker least local batch the job asks for: --min-batch-size, else the
        BatchNorm default of the DataLoader's global batch (1 without BatchNorm)."""
        if self.min_batch is not None:
            return self.min_batch
        return auto_min_batch(self.B, self.n, True) if self.batchnorm else 1

    def options(self) -> dict:
        if self.sync == "courier":
            return {"deadline": "1h", "epochs": 1000.0, "batch_range": self.batch_range}
        if self.sync == "goodput":
            return {"batch_range": self.batch_range, "lr_scaling": "linear"}
        return {}


@dataclasses.dataclass
class Step:
    """One iteration as the workers ran it."""

    t: int
    epoch: int
    total: int                 # its global batch
    starts: np.ndarray         # each worker's first sample, a position in the epoch's order
    split: np.ndarray          # each worker's local batch
    sent: Optional[np.ndarray]  # the coordinator's split of it (None: the equal split)


class Failed(Exception):
    """The job stopped: the coordinator's failure, or a worker's error."""


class Job:
    """One launch of ``setup``: from iteration ``start`` (a resume: the checkpoint's
    ``manifest`` and the coordinator's ``state`` saved with it), on ``setup.n`` workers."""

    def __init__(self, setup: Setup, manifest: Optional[dict] = None,
                 state: Optional[dict] = None):
        self.setup = s = setup
        self.mode = modes.get(s.sync)
        self.coordinator = Coordinator(CoordinatorConfig(
            num_workers=s.n, token=TOKEN, sync=s.sync, predictor="last", exog=(),
            time_model=s.time_model, max_batch_size=s.max_batch, min_batch_size=s.min_batch,
            sync_options={k: v for k, v in s.options().items() if v is not None},
            resume_manifest=manifest, resume_state=state))
        self.plan = epochs.EpochPlan(s.N, s.B, s.last_batch)
        self.start = 0 if manifest is None else \
            epochs.resume_start(manifest, s.B, s.N, self.plan.length)
        self.writers = [Writer() for _ in range(s.n)]
        self.welcome: Optional[dict] = None
        self._pieces: Dict[object, list] = {}
        self.steps: List[Step] = []
        speed = np.ones(s.n) if s.speed is None else np.asarray(s.speed, dtype=float)
        a = np.zeros(s.n) if s.intercept is None else np.asarray(s.intercept, dtype=float)
        self._time = lambda sizes: a + sizes / speed
        self._choices = itertools.cycle(s.choices) if s.choices else None
        policy = self.coordinator._policy
        if self._choices is not None and hasattr(policy, "planner"):
            self._steer(policy)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the coordinator's records writer (a thread)."""
        self.coordinator.stop()

    def _steer(self, policy) -> None:
        """The planner's choice of B is the next of ``setup.choices``: courier's, through
        its update; goodput's, the B it plans by (``planner.current``) before each plan."""
        if self.setup.sync == "courier":
            policy.planner.update = lambda *args, **kw: int(next(self._choices))
        else:
            plan = policy.plan

            def steered(t, model, next_B, current):
                if policy.planner is not None:
                    policy.planner.current = int(next(self._choices))
                return plan(t, model, next_B, current)
            policy.plan = steered

    # ---- registration -------------------------------------------------------------------

    def hello(self, rank: int) -> dict:
        s = self.setup
        caps = list(s.hello_caps) if s.hello_caps is not None else [None] * s.n
        msg = P.hello(rank, TOKEN, 1000 + rank, f"h{rank}", s.B, s.N, caps[rank])
        msg["min_global_batch"] = self.plan.smallest
        msg["data_fingerprint"] = f"{s.N}"
        msg["order"] = {"shuffle": s.shuffle, "seed": s.seed if s.shuffle else None,
                        "last_batch": s.last_batch}
        return msg

    def register(self) -> Optional[str]:
        """Every worker's hello; the coordinator's refusal, or None once it welcomed all."""
        c = self.coordinator
        for rank in range(self.setup.n):
            c.on_hello(self.hello(rank), self.writers[rank])
        if c.failure is not None:
            return c.failure
        self.welcome = P.decode(self.writers[0].lines[0])
        assert self.welcome["type"] == P.WELCOME, self.welcome
        return None

    # ---- iterations ---------------------------------------------------------------------

    def _slice(self, rank: int, t: int, size: Optional[int]) -> split.Slice:
        """Session.slice: worker ``rank``'s slice of iteration ``t`` (global batch ``size``,
        None: the one the coordinator chose)."""
        if t == self.start:
            part = self._slice_of("welcome", lambda: self.welcome["split"], rank)
        elif not self.mode.follows_splits:
            part = self._slice_of(size, lambda: split.equal_split(size, self.setup.n), rank)
        else:
            part = self.writers[rank].slices.get(t)
            if part is None:
                raise Failed(f"worker {rank} never got its slice of iteration {t}")
        if size is None:
            return part
        return split.rescale_slice(part, rank, self.setup.n, size)

    def _slice_of(self, key, sizes, rank: int) -> split.Slice:
        """split.slice_of(sizes(), rank), each worker's from one pass over the split
        (``key`` names it; slice_of sums the ranks before: n workers would make it n^2)."""
        parts = self._pieces.get(key)
        if parts is None:
            sizes = [int(b) for b in sizes()]
            ends = np.cumsum(sizes).tolist()
            parts = [split.Slice(end - b, b, ends[-1]) for end, b in zip(ends, sizes)]
            for r in {0, len(sizes) // 2, len(sizes) - 1}:
                assert parts[r] == split.slice_of(sizes, r)
            self._pieces[key] = parts
        return parts[rank]

    def _loader(self, rank: int):
        """The DataLoader's iteration on worker ``rank``, for ever (one epoch per pass of
        a script's loop): (t, epoch, first position, local size, global batch, the next
        global batch and the one after it as the loader tells its session)."""
        s, plan, t = self.setup, self.plan, self.start - 1
        follows = self.mode.sets_batch
        for epoch in itertools.count():
            if follows:                        # DataLoader._iter_following
                cursor = 0
                while cursor < s.N:
                    t += 1
                    part = self._slice(rank, t, None)
                    if part.total > s.N - cursor:
                        raise Failed(f"global batch {part.total} of iteration {t} runs past "
                                     f"the end of the epoch ({s.N - cursor} samples left)")
                    cursor += part.total
                    yield (t, epoch, cursor - part.total + part.offset, part.size,
                           part.total, epochs.next_cap(s.N, cursor), None)
                continue
            first = plan.first_index(self.start, epoch)     # DataLoader.__iter__
            if first is None:
                continue
            for k in range(first, plan.length):
                start, size = plan.batch(k)
                t += 1
                part = self._slice(rank, t, size)
                yield (t, epoch, start + part.offset, part.size, size, plan.next_size(k),
                       plan.next_size(k, 2))

    def run(self, until_epoch: int, last: Optional[int] = None,
            most: int = 10_000) -> List[Step]:
        """Iterations until the first of epoch ``until_epoch`` or, when given, through
        iteration ``last``; :class:`Failed` when the job stops (its reason), or when it ran
        ``most`` iterations (a generated job meant to be short that is not)."""
        s, n = self.setup, self.setup.n
        loaders = [self._loader(r) for r in range(n)]
        while True:
            try:
                ran = [next(loader) for loader in loaders]
            except (split.SplitError, ValueError) as exc:
                raise Failed(f"a worker failed: {exc}") from None
            t, epoch = ran[0][0], ran[0][1]
            if epoch >= until_epoch or (last is not None and t > last):
                return self.steps
            if len(self.steps) >= most:
                raise Failed(f"more than {most} iterations before epoch {until_epoch}")
            if any(r[:2] != (t, epoch) or r[4] != ran[0][4] for r in ran):
                raise Failed(f"the workers disagree on iteration {t}: {ran}")
            starts = np.array([r[2] for r in ran], dtype=np.int64)
            sizes = np.array([r[3] for r in ran], dtype=np.int64)
            self.steps.append(Step(t, epoch, ran[0][4], starts, sizes, self.sent(t)))
            if np.any(sizes < 1):
                raise Failed(f"iteration {t}: a worker has no sample ({sizes.tolist()})")
            compute = self._time(sizes.astype(float))
            reports = []
            for r in range(n):
                msg = P.report(t, int(sizes[r]), float(compute[r]), 0.0, 0.0, 1.0,
                               int(ran[r][5]))
                msg["global_batch"] = int(ran[r][4])
                if ran[r][6] is not None:
                    msg["after_next_global_batch"] = int(ran[r][6])
                if t == self.start:
                    msg["batchnorm"] = s.batchnorm
                reports.append(msg)
            self._rows(reports)
            dones = [P.done(t, 0.0, 0.001 * (1 + r % 3), float(compute[r]) + 0.001)
                     for r in range(n)]
            self._rows(dones)

    def sent(self, t: int) -> Optional[np.ndarray]:
        """The coordinator's split of iteration ``t`` as its slices carried it (None: it
        sent none)."""
        parts = [w.slices.get(t) for w in self.writers]
        if any(p is None for p in parts):
            return None
        return np.array([p.size for p in parts], dtype=np.int64)

    def _rows(self, messages) -> None:
        c = self.coordinator
        c.on_rows(F.Rows.from_messages(list(range(self.setup.n)), messages, time.time()))
        if c.failure is not None:
            raise Failed(c.failure)

    # ---- checkpoints --------------------------------------------------------------------

    def checkpoint(self) -> tuple:
        """(manifest, coordinator state) after the last iteration run: what rank 0's
        checkpoint (mxlbbsp.worker.checkpoint.save_trainer) and the coordinator's
        (Coordinator.state_dict) hold; None's epoch fields when the epoch is not fixed."""
        s, t = self.setup, self.steps[-1].t
        length = None if self.mode.sets_batch else self.plan.length
        manifest = {"global_batch_size": s.B, "dataset_size": s.N,
                    **epochs.checkpoint_position(t, length), "num_workers": s.n,
                    "sync": s.sync, "params": [], "iteration": t}
        return manifest, self.coordinator.state_dict()
