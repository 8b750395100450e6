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


class MetricsError(ValueError):
    """A malformed metrics file; the message names the line."""


def load(path: str) -> List[dict]:
    """The records of a metrics file, checked for the required fields."""
    records = []
    try:
        fh = open(path)
    except OSError as exc:
        raise MetricsError(f"cannot read {path!r}: {exc.strerror}") from None
    with fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise MetricsError(f"{path}:{number}: not a JSON object") from None
            if not isinstance(rec, dict):
                raise MetricsError(f"{path}:{number}: not a JSON object")
            missing = [f for f in REQUIRED if f not in rec]
            if missing:
                raise MetricsError(f"{path}:{number}: missing field(s) {', '.join(missing)}")
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
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def summarize(records: Iterable[dict], skip: int = 1) -> dict:
    """Throughput and waiting of a run, leaving out the first ``skip`` iterations (warm-up).

    samples_per_s: the sum over workers of samples / (its summed iteration time), which for
    the synchronous modes is B / mean iteration time, and stays right for ASP where workers
    run different numbers of iterations per second. wait_share: the fraction of a worker's
    time spent waiting for others (allocation + push/pull), averaged over workers.
    """
    ranks = by_rank(r for r in records if r["iteration"] >= skip)
    if not ranks:
        raise MetricsError("no records after the warm-up iterations")
    per_rank = {}
    rate = 0.0
    for rank, rows in sorted(ranks.items()):
        it = [_num(r.get("iteration_s")) for r in rows]
        it = [x for x in it if x is not None]
        wait = [_num(r.get("wait_s")) or 0.0 for r in rows]
        samples = sum(int(r["batch_size"]) for r in rows)
        total = sum(it)
        if total > 0:
            rate += samples / total
        per_rank[rank] = {
            "iterations": len(rows),
            "mean_batch": samples / len(rows),
            "mean_compute_s": sum(float(r["compute_s"]) for r in rows) / len(rows),
            "mean_wait_s": sum(wait) / len(rows),
            "mean_iteration_s": total / len(it) if it else float("nan"),
            "mean_speed": sum(float(r["speed"]) for r in rows) / len(rows),
            "wait_share": sum(wait) / total if total > 0 else float("nan"),
        }
    iteration_s = [p["mean_iteration_s"] for p in per_rank.values()]
    return {
        "workers": len(per_rank),
        "iterations": max(p["iterations"] for p in per_rank.values()),
        "samples_per_s": rate,
        "mean_iteration_s": sum(iteration_s) / len(iteration_s),
        "wait_share": sum(p["wait_share"] for p in per_rank.values()) / len(per_rank),
        "per_rank": per_rank,
    }
