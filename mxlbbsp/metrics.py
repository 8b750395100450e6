"""The metrics log: one JSON record per worker per iteration (``mxlbbsp launch --metrics``).

Fields (at least): iteration, rank, host, batch_size, compute_s, wait_s, sync_s,
iteration_s, speed, predicted_speed, cpu_percent, mem_percent, slowdown, sync, predictor,
fallbacks, time. ``speed`` is batch_size / compute_s (samples/s); ``predicted_speed`` is what
the predictor expected that speed to be, one iteration ahead (null for the first).

No framework import.
"""
from __future__ import annotations

import json
import math
from typing import Dict, Iterable, List, Optional

REQUIRED = ("iteration", "rank", "batch_size", "compute_s", "wait_s", "speed",
            "predicted_speed", "cpu_percent", "mem_percent", "sync", "time")


#: what a user who gave a bad metrics file should give instead (for the commands that read one)
HINT = "give a metrics file written by 'mxlbbsp launch --metrics'"
#: integers from here on (in any field) are out of range: no float holds them exactly, and
#: a 400-digit one does not convert to a float at all
BIG = 2 ** 63


def is_number(x) -> bool:
    """A finite JSON number (not a bool, not an integer beyond the float range)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return abs(x) < BIG if isinstance(x, int) else math.isfinite(x)


def _is_index(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < BIG


#: every reader's checks of a record (report, trace, plan, the batch schedule): one place
CHECKS = (
    ("iteration", _is_index, "an integer >= 0"),
    ("rank", _is_index, "an integer >= 0"),
    ("batch_size", lambda x: is_number(x) and x >= 0, "a number >= 0"),
    ("compute_s", lambda x: is_number(x) and x >= 0, "a number >= 0"),
    ("speed", lambda x: is_number(x) and x >= 0, "a number >= 0"),
    ("time", is_number, "a number"),
    ("wait_s", lambda x: x is None or (is_number(x) and x >= 0), "a number >= 0 or null"),
    ("predicted_speed", lambda x: x is None or is_number(x), "a number or null"),
    ("sync", lambda x: isinstance(x, str) and x != "", "a sync mode such as \"lbbsp\""),
)


def _shown(value) -> str:
    """A field's value for an error line: long ones cut (a 400-digit integer)."""
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > 24:
        return f"an integer of {len(text.lstrip('-'))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(rec: dict, where: str) -> None:
    """MetricsError naming ``where`` (path:line) for a field no reader can use."""
    for field, ok, what in CHECKS:
        if not ok(rec[field]):
            raise MetricsError(f"{where}: {field} is {_shown(rec[field])}, expected {what}")
    for field, value in rec.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= BIG:
            raise MetricsError(f"{where}: {field} is {_shown(value)}, out of range")


class MetricsError(ValueError):
    """A malformed metrics file; the message names the line."""


def load(path: str) -> List[dict]:
    """The records of a metrics file, checked for the required fields and their types
    (:data:`CHECKS`); a MetricsError names the file and line."""
    records = []
    try:
        fh = open(path, "rb")       # decoded line by line, so that an error names its line
    except OSError as exc:
        raise MetricsError(f"cannot read {path!r}: {exc.strerror}") from None
    with fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise MetricsError(f"{path}:{number}: not UTF-8 text (a metrics file is JSON "
                                   "Lines)") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                raise MetricsError(f"{path}:{number}: not a JSON object") from None
            if not isinstance(rec, dict):
                raise MetricsError(f"{path}:{number}: not a JSON object")
            missing = [f for f in REQUIRED if f not in rec]
            if missing:
                raise MetricsError(f"{path}:{number}: missing field(s) {', '.join(missing)}")
            check_record(rec, f"{path}:{number}")
            records.append(rec)
    if not records:
        raise MetricsError(f"{path}: no records")
    return records


def by_rank(records: Iterable[dict]) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for r in records:
        out.setdefault(int(r["rank"]), []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["iteration"])
    return out


def _num(x) -> Optional[float]:
    return float(x) if is_number(x) else None


class Totals:
    """The run's figures, accumulated record by record: the one place they are computed.

    Both the launcher's end-of-job line (the coordinator adds each record as it writes it)
    and ``mxlbbsp report`` (:func:`summarize`, from the file) use this class, so the two
    always agree. Records of iterations below ``skip`` (warm-up: graph building) are left out.

    samples_per_s: the sum over workers of samples / (its summed iteration time), which for
    the synchronous modes is B / mean iteration time, and stays right for ASP where workers
    run different numbers of iterations per second. wait_share: the fraction of a worker's
    time spent waiting for others (allocation + push/pull), averaged over workers.
    """

    # per rank: rows, samples, compute_s, speed, wait_s, iteration_s, rows with iteration_s
    _FIELDS = 7

    def __init__(self, skip: int = 1):
        self.skip = skip
        self._ranks: Dict[int, List[float]] = {}

    def add(self, rec: dict) -> None:
        if rec["iteration"] < self.skip:
            return
        sums = self._ranks.setdefault(int(rec["rank"]), [0.0] * self._FIELDS)
        it = _num(rec.get("iteration_s"))
        sums[0] += 1
        sums[1] += int(rec["batch_size"])
        sums[2] += float(rec["compute_s"])
        sums[3] += float(rec["speed"])
        sums[4] += _num(rec.get("wait_s")) or 0.0
        if it is not None:
            sums[5] += it
            sums[6] += 1

    def per_rank(self) -> Dict[int, dict]:
        out = {}
        for rank, (rows, samples, compute, speed, wait, total, timed) in sorted(
                self._ranks.items()):
            out[rank] = {
                "iterations": int(rows),
                "samples": int(samples),
                "mean_batch": samples / rows,
                "mean_compute_s": compute / rows,
                "mean_wait_s": wait / rows,
                "mean_iteration_s": total / timed if timed else float("nan"),
                "mean_speed": speed / rows,
                "wait_share": wait / total if total > 0 else float("nan"),
                "samples_per_s": samples / total if total > 0 else 0.0,
            }
        return out

    def summary(self) -> Optional[dict]:
        """workers, iterations, samples, samples_per_s, mean_iteration_s, wait_share,
        per_rank; None when no record is past the warm-up."""
        per_rank = self.per_rank()
        if not per_rank:
            return None
        iteration_s = [p["mean_iteration_s"] for p in per_rank.values()]
        return {
            "workers": len(per_rank),
            "iterations": max(p["iterations"] for p in per_rank.values()),
            "samples": sum(p["samples"] for p in per_rank.values()),
            "samples_per_s": sum(p["samples_per_s"] for p in per_rank.values()),
            "mean_iteration_s": sum(iteration_s) / len(iteration_s),
            "wait_share": sum(p["wait_share"] for p in per_rank.values()) / len(per_rank),
            "per_rank": per_rank,
        }


def summarize(records: Iterable[dict], skip: int = 1) -> dict:
    """Throughput and waiting of a run, leaving out the first ``skip`` iterations (warm-up);
    the figures of :class:`Totals`."""
    totals = Totals(skip)
    for rec in records:
        totals.add(rec)
    result = totals.summary()
    if result is None:
        raise MetricsError("no records after the warm-up iterations")
    return result
