"""`mxlbbsp plan`'s profile fit (mxlbbsp.analysis.profile) on the profiles users gave it:
records built to their shapes (no processes, milliseconds), then real profiling jobs
(cluster)."""
import json
import math

import numpy as np
import pytest

from conftest import EXAMPLE, PY, run_mxlbbsp
from mxlbbsp.analysis import profile as _profile
from mxlbbsp.core import metrics
from mxlbbsp.core.planner import PlanError
from mxlbbsp.launcher.cli import main

#: sklearn's digits as examples/train_gluon.py splits it: the training set's size
DIGITS = 1437


def _epochs(batch, epochs, samples=DIGITS):
    """The global batches of ``epochs`` epochs at ``batch``: each epoch's full batches, then
    its short last one."""
    full, rest = divmod(samples, batch)
    return ([batch] * full + ([rest] if rest else [])) * epochs


def _run(globals_, split, models, rng, noise=0.05, spikes=0.0, spike_factor=4.0):
    """One profiling run's records: iteration t splits ``globals_[t]`` by ``split(B)`` into
    the ranks' local batches; rank i's compute time is a_i + b / v_i (``models``) times
    lognormal noise, a share ``spikes`` of them stretched ``spike_factor`` times (a
    preempted iteration)."""
    records = []
    for t, total in enumerate(globals_):
        for rank, b in enumerate(split(total)):
            a, v = models[rank]
            c = (a + b / v) * rng.lognormal(0.0, noise)
            if rng.random() < spikes:
                c *= spike_factor
            records.append({"iteration": t, "rank": rank, "batch_size": int(b),
                            "compute_s": c, "wait_s": 0.0, "sync_s": 0.004,
                            "speed": b / c, "predicted_speed": None, "cpu_percent": 50.0,
                            "mem_percent": 10.0, "sync": "lbbsp", "time": 1.0 + t,
                            "global_batch": int(total)})
    return records


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _even(total):
    return [total - total // 2, total // 2]


def _rank1_takes(rng, low, high):
    """A split of two workers in which rank 1 takes between ``low`` and ``high`` samples
    (drawn each iteration, as lbbsp's split moves) and rank 0 the rest."""
    def split(total):
        mine = min(int(rng.integers(low, high + 1)), total - 1)
        return [total - mine, mine]
    return split


def test_profiles_of_different_length_give_a_table(tmp_path, capsys):
    """B=16 and B=256, 3 epochs each: the B=16 run has 16x the records, and under lbbsp
    rank 0 took 15 of its 16 samples; the variety test counted records and refused ("local
    batch rank 0: 15 in 92%")."""
    rng = np.random.default_rng(5)
    models = [(0.002, 60000.0), (0.0025, 30000.0)]
    small = _run(_epochs(16, 3), _rank1_takes(rng, 1, 1), models, rng, spikes=0.03)
    large = _run(_epochs(256, 3), _rank1_takes(rng, 120, 136), models, rng, spikes=0.03)
    ranks, model, _ = _profile.fit_time_models(small + large)
    assert ranks == [0, 1]
    np.testing.assert_allclose(model.speed, [60000.0, 30000.0], rtol=0.15)
    np.testing.assert_allclose(model.intercept, [0.002, 0.0025], rtol=0.15)
    paths = [_write(tmp_path / "b16.jsonl", small), _write(tmp_path / "b256.jsonl", large)]
    assert main(["plan", *paths, "--samples", str(DIGITS), "--epochs", "10"]) == 0
    assert "<- choice" in capsys.readouterr().out


def test_a_fixed_cost_above_the_least_time_measured_is_kept(tmp_path, capsys):
    """B=32 and B=256: rank 1's medians grow from 4.9 ms at a local batch of 1 to 18 ms at
    48, so its fixed cost is 4.6 ms, above some of its times at 1 (noise); the fit took any
    intercept at or above the least time measured for noise and refused."""
    rng = np.random.default_rng(7)
    slope = (0.018 - 0.0049) / 47
    models = [(0.001, 20000.0), (0.0049 - slope, 1.0 / slope)]
    b32 = _run([32] * 30, _rank1_takes(rng, 1, 2), models, rng, noise=0.08)
    b256 = _run([256] * 30, _rank1_takes(rng, 44, 52), models, rng, noise=0.08)
    records = b32 + b256
    ranks, model, _ = _profile.fit_time_models(records)
    assert model.intercept[1] == pytest.approx(0.0049 - slope, rel=0.1)
    assert model.speed[1] == pytest.approx(1.0 / slope, rel=0.1)
    assert model.intercept[1] > min(r["compute_s"] for r in records if r["rank"] == 1
                                    and r["iteration"] >= 1)
    assert model.speed[0] == pytest.approx(20000.0, rel=0.15)
    paths = [_write(tmp_path / "b32.jsonl", b32), _write(tmp_path / "b256.jsonl", b256)]
    assert main(["plan", *paths, "--samples", "50000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fixed_s"][1] == pytest.approx(model.intercept[1])


def test_short_profiles_with_preempted_iterations_give_a_table(tmp_path, capsys):
    """B=64 and B=256, 30 iterations each: every rank's median grows (2.59 -> 5.05 ms), but
    a few preempted iterations at 32 samples raise their mean to that of 128, and least
    squares through the records found no growth ("timing noise swamps")."""
    rng = np.random.default_rng(11)
    slope = (0.00505 - 0.00259) / 96
    models = [(0.00259 - 32 * slope, 1.0 / slope)] * 2
    b64 = _run([64] * 30, _even, models, rng, noise=0.1, spikes=0.15, spike_factor=6.0)
    b256 = _run([256] * 30, _even, models, rng, noise=0.1)
    ranks, model, _ = _profile.fit_time_models(b64 + b256)
    # a fixed cost is the difference of two medians, each moved a little by the
    # preempted iterations among its records: less certain than the speed
    np.testing.assert_allclose(model.speed, 1.0 / slope, rtol=0.2)
    np.testing.assert_allclose(model.intercept, 0.00259 - 32 * slope, rtol=0.3)
    paths = [_write(tmp_path / "b64.jsonl", b64), _write(tmp_path / "b256.jsonl", b256)]
    assert main(["plan", *paths, "--samples", "50000", "--deadline", "15m"]) == 0
    assert "<- choice" in capsys.readouterr().out


def test_one_batch_size_and_its_epochs_short_last_batches_is_refused(tmp_path, capsys):
    """One B (bsp: 32 a worker) for 3 epochs: the last batch of each epoch (29: 15 and 14)
    gives each worker 3 records at half its batch, which is no second batch size."""
    rng = np.random.default_rng(3)
    records = _run(_epochs(64, 3), _even, [(0.002, 20000.0)] * 2, rng)
    path = _write(tmp_path / "b64.jsonl", records)
    assert main(["plan", path, "--samples", str(DIGITS)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "barely vary (rank 0: local batch 32 in 65 of 65 records" in err[0]
    assert "profile at two global batch sizes" in err[0]


def test_medians_that_do_not_grow_are_refused(tmp_path, capsys):
    """Two batch sizes whose median times are the same but for noise: no speed to fit."""
    rng = np.random.default_rng(2)
    flat = [(0.01, 1e12)] * 2                            # no cost per sample at all
    records = (_run([32] * 20, _even, flat, rng, noise=0.2)
               + _run([128] * 20, _even, flat, rng, noise=0.2))
    with pytest.raises(PlanError, match="does not grow with its batch size"):
        _profile.fit_time_models(records)
    path = _write(tmp_path / "flat.jsonl", records)
    assert main(["plan", path, "--samples", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at local batch 16" in err[0] and "on a quieter machine" in err[0]


@pytest.mark.parametrize("globals_, tails", [
    (_epochs(64, 3), {22, 45, 68}),                         # an epoch's last batch
    ([64, 128] * 10, set()),                                # two runs' sizes, interleaved
    ([256] * 5 + [128] * 5, set()),                         # courier: a smaller B, kept
    ([16] * 5 + [13], {5}),                                 # the run ends with a short batch
])
def test_epoch_tails(globals_, tails):
    records = _run(globals_, _even, [(0.001, 1000.0)] * 2, np.random.default_rng(0))
    assert _profile._epoch_tails(records) == tails


def test_pooled_files_are_runs_of_their_own():
    rng = np.random.default_rng(0)
    a = _run([16] * 4, _even, [(0.001, 1000.0)] * 2, rng)
    b = _run([64] * 3, _even, [(0.001, 1000.0)] * 2, rng)
    assert [len(run) for run in _profile._runs(a + b)] == [8, 6]


def test_groups_join_nearby_sizes_and_drop_the_odd_few():
    b = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 64, 64, 128, 128, 128]
    t = np.arange(len(b), dtype=float) + 1
    got = _profile.groups(b, t)
    assert [(g.low, g.high, g.records) for g in got] == [(30, 37, 8), (38, 40, 3),
                                                         (128, 128, 3)]
    assert got[0].batch == 33.5 and got[0].seconds == 4.5


# ---- real profiling jobs ----------------------------------------------------------------------

#: the per-sample cost the profiling jobs add (ms, slept and recorded exactly in compute_s:
#: a cost the test knows, which a busy machine cannot hide), and worker 1's slowdown; the
#: MLP's own compute, and its noise, are in every record as well
SAMPLE_MS, SLOWDOWN = 0.5, 3.0
LAUNCH = ["--emulate-compute", SAMPLE_MS, "--emulate-slowdown", f"1,{SLOWDOWN:g}"]
TRAIN = ["--model", "mlp", "--data", "digits"]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """Four profiling runs of 2 workers: lbbsp at B=16 and B=256 for 3 epochs each (the
    first with 16x the records), bsp at B=64 and B=256 for 30 iterations each."""
    tmp = tmp_path_factory.mktemp("profiles")
    runs = {"b16": ["--batch-size", 16, "--epochs", 3],
            "b256": ["--batch-size", 256, "--epochs", 3],
            "q64": ["--batch-size", 64, "--epochs", 2, "--iterations", 30],
            "q256": ["--batch-size", 256, "--epochs", 6, "--iterations", 30]}
    out = {}
    for name, args in runs.items():
        sync = "bsp" if name.startswith("q") else "lbbsp"
        path = tmp / f"{name}.jsonl"
        r = run_mxlbbsp("launch", "-n", 2, "--sync", sync, *LAUNCH, "--metrics", path, "--",
                        PY, EXAMPLE, *TRAIN, *args, timeout=240)
        assert r.rc == 0, r.output
        out[name] = path
    return out


def _plan(*paths, args=()):
    return run_mxlbbsp("plan", *paths, "--samples", DIGITS, "--epochs", 10, *args,
                       timeout=60)


def _check_fit(paths):
    """A table, and a fit that means something: a fixed cost >= 0 and a speed > 0 for each
    worker, the cost of a sample within a factor 2 of the one the job added (3x for the
    slow worker), and the slow worker the slower."""
    r = _plan(*paths)
    assert r.rc == 0, r.output
    assert "<- choice" in r.stdout and "speeds (samples/s)" in r.stdout
    r = _plan(*paths, args=["--json"])
    assert r.rc == 0, r.output
    data = json.loads(r.stdout)
    print(f"{', '.join(p.name for p in paths)}: speeds {data['speed']}, fixed costs "
          f"{data['fixed_s']}, push/pull {data['sync_s']}")
    assert data["workers"] == 2
    assert all(math.isfinite(a) and a >= 0 for a in data["fixed_s"]), data
    per_sample = [1e3 / v for v in data["speed"]]
    for ms, factor in zip(per_sample, (1.0, SLOWDOWN)):
        assert SAMPLE_MS * factor / 2 <= ms <= 2 * SAMPLE_MS * factor, data
    assert per_sample[1] > 1.5 * per_sample[0], data


@pytest.mark.cluster
def test_plan_on_real_profiles_of_different_length(profiles):
    """B=16 and B=256 for 3 epochs each (270 and 18 iterations)."""
    assert len(metrics.load(profiles["b16"])) > 10 * len(metrics.load(profiles["b256"]))
    _check_fit([profiles["b16"], profiles["b256"]])


@pytest.mark.cluster
def test_plan_on_two_short_real_profiles(profiles):
    """B=64 and B=256 for 30 iterations each."""
    _check_fit([profiles["q64"], profiles["q256"]])


@pytest.mark.cluster
def test_plan_refuses_a_real_profile_at_one_batch_size(profiles):
    r = _plan(profiles["q64"])
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxlbbsp plan: error: "), r.stderr
    assert "barely vary (rank 0: local batch 32 in" in lines[0]
    assert "profile at two global batch sizes" in lines[0] and "Traceback" not in r.output
