"""The split of one global batch (mxlbbsp.core.split) over the whole input space.

Generated: 1 to 1024 workers, global batches up to millions, speeds over four orders of
magnitude, fixed costs per iteration (time models t_i(b) = a_i + b / v_i), a least local
batch, per-worker caps, and a split in force (the balancer's hysteresis). Invariants:

* the split sums to B and respects every bound that can be respected: each worker at least
  min(least local batch, B // n) and at most its cap (no split at all when the caps add up
  to less than B);
* it is optimal: no integer split within the bounds finishes sooner (against the greedy
  that hands out one sample at a time to the worker that would finish first);
* a faster worker never gets fewer samples than a slower one with the same bounds and no
  smaller fixed cost;
* the same split on every worker: each worker's rescale_slice of its own slice is its part
  of rescale of the whole split, and the slices tile the new global batch.
"""
import heapq

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mxlbbsp.core import split
from mxlbbsp.core.timemodel import TimeModel, makespan
from props import WORKERS, per_worker, share, spread

BIG = 10 ** 12          # no cap (sums of n of them stay within int64)


@st.composite
def problems(draw, most_workers=1024, most_batch=10 ** 6):
    """(time model, B, least local batch, caps or None, a current split or None)."""
    n = draw(spread(1, most_workers))
    B = draw(st.one_of(st.integers(n, n + 64), spread(n, max(n, most_batch))))
    speed = np.array(per_worker(draw, n, st.floats(0.05, 1000.0),
                                lambda rng, k: rng.lognormal(3, 2, k).clip(0.05, 1000.0)))
    fixed = draw(st.sampled_from(["none", "some", "equal"]))
    if fixed == "none":
        a = np.zeros(n)
    elif fixed == "equal":
        a = np.full(n, draw(st.floats(0.0, 1.0)))
    else:
        a = np.array(per_worker(draw, n, st.floats(0.0, 1.0),
                                lambda rng, k: rng.uniform(0, 1, k)))
    least = draw(st.one_of(st.just(1), st.integers(1, 16), st.integers(1, 2 * B // n + 2)))
    caps = None
    share_ = -(-B // n)
    if draw(st.booleans()):
        caps = np.array(per_worker(draw, n, st.one_of(st.integers(1, 2 * share_ + 2),
                                                      st.just(B)),
                                   lambda rng, k: rng.integers(1, 2 * share_ + 3, k)))
    current = None
    if draw(st.booleans()):
        current = np.array(per_worker(draw, n, st.integers(1, 2 * share_ + 2),
                                      lambda rng, k: rng.integers(1, 2 * share_ + 3, k)))
    return TimeModel(speed, a), B, least, caps, current


def bounds(B, n, least, caps):
    hi = np.full(n, BIG) if caps is None else np.asarray(caps, dtype=np.int64)
    lo = np.maximum(np.minimum(np.minimum(least, B // n), hi), 1)
    return lo, hi


@share(3.0)
@given(problems(), st.booleans())
def test_a_split_sums_to_B_and_keeps_every_bound_it_can(problem, prefer_equal):
    model, B, least, caps, current = problem
    n = len(model.speed)
    bal = split.Balancer(threshold=0.05, min_batch=least, max_batch=caps,
                         prefer_equal=prefer_equal)
    lo, hi = bounds(B, n, least, caps)
    if hi.sum() < B:
        with pytest.raises(split.SplitError):
            bal.split(model, B, current)
        return
    b = bal.split(model, B, current)
    assert b.dtype.kind == "i" and b.shape == (n,)
    assert int(b.sum()) == B
    assert np.all(b >= lo), (b.tolist(), lo.tolist())
    assert np.all(b <= hi), (b.tolist(), hi.tolist())


def greedy(model, B, lo, hi) -> np.ndarray:
    """The optimal integer split, the slow way: from the least local batches, each further
    sample to the worker that would finish it first."""
    b = lo.copy()
    heap = [(model.intercept[i] + (b[i] + 1) / model.speed[i], i) for i in range(len(b))
            if b[i] < hi[i]]
    heapq.heapify(heap)
    for _ in range(B - int(b.sum())):
        _, i = heapq.heappop(heap)
        b[i] += 1
        if b[i] < hi[i]:
            heapq.heappush(heap, (model.intercept[i] + (b[i] + 1) / model.speed[i], i))
    return b


@share(2.0)
@given(problems(most_workers=64, most_batch=4000))
def test_the_split_finishes_no_later_than_any_other_within_the_bounds(problem):
    model, B, least, caps, _ = problem
    n = len(model.speed)
    lo, hi = bounds(B, n, least, caps)
    assume(hi.sum() >= B)
    b = split.solve(model, B, lo, None if caps is None else hi)
    best = makespan(model, greedy(model, B, lo, hi))
    assert makespan(model, b) <= best * (1 + 1e-12) + 1e-12


@share(3.0)
@given(problems(), st.booleans())
def test_a_faster_worker_never_gets_fewer_samples_under_the_same_bounds(problem, prefer):
    model, B, least, caps, _ = problem
    n = len(model.speed)
    lo, hi = bounds(B, n, least, caps)
    assume(hi.sum() >= B)
    b = split.Balancer(0.05, least, caps, prefer_equal=prefer).split(model, B)
    v, a = model.speed, np.maximum(model.intercept, 0)
    # pairs (i, j): i at least as fast as j with no larger fixed cost, one of them strictly
    # (a fixed cost a nanosecond smaller at least: less vanishes from the finish times'
    # floats, and the tie goes to the lower rank), and the same bounds; a few hundred pairs
    rng = np.random.default_rng(n)
    i, j = rng.integers(0, n, (2, min(n * n, 400)))
    keep = (v[i] >= v[j]) & (a[i] <= a[j]) & ((v[i] > v[j]) | (a[i] < a[j] - 1e-9)) \
        & (lo[i] == lo[j]) & (hi[i] == hi[j])
    i, j = i[keep], j[keep]
    assert np.all(b[i] >= b[j]), [(int(x), int(y), int(b[x]), int(b[y]))
                                  for x, y in zip(i, j) if b[x] < b[y]][:3]


@share(3.0)
@given(WORKERS, st.data())
def test_equal_split_is_as_even_as_can_be(n, data):
    B = data.draw(spread(n, 10 ** 7))
    b = split.equal_split(B, n)
    assert int(b.sum()) == B and b.max() - b.min() <= 1
    assert np.all(np.diff(b) <= 0)          # the remainder to the lowest ranks
    with pytest.raises(split.SplitError):
        split.equal_split(n - 1, n)


@share(3.0, props=1.5)
@given(WORKERS, st.data())
def test_every_worker_scales_its_own_slice_to_its_part_of_the_whole(n, data):
    if n <= 8 and data.draw(st.booleans()):
        sizes = np.array(data.draw(st.lists(st.integers(1, 500), min_size=n, max_size=n)))
    else:
        sizes = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1))).integers(1, 500, n)
    total = data.draw(spread(n, 4 * int(sizes.sum())))
    whole = split.rescale(sizes, total)
    pieces = [split.rescale_slice(split.slice_of(sizes, i), i, n, total) for i in range(n)]
    assert [p.size for p in pieces] == whole.tolist()
    assert [p.total for p in pieces] == [total] * n
    assert pieces[0].offset == 0 and pieces[-1].offset + pieces[-1].size == total
    assert all(p.offset + p.size == q.offset for p, q in zip(pieces, pieces[1:]))
    assert whole.min() >= 1 and int(whole.sum()) == total


@share(2.0)
@given(problems())
def test_the_split_before_any_speed_is_the_equal_one_within_the_bounds(problem):
    """Balancer.even (the first split) and Balancer.scale (the warm-up): within the bounds,
    and the equal split, or the split in force, wherever the bounds allow it."""
    model, B, least, caps, current = problem
    n = len(model.speed)
    lo, hi = bounds(B, n, least, caps)
    assume(hi.sum() >= B)
    bal = split.Balancer(0.05, least, caps)
    even = bal.even(B, n)
    assert int(even.sum()) == B and np.all(even >= lo) and np.all(even <= hi)
    equal = split.equal_split(B, n)
    if np.all(equal <= hi):
        assert even.tolist() == equal.tolist()
    if current is not None:
        scaled = bal.scale(current, B)
        assert int(scaled.sum()) == B and np.all(scaled >= lo) and np.all(scaled <= hi)
        if int(current.sum()) == B and np.all(current >= lo) and np.all(current <= hi):
            assert scaled.tolist() == current.tolist()
