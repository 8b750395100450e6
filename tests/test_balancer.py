"""Invariants of the allocation, as property tests with seeded inputs."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mxlbbsp.core.timemodel import AffineFit
from mxlbbsp.core.split import SplitError
from mxlbbsp.core.split import Balancer
from mxlbbsp.core.timemodel import TimeModel
from mxlbbsp.core.split import solve
from mxlbbsp.core.split import equal_split
from mxlbbsp.core.timemodel import makespan
from mxlbbsp.core.timemodel import pooled_slope
from mxlbbsp.core.split import rescale
from mxlbbsp.core.split import rescale_slice
from mxlbbsp.core.split import slice_of
from mxlbbsp.core.split import equal_slice

speeds = st.lists(st.floats(0.05, 1000.0, allow_nan=False), min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(speeds, st.integers(0, 5000), st.data())
def test_sum_is_exactly_B_and_bounds_hold(v, extra, data):
    n = len(v)
    B = n + extra
    lo = data.draw(st.integers(1, max(1, B // n)))
    hi = data.draw(st.one_of(st.none(), st.integers(lo, B)))
    if hi is not None and hi * n < B:
        with pytest.raises(SplitError):
            solve(TimeModel.linear(v), B, lo, hi)
        return
    b = solve(TimeModel.linear(v), B, lo, hi)
    assert b.dtype.kind == "i"
    assert int(b.sum()) == B
    assert b.min() >= lo
    if hi is not None:
        assert b.max() <= hi


@settings(max_examples=300, deadline=None)
@given(speeds, st.integers(0, 5000), st.floats(0.0, 2.0))
def test_a_faster_worker_never_gets_a_smaller_batch(v, extra, intercept):
    B = len(v) + extra
    model = TimeModel(np.array(v), np.full(len(v), intercept))
    b = solve(model, B)
    order = np.argsort(v, kind="stable")
    for i, j in zip(order[:-1], order[1:]):   # v[i] <= v[j]
        if v[i] < v[j]:
            assert b[i] <= b[j], (v, b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=3),
       st.lists(st.floats(0.0, 3.0), min_size=3, max_size=3),
       st.integers(0, 12), st.booleans())
def test_affine_makespan_is_minimal_against_brute_force(v, a, extra, capped):
    n = len(v)
    B = n + extra
    model = TimeModel(np.array(v), np.array(a[:n]))
    hi = max(1, (B + n - 1) // n + 1) if capped else None
    b = solve(model, B, 1, hi)
    best = min(makespan(model, c)
               for c in itertools.product(range(1, (hi or B) + 1), repeat=n) if sum(c) == B)
    assert makespan(model, b) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_linear_split_is_proportional_to_speed():
    assert solve(TimeModel.linear([1, 1, 3]), 100).tolist() == [20, 20, 60]
    assert solve(TimeModel.linear([3, 1]), 64).tolist() == [48, 16]


def test_finish_time_ties_go_to_the_faster_worker():
    # 2/999.9999999999999 and 2/1000 are the same float: the tie must not go to rank 0
    assert solve(TimeModel.linear([999.9999999999999, 1000.0]), 3).tolist() == [1, 2]


def test_every_worker_gets_at_least_one_sample():
    b = solve(TimeModel.linear([1000.0, 1.0, 1.0]), 10)
    assert b.min() >= 1 and b.sum() == 10


def test_infeasible_bounds_are_refused_with_a_reason():
    with pytest.raises(SplitError, match="smaller than the sum of the minimum"):
        solve(TimeModel.linear([1, 1, 1]), 2)
    with pytest.raises(SplitError, match="finite and positive"):
        solve(TimeModel.linear([1, float("nan")]), 8)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 64), extra=st.integers(0, 5000), data=st.data())
def test_a_workers_equal_slice_is_its_slice_of_the_equal_split(n, extra, data):
    """What a worker cuts in bsp (integers, from its rank alone) is its part of the whole
    equal split, so the workers' slices tile the global batch."""
    total = n + extra
    rank = data.draw(st.integers(0, n - 1))
    assert equal_slice(total, n, rank) == slice_of(equal_split(total, n), rank)
    ends = [equal_slice(total, n, r) for r in range(n)]
    assert [p.offset for p in ends] == [0] + [p.offset + p.size for p in ends[:-1]]
    assert sum(p.size for p in ends) == total
    with pytest.raises(SplitError):
        equal_slice(n - 1, n, 0)


def test_equal_split_and_rescale():
    assert equal_split(10, 3).tolist() == [4, 3, 3]
    with pytest.raises(SplitError):
        equal_split(2, 3)
    r = rescale([48, 16], 20)
    assert r.sum() == 20 and r[0] > r[1]
    assert rescale([48, 16], 64).tolist() == [48, 16]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=40), st.data())
def test_each_worker_rescales_its_own_slice_and_the_slices_tile(sizes, data):
    """A worker knows only its own slice; scaled alone, the slices still tile the new global
    batch, give everyone a sample, and agree with scaling the whole allocation."""
    n = len(sizes)
    new_total = data.draw(st.integers(n, 3 * sum(sizes)))
    whole = rescale(sizes, new_total)
    pieces = [rescale_slice(slice_of(sizes, i), i, n, new_total) for i in range(n)]
    assert [p.size for p in pieces] == whole.tolist()
    assert pieces[0].offset == 0 and pieces[-1].offset + pieces[-1].size == new_total
    assert all(a.offset + a.size == b.offset for a, b in zip(pieces, pieces[1:]))
    assert min(p.size for p in pieces) >= 1 and int(whole.sum()) == new_total


def test_semi_dynamic_keeps_the_split_unless_the_gain_passes_the_threshold():
    bal = Balancer(threshold=0.05)
    current = np.array([32, 32])
    # 2% faster worker 0: the best split is barely better -> keep.
    kept = bal.split(TimeModel.linear([1.02, 1.0]), 64, current)
    assert kept.tolist() == [32, 32]
    # 3x faster worker 0: a big gain -> move.
    moved = bal.split(TimeModel.linear([3.0, 1.0]), 64, current)
    assert moved.tolist() == [48, 16]
    # A current split for another global batch is never kept.
    assert bal.split(TimeModel.linear([1.0, 1.0]), 20, current).sum() == 20


def test_affine_fit_recovers_the_fixed_cost():
    rng = np.random.default_rng(0)
    fit = AffineFit(num_workers=2)
    a_true, v_true = np.array([0.05, 0.2]), np.array([500.0, 100.0])
    for _ in range(40):
        # batches >= 16 keep the fixed cost under the fit's clamp (80% of the fastest time)
        b = rng.integers(16, 64, size=2)
        t = a_true + b / v_true + rng.normal(0, 1e-4, size=2)
        fit.observe(b, t)
    assert fit.intercept == pytest.approx(a_true, abs=5e-3)
    model = fit.model([32, 32], a_true + 32 / v_true)
    assert model.speed == pytest.approx(v_true, rel=0.05)


def test_affine_fit_never_explains_away_the_whole_iteration():
    fit = AffineFit(num_workers=1)
    for b in [1, 2, 1, 2, 1, 2]:
        fit.observe([b], [1.0 + 1e-3 * b])     # almost all fixed cost
    assert 0 < fit.intercept[0] <= 0.8 * 1.001 + 1e-12


def test_affine_fit_keeps_the_linear_model_when_batches_never_change():
    fit = AffineFit(num_workers=1)
    for _ in range(10):
        fit.observe([32], [0.3])
    assert fit.intercept.tolist() == [0.0]


def test_prefer_equal_pulls_a_split_back_when_uneven_gains_nothing():
    # fixed cost 10 s, per-sample 0.01 s and 0.011 s: the best split gains < 3 %
    model = TimeModel(np.array([100.0, 90.9]), np.array([10.0, 10.0]))
    bal = Balancer(0.03, prefer_equal=True)
    assert bal.split(model, 64, [63, 1]).tolist() == [32, 32]
    plain = Balancer(0.03)
    assert plain.split(model, 64, [63, 1]).tolist() == [63, 1]     # kept: the old rule
    # a worker 3x slower per sample with no fixed cost: uneven wins by far
    assert bal.split(TimeModel.linear([3.0, 1.0]), 64, [32, 32]).tolist() == [48, 16]


def test_affine_fit_job_share_sees_a_time_that_does_not_grow_with_the_batch():
    rng = np.random.default_rng(0)
    fit = AffineFit(2)
    for t in range(40):
        b = np.array([32 + (t % 8) * 4, 32 - (t % 8) * 4], dtype=float)
        fit.observe(b, 0.005 * np.exp(rng.normal(0, 0.3, 2)))     # 5 ms +- 30 %, any b
    assert fit.job_share >= 0.5
    lin = AffineFit(2)
    for t in range(40):
        b = np.array([32 + (t % 8) * 4, 32 - (t % 8) * 4], dtype=float)
        lin.observe(b, 0.001 * b * np.exp(rng.normal(0, 0.05, 2)))  # per-sample only
    assert lin.job_share < 0.3


def test_pooled_slope_is_not_set_by_one_stretched_iteration():
    # Worker 0 mostly near 10 samples, once at 32, and that iteration stretched 4x by a
    # passing tenant; worker 1 the mirror image. True line: 4 ms + 30 us per sample.
    rng = np.random.default_rng(1)
    b = np.array([[32] + list(10 + rng.integers(-3, 4, 31)),
                  [32] + list(54 + rng.integers(-3, 4, 31))], dtype=float)
    t = (0.004 + 3e-5 * b) * np.exp(rng.normal(0, 0.05, b.shape))
    t[0, 0] *= 4
    valid = np.ones_like(b, dtype=bool)
    slope, se = pooled_slope(b, t, valid)
    assert slope == pytest.approx(3e-5, abs=1.5e-5)
    assert 0 < se < 3e-5
    # what least squares makes of the same window: many times the true slope
    db, dt = b - b.mean(axis=1, keepdims=True), t - t.mean(axis=1, keepdims=True)
    assert (db * dt).sum() / (db * db).sum() > 5 * 3e-5


def test_pooled_slope_says_when_it_cannot_tell():
    b = np.full((2, 8), 32.0)
    slope, se = pooled_slope(b, np.full((2, 8), 0.01), np.ones((2, 8), dtype=bool))
    assert np.isnan(slope) and se == np.inf


def test_job_share_bounds_are_wide_until_the_batch_sizes_vary_enough():
    rng = np.random.default_rng(2)
    few = AffineFit(2)
    for t in range(32):          # one sample either way: the slope is noise
        b = np.array([32 + (t % 2), 32 - (t % 2)] if t % 3 else [33, 31], dtype=float)
        few.observe(b, (0.004 + 3e-5 * b) * np.exp(rng.normal(0, 0.3, 2)))
    assert few.job_share_low < 0.5 <= few.job_share_high
    many = AffineFit(2)
    for t in range(32):          # the split sweeps 16..48: the fixed cost is clear
        b = np.array([16 + (t % 8) * 4, 48 - (t % 8) * 4], dtype=float)
        many.observe(b, (0.004 + 3e-5 * b) * np.exp(rng.normal(0, 0.05, 2)))
    assert many.job_share_low >= 0.5 and many.job_share == pytest.approx(0.8, abs=0.1)


def test_equal_split_bounds_hold_the_time_at_the_equal_batch_whatever_the_fixed_cost():
    for fixed_share in (0.0, 0.5, 0.95):
        fit = AffineFit(2)
        a, c = fixed_share * 0.01, (1 - fixed_share) * 0.01 / 32    # 10 ms at 32 samples
        for t in range(16):
            b = np.array([8 + t % 3, 56 - t % 3], dtype=float)
            fit.observe(b, a + c * b)
        lo, hi = fit.equal_split_bounds(32)
        assert np.all(lo <= 0.01 + 1e-12) and np.all(0.01 - 1e-12 <= hi)
        # far from the equal split no worker can be shown slower than the other
        assert lo.max() <= hi.min()
    fit = AffineFit(2)
    for _ in range(8):
        fit.observe([32, 32], [0.01, 0.02])
    lo, hi = fit.equal_split_bounds(32)
    assert lo.tolist() == hi.tolist() == [0.01, 0.02]       # at the equal split: exact
    short = AffineFit(2)
    short.observe([32, 32], [0.01, 0.02])
    assert np.isnan(short.equal_split_bounds(32)[0]).all()   # one observation: cannot tell


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 4), window=st.sampled_from([8, 16, 32]), steps=st.integers(0, 80),
       recent=st.one_of(st.none(), st.integers(1, 40)),
       share=st.tuples(st.floats(-0.5, 1.5), st.floats(-0.5, 1.5)),
       equal=st.floats(1, 64), seed=st.integers(0, 2 ** 16))
def test_equal_split_bounds_are_the_medians_of_the_carried_times(n, window, steps, recent,
                                                                 share, equal, seed):
    """What equal_split_bounds documents, against np.nanmedian written out: each valid
    observation of the last ``recent`` carried to the equal batch at both fixed shares
    (clipped to [0, 1]), the per-worker medians of the lower and the higher; NaN while any
    worker has fewer than min(8, columns) valid ones. Windows with missing times and zero
    batches (the masked path) and full ones (its shortcut) alike."""
    import warnings
    rng = np.random.default_rng(seed)
    fit = AffineFit(n, window=window)
    for _ in range(steps):
        b = rng.integers(0, 64, n).astype(float)
        t = 0.003 + b * 1e-5 * rng.uniform(0.5, 2, n)
        t[rng.random(n) < 0.05] = np.nan
        fit.observe(b, t)
    lo, hi = fit.equal_split_bounds(equal, recent=recent, fixed_share=share)
    k = window if recent is None or recent >= window else recent
    cols = [(fit._next - 1 - j) % window for j in range(k)]
    b, t = fit._b[:, cols], fit._t[:, cols]
    valid = np.isfinite(b) & np.isfinite(t) & (t > 0) & (b > 0)
    if valid.sum(axis=1).min() < min(k, 8):
        assert np.isnan(lo).all() and np.isnan(hi).all()
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        carried = [t * (phi + (1.0 - phi) * equal / b) for phi in np.clip(share, 0.0, 1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected_lo = np.nanmedian(np.where(valid, np.minimum(*carried), np.nan), axis=1)
        expected_hi = np.nanmedian(np.where(valid, np.maximum(*carried), np.nan), axis=1)
    assert np.array_equal(lo, expected_lo) and np.array_equal(hi, expected_hi)


def test_nanmedian_last_is_numpys_nanmedian_without_its_cost():
    """balancer.nanmedian_last (on the coordinator's critical path) gives np.nanmedian's
    numbers along the last axis, NaN for a row with nothing left, for 1-, 2- and 3-D input,
    with NaNs and without (its shortcut)."""
    import warnings
    from mxlbbsp.core.timemodel import nanmedian_last
    rng = np.random.default_rng(0)
    for shape, nans in itertools.product([(1,), (7,), (8,), (5, 6), (2, 8), (3, 4, 9)],
                                         [True, False]):
        x = rng.normal(size=shape) * 10.0 ** rng.uniform(-6, 3)
        if nans:
            x[rng.random(shape) < 0.3] = np.nan
            if len(shape) > 1:
                x[(0,) * (len(shape) - 1)] = np.nan      # a row with nothing left
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(x, axis=-1)
        assert np.array_equal(nanmedian_last(x), expected, equal_nan=True), shape


def test_std_rows_is_numpys_nanstd():
    """balancer._std_rows (which workers pooled_slope keeps, at more than POOLED_WORKERS)
    gives np.nanstd's numbers bit for bit, NaN for a row with nothing valid: the same workers
    are kept, so the same slope."""
    import warnings
    from mxlbbsp.core.timemodel import _std_rows
    rng = np.random.default_rng(0)
    for rows, cols in [(1, 1), (3, 8), (40, 32), (256, 32)]:
        b = rng.integers(1, 80, size=(rows, cols)) * rng.uniform(0.5, 2.0)
        valid = rng.random((rows, cols)) < 0.8
        valid[0] = False                                  # a row with nothing valid
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanstd(np.where(valid, b, np.nan), axis=1)
        assert np.array_equal(_std_rows(b, valid), expected, equal_nan=True), (rows, cols)
    # AffineFit.observe hands pooled_slope the spreads it has already computed: the same
    # workers kept, the same slope as pooled_slope computing them itself
    from mxlbbsp.core.timemodel import AffineFit
    from mxlbbsp.core.timemodel import POOLED_WORKERS
    from mxlbbsp.core.timemodel import pooled_slope
    n = POOLED_WORKERS + 8
    fit = AffineFit(n)
    for _ in range(12):
        batch = rng.integers(10, 60, n).astype(float)
        fit.observe(batch, 0.002 + 1e-4 * batch * rng.lognormal(0, 0.1, n))
    valid = np.isfinite(fit._t)
    assert fit.pooled_slope == pooled_slope(fit._b, fit._t, valid)[0]


def test_the_balancer_says_why_it_chose_a_split():
    """`launch -v` logs these: a new split and its predicted gain, or the split kept."""
    from mxlbbsp.core.split import Balancer
    from mxlbbsp.core.timemodel import TimeModel
    b = Balancer(threshold=0.05)
    model = TimeModel.linear(np.array([100.0, 100.0]))
    assert list(b.split(model, 64, [31, 33])) == [31, 33]        # 3 % gain at most: kept
    assert b.decision == ("kept the split: a new one is predicted 3.0% faster, under the "
                          "threshold 5%"), b.decision
    assert list(b.split(model, 64, [16, 48])) == [32, 32]
    assert b.decision == ("new split: predicted 33.3% faster than the current one "
                          "(threshold 5%)")
    b.split(model, 64, [32, 32])
    assert b.decision == "the same split (still the predicted best)"
    b.split(model, 64)
    assert b.decision == "new split (no current one)"


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 60), st.sampled_from(["spread", "equal", "rounded"]), st.booleans(),
       st.booleans(), st.data())
def test_the_greedy_completion_in_arrays_chooses_what_the_heap_did(n, speeds, fixed, capped,
                                                                   data):
    from mxlbbsp.core import split as S
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    v = {"spread": rng.uniform(10, 1000, n), "equal": np.full(n, rng.uniform(10, 1000)),
         "rounded": np.round(rng.uniform(1, 20, n))}[speeds]
    a = rng.uniform(0, 0.01, n) if fixed else np.zeros(n)      # ties in time with equal v
    batch = rng.integers(1, 50, n)
    hi = batch + rng.integers(0, 40, n) if capped else np.full(n, 10 ** 9)
    live = int((hi > batch).sum())
    if live == 0:
        return
    remaining = data.draw(st.integers(1, live))
    mine, theirs = batch.copy(), batch.copy()
    S._complete(mine, a, v, hi, remaining)
    S._complete_by_heap(theirs, a, v, hi, remaining)
    assert mine.tolist() == theirs.tolist()
