"""Checkpoints, resume, --restarts and BatchNorm synchronisation, with real processes.

The promise: a job stopped at any iteration (kill -9 of the launcher, a dead worker) and
resumed from its latest checkpoint, on the same or another number of workers, ends with the
parameters of the uninterrupted run and of one process on the whole batch (<= 1e-4): the
independent reference's (tests/reference.py: plain Gluon, no mxlbbsp, a process of its own,
on the global batches that the job's sample ledger recorded, tests/scripts/ledger_train.py;
a restarted launch's lines win where it trained iterations again).
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mxnet as mx
import numpy as np
import psutil
import pytest

from conftest import PY, ROOT, mxlbbsp_argv, newest_checkpoint, run_mxlbbsp, wait_no_leftovers
from mxlbbsp.core import store as _store
from reference import against


pytestmark = pytest.mark.cluster

SCRIPT = ROOT / "tests" / "scripts" / "ledger_train.py"
SAMPLES = 1437              # 2 x 23 iterations of B=64, the last of each epoch 29
TRAIN = ["--samples", SAMPLES, "--batch-size", 64, "--epochs", "2", "--lr-decay"]


def load(path):
    return mx.nd.load(str(path))


def relative_difference(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k].asnumpy() - b[k].asnumpy()).max()
                     / max(np.abs(a[k].asnumpy()).max(), 1e-12)) for k in a)


def _no_leftovers(marker, timeout=30):
    """wait_no_leftovers, tolerating processes that vanish while it looks at them (the job
    is dying right then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return wait_no_leftovers(marker, timeout) == []
        except psutil.NoSuchProcess:
            time.sleep(0.2)
    return False


def launch(*args, **kw):
    return run_mxlbbsp("launch", "--progress", "0", *args, **kw)


def one_process(folder, epochs=2, **options) -> float:
    """The largest difference between the job in ``folder`` and the independent reference
    on its ledger, which must hold every sample once per epoch."""
    options = {"samples": SAMPLES, "lr_decay": True, **options}
    diff, whole = against(folder, **options)
    assert whole == epochs
    return diff


def ledger_until(source: Path, folder: Path, last: int) -> None:
    """A job resumed into ``folder`` from ``source``'s checkpoint of iteration ``last``:
    the ledger up to there, and the parameters it started from."""
    for path in source.glob("ledger-rank*.jsonl"):
        lines = [x for x in path.read_text().splitlines() if json.loads(x)["iteration"] <= last]
        (folder / path.name).write_text("".join(x + "\n" for x in lines))
    (folder / "init.params").write_bytes((source / "init.params").read_bytes())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted job: 3 workers at 1:3:1, a checkpoint every 10 iterations."""
    tmp = tmp_path_factory.mktemp("reference")
    r = launch("-n", 3, "--emulate-slowdown", "1,3,1", "--checkpoint-dir", tmp / "ckpt",
               "--checkpoint-every", 10, "--metrics", tmp / "m.jsonl",
               "--", PY, SCRIPT, tmp, *TRAIN)
    assert r.rc == 0, r.output
    return tmp


def test_uninterrupted_run_writes_complete_checkpoints(reference):
    ckpts = sorted(p.name for p in (reference / "ckpt").iterdir())
    # the two newest are kept: the periodic one of 39, with the coordinator's state of the
    # same iteration, and the final one, written when the job ended normally
    assert ckpts == ["ckpt-00000039", "ckpt-00000045", "coordinator-00000039.json"]
    assert _store.read_manifest(reference / "ckpt" / "ckpt-00000045")["final"] is True
    assert "final" not in _store.read_manifest(reference / "ckpt" / "ckpt-00000039")
    m = _store.read_manifest(reference / "ckpt" / "ckpt-00000039")
    assert (m["iteration"], m["epoch"], m["index_in_epoch"], m["global_batch_size"]) == \
        (39, 1, 17, 64)
    state = _store.coordinator_state(str(reference / "ckpt" / "ckpt-00000039"))
    assert state["iteration"] == 39 and sum(state["split"]) == 64
    assert state["metrics_records"] == 3 * 40 and state["predictor"]
    assert one_process(reference) <= 1e-4


def test_resume_on_fewer_workers_is_exact(reference, tmp_path):
    """3 -> 2 workers from the checkpoint of iteration 39; metrics appended, no duplicates."""
    metrics = tmp_path / "m.jsonl"
    metrics.write_text((reference / "m.jsonl").read_text())
    ledger_until(reference, tmp_path, 39)
    r = launch("-n", 2, "--emulate-slowdown", "3,1", "--resume",
               reference / "ckpt" / "ckpt-00000039",
               "--metrics", metrics, "--", PY, SCRIPT, tmp_path, *TRAIN)
    assert r.rc == 0, r.output
    assert "resuming from iteration 40" in r.stderr
    assert "finished at iteration 46" in r.stdout
    resumed = load(tmp_path / "rank0.params")
    assert relative_difference(resumed, load(reference / "rank0.params")) <= 1e-4
    assert one_process(tmp_path) <= 1e-4
    assert relative_difference(resumed, load(tmp_path / "rank1.params")) == 0
    rows = [json.loads(line) for line in open(metrics)]
    keys = [(r["iteration"], r["rank"]) for r in rows]
    assert len(keys) == len(set(keys)) == 3 * 40 + 2 * 6
    assert sorted({t for t, _ in keys}) == list(range(46))


def test_kill9_of_the_launcher_then_resume_on_more_workers_is_exact(reference, tmp_path):
    """kill -9 of the launcher mid-run; the same command again continues from the newest
    checkpoint in --checkpoint-dir, on 4 workers instead of 2."""
    ckpt = tmp_path / "ckpt"
    marker = uuid.uuid4().hex
    argv = mxlbbsp_argv("launch", "--env", f"MXLBBSP_TEST_MARK={marker}", "--progress", "0",
                        "-n", 2, "--emulate-slowdown", "1,3", "--checkpoint-dir", ckpt,
                        "--checkpoint-every", 5, "--", PY, SCRIPT, tmp_path, *TRAIN)
    proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, MXLBBSP_TEST_MARK=marker),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while newest_checkpoint(ckpt) < 19 and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint of iteration 19"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert _no_leftovers(marker)
    assert not (tmp_path / "rank0.params").exists()      # it did not get to the end
    stopped = _store.read_manifest(_store.latest(str(ckpt)))["iteration"]
    assert 19 <= stopped < 45
    r = launch("-n", 4, "--emulate-slowdown", "1,3,1,2", "--checkpoint-dir", ckpt,
               "--checkpoint-every", 5, "--", PY, SCRIPT, tmp_path, *TRAIN)
    assert r.rc == 0, r.output
    assert f"resuming from iteration {stopped + 1}" in r.stderr
    assert r.stdout.count("finished at iteration 46") == 4, r.output
    # the summary covers the whole job, and says what this launch trained
    assert f"({46 - stopped - 1} in this launch, which resumed at iteration {stopped + 1})" \
        in r.stderr, r.output
    resumed = load(tmp_path / "rank0.params")
    assert one_process(tmp_path) <= 1e-4, r.output
    assert relative_difference(resumed, load(reference / "rank0.params")) <= 1e-4


def test_a_finished_job_is_not_run_again(reference):
    """The same command again (--checkpoint-dir): the final checkpoint says the job ended;
    nothing starts, exit 0. An explicit --resume of it runs the script on from there (more
    epochs: tests/test_exact_bn.py); one that asks for no more iterations ends at once."""
    r = launch("-n", 3, "--checkpoint-dir", reference / "ckpt", "--", PY, SCRIPT,
               reference / "again", *TRAIN)
    assert r.rc == 0, r.output
    assert "nothing to do" in r.stderr and "after iteration 45" in r.stderr, r.output
    assert "to train on from it (e.g. more epochs), add --resume " in r.stderr, r.output
    assert "started" not in r.stderr and "worker" not in r.stdout, r.output
    (reference / "again").mkdir(exist_ok=True)
    r = launch("-n", 3, "--resume", reference / "ckpt", "--", PY, SCRIPT, reference / "again",
               *TRAIN)
    assert r.rc == 0, r.output
    assert "the final checkpoint of a job that ended normally after iteration 45" in r.stderr
    assert r.stdout.count("finished at iteration 46") == 3, r.output


def test_a_dead_worker_is_restarted_from_the_checkpoint(reference, tmp_path):
    """Rank 1 exits with code 9 after iteration 22; --restarts 1 continues from 19. The
    summary and the metrics cover the whole job (45 iterations after the warm-up), as
    `mxlbbsp report` computes them from the file."""
    r = launch("-n", 2, "--emulate-slowdown", "1,3", "--checkpoint-dir", tmp_path / "ckpt",
               "--checkpoint-every", 5, "--restarts", 1, "--metrics", tmp_path / "m.jsonl",
               "--", PY, SCRIPT, tmp_path, *TRAIN, "--die-at", 22)
    assert r.rc == 0, r.output
    assert "restart 1/1 from iteration 20 on 2 worker(s) (worker 1 exited with code 9)" \
        in r.stderr
    from mxlbbsp.core import metrics
    rows = metrics.load(str(tmp_path / "m.jsonl"))
    assert sorted({(x["iteration"], x["rank"]) for x in rows}) == \
        [(t, k) for t in range(46) for k in (0, 1)] and len(rows) == 92
    s = metrics.summarize(rows)
    done = [line for line in r.stderr.splitlines() if "done in" in line]
    assert len(done) == 1 and "(the whole job, 1 restart(s)): 45 iterations after the " \
        f"warm-up, {s['samples_per_s']:.1f} samples/s" in done[0], r.output
    resumed = load(tmp_path / "rank0.params")
    assert relative_difference(resumed, load(reference / "rank0.params")) <= 1e-4
    assert one_process(tmp_path) <= 1e-4


def test_batchnorm_statistics_are_one_model_on_every_worker(tmp_path):
    """A net with BatchNorm on 2 workers at 1:3: identical parameters and running statistics
    on both, and the reference's, the running variance too (the spread of the workers'
    batch means included)."""
    args = ["--model", "bn", "--epochs", "1"]
    r = launch("-n", 2, "--emulate-slowdown", "1,3", "--", PY, SCRIPT, tmp_path, *TRAIN, *args)
    assert r.rc == 0, r.output
    a, b = (load(tmp_path / f"{n}.params") for n in ("rank0", "rank1"))
    for key in a:
        assert np.array_equal(a[key].asnumpy(), b[key].asnumpy()), key
    assert sum(k.endswith(("running_mean", "running_var")) for k in a) == 2
    assert one_process(tmp_path, epochs=1, model="bn") <= 1e-4


# ---- atomic writes (no cluster) ----------------------------------------------------------

def _files(value):
    return {"params.npz": lambda path: np.savez(path, w=np.full(3, value))}


@pytest.mark.parametrize("how", ["exception", "kill -9"])
def test_an_interrupted_write_never_corrupts_the_previous_checkpoint(tmp_path, how):
    d = str(tmp_path)
    _store.write_checkpoint(d, 5, _files(5.0), {"global_batch_size": 8})
    if how == "exception":
        def broken(path):
            open(path, "wb").write(b"half")
            raise OSError("disk full")
        with pytest.raises(OSError):
            _store.write_checkpoint(d, 10, {"a": b"x", "b": broken}, {})
    else:
        # a process killed in the middle of writing iteration 10 (after its first file)
        code = ("import os, signal, sys; from mxlbbsp.core import store as _store\n"
                "def die(path):\n"
                "    open(path, 'wb').write(b'half'); os.kill(os.getpid(), signal.SIGKILL)\n"
                f"_store.write_checkpoint({d!r}, 10, {{'a': b'x', 'b': die}}, {{}})\n")
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
        assert p.returncode == -signal.SIGKILL
        assert any(n.startswith(".tmp-ckpt-") for n in os.listdir(d))
    latest = _store.latest(d)
    assert latest == os.path.join(d, "ckpt-00000005")
    assert _store.read_manifest(latest)["iteration"] == 5
    assert np.load(os.path.join(latest, "params.npz"))["w"].tolist() == [5.0] * 3
    assert not os.path.exists(os.path.join(d, "ckpt-00000010"))
    # the next write clears the leftovers, and keeps the two newest
    _store.write_checkpoint(d, 15, _files(15.0), {})
    _store.write_checkpoint(d, 20, _files(20.0), {})
    assert sorted(os.listdir(d)) == ["ckpt-00000015", "ckpt-00000020"]


# ---- bad input ---------------------------------------------------------------------------

def _one_error(r, text):
    assert r.rc == 2, r.output
    assert "Traceback" not in r.output
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert errors and text in errors[0], r.output
    return errors


@pytest.mark.parametrize("case", ["empty", "foreign", "missing"])
def test_resume_without_a_checkpoint_is_one_line_exit_2(tmp_path, case):
    folder = tmp_path / "ckpt"
    if case != "missing":
        folder.mkdir()
    if case == "foreign":
        (folder / "notes.txt").write_text("not a checkpoint")
        (folder / "ckpt-00000003").mkdir()         # a half-written one: no manifest
    r = launch("-n", 2, "--resume", folder, "--", PY, SCRIPT, tmp_path)
    errors = _one_error(r, f"--resume {folder}: the folder")
    assert len(errors) == 1 and "started" not in r.stderr


def test_restarts_without_a_checkpoint_dir_is_one_line_exit_2(tmp_path):
    r = launch("-n", 2, "--restarts", 2, "--", PY, SCRIPT, tmp_path)
    assert len(_one_error(r, "--restarts needs --checkpoint-dir")) == 1


def test_resume_with_another_global_batch_is_one_line_exit_2(reference, tmp_path):
    r = launch("-n", 2, "--resume", reference / "ckpt", "--", PY, SCRIPT, tmp_path, *TRAIN,
               "--batch-size", 32)
    errors = _one_error(r, "the checkpoint (iteration 45) was written with a global batch "
                           "size of 64")
    assert len(errors) == 1


def test_resume_with_another_model_is_one_line_exit_2(reference, tmp_path):
    r = launch("-n", 2, "--resume", reference / "ckpt", "--", PY, SCRIPT, tmp_path, *TRAIN,
               "--model", "bn")
    # found by the workers once they build the model: each refuses, the launcher says it once
    errors = _one_error(r, "the checkpoint holds a different model")
    assert len(errors) == 1, r.output
