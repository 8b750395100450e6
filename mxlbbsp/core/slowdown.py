"""Slowdown emulation: stretch each worker's compute phase by a factor, for experiments.

On the command line (``--emulate-slowdown``) a spec is either a list of per-worker factors,
``"1,1,3"``, or the path of a CSV trace with the header ``iteration,rank,slowdown``: a factor
holds from its iteration until the next row of the same rank (a step function; a rank's factor
is 1 before its first row). A trace whose first column is ``time_s`` instead of ``iteration``
changes factors at moments, in seconds from the job's registration (a tenant that arrives at a
time, whatever the batch size: what a job that changes its batch size meets).

Each worker receives its own schedule in ``MXLBBSP_SLOWDOWN``: ``"3"`` for a constant factor,
change points ``"0:1,100:3,200:1"`` (iteration:factor), or ``"@0:1,@12.5:3"`` (seconds:factor).
"""
from __future__ import annotations

import bisect
import csv
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple


class SlowdownError(ValueError):
    """A malformed spec; the message names where."""


class Schedule:
    """A worker's slowdown factor as a step function of the iteration."""

    def __init__(self, points: Sequence[Tuple[float, float]] = (), timed: bool = False):
        points = sorted(points)
        self._iters = [it for it, _ in points]
        self._factors = [f for _, f in points]
        #: change points are seconds from :meth:`start`, not iterations
        self.timed = timed
        self._t0: Optional[float] = None

    def start(self) -> None:
        """Time zero of a timed schedule (the job's registration, on the worker)."""
        self._t0 = time.monotonic()

    def factor(self, iteration: int) -> float:
        if self.timed:
            if self._t0 is None:
                self.start()
            iteration = time.monotonic() - self._t0
        k = bisect.bisect_right(self._iters, iteration) - 1
        return self._factors[k] if k >= 0 else 1.0

    @property
    def constant(self) -> bool:
        return len(set(self._factors)) <= 1 and (not self._iters or self._iters[0] == 0)

    def encode(self) -> str:
        if not self._iters:
            return "1"
        if self.constant:
            return _fmt(self._factors[0])
        at = "@" if self.timed else ""
        return ",".join(f"{at}{_fmt(it) if self.timed else it}:{_fmt(f)}"
                        for it, f in zip(self._iters, self._factors))

    @classmethod
    def decode(cls, text: Optional[str]) -> "Schedule":
        if not text:
            return cls()
        text = text.strip()
        try:
            if ":" not in text:
                return cls([(0, _factor(float(text)))])
            points = []
            timed = text.startswith("@")
            for part in text.split(","):
                it, f = part.split(":")
                if it.startswith("@") != timed:
                    raise ValueError("mixes iterations and @seconds")
                at = float(it[1:]) if timed else int(it)
                points.append((at, _factor(float(f))))
            return cls(points, timed=timed)
        except (ValueError, SlowdownError) as exc:
            raise SlowdownError(f"MXLBBSP_SLOWDOWN={text!r} is malformed: {exc}") from None


def _fmt(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _factor(x: float) -> float:
    if not x >= 1.0 or x != x or x == float("inf"):
        raise SlowdownError(f"slowdown factor {x} must be a finite number >= 1")
    return x


def parse(spec: str, num_workers: int) -> List[Schedule]:
    """The per-rank schedules of a ``--emulate-slowdown`` spec (list or CSV path)."""
    spec = spec.strip()
    if os.path.exists(spec) or spec.endswith(".csv"):
        return _parse_csv(spec, num_workers)
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != num_workers:
        raise SlowdownError(
            f"--emulate-slowdown {spec!r} has {len(parts)} factor(s) but -n is {num_workers}; "
            f"give one factor per worker, e.g. {','.join(['1'] * max(num_workers - 1, 0) + ['3'])}")
    schedules = []
    for i, p in enumerate(parts):
        try:
            schedules.append(Schedule([(0, _factor(float(p)))]))
        except ValueError:
            raise SlowdownError(f"--emulate-slowdown: factor {i + 1} ({p!r}) must be a number "
                                ">= 1") from None
    return schedules


def _parse_csv(path: str, num_workers: int) -> List[Schedule]:
    if not os.path.isfile(path):
        raise SlowdownError(f"--emulate-slowdown: no such file {path!r}")
    points: Dict[int, List[Tuple[float, float]]] = {r: [] for r in range(num_workers)}
    seen: Dict[Tuple[int, float], int] = {}   # (rank, iteration or time) -> line
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            columns = set(reader.fieldnames or ())
            timed = "time_s" in columns and "iteration" not in columns
            key = "time_s" if timed else "iteration"
            missing = {key, "rank", "slowdown"} - columns
            if missing:
                raise SlowdownError(f"{path}: header must have columns iteration,rank,slowdown "
                                    f"(or time_s,rank,slowdown; missing "
                                    f"{', '.join(sorted(missing))})")
            for row in reader:
                line = reader.line_num
                try:
                    it = float(row[key]) if timed else int(row[key])
                    rank, f = int(row["rank"]), float(row["slowdown"])
                    f = _factor(f)
                    if timed and not 0 <= it < float("inf"):
                        raise ValueError(f"time_s {row[key]!r} must be a finite number >= 0")
                except (TypeError, ValueError) as exc:
                    raise SlowdownError(f"{path}:{line}: {exc}") from None
                if not 0 <= rank < num_workers:
                    raise SlowdownError(f"{path}:{line}: rank {rank} is outside "
                                        f"0..{num_workers - 1} "
                                        f"(-n is {num_workers})")
                if it < 0:
                    raise SlowdownError(f"{path}:{line}: {key} {it} is negative")
                if (rank, it) in seen:
                    raise SlowdownError(f"{path}:{line}: rank {rank}, {key} {it} already has a "
                                        f"slowdown on line {seen[rank, it]}; keep one of the rows")
                seen[rank, it] = line
                points[rank].append((it, f))
    except UnicodeDecodeError:
        raise SlowdownError(f"{path}: not a text (UTF-8) CSV file; expected the header "
                            "iteration,rank,slowdown") from None
    except csv.Error as exc:
        raise SlowdownError(f"{path}: not valid CSV: {exc}") from None
    except OSError as exc:
        raise SlowdownError(f"--emulate-slowdown: cannot read {path!r}: {exc.strerror}") from None
    return [Schedule(points[r], timed=timed) for r in range(num_workers)]
