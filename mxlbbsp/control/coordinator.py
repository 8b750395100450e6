"""The coordinator: collects per-iteration reports, predicts speeds, splits the next batch.

It runs on the launch node, inside ``mxlbbsp launch`` (a thread with its own asyncio loop),
and speaks :mod:`mxlbbsp.core.protocol` with the workers. Per iteration t, once all n reports of t
are in:

1. every worker's observed speed (samples/s of its compute phase) and its host's CPU and
   memory load go to the predictor, which forecasts each worker's speed;
2. (``lbbsp``) the balancer splits the global batch of iteration t+2 so that all workers are
   predicted to finish together, keeping the split in force when the gain is below the
   threshold, and the split is sent to every worker: the split of t+1 went out an iteration
   before, so the workers never wait for it unless the coordinator is an iteration late (a
   mode's ``ahead``: 0 splits t+1 instead, as ``r2sp`` does);
3. when a worker's ``done`` for t arrives (after its push/pull), its metrics record is
   complete; the recorder writes it off this thread.

What the coordinator does with the forecast is the sync mode's (:mod:`mxlbbsp.modes`): its
coordinator policy validates the hellos, gives the first split and plans each next one. In
``bsp`` and ``asp`` the workers split the batch equally by themselves and never wait for the
coordinator; it still predicts, so that predictors can be compared on any run.

Its peers are the workers, each directly or through its host's relay (:mod:`mxlbbsp.relay`:
one connection per host, a host's reports and dones of an iteration in one frame). Either
way the reports and dones reach the iteration flow as batches (:class:`~mxlbbsp.core.
frames.Rows`), handled as arrays: a relay's section, or one message of a worker connected
directly; every other message as the worker sent it.

The rooms: :mod:`.connection` (its port: what it lets in, refusals), :mod:`.inbox` (what
comes in: hellos, lines, frames, handed to the handlers here), :mod:`mxlbbsp.core.links`
(what is written to the workers), :mod:`.collect` (each iteration's reports and dones as
arrays), :mod:`.speed` (predictor, time-model fit, the ``auto`` regime), :mod:`.recorder`
(metrics records, totals, written by a thread of their own), :mod:`.registration` (the
checks of the workers' hellos); this module is the iteration flow, the lifecycle and the
checkpoint state that ties them together. (Long, on purpose: the message handlers share one
state, which worker has sent what of which iteration, and read best side by side.)

No MXNet import: the coordinator is plain numpy + asyncio and is tested in milliseconds.
"""
from __future__ import annotations

import asyncio
import collections
import gc
import logging
import threading
import time
from typing import Dict, List, Optional

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp.control.collect import Collector
from mxlbbsp.control.config import CoordinatorConfig, Progress, Waiting
from mxlbbsp.control.connection import hello_gate, listen
from mxlbbsp.control.inbox import Inbox, relay_config
from mxlbbsp.control.recorder import Recorder
from mxlbbsp.control.registration import (
    auto_min_batch,
    check_hellos,
    epoch_plan,
    uneven_end,
)
from mxlbbsp.control.speed import SpeedModel
from mxlbbsp.core import protocol as P
from mxlbbsp.core import split as _split
from mxlbbsp.core.links import Links
from mxlbbsp.core.store import save_coordinator

log = logging.getLogger(__name__)

#: how many iterations' split latencies the coordinator keeps
SPLIT_LATENCY_KEPT = 100_000
#: the longest lease: at most this many iterations decided at once (a control period of
#: iterations shorter than period / LEASE_MOST still gives leases of this many)
LEASE_MOST = 64
#: the iterations the job's rate is measured over (the lease length); below this many, no
#: lease: a decision per iteration
RATE_OVER = 8


class Coordinator:
    """The coordination service of one job. ``start()`` it, hand its address to the workers.

    Long, on purpose: the iteration flow (hello, report, done, log, bye) and the lifecycle
    share the job's state (which worker sent what of which iteration); the rooms it hands
    work to (connection, inbox, collect, speed, recorder, registration) hold the rest. It is
    the :class:`~mxlbbsp.control.inbox.InboxHandler` of its inbox and the
    :class:`~mxlbbsp.modes.Control` of its mode's policy.
    """

    def __init__(self, config: CoordinatorConfig):
        self.config = config
        self.failure: Optional[str] = None           # fatal problem; the job must stop
        self.failure_kind: Optional[str] = None      # "config" (bad input) or "runtime"
        self.failed_at: float = 0.0
        self.failure_fatal = False                   # the failure was sent to every worker
        self.finished = threading.Event()            # every worker said bye
        self.address = None
        self.speed = SpeedModel(config.num_workers, config.predictor, len(config.exog),
                                config.time_model, schedules=config.slowdown,
                                ahead=_modes.get(config.sync).policy.ahead)
        # auto time model: prefer the equal split whenever an uneven one does not gain the
        # threshold (see split.Balancer._prefer_equal)
        self.balancer = _split.Balancer(config.threshold, config.min_batch_size or 1,
                                       config.max_batch_size,
                                       prefer_equal=config.time_model == "auto")
        n = config.num_workers
        self.links = Links()
        self._gate = hello_gate(config.token)
        self.recorder = Recorder(n, config.metrics, config.tensorboard, config.warmup,
                                 append=config.resume_manifest is not None, fail=self._fail,
                                 sync=config.sync, predictor=config.predictor)
        self.collect = Collector(n, config.exog)
        self._policy = _modes.get(config.sync).policy(self, config.sync_options)
        base = _modes.CoordinatorPolicy
        #: the policy's per-worker hooks, when it has any (each row then as a message)
        self._hooks = {P.REPORT: type(self._policy).on_report is not base.on_report,
                       P.DONE: type(self._policy).on_done is not base.on_done}
        self.inbox = Inbox(self, self.links, relay_config(
            _modes.get(config.sync).barrier, self._hooks[P.DONE],
            config.checkpoint_every if config.checkpoint_dir else 0))
        self._hellos: Dict[int, dict] = {}
        self._hosts: List[Optional[str]] = [None] * n      # rank -> its host (records)
        #: iteration -> the relays' predictor states of it, (ranks, state) (checkpoints)
        self._relay_states: Dict[int, list] = {}
        self._byes = np.zeros(n, dtype=bool)             # per rank: it said bye
        self._lost: set = set()                      # ranks whose connection broke
        #: the hand-over of an elastic job (request_state): the answer of the worker asked,
        #: (iteration, checkpoint folder, error), and the iteration whose coordinator state
        #: is still to be saved beside it
        self.saved: Optional[tuple] = None
        self._boundary = False           # the request was for a boundary (a graceful resize)
        self._state_due: Optional[int] = None
        self.state_saved: Optional[int] = None
        self._bye_at: Dict[int, int] = {}            # rank -> its last reported iteration
        self._in_force: Optional[np.ndarray] = None   # the split of the latest iteration planned
        #: iteration -> its split, for the iterations planned after the last finished one
        self._splits: Dict[int, np.ndarray] = {}
        # iteration -> the last iteration whose reports its split was decided from (metrics)
        self._planned_from: Dict[int, int] = {}
        self._measured: Optional[tuple] = None       # see `measured`
        self._iteration = -1
        self._samples = 0
        self._recent: List[tuple] = []               # (monotonic time, samples) per iteration
        self._last_change = time.monotonic()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server = None
        self._thread: Optional[threading.Thread] = None
        #: seconds from the last report of an iteration to its split sent, for the latest
        #: SPLIT_LATENCY_KEPT iterations (benchmarks/coordinator_scale.py reads them)
        self.split_latency: collections.deque = collections.deque(maxlen=SPLIT_LATENCY_KEPT)
        self._start = 0                              # first iteration (> 0 when resumed)
        #: the last iteration planned (its split decided, sent by a policy that sends)
        self._planned = -1
        #: (first, last) of the split being planned (Control.planning)
        self._planning = (0, 0)
        #: the reports of the iterations since the last plan, learnt from at the next
        #: (a decision per control period: see decide)
        self._window: List[np.ndarray] = []
        #: a worker's loader asked for another B than the epochs' plan says: no leases
        self._leases_off = False
        self._epochs = None                          # the DataLoaders' EpochPlan (leases)
        #: the splits a checkpoint saved: of the iteration after it, and of the one after
        self._resumed_split: Optional[np.ndarray] = None
        self._resumed_next: Optional[np.ndarray] = None
        if config.resume_manifest is not None:
            self._start = int(config.resume_manifest["iteration"]) + 1
            self._iteration = self._start - 1
            self._load_state(config.resume_state)

    # the rooms' parts that modes, tests and benchmarks name
    _predictor = property(lambda self: self.speed.predictor)
    _fit = property(lambda self: self.speed.fit)
    _regime = property(lambda self: self.speed.regime)
    refused = property(lambda self: self._gate.refusals.count,
                       doc="connections refused before a hello")

    # ---- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What balancing needs to continue without re-learning (JSON-serialisable):
        the speed model, the splits of the two iterations after the last finished one t
        (``split``: of t+1; ``next_split``: of t+2, once planned), and the metrics records
        and summary's totals through t (the complete records not yet written included)."""
        written, totals = self.recorder.pending_totals(
            self._iteration, self._hosts, self.speed.fallbacks, self._record_fields)
        t = self._iteration
        split, after = self._splits.get(t + 1), self._splits.get(t + 2)
        return {"iteration": t, "num_workers": self.config.num_workers,
                **self.speed.state_dict(self._relay_states.get(t)),
                "split": None if split is None else [int(b) for b in split],
                "next_split": None if after is None else [int(b) for b in after],
                "metrics_records": written, "totals": totals.state()}

    def _load_state(self, state: Optional[dict]) -> None:
        """Restore :meth:`state_dict`; on another number of workers (or predictor) only the
        metrics position carries over, and balancing learns afresh."""
        if not state:
            return
        self.recorder.written = int(state.get("metrics_records", 0))
        if state.get("totals"):
            # the summary covers the whole job, its attempts before this resume too
            self.recorder.totals.load(state["totals"])
        if state.get("num_workers") != self.config.num_workers:
            return
        # a state saved under the keys "sizes" and "next_sizes" reads as well
        split = state.get("split", state.get("sizes"))
        after = state.get("next_split", state.get("next_sizes"))
        if self.speed.load_state_dict(state) and split:
            self._resumed_split = np.array(split, dtype=np.int64)
            if after:
                self._resumed_next = np.array(after, dtype=np.int64)

    # ---- the hand-over of an elastic job ---------------------------------------------------

    def request_state(self, boundary: bool, gone=()) -> Optional[int]:
        """Ask one worker for the job's state (from the launcher's thread): rank 0, or the
        lowest rank still here (``gone``: ranks the launcher saw end); ``boundary``: at the
        end of its current step, after which it halts (a graceful resize: no worker can then
        finish another iteration), else at once, the last finished iteration's (a
        failure). The answer comes as :attr:`saved`. Returns the rank asked (None: none)."""
        left = [r for r in range(self.config.num_workers)
                if r not in self._lost and r not in set(gone) and not self._byes[r]]
        if not left or self._loop is None:
            return None
        rank = left[0]
        self.saved = self.state_saved = self._state_due = None
        self._boundary = boundary
        msg = {"type": P.CHECKPOINT, "mode": "boundary" if boundary else "snapshot"}
        self._loop.call_soon_threadsafe(self.send, rank, msg)
        return rank

    def _on_saved(self, rank: int, msg: dict) -> None:
        t = msg.get("iteration")
        if type(t) is not int:
            self.saved = (None, None, str(msg.get("error") or "no iteration saved"))
            return
        self.saved = (t, msg.get("path"), None)
        if self._iteration >= t:
            self._save_state(t)
        else:
            self._state_due = t         # once every done of t is in (_finished)

    @property
    def _halted(self) -> bool:
        """A boundary was asked for and saved: the workers end here, by design."""
        return self._boundary and self.saved is not None and self.saved[0] is not None

    def _save_state(self, t: int) -> None:
        cfg = self.config
        if cfg.checkpoint_dir:
            try:
                save_coordinator(cfg.checkpoint_dir, t, self.state_dict())
            except (OSError, ValueError) as exc:
                log.warning("could not save the coordinator's state: %s", exc)
        self.state_saved = t

    def _maybe_checkpoint(self, t: int) -> None:
        if self._state_due == t:
            self._state_due = None
            self._save_state(t)
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
            self.recorder.call_soon = loop.call_soon_threadsafe
            try:
                self._server = loop.run_until_complete(listen(
                    self.inbox, self._gate, self.config.host, self.config.port,
                    self.config.sock))
                self.address = self._server.sockets[0].getsockname()[:2]
            except OSError as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                self.recorder.call_soon = None
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        # What this process holds by now (modules, the job's setup) lives as long as it
        # does: out of the cyclic collector's reach, so that its full collections scan only
        # what came since (at 1024 workers one took 7.5 ms, 0.5 ms after this, in the
        # metrics writer's thread, which holds the GIL the coordinator's needs to answer)
        gc.freeze()
        self._thread = threading.Thread(target=run, name="mxlbbsp-coordinator", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        return self.address

    def stop(self) -> None:
        """Close every connection, stop the loop and write the metrics left."""
        loop = self._loop
        if loop is not None and loop.is_running():
            async def shutdown():
                self._server.close()
                self.links.close_all()
            fut = asyncio.run_coroutine_threadsafe(shutdown(), loop)
            try:
                fut.result(timeout=5)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._flush_records(final=True)
        self.recorder.close()

    @property
    def registered(self) -> int:
        """How many workers have said hello."""
        return len(self._hellos)

    def summary(self) -> Optional[dict]:
        """The run's figures over the records written so far, warm-up left out, exactly as
        ``mxlbbsp report`` computes them from the metrics file (:class:`mxlbbsp.core.metrics.
        Totals`); None before the first record after the warm-up."""
        return self.recorder.summary()

    def progress(self) -> Progress:
        recent = self._recent[-20:]
        rate = 0.0
        if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
            rate = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
        split = [] if self._in_force is None else [int(b) for b in self._in_force]
        times = [t for t, _ in recent]
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        median = gaps[len(gaps) // 2] if gaps else None
        return Progress(self._iteration, self._samples, self._last_change, rate, split, median)

    def waiting(self) -> Waiting:
        """Which workers the job waits for: at registration, their hello; then, for the
        iteration after the last finished one, their report (computed gradients), or, when
        every report is in, their done (push/pull finished). Read from another thread."""
        n = self.config.num_workers
        hellos = dict(self._hellos)
        if len(hellos) < n:
            return Waiting(None, "hello", [r for r in range(n) if r not in hellos])
        t = self._iteration + 1
        reported, done = self.collect.waiting(t)
        if not reported.all():
            return Waiting(t, "report", np.flatnonzero(~reported).tolist())
        return Waiting(t, "done", np.flatnonzero(~done).tolist())

    # ---- messages (the inbox's handler: control.inbox.InboxHandler) ------------------------

    def on_message(self, rank: int, msg: dict) -> None:
        """A registered worker's message other than a report or a done."""
        kind = msg["type"]
        if kind == P.LOG:
            self._on_log(rank, msg)
        elif kind == P.BYE:
            self._on_bye(rank, msg)
        elif kind == P.SAVED:
            self._on_saved(rank, msg)
        elif not self._policy.on_message(rank, msg):
            raise P.ProtocolError(f"unexpected message {kind!r}")

    def on_forecasts(self, iteration: int, ranks: np.ndarray, forecasts: np.ndarray,
                     fallbacks: np.ndarray) -> None:
        """A relay's forecasts of its workers' speeds at ``iteration`` + 1."""
        self.collect.forecasts(iteration, ranks, forecasts, fallbacks)

    def on_state(self, iteration: int, ranks: List[int], state: dict) -> None:
        """A relay's predictor state after an iteration the coordinator checkpoints (a
        hub's relays send theirs one by one): joined by ``state_dict``."""
        self._relay_states.setdefault(iteration, []).append((ranks, state))
        horizon = iteration - 2 * max(self.config.checkpoint_every, 1)
        for old in [k for k in self._relay_states if k < horizon]:
            del self._relay_states[old]

    def on_lost(self, rank: int) -> None:
        self._lost.add(rank)
        if not self._byes[rank] and self.failure is None and not self._halted:
            self._fail(f"worker {rank} lost its connection to the coordinator before it "
                       "finished", fatal_for_workers=False)

    def on_relay_lost(self, relay) -> None:
        if (self.failure is None and not self._halted
                and not self._byes[relay.ranks_array].all()):
            self._fail(f"{relay.describe()} lost its connection to the coordinator before its "
                       "workers finished", fatal_for_workers=False)

    def on_malformed(self, message: str) -> None:
        self._fail(message)

    def _on_bye(self, rank: int, msg: dict) -> None:
        self._byes[rank] = True
        last = msg.get("iteration")
        if isinstance(last, int) and not isinstance(last, bool):
            self._bye_at[rank] = last
            self._check_even()
        self._policy.on_bye(rank)
        if self._byes.all():
            self._flush_records(final=True)
            self.finished.set()

    def _check_even(self) -> None:
        """Fail the job when a worker ended while another went on to a later iteration:
        in synchronous training the others would wait for it forever."""
        if not self._bye_at or self.failure is not None \
                or not _modes.get(self.config.sync).barrier:
            return                  # without a barrier per iteration nobody waits for it
        last = self.collect.last_report.tolist()
        problem = uneven_end(self._bye_at, {r: t for r, t in enumerate(last) if t >= 0})
        if problem:
            self._fail(problem)

    # ---- the policies' view of the coordinator (mxlbbsp.modes.Control) ---------------------

    @property
    def current_split(self) -> Optional[np.ndarray]:
        """The split in force: the per-worker batch sizes of the latest iteration planned."""
        return self._in_force

    @property
    def planning(self) -> tuple:
        """(first, last): the iterations the split being planned is for."""
        return self._planning

    @property
    def measured(self) -> Optional[tuple]:
        """(batch sizes, compute seconds) per worker of the iteration being decided."""
        return self._measured

    def send(self, rank: int, msg: dict) -> None:
        """One message to worker ``rank`` (dropped when it is gone)."""
        self.links.send(rank, msg)

    def broadcast(self, msg: dict) -> None:
        """One message to every worker, encoded once (behind a relay: one frame for all)."""
        self.links.broadcast(msg)

    def send_split(self, iteration: int, split, until: Optional[int] = None) -> None:
        """Every worker its own slice of ``split``, iteration's global batch (with
        ``until``: of every iteration up to it; O(n) bytes)."""
        if until is None or until == iteration:
            self.links.send_split(iteration, split)
        else:
            self.links.send_split(iteration, split, until=until)

    def _fail(self, message: str, fatal_for_workers: bool = True, kind: str = "runtime") -> None:
        if self.failure is None:
            self.failure = message
            self.failure_kind = kind
            self.failed_at = time.monotonic()
            self.failure_fatal = fatal_for_workers
            log.debug("job failure: %s", message)
            if fatal_for_workers:
                self.links.broadcast(P.error(message))

    # ---- registration ---------------------------------------------------------------------

    def on_hello(self, msg: dict, writer) -> Optional[int]:
        """A worker's hello (``writer``: its own transport, or :class:`~mxlbbsp.core.links.
        ViaRelay`); its rank once registered, else None (after an error to it)."""
        n = self.config.num_workers
        rank = msg.get("rank")
        refused = (f"rank {rank!r} is outside 0..{n - 1}"
                   if not isinstance(rank, int) or not 0 <= rank < n else
                   f"rank {rank} connected twice" if rank in self._hellos else None)
        if refused:
            writer.write(P.encode(P.error(refused)))
            writer.close()          # (behind a relay: a CLOSE frame for that worker)
            return None
        self._hellos[rank] = msg
        self._hosts[rank] = msg.get("host")
        self.links.register(rank, writer)
        if len(self._hellos) == n:
            hellos = [self._hellos[r] for r in range(n)]
            problem = check_hellos(hellos, self.config, self._policy, self.balancer) \
                or self._policy.validate(hellos)
            if problem:
                self._fail(problem, kind="config")
            else:
                self._open()
        return rank

    def _open(self) -> None:
        """Every worker registered: the first split in ``welcome``, and with a policy that
        splits ahead, the next ones (decided before any report: no report splits them)."""
        policy, start = self._policy, self._start
        B = self.opening_batch(start)
        self._in_force = np.asarray(policy.first_split(B))
        resumed = self._resumed_split
        if resumed is not None and policy.sends and self.balancer.fits(resumed, B):
            self._in_force = resumed          # the split balancing had reached
        self._splits = {start: self._in_force}
        self._hand_off_forecasts()
        self.links.broadcast(P.welcome(self.config.num_workers, self.config.sync, self._in_force,
                                       self._period))
        self._planned = start + policy.ahead
        for k in range(1, 1 + policy.ahead):
            after = self._resumed_next if k == 1 else None
            if (after is not None and policy.sends
                    and self.balancer.fits(after, self.opening_batch(start + k))):
                # the checkpointed job's split of this iteration
                self.send_split(start + k, after)
                self._in_force = after
            else:
                self._in_force = np.asarray(policy.opening(start + k, self._in_force))
            self._splits[start + k] = self._in_force
            log.debug("iteration %d: split %s (before any report)", start + k,
                      _shown(self._in_force))

    @property
    def _period(self) -> float:
        """The control period: how long a worker may hold its reports (0: none). None with
        relays: they forecast and hold their host's sections per iteration, and the
        coordinator then decides every iteration, which held reports would make late."""
        if self.links.relays or not self._policy.decides_per_period:
            return 0.0
        return self.config.control_period

    def opening_batch(self, iteration: int) -> int:
        """The global batch the DataLoaders ask for at ``iteration``, split before any
        report: their B, or the short last batch of an epoch when the iteration falls on
        it."""
        if iteration:
            # a job may start (resumed) or continue at an epoch's short last batch: its
            # split, not B's, which each worker would scale down without the bounds
            return self._batch_at(iteration)
        return int(self._hellos[0]["global_batch_size"])

    def _hand_off_forecasts(self) -> None:
        """Every worker has said hello: with a separable predictor, each relay forecasts its
        own workers from now on (its CONFIG's ``forecast``; the part of a checkpoint's
        predictor state that is theirs, when the job resumed)."""
        speed, cfg = self.speed, self.config
        if not any(relay.ranks for relay in self.links.relays) or not speed.separable():
            return
        full = speed.hand_off(self.links.behind(cfg.num_workers))
        relays = self.links.hand_off(
            {"predictor": speed.predictor_name, "exog": list(cfg.exog),
             "from": self._start + cfg.warmup, "ranks": list(range(cfg.num_workers)),
             "state": full}, speed.part_of)
        log.debug("the relays (%d connection(s)) forecast their %d workers (%s); the coordinator "
                  "the other %d", relays, int(speed.remote.sum()), speed.predictor_name,
                  len(speed.local))

    # ---- iterations -----------------------------------------------------------------------

    def on_rows(self, rows) -> None:
        """A batch of reports, or of dones, of one iteration (:class:`~mxlbbsp.core.frames.
        Rows`); WorkerError for a malformed one."""
        if rows.what == P.REPORT:
            decided = self.collect.reports(rows)
            if rows.kind("batchnorm") is not None and self.config.min_batch_size is None \
                    and self._hellos and any(rows.values("batchnorm")):
                # the model has BatchNorm layers: keep its statistics sane (auto_min_batch)
                self.balancer.min_batch = max(self.balancer.min_batch, auto_min_batch(
                    int(self._hellos[0]["global_batch_size"]), self.config.num_workers, True))
            if self._bye_at:
                self._check_even()
            # The metrics records are built by the recorder's thread: nothing on the path
            # from the last report to the broadcast that need not be there.
            self.recorder.add(rows)
            if self._hooks[P.REPORT]:
                for rank, msg in zip(rows.ranks.tolist(), rows.dicts()):
                    self._policy.on_report(rank, msg)
            if decided is not None:
                self.decide(*decided)
            return
        self.recorder.add(rows)
        if self._hooks[P.DONE]:
            for rank, msg in zip(rows.ranks.tolist(), rows.dicts()):
                self._policy.on_done(rank, msg)
        samples = self.collect.dones(rows)
        if samples is not None:
            self._finished(rows.iteration, samples)

    def decide(self, t: int, next_B: Optional[int], columns: np.ndarray,
               forecast: Optional[tuple] = None, after_B: Optional[int] = None) -> None:
        """All n reports of iteration t are in: learn from them and split iteration
        t+1+ahead (the policy's). ``columns``: per worker [batch, compute_s, the --exog
        columns...] (Collector); ``next_B``, ``after_B``: rank 0's next_global_batch and
        after_next_global_batch; ``forecast``: the relays' forecasts."""
        started = time.perf_counter()
        policy = self._policy
        B = policy.global_batch(t, next_B, after_B)
        lease = self._lease(t, B)
        learning = t >= self._start + self.config.warmup
        if lease is None:            # planned far enough ahead: learnt from with the next plan
            if learning:
                self.speed.fit_step(t, columns[:, 0].copy(), columns[:, 1].copy())
            self._window.append(columns)
            return
        target, last = self._planning = lease
        fitted = bool(self._window)
        if fitted:
            if learning:             # the fit and the regime take every iteration
                self.speed.fit_step(t, columns[:, 0].copy(), columns[:, 1].copy())
            self._window.append(columns)
            columns = _mean(self._window)
            self._window = []
        if target != t + 1 + policy.ahead:
            B = self._batch_at(target)
        # contiguous copies: the same arrays (and sums) as built from the reports
        batch, compute = columns[:, 0].copy(), columns[:, 1].copy()
        exog = np.ascontiguousarray(columns[:, 2:])
        self._measured = (batch, compute)
        for old in [k for k in self._splits if k < t]:
            del self._splits[old]
        # the split in force (the latest planned), scaled to the B of the one planned now
        in_force = self._in_force
        if in_force is not None and B is not None and int(in_force.sum()) != B:
            in_force = self.balancer.scale(in_force, B, bounds=False)
        if t < self._start + self.config.warmup:
            # Iteration 0 builds graphs and allocates memory: not a speed worth learning.
            if B is not None and in_force is not None:
                self._planned_as(np.asarray(policy.warmup(t, B, in_force)))
                log.debug("iteration %d: split %s (warm-up: no speed learnt yet)",
                          target, _shown(self._in_force))
            return
        model = self.speed.model(t, batch, compute, exog, forecast, fitted=fitted)
        if B is None:
            return
        self.balancer.decision = ""
        try:
            split = policy.plan(t, model, B, in_force)
        except _split.SplitError as exc:
            self._fail(f"cannot split the global batch of iteration {target}: {exc}")
            return
        if policy.sends:
            self.split_latency.append(time.perf_counter() - started)
        self._planned_as(np.asarray(split))
        # What the predictor expects each worker's observed speed to be at those iterations
        # (a forecast of the next one stands for them)
        predicted = self._in_force / model.time(self._in_force)
        for k in range(target, last + 1):
            self.recorder.predicted[k] = predicted
            self._planned_from[k] = t
        if log.isEnabledFor(logging.DEBUG):
            log.debug("iteration %s: split %s of %d; predicted speeds %s samples/s; %s",
                      target if last == target else f"{target}-{last}",
                      _shown(self._in_force), int(self._in_force.sum()), _shown(predicted),
                      self.balancer.decision or f"{self.config.sync}'s own split")
        self.speed.learn()     # training, after the broadcast: off the critical path
        policy.after_split(t)

    def _planned_as(self, split: np.ndarray) -> None:
        """The split of the iterations being planned (:attr:`planning`) is ``split``."""
        first, last = self._planning
        self._in_force = split
        for k in range(first, last + 1):
            self._splits[k] = split
        self._planned = max(self._planned, last)

    def _lease(self, t: int, B: Optional[int]) -> Optional[tuple]:
        """The iterations to plan now that the reports of t are in: (first, last), or None
        when they are planned far enough ahead already.

        A decision per iteration plans t+1+ahead. On iterations shorter than the control
        period (``--control-period``), one decision per period: the split then holds for a
        lease of k = period / iteration time iterations, planned so far ahead that a worker
        never waits for it although its reports come once per period: a report goes out at
        the worker's first stop once a period has passed (up to k + 1 iterations late, the
        engine's lead of two besides), and the next lease is planned 2k + 1 iterations
        beyond t+1+ahead (k + 1 of them for the worker still to run); the predictor learns
        from the mean of the iterations reported since the last plan. Not during the warm-up,
        with relays (which forecast per iteration), or once a loader's B left the epochs'
        plan (a lease is cut where B changes: the coordinator follows the plan itself)."""
        natural = t + 1 + self._policy.ahead
        k = self._lease_length(t, B, natural)
        if k == 1:
            return None if self._planned >= natural else (natural, natural)
        need = natural + 2 * k + 1
        if self._planned >= need:
            return None
        first = self._planned + 1
        last = min(max(need, self._planned + k), self._planned + LEASE_MOST)
        size = self._batch_at(first)
        for x in range(first + 1, last + 1):
            if self._batch_at(x) != size:            # an epoch's short last batch: its own
                last = x - 1
                break
        return first, last

    def _lease_length(self, t: int, B: Optional[int], natural: int) -> int:
        """How many iterations the next split holds (1: a decision per iteration)."""
        period = self._period
        if period <= 0 or self._leases_off or B is None \
                or t < self._start + self.config.warmup or len(self._recent) < RATE_OVER:
            return 1
        if B != self._batch_at(natural):
            # the loader does not follow the epochs' plan (e.g. a loader made anew within an
            # epoch): from here on, B as rank 0 announces it, every iteration
            self._leases_off = True
            log.debug("iteration %d: the loader's global batch %d is not the epoch plan's %d: "
                      "a decision per iteration from now on", natural, B,
                      self._batch_at(natural))
            return 1
        (t0, _), (t1, _) = self._recent[0], self._recent[-1]
        each = (t1 - t0) / (len(self._recent) - 1)
        if not each > 0:
            return 1
        return int(min(LEASE_MOST, max(1, round(period / each))))

    def _batch_at(self, iteration: int) -> int:
        """The global batch the DataLoaders ask for at ``iteration`` (their epochs' plan)."""
        hello = self._hellos[0]
        if not hello.get("dataset_size"):
            return int(hello["global_batch_size"])
        if self._epochs is None:
            self._epochs = epoch_plan(hello)
        plan = self._epochs
        return plan.batch(plan.position(iteration)[1])[1]

    def _on_log(self, rank: int, msg: dict) -> None:
        """The script's values of an iteration (mxlbbsp.log): into that record's scalars."""
        t = msg.get("iteration")
        if not isinstance(t, int) or isinstance(t, bool):
            raise P.ProtocolError("a log message needs an integer iteration")
        values = P.scalars_of(msg)
        if t <= self.recorder.logged[rank]:
            log.debug("worker %d logged values of iteration %d after its record was written; "
                      "left out", rank, t)
            return
        self.recorder.add_scalars(t, rank, values)

    def _finished(self, t: int, samples: int) -> None:
        """All n dones of iteration t are in (``samples``: its global batch)."""
        if t > self._iteration:
            self._iteration = t
            self._samples += samples
            now = time.monotonic()
            self._last_change = now
            self._recent.append((now, self._samples))
            del self._recent[:-50]
        if self._loop is not None:
            # after what was read with these dones: a relay's dones come with its next
            # reports, and the records' writer (another thread, the same GIL) should not
            # start while the split those reports decide is being made
            self._loop.call_soon(self._flush_records)
        else:
            self._flush_records()
        self._maybe_checkpoint(t)

    def _flush_records(self, final: bool = False) -> None:
        """Hand every complete record (all of them at the end) to the recorder's writer."""
        self.recorder.flush(self._iteration, self.collect.last_report, self._byes,
                            self._hosts, self.speed.fallbacks, self._record_fields,
                            final=final)
        parts = self.recorder.parts
        for t in [t for t in self._planned_from if t <= self._iteration and t not in parts]:
            del self._planned_from[t]

    def _record_fields(self, t: int) -> dict:
        """The mode's fields of iteration ``t``'s records, and ``planned_from``: the last
        iteration whose reports its split was decided from (t-1-ahead with a decision per
        iteration; earlier under a lease, :meth:`_lease`)."""
        fields = self._policy.record_fields(t)
        planned = self._planned_from.get(t)
        return fields if planned is None else {**fields, "planned_from": planned}


def _mean(columns: List[np.ndarray]) -> np.ndarray:
    """The mean of several iterations' report columns, NaN where none had a value."""
    stack = np.stack(columns)
    have = ~np.isnan(stack)
    counts = have.sum(axis=0)
    sums = np.where(have, stack, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _shown(values, most: int = 16) -> str:
    """Per-worker values (batch sizes, speeds) for a log line, rounded: all of them up to
    ``most``, else a summary."""
    values = np.asarray(values, dtype=float)
    if len(values) <= most:
        return ",".join(f"{v:.0f}" for v in values)
    return (f"min {values.min():.0f}, median {np.median(values):.0f}, max "
            f"{values.max():.0f} over {len(values)} workers")

