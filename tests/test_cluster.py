"""End to end on this machine: `mxlbbsp launch` with real MXNet schedulers, servers, workers.

The exactness promise: an LB-BSP run with an uneven split ends with the same parameters as
one process training on the whole global batch; here the independent reference's
(tests/reference.py: plain Gluon, no mxlbbsp, a process of its own, on the global batches
that the job's sample ledger recorded: tests/scripts/ledger_train.py).
"""
import json
import os
import signal
import subprocess
import time
import uuid

import mxnet as mx
import pytest

from conftest import (EXAMPLE, PY, ROOT, mxlbbsp_argv, processes_with, run_mxlbbsp,
                      wait_no_leftovers)
from reference import against, difference

pytestmark = pytest.mark.cluster

LEDGER = ROOT / "tests" / "scripts" / "ledger_train.py"
#: 1437 samples (as digits' training set): 23 iterations of B=64 an epoch, the last of 29
SAMPLES = 1437
TRAIN = ["--samples", SAMPLES, "--batch-size", "64", "--epochs", "2", "--momentum", "0.9",
         "--lr", "0.1"]
RECORD = ROOT / "tests" / "scripts" / "record_batches.py"


def one_model(folder, workers):
    """Every worker ended with the same parameters."""
    first = mx.nd.load(str(folder / "rank0.params"))
    for k in range(1, workers):
        assert difference(mx.nd.load(str(folder / f"rank{k}.params")), first) == 0, k


from mxlbbsp import modes  # noqa: E402
from mxlbbsp.core import signals  # noqa: E402


def records(path):
    rows = [json.loads(line) for line in open(path)]
    by_iter = {}
    for r in rows:
        by_iter.setdefault(r["iteration"], {})[r["rank"]] = r
    return rows, by_iter


@pytest.fixture(scope="module")
def lbbsp_run(tmp_path_factory):
    """One 2-worker LB-BSP job, worker 1 emulated 3x slower; several tests read it."""
    tmp = tmp_path_factory.mktemp("lbbsp")
    (tmp / "job").mkdir()
    result = run_mxlbbsp("launch", "-n", 2, "--emulate-slowdown", "1,3", "--relay", "on",
                         "--hubs", "on", "--metrics", tmp / "m.jsonl", "--progress", "1",
                         "--", PY, LEDGER, tmp / "job", *TRAIN)
    return tmp, result


def test_lbbsp_run_succeeds(lbbsp_run):
    _, r = lbbsp_run
    assert r.rc == 0, r.output
    assert "[worker 0] finished at iteration 46" in r.stdout
    assert "[mxlbbsp] done in" in r.stderr


def test_lbbsp_ends_with_the_parameters_of_one_process(lbbsp_run):
    """... through the host's relay and a hub (--relay on --hubs on, two workers on this
    host)."""
    tmp, r = lbbsp_run
    assert r.rc == 0, r.output
    assert "started 2 worker(s), 1 relay(s) through 1 hub(s)" in r.stderr, r.output
    one_model(tmp / "job", 2)
    diff, epochs = against(tmp / "job", samples=SAMPLES, metrics=tmp / "m.jsonl")
    assert epochs == 2 and diff <= 1e-4


def test_lbbsp_split_is_uneven_and_favours_the_fast_worker(lbbsp_run):
    tmp, _ = lbbsp_run
    rows, by_iter = records(tmp / "m.jsonl")
    iterations = sorted(by_iter)
    assert iterations == list(range(len(iterations)))
    uneven = [t for t in iterations if by_iter[t][0]["batch_size"] != by_iter[t][1]["batch_size"]]
    assert len(uneven) >= 0.6 * len(iterations)
    # the fast worker gets more in (nearly) every uneven split and far more in all: one
    # split may follow a speed misread on a busy machine (seen in CI: one 29:35 of 40)
    favoured = [t for t in uneven if by_iter[t][0]["batch_size"] > by_iter[t][1]["batch_size"]]
    assert len(favoured) >= 0.8 * len(uneven)
    fast, slow = ([by_iter[t][k]["batch_size"] for t in iterations] for k in (0, 1))
    assert sum(fast) >= 2 * sum(slow)
    # every iteration's split adds up to the global batch (64, or 29 at the end of an epoch)
    assert {sum(r["batch_size"] for r in by_iter[t].values()) for t in iterations} == {64, 29}


def test_metrics_have_one_record_per_worker_per_iteration(lbbsp_run):
    tmp, _ = lbbsp_run
    rows, by_iter = records(tmp / "m.jsonl")
    assert len(rows) == 2 * len(by_iter)
    for r in rows:
        for field in ("iteration", "rank", "host", "batch_size", "compute_s", "wait_s",
                      "speed", "predicted_speed", "cpu_percent", "mem_percent", "sync", "time"):
            assert field in r
        assert r["sync"] == "lbbsp" and r["compute_s"] > 0 and r["wait_s"] >= 0
    assert {r["slowdown"] for r in rows if r["rank"] == 1} == {3.0}
    # every iteration split from a report learnt from (iteration 1's on: the warm-up's is
    # not) carries the speed the predictor expected: lbbsp's reports of t split t+1+ahead
    first = 2 + modes.get("lbbsp").policy.ahead
    assert all(r["predicted_speed"] > 0 for r in rows if r["iteration"] >= first)
    # the default --signals auto: every signal but the tail (no sampler thread)
    assert all(name in r for name in signals.AUTO for r in rows)
    assert not any(name in r for name in signals.TAIL_NAMES for r in rows)
    assert any(r["others_cpu"] is not None for r in rows)


def test_the_last_line_agrees_with_the_report(lbbsp_run):
    """The launcher's "done in ..." figures are mxlbbsp report's (metrics.summarize) on the
    metrics file of the same run: both leave the warm-up iteration out."""
    import re
    from mxlbbsp.core import metrics
    tmp, r = lbbsp_run
    m = re.search(r"done in [\d.]+ s: (\d+) iterations after the warm-up, ([\d.]+) samples/s, "
                  r"workers waited ([\d.]+)% of the time", r.stderr)
    assert m, r.stderr
    report = metrics.summarize(metrics.load(str(tmp / "m.jsonl")))
    assert int(m[1]) == report["iterations"]
    assert m[2] == f"{report['samples_per_s']:.1f}"
    assert m[3] == f"{100 * report['wait_share']:.1f}"


def test_progress_lines_are_printed(lbbsp_run):
    _, r = lbbsp_run
    assert "[mxlbbsp] started 2 worker(s)" in r.stderr


@pytest.mark.parametrize("loader_workers", [0, 2])
def test_workers_batches_tile_the_single_process_batches(tmp_path, loader_workers):
    """Slicing rule: at every iteration, rank 0's samples then rank 1's then rank 2's are
    exactly the single process's batch; every sample once per epoch."""
    N, B, epochs = 203, 20, 2           # a short last batch of 3 each epoch
    args = [str(tmp_path), N, B, epochs, loader_workers, "keep"]
    r = run_mxlbbsp("launch", "-n", 3, "--emulate-slowdown", "1,2,4", "--progress", "0",
                    "--", PY, RECORD, *args)
    assert r.rc == 0, r.output
    subprocess.run([PY, str(RECORD), *map(str, args)], check=True, cwd=ROOT, timeout=120,
                   capture_output=True)
    single = json.load(open(tmp_path / "single.json"))["batches"]
    ranks = [json.load(open(tmp_path / f"rank{i}.json"))["batches"] for i in range(3)]
    assert all(len(b) == len(single) for b in ranks)
    assert len(single) == epochs * 11
    for t, batch in enumerate(single):
        assert ranks[0][t] + ranks[1][t] + ranks[2][t] == batch
        assert all(len(rk[t]) >= 1 for rk in ranks)
    per_epoch = len(single) // epochs
    for e in range(epochs):
        used = [i for b in single[e * per_epoch:(e + 1) * per_epoch] for i in b]
        assert sorted(used) == list(range(N))
    assert any(len(ranks[0][t]) != len(ranks[2][t]) for t in range(len(single)))


def test_global_batch_smaller_than_workers_is_one_line_exit_2(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("earlier run\n")
    r = run_mxlbbsp("launch", "-n", 4, "--metrics", metrics, "--progress", "0",
                    "--", PY, EXAMPLE, "--model", "mlp", "--batch-size", "3")
    assert r.rc == 2, r.output
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1
    assert "global batch size 3 is smaller than the number of workers (4)" in errors[0]
    assert "Traceback" not in r.output
    assert metrics.read_text() == "earlier run\n"


def test_first_failing_worker_stops_the_job_with_its_code(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['MXLBBSP_RANK'] == '1':\n"
                      "    time.sleep(1); sys.exit(3)\n"
                      "time.sleep(120)\n")
    r = run_mxlbbsp("launch", "-n", 3, "--progress", "0", "--", PY, script, timeout=60)
    assert r.rc == 3
    assert "error: worker 1 exited with code 3" in r.stderr


def test_ctrl_c_stops_everything_and_exits_130(tmp_path):
    marker = uuid.uuid4().hex
    env = dict(os.environ, MXLBBSP_TEST_MARK=marker)
    proc = subprocess.Popen(mxlbbsp_argv("launch", "-n", 2, "--env", f"MXLBBSP_TEST_MARK={marker}",
                                         "--progress", "0", "--", PY, EXAMPLE, "--model", "mlp",
                                         "--epochs", "1000", "--log-interval", "0"),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Interrupt once the job is up: 2 workers, a server and a scheduler, each under a guard.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(processes_with(marker)) < 8:
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGINT: stopping all" in err
    assert wait_no_leftovers(marker) == []
