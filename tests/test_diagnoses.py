"""Launched jobs (real scheduler, servers, workers on loopback): the script's logged curves in
the metrics, in TensorBoard's files and in the report, and the end-of-job diagnoses, which
are the report's (metrics.diagnose of the same Totals).

Each diagnosed case is made to show whatever the machine's load: a one-hidden-layer model of
0.6 M parameters on 4 samples per worker (its push/pull dwarfs its compute: 30 % seen), a
worker slowed 40x, a deadline of 1 s (MXNet's import alone takes longer), momentum 0.9 with
asp.
"""

import pytest

from conftest import PY, ROOT, run_mxlbbsp
from mxlbbsp.core import metrics

pytestmark = pytest.mark.cluster

SCRIPT = ROOT / "tests" / "scripts" / "log_train.py"


def launch(*args, **kw):
    return run_mxlbbsp("launch", "--progress", "0", *args, **kw)


def notes(r):
    return [line.split("note: ", 1)[1] for line in r.stderr.splitlines()
            if line.startswith("[mxlbbsp] note: ")]


def agrees_with_the_file(r, path):
    """The launcher's notes are metrics.diagnose of the metrics file (the report's)."""
    s = metrics.summarize(metrics.load(str(path)))
    assert notes(r) == metrics.diagnose(s), r.output
    return s


def test_logged_curves_reach_the_metrics_tensorboard_and_the_report(tmp_path):
    m, tb = tmp_path / "m.jsonl", tmp_path / "tb"
    r = launch("-n", 2, "--metrics", m, "--tensorboard", tb,
               "--", PY, SCRIPT, "--epochs", 2, "--batch-size", 64)
    assert r.rc == 0, r.output
    rows = metrics.load(str(m))
    its = sorted({x["iteration"] for x in rows})
    assert its == list(range(2 * 23))                    # digits' 1437 training samples
    assert all(set(x["scalars"]) >= {"loss"} for x in rows), rows[:2]
    epochs_end = [x for x in rows if "accuracy" in x.get("scalars", {})]
    assert [(x["iteration"], x["rank"]) for x in epochs_end] == [(22, 0), (45, 0)]
    curve = metrics.combine_scalars(rows)
    assert curve[-1][1]["loss"] < curve[0][1]["loss"]    # it trains
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(tb))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == \
        [(t, pytest.approx(v["loss"], rel=1e-5)) for t, v, _ in curve]
    assert [e.step for e in acc.Scalars("accuracy")] == [22, 45]
    assert len(acc.Scalars("worker1/batch_size")) == len(its)

    out = tmp_path / "report"
    rep = run_mxlbbsp("report", m, "-o", out)
    assert rep.rc == 0, rep.output
    assert (out / "scalars.png").stat().st_size > 10000
    assert "Training curves" in (out / "index.html").read_text()


def test_a_tiny_model_is_told_balancing_cannot_gain_much(tmp_path):
    m = tmp_path / "m.jsonl"
    r = launch("-n", 2, "--sync", "bsp", "--metrics", m,
               "--", PY, SCRIPT, "--hidden", 8192, "--batch-size", 8, "--iterations", 60)
    assert r.rc == 0, r.output
    s = agrees_with_the_file(r, m)
    assert s["compute_share"] < 0.5
    assert any(n.startswith(f"compute is only {s['compute_share']:.0%} of the iteration")
               and "balancing cannot gain more than" in n for n in notes(r)), r.output
    out = tmp_path / "report"
    assert run_mxlbbsp("report", m, "-o", out).rc == 0
    assert "balancing cannot gain more than" in (out / "index.html").read_text()


def test_a_starved_worker_is_named_and_min_batch_size_feeds_it(tmp_path):
    m = tmp_path / "m.jsonl"
    slow = ("-n", 2, "--sync", "lbbsp", "--time-model", "linear", "--emulate-slowdown", "1,40")
    train = ("--", PY, SCRIPT, "--batch-size", 32, "--iterations", 40)
    r = launch(*slow, "--metrics", m, *train)
    assert r.rc == 0, r.output
    agrees_with_the_file(r, m)
    assert any(n.startswith("starved: worker 1 (") and "--min-batch-size N" in n
               for n in notes(r)), r.output
    r = launch(*slow, "--metrics", m, "--min-batch-size", 5, *train)
    assert r.rc == 0, r.output
    rows = metrics.load(str(m))
    assert min(x["batch_size"] for x in rows) == 5, [x["batch_size"] for x in rows]
    agrees_with_the_file(r, m)
    assert not any(n.startswith("starved") for n in notes(r)), r.output


def test_min_batch_size_above_the_equal_share_is_one_line_exit_2(tmp_path):
    r = launch("-n", 2, "--min-batch-size", 17, "--", PY, SCRIPT, "--batch-size", 32)
    assert r.rc == 2, r.output
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert errors == ["[mxlbbsp] error: --min-batch-size 17 is more than the global batch "
                      "size 32 / 2 workers (16 each): every worker must be able to get it; "
                      "use at most 16, or fewer workers"], r.output


def test_a_missed_courier_deadline_says_by_how_much(tmp_path):
    m = tmp_path / "m.jsonl"
    r = launch("-n", 2, "--sync", "courier", "--deadline", "1s", "--epochs", 1,
               "--metrics", m, "--", PY, SCRIPT, "--batch-size", 64)
    assert r.rc == 0, r.output
    s = agrees_with_the_file(r, m)
    late = s["done_s"] - 1.0
    assert late > 0
    assert f"deadline missed by {late:.1f} s" in "\n".join(notes(r)), r.output
    out = tmp_path / "report"
    assert run_mxlbbsp("report", m, "-o", out).rc == 0
    assert "deadline missed by" in (out / "index.html").read_text()


def test_momentum_with_asp_is_warned_at_launch_and_in_the_summary(tmp_path):
    m = tmp_path / "m.jsonl"
    r = launch("-n", 2, "--sync", "asp", "--metrics", m,
               "--", PY, SCRIPT, "--momentum", 0.9, "--iterations", 10)
    assert r.rc == 0, r.output
    warned = [line for line in r.stderr.splitlines()
              if "warning: momentum 0.9 with --sync asp" in line]
    assert len(warned) == 1 and warned[0].startswith("[worker 0]"), r.output
    agrees_with_the_file(r, m)
    assert any(n.startswith("momentum 0.9 with --sync asp") for n in notes(r)), r.output


def test_log_with_a_non_number_in_a_job_is_one_line_exit_2(tmp_path):
    r = launch("-n", 2, "--", PY, SCRIPT, "--iterations", 3, "--bad", "high")
    assert r.rc == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("[mxlbbsp] error")]
    assert len(errors) == 1 and "mxlbbsp.log: loss='high' is not a number" in errors[0], \
        r.output
