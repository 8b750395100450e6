"""Goodput's learning rate: AdaScale's gain from the coordinator's noise scale, sent with the
split, recorded, and replayed (``--lr-scaling adascale``); and the throughput model's parts
(the push/pull time of an iteration, the workers' fixed costs). No processes: an in-process
coordinator with real sessions over loopback TCP."""
import json
import math

import numpy as np
import pytest

from mxlbbsp.core import lr as _lr
from mxlbbsp.core import noise
from mxlbbsp.core import timemodel as _tm
from mxlbbsp.modes import goodput
from mxlbbsp.modes.lbbsp import BatchChoosingPolicy
from mxlbbsp.worker.session import Session

from conftest import in_threads
from test_coordinator import TOKEN, coordinator, env_for, finished_records  # noqa: F401


def test_adascale_gain_is_pollux_and_adascale_s():
    """r(B) = (V/B0 + S) / (V/B + S) (AdaScale's r with sigma^2 = V/B0, mu^2 = S): 1 at B0,
    B/B0 when the noise dominates, 1 without noise; Pollux's efficiency is r / (B/B0)."""
    S, V, B0 = 0.2, 40.0, 32
    phi = V / S
    for B in (8, 32, 100, 512):
        r = _lr.adascale(phi, B, B0)
        assert r == pytest.approx((V / B0 + S) / (V / B + S))
        assert r == pytest.approx(noise.gain(phi, B, B0))
        assert float(noise.efficiency(phi, B, B0)) == pytest.approx(r * B0 / B)
        lo, hi = sorted((1.0, B / B0))
        assert lo - 1e-12 <= r <= hi + 1e-12
    assert _lr.adascale(phi, B0, B0) == 1.0
    assert _lr.adascale(1e15, 128, B0) == pytest.approx(4.0)
    assert _lr.adascale(0.0, 128, B0) == 1.0
    # unknown noise scale: sqrt, the same on the coordinator and on a worker by itself
    assert _lr.adascale(None, 128, B0) == _lr.adascale(math.nan, 128, B0) == 2.0
    assert _lr.factor("adascale", 4.0) == 2.0 == _lr.factor("sqrt", 4.0)


def test_adascale_is_goodput_s_only():
    assert _lr.rule_problem("adascale", "goodput") is None
    assert _lr.rule_problem("adascale") is None
    problem = _lr.rule_problem("adascale", "courier")
    assert "only --sync goodput" in problem and "\n" not in problem
    from mxlbbsp.modes import courier
    assert "only --sync goodput" in courier.Courier.check_options(
        {"deadline": "5m", "epochs": 2, "lr_scaling": "adascale"})
    assert goodput.Goodput.check_options({"lr_scaling": "adascale"}) is None
    assert goodput.DEFAULTS["lr_scaling"] == "adascale"


def test_with_fixed_costs_keeps_the_time_at_the_current_batch():
    model = _tm.TimeModel.linear([1000.0, 250.0])           # 48 and 16 samples: 48, 64 ms
    sizes = [48, 16]
    out = goodput.with_fixed_costs(model, np.array([0.012, 0.9]), sizes)
    assert out.time(sizes) == pytest.approx(model.time(sizes))
    assert out.intercept[0] == pytest.approx(0.012)
    assert out.intercept[1] == pytest.approx(0.8 * 0.064)    # at most 80 % of the time
    # a larger batch costs less than in proportion
    assert out.time([96, 32])[0] == pytest.approx(0.012 + 96 * 0.036 / 48)
    # a model with its own fixed costs keeps them
    affine = _tm.TimeModel(np.array([1000.0, 250.0]), np.array([0.005, 0.0]))
    kept = goodput.with_fixed_costs(affine, np.array([0.02, 0.01]), sizes)
    assert kept.intercept[0] == 0.005 and kept.speed[0] == pytest.approx(1000.0)
    assert kept.intercept[1] == pytest.approx(0.01)
    # no fit yet (NaN): the split's model
    same = goodput.with_fixed_costs(model, np.array([np.nan, np.nan]), sizes)
    assert same.intercept.tolist() == [0.0, 0.0]


class _Control:
    """The coordinator as a policy sees it, recording what the policy sends."""

    class config:
        num_workers, warmup, sync = 3, 1, "goodput"

    def __init__(self):
        self.sent, self.failure = [], None

    def send(self, rank, msg):
        self.sent.append((rank, msg))

    def broadcast(self, msg):
        self.sent.extend((rank, msg) for rank in range(self.config.num_workers))


def test_the_push_pull_time_is_the_least_any_worker_measured():
    """A worker that waited for another (rank 0 evaluating, untimed, between iterations)
    measures the wait as push/pull; the last to push measures the push/pull alone."""
    policy = BatchChoosingPolicy(_Control())
    for t, syncs in ((1, [0.5, 0.02, 0.4]), (2, [0.02, 0.6, 0.5]), (3, [0.3, 0.02, None])):
        for rank, s in enumerate(syncs):
            policy.on_done(rank, {"iteration": t, "sync_s": s})
    assert policy.sync_s == pytest.approx(0.02)
    policy.on_done(0, {"iteration": 0, "sync_s": 0.001})      # warm-up: not counted
    assert policy.sync_s == pytest.approx(0.02)


def _sessions(c, n, B, N, rule):
    out, errors = in_threads(lambda r: Session(
        B, N, B, None, env=dict(env_for(c, r, n, "goodput"), MXLBBSP_LR_SCALING=rule)), n)
    assert not errors
    return out


def test_adascale_factor_comes_with_the_split_and_is_recorded(coordinator):
    """Every worker applies the factor the coordinator computed from its noise scale for
    that iteration's B, and the metrics record it beside that noise scale."""
    n, B0, N = 3, 40, 100000
    c = coordinator(n, sync="goodput", predictor="last",
                    sync_options={"batch_range": "6:30", "lr_scaling": "adascale"})
    ss = _sessions(c, n, B0, N, "adascale")
    for s in ss:
        s.announce(N)
    rng = np.random.default_rng(0)
    d = 300
    G, sd = rng.standard_normal(d) * 0.05, rng.uniform(0.5, 1.5, d)
    used = []
    for _ in range(25):
        sizes = [s.next_iteration(None)[2] for s in ss]
        factors = {s.lr_factor() for s in ss}
        assert len(factors) == 1                              # the same on every worker
        used.append((ss[0].iteration, ss[0].batch_global, factors.pop()))
        sums = [b * G + math.sqrt(b) * sd * rng.standard_normal(d) for b in sizes]
        for s, part, local in zip(ss, sums, sizes):
            s._t_end -= 0.001 * local
            s.gradients_ready(float(part @ part))
        total = np.sum(sums, axis=0)
        ss[0].step_done(float(total @ total))
        for s in ss[1:]:
            s.step_done()
    for s in ss:
        s.close()
    rows = {r["iteration"]: r for r in finished_records(c) if r["rank"] == 0}
    assert used[0][1] == 30 and used[0][2] == pytest.approx(math.sqrt(30 / B0))
    known = 0
    for t, B, f in used:
        rec = rows[t]
        assert rec["global_batch"] == B and rec["lr_factor"] == f
        phi = rec["noise_scale"]
        assert f == _lr.adascale(phi, B, B0)                 # exactly the coordinator's
        known += phi is not None
    assert known >= 15
    assert any(f != pytest.approx(math.sqrt(B / B0)) for _, B, f in used)


def _records(path, factors, batches):
    with open(path, "w") as fh:
        for t, (f, b) in enumerate(zip(factors, batches)):
            for rank in range(2):
                fh.write(json.dumps({
                    "iteration": t, "rank": rank, "batch_size": b // 2, "compute_s": 0.01,
                    "wait_s": 0.0, "sync_s": 0.001, "speed": 100.0, "predicted_speed": None,
                    "cpu_percent": None, "mem_percent": None, "sync": "goodput",
                    "time": 1.0 + t, "global_batch": b, "lr_factor": f}) + "\n")


def test_a_replay_applies_the_recorded_factors(tmp_path, monkeypatch):
    from mxnet import gluon, nd

    import mxlbbsp
    from mxlbbsp.worker import session

    monkeypatch.delenv("MXLBBSP_COORDINATOR", raising=False)
    monkeypatch.setenv("MXLBBSP_LR_SCALING", "linear")      # the recorded factors win
    session.close_session()
    N = 60
    ds = gluon.data.ArrayDataset(nd.array(np.arange(N).reshape(N, 1)), nd.array(np.arange(N)))
    factors, batches = [1.0, 0.8123456789012345, 1.25, 0.5], [20, 10, 24, 6]
    path = tmp_path / "m.jsonl"
    _records(path, factors, batches)
    loader = mxlbbsp.DataLoader(ds, global_batch_size=16, batch_schedule=str(path))
    seen = []
    try:
        for data, _ in loader:
            seen.append((len(data), session.current().lr_factor()))
    finally:
        session.close_session()
    assert seen == list(zip(batches, factors))
    # adascale without the job's record: refused (the worker could not know the factors)
    monkeypatch.setenv("MXLBBSP_LR_SCALING", "adascale")
    with pytest.raises(ValueError, match="metrics file"):
        mxlbbsp.DataLoader(ds, global_batch_size=16, batch_schedule=batches)
    session.close_session()


class _Balancer:
    min_batch, max_batch = 8, None


def test_the_global_batch_leaves_every_worker_its_least_batch():
    """BatchNorm models get 8 samples per worker at least: B and an epoch's rest keep to it
    (seen: a rest of 10 on 2 workers stopped a ResNet-20 job), and the planner does not
    consider a smaller B."""
    control = _Control()
    control.balancer = _Balancer()
    policy = BatchChoosingPolicy(control)
    assert policy.least == 24
    assert policy._cap(16, None) == 24                  # the planner's 16: too small
    assert policy._cap(91, 101) == 101                  # a rest of 10 joins this batch
    assert policy._cap(91, 200) == 91 and policy._cap(300, 200) == 200
    fn = goodput.iteration_model("hetero", _tm.TimeModel.linear([1000.0] * 3), 0.01,
                                 least=policy.least)
    assert math.isinf(fn(16)) and math.isfinite(fn(24))
    p = goodput.GoodputPlanner(16, 256, 64)
    assert p.update(fn, 1.0, force=True) >= 24          # tiny noise scale: the least B


def test_fixed_cost_fit_is_robust_and_waits_for_varied_batches():
    rng = np.random.default_rng(5)
    fit = _tm.FixedCostFit(2, window=64, every=1)
    a, c = np.array([0.010, 0.030]), np.array([0.0005, 0.0015])     # the slow one 3x
    for k in range(64):                                             # one batch: nothing
        b = np.array([48.0, 16.0])
        fit.observe(b, a + c * b + rng.normal(0, 0.001, 2))
    assert fit.intercept.tolist() == [0.0, 0.0]
    assert not fit.known.any()                    # 0 is only the default, not a fit
    for k in range(64):                                             # B moved, a tenant
        b = np.array([48.0, 16.0]) * (1 if k % 3 else 0.6)
        t = a + c * b + rng.normal(0, 0.001, 2)
        if k % 17 == 0:
            t = t * 4                                               # passing slow iterations
        fit.observe(b, t)
    assert fit.intercept == pytest.approx(a, rel=0.25)
    assert fit.known.all()


def test_fixed_cost_fit_knows_a_cost_as_soon_as_the_batches_vary():
    """Between its scheduled refits (every 16) the fit still looks at every observation
    while a cost is not known: known 8 observations into batches that vary."""
    fit = _tm.FixedCostFit(2, window=64, every=16)
    a, c = np.array([0.010, 0.030]), np.array([0.0005, 0.0015])
    for k in range(5):
        fit.observe(np.array([48.0, 16.0]), a + c * np.array([48.0, 16.0]))
    for k in range(8):
        b = np.array([48.0, 16.0]) * (0.8 if k % 2 else 1.2)
        fit.observe(b, a + c * b)
        if fit.known.all():
            break
    assert fit.known.all() and 5 + k + 1 < 16
    assert fit.intercept == pytest.approx(a, rel=1e-6)


def test_fixed_cost_fit_refits_many_workers_a_group_at_a_time():
    """At 320 workers one observation refits at most ``rows`` known workers (a group in
    turn) and ``rows`` not known yet; every worker still gets its cost, and a cost that
    changes later is seen by every worker within one turn of the groups."""
    n, rows = 320, 32
    rng = np.random.default_rng(3)
    fit = _tm.FixedCostFit(n, window=32, every=4, rows=rows)
    a, c = rng.uniform(0.005, 0.02, n), rng.uniform(0.0005, 0.002, n)

    def observe(a):
        b = rng.integers(20, 40, n).astype(float)
        before = fit.intercept.copy()
        fit.observe(b, a + c * b)
        return int(np.count_nonzero(fit.intercept != before))

    changed = [observe(a) for _ in range(40)]
    assert max(changed) <= 2 * rows < n
    assert fit.known.all() and fit.intercept == pytest.approx(a, rel=1e-6)
    a2 = a * 2                                          # every cost doubles
    for _ in range(fit.window):                         # the window forgets the old ones
        changed.append(observe(a2))
    changed = [observe(a2) for _ in range(10)]          # one turn: 10 groups of 32
    assert max(changed) <= rows
    assert fit.intercept == pytest.approx(a2, rel=1e-6)
