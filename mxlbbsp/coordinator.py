"""The coordinator: collects per-iteration reports, predicts speeds, splits the next batch.

It runs on the launch node, inside ``mxlbbsp launch`` (a thread with its own asyncio loop),
and speaks :mod:`mxlbbsp.protocol` with the workers. Per iteration t, once all n reports of t
are in:

1. every worker's observed speed (samples/s of its compute phase) and its host's CPU and
   memory load go to the predictor, which forecasts each worker's speed at t+1;
2. (``lbbsp``) the balancer splits the next global batch so that all workers are predicted
   to finish together, keeping the current split when the gain is below the threshold, and
   the allocation is sent to every worker;
3. when a worker's ``done`` for t arrives (after its push/pull), one metrics record is written.

In ``bsp`` and ``asp`` the workers split the batch equally by themselves and never wait for the
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

from . import balancer as _bal
from . import predictors as _pred
from . import protocol as P

log = logging.getLogger(__name__)

TIME_MODELS = ("linear", "affine")


@dataclasses.dataclass
class CoordinatorConfig:
    """What the coordinator needs to know about the job."""

    num_workers: int
    token: str
    sync: str = "lbbsp"
    predictor: str = "narx"
    time_model: str = "linear"
    threshold: float = 0.03
    max_batch: Optional[int] = None       # per-worker cap from the command line
    metrics_path: Optional[str] = None
    warmup: int = 1                       # first iterations (graph building) not learnt from
    slowdown: Optional[list] = None       # per-rank emulated slowdown schedules (the oracle's)
    host: str = "127.0.0.1"               # address to listen on
    port: int = 0                         # 0: any free port
    # checkpoints (mxlbbsp.checkpoint): where and how often to save the coordinator's state,
    # and, when resuming, the checkpoint's manifest and the state saved with it
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    resume_manifest: Optional[dict] = None
    resume_state: Optional[dict] = None

    def __post_init__(self):
        if self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if self.time_model not in TIME_MODELS:
            raise ValueError(f"time_model must be one of {TIME_MODELS}")
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


class Coordinator:
    """The coordination service of one job. ``start()`` it, hand its address to the workers."""

    def __init__(self, config: CoordinatorConfig):
        self.config = config
        n = config.num_workers
        self.failure: Optional[str] = None           # fatal problem; the job must stop
        self.failure_kind: Optional[str] = None      # "config" (bad input) or "runtime"
        self.failed_at: float = 0.0
        self.finished = threading.Event()            # every worker said bye
        self.address = None
        options = {}
        if getattr(_pred.predictor_class(config.predictor), "needs_schedules", False):
            options["schedules"] = config.slowdown
        self._predictor = _pred.create(config.predictor, n, **options)
        self._fit = _bal.AffineFit(n)
        self._balancer = _bal.Balancer(config.threshold, 1, config.max_batch)
        self._writers: Dict[int, asyncio.StreamWriter] = {}
        self._hellos: Dict[int, dict] = {}
        self._byes: set = set()
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
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self.alloc_latency: List[float] = []         # seconds from last report to broadcast
        # per rank: records, samples, compute seconds, wait seconds, iteration seconds
        self._totals = np.zeros((n, 5))
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
        from .checkpoint import object_state
        return {"iteration": self._iteration, "num_workers": self.config.num_workers,
                "predictor_name": self.config.predictor,
                "predictor": self._predictor.state_dict(), "fit": object_state(self._fit),
                "sizes": None if self._sizes is None else [int(b) for b in self._sizes],
                "metrics_records": self._written}

    def _load_state(self, state: Optional[dict]) -> None:
        """Restore :meth:`state_dict`; on another number of workers (or predictor) only the
        metrics position carries over, and balancing learns afresh."""
        if not state:
            return
        self._written = int(state.get("metrics_records", 0))
        if state.get("num_workers") != self.config.num_workers:
            return
        from .checkpoint import load_object_state
        if state.get("predictor_name") == self.config.predictor:
            self._predictor.load_state_dict(state["predictor"])
        load_object_state(self._fit, state["fit"])
        if state.get("sizes"):
            self._resumed_sizes = np.array(state["sizes"], dtype=np.int64)

    def _maybe_checkpoint(self, t: int) -> None:
        cfg = self.config
        if cfg.checkpoint_dir and cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0:
            from .checkpoint import save_coordinator
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
        if self._metrics is not None:
            self._flush_records(final=True)
            self._metrics.close()
            self._metrics = None

    @property
    def registered(self) -> int:
        """How many workers have said hello."""
        return len(self._hellos)

    def summary(self) -> Optional[dict]:
        """Totals over the records written so far (None before the first)."""
        count, samples, compute, wait, it = self._totals.sum(axis=0)
        if count == 0:
            return None
        # As mxlbbsp.metrics.summarize: each worker's samples over its own time, added up
        # (the same as B / iteration time when synchronous; right for ASP too).
        per_rank = self._totals[:, 4] > 0
        rate = float(np.sum(self._totals[per_rank, 1] / self._totals[per_rank, 4]))
        return {"iterations": int(self._totals[:, 0].max()), "samples": int(samples),
                "samples_per_s": rate, "wait_share": wait / it if it > 0 else 0.0}

    def progress(self) -> Progress:
        recent = self._recent[-20:]
        rate = 0.0
        if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
            rate = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
        sizes = [] if self._sizes is None else [int(b) for b in self._sizes]
        return Progress(self._iteration, self._samples, self._last_change, rate, sizes)

    # ---- connections ----------------------------------------------------------------------

    def _on_line(self, conn: "_Connection", line: bytes) -> bool:
        """One message of a connection; False when the connection is done with."""
        rank = conn.rank
        try:
            msg = P.decode(line)
            kind = msg["type"]
            if rank is None:
                if kind != P.HELLO or not P.token_ok(msg, self.config.token):
                    log.warning("refused a connection from %s: bad hello or token",
                                conn.transport.get_extra_info("peername"))
                    conn.transport.close()
                    return False
                conn.rank = self._on_hello(msg, conn.transport)
                if conn.rank is None:
                    conn.transport.close()
                    return False
            elif kind == P.REPORT:
                self._on_report(rank, msg)
            elif kind == P.DONE:
                self._on_done(rank, msg)
            elif kind == P.BYE:
                self._byes.add(rank)
                if len(self._byes) == self.config.num_workers:
                    self._flush_records(final=True)
                    self.finished.set()
            else:
                raise P.ProtocolError(f"unexpected message {kind!r}")
        except (P.ProtocolError, ValueError, KeyError, TypeError) as exc:
            self._reject(conn, str(exc))
            return False
        return True

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

    def _send(self, rank: int, msg: dict) -> None:
        w = self._writers.get(rank)
        if w is not None and not w.is_closing():
            w.write(P.encode(msg))

    def _broadcast(self, msg: dict) -> None:
        data = P.encode(msg)
        for w in self._writers.values():
            if not w.is_closing():
                w.write(data)

    def _send_allocation(self, iteration: int, sizes) -> None:
        """Every worker its own slice of the global batch (O(n) bytes in all)."""
        total = int(sum(sizes))
        offset = 0
        for rank, size in enumerate(sizes):
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
            problem = self._validate()
            if problem:
                self._fail(problem, kind="config")
            else:
                B = int(self._hellos[0]["global_batch_size"])
                self._sizes = _bal.equal_split(B, n)
                resumed = self._resumed_sizes
                if resumed is not None and int(resumed.sum()) == B and self.config.sync == "lbbsp":
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
        caps = [h.get("max_batch_size") for h in hellos]
        if self.config.max_batch is not None:
            caps = [self.config.max_batch if c is None else min(c, self.config.max_batch)
                    for c in caps]
        if all(c is not None for c in caps):
            self._balancer.max_batch = np.array(caps, dtype=np.int64)
            if sum(caps) < B:
                return (f"the workers' maximum batch sizes ({', '.join(map(str, caps))}) add up "
                        f"to less than the global batch size {B}; raise --max-batch-size or "
                        "use more workers")
        elif any(c is not None for c in caps):
            self._balancer.max_batch = np.array([B if c is None else c for c in caps],
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
        # The metrics record is built when it is written (_flush_records): nothing on the
        # path from the last report to the broadcast that need not be there.
        self._records.setdefault((t, rank), {})["report"] = msg
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
        exog = np.array([[_nan(reports[r].get("cpu_percent")), _nan(reports[r].get("mem_percent"))]
                         for r in range(n)])
        next_B = reports[0].get("next_global_batch")
        if t < self._start + self.config.warmup:
            # Iteration 0 builds graphs and allocates memory: not a speed worth learning.
            if next_B is not None and self.config.sync == "lbbsp":
                self._sizes = _bal.rescale(self._sizes, next_B)
                self._send_allocation(t + 1, self._sizes)
            return
        affine = self.config.time_model == "affine"
        if affine:
            self._fit.observe(batch, compute)
            fixed = np.minimum(self._fit.intercept, 0.8 * compute)
        else:
            fixed = np.zeros(n)
        # The predictor sees the batch-invariant (marginal) speed; with the linear model it
        # is simply batch / compute time.
        if hasattr(self._predictor, "advance"):
            self._predictor.advance(t)
        self._predictor.observe(batch / (compute - fixed), exog)
        marginal = self._predictor.predict()
        bad = ~(np.isfinite(marginal) & (marginal > 0))
        marginal = np.where(bad, batch / (compute - fixed), marginal)
        model = _bal.TimeModel(marginal, fixed)

        if next_B is None:
            return
        current = self._sizes
        if current is not None and int(current.sum()) != next_B:
            current = _bal.rescale(current, next_B)
        if self.config.sync == "lbbsp":
            try:
                sizes = self._balancer.allocate(model, next_B, current)
            except _bal.AllocationError as exc:
                self._fail(f"cannot split the global batch of iteration {t + 1}: {exc}")
                return
            self._send_allocation(t + 1, sizes)
            self.alloc_latency.append(time.perf_counter() - started)
        else:
            sizes = _bal.equal_split(next_B, n)
        self._sizes = np.asarray(sizes)
        # What the predictor expects each worker's observed speed to be at t+1.
        self._predicted[t + 1] = self._sizes / model.time(self._sizes)
        self._predictor.learn()     # training, after the broadcast: off the critical path

    def _on_done(self, rank: int, msg: dict) -> None:
        t = int(msg["iteration"])
        self._records.setdefault((t, rank), {})["done"] = msg
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

    def _record(self, t: int, rank: int, report: dict, done: Optional[dict]) -> dict:
        """The metrics record of worker ``rank`` at iteration ``t`` (fields: mxlbbsp.metrics)."""
        batch, compute = report["batch_size"], report["compute_s"]
        done = done or {}
        predicted = self._predicted.get(t)
        return {
            "iteration": t, "rank": rank, "host": self._hellos[rank].get("host"),
            "batch_size": batch, "compute_s": compute, "speed": batch / compute,
            "cpu_percent": report.get("cpu_percent"), "mem_percent": report.get("mem_percent"),
            "slowdown": report.get("slowdown", 1.0), "sync": self.config.sync,
            "predictor": self.config.predictor, "time": report["time"],
            # Looked up now, not when the report came: a worker's report of t+1 can arrive
            # before the last report of t (ASP, or lines buffered on one connection).
            "predicted_speed": None if predicted is None else _num(predicted[rank]),
            "wait_s": done.get("wait_s"), "sync_s": done.get("sync_s"),
            "iteration_s": done.get("iteration_s"),
            "fallbacks": int(self._predictor.fallbacks[rank]),
        }

    def _flush_records(self, final: bool = False) -> None:
        """Write every complete record (all of them at the end) in (iteration, rank) order."""
        # Only iterations every worker has finished: the file stays in (iteration, rank)
        # order even though the workers' messages arrive on separate connections.
        ready = sorted(k for k, r in self._records.items()
                       if final or (k[0] <= self._iteration and "done" in r and "report" in r))
        lines = []
        for t, rank in ready:
            parts = self._records.pop((t, rank))
            if "report" not in parts:
                continue
            rec = self._record(t, rank, parts["report"], parts.get("done"))
            if rec["wait_s"] is not None and rec["iteration_s"] is not None:
                self._totals[rank] += (1, rec["batch_size"], rec["compute_s"], rec["wait_s"],
                                       rec["iteration_s"])
            lines.append(json.dumps(rec, allow_nan=False))
        if lines and self.config.metrics_path:
            if self._metrics is None:
                # Opened at the first record, so that a job rejected at registration leaves
                # an earlier metrics file untouched.
                mode = "a" if self.config.resume_manifest is not None else "w"
                self._metrics = open(self.config.metrics_path, mode)
            self._metrics.write("\n".join(lines) + "\n")
            self._written += len(lines)
            self._metrics.flush()
        pending = {t for t, _ in self._records}
        for t in [t for t in self._predicted if t <= self._iteration and t not in pending]:
            del self._predicted[t]


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

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if not self.coordinator._on_line(self, line):
                buffer.clear()
                return
        del buffer[:start]
        if len(buffer) > P.MAX_LINE:
            buffer.clear()
            self.coordinator._reject(self, "message too long")

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.coordinator._on_lost(self)


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def _num(x) -> Optional[float]:
    x = float(x)
    return x if math.isfinite(x) else None
