"""The goodput mode end to end: real scheduler, servers and workers on loopback; a single
process replaying the job's recorded B(t) and learning rates (AdaScale's gain, from the
coordinator) ends with its parameters."""
import itertools
import json
import os
import subprocess

import pytest

from mxlbbsp.launcher.cli import main


@pytest.mark.cluster
def test_goodput_job_chooses_batches_and_a_replay_ends_with_its_parameters(tmp_path):
    """... and so does the independent reference (tests/reference.py: plain Gluon, no
    mxlbbsp) on the global batches of the job's sample ledger, at lr x AdaScale's recorded
    gain."""
    import mxnet as mx

    from conftest import PY, ROOT, run_mxlbbsp
    from reference import against, difference, read_ledger

    from mxlbbsp.core.lr import adascale

    script = ROOT / "tests" / "scripts" / "ledger_train.py"
    N, B0, epochs = 600, 40, 3
    train = ["--samples", N, "--batch-size", B0, "--epochs", epochs]
    job, single = tmp_path / "job", tmp_path / "single"
    job.mkdir()
    single.mkdir()
    # B0 = 40 lies above the range: every B(t) is the coordinator's, none the loader's
    # the default --lr-scaling adascale: the factors come from the coordinator's noise scale
    r = run_mxlbbsp("launch", "-n", 3, "--sync", "goodput", "--batch-range", "6:30",
                    "--emulate-compute", 0.5,
                    "--emulate-slowdown", "1,1,3", "--metrics", tmp_path / "m.jsonl",
                    "--progress", 0, "--", PY, script, job, *train)
    assert r.rc == 0, r.output
    recs = [json.loads(line) for line in open(tmp_path / "m.jsonl")]
    totals = {}
    for rec in recs:
        totals.setdefault(rec["iteration"], []).append(rec["batch_size"])
    schedule = [sum(totals[t]) for t in sorted(totals)]
    assert sum(schedule) == N * epochs                  # every sample of every epoch
    # the noise scale was estimated from the workers' norms and recorded
    phis = [x["noise_scale"] for x in recs if x.get("noise_scale") is not None]
    assert phis and all(p >= 0 for p in phis)
    assert any(x.get("noise_point") for x in recs)
    # B(t) within the range; an epoch's last batch is its rest, at least the 3 workers (a
    # rest below 3 joins the batch before it: up to 30 + 2)
    last = {t for t, total in enumerate(itertools.accumulate(schedule)) if total % N == 0}
    outside = [(t, b) for t, b in enumerate(schedule)
               if not (3 if t in last else 6) <= b <= 32]
    assert not outside, outside
    # every worker applied AdaScale's gain at B(t) from the noise scale recorded with it
    # (sqrt(B/B0) before it was known)
    for t in sorted(totals):
        mine = [x for x in recs if x["iteration"] == t]
        assert len({x["lr_factor"] for x in mine}) == 1
        assert mine[0]["lr_factor"] == adascale(mine[0]["noise_scale"], schedule[t], B0)
    assert sum(x["noise_scale"] is not None for x in recs) > len(recs) / 2
    union = [sorted(i for piece in slices for i in piece) for slices in read_ledger(job)]
    assert [len(batch) for batch in union] == schedule
    # one process replaying the recorded B(t) and learning-rate factors
    env = dict(os.environ, MXLBBSP_BATCH_SCHEDULE=str(tmp_path / "m.jsonl"))
    subprocess.run([PY, str(script), str(single), *map(str, train)], check=True, cwd=ROOT,
                   timeout=300, env=env, capture_output=True)
    replay = [sorted(slices[0]) for slices in read_ledger(single)]
    assert replay == union                              # exactly the same batches
    dist = mx.nd.load(str(job / "rank0.params"))
    assert difference(dist, mx.nd.load(str(single / "rank0.params"))) <= 1e-4
    diff, whole = against(job, samples=N, metrics=tmp_path / "m.jsonl")
    assert whole == epochs and diff <= 1e-4


@pytest.mark.parametrize("args,words", [
    (["--sync", "goodput", "--batch-range", "64:32"], "inverted"),
    (["--sync", "goodput", "--batch-range", "0:0"], "inverted"),
    (["--sync", "goodput", "--batch-range", "2:64"], "below the number of workers"),
    (["--sync", "goodput", "--deadline", "5m"], "--deadline"),
    (["--sync", "goodput", "--epochs", "3"], "--epochs"),
    (["--sync", "lbbsp", "--goodput-model", "homo"], "only --sync goodput"),
    (["--sync", "bsp", "--batch-range", "8:64"], "--batch-range"),
    (["--sync", "courier", "--deadline", "5m", "--epochs", "2", "--lr-scaling", "adascale"],
     "only --sync goodput"),
    (["--sync", "goodput", "--lr-scaling", "cubic"], "--lr-scaling"),
])
def test_launch_refuses_bad_goodput_options_before_starting_anything(capsys, args, words):
    assert main(["launch", "-n", "4", *args, "--", "python", "-c", "pass"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert "started" not in captured.out + captured.err
