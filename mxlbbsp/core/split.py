"""The split: the per-worker batch sizes of one iteration, chosen so that all finish together.

Pure numpy; no MXNet. The coordinator calls :meth:`Balancer.split` once per iteration
with the workers' time models (:mod:`mxlbbsp.core.timemodel`).

The words, one each:

* **split**: the per-worker batch sizes of one iteration, in rank order, a vector that sums to
  the global batch B(t) (:func:`solve` chooses it, :meth:`Balancer.split` with the
  threshold and the bounds, :func:`equal_split` for BSP).
* **slice**: one worker's part of a split, where it sits in the global batch
  (:class:`Slice`: offset, size, total), what the ``slice`` message carries to it
  (:mod:`mxlbbsp.core.protocol`; a SLICES frame holds the slices of one split for a host).
* **rescaling**: a split (or a slice) carried to another global batch in its proportions,
  here only: the coordinator through :meth:`Balancer.scale` (``bounds=False``:
  :func:`rescale`), each worker for its own slice through its session's ``rescale``
  (:func:`rescale_slice`), both the same numbers.

The split solves, over integers::

    minimise  max_i t_i(b_i)   subject to   sum_i b_i = B,   lo_i <= b_i <= hi_i

exactly: the continuous optimum T* (found in O(n log n) from the breakpoints of the piecewise
linear capacity function) is rounded down, and the remaining (< n) samples go one at a time to
the worker that would finish earliest with one more. Because every t_i is increasing and the
rounded-down point lies below some integer optimum, this greedy completion is optimal. (The
greedy is done in arrays: its choices are the smallest of every worker's candidate finish
times, a + (b + k) / v for its k-th extra sample, in the order the heap of the one-at-a-time
greedy pops them, ties to the faster worker, then the lower rank: :func:`_complete`.)

A worker's slice is the index range it reads of the epoch's permutation.
"""
from __future__ import annotations

import heapq
from typing import NamedTuple, Optional, Sequence

import numpy as np

from mxlbbsp.core.timemodel import TimeModel, makespan


class SplitError(ValueError):
    """The global batch cannot be split within the bounds."""


def _bounds(n: int, total: int, lower, upper):
    lo = np.broadcast_to(np.asarray(1 if lower is None else lower, dtype=np.int64), (n,)).copy()
    hi = np.broadcast_to(np.asarray(total if upper is None else upper, dtype=np.int64), (n,))
    hi = np.minimum(hi, total)
    if np.any(lo < 0) or np.any(hi < lo):
        raise SplitError(f"invalid bounds: lower={lo.tolist()} upper={hi.tolist()}")
    if lo.sum() > total:
        raise SplitError(f"global batch {total} is smaller than the sum of the minimum "
                              f"local batches ({int(lo.sum())})")
    if hi.sum() < total:
        raise SplitError(f"global batch {total} exceeds the sum of the maximum local "
                              f"batches ({int(hi.sum())})")
    return lo, hi


def _continuous_makespan(model: TimeModel, total: float, lo, hi) -> float:
    """The T with sum_i clip((T - a_i) * v_i, lo_i, hi_i) == total."""
    v, a = model.speed, model.intercept
    t_lo = a + lo / v                       # below: worker i holds lo_i
    t_hi = a + hi / v                       # above: worker i holds hi_i
    points = np.concatenate([t_lo, t_hi])
    slope_change = np.concatenate([v, -v])
    order = np.argsort(points, kind="stable")
    points, slope_change = points[order], slope_change[order]
    slope = np.cumsum(slope_change)         # slope of the capacity right after each point
    capacity = lo.sum() + np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(points))])
    k = int(np.searchsorted(capacity, total, side="right")) - 1
    k = min(max(k, 0), len(points) - 1)
    if slope[k] <= 0:
        return float(points[k])
    return float(points[k] + (total - capacity[k]) / slope[k])


def solve(model: TimeModel, total: int, lower=1, upper=None) -> np.ndarray:
    """The integer split of ``total`` samples with the smallest makespan (see module doc).

    ``lower``/``upper`` are per-worker bounds (scalars broadcast); ``upper=None`` means no cap.
    A sample whose finish times tie goes to the faster worker, then to the lower rank: the
    result is deterministic, and a faster worker never gets fewer samples.
    """
    v = np.asarray(model.speed, dtype=float)
    n = v.shape[0]
    if n == 0:
        raise SplitError("no workers")
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise SplitError(f"speeds must be finite and positive, got {v.tolist()}")
    a = np.maximum(np.asarray(model.intercept, dtype=float), 0.0)
    model = TimeModel(v, a)
    total = int(total)
    lo, hi = _bounds(n, total, lower, upper)
    t_star = _continuous_makespan(model, total, lo, hi)
    share = np.clip((t_star - a) * v, lo, hi)
    batch = np.clip(np.floor(share + 1e-9).astype(np.int64), lo, hi)
    remaining = total - int(batch.sum())
    if 0 < remaining <= int(np.count_nonzero(batch < hi)):
        _complete(batch, a, v, hi, remaining)
    elif remaining > 0:                     # not from the rounding above: one at a time
        _complete_by_heap(batch, a, v, hi, remaining)
    elif remaining < 0:  # only from rounding at the 1e-9 guard; take back from the latest
        heap = [(-(a[i] + batch[i] / v[i]), v[i], i) for i in range(n) if batch[i] > lo[i]]
        heapq.heapify(heap)
        for _ in range(-remaining):
            _, _, i = heapq.heappop(heap)
            batch[i] -= 1
            if batch[i] > lo[i]:
                heapq.heappush(heap, (-(a[i] + batch[i] / v[i]), v[i], i))
    return batch


def _complete_by_heap(batch: np.ndarray, a: np.ndarray, v: np.ndarray, hi: np.ndarray,
                      remaining: int) -> None:
    """:func:`_complete` one sample at a time with a heap of each worker's next finish time
    (ties: the faster, then the lower rank): for many more samples than workers, and the
    reference the arrays must equal (tests/test_balancer.py)."""
    heap = [(a[i] + (batch[i] + 1) / v[i], -v[i], i) for i in range(len(batch))
            if batch[i] < hi[i]]
    heapq.heapify(heap)
    for _ in range(remaining):
        _, _, i = heapq.heappop(heap)
        batch[i] += 1
        if batch[i] < hi[i]:
            heapq.heappush(heap, (a[i] + (batch[i] + 1) / v[i], -v[i], i))


def _complete(batch: np.ndarray, a: np.ndarray, v: np.ndarray, hi: np.ndarray,
              remaining: int) -> None:
    """Give ``remaining`` more samples, one at a time each to the worker that finishes
    earliest with one more (ties: the faster, then the lower rank), ``batch`` in place:
    what a heap of each worker's next finish time pops, in arrays. A worker's k-th extra
    sample would finish at a + (b + k) / v (the heap's number: the same operations), later
    for every k; so the heap pops the ``remaining`` smallest of all these candidates, in
    (time, -speed, rank) order. None later than the ``remaining``-th smallest first extra
    can be among them, which bounds the candidates to about n + remaining."""
    room = hi - batch
    live = np.flatnonzero(room > 0)
    first = a[live] + (batch[live] + 1) / v[live]
    tau = np.partition(first, remaining - 1)[remaining - 1]
    with np.errstate(invalid="ignore", over="ignore"):
        count = np.floor((tau - a[live]) * v[live] - batch[live]) + 2    # 1 to spare
    count = np.minimum(np.minimum(np.maximum(count, 1), room[live]), remaining).astype(np.int64)
    who = np.repeat(live, count)
    k = np.arange(len(who)) - np.repeat(np.cumsum(count) - count, count) + 1
    when = a[who] + (batch[who] + k) / v[who]
    chosen = who[np.lexsort((who, -v[who], when))[:remaining]]
    batch += np.bincount(chosen, minlength=len(batch))


def _equal_parts(total: int, n: int) -> tuple:
    """(total // n, total % n) of BSP's split; SplitError when a worker would get nothing."""
    if n <= 0 or total < n:
        raise SplitError(f"cannot split a global batch of {total} among {n} workers "
                              "with at least one sample each")
    return divmod(int(total), int(n))


def equal_split(total: int, n: int) -> np.ndarray:
    """BSP's split: total // n each, the remainder one each to the lowest ranks."""
    base, extra = _equal_parts(total, n)
    out = np.full(int(n), base, dtype=np.int64)
    out[:extra] += 1
    return out


class Slice(NamedTuple):
    """One worker's part of a global batch: samples [offset, offset + size) of ``total``."""

    offset: int
    size: int
    total: int


def equal_slice(total: int, n: int, rank: int) -> Slice:
    """Worker ``rank``'s slice of :func:`equal_split` ``(total, n)``, in integers: what a
    worker of ``bsp`` (and every mode without splits) cuts each iteration, without building
    the whole split."""
    base, extra = _equal_parts(total, n)
    rank = int(rank)
    return Slice(rank * base + min(rank, extra), base + (rank < extra), int(total))


def slice_of(split: Sequence[int], rank: int) -> Slice:
    """Worker ``rank``'s slice of ``split``."""
    split = [int(b) for b in split]
    return Slice(sum(split[:rank]), split[rank], sum(split))


def _boundary(i: int, start: int, n: int, old_total: int, new_total: int) -> int:
    """Where worker i's slice starts once a split of ``old_total`` (in which it started at
    ``start``) is scaled to ``new_total``: every worker has one sample, and the samples above
    that are shared in the old proportions. Integer arithmetic, rounding half up: worker i-1
    computes the same number as its end, so the scaled slices tile the new batch exactly."""
    if new_total < n:
        raise SplitError(f"cannot split a global batch of {new_total} among {n} workers "
                              "with at least one sample each")
    extra_old, extra_new = old_total - n, new_total - n
    if extra_old <= 0:                      # one sample each: no proportions to keep
        base, rest = divmod(new_total, n)
        return i * base + min(i, rest)
    return i + ((start - i) * extra_new * 2 + extra_old) // (2 * extra_old)


def rescale_slice(part: Slice, rank: int, n: int, total: int) -> Slice:
    """``part`` (worker ``rank``'s slice, one of n) scaled to a global batch of ``total``,
    from this worker's slice alone: what :func:`rescale` gives the whole split. A worker
    calls it through its session only (``Session.rescale``)."""
    if part.total == total:
        return part
    start = _boundary(rank, part.offset, n, part.total, total)
    end = _boundary(rank + 1, part.offset + part.size, n, part.total, total)
    return Slice(start, end - start, total)


def rescale(split: Sequence[int], total: int) -> np.ndarray:
    """Scale a split to another global batch size, keeping its proportions.

    Used for a short last batch of an epoch. Deterministic, and the same as every worker
    computes for itself with :func:`rescale_slice`. The coordinator calls it through
    :meth:`Balancer.scale` (``bounds=False``) only.
    """
    split = np.asarray(split, dtype=np.int64)
    old = int(split.sum())
    if old == total:
        return split
    n = len(split)
    starts = np.concatenate([[0], np.cumsum(split)])
    bounds = [_boundary(i, int(starts[i]), n, old, total) for i in range(n + 1)]
    return np.diff(bounds).astype(np.int64)


class Balancer:
    """Per-iteration split with semi-dynamic hysteresis.

    ``threshold``: keep the split in force unless the new one is predicted to shorten the
    iteration by at least this fraction (the semi-dynamic rule; stops batch sizes jittering
    with prediction noise), the iteration of the workers whose batch it changes. ``min_batch`` >= 1: a worker with no samples would never push its
    gradient and the dist_sync servers would wait forever. ``max_batch``: per-worker caps
    (memory), scalar or sequence; None for none. ``prefer_equal``: see :meth:`_prefer_equal`.
    """

    def __init__(self, threshold: float = 0.03, min_batch: int = 1, max_batch=None,
                 prefer_equal: bool = False):
        if min_batch < 1:
            raise ValueError("min_batch must be >= 1")
        if not 0 <= threshold < 1:
            raise ValueError("threshold must be in [0, 1)")
        self.threshold = float(threshold)
        self.min_batch = int(min_batch)
        self.max_batch = max_batch
        #: prefer the equal split when it is within the threshold of the best (see
        #: _prefer_equal); the coordinator turns it on while the fixed cost dominates
        self.prefer_equal = bool(prefer_equal)
        #: why the last split() chose what it chose, in a few words (for ``-v``)
        self.decision = ""

    def lower(self, total: int, n: int) -> np.ndarray:
        """Each worker's least local batch in a global batch of ``total`` among ``n``:
        ``min_batch``, as far as ``total`` allows (the short last batch of an epoch, or a
        smaller B(t) chosen as the job runs, may hold fewer than n x ``min_batch``: then
        every worker gets at least its equal share rounded down), and never above a
        worker's own cap. So every global batch that registration let through can be split
        (:func:`mxlbbsp.control.registration.check_hellos` refuses the rest)."""
        lo = np.full(n, max(1, min(self.min_batch, int(total) // max(n, 1))), dtype=np.int64)
        if self.max_batch is not None:
            lo = np.maximum(np.minimum(lo, np.asarray(self.max_batch, dtype=np.int64)), 1)
        return lo

    def fits(self, split, total: int) -> bool:
        """Whether ``split`` is a split of ``total`` within this balancer's bounds."""
        split = np.asarray(split, dtype=np.int64)
        return int(split.sum()) == int(total) and bool(
            np.all(split >= self.lower(total, len(split))) and (
                self.max_batch is None or np.all(split <= np.asarray(self.max_batch))))

    def scale(self, split: Sequence[int], total: int, bounds: bool = True) -> np.ndarray:
        """``split`` (a split in force) scaled to a global batch of ``total``: the one way
        the coordinator's side rescales a split.

        ``bounds=True``: in its proportions as far as the bounds allow: the split of an
        iteration before any speed was learnt (the warm-up; :meth:`even` at the first
        iteration). ``bounds=False``: :func:`rescale`, the proportions without the bounds,
        the numbers every worker computes for its own slice (:func:`rescale_slice`) when
        its global batch differs from the split's total (an epoch's short last batch); a
        worker's cap or least local batch need not hold."""
        if not bounds:
            return rescale(split, total)
        split = np.asarray(split, dtype=np.int64)
        if self.fits(split, total):
            return split
        return solve(TimeModel.linear(np.maximum(split, 1).astype(float)), total,
                     self.lower(total, len(split)), self.max_batch)

    def even(self, total: int, n: int) -> np.ndarray:
        """The split of ``total`` among ``n`` workers as even as the bounds allow: the equal
        split (:func:`equal_split`) unless a worker's cap is below its share."""
        return self.scale(np.ones(n, dtype=np.int64), total)

    def split(self, model: TimeModel, total: int,
              in_force: Optional[Sequence[int]] = None) -> np.ndarray:
        """The next split, or ``in_force`` (the split in force) when the gain is below the
        threshold."""
        lower = self.lower(total, np.asarray(model.speed).shape[0])
        new = solve(model, total, lower, self.max_batch)
        self.decision = "new split (no current one)"
        if in_force is None:
            return new
        in_force = np.asarray(in_force, dtype=np.int64)
        if in_force.shape != new.shape or int(in_force.sum()) != total:
            self.decision = "new split (the global batch changed)"
            return new
        if not self.fits(in_force, total):
            self.decision = "new split (the current one breaks a per-worker limit)"
            return new
        # Over the workers whose batch would change: one that keeps its batch and finishes
        # last either way (a clearly slower worker at its least batch) makes every split of
        # the others equally long, and the first split they were given would be kept for
        # good however uneven (seen: two equal workers held at 41 and 18 samples)
        moved = new != in_force
        if moved.any():
            part = TimeModel(np.asarray(model.speed, dtype=float)[moved],
                             np.asarray(model.intercept, dtype=float)[moved])
            old_t, new_t = makespan(part, in_force[moved]), makespan(part, new[moved])
        else:
            old_t = new_t = makespan(model, in_force)
        gain = (old_t - new_t) / old_t if old_t > 0 else 0.0
        if np.array_equal(new, in_force):
            self.decision = "the same split (still the predicted best)"
        elif old_t <= 0 or gain < self.threshold:
            new = in_force
            self.decision = (f"kept the split: a new one is predicted {100 * gain:.1f}% "
                             f"faster, under the threshold {100 * self.threshold:g}%")
        else:
            self.decision = (f"new split: predicted {100 * gain:.1f}% faster than the "
                             f"current one (threshold {100 * self.threshold:g}%)")
        return self._prefer_equal(model, total, new) if self.prefer_equal else new

    def _prefer_equal(self, model: TimeModel, total: int, chosen: np.ndarray) -> np.ndarray:
        """The equal split when it is predicted within ``threshold`` of ``chosen``.

        When the fixed cost dominates, every split takes about as long, and prediction noise
        alone would walk the split to an extreme (63:1 on two equal workers); this pulls it
        back to equal whenever an uneven split does not buy at least the threshold.
        """
        n = len(chosen)
        equal = equal_split(total, n)
        if self.max_batch is not None and np.any(equal > np.asarray(self.max_batch)):
            return chosen
        eq_t, ch_t = makespan(model, equal), makespan(model, chosen)
        if eq_t <= 0 or (eq_t - ch_t) / eq_t < self.threshold:
            if not np.array_equal(equal, chosen):
                gain = (eq_t - ch_t) / eq_t if eq_t > 0 else 0.0
                self.decision = (f"equal split: the uneven one is predicted only "
                                 f"{100 * gain:.1f}% faster, under the threshold "
                                 f"{100 * self.threshold:g}%")
            return equal
        return chosen
