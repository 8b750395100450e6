"""The profile fit behind ``mxlbbsp plan``: per-worker time models from a metrics log.

Each worker's compute time is modelled as t(b) = a + b / v (fixed cost a >= 0 per
iteration, speed v > 0). The line is fitted through robust summaries, not through the raw
records: the records of a worker are grouped by local batch size (from a group's smallest
size up to ``BIN_RATIO`` times it, as lbbsp's local batches vary continuously), and each
group with ``MIN_RECORDS`` records or more gives one point, its median batch size
and median compute time. A preempted iteration moves a median little, and a run with 16x
the records of another (B and 16B for the same epochs) gives points that weigh more (up to
``MAX_WEIGHT_RECORDS``), not more points. An epoch's short last batch is left out: three
epochs give three such records, which a profile at one B must not pass off as a second
batch size.
"""
from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Sequence

import numpy as np

from mxlbbsp.core import timemodel as _tm
from mxlbbsp.core.planner import PlanError

#: records a batch size needs before it counts: one or two odd iterations are no batch size
MIN_RECORDS = 3
#: local batch sizes within this factor of a group's smallest are one group (their median)
BIN_RATIO = 1.25
#: the largest and the smallest counted batch size of a worker must be this far apart, or
#: the fixed cost cannot be told from the per-sample cost
MIN_RATIO = 1.5
#: the fitted per-sample cost must stand this many standard errors above 0
MIN_Z = 2.0
#: a group's weight grows with its records up to this many: beyond it, how busy the machine
#: was while they ran, not their number, limits how well their median is known
MAX_WEIGHT_RECORDS = 30
#: the least relative spread assumed of compute times (timers are not exact, and a profile
#: of identical times must not make a slope of rounding errors certain)
MIN_NOISE = 1e-6


class Group(NamedTuple):
    """One point of a worker's fit: the records at nearby local batch sizes."""

    low: float         # the smallest and the largest local batch size in the group
    high: float
    records: int
    batch: float       # the median local batch size
    seconds: float     # the median compute time


class Fit(NamedTuple):
    """One worker's fitted line, t(b) = intercept + b / speed, and its points."""

    speed: float
    intercept: float
    slope: float       # seconds per sample of the unconstrained line
    stderr: float      # its standard error
    points: List[Group]


def fit_time_models(records: Sequence[dict], skip: int = 1) -> tuple:
    """Per-worker time models and the push/pull time from a metrics log (a profiling run).

    Returns (ranks, TimeModel, sync_s); ``sync_s`` is the median of the records' ``sync_s``
    (0 when none). The first ``skip`` iterations of each run (graph building) are left out;
    ``records`` may pool several runs (several metrics files), each starting again from its
    first iteration.

    Each worker's compute time is fitted as a + b / v through its groups' medians
    (:func:`groups`, :func:`fit_line`). A worker without two groups ``MIN_RATIO`` apart
    cannot have its fixed cost told from its per-sample cost: assuming none overstates the
    cost of a sample (a B=16 profile put a 3x slower worker at 10x), so that is a
    :class:`PlanError` asking for a profile at two global batch sizes. So is a worker whose
    medians do not grow with the batch size by ``MIN_Z`` standard errors of the slope
    (timing noise swamps the per-sample cost).
    """
    rows: Dict[int, list] = {}
    syncs = []
    for run in _runs(records):
        tails = _epoch_tails(run)
        for rec in run:
            it = int(rec["iteration"])
            if it < skip or it in tails:
                continue
            b, c = rec.get("batch_size"), rec.get("compute_s")
            if not (isinstance(b, (int, float)) and isinstance(c, (int, float))
                    and b > 0 and c > 0 and math.isfinite(c)):
                continue
            rows.setdefault(int(rec["rank"]), []).append((float(b), float(c)))
            s = rec.get("sync_s")
            if isinstance(s, (int, float)) and math.isfinite(s) and s >= 0:
                syncs.append(float(s))
    if not rows:
        raise PlanError(f"no usable records after iteration {skip - 1}: run the profiling job "
                        "for more iterations")
    ranks = sorted(rows)
    fits, flat, noisy = [], [], []
    for r in ranks:
        data = np.array(rows[r], dtype=float)
        points = groups(data[:, 0], data[:, 1])
        if len(points) < 2 or points[-1].batch < MIN_RATIO * points[0].batch:
            flat.append(f"rank {r}: {_most(data[:, 0])}")
            continue
        fit = fit_line(points, data[:, 0], data[:, 1])
        if not fit.slope > MIN_Z * fit.stderr:
            small, large = points[0], points[-1]
            noisy.append(f"rank {r} (median {_ms(small.seconds)} at local batch "
                         f"{_size(small)}, {_ms(large.seconds)} at {_size(large)})")
        fits.append(fit)
    if flat:
        raise PlanError(
            f"the profile's batch sizes barely vary ({'; '.join(flat[:3])}"
            f"{'; ...' if len(flat) > 3 else ''}; a batch size counts from {MIN_RECORDS} "
            f"records, {MIN_RATIO:g}x from another, an epoch's short last batch never), so the "
            "fixed cost per iteration cannot be told from the per-sample cost; profile at two "
            "global batch sizes (e.g. two short runs at B and 4B) and give both metrics files")
    if noisy:
        raise PlanError(
            f"the compute time of {', '.join(noisy[:2])}{', ...' if len(noisy) > 2 else ''} "
            "does not grow with its batch size in the profile (timing noise swamps the "
            "per-sample cost), so its speed cannot be fitted; profile for more iterations, at "
            "batch sizes further apart (B and 4B), on a quieter machine")
    model = _tm.TimeModel(np.array([f.speed for f in fits]),
                          np.array([f.intercept for f in fits]))
    return ranks, model, float(np.median(syncs)) if syncs else 0.0


def groups(batch, seconds) -> List[Group]:
    """A worker's records grouped by local batch size, smallest first: sizes from a
    group's smallest s up to ``BIN_RATIO`` * s are one group; groups of fewer than
    ``MIN_RECORDS`` records are left out."""
    batch = np.asarray(batch, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    order = np.argsort(batch, kind="stable")
    batch, seconds = batch[order], seconds[order]
    out, start = [], 0
    while start < len(batch):
        end = int(np.searchsorted(batch, BIN_RATIO * batch[start], side="right"))
        if end - start >= MIN_RECORDS:
            out.append(Group(float(batch[start]), float(batch[end - 1]), end - start,
                             float(np.median(batch[start:end])),
                             float(np.median(seconds[start:end]))))
        start = end
    return out


def fit_line(points: Sequence[Group], batch, seconds) -> Fit:
    """The line t = a + b / v through the groups' medians, robustly.

    Least squares through the points, each weighing its records (up to
    ``MAX_WEIGHT_RECORDS``), would take the mean of the slopes between pairs of points,
    each pair weighing n_i n_j (b_i - b_j)^2; this takes their weighted median, so a
    minority of odd groups (lbbsp moves a worker that was slow for a moment to a small
    batch, which then looks slow) cannot set it, and pairs of batch sizes far apart say
    the most. The intercept is the weighted median of t - slope * b. The points are not
    weighted by their precision: the times of small batches are the most precise, and
    pairs of them, a few samples apart, would then set the slope, but the time of a small
    batch often grows less than in proportion (seen: flat from 1 to 15 samples, then
    0.3 ms a sample), and the plan is for large batches.

    The slope's standard error is that of the weighted least-squares slope, from the
    spread of each point's median: sqrt(pi/2) s t / sqrt(n) for n records of relative
    spread s (pooled over the worker's records, 1.4826 x their median absolute deviation
    from their group's median: timing noise grows with the time).

    A negative intercept gives the line through 0 instead (no fixed cost: the weighted
    median of t / b, each weighing n b^2); a positive slope gives a finite speed, and the
    intercept is then what the medians say, even above the smallest time measured.
    """
    b = np.array([p.batch for p in points])
    t = np.array([p.seconds for p in points])
    n = np.minimum([p.records for p in points], MAX_WEIGHT_RECORDS).astype(float)
    # in units of the largest point: times near the float range stay finite when squared
    b_unit, t_unit = float(b.max()), float(t.max())
    x, y = b / b_unit, t / t_unit
    batch = np.asarray(batch, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    dev = []
    for p in points:
        inside = (batch >= p.low) & (batch <= p.high)
        dev.append(np.abs(seconds[inside] / p.seconds - 1.0))
    spread = max(1.4826 * float(np.median(np.concatenate(dev))), MIN_NOISE)
    i, j = np.triu_indices(len(x), 1)
    slope = _weighted_median((y[i] - y[j]) / (x[i] - x[j]), n[i] * n[j] * (x[i] - x[j]) ** 2)
    icpt = _weighted_median(y - slope * x, n)
    dx = x - float(np.sum(n * x) / np.sum(n))
    sxx = float(np.sum(n * dx * dx))
    stderr = spread * math.sqrt(math.pi / 2 * float(np.sum(n * (dx * y) ** 2))) / sxx
    slope_s, stderr_s = slope * t_unit / b_unit, stderr * t_unit / b_unit
    if slope <= 0:
        return Fit(math.nan, math.nan, slope_s, stderr_s, list(points))
    if icpt < 0:
        through_0 = _weighted_median(y / x, n * x * x)
        return Fit(b_unit / (t_unit * through_0), 0.0, slope_s, stderr_s, list(points))
    return Fit(b_unit / (t_unit * slope), icpt * t_unit, slope_s, stderr_s, list(points))


def _weighted_median(values, weights) -> float:
    """The value at which half the weight lies on either side (the mean of the two middle
    values when the halves meet between them)."""
    order = np.argsort(values, kind="stable")
    v, c = np.asarray(values, float)[order], np.cumsum(np.asarray(weights, float)[order])
    half = c[-1] / 2
    k = int(np.searchsorted(c, half))
    if math.isclose(c[k], half, rel_tol=1e-12) and k + 1 < len(v):
        return float((v[k] + v[k + 1]) / 2)
    return float(v[k])


def _runs(records: Sequence[dict]) -> List[list]:
    """The records cut into runs: a record of a (rank, iteration) already seen starts the
    next run (the next metrics file, pooled, starts again from iteration 0)."""
    runs, seen = [[]], set()
    for rec in records:
        key = (rec.get("rank"), rec.get("iteration"))
        if key in seen:
            runs.append([])
            seen = set()
        seen.add(key)
        runs[-1].append(rec)
    return [run for run in runs if run]


def _epoch_tails(run: Sequence[dict]) -> set:
    """The iterations of a run that are an epoch's short last batch: a global batch (the sum
    of the local ones) below that of the two iterations before it, which are equal, and not
    followed by the same (a change of B stays; the last batch of an epoch is one
    iteration). Pooled, three epochs give three such records: never a batch size."""
    total: Dict[int, float] = {}
    for rec in run:
        b = rec.get("batch_size")
        if isinstance(b, (int, float)):
            it = int(rec["iteration"])
            total[it] = total.get(it, 0.0) + float(b)
    tails = set()
    for it, g in total.items():
        before, earlier, after = total.get(it - 1), total.get(it - 2), total.get(it + 1)
        if before is not None and before == earlier and g < before and after != g:
            tails.add(it)
    return tails


def _most(batch) -> str:
    sizes, counts = np.unique(batch, return_counts=True)
    i = int(np.argmax(counts))
    return f"local batch {sizes[i]:g} in {int(counts[i])} of {len(batch)} records"


def _size(group: Group) -> str:
    return f"{group.low:g}" if group.low == group.high else f"{group.low:g}-{group.high:g}"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms"
