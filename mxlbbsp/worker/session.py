"""A worker's side of a job: its rank, its batch sizes, its timing, its talk with the coordinator.

One :class:`Session` per process, created by the first :class:`mxlbbsp.DataLoader` iteration
(:func:`open_session`) and found by :class:`mxlbbsp.Trainer` (:func:`current`). Outside a
launched job (no ``MXLBBSP_COORDINATOR``) it is a one-worker session that never talks to
anybody: the loader gets the whole global batch.

The loader and the trainer tell the session what they know through its methods, and write
none of its attributes: the loader an epoch's length and the iteration a resumed job starts
at (:meth:`Session.begin_epoch`), global batches chosen as the job runs
(:meth:`Session.follow`), B(t+1) and B(t+2) for the report of t (:meth:`Session.announce`);
the trainer the model (:meth:`Session.describe_model`) and, in a mode that asks for them,
the gradients' norms with the report and the done.

Timeline of iteration t on a worker, and what is measured::

    |-- wait for b(t) --|-- load + forward + backward --|-- slowdown --|- slot -|- push/pull -|
    |<- slice wait ---->|<------- compute_s (stretched by the factor) ->|<-slot->|<- sync_s ->|
    wait_s = slice wait + slot wait + sync_s          iteration_s = compute_s + wait_s

(the slot wait is the mode's ``before_push``: r2sp waits there for the push slot the
coordinator grants; it is 0 in the other modes)

``compute_s`` is everything the worker does on its own (it grows with its batch);
``wait_s`` is time spent waiting for the others. The report of t (batch, compute_s, host CPU and
memory load) is sent as soon as the gradients are ready; in lbbsp the coordinator's answer is
b(t+2) (b(t+1) went out an iteration before), so the worker waits for its slice only when the
coordinator is a whole iteration late.

No framework import here: the caller waits for MXNet's asynchronous engine before it calls
:meth:`Session.gradients_ready` and :meth:`Session.step_done`, or, where it does not wait
(dist_sync, :mod:`mxlbbsp.worker.engine`), hands the engine :meth:`Session.report_when_ready`
and :meth:`Session.done_when_finished`, which read the clock on the engine's thread when the
arrays are ready and leave the messages for the main thread to send at its next stop
(:meth:`Session.send_pending`: the next batch asked for, any wait of the session).

(Most of this module is :class:`Session`: see its docstring for why it is one class.)
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
import threading
import time
from typing import Callable, Dict, List, Optional

from mxlbbsp import modes as _modes
from mxlbbsp.core import env as _env
from mxlbbsp.core import lr as _lr
from mxlbbsp.core import protocol as P
from mxlbbsp.core import signals as _signals
from mxlbbsp.core import split as _split
from mxlbbsp.core.slowdown import Schedule
from mxlbbsp.worker import timeline as _timeline

log = logging.getLogger(__name__)

_session: Optional["Session"] = None
#: at the end, how long the bye waits for the reports and dones still in the engine
CLOSE_FLUSH_S = 30.0
_lock = threading.Lock()


class JobAborted(SystemExit):
    """The coordinator stopped the job (it names the reason, and the launcher prints it).

    A ``SystemExit`` with code 2, so the worker ends quietly, with no traceback, and the one
    line the user sees is the launcher's.
    """

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


class CoordinatorLost(RuntimeError):
    """The connection to the coordinator broke (the launcher died or the network failed)."""


def misuse(message: str) -> SystemExit:
    """A script that uses mxlbbsp wrongly inside a job: one line, then SystemExit(2) to raise
    (the job ends at once, and the launcher names the worker and the line)."""
    return _env.refuse(message)


def current() -> Optional["Session"]:
    """The session of this process, if a DataLoader has opened one."""
    return _session


def open_session(global_batch_size: int, dataset_size: int, min_global_batch: int,
                 max_batch_size: Optional[int] = None,
                 identity: Optional[Callable[[], dict]] = None) -> "Session":
    """The process's session, opening it on first use (connects to the coordinator).
    ``identity``: what the hello says of the data and its order (the loader's
    :meth:`~mxlbbsp.worker.dataloader.DataLoader.identity`), computed only when a hello is
    sent."""
    global _session
    with _lock:
        if _session is None:
            _session = Session(global_batch_size, dataset_size, min_global_batch, max_batch_size,
                               identity=identity)
            atexit.register(close_session)
        elif _session.global_batch_size != global_batch_size:
            raise ValueError(
                f"this process already trains with a global batch size of "
                f"{_session.global_batch_size}; a second mxlbbsp.DataLoader with "
                f"{global_batch_size} cannot join the same job (use gluon.data.DataLoader for "
                "evaluation)")
        return _session


def close_session() -> None:
    """Say goodbye to the coordinator and forget the session (tests; also at exit)."""
    global _session
    with _lock:
        if _session is not None:
            _session.close()
            _session = None



def engine_compute(start: float, issued: float, previous_end: Optional[float], now: float,
                   untimed: float = 0.0) -> float:
    """A worker's compute time of an iteration whose report the engine timed, in seconds.

    ``start``: the slice known on the main thread; ``issued``: the main thread done issuing
    the iteration's forward and backward passes; ``previous_end``: the engine done with the
    step before (None on the first); ``now``: the gradients ready; ``untimed``: seconds in
    :meth:`Session.untimed`.

    The engine's part runs from the later of ``start`` and ``previous_end``. But the main
    thread may have issued the whole iteration while the engine still waited for the step
    before (the pull of the other workers' gradients): the engine then runs the forward and
    backward passes in a fraction of what the iteration costs this worker, whose Python
    issuing them is its critical path. So the compute is the longer of the two: on a 2 ms
    MLP under load, the engine's part alone read 0.3-0.5 ms in one report of six, and the
    split of two equal workers went to 44:20."""
    begin = max(start, previous_end if previous_end is not None else start)
    return max(max(now - begin, issued - start) - untimed, 1e-9)

class Session:
    """See the module docstring. Use :func:`open_session`, not the constructor.

    Longer than most classes here, on purpose: it is the one timeline of a
    worker's iteration (wait for the split, compute, the mode's wait, push/pull) that the
    loader, the trainer and the mode's worker half each drive a part of, and its timings are
    differences of clock readings taken in different methods under one lock. Its parts that
    stand alone are elsewhere: the contention signals (core.signals), the slowdown schedule
    (core.slowdown), a mode's own messages and waits (the mode's ``attach``).
    """

    def __init__(self, global_batch_size: int, dataset_size: int, min_global_batch: int,
                 max_batch_size: Optional[int] = None, env=None,
                 identity: Optional[Callable[[], dict]] = None):
        self.global_batch_size = int(global_batch_size)
        self.rank = _env.rank(env)
        try:
            self.sync = _modes.from_env(env).name
        except _env.EnvError as exc:
            raise _env.refuse(exc) from None
        self.mode = _modes.get(self.sync)
        #: the coordinator chooses each global batch B(t) (a mode like courier)
        self.sets_batch = self.mode.sets_batch
        #: a single process replays recorded global batch sizes (DataLoader batch_schedule)
        self._replaying = False
        #: a replay's learning-rate factor of each iteration, as its job recorded them
        #: (DataLoader batch_schedule from a metrics file); None: the rule's
        self._lr_schedule: Optional[List[float]] = None
        self.lr_scaling = _env.lr_scaling(env)
        self.host = _env.host(env)
        self.slowdown = Schedule.decode(_env.slowdown(env))
        self.sample_cost = _env.sample_cost(env)
        self.iteration = -1
        self.reported = -1                # the last iteration whose report went out
        self.first_iteration = 0          # > 0 when the job resumed from a checkpoint
        self.epoch_length = None          # global batches per epoch (the loader's, checkpoints)
        self.dataset_size = int(dataset_size)
        self.batch_global = 0             # global batch of the current iteration
        self.batch_local = 0
        self._slices: Dict[int, _split.Slice] = {}
        self._cond = threading.Condition()
        self._failure: Optional[str] = None
        self._lost = False
        self._listeners: List[Callable[[int, _split.Slice], None]] = []
        self._sock: Optional[socket.socket] = None
        self._send_lock = threading.Lock()
        self._t_end = None                # when the previous step ended
        self._t_ready = None              # when this iteration's gradients were ready
        #: engine-timed: how long the engine idled between the step before and this
        #: iteration's compute (the report's function sets it, the done's reads it)
        self._idle = float("inf")
        self._t_start = None              # when this iteration's slice was known
        # the report and done of an iteration the engine sends (report_when_ready,
        # done_when_finished): how many were handed over and have run, the last iteration
        # whose done went out, and what failed on the engine's thread
        self._scheduled = 0
        self._fired = 0
        self._outbox: list = []
        #: how long reports, dones and logs may wait in the outbox to go in one write (the
        #: welcome's period_s; 0: each at once), and when the outbox was last sent
        self._period = 0.0
        self._flushed = 0.0
        #: the last iteration whose step has ended (the engine's done, or step_done)
        self.finished = -1
        self._slice_wait = 0.0
        self._push_wait = 0.0             # in the mode's before_push (r2sp: its push slot)
        #: the mode's handlers of its own messages (SyncMode.attach registers them)
        self._handlers: Dict[str, Callable[[dict], None]] = {}
        #: what the mode's worker half keeps per session (SyncMode.attach's result)
        self.mode_half = None
        self._untimed = 0.0               # seconds inside untimed() since the last step
        self._compute = 0.0
        self._signals: Optional[_signals.Signals] = None   # contention over the compute phase
        self._read_load = False                  # cpu_percent, mem_percent asked for
        #: what the trainer tells the coordinator once, with its first report
        #: (:meth:`describe_model`)
        self.model_info: Dict[str, object] = {}
        self._info_sent = False
        #: B(t+1) and B(t+2) as the loader announced them (:meth:`announce`)
        self._announced: tuple = (self.global_batch_size, None)
        #: the phases' clock readings (MXLBBSP_TIMELINE), or None: off
        self.clock: Optional[_timeline.Timeline] = _timeline.from_env(self.rank, env)
        addr = _env.coordinator(env)
        if addr is None:
            self.num_workers = 1
            self.rank = 0
            self._initial = _split.Slice(0, self.global_batch_size, self.global_batch_size)
            return
        self.num_workers = _env.num_workers(env)
        self._connect(addr, _env.token(env), dataset_size, min_global_batch, max_batch_size,
                      identity)

    # ---- connection ---------------------------------------------------------------------

    @property
    def coordinated(self) -> bool:
        return self._sock is not None

    def _connect(self, addr, token, dataset_size, min_global_batch, max_batch_size,
                 identity=None):
        deadline = time.monotonic() + 60
        while True:
            try:     # the coordinator's address, or its host's relay's (a Unix socket)
                sock = P.connect(addr, timeout=10)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    hint = ("" if not isinstance(addr, str) else
                            " (its host's relay: a worker that does not share this host's "
                            "files, e.g. in a container, needs `mxlbbsp launch --relay off`)")
                    raise CoordinatorLost(f"cannot reach the coordinator at "
                                          f"{P.format_address(addr)}: {exc}{hint}") from None
                time.sleep(0.2)
        sock.settimeout(None)
        self._sock = sock
        columns = _env.signals()
        if columns is None:
            columns = _signals.AUTO
        # only what the launcher asks for (--signals, --exog): reading costs time in the
        # compute phase, and the tail a thread (see mxlbbsp/core/signals.py)
        self._read_load = "cpu_percent" in columns or "mem_percent" in columns
        if self._read_load:
            _host_load()  # the first CPU reading only starts psutil's interval
        self._signals = _signals.Signals(columns=columns)
        self._signals.begin()
        hello = P.hello(self.rank, token, os.getpid(), self.host, self.global_batch_size,
                        dataset_size, max_batch_size)
        hello["min_global_batch"] = int(min_global_batch)
        if identity is not None:
            hello.update(identity())        # the data's fingerprint and its order
        self.send(hello)
        self._file = sock.makefile("rb")
        welcome = self._read()
        if welcome is None:
            raise CoordinatorLost("the coordinator closed the connection during registration")
        if welcome["type"] == P.ERROR:
            raise JobAborted(welcome["message"])
        if welcome["type"] != P.WELCOME:
            raise CoordinatorLost(f"unexpected first message {welcome['type']!r}")
        self.num_workers = int(welcome["num_workers"])
        self._initial = _split.slice_of(welcome["split"], self.rank)
        self._period = float(welcome.get("period_s") or 0.0)
        self.slowdown.start()          # a timed slowdown trace counts from the registration
        self.mode_half = self.mode.attach(self)
        threading.Thread(target=self._receive, name="mxlbbsp-session", daemon=True).start()

    def _read(self) -> Optional[dict]:
        line = self._file.readline(P.MAX_LINE + 1)
        return P.decode(line) if line else None

    def _receive(self) -> None:
        try:
            while True:
                msg = self._read()
                if msg is None:
                    break
                if msg["type"] == P.SLICE:
                    until = msg.get("until")
                    self.set_slice(int(msg["iteration"]), _split.Slice(
                        int(msg["offset"]), int(msg["size"]), int(msg["total"])),
                        None if until is None else int(until))
                elif msg["type"] == P.ERROR:
                    with self._cond:
                        self._failure = msg["message"]
                        self._cond.notify_all()
                elif msg["type"] in self._handlers:
                    self._handlers[msg["type"]](msg)
        except (OSError, P.ProtocolError, ValueError, KeyError, TypeError):
            pass
        with self._cond:
            self._lost = True
            self._cond.notify_all()

    # ---- the seam of a mode's worker half (mxlbbsp.modes.WorkerSession) -------------------

    def on(self, kind: str, handler: Callable[[dict], None]) -> None:
        """Call ``handler(msg)`` on the receiving thread for each message of type ``kind``."""
        self._handlers[kind] = handler

    def set_slice(self, iteration: int, part: _split.Slice,
                  until: Optional[int] = None) -> None:
        """This worker's slice of ``iteration``'s global batch has come (with ``until``: of
        every iteration from ``iteration`` to ``until``): the loader may cut it."""
        last = iteration if until is None else max(int(until), iteration)
        with self._cond:
            for t in range(iteration, last + 1):
                self._slices[t] = part
            self._cond.notify_all()
        for fn in list(self._listeners):
            for t in range(iteration, last + 1):
                fn(t, part)

    def update(self, change: Callable[[], None]) -> None:
        """Run ``change()`` under the session's lock and wake whoever waits (wait_until)."""
        with self._cond:
            change()
            self._cond.notify_all()

    def wait_until(self, ready: Callable[[], bool], hold: bool = False) -> None:
        """Block until ``ready()`` (checked under the lock after each update); raises when
        the job failed or the coordinator is gone. What the outbox holds goes out at once
        (the coordinator may need it to answer what this worker waits for), or with
        ``hold`` (a wait for this worker's own engine) once the control period has passed,
        as at any stop: the main thread waits for its engine nearly every iteration of a
        small model, and a write each time was the cost the period saves."""
        while True:
            with self._cond:
                if ready():
                    return
                self._check_going()
                if hold and self._outbox:
                    left = self._period - (time.monotonic() - self._flushed)
                    if left > 0:
                        self._cond.wait(min(left, 1.0))
                elif not self._outbox:
                    self._cond.wait(1.0)
            self.send_pending(force=not hold)

    def halt(self) -> None:
        """Wait here until the job ends under this worker (an elastic job's hand-over: the
        launcher stops every process once the state is saved); raises as wait_until."""
        self.wait_until(lambda: False)

    def send(self, msg: dict) -> None:
        """One protocol message to the coordinator (nothing outside a job), after what the
        outbox holds, in the same write: messages go in the order they were made."""
        if self._sock is None:
            return
        self.send_pending(force=True, then=P.encode(msg))

    def _send_bytes(self, data: bytes) -> None:
        if self._sock is None:
            return
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise CoordinatorLost(f"lost the connection to the coordinator: {exc}") from None

    def on_slice(self, fn: Callable[[int, _split.Slice], None]) -> None:
        """Call ``fn(iteration, slice)`` (on a background thread) when a slice arrives."""
        self._listeners.append(fn)

    # ---- what the loader and the trainer tell it -----------------------------------------

    def begin_epoch(self, length: int, first_iteration: int = 0) -> None:
        """The loader begins an epoch of ``length`` global batches (a checkpoint records the
        position in it). ``first_iteration``: the iteration the job resumed at from a
        checkpoint (0: none); the session numbers its iterations from there, once."""
        self.epoch_length = length
        if self.iteration < 0 and first_iteration > 0:
            self.first_iteration = first_iteration
            self.iteration = first_iteration - 1

    def follow(self, replay: bool, lr_schedule: Optional[List[float]] = None) -> None:
        """The loader cuts global batches chosen as the job runs: by the coordinator
        (:attr:`sets_batch`), or with ``replay`` by a recorded ``batch_schedule``, which a
        single process replays; ``lr_schedule``: the learning-rate factor the job recorded
        for each iteration (None: the ``--lr-scaling`` rule's, :meth:`lr_factor`)."""
        self._replaying = replay and not self.coordinated
        if self._replaying:
            self._lr_schedule = lr_schedule

    def announce(self, next_global_batch: Optional[int],
                 after_next_global_batch: Optional[int] = None) -> None:
        """B(t+1) and B(t+2) as the loader sees them, which the report of the current
        iteration carries: the coordinator splits them ahead. ``after_next_global_batch``
        None: the loader does not know it (the coordinator chooses B(t+1))."""
        self._announced = (next_global_batch, after_next_global_batch)

    def next_global_batch(self) -> Optional[int]:
        """B(t+1) as the loader announced it (the global batch size until it has)."""
        return self._announced[0]

    def describe_model(self, info: Dict[str, object]) -> None:
        """What the first report tells the coordinator of the model and the optimizer: the
        optimizer's momentum, whether the model has BatchNorm layers (the diagnoses and the
        default --min-batch-size). Sent once; later descriptions are ignored."""
        if not self.model_info:
            self.model_info = dict(info)

    # ---- slices ------------------------------------------------------------------------

    def slice(self, iteration: int, global_batch: Optional[int],
              block: bool = True) -> Optional[_split.Slice]:
        """This worker's slice of the global batch of ``global_batch`` samples at ``iteration``.

        A mode whose coordinator sends splits (``lbbsp``, ``r2sp``, ``courier``) waits
        for it from iteration 1 on; the other modes, and a single process, know their split at
        once. ``global_batch=None``: the size the coordinator chose (:attr:`sets_batch`), the
        slice as it came. With ``block=False``, None when not known.
        """
        if iteration == self.first_iteration:
            part = self._initial
        elif not self.coordinated or not self.mode.follows_splits:
            part = _split.equal_slice(global_batch, self.num_workers, self.rank)
        else:
            part = self._wait_slice(iteration, block)
            if part is None:
                return None
        if global_batch is None:
            return part
        return self.rescale(part, global_batch)

    def rescale(self, part: _split.Slice, global_batch: int) -> _split.Slice:
        """This worker's slice ``part`` scaled to a global batch of ``global_batch`` samples
        (an epoch's short last batch): the one place a worker rescales its slice, the same
        numbers the coordinator's side gets for the whole split
        (:func:`mxlbbsp.core.split.rescale_slice`)."""
        return _split.rescale_slice(part, self.rank, self.num_workers, global_batch)

    def _check_going(self) -> None:
        """Raise if the job ended under this worker: the coordinator announced a failure,
        or the connection to it broke. Call with ``self._cond`` held."""
        if self._failure is not None:
            raise JobAborted(self._failure)
        if self._lost:
            raise CoordinatorLost("lost the connection to the coordinator")

    def _wait_slice(self, iteration: int, block: bool) -> Optional[_split.Slice]:
        if block and iteration not in self._slices:
            self.wait_until(lambda: iteration in self._slices)
        with self._cond:
            if iteration not in self._slices:
                self._check_going()
                return None
            part = self._slices[iteration]
            for old in [k for k in self._slices if k < iteration - 1]:
                del self._slices[old]
        return part

    def next_iteration(self, global_batch: Optional[int]) -> tuple:
        """Start the next iteration: returns (iteration, offset, local batch size).

        ``offset`` is where this worker's slice starts inside the global batch.
        ``global_batch=None``: the coordinator chooses it (:attr:`sets_batch`); it is then
        :attr:`batch_global`.
        """
        t = self.iteration + 1
        with self._cond:
            if self._failure is not None:      # the job failed: stop here, in every mode
                raise JobAborted(self._failure)
        if self.coordinated and self.first_iteration <= self.iteration != self.reported:
            # the coordinator waits for that report before it answers: the job would stall
            raise misuse(
                f"iteration {self.iteration} of mxlbbsp.DataLoader ended without "
                "mxlbbsp.Trainer.step(), so the coordinator never heard of it; use "
                "mxlbbsp.Trainer with mxlbbsp.DataLoader (a plain gluon.Trainer does not "
                "report), and call step() once per batch")
        self.send_pending()
        if self.clock is not None:
            self.clock.begin(t)
        start = time.perf_counter()
        if self._t_end is None:
            self._t_end = start
        part = self.slice(t, global_batch)
        global_batch = part.total
        self._t_start = time.perf_counter()
        self._slice_wait = self._t_start - start
        if self.clock is not None:
            self.clock.mark("alloc")
        self.iteration = t
        self.batch_global = int(global_batch)
        self.batch_local = part.size
        return t, part.offset, part.size

    def lr_factor(self) -> float:
        """How much the learning rate of this iteration is scaled: 1, unless the global
        batch is chosen as the job runs: the factor the coordinator sent for it (goodput's
        ``--lr-scaling adascale``), else the rule of B(t) / B0 (B0 the DataLoader's
        global_batch_size); in a replay from a metrics file, the factor the job recorded."""
        if not (self.sets_batch or self._replaying) or self.batch_global <= 0:
            return 1.0
        if self._replaying and self._lr_schedule is not None:
            return self._lr_schedule[self.iteration]
        given = self.mode.lr_factor(self) if self.coordinated else None
        if given is not None:
            return given
        return _lr.factor(self.lr_scaling, self.batch_global / self.global_batch_size)

    # ---- measurements -------------------------------------------------------------------

    @contextlib.contextmanager
    def untimed(self):
        """Time spent inside is not this worker's compute (e.g. rank 0 evaluating): the
        coordinator would otherwise take the worker for slower than it is."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._untimed += time.perf_counter() - start

    def gradients_ready(self, grad_sqr: Optional[float] = None) -> None:
        """Call once the gradients of this iteration are computed (engine synchronised).
        ``grad_sqr``: |sum of this worker's per-sample gradients|^2, in a mode that asks for
        it (``grad_norms``: goodput's noise scale), sent with the report."""
        now = time.perf_counter()
        compute = max(now - self._t_end - self._slice_wait - self._untimed, 1e-9)
        self._untimed = 0.0
        # Experiments: an emulated per-sample cost (a heavier model without using the CPU),
        # then the worker's slowdown factor stretches the whole compute phase.
        extra = self.sample_cost * self.batch_local
        factor = self.slowdown.factor(self.iteration)
        extra += (factor - 1.0) * (compute + extra)
        if extra > 0:
            time.sleep(extra)
            compute += extra
        self._compute = compute
        self._t_ready = time.perf_counter()
        if self.coordinated:
            if self._period > 0:
                # held for the next write (send_pending): its signals are read then
                with self._cond:
                    self._outbox.append((self.iteration, self.batch_local, self.batch_global,
                                         compute, factor, *self._announced,
                                         self.lr_factor(), grad_sqr))
            else:
                self.send(self._report(self.iteration, self.batch_local, self.batch_global,
                                       compute, factor, *self._announced, self.lr_factor(),
                                       grad_sqr))
        self.reported = self.iteration

    def _report(self, t: int, local: int, total: int, compute: float, factor: float,
                next_B: Optional[int], after_B: Optional[int], lr: float,
                grad_sqr: Optional[float] = None, load: Optional[tuple] = None) -> dict:
        """The report of iteration ``t``, with the host's load and the contention signals
        read now (``load``: (cpu, mem, signals) read once for the reports of one write)."""
        if load is None:
            load = self._load()
        cpu, mem, signals = load
        msg = P.report(t, local, compute, cpu, mem, factor, next_B, signals)
        msg["global_batch"] = total
        if after_B is not None:
            msg["after_next_global_batch"] = after_B
        if self.model_info and not self._info_sent:
            msg.update(self.model_info)
            self._info_sent = True
        if lr != 1.0:
            msg["lr_factor"] = lr
        if grad_sqr is not None:
            msg["grad_sqr"] = grad_sqr if math.isfinite(grad_sqr) else None
        return msg

    # ---- the same, timed by the engine (mxlbbsp.worker.engine) ---------------------------

    @property
    def emulated(self) -> bool:
        """An emulated slowdown or per-sample cost: the worker sleeps it in the compute
        phase, from the main thread (:meth:`gradients_ready`)."""
        return self.sample_cost > 0 or not (self.slowdown.constant
                                            and self.slowdown.factor(0) == 1.0)

    def report_when_ready(self) -> Callable[[], None]:
        """This iteration's report, as a function for MXNet's engine to call once the
        gradients are ready (instead of :meth:`gradients_ready` after waiting for them).

        What the main thread knows of the iteration is taken now; the function only reads
        the clock and leaves the report in the outbox (the engine's thread waits while it
        runs), and the main thread sends it at its next stop (:meth:`send_pending`), with
        the contention signals read then. The compute phase is :func:`engine_compute`'s;
        no emulated cost (:attr:`emulated`: those take the waiting path)."""
        t, local, total = self.iteration, self.batch_local, self.batch_global
        fields = self._announced + (self.lr_factor(),)
        start, untimed = self._t_start, self._untimed
        issued = time.perf_counter()
        self._untimed = 0.0
        self.reported = t
        self._handed_over()

        def report() -> None:
            now, end = time.perf_counter(), self._t_end
            compute = engine_compute(start, issued, end, now, untimed)
            self._compute, self._t_ready = compute, now
            # the engine idled from the step before to this compute: the most of the main
            # thread's wait for this slice that held the worker up (the rest overlapped it)
            self._idle = max(start - end, 0.0) if end is not None else float("inf")
            self._post(None, (t, local, total, compute) + fields)
        return report

    def done_when_finished(self) -> Callable[[], None]:
        """This iteration's done, as a function for the engine to call once the step's
        update is done (instead of :meth:`step_done` after waiting for it); as
        :meth:`report_when_ready`, sent by the main thread. Its wait counts the main
        thread's wait for the slice only as far as the engine idled for it (the main thread
        may wait while the engine still runs the step before)."""
        t, slice_wait = self.iteration, self._slice_wait
        self._handed_over()

        def done() -> None:
            now = time.perf_counter()
            sync = now - (self._t_ready if self._t_ready is not None else now)
            iteration_s = now - (self._t_end if self._t_end is not None else now)
            self._t_end = now
            waited = min(slice_wait, self._idle) + sync
            self._post(t, P.done(t, waited, sync, iteration_s))
        return done

    def _handed_over(self) -> None:
        with self._cond:
            self._scheduled += 1

    def _post(self, finished: Optional[int], item) -> None:
        """On the engine's thread: a done (a message) or a report's figures (a tuple) for
        the main thread to send."""
        with self._cond:
            self._outbox.append(item)
            self._fired += 1
            if finished is not None:
                self.finished = finished
            self._cond.notify_all()

    def _load(self) -> tuple:
        """(host CPU %, memory %, the contention signals) now: over the window since the
        previous reading."""
        cpu, mem = _host_load() if self._read_load else (None, None)
        return cpu, mem, self._signals.read()

    def send_pending(self, force: bool = False, then: bytes = b"") -> None:
        """Send what the outbox holds in one write (and ``then``, a message after it): the
        reports and dones the engine timed (:meth:`report_when_ready`,
        :meth:`done_when_finished`), and with a control period (the welcome's ``period_s``)
        the reports, dones and logs held for it. Unless ``force``d, held ones wait until the
        period has passed since the last write: on a model of a few milliseconds a write
        per message was a large part of a worker's and the coordinator's CPU. The host's
        load and the contention signals are read here, once for every report of the write:
        over the window since the previous one (the engine's thread does not read them)."""
        if not self._outbox:
            if then:
                self._send_bytes(then)
            return
        now = time.monotonic()
        if not (force or then) and self._period > 0 and now - self._flushed < self._period:
            return
        with self._cond:
            items, self._outbox = self._outbox, []
        self._flushed = now
        data, load = [], None
        for item in items:
            if isinstance(item, tuple):
                if load is None:
                    load = self._load()
                if len(item) == 7:          # engine-timed: no slowdown, no gradient norm
                    item = self._report(*item[:4], 1.0, *item[4:], load=load)
                else:
                    item = self._report(*item, load=load)
            data.append(item if isinstance(item, bytes) else P.encode(item))
        if then:
            data.append(then)
        self._send_bytes(b"".join(data))

    def wait_finished(self, iteration: int) -> None:
        """Block until the engine has finished the step of ``iteration`` (sending what it
        timed meanwhile; raises as wait_until)."""
        if self.finished < iteration:
            self.wait_until(lambda: self.finished >= iteration, hold=True)
        self.send_pending()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until the engine has timed every report and done handed to it, and send them
        (before a message that must follow them: a checkpoint's, the bye); False on
        ``timeout`` or when the coordinator is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.send_pending(force=True)
            with self._cond:
                if self._fired >= self._scheduled and not self._outbox:
                    return True
                if self._failure is not None or self._lost:
                    return False
                left = 1.0 if deadline is None else min(deadline - time.monotonic(), 1.0)
                if left <= 0:
                    return False
                if not self._outbox:
                    self._cond.wait(left)

    def send_scalars(self, iteration: int, values: Dict[str, float]) -> None:
        """The script's values of ``iteration`` (:func:`mxlbbsp.log`) to the coordinator."""
        if self.coordinated:
            if self._period > 0:
                with self._cond:
                    self._outbox.append(P.encode(P.log(iteration, values)))
                self.send_pending()
            else:
                self.send(P.log(iteration, values))

    def before_push(self) -> None:
        """Call between :meth:`gradients_ready` and the push: whatever the mode waits for
        (r2sp: its push slot). The time it takes counts as waiting, not as push/pull."""
        start = time.perf_counter()
        self.mode.before_push(self)
        self._push_wait = time.perf_counter() - start

    def step_done(self, global_grad_sqr: Optional[float] = None) -> None:
        """Call once this iteration's push/pull has completed (engine synchronised).
        ``global_grad_sqr``: rank 0's |sum of every worker's gradients|^2 after the pull, in
        a mode that asks for it (as :meth:`gradients_ready`'s), sent with the done."""
        now = time.perf_counter()
        sync = now - (self._t_ready if self._t_ready is not None else now) - self._push_wait
        iteration_s = now - self._t_end
        self._t_end = now
        self.finished = self.iteration
        if self.coordinated:
            msg = P.done(self.iteration, self._slice_wait + self._push_wait + sync, sync,
                         iteration_s)
            if global_grad_sqr is not None:
                msg["global_grad_sqr"] = (global_grad_sqr
                                          if math.isfinite(global_grad_sqr) else None)
            if self._period > 0:
                # the signals' window runs from one write to the next (send_pending)
                with self._cond:
                    self._outbox.append(msg)
                self.send_pending()
            else:
                self._signals.begin()       # the next compute phase starts now
                self.send(msg)
        self._push_wait = 0.0

    def close(self) -> None:
        if self.clock is not None:
            self.clock.write()
            self.clock = None
        if self._sock is None:
            return
        # the engine's last report and done before the bye (they are on their way unless a
        # push/pull never ends: a worker gone)
        self.flush(timeout=CLOSE_FLUSH_S)
        try:
            self.send(P.bye(self.reported))
            self._sock.shutdown(socket.SHUT_WR)
        except (OSError, CoordinatorLost):
            pass
        self._sock.close()
        self._sock = None


class _HostLoad:
    """The host's CPU percent since the previous call and its memory percent, as psutil's
    ``cpu_percent(interval=None)`` and ``virtual_memory().percent`` compute them, from the
    first line of /proc/stat and the first lines of /proc/meminfo (psutil parses all of
    both, every iteration: a tenth of a millisecond of a tiny model's few); psutil where
    those files are missing."""

    def __init__(self):
        self._last: Optional[List[int]] = None
        self._proc = os.path.exists("/proc/stat") and os.path.exists("/proc/meminfo")

    def __call__(self):
        if not self._proc:
            import psutil
            return psutil.cpu_percent(interval=None), psutil.virtual_memory().percent
        try:
            stat, meminfo = _signals.read_proc("/proc/stat"), _signals.read_proc("/proc/meminfo")
            if stat is None or meminfo is None:
                raise OSError("/proc/stat or /proc/meminfo cannot be read")
            now = [int(x) for x in stat.split(b"\n", 1)[0].split()[1:11]]
            mem = {}
            for line in meminfo.splitlines():
                key, value = line.split(b":", 1)
                mem[key] = int(value.split()[0])
                if b"MemAvailable" in mem:
                    break
        except (OSError, ValueError, IndexError):
            self._proc = False
            return self()
        last, self._last = self._last or now, now
        d = [max(b - a, 0) for a, b in zip(last, now)]
        d += [0] * (10 - len(d))
        # psutil's: guest and guest_nice are inside user and nice; idle and iowait are idle
        total = sum(d) - d[8] - d[9]
        cpu = round(100.0 * (total - d[3] - d[4]) / total, 1) if total > 0 else 0.0
        memory = mem.get(b"MemTotal", 0)
        avail = min(mem.get(b"MemAvailable", mem.get(b"MemFree", 0)), memory)
        return cpu, (round(100.0 * (memory - avail) / memory, 1) if memory else 0.0)


#: (cpu_percent since the previous call, memory percent) of this host
_host_load = _HostLoad()
