"""mxlbbsp.log (the script's own values), the metrics' scalars, TensorBoard files, the
diagnoses of metrics.diagnose, --min-batch-size: units, and the coordinator with real sessions
over loopback TCP (threads play the workers). The launched jobs: tests/test_diagnoses.py."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import mxlbbsp
from mxlbbsp.core import metrics
from mxlbbsp.analysis import runs as report_runs
from mxlbbsp.worker import scalars
from mxlbbsp.control.registration import auto_min_batch

from test_coordinator import coordinator, finished_records, sessions  # noqa: F401



# ---- mxlbbsp.log ---------------------------------------------------------------------------

def test_log_accepts_numbers_and_one_element_arrays():
    import mxnet as mx
    assert scalars.check({"a": 1, "b": 0.5, "c": np.float32(2.5), "d": np.array([3.0]),
                          "e": mx.nd.array([4.0]).mean(), "f": float("nan")}) == \
        pytest.approx({"a": 1.0, "b": 0.5, "c": 2.5, "d": 3.0, "e": 4.0, "f": math.nan},
                      nan_ok=True)


@pytest.mark.parametrize("value, why", [("0.5", "is not a number"), (None, "is not a number"),
                                        (True, "is not a number"),
                                        (np.ones(2), "shape (2,) is not one number"),
                                        ([1, 2], "shape (2,) is not one number"),
                                        ({"x": 1}, "is not a number")])
def test_log_refuses_what_is_not_one_number(value, why):
    with pytest.raises(scalars.ScalarError, match=why.replace("(", r"\(").replace(")", r"\)")):
        scalars.check({"loss": value})


def test_log_in_a_single_process_keeps_the_values_and_writes_nothing(tmp_path):
    code = ("import mxlbbsp, mxlbbsp.worker.scalars as s\n"
            "mxlbbsp.log(loss=0.5, accuracy=0.25, lr=0.1)\n"
            "mxlbbsp.log()\n"
            "print(s.history()[-1][0], sorted(s.history()[-1][2].items()))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "-1 [('accuracy', 0.25), ('loss', 0.5), ('lr', 0.1)]"
    assert list(tmp_path.iterdir()) == []
    assert "log" in mxlbbsp.__all__


def test_log_does_not_import_mxnet():
    code = ("import sys, mxlbbsp\nmxlbbsp.log(loss=1.0)\n"
            "print('mxnet' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


@pytest.mark.parametrize("value", ["'abc'", "[1.0, 2.0]"])
def test_log_with_a_non_number_is_one_line_and_exit_2(value):
    r = subprocess.run([sys.executable, "-c", f"import mxlbbsp\nmxlbbsp.log(loss={value})"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxlbbsp: error: mxlbbsp.log: loss"), \
        r.stderr


# ---- the coordinator: scalars into the records, TensorBoard --------------------------------

def _step(s, B, seconds, **values):
    t, _, _ = s.next_iteration(B)
    s._t_end -= seconds
    s.gradients_ready()
    s.step_done()
    if values:
        s.send_scalars(t, values)


def test_logged_values_land_in_their_iteration_and_in_tensorboard(coordinator, tmp_path):
    """Values sent after the step (as mxlbbsp.log does) are in the record of their own
    iteration; TensorBoard's own reader finds the batch-weighted mean per iteration and each
    worker's speed and batch size."""
    tb = tmp_path / "tb"
    c = coordinator(2, sync="bsp", predictor="last", tensorboard=str(tb))
    ss, errors = sessions(c, 2, sync="bsp")
    assert not errors
    for t in range(4):
        for rank, s in enumerate(ss):
            _step(s, 64, 0.01 * (rank + 1), loss=1.0 / (t + 1) + rank, step=t)
    for s in ss:
        s.close()
    rows = finished_records(c)
    assert [(r["iteration"], r["rank"]) for r in rows] == [(t, r) for t in range(4)
                                                          for r in (0, 1)]
    for r in rows:
        assert r["scalars"] == {"loss": pytest.approx(1.0 / (r["iteration"] + 1) + r["rank"]),
                                "step": r["iteration"]}
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(tb))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "step", "worker0/speed", "worker1/speed", "worker0/batch_size",
            "worker1/batch_size"} <= tags
    # equal batches (bsp): the mean of 1/(t+1) and 1/(t+1) + 1
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == \
        [(t, pytest.approx(1.0 / (t + 1) + 0.5)) for t in range(4)]
    assert [e.value for e in acc.Scalars("worker1/batch_size")] == [32.0] * 4
    speeds = {(r["iteration"], r["rank"]): r["speed"] for r in rows}
    assert [e.value for e in acc.Scalars("worker1/speed")] == \
        [pytest.approx(speeds[(t, 1)], rel=1e-6) for t in range(4)]


def test_a_malformed_log_message_fails_the_job(coordinator):
    from mxlbbsp.core import protocol as P
    c = coordinator(1, sync="bsp", predictor="last")
    ss, _ = sessions(c, 1, sync="bsp")
    _step(ss[0], 64, 0.01)
    ss[0].send({"type": P.LOG, "iteration": 0, "scalars": {"loss": "high"}})
    deadline = __import__("time").monotonic() + 5
    while c.failure is None and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.02)
    assert c.failure and "scalar 'loss' is not a number" in c.failure
    ss[0].close()


def test_combine_scalars_weights_by_batch_and_keeps_nan():
    recs = [{"iteration": 0, "rank": 0, "batch_size": 30, "time": 5.0,
             "scalars": {"loss": 1.0, "acc": None}},
            {"iteration": 0, "rank": 1, "batch_size": 10, "time": 6.0,
             "scalars": {"loss": 3.0}},
            {"iteration": 1, "rank": 0, "batch_size": 30, "time": 7.0}]
    out = metrics.combine_scalars(recs)
    assert len(out) == 1 and out[0][0] == 0 and out[0][2] == 6.0
    assert out[0][1]["loss"] == pytest.approx(1.5) and math.isnan(out[0][1]["acc"])


def test_report_refuses_scalars_that_are_not_numbers(tmp_path):
    rec = {"iteration": 0, "rank": 0, "batch_size": 8, "compute_s": 0.1, "wait_s": 0.0,
           "speed": 80.0, "predicted_speed": None, "cpu_percent": None, "mem_percent": None,
           "sync": "bsp", "time": 1.0, "iteration_s": 0.1, "scalars": {"loss": "x"}}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(report_runs.InputError, match=r"m.jsonl:1: scalars is"):
        report_runs.load_run(str(path))


# ---- diagnoses -------------------------------------------------------------------------------

def _records(sizes, compute, iteration_s, n_iter=10, sync="lbbsp", **extra):
    out = []
    for t in range(n_iter):
        for r, (b, c) in enumerate(zip(sizes, compute)):
            out.append({"iteration": t, "rank": r, "batch_size": b, "compute_s": c,
                        "speed": b / c, "wait_s": iteration_s - c, "iteration_s": iteration_s,
                        "sync": sync, "barrier": sync not in ("asp", "r2sp"),
                        "time": float(t), **(extra if t == 0 else {})})
    return out


def test_a_small_compute_share_bounds_what_balancing_can_gain():
    # equal split, worker 1 twice as slow: compute 20 ms of a 100 ms iteration
    s = metrics.summarize(_records([32, 32], [0.01, 0.02], 0.1, sync="bsp"))
    assert s["compute_share"] == pytest.approx(0.2)
    # rest 80 ms; balanced 64 samples at 3200 + 1600 samples/s: 13.3 ms -> 100 / 93.3
    assert s["balance_gain"] == pytest.approx(0.1 / (0.08 + 64 / 4800) - 1)
    notes = metrics.diagnose(s)
    assert len(notes) == 1 and notes[0].startswith("compute is only 20% of the iteration")
    assert "balancing cannot gain more than 7.1 %" in notes[0]
    # a compute-bound job says nothing of the kind
    s = metrics.summarize(_records([32, 32], [0.09, 0.05], 0.1, sync="bsp"))
    assert s["compute_share"] == pytest.approx(0.9) and metrics.diagnose(s) == []


def test_the_gain_bound_is_below_what_compute_taking_no_time_would_gain():
    # speeds measured on a 1-sample batch look tiny; still no more than T / rest - 1
    s = metrics.summarize(_records([63, 1], [0.001, 0.05], 0.06))
    assert 0 < s["balance_gain"] < 0.06 / 0.01 - 1


def test_a_starved_worker_is_named_with_the_option():
    notes = metrics.diagnose(metrics.summarize(_records([62, 2], [0.1, 0.1], 0.11)))
    assert len(notes) == 1 and notes[0].startswith("starved: worker 1 (9 of 9 iterations")
    assert "--min-batch-size N" in notes[0]
    assert metrics.diagnose(metrics.summarize(_records([56, 8], [0.1, 0.1], 0.11))) == []


def test_a_courier_deadline_met_or_missed_by_how_much():
    late = _records([32, 32], [0.1, 0.1], 0.11, sync="courier")
    for rec in late:
        rec.update(deadline_s=3.0, done_s=1.0 + 0.3 * rec["iteration"])
    notes = metrics.diagnose(metrics.summarize(late))
    assert any(n.startswith("deadline missed by 0.7 s (23%): training ended at 3.7 s")
               for n in notes), notes
    for rec in late:
        rec["deadline_s"] = 5.0
    notes = metrics.diagnose(metrics.summarize(late))
    assert notes[0].startswith("deadline met: training ended at 3.7 s, 1.3 s before")


def test_momentum_with_asp_is_warned_about_but_not_with_bsp():
    asp = metrics.summarize(_records([32, 32], [0.1, 0.1], 0.11, sync="asp", momentum=0.9))
    assert asp["momentum"] == 0.9            # from the warm-up record too
    notes = metrics.diagnose(asp)
    assert len(notes) == 1 and notes[0].startswith("momentum 0.9 with --sync asp")
    bsp = metrics.summarize(_records([32, 32], [0.1, 0.1], 0.11, sync="bsp", momentum=0.9))
    assert metrics.diagnose(bsp) == []


def test_totals_carry_over_a_resume():
    recs = _records([32, 32], [0.1, 0.2], 0.25)
    whole = metrics.Totals()
    first = metrics.Totals()
    for r in recs:
        whole.add(r)
        if r["iteration"] < 6:
            first.add(r)
    resumed = metrics.Totals()
    resumed.load(json.loads(json.dumps(first.state())))
    for r in recs:
        if r["iteration"] >= 6:
            resumed.add(r)
    assert resumed.summary() == whole.summary()


# ---- --min-batch-size ------------------------------------------------------------------------

def test_the_default_minimum_batch_keeps_batchnorm_models_sane():
    assert auto_min_batch(64, 2, batchnorm=False) == 1
    assert auto_min_batch(64, 2, batchnorm=True) == 8
    assert auto_min_batch(16, 2, batchnorm=True) == 4      # at most half the equal share
    assert auto_min_batch(2, 2, batchnorm=True) == 1


def test_min_batch_size_above_the_equal_share_is_refused_at_registration(coordinator):
    c = coordinator(2, sync="lbbsp", min_batch_size=40)
    ss, errors = sessions(c, 2, B=64)
    assert c.failure_kind == "config"
    assert c.failure == ("--min-batch-size 40 is more than the global batch size 64 / 2 "
                         "workers (32 each): every worker must be able to get it; use at most "
                         "32, or fewer workers")


def test_min_batch_size_holds_for_a_much_slower_worker(coordinator):
    c = coordinator(2, sync="lbbsp", predictor="last", min_batch_size=6, time_model="linear")
    ss, errors = sessions(c, 2, B=64)
    assert not errors
    sizes = []
    for t in range(8):
        for rank, s in enumerate(ss):
            _, _, local = s.next_iteration(64)
            sizes.append(local)
            s._t_end -= 0.001 * local * (1 if rank == 0 else 100)
            s.gradients_ready()
            s.step_done()
    for s in ss:
        s.close()
    rows = finished_records(c)
    assert min(r["batch_size"] for r in rows) == 6       # it got the minimum, not less


def test_min_batch_size_above_couriers_smallest_batch_is_refused(coordinator):
    c = coordinator(2, sync="courier", min_batch_size=40,
                    sync_options={"deadline": "60s", "epochs": 1, "batch_range": "64:512"})
    sessions(c, 2, B=64, sync="courier")
    assert c.failure_kind == "config" and c.failure.startswith(
        "--min-batch-size 40 is more than --batch-range's minimum 64 / 2 workers (32 each)")


def test_a_batchnorm_job_splits_the_short_last_batch_of_its_epoch(coordinator):
    """The BatchNorm minimum (8 per worker here) cannot hold for an epoch's last batch of 5
    samples on 3 workers: that batch is split with at least one sample each, and the full
    batches keep the minimum (the job used to fail at the end of its first epoch)."""
    c = coordinator(3, sync="lbbsp", predictor="last", time_model="linear")
    ss, errors = sessions(c, 3, B=64, N=197, min_global_batch=5)
    assert not errors and c.failure is None
    for s in ss:
        s.describe_model({"batchnorm": True})
    plan = [64, 64, 64, 5, 64, 64]                 # two epochs' starts: 197 = 3 x 64 + 5
    seen = []
    for t, B in enumerate(plan):
        nxt = plan[t + 1] if t + 1 < len(plan) else 64
        after = plan[t + 2] if t + 2 < len(plan) else 64
        sizes = []
        for rank, s in enumerate(ss):
            # as the DataLoader announces them: B(t+1) and B(t+2), which the reports of t split
            s.announce(nxt, after)
            _, _, local = s.next_iteration(B)
            sizes.append(local)
            s._t_end -= 0.001 * local * (1 if rank == 0 else 50)   # ranks 1, 2: 50x slower
            s.gradients_ready()
        for s in ss:
            s.step_done()
        seen.append(sizes)
        assert c.failure is None, c.failure
    for s in ss:
        s.close()
    assert [sum(b) for b in seen] == plan
    assert min(seen[3]) >= 1                        # the short batch: one sample at least
    assert all(min(b) >= 8 for b in seen[2:3] + seen[4:])   # BatchNorm's minimum elsewhere
    assert c.balancer.min_batch == 8
