"""Exactness against an independent reference, for the habits and edges users hit.

Each job runs tests/scripts/ledger_train.py, which records its sample ledger (the indices
each worker trained on at each iteration, read from the items it was given);
tests/reference.py (plain Gluon, no mxlbbsp) checks the ledger (each epoch a permutation of
the data set) and trains one process on those global batches; the job's parameters must
equal the reference's (1e-4, BatchNorm's running statistics included).
"""
import mxnet as mx
import pytest

from conftest import PY, ROOT, run_mxlbbsp
from reference import against, difference

pytestmark = pytest.mark.cluster

SCRIPT = ROOT / "tests" / "scripts" / "ledger_train.py"


def ledger_job(tmp, launch_options, script_options, samples=300, model="mlp", lr=0.1,
               momentum=0.9):
    """Run the job, then the reference; (the launcher's result, the largest difference)."""
    tmp.mkdir(parents=True, exist_ok=True)
    r = run_mxlbbsp("launch", *launch_options, "--metrics", tmp / "m.jsonl", "--progress", 0,
                    "--", PY, SCRIPT, tmp, "--model", model, "--samples", samples,
                    "--lr", lr, "--momentum", momentum, *script_options)
    if r.rc != 0:
        return r, None
    job = mx.nd.load(str(tmp / "rank0.params"))
    for other in sorted(tmp.glob("rank*.params")):
        assert difference(mx.nd.load(str(other)), job) == 0, other   # one model everywhere
    diff, _ = against(tmp, samples=samples, model=model, lr=lr, momentum=momentum,
                      metrics=tmp / "m.jsonl")
    return r, diff


@pytest.mark.parametrize("step", ["none", "one"])
def test_a_mean_loss_trains_exactly_as_one_process(tmp_path, step):
    """``loss.mean().backward()`` with ``trainer.step()``, or Gluon's ``step(1)``, on two
    workers at 1:3 (uneven local batches): each worker's gradients are scaled back to the
    per-sample sum, and the job ends with the parameters of plain Gluon on the mean over
    each global batch. (Unscaled, it trained with a learning rate b_i times too small, and
    ``step(1)`` was refused.)"""
    r, diff = ledger_job(tmp_path, ["-n", 2, "--emulate-slowdown", "1,3"],
                         ["--loss", "mean", "--step", step])
    assert r.rc == 0, r.output
    assert "the loss is a mean over the batch" in r.stderr, r.output
    assert diff <= 1e-4, r.output


def test_a_mean_loss_with_step_of_the_batch_is_one_line(tmp_path):
    """``loss.mean()`` then ``step(len(data))`` divides by the batch twice: refused."""
    r = run_mxlbbsp("launch", "-n", 2, "--progress", 0, "--", PY, SCRIPT, tmp_path,
                    "--loss", "mean", "--step", "n")
    assert r.rc == 2, r.output
    assert "divides by the batch twice" in r.stderr and "Traceback" not in r.output, r.output


def test_workers_that_shuffle_with_a_seed_per_rank_are_refused_at_registration(tmp_path):
    r = run_mxlbbsp("launch", "-n", 2, "--progress", 0, "--", PY, SCRIPT, tmp_path,
                    "--seed-per-rank")
    assert r.rc == 2, r.output
    assert "the workers order the data differently (rank 0: last_batch='keep', seed=0, " \
           "shuffle=True; rank 1: last_batch='keep', seed=1, shuffle=True)" in r.stderr, r.output
    assert "Traceback" not in r.output, r.output
    assert not any(p.read_text() for p in tmp_path.glob("ledger-*")), "an iteration ran"


def test_workers_that_hold_different_data_are_refused_at_registration(tmp_path):
    r = run_mxlbbsp("launch", "-n", 2, "--progress", 0, "--", PY, SCRIPT, tmp_path,
                    "--shard-by-rank")
    assert r.rc == 2, r.output
    assert "the workers hold different data sets of the same size (rank 1 and rank 0" \
        in r.stderr and "Traceback" not in r.output, r.output


def test_a_batchnorm_job_with_a_5_sample_last_batch_on_3_workers_is_exact(tmp_path):
    """197 samples at B=64: the last batch of each epoch has 5 samples, under the BatchNorm
    default of 8 per worker; the job used to die at the end of its first epoch."""
    r, diff = ledger_job(tmp_path, ["-n", 3, "--emulate-slowdown", "1,1,3"],
                         ["--batch-size", 64, "--epochs", 2], samples=197, model="bn")
    assert r.rc == 0, r.output
    assert diff <= 1e-4, r.output


def test_a_batchnorm_resnet_whose_epoch_ends_short_runs_to_the_end():
    """The example's ResNet-20 on digits (1437 training samples) at B=110 on 3 workers: the
    epoch's last batch has 7 samples, fewer than 3 x the BatchNorm default of 8."""
    from conftest import EXAMPLE
    r = run_mxlbbsp("launch", "-n", 3, "--progress", 0, "--", PY, EXAMPLE, "--model",
                    "resnet20", "--batch-size", 110)
    assert r.rc == 0, r.output
    assert "[worker 0] done: 14 iterations" in r.stdout, r.output
