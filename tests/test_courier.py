"""Courier's planning (mxlbbsp.core.planner) and `mxlbbsp plan`: no processes, milliseconds."""
import json
import os
import math
import time

import numpy as np
import pytest


from mxlbbsp.core.timemodel import TimeModel
from mxlbbsp.launcher.cli import main
from mxlbbsp.analysis import profile as _profile
from mxlbbsp import modes as _modes
from mxlbbsp.core import lr as _lr
from mxlbbsp.core import planner as _planner
from mxlbbsp.worker import session as _session_module


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("15m", 900), ("1h30m", 5400),
                                          ("2.5h", 9000), ("1d", 86400), (" 10 m ", 600)])
def test_durations(text, seconds):
    assert _planner.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["15", "-5m", "0s", "m", "5x", "1h junk", "", "nan"])
def test_bad_durations(text):
    with pytest.raises(_planner.PlanError) as err:
        _planner.parse_duration(text)
    assert "\n" not in str(err.value) and "--deadline" in str(err.value)


def test_batch_ranges():
    assert _planner.parse_batch_range("64:1024") == (64, 1024)
    assert _planner.parse_batch_range("8:8", num_workers=4) == (8, 8)
    for bad in ("1024:64", "0:10", "64", "a:b", "64:"):
        with pytest.raises(_planner.PlanError):
            _planner.parse_batch_range(bad)
    with pytest.raises(_planner.PlanError, match="below the number of workers"):
        _planner.parse_batch_range("2:64", num_workers=4)


def test_candidates_cover_the_range_geometrically():
    c = _planner.candidates(64, 1024)
    assert c[0] == 64 and c[-1] == 1024
    assert np.all(np.diff(c) > 0)
    assert {64, 128, 256, 512, 1024} <= set(c.tolist())     # Courier's own grid is in it
    assert _planner.candidates(100, 100).tolist() == [100]


def _model(speeds, fixed=0.01):
    speeds = np.asarray(speeds, dtype=float)
    return TimeModel(speeds, np.full_like(speeds, fixed))


def test_plan_is_the_lbbsp_makespan_plus_sync():
    model = _model([100.0, 300.0], fixed=0.0)
    work = _planner.Work(0, 1000, 1)
    (row,) = _planner.plan(model, 0.05, work, [400])
    # 400 samples split 100:300 -> each 1.0 s; plus 0.05 s push/pull; ceil(1000/400) = 3
    assert row.iteration_s == pytest.approx(1.05)
    # 1000 = 2 x 400 + 200: the short last batch, 200 split 50:150, takes 0.5 + 0.05 s
    assert row.finish_s == pytest.approx(2 * 1.05 + 0.55)


def _iterate(work, B, n):
    """The global batches of ``work`` at B, one by one, as the courier mode cuts them."""
    sizes = []
    for samples, times in ((work.in_epoch, 1), (work.epoch_size, int(work.epochs))):
        for _ in range(times):
            left = samples
            while left > 0:
                b = min(B, left)
                if 0 < left - b < n:
                    b = left                       # a rest below n joins this batch
                sizes.append(b)
                left -= b
    return sizes


@pytest.mark.parametrize("fixed, sync", [(0.0, 0.0), (0.02, 0.01), (0.2, 0.05)])
def test_predicted_time_is_the_sum_of_its_iterations_short_last_batch_included(fixed, sync):
    """The issue's case: 1437 samples, 20 epochs, 64:1024; the predicted time equals the sum
    of the predicted times of the iterations one by one, each at its own size."""
    model = _model([300.0, 300.0, 100.0, 300.0], fixed=fixed)
    work = _planner.Work(500, 1437, 20)
    rows = _planner.plan(model, sync, work, _planner.candidates(64, 1024))
    for r in rows:
        its = _iterate(work, r.batch, 4)
        assert sum(its) == 500 + 20 * 1437
        assert work.iterations(r.batch) == len(its)
        expected = sum(_planner.iteration_time(model, sync, b) for b in its)
        assert r.finish_s == pytest.approx(expected, rel=1e-9)
    # a larger batch never takes longer, but for the integer split's rounding (< 3 %): fixed
    # costs are paid by fewer iterations (counting every batch as a full one, the time went
    # up and down with B by 20-40 %)
    finish = [r.finish_s for r in rows]
    assert all(b <= a * 1.03 for a, b in zip(finish, finish[1:]))


def test_smallest_batch_that_meets_the_deadline_else_the_fastest():
    model = _model([500.0, 500.0, 500.0, 500.0], fixed=0.02)
    work = _planner.Work(0, 20000, 2)
    rows = _planner.plan(model, 0.01, work, _planner.candidates(64, 1024))
    finish = {r.batch: r.finish_s for r in rows}
    # with a fixed cost per iteration, bigger batches finish sooner
    assert finish[1024] < finish[64]
    deadline = finish[256] * 1.001
    rows = _planner.plan(model, 0.01, work, _planner.candidates(64, 1024), deadline)
    batch, meets = _planner.choose(rows)
    assert meets and batch <= 256
    assert all(not r.meets for r in rows if r.batch < batch)
    rows = _planner.plan(model, 0.01, work, _planner.candidates(64, 1024), 0.001)
    batch, meets = _planner.choose(rows)
    assert not meets and batch == min(rows, key=lambda r: r.finish_s).batch


def test_work_counts_the_short_last_batch_of_each_epoch():
    work = _planner.Work(in_epoch=100, epoch_size=1000, epochs=2)
    assert work.iterations(64) == math.ceil(100 / 64) + 2 * math.ceil(1000 / 64)
    assert work.samples == 2100


def test_planner_moves_up_when_the_cluster_slows_and_keeps_still_under_noise():
    rng = np.random.default_rng(0)
    n, epoch = 4, 50000
    planner = _planner.BatchPlanner(64, 1024, every=5, margin=0.1)
    fast = np.full(n, 2000.0)
    work = _planner.Work(epoch, epoch, 2)
    rows = _planner.plan(_model(fast), 0.01, work, planner.batches)
    # a deadline that B=256 meets comfortably at full speed
    time_left = {r.batch: r.finish_s for r in rows}[256] * 1.3
    b0 = planner.update(_model(fast), 0.01, work, time_left, force=True)
    seen = []
    for _ in range(30):                                 # 3% noise on the speeds
        noisy = fast * (1 + 0.03 * rng.standard_normal(n))
        seen.append(planner.update(_model(noisy), 0.01, work, time_left))
    assert len(set(seen)) == 1 and seen[0] == b0        # no jitter
    slow = fast.copy()
    slow[:2] /= 3                                       # a tenant slows two of four workers 3x
    b1 = planner.update(_model(slow), 0.01, work, time_left)
    assert b1 > b0                                      # at once, not after `every`
    assert not planner.missing
    # the tenant leaves: after `every` iterations the planner comes back down
    back = [planner.update(_model(fast), 0.01, work, time_left) for _ in range(6)]
    assert back[0] == b1 and back[-1] < b1


def simulate_planner(deadline_s, speeds, fixed_s, sync_s, N, epochs, noise, seed,
                     lo=64, hi=1024, planner=None):
    """A courier job in simulation, deterministic: every iteration the planner sees the true
    time models with an error on each worker's predicted speed that persists, as a
    predictor's does (log error x(t) = 0.9 x(t-1) + ``noise`` x N(0, 1)), the iteration takes
    its true time times a lognormal(0.05) stretch, and the planner observes it. Returns
    (finish time, [(epoch, planned B)], planner)."""
    rng = np.random.default_rng(seed)
    speeds = np.asarray(speeds, dtype=float)
    n = len(speeds)
    true = TimeModel(speeds, np.full(n, fixed_s))
    planner = planner or _planner.BatchPlanner(lo, hi)
    clock, done, total, chosen = 0.0, 0, int(N * epochs), []
    error = np.zeros(n)
    while done < total:
        epoch, rest = done // N, N - done % N
        remaining = total - done
        error = 0.9 * error + noise * rng.standard_normal(n)
        est = TimeModel(speeds * np.exp(error), np.full(n, fixed_s))
        work = _planner.Work(min(rest, remaining), N, max(remaining - rest, 0) / N)
        if planner.current is None:
            B = planner.update(est, sync_s, work, deadline_s - clock, force=True)
        else:
            B = planner.update(est, sync_s, work, deadline_s - clock)
        b = min(B, rest)
        if 0 < rest - b < n:
            b = rest
        took = _planner.iteration_time(true, sync_s, b) * rng.lognormal(0, 0.05)
        planner.observe(took, _planner.iteration_time(est, sync_s, b))
        clock += took
        done += b
        chosen.append((epoch, B))
    return clock, chosen, planner


def _changes_per_epoch(chosen):
    per = {}
    for (e0, b0), (e1, b1) in zip(chosen, chosen[1:]):
        per.setdefault(e1, 0)
        per[e1] += b1 != b0
    return per


def test_steady_speeds_give_a_steady_batch_and_meet_the_deadline():
    """One worker steadily 3x slower, speeds that do not change but are predicted with a
    persistent ~12 % error: over 5 deadlines across the feasible range and 2 seeds, B changes
    at most twice per epoch and the job meets its deadline (the issue's run changed B 68-70
    times in 650 iterations; up-moves that only ate into the margin, unbounded, gave 3 in an
    epoch here). Two candidates per octave and 6 epochs keep it to seconds."""
    speeds, fixed, sync, N, epochs = [600.0, 600.0, 200.0, 600.0], 0.004, 0.01, 1437, 6
    model = TimeModel(np.array(speeds), np.full(4, fixed))
    rows = _planner.plan(model, sync, _planner.Work(N, N, epochs - 1),
                        _planner.candidates(64, 1024, 2))
    fastest, slowest = min(r.finish_s for r in rows), max(r.finish_s for r in rows)
    for share in (0.1, 0.3, 0.5, 0.7, 0.9):
        deadline = fastest * 1.15 + share * (slowest - fastest * 1.15)
        for seed in range(2):
            took, chosen, planner = simulate_planner(
                deadline, speeds, fixed, sync, N, epochs, 0.05, seed,
                planner=_planner.BatchPlanner(64, 1024, per_octave=2))
            per = _changes_per_epoch(chosen)
            assert max(per.values()) <= 2, (share, seed, per)
            assert took <= deadline, (share, seed, took, deadline)
            assert planner.MIN_MARGIN <= planner.margin <= planner.MAX_MARGIN


def test_the_margin_follows_the_measured_spread_of_iteration_times():
    steady, noisy = _planner.BatchPlanner(64, 1024), _planner.BatchPlanner(64, 1024)
    assert steady.margin == noisy.margin == _planner.BatchPlanner.START_MARGIN
    rng = np.random.default_rng(0)
    for _ in range(40):
        steady.observe(1.0 * rng.lognormal(0, 0.01), 1.0)
        noisy.observe(1.2 * rng.lognormal(0, 0.15), 1.0)
    assert steady.margin == pytest.approx(_planner.BatchPlanner.MIN_MARGIN)
    assert 0.15 < noisy.margin <= _planner.BatchPlanner.MAX_MARGIN
    assert steady.bias == pytest.approx(1.0, abs=0.01)
    assert noisy.bias == pytest.approx(1.2, rel=0.1)      # predictions 20 % optimistic


def test_planner_says_when_no_batch_meets_the_deadline():
    planner = _planner.BatchPlanner(64, 256)
    work = _planner.Work(10**6, 10**6, 1)
    b = planner.update(_model([100.0, 100.0]), 0.01, work, time_left=1.0, force=True)
    assert planner.missing and b == 256


def test_fit_time_models_recovers_fixed_cost_and_speed():
    recs = []
    rng = np.random.default_rng(1)
    for t in range(40):
        for rank, (a, v) in enumerate([(0.02, 1000.0), (0.05, 250.0)]):
            b = int(rng.integers(20, 200))
            recs.append({"iteration": t, "rank": rank, "batch_size": b,
                         "compute_s": a + b / v, "sync_s": 0.004})
    ranks, model, sync_s = _profile.fit_time_models(recs)
    assert ranks == [0, 1]
    np.testing.assert_allclose(model.intercept, [0.02, 0.05], rtol=1e-6)
    np.testing.assert_allclose(model.speed, [1000.0, 250.0], rtol=1e-6)
    assert sync_s == pytest.approx(0.004)


def _metrics_file(tmp_path):
    path = tmp_path / "prof.jsonl"
    with open(path, "w") as fh:
        for t in range(20):
            for rank, v in enumerate([1000.0, 500.0]):
                b = (64 if rank == 0 else 32) * (1 + t % 2)     # two runs' sizes, pooled
                fh.write(json.dumps({
                    "iteration": t, "rank": rank, "batch_size": b, "compute_s": b / v,
                    "wait_s": 0.0, "sync_s": 0.005, "speed": v, "predicted_speed": None,
                    "cpu_percent": 50.0, "mem_percent": 10.0, "sync": "lbbsp",
                    "time": 1.0 + t}) + "\n")
    return path


def test_plan_cli_table_and_json(tmp_path, capsys):
    path = _metrics_file(tmp_path)
    assert main(["plan", str(path), "--samples", "10000", "--epochs", "2",
                 "--batch-range", "32:512", "--deadline", "30s"]) == 0
    out = capsys.readouterr().out
    assert "<- choice" in out and "meets" in out
    assert main(["plan", str(path), "--samples", "10000", "--epochs", "2",
                 "--batch-range", "32:512", "--deadline", "30s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workers"] == 2 and data["meets_deadline"]
    np.testing.assert_allclose(data["speed"], [1000.0, 500.0])
    # 1500 samples/s in all with no fixed cost: 20000 samples take ~13.3 s plus push/pulls
    choice = next(r for r in data["rows"] if r["batch"] == data["choice"])
    assert choice["finish_s"] <= 30 and choice["batch"] == 32


def test_plan_asks_for_a_varied_profile_when_one_batch_size_hides_the_fixed_cost(
        tmp_path, capsys):
    """The issue's case: a profile at one fixed B (16) of a cluster with a fixed cost per
    iteration; assuming none put the 3x slower worker at 10x. plan now says in one line that
    it cannot tell (exit 2); the same cluster profiled at two sizes gives the speeds."""
    def profile(path, sizes):
        with open(path, "w") as fh:
            for t in range(30):
                for rank, (a, v) in enumerate([(0.03, 1600.0), (0.03, 530.0)]):
                    b = sizes[t % len(sizes)] // 2
                    fh.write(json.dumps({
                        "iteration": t, "rank": rank, "batch_size": b, "compute_s": a + b / v,
                        "wait_s": 0.0, "sync_s": 0.005, "speed": b / (a + b / v),
                        "predicted_speed": None, "cpu_percent": 50.0, "mem_percent": 10.0,
                        "sync": "lbbsp", "time": 1.0 + t}) + "\n")
    flat = tmp_path / "b16.jsonl"
    profile(flat, [16])
    assert main(["plan", str(flat), "--samples", "1437", "--batch-range", "16:256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "barely vary" in err[0] and "two global batch sizes" in err[0]
    assert "Traceback" not in err[0]
    varied = tmp_path / "b64.jsonl"
    profile(varied, [64])
    assert main(["plan", str(flat), str(varied), "--samples", "1437", "--batch-range",
                 "16:256", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(data["speed"], [1600.0, 530.0], rtol=1e-6)
    np.testing.assert_allclose(data["fixed_s"], [0.03, 0.03], rtol=1e-6)
    # a compute time that does not grow with the batch: unsure, says so
    noise = tmp_path / "noise.jsonl"
    with open(noise, "w") as fh:
        for t in range(30):
            for rank in range(2):
                b = (16, 64)[t % 2]
                c = 0.05 + 0.01 * ((t * 7) % 3) - 0.0001 * b
                fh.write(json.dumps({
                    "iteration": t, "rank": rank, "batch_size": b, "compute_s": c,
                    "wait_s": 0.0, "sync_s": 0.005, "speed": b / c, "predicted_speed": None,
                    "cpu_percent": 50.0, "mem_percent": 10.0, "sync": "lbbsp",
                    "time": 1.0 + t}) + "\n")
    assert main(["plan", str(noise), "--samples", "1437", "--batch-range", "16:256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not grow with its batch size" in err[0]


@pytest.mark.parametrize("args,words", [
    (["--deadline", "15"], "unit"),
    (["--deadline", "-1m"], "positive"),
    (["--batch-range", "512:64"], "inverted"),
    (["--batch-range", "1:64"], "number of workers"),
    (["--samples", "0"], "--samples"),
    (["--skip", "40"], "no usable records"),
])
def test_plan_cli_bad_input(tmp_path, capsys, args, words):
    path = _metrics_file(tmp_path)
    argv = ["plan", str(path), "--samples", "1000", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


def test_loader_replays_a_schedule_and_uses_every_sample_once_per_epoch(monkeypatch):
    from mxnet import gluon, nd

    import mxlbbsp
    from mxlbbsp.worker import session

    monkeypatch.delenv("MXLBBSP_COORDINATOR", raising=False)
    session.close_session()
    N = 100
    ds = gluon.data.ArrayDataset(nd.array(np.arange(N).reshape(N, 1)), nd.array(np.arange(N)))
    schedule = [10, 30, 7, 53, 40, 40, 20, 99, 1]
    loader = mxlbbsp.DataLoader(ds, global_batch_size=10, shuffle=True, seed=3,
                                batch_schedule=schedule)
    sizes, epochs = [], []
    try:
        for _ in range(3):
            seen = []
            for _, label in loader:
                sizes.append(len(label))
                seen.extend(int(i) for i in label.asnumpy())
            epochs.append(seen)
        with pytest.raises(TypeError, match="not fixed"):
            len(loader)
        assert session.current().lr_factor() == pytest.approx(1 / 10)   # B = 1, B0 = 10
    finally:
        session.close_session()
    assert sizes == schedule
    for seen in epochs:
        assert sorted(seen) == list(range(N))
    assert epochs[0] != epochs[1]                     # a new permutation every epoch
    bad = mxlbbsp.DataLoader(ds, global_batch_size=10, batch_schedule=[60, 60])
    with pytest.raises(ValueError, match="past the end of the epoch"):
        list(bad)
    session.close_session()


# ---- the courier mode in the coordinator, with real sessions over loopback TCP -------------

from test_coordinator import coordinator, sessions  # noqa: E402,F401  (fixture and helper)


class _SimulatedTime:
    """The sessions' ``time`` module with ``perf_counter`` set by the test: the times the
    workers measure and report are the simulated ones, whatever this machine's load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def _courier_iteration(ss, speeds, sync_s=0.05, clock=None, fake=None):
    """One iteration of every worker at the given per-sample speeds, with a push/pull of
    ``sync_s``: the fixed cost per iteration that a larger batch amortises.

    ``fake``: the sessions' :class:`_SimulatedTime`; each worker's compute phase then
    takes exactly local / v and its push/pull ``sync_s`` on its own timeline.
    ``clock``: [seconds], the courier policy's clock, advanced by the iteration's time
    before the reports are sent, so the policy (which reads it once all n are in) reads the
    same time however its thread and this one interleave."""
    starts = [s._t_end for s in ss]
    if fake is not None:
        fake.now = max(starts)
    sizes = [s.next_iteration(None)[2] for s in ss]
    t = ss[0].iteration
    if clock is not None:
        clock[0] += max(b / v for b, v in zip(sizes, speeds)) + sync_s
    for s, start, local, v in zip(ss, starts, sizes, speeds):
        if fake is None:
            s._t_end -= local / v
        else:
            s._slice_wait, s._t_end, fake.now = 0.0, start, start + local / v
        s.gradients_ready()
    if fake is not None:
        # the pushes end once the coordinator has planned from all n reports (the split of
        # t+1+ahead): else a done of t could reach it before the last report, and its
        # sync-time average would depend on how the two threads interleave
        planned = t + 1 + _modes.get("courier").policy.ahead
        deadline = time.monotonic() + 30
        while not all(planned in s._slices for s in ss) and time.monotonic() < deadline:
            time.sleep(0.001)
    for s in ss:
        if fake is None:
            s._t_ready -= sync_s
        else:
            fake.now = s._t_ready + sync_s
        s.step_done()
    return t, ss[0].batch_global, sizes


def test_courier_rechooses_the_global_batch_when_the_workers_slow_down(coordinator,
                                                                        monkeypatch):
    # epochs of 5000 samples (5-20 iterations): B may change at most twice per epoch with
    # steady speeds, and the tenant's arrival and departure fall into different epochs
    n, N = 4, 5000
    c = coordinator(n, sync="courier", predictor="last",
                    sync_options={"deadline": "20s", "batch_range": "32:1024", "epochs": 4})
    # the policy's clock is the simulated one: the deadline counts simulated seconds, not
    # this test's (a loaded machine's) wall time
    clock = [0.0]
    c._policy.clock, c._policy.started = (lambda: clock[0]), 0.0
    # and so are the workers' measured times
    fake = _SimulatedTime()
    monkeypatch.setattr(_session_module, "time", fake)
    ss, errors = sessions(c, n, B=64, N=N, sync="courier")
    assert not errors
    for s in ss:
        s.announce(N)
        s._t_end = 0.0
    fast, slow = [1000.0] * 4, [1000.0, 1000.0, 250.0, 250.0]
    history = [_courier_iteration(ss, fast, clock=clock, fake=fake) for _ in range(15)]
    before = history[-1][1]
    history += [_courier_iteration(ss, slow, clock=clock, fake=fake) for _ in range(10)]
    during = max(b for _, b, _ in history[-10:])
    history += [_courier_iteration(ss, fast, clock=clock, fake=fake) for _ in range(20)]
    after = history[-1][1]
    for s in ss:
        s.close()
    assert c.failure is None
    for t, B, sizes in history:
        assert sum(sizes) == B and min(sizes) >= 1         # the slices tile B(t)
        assert B == 64 or 32 <= B <= 1024                  # B0, then within the range
    print("B(t)", [b for _, b, _ in history])
    assert during > before                                 # the tenant arrived: larger B
    assert after < during                                  # it left: back down
    # the slow workers get less than the fast ones while they are slow
    t, B, sizes = history[24]
    assert sizes[0] > sizes[2] and sizes[1] > sizes[3]
    rows = finished_records(c)
    assert {r["global_batch"] for r in rows} == {B for _, B, _ in history}
    assert all(r["deadline_s"] == 20.0 for r in rows)


from test_coordinator import finished_records  # noqa: E402


# ---- end to end: a real courier job, and one process replaying its B(t) ---------------------

@pytest.mark.cluster
def test_courier_job_uses_every_sample_once_and_a_replay_ends_with_its_parameters(tmp_path):
    """... and so does the independent reference (tests/reference.py: plain Gluon, no
    mxlbbsp) on the global batches of the job's sample ledger, at lr x the recorded factor."""
    import subprocess

    import mxnet as mx

    from conftest import PY, ROOT, run_mxlbbsp
    from reference import against, difference, read_ledger

    script = ROOT / "tests" / "scripts" / "ledger_train.py"
    N, B0, epochs = 600, 50, 2                # B0 = 50 is not a candidate: B(t) must change
    train = ["--samples", N, "--batch-size", B0, "--epochs", epochs]
    job, single = tmp_path / "job", tmp_path / "single"
    job.mkdir()
    single.mkdir()
    with open(tmp_path / "tenant.csv", "w") as fh:     # worker 1 slows down 4x mid-run
        fh.write("iteration,rank,slowdown\n0,0,1\n0,1,1\n0,2,1\n8,1,4\n")
    import time
    launched = time.time()
    r = run_mxlbbsp("launch", "-n", 3, "--sync", "courier", "--deadline", "20s",
                    "--batch-range", "24:300", "--epochs", epochs, "--lr-scaling", "sqrt",
                    "--emulate-compute", 1, "--emulate-slowdown", tmp_path / "tenant.csv",
                    "--metrics", tmp_path / "m.jsonl", "--progress", 0,
                    "--", PY, script, job, *train)
    assert r.rc == 0, r.output
    recs = [json.loads(line) for line in open(tmp_path / "m.jsonl")]
    totals = {}
    for rec in recs:
        totals.setdefault(rec["iteration"], []).append(rec["batch_size"])
    schedule = [sum(totals[t]) for t in sorted(totals)]
    assert schedule == [next(x["global_batch"] for x in recs if x["iteration"] == t)
                        for t in sorted(totals)]
    assert len(set(schedule)) > 1                       # the coordinator chose B(t)
    # the deadline's clock started at the launch: a record's time less its elapsed_s is
    # the moment the clock started (plus the iteration between its plan and its record)
    starts = [x["time"] - x["elapsed_s"] for x in recs if x.get("elapsed_s") is not None]
    assert starts and launched - 0.5 <= min(starts) <= launched + 1.0, (launched, min(starts))
    assert sum(schedule) == N * epochs                  # every sample of both epochs ...
    union = [sorted(i for part in slices for i in part) for slices in read_ledger(job)]
    assert [len(batch) for batch in union] == schedule
    cursor, epoch_seen = 0, []
    for batch in union:                                 # ... used once per epoch
        epoch_seen.extend(batch)
        cursor += len(batch)
        if cursor == N:
            assert sorted(epoch_seen) == list(range(N))
            cursor, epoch_seen = 0, []
    assert cursor == 0
    # one process replaying the recorded B(t), with the same learning-rate rule
    env = dict(os.environ, MXLBBSP_BATCH_SCHEDULE=str(tmp_path / "m.jsonl"),
               MXLBBSP_LR_SCALING="sqrt")
    subprocess.run([PY, str(script), str(single), *map(str, train)], check=True, cwd=ROOT,
                   timeout=300, env=env, capture_output=True)
    replay = [sorted(slices[0]) for slices in read_ledger(single)]
    assert replay == union                              # exactly the same batches
    dist = mx.nd.load(str(job / "rank0.params"))
    assert difference(dist, mx.nd.load(str(single / "rank0.params"))) <= 1e-4
    diff, whole = against(job, samples=N, metrics=tmp_path / "m.jsonl")
    assert whole == epochs and diff <= 1e-4


def test_report_plots_the_plan_of_a_courier_run(tmp_path):
    from mxlbbsp.analysis.report import write_report
    path = tmp_path / "_planner.jsonl"
    with open(path, "w") as fh:
        for t in range(30):
            B = 64 if t < 10 else 128
            for rank in range(2):
                fh.write(json.dumps({
                    "iteration": t, "rank": rank, "batch_size": B // 2, "compute_s": 0.01,
                    "wait_s": 0.001, "sync_s": 0.001, "iteration_s": 0.011, "speed": B / 0.02,
                    "predicted_speed": None, "cpu_percent": 50.0, "mem_percent": 10.0,
                    "sync": "courier", "predictor": "last", "time": 1.0 + t,
                    "global_batch": B, "lr_factor": B / 64, "deadline_s": 60.0,
                    "predicted_finish_s": 50.0 + t / 10, "elapsed_s": 5.0 + t,
                    "batch_range": [32, 512]}) + "\n")
    index = write_report([str(path)], str(tmp_path / "out"))
    assert (tmp_path / "out" / "run-plan.png").stat().st_size > 10000
    html = open(index).read()
    assert "run-plan.png" in html and "deadline" in html


@pytest.mark.parametrize("args,words", [
    (["--sync", "courier", "--epochs", "1", "--deadline", "15"], "unit"),
    (["--sync", "courier", "--epochs", "1", "--deadline", "-5m"], "positive"),
    (["--sync", "courier", "--epochs", "1", "--deadline", "5m", "--batch-range", "64:32"],
     "inverted"),
    (["--sync", "courier", "--epochs", "1", "--deadline", "5m", "--batch-range", "2:64"],
     "below the number of workers"),
    (["--sync", "bsp", "--deadline", "5m"],
     "only --sync courier or --sync goodput chooses the global batch"),
    (["--sync", "courier", "--deadline", "5m"], "--epochs"),
])
def test_launch_refuses_bad_courier_options_before_starting_anything(capsys, args, words):
    assert main(["launch", "-n", "4", *args, "--", "python", "-c", "pass"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert "started" not in captured.out + captured.err


def test_momentum_and_a_large_learning_rate_factor_are_warned_once(caplog):
    assert _lr.momentum_warning(0.9, 2.0) is None           # a small factor
    assert _lr.momentum_warning(0.0, 16.0) is None          # no momentum
    text = _lr.momentum_warning(0.9, 16.0)
    assert "16.0x" in text and "momentum is 0.9" in text and "--lr-scaling sqrt" in text

    class SGD:
        momentum = 0.9
    opt = SGD()
    with caplog.at_level("WARNING", logger="mxlbbsp.core.lr"):
        for factor in (1.0, 2.0, 8.0, 16.0, 8.0):
            _lr.warn_momentum(opt, factor)
    lines = [r.getMessage() for r in caplog.records if r.name == "mxlbbsp.core.lr"]
    assert len(lines) == 1 and "8.0x" in lines[0]


def test_the_deadline_counts_from_the_launch_the_launcher_hands_over(coordinator):
    """The launcher passes its process's start (_planner.launch_clock) as
    CoordinatorConfig.started: the policy's clock starts there, not when it is built (after
    the SSH pre-flight)."""
    import time

    import psutil
    age = time.time() - psutil.Process().create_time()    # whole seconds of boot time
    start = _planner.launch_clock()
    assert start == pytest.approx(time.monotonic() - age, abs=1.5)
    assert start < time.monotonic() - 0.1          # this test process is older than that
    c = coordinator(2, sync="courier", started=start,
                    sync_options={"deadline": "60s", "epochs": 1, "batch_range": "2:64"})
    assert c._policy.started == start
    c2 = coordinator(2, sync="courier",
                     sync_options={"deadline": "60s", "epochs": 1, "batch_range": "2:64"})
    assert c2._policy.started > start            # none handed over: when it is built
    # (that the launcher hands it over: the end-to-end courier job below)
