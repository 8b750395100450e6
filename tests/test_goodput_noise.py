"""The noise-scale estimator (mxlbbsp/core/noise.py) on synthetic gradients of known noise."""
import math

import numpy as np
import pytest

from mxlbbsp.core import noise


def _sums(rng, G, sd, sizes):
    """Gradient sums of b samples each, per-sample gradients ~ N(G, diag(sd^2)): the sum of
    b of them is b G + sqrt(b) N(0, diag(sd^2)) exactly."""
    return [b * G + math.sqrt(b) * sd * rng.standard_normal(G.shape) for b in sizes]


@pytest.mark.parametrize("sizes", [[8, 24, 96], [16, 16, 16, 16], [5, 40]])
def test_noise_scale_gaussian_within_20_percent(sizes):
    rng = np.random.default_rng(1)
    d = 2000
    G = rng.standard_normal(d) * 0.05
    sd = rng.uniform(0.5, 1.5, d)
    phi_true = float(np.sum(sd ** 2) / np.sum(G ** 2))
    est = noise.NoiseScale(base_batch=sum(sizes), smoothing=0.9)
    for _ in range(300):
        sums = _sums(rng, G, sd, sizes)
        total = np.sum(sums, axis=0)
        est.update([float(s @ s) for s in sums], sizes, float(total @ total))
    assert est.count == 300
    assert est.noise_scale == pytest.approx(phi_true, rel=0.2)
    assert est.var == pytest.approx(float(np.sum(sd ** 2)), rel=0.2)
    assert est.sqr == pytest.approx(float(G @ G), rel=0.2)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_noise_scale_of_real_per_sample_gradients(seed):
    """Least squares on a fixed data set, batches drawn with replacement: the true G and
    Sigma are the data set's own, and the estimate from heterogeneous batches finds them."""
    rng = np.random.default_rng(seed)
    N, d = 4000, 30
    X = rng.standard_normal((N, d))
    w_true = rng.standard_normal(d)
    y = X @ w_true + rng.standard_normal(N) * 2.0
    w = w_true + 0.3 * rng.standard_normal(d)          # somewhere along the way
    per_sample = (X @ w - y)[:, None] * X              # gradient of (x.w - y)^2 / 2
    G = per_sample.mean(axis=0)
    V = float(np.sum(per_sample.var(axis=0)))
    phi_true = V / float(G @ G)
    sizes = [6, 18, 54]
    est = noise.NoiseScale(base_batch=26, smoothing=0.99)
    for _ in range(600):
        idx = rng.integers(0, N, sum(sizes))
        parts = np.split(idx, np.cumsum(sizes)[:-1])
        sums = [per_sample[p].sum(axis=0) for p in parts]
        total = per_sample[idx].sum(axis=0)
        est.update([float(s @ s) for s in sums], sizes, float(total @ total))
    assert est.noise_scale == pytest.approx(phi_true, rel=0.2)


def test_fit_line_is_exact_on_expected_values():
    """Feeding the expectations E|s_b|^2 = b^2 S + b V gives S and V back (any split)."""
    S, V = 0.3, 50.0
    sizes = [3, 11, 40]
    B = sum(sizes)
    point = noise.fit_line([b * b * S + b * V for b in sizes], sizes, B * B * S + B * V)
    assert point.sqr == pytest.approx(S) and point.var == pytest.approx(V)
    # without the global point too (the local sizes differ)
    point = noise.fit_line([b * b * S + b * V for b in sizes], sizes)
    assert point.sqr == pytest.approx(S) and point.var == pytest.approx(V)


def test_fit_line_needs_two_batch_sizes():
    assert noise.fit_line([4.0, 4.0], [2, 2]) is None
    assert noise.fit_line([4.0], [2]) is None
    assert noise.fit_line([float("nan"), 1.0], [2, 3]) is None
    est = noise.NoiseScale(8)
    assert est.update([4.0, 4.0], [2, 2]) is None and not est.known
    assert math.isnan(est.noise_scale) and est.gain(64) == 1.0


def test_efficiency_and_gain():
    B0 = 32
    assert noise.gain(100.0, B0, B0) == pytest.approx(1.0)
    for phi in (0.0, 10.0, 1000.0, 1e9):
        for B in (32, 64, 512):
            r = noise.gain(phi, B, B0)
            assert 1.0 - 1e-9 <= r <= B / B0 + 1e-9
            assert float(noise.efficiency(phi, B, B0)) == pytest.approx(r * B0 / B)
    # no noise: a larger batch buys nothing; all noise: every sample counts fully
    assert float(noise.efficiency(0.0, 128, B0)) == pytest.approx(B0 / 128)
    assert float(noise.efficiency(1e12, 128, B0)) == pytest.approx(1.0, rel=1e-6)


def test_goodput_picks_the_batch_that_balances_speed_and_noise():
    # iteration time a + B / v: throughput saturates at v; goodput peaks near sqrt(a v phi)
    a, v, B0 = 0.05, 2000.0, 32
    batches = [32, 64, 128, 256, 512, 1024]
    it = lambda B: a + B / v
    low = noise.best(noise.goodput_rows(batches, it, 20.0, B0)).batch
    high = noise.best(noise.goodput_rows(batches, it, 5000.0, B0)).batch
    assert low < high
    # unknown noise: throughput alone (the largest batch)
    assert noise.best(noise.goodput_rows(batches, it, math.nan, B0)).batch == 1024


def test_state_round_trip():
    est = noise.NoiseScale(16)
    for k in range(noise.NoiseScale.MIN_COUNT):
        est.add(noise.NoisePoint(0.5 + 0.1 * k, 20.0 - k), 16 * (1 + k % 2))
    copy = noise.NoiseScale(16)
    copy.load(est.state())
    assert copy.noise_scale == est.noise_scale and copy.count == noise.NoiseScale.MIN_COUNT
    assert copy.noise_scale_range == est.noise_scale_range


def test_no_estimate_before_it_has_an_error_bar():
    """A first |G|^2 estimate below 0 (seen on a real run) made phi 4e31 with no error bar:
    nothing is estimated until MIN_COUNT points are in, and then phi comes with a range that
    holds the cautious and the point estimates."""
    est = noise.NoiseScale(64)
    points = [(-0.02, 30.0), (0.3, 25.0), (0.2, 35.0), (0.25, 28.0), (0.22, 31.0)]
    for k, (sqr, var) in enumerate(points):
        est.add(noise.NoisePoint(sqr, var), 64)
        if k + 1 < noise.NoiseScale.MIN_COUNT:
            assert math.isnan(est.noise_scale) and math.isnan(est.noise_scale_low)
            assert all(math.isnan(x) for x in est.noise_scale_range)
        else:
            low, high = est.noise_scale_range
            assert 0 < low <= est.noise_scale_low <= est.noise_scale <= high
            assert est.noise_scale < 1e4


def test_cautious_noise_scale_stays_finite_when_the_gradient_is_lost_in_noise():
    """|G|^2 far below tr(Sigma)/B: the smoothed S goes near or below 0 and the point phi
    explodes; the cautious phi stays within what one standard error supports."""
    rng = np.random.default_rng(3)
    d, sizes = 500, [200, 200, 70]
    G = np.full(d, 1e-4)
    sd = np.ones(d)
    est = noise.NoiseScale(base_batch=64)
    lows = []
    for _ in range(200):
        sums = _sums(rng, G, sd, sizes)
        total = np.sum(sums, axis=0)
        est.update([float(s @ s) for s in sums], sizes, float(total @ total))
        lows.append(est.noise_scale_low)
    first = noise.NoiseScale.MIN_COUNT - 1
    assert all(math.isnan(x) for x in lows[:first])          # no error bar yet
    assert all(math.isfinite(x) and x > 0 for x in lows[first:])
    # bounded by V / se(S): the measurements cannot tell |G|^2 from 0 below one stderr
    assert est.noise_scale_low <= est.var / est.sqr_stderr * (1 + 1e-9)
    assert est.noise_scale_low < 1e6 < float(sd @ sd) / float(G @ G)


def test_cautious_noise_scale_is_close_when_the_gradient_is_well_measured():
    rng = np.random.default_rng(4)
    d, sizes = 1000, [8, 24, 96]
    G = rng.standard_normal(d) * 0.05
    sd = rng.uniform(0.5, 1.5, d)
    est = noise.NoiseScale(base_batch=128)
    for _ in range(300):
        sums = _sums(rng, G, sd, sizes)
        total = np.sum(sums, axis=0)
        est.update([float(s @ s) for s in sums], sizes, float(total @ total))
    assert est.noise_scale_low <= est.noise_scale
    assert est.noise_scale_low == pytest.approx(est.noise_scale, rel=0.2)
