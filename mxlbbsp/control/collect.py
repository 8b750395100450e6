"""The reports and dones of each iteration as they come, gathered into arrays.

A batch of them (:class:`~mxlbbsp.core.frames.Rows`: a relay's section, or one message of a
worker connected directly) is checked and written into its iteration's columns at once:
per worker its batch size, compute time and the ``--exog`` columns the predictor reads, and
which workers have sent theirs, and the forecasts of the workers whose relays forecast them
(the sections' ``_forecast`` and ``_fallbacks`` columns, or a FORECAST frame). The
coordinator learns from the columns once all n reports of an iteration are in, and moves on
once all n dones are; nothing here is one Python object per worker.

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

    __slots__ = ("columns", "seen", "count")

    def __init__(self, n: int, width: int):
        #: per worker [batch, compute_s, the --exog columns..., _forecast, _fallbacks,
        #: next_global_batch, after_next_global_batch] (a relay's forecast and fallback
        #: count, B(t+2): NaN when none)
        self.columns = np.full((n, width), np.nan)
        self.seen = np.zeros(n, dtype=bool)
        self.count = 0


class Collector:
    """Each iteration's reports and dones, as they come (see the module docstring)."""

    def __init__(self, num_workers: int, exog: Sequence[str]):
        self.n = num_workers
        self.exog = tuple(exog)
        # the fields read from every report; with no --exog the predictor still gets one
        # column, of NaN (a name no report has)
        self._keys = ("batch_size", "compute_s") + (self.exog or ("",)) \
            + ("_forecast", "_fallbacks", "next_global_batch", "after_next_global_batch")
        self._reports: Dict[int, _Reports] = {}
        self._dones: Dict[int, np.ndarray] = {}
        self._samples: Dict[int, int] = {}        # iteration -> its samples (all reports)
        #: per rank, its latest report's iteration (-1: none yet)
        self.last_report = np.full(num_workers, -1, dtype=np.int64)
        self._top = -1                            # the latest iteration any worker reported

    def _iteration(self, t: int) -> _Reports:
        it = self._reports.get(t)
        if it is None:
            it = self._reports[t] = _Reports(self.n, len(self._keys))
        return it

    def forecasts(self, t: int, ranks: np.ndarray, values: np.ndarray,
                  fallbacks: np.ndarray) -> None:
        """A relay's forecasts of iteration t+1 for ``ranks`` (a FORECAST frame): ahead of
        the section that completes its host's reports of t (which carries its own rows'
        forecasts too), after the sections that left before it (without)."""
        if t in self._samples:
            return                              # t was decided without them: too late
        columns = self._iteration(t).columns
        columns[ranks, -4] = values
        columns[ranks, -3] = fallbacks

    def reports(self, rows) -> Optional[Tuple[int, Optional[int], np.ndarray, tuple,
                                              Optional[int]]]:
        """Take a batch of reports (WorkerError for a malformed one); (t, rank 0's
        next_global_batch, the columns [batch, compute_s, the --exog columns...], the relays'
        (forecasts, fallback counts) per rank, rank 0's after_next_global_batch) once all n
        reports of t are in, else None."""
        t, ranks = rows.iteration, rows.ranks
        if rows.kind("batch_size") != "i" or rows.kind("compute_s") not in ("f", "i"):
            self._bad(rows, t)
        try:
            values = rows.matrix(self._keys)
        except (ValueError, TypeError):
            self._bad_number(rows, t)
            raise
        low = values[:2].min(axis=1).tolist()
        if not (low[0] >= 1 and low[1] > 0):                     # NaN: not > 0
            self._bad(rows, t)
        if t >= self._top:                      # the usual case: no rank is past t
            self.last_report[ranks] = self._top = t
        else:
            last = self.last_report
            last[ranks] = np.maximum(last[ranks], t)
        it = self._iteration(t)
        seen = it.seen
        if seen[ranks].any():                   # a worker's second report of t: counted once
            it.count += int((~seen[ranks]).sum())
        else:
            it.count += len(ranks)
        seen[ranks] = True
        it.columns[ranks] = values.T
        if it.count < self.n:
            return None
        del self._reports[t]
        columns = it.columns
        self._samples[t] = int(columns[:, 0].sum())
        for old in [k for k in self._samples if k < t - 64]:
            del self._samples[old]
        next_B, after_B = columns[0, -2], columns[0, -1]
        return (t, (int(next_B) if next_B == next_B else None), columns[:, :-4],
                (columns[:, -4], columns[:, -3]), (int(after_B) if after_B == after_B else None))

    @staticmethod
    def _bad(rows, t: int) -> None:
        """WorkerError naming the first worker whose report is out of bounds."""
        for rank, msg in zip(rows.ranks.tolist(), rows.dicts()):
            batch, compute = msg.get("batch_size"), msg.get("compute_s")
            if not (type(batch) is int and batch >= 1 and isinstance(compute, (int, float))
                    and not isinstance(compute, bool) and compute > 0):
                raise WorkerError(rank, f"report of iteration {t} has batch_size={batch}, "
                                        f"compute_s={compute}")
        raise WorkerError(int(rows.ranks[0]), f"report of iteration {t}: a malformed report")

    def _bad_number(self, rows, t: int) -> None:
        """WorkerError naming the first worker whose --exog field is not a number."""
        for rank, msg in zip(rows.ranks.tolist(), rows.dicts()):
            for c in self.exog:
                value = msg.get(c)
                if value is not None and not isinstance(value, (int, float)):
                    raise WorkerError(rank, f"report of iteration {t} has {c}={value!r}, "
                                            "not a number") from None

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
