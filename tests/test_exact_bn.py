"""Exactness for the scripts users really write (issue 20): BatchNorm at momentum 0.99, the
Gluon idioms step(len(data)), step(batch_size), allreduce_grads() + update(), gluoncv's
habits; a fresh uneven job, a resume onto fewer workers, and a restart after a killed worker.

Each job ends with every parameter, running mean and running variance included, within 1e-4
(max absolute difference; running means of order 1 and more) of the independent reference
(tests/scripts/bn_train.py --reference, which imports no mxlbbsp: plain Gluon trains one
process on the global batches the job's sample ledger recorded, tests/reference.py, with
BatchNorm normalising each worker's slice on its own, as it does on the workers, and its
running statistics updated by MXNet's own BatchNorm from the whole global batch). Real
schedulers, servers and workers on loopback.
"""
import re
import subprocess

import mxnet as mx
import numpy as np
import pytest

from conftest import PY, ROOT, run_mxlbbsp
from reference import read_ledger

pytestmark = pytest.mark.cluster

SCRIPT = ROOT / "tests" / "scripts" / "bn_train.py"
TOLERANCE = 1e-4


def launch(out, *options, script_args=()):
    out.mkdir(exist_ok=True)
    return run_mxlbbsp("launch", *options, "--progress", 30, "--", PY, SCRIPT, out,
                       *script_args, timeout=600)


def reference(out, folders, *script_args):
    out.mkdir(exist_ok=True)
    p = subprocess.run([PY, str(SCRIPT), str(out), *script_args, "--reference",
                        *map(str, folders)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    given = [str(a) for a in script_args]
    epochs = given[given.index("--epochs") + 1] if "--epochs" in given else "2"
    assert f", {epochs} whole epoch(s)" in p.stdout, p.stdout     # every sample once each
    return mx.nd.load(str(out / "single.params"))


def worst(job, single):
    """(max absolute difference, its parameter) over every parameter."""
    assert job.keys() == single.keys()
    found = max((float(np.abs(job[k].asnumpy() - single[k].asnumpy()).max()), k) for k in job)
    print(f"the largest difference from the reference: {found[0]:.2e} ({found[1]})")
    return found


def assert_one_model(folder, ranks):
    """Every worker ends with the same parameters, statistics included, bit for bit."""
    first = mx.nd.load(str(folder / "rank0.params"))
    for r in range(1, ranks):
        other = mx.nd.load(str(folder / f"rank{r}.params"))
        for key in first:
            assert np.array_equal(first[key].asnumpy(), other[key].asnumpy()), (r, key)
    return first


CNN = ["--model", "cnn", "--epochs", "2"]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """3 workers at 1:1:3 with step(len(data)), a checkpoint after each epoch (23 iterations)."""
    tmp = tmp_path_factory.mktemp("bn")
    r = launch(tmp / "job", "-n", 3, "--emulate-slowdown", "1,1,3", "--checkpoint-dir",
               tmp / "ckpt", "--checkpoint-every", 23, script_args=[*CNN, "--idiom", "step-n"])
    return tmp, r


def test_a_fresh_uneven_job_is_one_process_statistics_included(fresh):
    tmp, r = fresh
    assert r.rc == 0, r.output
    # step(len(data)) is taken as step(), and each worker says so once
    notes = [line for line in r.stderr.splitlines() if "trainer.step(" in line]
    assert len(notes) == 3 and all("normalised by the global batch" in n for n in notes), notes
    # the slow worker had fewer samples than an equal split gives it (an equal split of 64
    # over 3, or of the last batch's 29, is never more than 1 apart)
    slices = read_ledger(str(tmp / "job"))
    assert any(max(map(len, s)) - len(s[2]) > 1 for s in slices), "not an uneven job"
    job = assert_one_model(tmp / "job", 3)
    single = reference(tmp / "ref", [tmp / "job"], *CNN)
    assert float(np.abs(single["1.running_mean"].asnumpy()).max()) >= 1.0
    diff, key = worst(job, single)
    assert diff <= TOLERANCE, (key, diff)


def test_a_resume_onto_two_workers_with_allreduce_and_update_is_exact(fresh, tmp_path):
    tmp, first = fresh
    assert first.rc == 0, first.output
    r = launch(tmp_path / "job", "-n", 2, "--emulate-slowdown", "1,3", "--resume", tmp / "ckpt",
               script_args=["--model", "cnn", "--epochs", "3", "--idiom", "split"])
    assert r.rc == 0, r.output
    assert "resuming from iteration 46" in r.stderr, r.stderr
    job = assert_one_model(tmp_path / "job", 2)
    single = reference(tmp_path / "ref", [tmp / "job", tmp_path / "job"], "--model", "cnn",
                       "--epochs", "3")
    diff, key = worst(job, single)
    assert diff <= TOLERANCE, (key, diff)


def test_a_restart_after_a_killed_worker_is_exact(tmp_path):
    """Rank 1 exits with code 9 after iteration 30; --restarts 1 goes on from the checkpoint
    of iteration 29. The script passes its constant batch size: trainer.step(64)."""
    args = [*CNN, "--idiom", "step-b", "--die-at", 30]
    r = launch(tmp_path / "job", "-n", 3, "--emulate-slowdown", "1,1,3", "--checkpoint-dir",
               tmp_path / "ckpt", "--checkpoint-every", 10, "--restarts", 1, script_args=args)
    assert r.rc == 0, r.output
    assert "restart 1/1 from iteration 30" in r.stderr, r.stderr
    job = assert_one_model(tmp_path / "job", 3)
    single = reference(tmp_path / "ref", [tmp_path / "job"], *CNN, "--idiom", "step-b")
    diff, key = worst(job, single)
    assert diff <= TOLERANCE, (key, diff)


def test_a_gluoncv_resnet_trained_the_gluoncv_way_is_exact(tmp_path):
    """gluoncv.model_zoo's cifar_resnet20_v1, split_and_load, step(batch_size) with
    the constant batch size and a learning-rate scheduler, 3 workers at 1:1:3."""
    # 4 iterations: this net amplifies float rounding (the sums' order) beyond 1e-4 within
    # a dozen steps, for one process as much as for a job (tests/scripts/bn_train.py)
    args = ["--model", "resnet", "--epochs", "1", "--batch-size", "96", "--idiom", "step-b"]
    r = launch(tmp_path / "job", "-n", 3, "--emulate-slowdown", "1,1,3", script_args=args)
    assert r.rc == 0, r.output
    job = assert_one_model(tmp_path / "job", 3)
    single = reference(tmp_path / "ref", [tmp_path / "job"], *args)
    assert sum(k.endswith("running_var") for k in single) == 21     # every BatchNorm layer
    diff, key = worst(job, single)
    assert diff <= TOLERANCE, (key, diff)


# ---- the mistakes: one line, at once, nothing left running ------------------------------

def _one_line(r, rc=2):
    assert r.rc == rc, r.output
    assert "Traceback" not in r.output, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("[mxlbbsp] error")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_step_with_a_number_that_is_no_batch_stops_the_job_in_one_line(tmp_path):
    r = launch(tmp_path / "job", "-n", 2, script_args=["--epochs", "1", "--step-with", 7])
    line = _one_line(r)
    assert re.search(r"trainer\.step\(7\) at iteration 0: 7 is neither this worker's batch "
                     r"\(\d+\) nor the global batch \(64\)", line), line
    assert "write trainer.step()" in line


def test_a_loader_with_a_plain_gluon_trainer_is_one_line_within_seconds(tmp_path):
    r = launch(tmp_path / "job", "-n", 2, script_args=["--epochs", "1", "--plain-trainer", "--idiom", "step-n"])
    line = _one_line(r)
    assert "use mxlbbsp.Trainer with mxlbbsp.DataLoader" in line, line
    assert "iteration 0 of mxlbbsp.DataLoader ended without mxlbbsp.Trainer.step()" in line
    assert r.seconds < 60, r.seconds        # a hang would take the 300 s start-up limit


def test_a_trainer_without_its_loader_is_one_line(tmp_path):
    r = launch(tmp_path / "job", "-n", 2, script_args=["--epochs", "1", "--plain-loader"])
    line = _one_line(r)
    assert "do not come from an mxlbbsp.DataLoader" in line, line
    assert "use mxlbbsp.Trainer with mxlbbsp.DataLoader" in line
