"""The goodput mode's planner (mxlbbsp/modes/goodput.py): which B, and how steadily."""
import math

import numpy as np
import pytest

from mxlbbsp.core import timemodel as _bal
from mxlbbsp.core import noise
from mxlbbsp.core import split as _split
from mxlbbsp.modes import goodput


def _model(speeds, fixed=0.01):
    return _bal.TimeModel(np.array(speeds, float), np.full(len(speeds), fixed))


def test_the_chosen_batch_grows_with_the_noise_scale():
    fn = goodput.iteration_model("hetero", _model([3000, 3000, 1000]), 0.02)
    chosen = []
    for phi in (10.0, 100.0, 1000.0, 10000.0):
        p = goodput.GoodputPlanner(16, 1024, 64)
        chosen.append(p.update(fn, phi, force=True))
        assert p.row().goodput == max(r.goodput for r in p.last_rows)
    assert chosen == sorted(chosen) and chosen[0] < chosen[-1]


def test_hetero_model_is_the_lbbsp_makespan_and_homo_the_equal_split():
    m = _model([3000, 1000], fixed=0.0)
    het = goodput.iteration_model("hetero", m, 0.01)
    hom = goodput.iteration_model("homo", m, 0.01)
    # B = 400: balanced 300/100 -> 0.1 s; equal 200/200 -> the slow one's 0.2 s
    assert het(400) == pytest.approx(0.11, rel=1e-6)
    assert hom(400) == pytest.approx(0.21, rel=1e-6)
    assert math.isinf(hom(1))                  # a worker without a sample


def test_planner_moves_to_the_best_candidate_not_the_nearest():
    fn = goodput.iteration_model("hetero", _model([2000, 2000]), 0.02)
    best = goodput.GoodputPlanner(16, 1024, 64).update(fn, 5000.0, force=True)
    assert best >= 4 * 64
    p = goodput.GoodputPlanner(16, 1024, 64, min_interval=5)
    assert p.update(fn, 5000.0, (4000.0, 6000.0)) == best      # at once, all the way
    assert p.changes == 1


def test_planner_keeps_still_while_the_gain_is_within_the_error_bar():
    """The best B at the estimate is larger, but within the error bar the current B is as
    good: no move; the same estimate with a narrow error bar moves it. Speeds that jitter
    by 3 % do not move it either."""
    rng = np.random.default_rng(0)
    fn = goodput.iteration_model("hetero", _model([2000, 2000]), 0.02)
    phi = 400.0
    assert goodput.GoodputPlanner(16, 1024, 64).update(fn, phi, force=True) > 64
    p = goodput.GoodputPlanner(16, 1024, 64, min_interval=1)
    for _ in range(20):
        assert p.update(fn, phi, (10.0, 20000.0)) == 64
    moved = p.update(fn, phi, (0.9 * phi, 1.1 * phi))
    assert moved > 64
    for _ in range(30):
        jitter = goodput.iteration_model(
            "hetero", _model(2000.0 * (1 + 0.03 * rng.standard_normal(2))), 0.02)
        assert p.update(jitter, phi, (0.9 * phi, 1.1 * phi)) == moved
    assert p.changes == 1


def test_planner_moves_at_most_once_per_min_interval():
    fn = goodput.iteration_model("hetero", _model([2000, 2000]), 0.02)
    p = goodput.GoodputPlanner(16, 1024, 64, min_interval=5)
    changed = []
    for t in range(40):                           # a noise scale that keeps swinging
        before = p.current
        p.update(fn, 10.0 if (t // 2) % 2 else 10000.0, iteration=t)
        if p.current != before:
            changed.append(t)
    assert len(changed) >= 4
    assert min(b - a for a, b in zip(changed, changed[1:])) >= 5


def test_planner_moves_down_when_the_noise_scale_falls():
    fn = goodput.iteration_model("hetero", _model([2000, 2000]), 0.02)
    p = goodput.GoodputPlanner(16, 1024, 64, min_interval=1)
    high = p.update(fn, 3000.0, (2500.0, 3500.0))
    low = p.update(fn, 30.0, (25.0, 35.0))
    assert low < high and p.changes == 2


def test_planner_moves_down_when_a_fast_worker_leaves():
    """1:3 workers; the fast one leaves the throughput model (its time model gone), or
    slows down 30x: the throughput saturates sooner, so a smaller B gives the most goodput,
    and the planner moves there at its next plan."""
    phi, bar = 500.0, (450.0, 550.0)
    for after in ([1000.0], [100.0, 1000.0]):
        p = goodput.GoodputPlanner(16, 1024, 64, min_interval=1)
        both = p.update(goodput.iteration_model("hetero", _model([3000, 1000]), 0.02), phi,
                        bar)
        fewer = p.update(goodput.iteration_model("hetero", _model(after), 0.02), phi, bar)
        assert fewer < both / 1.4 and p.changes == 2


def test_planner_moves_only_where_every_possible_throughput_agrees():
    """A low noise scale and a fixed cost not known yet: the linear model (no fixed cost)
    makes B=16 look as fast per sample, and goodput the best; with the largest fixed cost
    still possible it is far slower. Given both (``also``), the planner does not move
    down; with the fixed cost known (one model) it moves to the best B of that one."""
    phi = 40.0
    linear = goodput.iteration_model("hetero", _model([3000, 1000], fixed=0.0), 0.0005)
    heavy = goodput.iteration_model("hetero", _model([3000, 1000], fixed=0.2), 0.0005)
    assert goodput.GoodputPlanner(16, 1024, 64).update(linear, phi, force=True) == 16
    p = goodput.GoodputPlanner(16, 1024, 64, min_interval=1)
    for _ in range(5):
        assert p.update(linear, phi, (35.0, 45.0), also=[heavy]) == 64
    assert p.changes == 0
    best = goodput.GoodputPlanner(16, 1024, 64).update(heavy, phi, force=True)
    assert best > 64
    assert p.update(heavy, phi, (35.0, 45.0)) == best
    # an up move that both ends agree on (a push/pull of 10 ms) is taken while the cost
    # is unknown
    linear = goodput.iteration_model("hetero", _model([3000, 1000], fixed=0.0), 0.01)
    heavy = goodput.iteration_model("hetero", _model([3000, 1000], fixed=0.2), 0.01)
    q = goodput.GoodputPlanner(16, 1024, 64, min_interval=1)
    assert q.update(linear, 20000.0, (18000.0, 22000.0), also=[heavy]) > 64


def test_vectorised_iteration_times_are_the_integer_splits_within_a_sample():
    rng = np.random.default_rng(1)
    for n in (2, 3, 7):
        m = _bal.TimeModel(rng.uniform(300, 3000, n), rng.uniform(0, 0.02, n))
        for kind in ("hetero", "homo"):
            fn = goodput.iteration_model(kind, m, 0.01, least=2 * n)
            batches = list(range(1, 300, 7))
            many = fn.many(batches)
            for B, fast in zip(batches, many):
                exact = fn(B)
                if kind == "hetero" and B >= 2 * n:     # the split's own least batch
                    split = _split.solve(m, B, 2)
                    exact = float(np.max(m.time(split))) + 0.01
                if math.isinf(exact):
                    assert math.isinf(fast)
                else:
                    assert exact - float(np.max(1 / m.speed)) - 1e-9 <= fast <= exact + 1e-12


def test_homogeneous_model_underrates_large_batches_on_a_heterogeneous_cluster():
    """1:3 workers: the equal-split model sees the slow worker's time and chooses a
    batch at most as large as the heterogeneity-aware one; on equal workers they agree."""
    phi = 500.0
    for speeds, same in (([3000, 1000], False), ([2000, 2000], True)):
        m = _model(speeds, fixed=0.02)
        het = goodput.GoodputPlanner(16, 1024, 64)
        hom = goodput.GoodputPlanner(16, 1024, 64)
        b_het = het.update(goodput.iteration_model("hetero", m, 0.02), phi, force=True)
        b_hom = hom.update(goodput.iteration_model("homo", m, 0.02), phi, force=True)
        if same:
            assert b_het == b_hom
        else:
            assert b_hom < b_het
        if not same:
            # the hetero choice has the larger true (LB-BSP) goodput
            real = goodput.iteration_model("hetero", m, 0.02)
            rows = {r.batch: r for r in noise.goodput_rows([b_het, b_hom], real, phi, 64)}
            assert rows[b_het].goodput >= rows[b_hom].goodput


@pytest.mark.parametrize("options,words", [
    ({"batch_range": "64:32"}, "inverted"),
    ({"batch_range": "0:32"}, "inverted"),
    ({"batch_range": "abc"}, "MIN:MAX"),
    ({"lr_scaling": "cubic"}, "--lr-scaling"),
    ({"goodput_model": "flat"}, "--goodput-model"),
])
def test_bad_options_are_one_line(options, words):
    problem = goodput.Goodput.check_options(options)
    assert problem and words in problem and "\n" not in problem


def test_range_below_the_number_of_workers():
    mode = goodput.Goodput()
    problem = mode.check_workers({"batch_range": "2:64"}, 4)
    assert "below the number of workers" in problem
    assert mode.check_workers({"batch_range": "4:64"}, 4) is None


# ---- mxlbbsp plan --goodput ------------------------------------------------------------------

def _profile(tmp_path, noise_scale=None):
    import json
    path = tmp_path / "prof.jsonl"
    with open(path, "w") as fh:
        for t in range(20):
            for rank, (a, v) in enumerate([(0.01, 3000.0), (0.01, 1000.0)]):
                b = (48 if rank == 0 else 16) * (1 + t % 2)
                rec = {"iteration": t, "rank": rank, "batch_size": b, "compute_s": a + b / v,
                       "wait_s": 0.0, "sync_s": 0.02, "speed": v, "predicted_speed": None,
                       "cpu_percent": 50.0, "mem_percent": 10.0, "sync": "lbbsp",
                       "time": 1.0 + t, "global_batch": 64 * (1 + t % 2)}
                if noise_scale is not None:
                    rec["noise_scale"] = noise_scale
                fh.write(json.dumps(rec) + "\n")
    return path


def test_plan_goodput_says_which_batch_and_why(tmp_path, capsys):
    import json

    from mxlbbsp.launcher.cli import main
    path = _profile(tmp_path, noise_scale=400.0)
    assert main(["plan", str(path), "--goodput", "--batch-range", "16:1024"]) == 0
    out = capsys.readouterr().out
    assert "<- choice" in out and "noise scale 400 samples (recorded)" in out
    assert "choice: B = " in out and "efficiency" in out
    assert main(["plan", str(path), "--goodput", "--batch-range", "16:1024", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    best = max(data["rows"], key=lambda r: r["goodput"])
    assert data["choice"] == best["batch"] and data["base_batch"] == 64
    # the same choice as the planner's from the true models
    fn = goodput.iteration_model("hetero", _bal.TimeModel(np.array([3000.0, 1000.0]),
                                                          np.array([0.01, 0.01])), 0.02)
    p = goodput.GoodputPlanner(16, 1024, 64)
    assert p.update(fn, 400.0, force=True) == data["choice"]
    # more noise: a larger batch; the homogeneous model: a smaller one
    assert main(["plan", str(path), "--goodput", "--batch-range", "16:1024",
                 "--noise-scale", "4000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choice"] > data["choice"]
    assert main(["plan", str(path), "--goodput", "--batch-range", "16:1024",
                 "--goodput-model", "homo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choice"] < data["choice"]


@pytest.mark.parametrize("args,words", [
    ([], "no noise_scale recorded"),
    (["--noise-scale", "-3"], "--noise-scale"),
    (["--noise-scale", "10", "--deadline", "5m"], "--goodput and --deadline"),
    (["--noise-scale", "10", "--batch-range", "1:64"], "number of workers"),
])
def test_plan_goodput_bad_input(tmp_path, capsys, args, words):
    from mxlbbsp.launcher.cli import main
    path = _profile(tmp_path)
    assert main(["plan", str(path), "--goodput", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


def test_report_plots_the_noise_scale_of_a_goodput_run(tmp_path):
    import json

    from mxlbbsp.analysis.report import write_report
    path = tmp_path / "goodput.jsonl"
    with open(path, "w") as fh:
        for t in range(30):
            B = 64 if t < 10 else 128
            for rank in range(2):
                fh.write(json.dumps({
                    "iteration": t, "rank": rank, "batch_size": B // 2, "compute_s": 0.01,
                    "wait_s": 0.001, "sync_s": 0.001, "iteration_s": 0.011, "speed": B / 0.02,
                    "predicted_speed": None, "cpu_percent": 50.0, "mem_percent": 10.0,
                    "sync": "goodput", "predictor": "last", "time": 1.0 + t,
                    "global_batch": B, "lr_factor": (B / 64) ** 0.5,
                    "batch_range": [16, 512], "goodput_model": "hetero",
                    "noise_scale": None if t < 3 else 100.0 + t, "goodput": 1000.0 + t,
                    "noise_scale_range": None if t < 3 else [80.0 + t, None if t < 8
                                                             else 150.0 + t],
                    "efficiency": (100.0 + 64) / (100.0 + B), "adascale_gain": None,
                    "noise_point": [0.1, 10.0]}) + "\n")
    index = write_report([str(path)], str(tmp_path / "out"))
    assert (tmp_path / "out" / "run-goodput.png").stat().st_size > 10000
    html = open(index).read()
    assert "run-goodput.png" in html and "noise scale" in html
    assert "run-plan.png" not in html              # not a courier run


def test_vectorised_iteration_times_keep_the_per_worker_caps():
    """--max-batch-size: a batch the caps cannot hold takes forever; below that, the
    makespan of the capped integer split within one sample per worker."""
    from mxlbbsp.core import planner
    m = _bal.TimeModel(np.array([3000.0, 1000.0, 500.0]), np.array([0.002, 0.004, 0.0]))
    caps = np.array([40, 100, 100])
    batches = np.arange(3, 260)
    fast = planner.iteration_times(m, 0.0, batches, caps, least=3)
    for B, got in zip(batches, fast):
        if B > caps.sum():
            assert math.isinf(got)
            continue
        split = _split.solve(m, int(B), 1, caps)
        exact = float(np.max(m.time(split)))
        assert exact - float(np.max(1 / m.speed)) - 1e-9 <= got <= exact + 1e-12, B

