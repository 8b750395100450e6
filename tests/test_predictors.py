"""The speed predictors on known dynamics: NARX (with its fallbacks), the first NARX
(narx-adam) and the AR(p) baseline.

Seeded synthetic series; no processes. The coordinator's contract is checked too: one
``observe`` + ``predict`` per iteration for all workers at once (vectorised). NARX's recursive
least squares is checked against np.linalg.lstsq.
"""
import sys
from pathlib import Path

import json

import numpy as np
import pytest

from mxlbbsp import predictors
from mxlbbsp.predictors import narx, narx_adam

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import predictors as bench  # noqa: E402  (benchmarks/predictors.py: the trace generators)


def replay(name, speed, exog, **options):
    """One-step-ahead forecasts of a (T, n) speed series; row 0 has none (NaN)."""
    T, n = speed.shape
    p = predictors.create(name, n, exog.shape[2], **options)
    out = np.full((T, n), np.nan)
    for t in range(T - 1):
        p.observe(speed[t], exog[t])
        out[t + 1] = p.predict()
    return out, p


def rmse(y, f):
    return float(np.sqrt(np.mean((y - f) ** 2)))


def arx_series(seed, T=1500, sigma=1.0):
    """y(t+1) = 100 + 0.5 (y(t) - 100) - 0.8 (cpu(t) - 50) + e,  e ~ N(0, sigma^2)."""
    rng = np.random.default_rng(seed)
    cpu = 50 + 10 * rng.standard_normal(T)
    mem = 40 + rng.standard_normal(T)
    y = np.empty(T)
    y[0] = 100.0
    for t in range(T - 1):
        y[t + 1] = 100 + 0.5 * (y[t] - 100) - 0.8 * (cpu[t] - 50) + sigma * rng.standard_normal()
    return y[:, None], np.stack([cpu, mem], axis=1)[:, None, :]


def test_all_registered():
    assert {"narx", "ar", "last", "ema"} <= set(predictors.available())


def test_narx_learns_a_linear_arx_system_to_its_noise_floor():
    sigma = 1.0
    y, x = arx_series(seed=3, sigma=sigma)
    f_narx, p = replay("narx", y, x)
    f_last, _ = replay("last", y, x)
    tail = slice(-500, None)
    # the best possible one-step forecast has RMSE sigma; last-value is ~8.6 sigma here
    assert rmse(y[tail], f_last[tail]) > 5 * sigma
    assert rmse(y[tail], f_narx[tail]) < 1.25 * sigma
    assert p.fallbacks.sum() == 0


def test_narx_warmup_forecasts_the_last_value():
    rng = np.random.default_rng(0)
    p = predictors.create("narx", 3, 2)
    for t in range(narx.WARMUP):
        speed = rng.uniform(50, 150, 3)
        p.observe(speed, rng.uniform(0, 100, (3, 2)))
        np.testing.assert_array_equal(p.predict(), speed)
    assert p.fallbacks.sum() == 0


def test_narx_adam_absurd_forecast_falls_back_and_is_counted():
    y, x = arx_series(seed=1, T=200)
    y = np.repeat(y, 2, axis=1)
    x = np.repeat(x, 2, axis=1)
    p = predictors.create("narx-adam", 2, 2)
    for t in range(100):
        p.observe(y[t], x[t])
    assert p.fallbacks.sum() == 0
    # Fault injection: worker 1's output bias becomes huge, so its network forecasts a speed
    # millions of times its recent range. It must get its last value instead, and a count.
    p._theta[1, p._slices[3]] = 1e9
    p.observe(y[100], x[100])
    forecast = p.predict()
    assert forecast[1] == y[100, 1]
    assert p.fallbacks.tolist() == [0, 1]
    assert 0.5 * y[:101, 0].min() < forecast[0] < 2 * y[:101, 0].max()


def test_narx_absurd_forecast_falls_back_and_is_counted():
    y, x = arx_series(seed=1, T=200)
    y = np.repeat(y, 2, axis=1)
    x = np.repeat(x, 2, axis=1)
    p = predictors.create("narx", 2, 2)
    for t in range(100):
        p.observe(y[t], x[t])
        p.learn()
    assert p.fallbacks.sum() == 0
    # Fault injection: worker 1's output bias becomes huge (a forecast of e^(1e8) times its
    # speed): its network's forecast is replaced by the last value, and counted.
    p._theta[1, 0] = 1e9
    p.observe(y[100], x[100])
    forecast = p.predict()
    assert p.fallbacks.tolist() == [0, 1]
    assert p._cand[1, 0] == y[100, 1]
    for i in (0, 1):
        assert 0.5 * y[:101, i].min() < forecast[i] < 2 * y[:101, i].max()


def test_narx_adam_non_finite_numbers_fall_back_and_are_counted():
    # Speeds at the edge of float64: the running statistics overflow, every forecast of the
    # network is NaN or inf, and the predictor must keep answering the last speed.
    p = predictors.create("narx-adam", 1, 2)
    speeds = [1e300 if t % 2 else 1e-300 for t in range(narx_adam.WARMUP + 10)]
    for s in speeds:
        p.observe([s], [[50.0, 40.0]])
        assert p.predict()[0] == s
    assert p.fallbacks[0] >= 9


def test_narx_non_finite_numbers_give_finite_forecasts():
    # Speeds at the edge of float64 (log-ratios of +-1380): every forecast stays finite,
    # positive and within the speeds seen, and the fit stays finite.
    p = predictors.create("narx", 1, 2)
    speeds = [1e300 if t % 2 else 1e-300 for t in range(narx.WARMUP + 30)]
    for s in speeds:
        p.observe([s], [[50.0, 40.0]])
        f = p.predict()[0]
        assert np.isfinite(f) and 1e-300 <= f <= 1e300
    assert np.isfinite(p._theta).all()


def test_narx_missing_exogenous_values_are_carried_forward():
    y, x = arx_series(seed=2, T=300)
    x = x.copy()
    x[::3, 0, 0] = np.nan          # psutil gave nothing: None -> NaN
    x[:, 0, 1] = np.nan            # this column is never measured
    f, p = replay("narx", y, x)
    assert np.isfinite(f[1:]).all()
    assert p.fallbacks.sum() == 0
    # a third of the cpu readings is stale, so ~0.64 of last-value's error is the best here
    assert rmse(y[-100:], f[-100:]) < 0.8 * rmse(y[-100:], y[-101:-1])


def test_narx_vectorised_equals_separate_predictors():
    rng = np.random.default_rng(7)
    series = [arx_series(seed=s, T=150) for s in (11, 12, 13)]
    y = np.concatenate([s[0] * (1 + k) for k, s in enumerate(series)], axis=1)   # (T, 3)
    x = np.concatenate([s[1] for s in series], axis=1)                           # (T, 3, 2)
    x[:, 2] += rng.normal(0, 5, (150, 2))
    together, _ = replay("narx", y, x)
    for i in range(3):
        alone, _ = replay("narx", y[:, i:i + 1], x[:, i:i + 1])
        np.testing.assert_allclose(together[:, i], alone[:, 0], rtol=1e-9)


def test_narx_workers_are_independent():
    y, x = arx_series(seed=5, T=150)
    y2 = np.concatenate([y, y], axis=1)
    x2 = np.concatenate([x, x], axis=1)
    base, _ = replay("narx", y2, x2)
    y2[60:, 0] *= 3.0               # worker 0 changes completely; worker 1 must not notice
    x2[60:, 0, 0] = 0.0
    changed, _ = replay("narx", y2, x2)
    np.testing.assert_array_equal(changed[:, 1], base[:, 1])
    assert not np.allclose(changed[70:, 0], base[70:, 0])


@pytest.mark.parametrize("name", ["narx", "narx-adam"])
def test_narx_checks_the_number_of_exogenous_columns(name):
    p = predictors.create(name, 2, 3)
    with pytest.raises(ValueError, match="exogenous"):
        p.observe([1.0, 2.0], [[1.0, 2.0], [3.0, 4.0]])


def test_ar_learns_an_ar2_process():
    # y(t) = 40 + 1.2 y(t-1) - 0.6 y(t-2) + e: mean 100, oscillating; sigma = 2
    rng = np.random.default_rng(4)
    T, sigma = 2000, 2.0
    y = np.full(T, 100.0)
    for t in range(2, T):
        y[t] = 40 + 1.2 * y[t - 1] - 0.6 * y[t - 2] + sigma * rng.standard_normal()
    x = np.zeros((T, 1, 2))
    f_ar, p = replay("ar", y[:, None], x)
    tail = slice(-1000, None)
    assert rmse(y[tail, None], f_ar[tail]) < 1.1 * sigma
    assert rmse(y[tail], y[-1001:-1]) > 1.3 * sigma           # last value is clearly worse
    assert p.fallbacks.sum() == 0


def test_ar_warmup_and_vectorised():
    rng = np.random.default_rng(9)
    y = rng.uniform(50, 150, (60, 2))
    x = np.zeros((60, 2, 2))
    f, _ = replay("ar", y, x)
    np.testing.assert_array_equal(f[1:11], y[:10])          # warm-up: last value
    alone, _ = replay("ar", y[:, 1:], x[:, 1:])
    np.testing.assert_allclose(f[:, 1], alone[:, 0], rtol=1e-9)


def test_narx_forecasts_do_not_depend_on_when_learn_is_called():
    """The coordinator trains after it has sent the allocation; trace replay never calls
    learn(): both must see the same forecasts."""
    rng = np.random.default_rng(3)
    speeds = 100 + 10 * rng.standard_normal((80, 3))
    exog = rng.uniform(0, 100, (80, 3, 2))
    eager, lazy = predictors.create("narx", 3), predictors.create("narx", 3)
    for y, x in zip(speeds, exog):
        eager.observe(y, x)
        eager.learn()
        lazy.observe(y, x)
        np.testing.assert_allclose(eager.predict(), lazy.predict(), rtol=1e-12)
    assert eager._count > eager.warmup    # the network, not the warm-up, made the forecasts


def test_narx_rls_is_the_least_squares_fit():
    """With lam = 1 and no error clipping, RLS's theta after k pairs is the ridge solution
    (Phi'Phi + I / delta)^-1 Phi' r over those k pairs: checked against np.linalg.lstsq on
    the augmented system [Phi; I / sqrt(delta)] theta = [r; 0]."""
    y, x = arx_series(seed=8, T=120)
    delta = 50.0
    p = predictors.create("narx", 1, 2, lam=1.0, delta=delta, clip_err=1e300)
    phis, ly = [], np.log(y[:, 0])
    for t in range(len(y)):
        p.observe(y[t], x[t])
        p.learn()
        phis.append(p._phi[0].copy())
    Phi = np.array(phis[:-1])                               # phi_t pairs with r_{t+1}
    r = (ly[1:] - ly[:-1]) / narx.SCALE
    F = Phi.shape[1]
    A = np.vstack([Phi, np.eye(F) / np.sqrt(delta)])
    b = np.concatenate([r, np.zeros(F)])
    expected, *_ = np.linalg.lstsq(A, b, rcond=None)
    np.testing.assert_allclose(p._theta[0], expected, rtol=1e-6, atol=1e-8)


def test_narx_learns_a_load_speed_curve_in_tens_of_iterations():
    """Load switches among 3 levels; the reading shows the next iteration's load; speed is a
    convex function of it with 3 % noise. From iteration 60 on, NARX must be far better than
    the last value (which misses every switch) and than the first, slowly trained NARX."""
    rows, _ = bench.family(seed=7, T=160, ranks=1)
    y = np.array([[r[2]] for r in rows])
    x = np.array([[r[3:]] for r in rows])
    window = slice(60, 160)

    def mape(name):
        f, _ = replay(name, y, x)
        return float(np.mean(np.abs(f[window] - y[window]) / y[window]))
    assert mape("narx") <= 0.6 * mape("last")
    assert mape("narx") < 0.8 * mape("narx-adam")


def test_narx_reaches_the_noise_floor_from_the_start():
    """Over a trace's first 120 iterations (its learning included), on 5 seeds of the
    benchmark's base family (3 load levels, the reading one iteration ahead, convex curve, 3 %
    noise): NARX's MAPE is at most half the best of last, EMA and AR, and within 2x of the
    oracle that knows the curve, the base speed and the loads (the first NARX, kernel units
    over normalised readings, was at 0.73x and 3.5x)."""
    to_best, to_oracle = [], []
    for seed in range(5):
        rows, oracle = bench.family(seed, T=120, ranks=1)
        y = np.array([[r[2]] for r in rows])
        x = np.array([[r[3:]] for r in rows])

        def mape(name):
            f, _ = replay(name, y, x)
            return 100 * float(np.mean(np.abs(f[1:] - y[1:]) / y[1:]))
        m = mape("narx")
        to_best.append(m / min(mape(b) for b in ("last", "ema", "ar")))
        to_oracle.append(m / oracle)
    assert np.mean(to_best) <= 0.5, to_best
    assert np.mean(to_oracle) <= 2.0, to_oracle


def test_narx_state_dict_round_trip_continues_the_same_forecasts():
    """A checkpoint (state_dict through JSON) taken after learn() restores a NARX that goes
    on forecasting exactly as the original: kernel memory, its sums, the gate, RLS."""
    import json
    rows, _ = bench.family(seed=5, T=120, ranks=1)
    y = np.array([[r[2]] for r in rows])
    x = np.array([[r[3:]] for r in rows])
    a = predictors.create("narx", 1, 2)
    for t in range(70):
        a.observe(y[t], x[t])
        a.learn()
    b = predictors.create("narx", 1, 2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for t in range(70, 120):
        a.observe(y[t], x[t])
        b.observe(y[t], x[t])
        np.testing.assert_allclose(b.predict(), a.predict(), rtol=1e-12)
        a.learn()
        b.learn()


def test_family_marks_the_first_step_at_each_new_load_level():
    """benchmarks/predictors.py's "levels seen before" column leaves out the steps whose load
    level the trace had not shown yet: with 3 levels there are at most 2 per rank, and at
    each the reading is far from every earlier one (levels 35 apart, reading noise sd 3)."""
    first = []
    rows, oracle = bench.family(seed=3, T=200, ranks=1, first=first)
    errs, new, floor = first[0]
    assert len(errs) == len(new) == len(floor) == 199
    assert 100 * errs.mean() == pytest.approx(oracle)
    assert 1 <= new.sum() <= 2
    cpu = np.array([r[3] for r in rows])
    for t in np.flatnonzero(new):
        assert t == 0 or np.min(np.abs(cpu[t] - cpu[:t])) > 20
    # the curve-free floor differs from the oracle only at the load's first switch, the
    # first new level, where it repeats the last speed
    speed = np.array([r[2] for r in rows])
    blind = np.flatnonzero(floor != errs)
    assert list(blind) == [np.flatnonzero(new)[0]]
    t = blind[0]
    assert floor[t] == pytest.approx(abs(speed[t + 1] - speed[t]) / speed[t + 1])
    assert floor[t] > 0.2      # the load moved by a level: far beyond the 3 % noise


def test_narx_fast_helpers_compute_what_numpy_does():
    """NARX's _median and _clip (numpy without its Python-level overhead, on the
    coordinator's critical path) give np.median's and np.clip's numbers, NaN included."""
    from mxlbbsp.predictors import narx
    rng = np.random.default_rng(0)
    for k in (1, 2, 7, 32):
        x = rng.normal(size=(3, 4, k))
        assert np.array_equal(narx._median(x), np.median(x, axis=-1))
    x = np.array([[np.nan, -5.0, 0.3, 9.0]])
    assert np.array_equal(narx._clip(x, -4.0, 4.0), np.clip(x, -4.0, 4.0), equal_nan=True)
    lo, hi = np.array([[-1.0, 0.0, 0.0, 10.0]]), np.array([[1.0, np.inf, 0.1, 11.0]])
    assert np.array_equal(narx._clip(x, lo, hi), np.clip(x, lo, hi), equal_nan=True)


def test_narx_sorted_window_is_np_sort_of_the_ring_ties_included():
    """The ring of |changes| kept sorted one step at a time (narx._slide: the median of the
    window in two reads, on the critical path) is np.sort of the ring after every step,
    as it grows and once it turns, with ties (zeros repeat) and a value equal to the one
    leaving."""
    from mxlbbsp.predictors import narx
    rng = np.random.default_rng(0)
    rows, W = 50, 8
    ring, window = np.zeros((rows, W)), np.zeros((rows, 0))
    for step in range(40):
        new = np.abs(rng.normal(size=rows)) * (rng.random(rows) < 0.6)
        if step % 5 == 0:
            new[:10] = ring[:10, step % W]          # the same value in as goes out
        old = ring[:, step % W].copy() if step >= W else None
        ring[:, step % W] = new
        window = narx._slide(window, new, old)
        assert np.array_equal(window, np.sort(ring[:, :min(step + 1, W)], axis=1)), step


@pytest.mark.parametrize("kernel", ["biweight", "gauss"])
def test_narx_forecasts_do_not_depend_on_its_work_arrays(kernel):
    """The sorted window and the work arrays are caches: a NARX restored from a state (none
    of them) forecasts what the one that kept them does, bit for bit; and so does one whose
    memory holds a bad pair (a NaN speed: the masked paths)."""
    rng = np.random.default_rng(5)
    a = predictors.create("narx", 6, 3, kernel=kernel)
    b = None
    for t in range(300):
        speed = rng.uniform(50, 60, 6)
        if t % 40 == 7:
            speed[2] = np.nan
        exog = rng.normal(size=(6, 3))
        a.observe(speed, exog)
        if b is not None:
            b.observe(speed, exog)
            assert np.array_equal(a.predict(), b.predict()), t
            b.learn()
        a.learn()
        if t == 120:                       # a checkpoint, as the coordinator takes it
            b = predictors.create("narx", 6, 3, kernel=kernel)
            b.load_state_dict(json.loads(json.dumps(a.state_dict())))


def test_narx_refuses_a_state_of_the_older_memory_layout():
    """A NARX state saved before the memory became (n, inputs, M) has the same sizes but
    another order: loading it must fail (the coordinator then learns afresh), not scramble
    the kernel units' memory."""
    import json
    a = predictors.create("narx", 2, 3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a.observe(100 + rng.normal(0, 5, 2), rng.normal(50, 5, (2, 3)))
        a.learn()
    state = json.loads(json.dumps(a.state_dict()))
    old = dict(state)
    old["_mem_u"] = old.pop("_mem_in")
    with pytest.raises(ValueError, match="older"):
        predictors.create("narx", 2, 3).load_state_dict(old)
    predictors.create("narx", 2, 3).load_state_dict(state)    # today's loads
    assert "_scratch" not in state and "d" not in state       # work arrays are not state


@pytest.mark.parametrize("name", [p for p in predictors.available()
                                  if predictors.predictor_class(p).separable])
def test_a_separable_predictor_over_some_workers_forecasts_what_one_over_all_does(name):
    """What lets a host's relay forecast its own workers: the predictor over each third of
    the workers gives, bit for bit, the forecasts of one over all of them (bad speeds and
    missing load readings included), its parts' states join into the whole one's, and the
    whole one's state cut by workers goes on the same."""
    rng = np.random.default_rng(1)
    n, E, T = 12, 2, 240
    speeds = 100 * np.exp(np.cumsum(rng.normal(0, 0.05, (T, n)), axis=0))
    speeds[50, 2] = np.nan
    speeds[90, 7] = -1.0
    exog = rng.uniform(0, 100, (T, n, E))
    exog[::7, 3] = np.nan
    exog[100:140, :6, 0] += 60 * (np.arange(40) % 13 < 6)[:, None]   # load switches
    whole = predictors.create(name, n, E)
    parts = [np.arange(i, n, 3) for i in range(3)]
    pieces = [predictors.create(name, len(p), E) for p in parts]
    for t in range(T):
        whole.observe(speeds[t], exog[t])
        forecast = np.empty(n)
        for index, piece in zip(parts, pieces):
            piece.observe(speeds[t][index], exog[t][index])
            forecast[index] = piece.predict()
        np.testing.assert_array_equal(forecast, whole.predict(), err_msg=f"iteration {t}")
        whole.learn()
        for piece in pieces:
            piece.learn()
        if t == 150:
            state = whole.state_dict()
            joined = predictors.join_states(name, E, n, [(index, piece.state_dict())
                                                         for index, piece in zip(parts, pieces)])
            assert json.dumps(joined, sort_keys=True) == json.dumps(state, sort_keys=True)
            pieces = [predictors.create(name, len(p), E) for p in parts]
            for index, piece in zip(parts, pieces):
                piece.load_state_dict(predictors.state_of_workers(name, E, state, index))
    assert np.array_equal(np.concatenate([p.fallbacks for p in pieces])[np.argsort(
        np.concatenate(parts))], whole.fallbacks)


def test_joined_states_must_cover_every_worker_once():
    one = predictors.create("narx", 2, 2).state_dict()
    with pytest.raises(ValueError, match="every worker once"):
        predictors.join_states("narx", 2, 4, [([0, 1], one), ([1, 2], one)])
