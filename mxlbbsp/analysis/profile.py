"""The profile fit behind ``mxlbbsp plan``: per-worker time models from a metrics log.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from mxlbbsp.core import timemodel as _tm
from mxlbbsp.core.planner import PlanError

#: the least relative spread of a worker's batch sizes that separates fixed and per-sample cost
MIN_SPREAD = 0.1


def fit_time_models(records: Sequence[dict], skip: int = 1) -> tuple:
    """Per-worker time models and the push/pull time from a metrics log (a profiling run).

    Returns (ranks, TimeModel, sync_s). Each worker's compute time is fitted as
    a + b / v by least squares over its records; ``sync_s`` is the median of the records'
    ``sync_s`` (0 when none). The first ``skip`` iterations (graph building) are left out.

    A worker whose batch sizes vary by less than ``MIN_SPREAD`` (relative standard
    deviation), or for less than ``MIN_SPREAD`` of its records (an epoch's short last batch
    at one fixed B), cannot have its fixed cost told from its per-sample cost: assuming none
    overstates the cost of a sample (a B=16 profile put a 3x slower worker at 10x), so that
    is a :class:`PlanError` asking for a profile with varied batch sizes (e.g. the records
    of two short runs at different global batches, pooled).
    """
    rows = {}
    syncs = []
    for rec in records:
        if int(rec["iteration"]) < skip:
            continue
        b, c = rec.get("batch_size"), rec.get("compute_s")
        if not (isinstance(b, (int, float)) and isinstance(c, (int, float)) and b > 0 and c > 0):
            continue
        rows.setdefault(int(rec["rank"]), []).append((float(b), float(c)))
        s = rec.get("sync_s")
        if isinstance(s, (int, float)) and math.isfinite(s) and s >= 0:
            syncs.append(float(s))
    if not rows:
        raise PlanError(f"no usable records after iteration {skip - 1}: run the profiling job "
                        "for more iterations")
    ranks = sorted(rows)
    speed, intercept, flat, noisy = [], [], [], []
    for r in ranks:
        data = np.array(rows[r])
        b, t = data[:, 0], data[:, 1]
        a, v = 0.0, float(np.sum(b) / np.sum(t))
        # varied: a spread of MIN_SPREAD, and not only from a few odd records (the short
        # last batch of each epoch alone is not a second batch size)
        off = np.mean(np.abs(b - np.median(b)) >= MIN_SPREAD * np.median(b))
        if len(b) < 4 or np.std(b) / np.mean(b) < MIN_SPREAD or off < MIN_SPREAD:
            flat.append(f"rank {r}: {np.median(b):.0f} in {100 * (1 - off):.0f}%")
        else:
            slope, icpt = np.polyfit(b, t, 1)
            if slope > 0 and 0 <= icpt < t.min():
                a, v = float(icpt), float(1.0 / slope)
            elif slope > 0 and icpt < 0:
                # no fixed cost to see: the least-squares line through 0
                v = float(np.sum(b * b) / np.sum(b * t))
            else:
                noisy.append(f"rank {r}")
        speed.append(v)
        intercept.append(a)
    if flat:
        raise PlanError(
            f"the profile's batch sizes barely vary (local batch {', '.join(flat[:3])}"
            f"{', ...' if len(flat) > 3 else ''} of its records), so the fixed cost per iteration "
            "cannot be told from the per-sample cost; profile at two global batch sizes "
            "(e.g. two short runs at B and 4B) and give both metrics files")
    if noisy:
        raise PlanError(
            f"the compute time of {', '.join(noisy[:3])}{', ...' if len(noisy) > 3 else ''} "
            "does not grow with its batch size in the profile (timing noise swamps the "
            "per-sample cost), so its speed cannot be fitted; profile for more iterations, "
            "at batch sizes further apart, on a quieter machine")
    model = _tm.TimeModel(np.array(speed), np.array(intercept))
    return ranks, model, float(np.median(syncs)) if syncs else 0.0
