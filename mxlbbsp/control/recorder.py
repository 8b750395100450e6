"""The recorder: the metrics records of a job, written off the coordinator's thread.

One JSON record per worker per iteration (fields: :mod:`mxlbbsp.core.metrics`), in
(iteration, rank) order, and the end-of-job summary's :class:`~mxlbbsp.core.metrics.Totals`.
The coordinator's thread only collects each record's parts as messages arrive (the report,
the done, the logged scalars) and, once an iteration is complete, hands the parts with a
snapshot of what the record shows from the coordinator's state (the host, the predicted
speed, the predictor's fallback count, the mode's fields) to a writer thread, which builds
the records, adds them to the totals, encodes and writes them, and feeds TensorBoard. At
1024 workers that work was about a quarter of the coordinator's CPU per iteration
(benchmarks/README.md, coordinator scale); the file is the same, line for line.

A write error (ENOSPC) stops the job through ``fail`` (called on the coordinator's loop),
as before. ``drain()`` waits for the writer: the coordinator's checkpoint reads the totals
through the last finished iteration, and ``close()`` writes everything left at the end.

No framework import.
"""
from __future__ import annotations

import json
import logging
import math
import queue
import threading
from typing import Callable, Dict, List, Optional

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp.core import metrics as _metrics
from mxlbbsp.core import signals as _signals

log = logging.getLogger(__name__)

#: the tag of an event among the items handed to the writer thread
EVENT = "event"

#: json.dumps(rec, allow_nan=False), without building an encoder per record
_encode = json.JSONEncoder(allow_nan=False).encode


class Parts:
    """What has come of iteration t's records: the reports and the dones (:class:`~mxlbbsp.
    core.frames.Rows`, as they came: a relay's section or one worker's message), the
    scalars logged, and per rank whether its report, its done, or anything at all is in."""

    __slots__ = ("reports", "dones", "scalars", "has_report", "has_done", "present")

    def __init__(self, n: int):
        self.reports: list = []
        self.dones: list = []
        self.scalars: Dict[int, dict] = {}
        self.has_report = np.zeros(n, dtype=bool)
        self.has_done = np.zeros(n, dtype=bool)
        self.present = np.zeros(n, dtype=bool)

    def complete(self, t: int, last_report: np.ndarray, byes: np.ndarray) -> bool:
        """Every worker with a part of t has its report and done in, and has moved on."""
        ok = self.has_report & self.has_done & ((last_report > t) | byes)
        return bool(np.all(ok | ~self.present))


class Recorder:
    """The parts of every record not yet written, and the writer of the complete ones.

    ``sync``, ``predictor``: the job's, in every record; ``fail(message, kind=...)`` is how
    a write error stops the job; ``call_soon`` runs a function on the coordinator's loop
    (None: call it directly, as after the loop ended).
    """

    def __init__(self, num_workers: int, metrics_path: Optional[str],
                 tensorboard_dir: Optional[str], skip: int, append: bool,
                 fail: Callable[..., None], sync: str = "lbbsp", predictor: str = ""):
        self.n = num_workers
        self.sync, self.predictor = sync, predictor
        self.barrier = _modes.get(sync).barrier
        self.metrics_path = metrics_path
        self.tensorboard_dir = tensorboard_dir
        self.append = append                 # a resumed job appends to its metrics file
        self._fail = fail
        self.call_soon: Optional[Callable] = None
        self.parts: Dict[int, Parts] = {}    # iteration -> what has come of its records
        self.predicted: Dict[int, np.ndarray] = {}   # iteration -> predicted speeds
        #: per rank, the last iteration handed to the writer (-1: none)
        self.logged = np.full(num_workers, -1, dtype=np.int64)
        self.totals = _metrics.Totals(skip=skip)
        self.written = 0                     # records in the file (writer thread)
        self._lock = threading.Lock()        # the totals: read by summary() from any thread
        self._file = None
        self._failed = False
        self._tensorboard = None
        self._queue: "queue.Queue[Optional[list]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    # ---- the coordinator's thread -----------------------------------------------------------

    def _parts(self, t: int) -> Parts:
        parts = self.parts.get(t)
        if parts is None:
            parts = self.parts[t] = Parts(self.n)
        return parts

    def add(self, rows) -> None:
        """Reports or dones of iteration ``rows.iteration`` (:class:`~mxlbbsp.core.frames.
        Rows`): kept as they came, built into records by the writer."""
        parts = self._parts(rows.iteration)
        if rows.what == "report":
            parts.reports.append(rows)
            parts.has_report[rows.ranks] = True
        else:
            parts.dones.append(rows)
            parts.has_done[rows.ranks] = True
        parts.present[rows.ranks] = True

    def add_scalars(self, t: int, rank: int, values: dict) -> None:
        """Values worker ``rank`` logged for iteration ``t`` (mxlbbsp.log)."""
        parts = self._parts(t)
        parts.scalars.setdefault(rank, {}).update(values)
        parts.present[rank] = True

    def flush(self, iteration: int, last_report: np.ndarray, byes: np.ndarray, hosts: list,
              fallbacks, fields: Callable[[int], dict], final: bool = False) -> None:
        """Hand every complete record (all of them when ``final``) to the writer, in
        (iteration, rank) order. ``iteration``: the last one every worker finished;
        ``last_report``: per rank, its latest report's iteration (-1: none); ``byes``: per
        rank, whether it ended; ``hosts``: per rank, its host; ``fallbacks``: the
        predictor's per worker; ``fields(t)``: the mode's own fields of iteration t's
        records."""
        # Only iterations every worker has finished: the file stays in (iteration, rank)
        # order even though the workers' messages arrive on separate connections. And only
        # once the worker has moved on (its report of a later iteration, or its bye): the
        # values its script logs for iteration t (mxlbbsp.log, after the step) come before
        # those on the same connection. (An iteration is written whole, so that the order
        # holds when one worker has moved on and another has not.)
        parts = self.parts
        ready = sorted(parts) if final else [
            t for t in sorted(parts)
            if t <= iteration and parts[t].complete(t, last_report, byes)]
        if ready:
            fallbacks = np.array(fallbacks, dtype=np.int64)      # a snapshot
            batch = []
            for t in ready:
                p = parts.pop(t)
                if p.has_report.any():
                    batch.append((t, p, hosts, self.predicted.get(t), fallbacks, fields(t)))
                    logged = self.logged
                    logged[p.has_report] = np.maximum(logged[p.has_report], t)
            if batch:
                self._put(batch)
        for t in [t for t in self.predicted if t <= iteration and t not in parts]:
            del self.predicted[t]

    def pending_totals(self, iteration: int, hosts, fallbacks, fields) -> tuple:
        """(records written or handed over, totals) through ``iteration``, the complete
        records not yet handed over included: what a checkpoint of it covers. Waits for
        the writer first."""
        self.drain()
        totals = _metrics.Totals(self.totals.skip)
        with self._lock:
            totals.load(self.totals.state())
        pending = 0
        for t in sorted(self.parts):
            if t > iteration:
                continue
            for rec in self._records(t, self.parts[t], hosts, self.predicted.get(t),
                                     fallbacks, fields(t), done_only=True):
                totals.add(rec)
                pending += 1
        return self.written + pending, totals

    def summary(self) -> Optional[dict]:
        """The totals' summary over the records handed over so far (waits for the writer:
        called from the launcher's thread)."""
        self.drain()
        with self._lock:
            return self.totals.summary()

    def drain(self) -> None:
        """Wait until the writer has written everything handed to it."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what was handed over, stop the writer, close the files."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._file is not None:
            try:
                self._file.close()
            except OSError:         # already reported
                pass
            self._file = None
        if self._tensorboard is not None:
            try:
                self._tensorboard.close()
            except OSError as exc:
                log.warning("could not close the TensorBoard files: %s", exc)
            self._tensorboard = None

    def event(self, rec: dict) -> None:
        """An event of the job (an elastic job's resize: ``{"event": "resized", "iteration",
        "time", ...}``): a line of its own in the metrics file, in order with the records,
        and in TensorBoard the job's workers at that iteration."""
        self._put([(EVENT, dict(rec))])

    def _put(self, batch: list) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mxlbbsp-recorder",
                                            daemon=True)
            self._thread.start()
        self._queue.put(batch)

    def _records(self, t: int, parts: Parts, hosts, predicted, fallbacks, fields: dict,
                 done_only: bool = False) -> List[dict]:
        """The records of iteration ``t`` from its parts, in rank order (``done_only``:
        only those whose done is in too)."""
        reports: Dict[int, dict] = {}
        for rows in parts.reports:
            reports.update(zip(rows.ranks.tolist(), rows.dicts()))
        dones: Dict[int, dict] = {}
        for rows in parts.dones:
            dones.update(zip(rows.ranks.tolist(), rows.dicts()))
        speeds = None if predicted is None else predicted.tolist()
        fallbacks = [int(x) for x in fallbacks]
        job = (self.sync, self.predictor, self.barrier)
        scalars = parts.scalars
        return [record(t, rank, reports[rank], dones.get(rank), scalars.get(rank),
                       hosts[rank], None if speeds is None else speeds[rank],
                       fallbacks[rank], fields, *job)
                for rank in sorted(reports) if not done_only or rank in dones]

    # ---- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                self._write(batch)
            except Exception as exc:  # noqa: BLE001 - any bug here must stop the job
                log.exception("the metrics writer failed")
                self._report_failure(f"the metrics writer failed: {exc}", "runtime")
            finally:
                self._queue.task_done()

    def _write(self, batch: list) -> None:
        events = [item[1] for item in batch if item[0] is EVENT]
        records = [rec for item in batch if item[0] is not EVENT for rec in self._records(*item)]
        with self._lock:
            add = self.totals.add
            for rec in records:
                add(rec)
        if self.tensorboard_dir:
            self._write_tensorboard(records, events)
        if not self.metrics_path or self._failed or not (records or events):
            return
        text = "\n".join([_encode(rec) for rec in records + events]) + "\n"
        try:
            if self._file is None:
                # Opened at the first record, so that a job rejected at registration leaves
                # an earlier metrics file untouched; a resumed job appends.
                self._file = open(self.metrics_path, "a" if self.append else "w")
            self._file.write(text)
            self.written += len(records)
            self._file.flush()
        except OSError as exc:
            # e.g. ENOSPC: the job stops with this one line (exit 2, as a --metrics path
            # refused at launch), not with the workers' "lost connection"
            self._failed = True
            self._report_failure(f"cannot write the metrics file {self.metrics_path!r} "
                                 f"({exc.strerror or exc}); free some space or choose another "
                                 "--metrics path", "config")

    def _report_failure(self, message: str, kind: str) -> None:
        call = self.call_soon
        if call is None:
            self._fail(message, kind=kind)
            return
        try:
            call(lambda: self._fail(message, kind=kind))
        except RuntimeError:            # the loop has closed: the job is ending anyway
            self._fail(message, kind=kind)

    def _write_tensorboard(self, records: List[dict], events: List[dict] = ()) -> None:
        """The records' scalars for TensorBoard (--tensorboard): per iteration, each logged
        name as the batch-weighted mean over the workers that logged it (what the report
        plots), and each worker's speed and batch size under ``worker<rank>/``."""
        if self._tensorboard is None:
            try:
                from tensorboardX import SummaryWriter  # optional: only with --tensorboard
                self._tensorboard = SummaryWriter(self.tensorboard_dir)
            except (ImportError, OSError) as exc:
                log.warning("--tensorboard %s: cannot write there (%s); no TensorBoard files",
                            self.tensorboard_dir, exc)
                self.tensorboard_dir = None
                return
        w = self._tensorboard
        for t, values, when in _metrics.combine_scalars(records):
            for name, value in values.items():
                w.add_scalar(name, value, t, walltime=when)
        for rec in records:
            t, r, when = rec["iteration"], rec["rank"], rec["time"]
            w.add_scalar(f"worker{r}/speed", rec["speed"], t, walltime=when)
            w.add_scalar(f"worker{r}/batch_size", rec["batch_size"], t, walltime=when)
        for ev in events:                  # a resize: the job's workers from then on
            w.add_scalar("job/workers", ev.get("workers", 0), ev["iteration"],
                         walltime=ev["time"])
            w.add_text("job/events", f"{ev['event']} {ev.get('workers_before')} -> "
                       f"{ev.get('workers')} workers ({ev.get('why', '')})", ev["iteration"],
                       walltime=ev["time"])
        w.flush()


def record(t: int, rank: int, report: dict, done: Optional[dict], scalars: Optional[dict],
           host, predicted, fallbacks: int, mode_fields: dict, sync: str,
           predictor: str, barrier: Optional[bool] = None) -> dict:
    """The metrics record of worker ``rank`` at iteration ``t`` (fields: core.metrics).
    ``predicted``: the speed the predictor expected for it (None: none); ``barrier``: whether
    the sync mode has one per iteration (None: the registered mode's)."""
    if barrier is None:
        barrier = _modes.get(sync).barrier
    batch, compute = report["batch_size"], report["compute_s"]
    done = done or {}
    extra = {}
    if scalars:
        extra["scalars"] = scalars
    if isinstance(report.get("momentum"), (int, float)):
        extra["momentum"] = report["momentum"]
    return {
        "iteration": t, "rank": rank, "host": host,
        "batch_size": batch, "compute_s": compute, "speed": batch / compute,
        "cpu_percent": report.get("cpu_percent"), "mem_percent": report.get("mem_percent"),
        "slowdown": report.get("slowdown", 1.0), "sync": sync, "barrier": barrier,
        "predictor": predictor, "time": report["time"],
        "predicted_speed": None if predicted is None else _num(predicted),
        "wait_s": done.get("wait_s"), "sync_s": done.get("sync_s"),
        "iteration_s": done.get("iteration_s"),
        "fallbacks": fallbacks,
        "global_batch": report.get("global_batch"),
        "lr_factor": report.get("lr_factor", 1.0),
        **mode_fields,
        **{name: report.get(name) for name in _signals.NAMES if name in report},
        **extra,
    }


def _num(x) -> Optional[float]:
    x = float(x)
    return x if math.isfinite(x) else None
