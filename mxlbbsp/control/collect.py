"""The reports and dones of each iteration as they come, gathered into arrays.

A batch of them (:class:`~mxlbbsp.core.frames.Rows`: a relay's section, or one message of a
worker connected directly) is checked and written into its iteration's columns at once:
per worker its batch size, compute time and the ``--exog`` columns the predictor reads, and
which workers have sent theirs. The coordinator learns from the columns once all n reports
of an iteration are in, and moves on once all n dones are; nothing here is one Python
object per worker.

No framework import.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from mxlbbsp.core import protocol as P


class WorkerError(P.ProtocolError):
    """A worker's malformed message (``rank``: whose); it fails the job, naming the worker."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


class _Reports:
    """Iteration t's reports so far."""

    __slots__ = ("columns", "seen", "count", "next_B", "samples")

    def __init__(self, n: int, width: int):
        #: per worker [batch, compute_s, the --exog columns...]
        self.columns = np.full((n, width), np.nan)
        self.seen = np.zeros(n, dtype=bool)
        self.count = 0
        self.next_B: Optional[int] = None     # rank 0's next_global_batch
        self.samples = 0


class Collector:
    """Each iteration's reports and dones, as they come (see the module docstring)."""

    def __init__(self, num_workers: int, exog: Sequence[str]):
        self.n = num_workers
        self.exog = tuple(exog)
        self._width = 2 + max(len(self.exog), 1)
        self._reports: Dict[int, _Reports] = {}
        self._dones: Dict[int, np.ndarray] = {}
        self._samples: Dict[int, int] = {}        # iteration -> its samples (all reports)
        #: per rank, its latest report's iteration (-1: none yet)
        self.last_report = np.full(num_workers, -1, dtype=np.int64)

    def reports(self, rows) -> Optional[Tuple[int, Optional[int], np.ndarray]]:
        """Take a batch of reports (WorkerError for a malformed one); (t, rank 0's
        next_global_batch, the columns) once all n reports of t are in, else None."""
        t, ranks = rows.iteration, rows.ranks
        batch = rows.floats("batch_size") if rows.kind("batch_size") == "i" else None
        compute = rows.floats("compute_s") if rows.kind("compute_s") in ("f", "i") else None
        ok = np.ones(len(ranks), dtype=bool)
        if batch is not None:
            ok &= batch >= 1
        if compute is not None:
            ok &= compute > 0
        if batch is None or compute is None or not ok.all():
            i = int(np.argmin(ok)) if batch is not None and compute is not None else 0
            rank = int(ranks[i])
            msg = rows.dicts()[i]
            raise WorkerError(rank, f"report of iteration {t} has batch_size="
                                    f"{msg.get('batch_size')}, compute_s={msg.get('compute_s')}")
        try:
            exog = [rows.floats(c) for c in self.exog]
        except (ValueError, TypeError):
            for rank, msg in zip(ranks.tolist(), rows.dicts()):
                for c in self.exog:
                    value = msg.get(c)
                    if value is not None and not isinstance(value, (int, float)):
                        raise WorkerError(rank, f"report of iteration {t} has {c}={value!r}, "
                                                "not a number") from None
            raise
        last = self.last_report
        last[ranks] = np.maximum(last[ranks], t)
        it = self._reports.get(t)
        if it is None:
            it = self._reports[t] = _Reports(self.n, self._width)
        columns = it.columns
        columns[ranks, 0] = batch
        columns[ranks, 1] = compute
        for j, values in enumerate(exog):
            columns[ranks, 2 + j] = values
        fresh = ~it.seen[ranks]
        it.seen[ranks] = True
        it.count += int(fresh.sum())
        it.samples += int(batch[fresh].sum())
        zero = np.flatnonzero(ranks == 0)
        if len(zero):
            it.next_B = rows.values("next_global_batch")[int(zero[0])]
        if it.count < self.n:
            return None
        del self._reports[t]
        self._samples[t] = it.samples
        for old in [k for k in self._samples if k < t - 64]:
            del self._samples[old]
        return t, it.next_B, columns

    def dones(self, rows) -> Optional[int]:
        """Take a batch of dones; the samples of iteration t once all n dones of t are in,
        else None."""
        t = rows.iteration
        seen = self._dones.get(t)
        if seen is None:
            seen = self._dones[t] = np.zeros(self.n, dtype=bool)
        seen[rows.ranks] = True
        if not seen.all():
            return None
        del self._dones[t]
        return self._samples.pop(t, 0)

    def waiting(self, t: int) -> Tuple[np.ndarray, np.ndarray]:
        """Per rank: whether its report of t is in, and whether its done of t is in."""
        it = self._reports.get(t)
        reported = it.seen.copy() if it is not None else np.full(self.n, t in self._samples)
        done = self._dones.get(t)
        return reported, (done.copy() if done is not None else np.zeros(self.n, dtype=bool))
