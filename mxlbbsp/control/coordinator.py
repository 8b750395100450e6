"""The coordinator: collects per-iteration reports, predicts speeds, splits the next batch.

It runs on the launch node, inside ``mxlbbsp launch`` (a thread with its own asyncio loop),
and speaks :mod:`mxlbbsp.core.protocol` with the workers. Per iteration t, once all n reports of t
are in:

1. every worker's observed speed (samples/s of its compute phase) and its host's CPU and
   memory load go to the predictor, which forecasts each worker's speed at t+1;
2. (``lbbsp``) the balancer splits the next global batch so that all workers are predicted
   to finish together, keeping the current split when the gain is below the threshold, and
   the allocation is sent to every worker;
3. when a worker's ``done`` for t arrives (after its push/pull), one metrics record is written.

What the coordinator does with the forecast is the sync mode's (:mod:`mxlbbsp.modes`): its
coordinator policy validates the hellos, gives the first split and plans each next one. In
``bsp`` and ``asp`` the workers split the batch equally by themselves and never wait for the
coordinator; it still predicts, so that predictors can be compared on any run.

No MXNet import: the coordinator is plain numpy + asyncio and is tested in milliseconds.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import threading
import time
from typing import Dict, List, Optional, TextIO

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp import predictors as _pred
from mxlbbsp.core import metrics as _metrics
from mxlbbsp.core import protocol as P
from mxlbbsp.core import signals as _signals
from mxlbbsp.core import split as _split
from mxlbbsp.core import timemodel as _tm
from mxlbbsp.core.store import load_object_state, object_state, save_coordinator

log = logging.getLogger(__name__)

TIME_MODELS = ("auto", "linear", "affine")
#: ``auto``: the fixed-cost regime once the fitted fixed cost (AffineFit.job_share) is at least
#: FIXED_SHARE of the workers' time in FIXED_VOTES iterations in a row, back to the linear
#: model only once it is surely less (AffineFit.job_share_high, three standard errors above),
#: or when a slower worker balanced for RETRY_EQUAL iterations made the batch sizes vary and
#: the estimate fell below: in the fixed-cost regime the split stays equal, the batch sizes
#: stop varying and the fit learns nothing new, so leaving on the estimate alone flipped the
#: regime on noise; entering on one estimate sent compute-bound jobs to the equal split now
#: and then.
FIXED_SHARE = 0.5
FIXED_VOTES = 3
#: ... and left at a retry of the equal split when the estimate is below COMPUTE_BOUND
COMPUTE_BOUND = 0.3
#: ``auto`` in the fixed-cost regime: a worker whose time at the equal batch is at least
#: CLEARLY_SLOWER times another's at every fixed share the fit allows (AffineFit.
#: equal_split_bounds over the last SPEED_WINDOW iterations) is clearly slower, and the linear
#: model balances the workers; they count as equal again once every worker's high bound is
#: within SAME_SPEED of every low bound, or after RETRY_EQUAL iterations, when the equal split
#: is tried again (the slow worker must show itself slower again to be balanced). Far from the
#: equal split the bounds are too wide to show a recovered worker equal: without the retry
#: the linear model, which reads a fixed cost as slowness, kept walking the split to 63:1
#: long after the other tenant had gone. The retry costs little: while the fixed cost
#: dominates, even the best uneven split gains little over the equal one.
SPEED_WINDOW = 8
CLEARLY_SLOWER = 1.5
SAME_SPEED = 1.2
RETRY_EQUAL = 24
#: ``auto`` in the linear regime, while the fit cannot tell whether the fixed cost dominates
#: (AffineFit.job_share_high >= FIXED_SHARE): a split held beyond HELD_UNEVEN:1 for
#: RETRY_EQUAL iterations gets one iteration at the equal split, which shows the fit what the
#: held split cannot (seen: 1:63 held for 25 iterations after the slow worker recovered)
HELD_UNEVEN = 4.0
#: ``auto`` in the fixed-cost regime, once a clearly slower worker is being balanced: the
#: faster worker's batch grew, and its speed did not change (the tenant is on the other one).
#: If its time grew with its batch like a compute-bound worker's (median time over PROBE
#: iterations after against PROBE before, at the equal split: log time ratio at least
#: ELASTIC times the log batch ratio, for a batch that grew by MIN_GROWTH or more), that is
#: one vote that the fixed cost does not dominate; COMPUTE_VOTES of them, and the job is
#: compute-bound for good (the fixed-cost regime is not entered again). The fit cannot tell
#: this by itself while the split answers speed changes: when a tenant arrives on one
#: worker's core, its batch shrinks just as its time per sample grows, which looks like a
#: fixed cost (seen in benchmarks/contention.py: ResNet-20, fixed share ~5 %, was put back at
#: the equal split for ~5 iterations after each switch, every ~35). The faster worker's
#: time is the measurement: with 81 % fixed cost, a batch 1.3x larger takes 1.06x the time;
#: compute-bound, 1.3x. (The gap between the two closing is not: a transient slowdown that
#: passes closes it on a fixed cost too.)
#: The mark is dropped when the mean batch per worker falls below half the one it was set at
#: (Courier may shrink the global batch a lot, and a smaller batch has a larger fixed share).
PROBE = 5
ELASTIC = 0.7
MIN_GROWTH = 1.2
COMPUTE_VOTES = 2


class AutoRegime:
    """``--time-model auto``: whether the fixed cost dominates the job and, if so, whether
    a worker is clearly slower; from the AffineFit's estimates, one iteration at a time."""

    def __init__(self, num_workers: int):
        self.fixed_dominates = False     # the fixed-cost regime
        self.uneven = False              # in it: a worker is clearly slower
        self.uneven_for = 0              # iterations since it was found slower
        self.fixed_votes = 0             # iterations in a row the fit said fixed
        self.held_for = 0                # linear regime: iterations the split stayed uneven
        self.compute_bound = False       # the fixed cost does not dominate, for good
        self.compute_votes = 0           # probes that found the time growing with the batch
        self.bound_at = 0.0              # the mean batch per worker when it was marked
        self.probe = np.full(3, np.nan)  # [fast worker, its batch, its median time] at the
        #                                  equal split; the last PROBE iterations' times and
        #                                  batch sizes (NaN: not yet)
        self.times = np.full((PROBE, num_workers), np.nan)
        self.batches = np.full((PROBE, num_workers), np.nan)

    def equal_split(self, fit: _tm.AffineFit, batch: np.ndarray,
                    compute: Optional[np.ndarray] = None) -> bool:
        """Update the regime with the fit after this iteration (batch sizes ``batch``,
        compute times ``compute``: without them no probe); True when the workers count as
        equal this time (the equal model)."""
        if compute is not None:
            self.times = self._keep(self.times, compute)
            self.batches = self._keep(self.batches, batch)
        if self.compute_bound and batch.mean() < 0.5 * self.bound_at:
            self.compute_bound, self.compute_votes = False, 0     # a much smaller batch
        if self.compute_bound:
            self.fixed_dominates = self.uneven = False
            return False
        if self.fixed_dominates:
            self.fixed_dominates = fit.job_share_high >= FIXED_SHARE
            self.fixed_votes = 0
        else:
            self.fixed_votes = self.fixed_votes + 1 if fit.job_share >= FIXED_SHARE else 0
            self.fixed_dominates = self.fixed_votes >= FIXED_VOTES
        if not self.fixed_dominates:
            # The linear model, while the fit cannot yet tell whether the fixed cost
            # dominates: a split it holds uneven gives the fit nothing new to go by (and on
            # a fixed cost it may hold one long after the slow worker recovered), so the
            # equal split is tried once every RETRY_EQUAL iterations.
            self.uneven = False
            held = batch.max() > HELD_UNEVEN * batch.min() and \
                fit.job_share_high >= FIXED_SHARE
            self.held_for = self.held_for + 1 if held else 0
            if self.held_for < RETRY_EQUAL:
                return False
            self.held_for = 0
            return True
        # A worker clearly slower (a slow host, not noise) is balanced as before: the linear
        # model, the slow worker gets proportionally less. Otherwise the workers count as
        # equal: balancing noise on an iteration that hardly grows with the batch would only
        # move the split to an extreme and leave it there.
        lo, hi = fit.equal_split_bounds(batch.sum() / len(batch), recent=SPEED_WINDOW,
                                        fixed_share=(fit.job_share_low, fit.job_share_high))
        if np.isfinite(lo).all():               # else too few observations: as before
            if self.uneven:
                self.uneven_for += 1
                if self.uneven_for == PROBE and self._probe_grew():
                    self.compute_votes += 1
                    if self.compute_votes >= COMPUTE_VOTES:
                        self.compute_bound = True
                        self.bound_at = float(batch.mean())
                        self.fixed_dominates = self.uneven = False
                        return False
                self.uneven = not (hi.max() <= SAME_SPEED * lo.min()
                                   or self.uneven_for >= RETRY_EQUAL)
                if not self.uneven and fit.job_share < COMPUTE_BOUND:
                    # balancing made the batch sizes vary, and the fit no longer calls the
                    # fixed cost dominant: a compute-bound job, the linear model's
                    self.fixed_dominates = False
            else:
                self.uneven = bool(lo.max() > CLEARLY_SLOWER * hi.min())
                self.uneven_for = 0
                self.probe = self._probe_of(int(np.argmin(hi))) if self.uneven \
                    else np.full(3, np.nan)
        return self.fixed_dominates and not self.uneven

    def describe(self) -> str:
        """The regime in a few words (for ``-v``)."""
        if self.compute_bound:
            return "compute-bound for good: the linear model"
        if not self.fixed_dominates:
            return "the linear model"
        if self.uneven:
            return "the fixed cost dominates, but a worker is clearly slower: the linear model"
        return "the fixed cost dominates (a tiny model): the equal split"

    def _probe_of(self, worker: int) -> np.ndarray:
        """[worker, its median batch, its median time] over the last PROBE iterations (NaN
        while fewer have been seen)."""
        return np.array([worker, np.median(self.batches[:, worker]),
                         np.median(self.times[:, worker])])

    def _probe_grew(self) -> bool:
        """Whether the probed worker's time grew with its batch since the probe began, as a
        compute-bound worker's does (ELASTIC, MIN_GROWTH)."""
        if not np.isfinite(self.probe).all():
            return False
        fast, b0, t0 = int(self.probe[0]), self.probe[1], self.probe[2]
        now = self._probe_of(fast)
        b1, t1 = now[1], now[2]
        return bool(np.isfinite(now).all() and t0 > 0 and b1 >= MIN_GROWTH * b0
                    and np.log(t1 / t0) >= ELASTIC * np.log(b1 / b0))

    @staticmethod
    def _keep(rows: np.ndarray, values) -> np.ndarray:
        """The last PROBE rows of per-worker values, ``values`` the newest."""
        return np.concatenate([rows[1:], np.asarray(values, dtype=float)[None, :]])

#: the smallest local batch of a model with BatchNorm layers when --min-batch-size is not
#: given: their statistics come from each worker's own batch, and batch norm degrades quickly
#: below about 8 samples per device (Wu & He, "Group Normalization", 2018, fig. 1); at most a
#: half of the equal share B / (2 n), so that a slow worker can still be given less
BATCHNORM_MIN_BATCH = 8


def auto_min_batch(global_batch: int, num_workers: int, batchnorm: bool) -> int:
    """The default --min-batch-size: 1 without BatchNorm, else BATCHNORM_MIN_BATCH capped at
    half the equal share."""
    if not batchnorm:
        return 1
    return max(1, min(BATCHNORM_MIN_BATCH, global_batch // (2 * num_workers)))


#: "refused a connection" warnings: the first few one by one, then one line per interval
REFUSALS_SHOWN = 5
REFUSAL_SUMMARY_S = 10.0


@dataclasses.dataclass
class CoordinatorConfig:
    """What the coordinator needs to know about the job."""

    num_workers: int
    token: str
    sync: str = "lbbsp"
    predictor: str = "narx"
    time_model: str = "auto"
    exog: tuple = _signals.DEFAULT        # the report fields the predictor sees (--exog)
    threshold: float = 0.03
    max_batch: Optional[int] = None       # per-worker cap from the command line
    #: per-worker minimum (--min-batch-size); None: auto, 1 unless the workers' model has
    #: BatchNorm layers, then BATCHNORM_MIN_BATCH (see auto_min_batch)
    min_batch: Optional[int] = None
    tensorboard_dir: Optional[str] = None  # --tensorboard: event files of the scalars
    metrics_path: Optional[str] = None
    warmup: int = 1                       # first iterations (graph building) not learnt from
    slowdown: Optional[list] = None       # per-rank emulated slowdown schedules (the oracle's)
    host: str = "127.0.0.1"               # address to listen on
    port: int = 0                         # 0: any free port
    sync_options: dict = dataclasses.field(default_factory=dict)   # the mode's own options
    #: time.monotonic() of the job's launch (courier's deadline counts from it); None: when
    #: the coordinator is built
    started: Optional[float] = None
    # checkpoints (mxlbbsp.core.store): where and how often to save the coordinator's state,
    # and, when resuming, the checkpoint's manifest and the state saved with it
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    resume_manifest: Optional[dict] = None
    resume_state: Optional[dict] = None

    def __post_init__(self):
        if self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        problem = _modes.get(self.sync).check_options(self.sync_options)
        if problem:
            raise ValueError(problem)
        if self.time_model not in TIME_MODELS:
            raise ValueError(f"time_model must be one of {TIME_MODELS}")
        if self.min_batch is not None and self.min_batch < 1:
            raise ValueError("min_batch must be >= 1")
        if self.predictor not in _pred.available():
            raise ValueError(f"unknown predictor {self.predictor!r}; choose from "
                             f"{', '.join(_pred.available())}")


@dataclasses.dataclass
class Progress:
    """A snapshot for progress lines and the stall timeout."""

    iteration: int            # last iteration every worker has finished (-1: none yet)
    samples: int              # samples trained so far (sum of global batches)
    last_change: float        # monotonic time the iteration last advanced
    samples_per_s: float      # over the recent iterations
    sizes: List[int]          # the latest allocation
    iteration_s: Optional[float] = None   # median time between recent iterations


@dataclasses.dataclass
class Waiting:
    """What the job waits for (stall messages): which workers have not sent what."""

    iteration: Optional[int]  # the iteration waited for (None: registration)
    what: str                 # "hello", "report" or "done"
    ranks: List[int]          # the workers whose message never came


class Coordinator:
    """The coordination service of one job. ``start()`` it, hand its address to the workers."""

    def __init__(self, config: CoordinatorConfig):
        self.config = config
        self.failure: Optional[str] = None           # fatal problem; the job must stop
        self.failure_kind: Optional[str] = None      # "config" (bad input) or "runtime"
        self.failed_at: float = 0.0
        self.failure_fatal = False                   # the failure was sent to every worker
        self.finished = threading.Event()            # every worker said bye
        self.address = None
        self._fresh_balancing()
        # auto time model: prefer the equal split whenever an uneven one does not gain the
        # threshold (see balancer.Balancer._prefer_equal)
        self.balancer = _split.Balancer(config.threshold, config.min_batch or 1,
                                       config.max_batch,
                                       prefer_equal=config.time_model == "auto")
        self._tensorboard = None                     # tensorboardX writer, at the first record
        self._logged: Dict[int, int] = {}            # rank -> the last iteration written
        self._policy = _modes.get(config.sync).policy(self, config.sync_options)
        self._writers: Dict[int, asyncio.StreamWriter] = {}
        self._hellos: Dict[int, dict] = {}
        self._byes: set = set()
        self._bye_at: Dict[int, int] = {}            # rank -> its last reported iteration
        self._last_report: Dict[int, int] = {}       # rank -> its latest report's iteration
        self._reports: Dict[int, Dict[int, dict]] = {}
        self._records: Dict[tuple, dict] = {}
        self._predicted: Dict[int, np.ndarray] = {}
        self._sizes: Optional[np.ndarray] = None
        self._done_count: Dict[int, int] = {}
        self._iteration = -1
        self._samples = 0
        self._recent: List[tuple] = []               # (monotonic time, samples) per iteration
        self._last_change = time.monotonic()
        self._metrics: Optional[TextIO] = None
        self._metrics_failed = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self.alloc_latency: List[float] = []         # seconds from last report to broadcast
        # the figures of the end-of-job summary, computed as `mxlbbsp report` computes them
        self._totals = _metrics.Totals(skip=config.warmup)
        self.refused = 0                             # connections refused before a hello
        self._refusals_unshown = 0
        self._refusal_timer = None
        self._start = 0                              # first iteration (> 0 when resumed)
        self._written = 0                            # metrics records in the file
        self._resumed_sizes: Optional[np.ndarray] = None   # the split a checkpoint saved
        if config.resume_manifest is not None:
            self._start = int(config.resume_manifest["iteration"]) + 1
            self._iteration = self._start - 1
            self._load_state(config.resume_state)

    # ---- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What balancing needs to continue without re-learning (JSON-serialisable)."""
        return {"iteration": self._iteration, "num_workers": self.config.num_workers,
                "predictor_name": self.config.predictor,
                "predictor": self._predictor.state_dict(), "fit": object_state(self._fit),
                "sizes": None if self._sizes is None else [int(b) for b in self._sizes],
                "regime": object_state(self._regime),
                **self._through()}

    def _through(self) -> dict:
        """metrics_records and the summary's totals (``totals``) through the last finished
        iteration, the complete records not yet written included (a record is written once
        its worker has moved on: _flush_records): what a checkpoint of it covers."""
        totals = _metrics.Totals(self._totals.skip)
        totals.load(self._totals.state())
        pending = 0
        for (t, rank) in sorted(self._records):
            parts = self._records[(t, rank)]
            if t <= self._iteration and "report" in parts and "done" in parts:
                totals.add(self._record(t, rank, parts["report"], parts["done"],
                                        parts.get("scalars")))
                pending += 1
        return {"metrics_records": self._written + pending, "totals": totals.state()}

    def _fresh_balancing(self) -> None:
        """The predictor, the time-model fit and the auto regime, knowing nothing yet."""
        cfg, n = self.config, self.config.num_workers
        options = {}
        if getattr(_pred.predictor_class(cfg.predictor), "needs_schedules", False):
            options["schedules"] = cfg.slowdown
        self._predictor = _pred.create(cfg.predictor, n, max(len(cfg.exog), 1), **options)
        self._fit = _tm.AffineFit(n)
        self._regime = AutoRegime(n)                 # --time-model auto

    def _load_state(self, state: Optional[dict]) -> None:
        """Restore :meth:`state_dict`; on another number of workers (or predictor) only the
        metrics position carries over, and balancing learns afresh."""
        if not state:
            return
        self._written = int(state.get("metrics_records", 0))
        if state.get("totals"):
            # the summary covers the whole job, its attempts before this resume too
            self._totals.load(state["totals"])
        if state.get("num_workers") != self.config.num_workers:
            return
        try:
            if state.get("predictor_name") == self.config.predictor:
                self._predictor.load_state_dict(state["predictor"])
            load_object_state(self._fit, state["fit"])
            if state.get("regime"):
                load_object_state(self._regime, state["regime"])
        except (ValueError, KeyError, TypeError) as exc:
            # a checkpoint of another build whose state has other shapes: learn afresh
            log.warning("the checkpoint's balancing state does not fit this build (%s); "
                        "balancing learns afresh", exc)
            self._fresh_balancing()
            return
        if state.get("sizes"):
            self._resumed_sizes = np.array(state["sizes"], dtype=np.int64)

    def _maybe_checkpoint(self, t: int) -> None:
        cfg = self.config
        if cfg.checkpoint_dir and cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0:
            try:
                save_coordinator(cfg.checkpoint_dir, t, self.state_dict())
            except (OSError, ValueError) as exc:
                log.warning("could not save the coordinator's state: %s", exc)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> tuple:
        """Listen and serve in a background thread; returns the (host, port) bound."""
        ready = threading.Event()
        errors: list = []

        def run():
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(loop.create_server(
                    lambda: _Connection(self), self.config.host, self.config.port,
                    backlog=4096))
                self.address = self._server.sockets[0].getsockname()[:2]
            except OSError as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="mxlbbsp-coordinator", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        return self.address

    def stop(self) -> None:
        """Close every connection, stop the loop and flush the metrics."""
        loop = self._loop
        if loop is not None and loop.is_running():
            async def shutdown():
                self._server.close()
                for transport in list(self._writers.values()):
                    transport.close()
            fut = asyncio.run_coroutine_threadsafe(shutdown(), loop)
            try:
                fut.result(timeout=5)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._metrics is not None or self._records:
            self._flush_records(final=True)
        if self._metrics is not None:
            try:
                self._metrics.close()
            except OSError:         # already reported by _flush_records
                pass
            self._metrics = None
        if self._tensorboard is not None:
            try:
                self._tensorboard.close()
            except OSError as exc:
                log.warning("could not close the TensorBoard files: %s", exc)
            self._tensorboard = None

    @property
    def registered(self) -> int:
        """How many workers have said hello."""
        return len(self._hellos)

    def summary(self) -> Optional[dict]:
        """The run's figures over the records written so far, warm-up left out, exactly as
        ``mxlbbsp report`` computes them from the metrics file (:class:`mxlbbsp.core.metrics.Totals`);
        None before the first record after the warm-up."""
        return self._totals.summary()

    def progress(self) -> Progress:
        recent = self._recent[-20:]
        rate = 0.0
        if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
            rate = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
        sizes = [] if self._sizes is None else [int(b) for b in self._sizes]
        times = [t for t, _ in recent]
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        median = gaps[len(gaps) // 2] if gaps else None
        return Progress(self._iteration, self._samples, self._last_change, rate, sizes, median)

    def waiting(self) -> Waiting:
        """Which workers the job waits for: at registration, their hello; then, for the
        iteration after the last finished one, their report (computed gradients), or, when
        every report is in, their done (push/pull finished). Read from another thread."""
        n = self.config.num_workers
        hellos = dict(self._hellos)
        if len(hellos) < n:
            return Waiting(None, "hello", [r for r in range(n) if r not in hellos])
        t = self._iteration + 1
        parts = [self._records.get((t, r)) or {} for r in range(n)]
        missing = [r for r in range(n) if "report" not in parts[r]]
        if missing:
            return Waiting(t, "report", missing)
        return Waiting(t, "done", [r for r in range(n) if "done" not in parts[r]])

    # ---- connections ----------------------------------------------------------------------

    def _on_line(self, conn: "_Connection", line: bytes) -> bool:
        """One message of a connection; False when the connection is done with."""
        rank = conn.rank
        try:
            # before authentication nothing longer than a hello is parsed
            msg = P.decode(line, P.MAX_HELLO if rank is None else P.MAX_LINE)
            kind = msg["type"]
            if rank is None:
                if kind != P.HELLO or not P.token_ok(msg, self.config.token):
                    self._refuse(conn, "bad hello or token")
                    return False
                conn.rank = self._on_hello(msg, conn.transport)
                if conn.rank is None:
                    conn.transport.close()
                    return False
            elif kind == P.REPORT:
                self._on_report(rank, msg)
            elif kind == P.DONE:
                self._on_done(rank, msg)
            elif kind == P.LOG:
                self._on_log(rank, msg)
            elif kind == P.BYE:
                self._byes.add(rank)
                last = msg.get("iteration")
                if isinstance(last, int) and not isinstance(last, bool):
                    self._bye_at[rank] = last
                    self._check_even()
                self._policy.on_bye(rank)
                if len(self._byes) == self.config.num_workers:
                    self._flush_records(final=True)
                    self.finished.set()
            elif not self._policy.on_message(rank, msg):
                raise P.ProtocolError(f"unexpected message {kind!r}")
        except (P.ProtocolError, ValueError, KeyError, TypeError, RecursionError) as exc:
            if rank is None:
                self._refuse(conn, str(exc) if isinstance(exc, P.ProtocolError)
                             else "malformed hello")
            else:
                self._reject(conn, str(exc) if not isinstance(exc, RecursionError)
                             else "message nested too deeply")
            return False
        return True

    def _refuse(self, conn: "_Connection", reason: str) -> None:
        """Close a connection that never authenticated; warn about the first few only, then
        one line per REFUSAL_SUMMARY_S seconds with the count (a port scan or a flood must
        not flood the user's output)."""
        self.refused += 1
        if self.refused <= REFUSALS_SHOWN:
            more = " (further refusals are counted, one line per " \
                   f"{REFUSAL_SUMMARY_S:g} s)" if self.refused == REFUSALS_SHOWN else ""
            log.warning("refused a connection from %s: %s%s",
                        conn.transport.get_extra_info("peername"), reason, more)
        else:
            self._refusals_unshown += 1
            if self._refusal_timer is None:
                self._refusal_timer = asyncio.get_running_loop().call_later(
                    REFUSAL_SUMMARY_S, self._refusal_summary)
        conn.transport.close()

    def _refusal_summary(self) -> None:
        self._refusal_timer = None
        if self._refusals_unshown:
            log.warning("refused %d more connection(s) in the last %g s (bad, oversized or "
                        "unauthenticated hello; "
                        "%d in all)", self._refusals_unshown, REFUSAL_SUMMARY_S, self.refused)
            self._refusals_unshown = 0

    def _check_even(self) -> None:
        """Fail the job when a worker ended while another went on to a later iteration:
        in synchronous training the others would wait for it forever."""
        if not self._bye_at or self.failure is not None \
                or not _modes.get(self.config.sync).barrier:
            return                  # without a barrier per iteration nobody waits for it
        low_rank = min(self._bye_at, key=lambda r: (self._bye_at[r], r))
        low = self._bye_at[low_rank]
        ahead = {r: t for r, t in self._last_report.items() if t > low}
        if not ahead:
            return
        high_rank = max(ahead, key=lambda r: (ahead[r], -r))
        what = "no iteration" if low < 0 else f"iteration {low}"
        self._fail(f"worker {low_rank} ended after {what} while worker {high_rank} went on to "
                   f"iteration {ahead[high_rank]}: every worker must run the same number of "
                   "iterations; use the DataLoader's epochs (the same on every worker), not a "
                   "wall clock or a per-worker iteration count")

    def _reject(self, conn: "_Connection", reason: str) -> None:
        """A malformed message: a registered worker's is a job failure; close either way."""
        if conn.rank is not None:
            self._fail(f"worker {conn.rank}: protocol error: {reason}")
        conn.transport.close()

    def _on_lost(self, conn: "_Connection") -> None:
        rank = conn.rank
        if rank is not None and rank not in self._byes and self.failure is None \
                and self._writers.get(rank) is conn.transport:
            self._fail(f"worker {rank} lost its connection to the coordinator before it "
                       "finished", fatal_for_workers=False)

    # ---- the policies' view of the coordinator (mxlbbsp.modes.Control) ---------------------

    @property
    def current_split(self) -> Optional[np.ndarray]:
        """The split in force: the per-worker batch sizes of the latest iteration planned."""
        return self._sizes

    def send(self, rank: int, msg: dict) -> None:
        """One message to worker ``rank`` (dropped when it is gone)."""
        w = self._writers.get(rank)
        if w is not None and not w.is_closing():
            w.write(P.encode(msg))

    def _broadcast(self, msg: dict) -> None:
        data = P.encode(msg)
        for w in self._writers.values():
            if not w.is_closing():
                w.write(data)

    def send_split(self, iteration: int, split) -> None:
        """Every worker its own slice of ``split``, iteration's global batch (O(n) bytes)."""
        total = int(sum(split))
        offset = 0
        for rank, size in enumerate(split):
            size = int(size)
            w = self._writers.get(rank)
            if w is not None and not w.is_closing():
                w.write(P.alloc_line(iteration, offset, size, total))
            offset += size

    def _fail(self, message: str, fatal_for_workers: bool = True, kind: str = "runtime") -> None:
        if self.failure is None:
            self.failure = message
            self.failure_kind = kind
            self.failed_at = time.monotonic()
            self.failure_fatal = fatal_for_workers
            log.debug("job failure: %s", message)
            if fatal_for_workers:
                self._broadcast(P.error(message))

    # ---- registration ---------------------------------------------------------------------

    def _on_hello(self, msg: dict, writer) -> Optional[int]:
        n = self.config.num_workers
        rank = msg.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < n:
            writer.write(P.encode(P.error(f"rank {rank!r} is outside 0..{n - 1}")))
            return None
        if rank in self._hellos:
            writer.write(P.encode(P.error(f"rank {rank} connected twice")))
            return None
        self._hellos[rank] = msg
        self._writers[rank] = writer
        if len(self._hellos) == n:
            problem = self._validate() or self._policy.validate(
                [self._hellos[r] for r in range(n)])
            if problem:
                self._fail(problem, kind="config")
            else:
                B = int(self._hellos[0]["global_batch_size"])
                self._sizes = np.asarray(self._policy.first_split(B))
                resumed = self._resumed_sizes
                if resumed is not None and int(resumed.sum()) == B and self._policy.sends:
                    self._sizes = resumed          # the split balancing had reached
                self._broadcast(P.welcome(n, self.config.sync, self._sizes))
        return rank

    def _validate(self) -> Optional[str]:
        """The first problem with the job's configuration as the workers declared it."""
        n = self.config.num_workers
        hellos = [self._hellos[r] for r in range(n)]
        for field, what in (("global_batch_size", "global batch size"),
                            ("dataset_size", "data set size")):
            values = {h[field] for h in hellos}
            if len(values) > 1:
                detail = ", ".join(f"rank {r}: {h[field]}" for r, h in enumerate(hellos))
                return f"the workers disagree on the {what} ({detail}); every worker must " \
                       "build the same mxlbbsp.DataLoader"
        B, N = hellos[0]["global_batch_size"], hellos[0]["dataset_size"]
        saved = self.config.resume_manifest
        if saved is not None and (saved["global_batch_size"] != B
                                  or saved.get("dataset_size") not in (None, N)):
            return (f"the checkpoint (iteration {saved['iteration']}) was written with a global "
                    f"batch size of {saved['global_batch_size']} on {saved.get('dataset_size')} "
                    f"samples, this job has {B} on {N}; resume with the same data and batch "
                    "size, or start without --resume")
        if B < n:
            return (f"global batch size {B} is smaller than the number of workers ({n}): every "
                    f"worker needs at least one sample per iteration; use a global batch size "
                    f">= {n} or fewer workers (-n)")
        if N < B:
            return (f"the data set has {N} samples, fewer than one global batch ({B}); use a "
                    "smaller global batch size")
        short = hellos[0].get("min_global_batch") or B
        if short < n:
            return (f"the last global batch of each epoch has {short} samples, fewer than the "
                    f"{n} workers; pass last_batch='discard' to mxlbbsp.DataLoader or change "
                    "the global batch size")
        low = self.config.min_batch
        smallest = getattr(self._policy, "lo", None)        # courier: --batch-range's minimum
        if low is not None and isinstance(smallest, int) and low * n > smallest:
            return (f"--min-batch-size {low} is more than --batch-range's minimum {smallest} / "
                    f"{n} workers ({smallest // n} each): every worker must be able to get it; "
                    f"use at most {smallest // n}, or raise the --batch-range minimum")
        if low is not None and low * n > B:
            return (f"--min-batch-size {low} is more than the global batch size {B} / {n} "
                    f"workers ({B // n} each): every worker must be able to get it; use at most "
                    f"{B // n}, or fewer workers")
        caps = [h.get("max_batch_size") for h in hellos]
        if self.config.max_batch is not None:
            caps = [self.config.max_batch if c is None else min(c, self.config.max_batch)
                    for c in caps]
        if all(c is not None for c in caps):
            self.balancer.max_batch = np.array(caps, dtype=np.int64)
            if sum(caps) < B:
                return (f"the workers' maximum batch sizes ({', '.join(map(str, caps))}) add up "
                        f"to less than the global batch size {B}; raise --max-batch-size or "
                        "use more workers")
        elif any(c is not None for c in caps):
            self.balancer.max_batch = np.array([B if c is None else c for c in caps],
                                                dtype=np.int64)
        return None

    # ---- iterations -----------------------------------------------------------------------

    def _on_report(self, rank: int, msg: dict) -> None:
        t = int(msg["iteration"])
        batch = msg["batch_size"]
        compute = msg.get("compute_s")
        if not isinstance(batch, int) or batch < 1 or compute is None or not compute > 0:
            raise P.ProtocolError(f"report of iteration {t} has batch_size={batch}, "
                                  f"compute_s={compute}")
        msg["time"] = time.time()
        if msg.get("batchnorm") and self.config.min_batch is None and self._hellos:
            # the model has BatchNorm layers: keep its statistics sane (auto_min_batch)
            self.balancer.min_batch = max(self.balancer.min_batch, auto_min_batch(
                int(self._hellos[0]["global_batch_size"]), self.config.num_workers, True))
        if t > self._last_report.get(rank, -1):
            self._last_report[rank] = t
            if self._bye_at:
                self._check_even()
        # The metrics record is built when it is written (_flush_records): nothing on the
        # path from the last report to the broadcast that need not be there.
        self._records.setdefault((t, rank), {})["report"] = msg
        self._policy.on_report(rank, msg)
        reports = self._reports.setdefault(t, {})
        reports[rank] = msg
        if len(reports) == self.config.num_workers:
            self._on_iteration(t, reports)
            del self._reports[t]

    def _on_iteration(self, t: int, reports: Dict[int, dict]) -> None:
        started = time.perf_counter()
        n = self.config.num_workers
        batch = np.array([reports[r]["batch_size"] for r in range(n)], dtype=float)
        compute = np.array([reports[r]["compute_s"] for r in range(n)], dtype=float)
        exog = np.array([[_nan(reports[r].get(c)) for c in self.config.exog] or [np.nan]
                         for r in range(n)])
        next_B = reports[0].get("next_global_batch")
        if t < self._start + self.config.warmup:
            # Iteration 0 builds graphs and allocates memory: not a speed worth learning.
            self._sizes = self._policy.warmup(t, next_B, self._sizes)
            if self._sizes is not None:
                log.debug("iteration %d: split %s (warm-up: no speed learnt yet)", t + 1,
                          _shown(self._sizes))
            return
        kind = self.config.time_model
        if kind != "linear":
            self._fit.observe(batch, compute)
        regime = self._regime.describe()
        equal = kind == "auto" and self._regime.equal_split(self._fit, batch, compute)
        if kind == "auto" and self._regime.describe() != regime:
            log.debug("iteration %d: time model: %s (fitted fixed share of the time %.0f%%)",
                      t + 1, self._regime.describe(), 100 * self._fit.job_share)
        if equal:
            model = self._equal_model(batch, compute)
            # the predictor still observes (whole-time speeds): no gaps in its lags
            if hasattr(self._predictor, "advance"):
                self._predictor.advance(t)
            self._predictor.observe(batch / compute, exog)
        else:
            fixed = np.minimum(self._fit.intercept, 0.8 * compute) if kind == "affine" \
                else np.zeros(n)
            # The predictor sees the batch-invariant (marginal) speed; with the linear model
            # it is simply batch / compute time.
            if hasattr(self._predictor, "advance"):
                self._predictor.advance(t)
            self._predictor.observe(batch / (compute - fixed), exog)
            marginal = self._predictor.predict()
            bad = ~(np.isfinite(marginal) & (marginal > 0))
            marginal = np.where(bad, batch / (compute - fixed), marginal)
            model = _tm.TimeModel(marginal, fixed)

        if next_B is None:
            return
        current = self._sizes
        if current is not None and int(current.sum()) != next_B:
            current = _split.rescale(current, next_B)
        self.balancer.decision = ""
        try:
            sizes = self._policy.plan(t, model, next_B, current)
        except _split.AllocationError as exc:
            self._fail(f"cannot split the global batch of iteration {t + 1}: {exc}")
            return
        if self._policy.sends:
            self.alloc_latency.append(time.perf_counter() - started)
        self._sizes = np.asarray(sizes)
        # What the predictor expects each worker's observed speed to be at t+1.
        self._predicted[t + 1] = self._sizes / model.time(self._sizes)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("iteration %d: split %s of %d; predicted speeds %s samples/s; %s",
                      t + 1, _shown(self._sizes), int(self._sizes.sum()),
                      _shown(self._predicted[t + 1]),
                      self.balancer.decision or f"{self.config.sync}'s own split")
        self._predictor.learn()     # training, after the broadcast: off the critical path

    def _equal_model(self, batch, compute) -> _tm.TimeModel:
        """``auto`` while the fixed cost dominates (tiny models) and no worker is clearly
        slower: every worker the same line t(b) = a + c b, so the equal split. c is the
        job's robust pooled slope (AffineFit.pooled_slope; a non-positive one, time that
        does not grow with the batch within the noise, counts as 1 % of the time per mean
        batch), a the median over workers of each one's window level; the times it predicts
        are the job's, for the metrics and for Courier's planning. Not a line per worker:
        when each worker keeps its own batch size, a difference in fixed cost and the slope
        cannot be told apart, and a slope error of a few microseconds per sample made equal
        workers look unequal by milliseconds (seen: equal pairs held at 52:12 and 63:1)."""
        fit = self._fit
        mean_b = np.where(np.isfinite(fit.mean_batch), fit.mean_batch, batch)
        mean_t = np.where(np.isfinite(fit.mean_time), fit.mean_time, compute)
        floor = 0.01 * mean_t.sum() / mean_b.sum()
        slope = fit.pooled_slope if np.isfinite(fit.pooled_slope) else floor
        slope = min(max(slope, floor), float(np.min(mean_t / mean_b)))
        level = float(np.median(np.maximum(mean_t - slope * mean_b, 0.0)))
        n = len(mean_b)
        return _tm.TimeModel(np.full(n, 1.0 / slope), np.full(n, level))

    def _on_log(self, rank: int, msg: dict) -> None:
        """The script's values of an iteration (mxlbbsp.log): into that record's scalars."""
        t = msg.get("iteration")
        if not isinstance(t, int) or isinstance(t, bool):
            raise P.ProtocolError("a log message needs an integer iteration")
        values = P.scalars_of(msg)
        if t <= self._logged.get(rank, -1):
            log.debug("worker %d logged values of iteration %d after its record was written; "
                      "left out", rank, t)
            return
        self._records.setdefault((t, rank), {}).setdefault("scalars", {}).update(values)

    def _on_done(self, rank: int, msg: dict) -> None:
        t = int(msg["iteration"])
        self._records.setdefault((t, rank), {})["done"] = msg
        self._policy.on_done(rank, msg)
        count = self._done_count.get(t, 0) + 1
        if count < self.config.num_workers:
            self._done_count[t] = count
            return
        self._done_count.pop(t, None)
        if t > self._iteration:
            self._iteration = t
            self._samples += sum(self._records.get((t, r), {}).get("report", {}).get(
                "batch_size", 0) for r in range(self.config.num_workers))
            now = time.monotonic()
            self._last_change = now
            self._recent.append((now, self._samples))
            del self._recent[:-50]
        self._flush_records()
        self._maybe_checkpoint(t)

    def _record(self, t: int, rank: int, report: dict, done: Optional[dict],
                scalars: Optional[dict] = None) -> dict:
        """The metrics record of worker ``rank`` at iteration ``t`` (fields: mxlbbsp.core.metrics)."""
        batch, compute = report["batch_size"], report["compute_s"]
        done = done or {}
        predicted = self._predicted.get(t)
        extra = {}
        if scalars:
            extra["scalars"] = scalars
        if isinstance(report.get("momentum"), (int, float)):
            extra["momentum"] = report["momentum"]
        return {
            "iteration": t, "rank": rank, "host": self._hellos[rank].get("host"),
            "batch_size": batch, "compute_s": compute, "speed": batch / compute,
            "cpu_percent": report.get("cpu_percent"), "mem_percent": report.get("mem_percent"),
            "slowdown": report.get("slowdown", 1.0), "sync": self.config.sync,
            "barrier": _modes.get(self.config.sync).barrier,
            "predictor": self.config.predictor, "time": report["time"],
            # Looked up now, not when the report came: a worker's report of t+1 can arrive
            # before the last report of t (ASP, or lines buffered on one connection).
            "predicted_speed": None if predicted is None else _num(predicted[rank]),
            "wait_s": done.get("wait_s"), "sync_s": done.get("sync_s"),
            "iteration_s": done.get("iteration_s"),
            "fallbacks": int(self._predictor.fallbacks[rank]),
            "global_batch": report.get("global_batch"),
            "lr_factor": report.get("lr_factor", 1.0),
            **self._policy.record_fields(t),
            **{name: report.get(name) for name in _signals.NAMES if name in report},
            **extra,
        }

    def _flush_records(self, final: bool = False) -> None:
        """Write every complete record (all of them at the end) in (iteration, rank) order."""
        # Only iterations every worker has finished: the file stays in (iteration, rank)
        # order even though the workers' messages arrive on separate connections. And only
        # once the worker has moved on (its report of a later iteration, or its bye): the
        # values its script logs for iteration t (mxlbbsp.log, after the step) come before
        # those on the same connection.
        # (An iteration is written whole, so that the order holds when one worker has
        # moved on and another has not.)
        def moved_on(k, r):
            return "done" in r and "report" in r and (
                self._last_report.get(k[1], -1) > k[0] or k[1] in self._byes)

        waiting = {k[0] for k, r in self._records.items() if not moved_on(k, r)}
        ready = sorted(k for k, r in self._records.items()
                       if final or (k[0] <= self._iteration and k[0] not in waiting))
        lines = []
        written = []
        for t, rank in ready:
            parts = self._records.pop((t, rank))
            if "report" not in parts:
                continue
            rec = self._record(t, rank, parts["report"], parts.get("done"),
                               parts.get("scalars"))
            self._totals.add(rec)
            self._logged[rank] = max(self._logged.get(rank, -1), t)
            written.append(rec)
            lines.append(json.dumps(rec, allow_nan=False))
        if written and self.config.tensorboard_dir:
            self._write_tensorboard(written)
        if lines and self.config.metrics_path and not self._metrics_failed:
            try:
                if self._metrics is None:
                    # Opened at the first record, so that a job rejected at registration
                    # leaves an earlier metrics file untouched; a resumed job appends.
                    mode = "a" if self.config.resume_manifest is not None else "w"
                    self._metrics = open(self.config.metrics_path, mode)
                self._metrics.write("\n".join(lines) + "\n")
                self._written += len(lines)
                self._metrics.flush()
            except OSError as exc:
                # e.g. ENOSPC: the job stops with this one line (exit 2, as a --metrics path
                # refused at launch), not with the workers' "lost connection"
                self._metrics_failed = True
                self._fail(f"cannot write the metrics file {self.config.metrics_path!r} "
                           f"({exc.strerror or exc}); free some space or choose another "
                           "--metrics path", kind="config")
        pending = {t for t, _ in self._records}
        for t in [t for t in self._predicted if t <= self._iteration and t not in pending]:
            del self._predicted[t]


    def _write_tensorboard(self, records: List[dict]) -> None:
        """The records' scalars for TensorBoard (--tensorboard): per iteration, each logged
        name as the batch-weighted mean over the workers that logged it (what the report
        plots), and each worker's speed and batch size under ``worker<rank>/``."""
        if self._tensorboard is None:
            try:
                from tensorboardX import SummaryWriter
                self._tensorboard = SummaryWriter(self.config.tensorboard_dir)
            except (ImportError, OSError) as exc:
                log.warning("--tensorboard %s: cannot write there (%s); no TensorBoard files",
                            self.config.tensorboard_dir, exc)
                self.config.tensorboard_dir = None
                return
        w = self._tensorboard
        for t, values, when in _metrics.combine_scalars(records):
            for name, value in values.items():
                w.add_scalar(name, value, t, walltime=when)
        for rec in records:
            t, r, when = rec["iteration"], rec["rank"], rec["time"]
            w.add_scalar(f"worker{r}/speed", rec["speed"], t, walltime=when)
            w.add_scalar(f"worker{r}/batch_size", rec["batch_size"], t, walltime=when)
        w.flush()


class _Connection(asyncio.Protocol):
    """One worker's connection: its lines go to the coordinator as they arrive.

    A protocol rather than a stream reader: no coroutine resumes per message, which is most
    of the cost when hundreds of workers report at the same moment.
    """

    def __init__(self, coordinator: Coordinator):
        self.coordinator = coordinator
        self.transport: Optional[asyncio.Transport] = None
        self.rank: Optional[int] = None          # set by a valid hello
        self._buffer = bytearray()
        self._hello_timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._hello_timer = asyncio.get_running_loop().call_later(30, self._no_hello)

    def _no_hello(self) -> None:
        if self.rank is None:
            self.transport.close()

    def _limit(self) -> int:
        """The longest line read: a hello's until the connection has authenticated."""
        return P.MAX_HELLO if self.rank is None else P.MAX_LINE

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():     # refused or rejected: read nothing more
            return
        buffer = self._buffer
        buffer += data
        start = 0
        while True:
            end = buffer.find(b"\n", start, start + self._limit() + 1)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if not self.coordinator._on_line(self, line):
                buffer.clear()
                return
        del buffer[:start]
        limit = self._limit()
        if len(buffer) > limit:
            buffer.clear()
            if self.rank is None:
                self.coordinator._refuse(self, f"first line longer than {limit} bytes")
            else:
                self.coordinator._reject(self, f"message longer than {limit} bytes")

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.coordinator._on_lost(self)


def _shown(values, most: int = 16) -> str:
    """Per-worker values (batch sizes, speeds) for a log line, rounded: all of them up to
    ``most``, else a summary."""
    values = np.asarray(values, dtype=float)
    if len(values) <= most:
        return ",".join(f"{v:.0f}" for v in values)
    return (f"min {values.min():.0f}, median {np.median(values):.0f}, max "
            f"{values.max():.0f} over {len(values)} workers")


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def _num(x) -> Optional[float]:
    x = float(x)
    return x if math.isfinite(x) else None
