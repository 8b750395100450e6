"""Slowdown emulation: stretch each worker's compute phase by a factor, for experiments.

On the command line (``--emulate-slowdown``) a spec is either a list of per-worker factors,
``"1,1,3"``, or the path of a CSV trace with the header ``iteration,rank,slowdown``: a factor
holds from its iteration until the next row of the same rank (a step function; a rank's factor
is 1 before its first row).

Each worker receives its own schedule in ``MXLBBSP_SLOWDOWN``: ``"3"`` for a constant factor, or
change points ``"0:1,100:3,200:1"`` (iteration:factor).
"""
from __future__ import annotations

import bisect
import csv
import os
from typing import Dict, List, Optional, Sequence, Tuple


class SlowdownError(ValueError):
    """A malformed spec; the message names where."""


class Schedule:
    """A worker's slowdown factor as a step function of the iteration."""

    def __init__(self, points: Sequence[Tuple[int, float]] = ()):
        points = sorted(points)
        self._iters = [it for it, _ in points]
        self._factors = [f for _, f in points]

    def factor(self, iteration: int) -> float:
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
        return ",".join(f"{it}:{_fmt(f)}" for it, f in zip(self._iters, self._factors))

    @classmethod
    def decode(cls, text: Optional[str]) -> "Schedule":
        if not text:
            return cls()
        text = text.strip()
        try:
            if ":" not in text:
                return cls([(0, _factor(float(text)))])
            points = []
            for part in text.split(","):
                it, f = part.split(":")
                points.append((int(it), _factor(float(f))))
            return cls(points)
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
    points: Dict[int, List[Tuple[int, float]]] = {r: [] for r in range(num_workers)}
    seen: Dict[Tuple[int, int], int] = {}     # (rank, iteration) -> line
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = {"iteration", "rank", "slowdown"} - set(reader.fieldnames or ())
            if missing:
                raise SlowdownError(f"{path}: header must have columns iteration,rank,slowdown "
                                    f"(missing {', '.join(sorted(missing))})")
            for row in reader:
                line = reader.line_num
                try:
                    it, rank, f = int(row["iteration"]), int(row["rank"]), float(row["slowdown"])
                    f = _factor(f)
                except (TypeError, ValueError) as exc:
                    raise SlowdownError(f"{path}:{line}: {exc}") from None
                if not 0 <= rank < num_workers:
                    raise SlowdownError(f"{path}:{line}: rank {rank} is outside "
                                        f"0..{num_workers - 1} "
                                        f"(-n is {num_workers})")
                if it < 0:
                    raise SlowdownError(f"{path}:{line}: iteration {it} is negative")
                if (rank, it) in seen:
                    raise SlowdownError(f"{path}:{line}: rank {rank}, iteration {it} already has a "
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
    return [Schedule(points[r]) for r in range(num_workers)]
