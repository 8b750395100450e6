"""`mxlbbsp launch` inside a SLURM allocation, against a real slurmctld and two slurmd's.

The cluster (tests/slurm.py) runs on this machine: nodes n1 and n2 at 127.0.0.1, 4 CPUs each
whatever the machine has. Every job runs under ``salloc`` the way a user runs it, through a
small shell that, once the launcher has ended and before the allocation goes, prints the
allocation's steps that SLURM still lists (``squeue -s``): there must be none.
"""
import json
import os
import re
import signal
import subprocess
import time
import uuid

import mxnet as mx
import numpy as np
import psutil
import pytest

import slurm as slurm_fixture
from conftest import (EXAMPLE, PY, ROOT, Result, newest_checkpoint, processes_with,
                      wait_no_leftovers)

pytestmark = pytest.mark.cluster

TRAIN = ["--model", "mlp", "--data", "digits", "--epochs", "2", "--batch-size", "64",
         "--momentum", "0.9", "--lr", "0.1", "--log-interval", "10"]
CKPT_SCRIPT = ROOT / "tests" / "scripts" / "ckpt_train.py"
CKPT_TRAIN = ["--epochs", "2", "--lr-decay"]
#: runs the launcher, then lists the steps left in the allocation, then exits with its code
WRAP = ('"$0" -m mxlbbsp.launcher "$@"; rc=$?; echo "launcher exit $rc" >&2; '
        'squeue -s -h -j "$SLURM_JOB_ID" -o "%i %j" | sed "s/^/step left: /" >&2; exit $rc')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_fixture.ensure_installed()
    if why:
        pytest.skip(f"no SLURM to test with: {why}")
    folder = tmp_path_factory.mktemp("slurm")
    os.chmod(folder, 0o700)
    c = slurm_fixture.Slurm(folder)
    try:
        c.start()
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def salloc_argv(alloc, args, marker):
    args = [str(a) for a in args]
    if args and args[0] == "launch":
        args = ["launch", "--env", f"MXLBBSP_TEST_MARK={marker}", "--progress", "0", *args[1:]]
    return ["salloc", "--quiet", *map(str, alloc), "--", "sh", "-c", WRAP, PY, *args]


def job_env(cluster, marker):
    return dict(cluster.env(), MXLBBSP_TEST_MARK=marker)


def salloc(cluster, alloc, *args, timeout=300):
    """``salloc ALLOC -- mxlbbsp ARGS`` to its end; nothing of it may be left running."""
    marker = uuid.uuid4().hex
    started = time.monotonic()
    proc = subprocess.run(salloc_argv(alloc, args, marker), capture_output=True, text=True,
                          timeout=timeout, env=job_env(cluster, marker), cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    r = Result(proc.returncode, proc.stdout, proc.stderr, marker, time.monotonic() - started)
    assert wait_no_leftovers(marker) == [], r.output
    return r


def steps_left(r):
    return [line for line in r.stderr.splitlines() if line.startswith("step left:")]


def relative_difference(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k].asnumpy() - b[k].asnumpy()).max()
                     / max(np.abs(a[k].asnumpy()).max(), 1e-12)) for k in a)


def one_error(r, needle):
    """The launcher's error lines: exactly one, containing ``needle``, exit 2."""
    errors = [line for line in r.stderr.splitlines() if line.startswith("mxlbbsp")]
    assert r.rc == 2, r.output
    assert len(errors) == 1 and needle in errors[0], r.output
    assert "Traceback" not in r.output
    return errors[0]


def worker_process(marker, rank, timeout=120):
    """The psutil process of worker ``rank`` of the job with ``marker`` (not its guard)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in processes_with(marker):
            try:
                env = p.environ()
            except psutil.Error:
                continue
            if env.get("DMLC_ROLE") == "worker" and env.get("MXLBBSP_RANK") == str(rank):
                return p
        time.sleep(0.2)
    raise AssertionError(f"no worker {rank} within {timeout} s")


# ---- node lists and slots: SLURM's documented forms, against SLURM itself ----------------

NODELISTS = [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),                                       # a range
    ("n[1,3,7]", ["n1", "n3", "n7"]),                                     # a list
    ("node[01-03,10]", ["node01", "node02", "node03", "node10"]),         # padded, mixed
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),      # padding kept
    ("gpu[1-2],cpu[07-08],login", ["gpu1", "gpu2", "cpu07", "cpu08", "login"]),  # prefixes
    ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
    ("a-b[7],c.d", ["a-b7", "c.d"]),
]


@pytest.mark.parametrize("nodelist, expected", NODELISTS)
def test_node_lists_expand_as_slurm_expands_them(cluster, monkeypatch, nodelist, expected):
    from mxlbbsp.launcher import slurm
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    assert slurm.expand_nodelist(nodelist) == expected
    assert cluster.run("scontrol", "show", "hostnames", nodelist).split() == expected


@pytest.mark.parametrize("text, expected", [("1", [1]), ("2(x3)", [2, 2, 2]),
                                            ("2(x3),1", [2, 2, 2, 1]), ("4,1(x2),3", [4, 1, 1, 3])])
def test_per_node_counts(text, expected):
    from mxlbbsp.launcher.slurm import parse_counts
    assert parse_counts(text) == expected
    with pytest.raises(ValueError):
        parse_counts(text + "x")


@pytest.mark.parametrize("alloc", [["-N", 2, "-n", 3], ["-N", 2, "-n", 4], ["-N", 1, "-n", 2],
                                   ["-N", 2, "--ntasks-per-node", 3]])
def test_slots_are_where_srun_places_the_tasks(cluster, alloc):
    """The launcher's hosts and slots inside an allocation, against the nodes where srun
    itself runs the allocation's tasks."""
    code = ("from mxlbbsp.launcher import slurm; "
            "print(' '.join(f'{h.name}={h.slots}' for h in slurm.allocation_hosts()))")
    argv = ["salloc", "--quiet", "--overcommit", *map(str, alloc), "--", "sh", "-c",
            f'"$0" -c "{code}"; srun --overcommit sh -c \'echo task $SLURMD_NODENAME\'', PY]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=cluster.env(),
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    slots = dict(item.split("=") for item in lines[0].split())
    placed = {}
    for line in lines[1:]:
        node = line.split()[1]
        placed[node] = placed.get(node, 0) + 1
    assert {k: int(v) for k, v in slots.items()} == placed


# ---- jobs -----------------------------------------------------------------------------------

def test_three_workers_in_an_allocation_end_with_the_parameters_of_one_process(cluster,
                                                                               tmp_path):
    """No -n: one worker per task slot (3, on both nodes); LB-BSP at 1:3:1; exact."""
    r = salloc(cluster, ["-N", 2, "-n", 3, "--overcommit"], "launch",
               "--emulate-slowdown", "1,3,1", "--metrics", tmp_path / "m.jsonl",
               "--relay", "on", "--", PY, EXAMPLE, *TRAIN, "--save-params",
               tmp_path / "lbbsp.params")
    assert r.rc == 0, r.output
    # n1, a node of two workers, gets a relay (--relay on)
    assert "started 3 worker(s), 1 relay(s) and 1 server(s)" in r.stderr, r.output
    assert "[worker 0@n1] done: 46 iterations" in r.stdout, r.output    # prefixed output
    rows = [json.loads(line) for line in open(tmp_path / "m.jsonl")]
    assert {(row["rank"], row["host"]) for row in rows} == {(0, "n1"), (1, "n1"), (2, "n2")}
    assert "launcher exit 0" in r.stderr
    assert steps_left(r) == [], r.output
    params = tmp_path / "single.params"
    subprocess.run([PY, str(EXAMPLE), *TRAIN, "--save-params", str(params)], check=True,
                   cwd=ROOT, capture_output=True, timeout=300)
    dist = mx.nd.load(str(tmp_path / "lbbsp.params"))
    assert relative_difference(dist, mx.nd.load(str(params))) <= 1e-4


def test_kill_9_of_a_worker_ends_the_job_names_it_and_leaves_no_step(cluster, tmp_path):
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        salloc_argv(["-N", 2, "-n", 3, "--overcommit"],
                    ["launch", "--", PY, EXAMPLE, *TRAIN, "--epochs", "200"], marker),
        env=job_env(cluster, marker), cwd=ROOT, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        worker = worker_process(marker, 1)
        # the job's secret is on no command line (srun's included): it travels on stdin
        token = worker.environ()["MXLBBSP_TOKEN"]
        assert len(token) >= 16
        for p in psutil.process_iter(["cmdline"]):
            assert token not in " ".join(p.info["cmdline"] or []), p.info["cmdline"]
        time.sleep(2)
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    ended = time.monotonic() - killed
    assert proc.returncode == 137, err
    assert ended < 30, err
    assert re.search(r"error: worker 1 was killed by SIGKILL \(exit code 137[^)]*\) on n\d",
                     err), err
    assert "launcher exit 137" in err
    assert [line for line in err.splitlines() if line.startswith("step left:")] == [], err
    assert wait_no_leftovers(marker) == []


def test_restarts_survive_a_killed_worker_and_leave_out_a_node_that_is_gone(cluster, tmp_path):
    """1 worker per node; worker 1 (on n2) is killed after a checkpoint and n2 is drained
    meanwhile: --restarts 1 continues from the checkpoint on n1 alone, exactly."""
    marker = uuid.uuid4().hex
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        salloc_argv(["-N", 2, "-n", 2, "--overcommit"],
                    ["launch", "--checkpoint-dir", ckpt, "--checkpoint-every", 5,
                     "--restarts", 1, "--",
                     PY, CKPT_SCRIPT, tmp_path, *CKPT_TRAIN, "--sleep", 0.1], marker),
        env=job_env(cluster, marker), cwd=ROOT, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        worker = worker_process(marker, 1)
        deadline = time.monotonic() + 240
        while newest_checkpoint(ckpt) < 9:
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
        cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=mxlbbsp-test")
        worker.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert proc.returncode == 0, out + err
    assert re.search(r"restart 1/1 from iteration \d+ on 1 worker\(s\) \(n2 unreachable\)",
                     err), err
    assert "finished at iteration 46" in out, out + err
    assert [line for line in err.splitlines() if line.startswith("step left:")] == [], err
    single = tmp_path / "single"
    single.mkdir()
    subprocess.run([PY, str(CKPT_SCRIPT), str(single), *CKPT_TRAIN], check=True, cwd=ROOT,
                   capture_output=True, timeout=300)
    resumed = mx.nd.load(str(tmp_path / "single.params"))      # 1 worker: the script's name
    assert relative_difference(resumed, mx.nd.load(str(single / "single.params"))) <= 1e-4
    assert wait_no_leftovers(marker) == []


# ---- choosing the transport, and bad input --------------------------------------------------

def test_inside_an_allocation_without_n_every_slot_is_a_worker(cluster):
    r = salloc(cluster, ["-N", 2, "-n", 4, "--overcommit"], "launch", "--dry-run", "--",
               PY, EXAMPLE)
    assert r.rc == 0, r.output
    assert r.stdout.startswith("job: 4 worker(s)"), r.output
    workers = re.findall(r"^worker\s+\d+\s+(n\d)", r.stdout, re.M)
    assert sorted(workers) == ["n1", "n1", "n2", "n2"]
    assert "srun --overlap" in r.stdout and "ssh" not in r.stdout


def test_a_hostfile_inside_an_allocation(cluster, tmp_path):
    """-H means SSH, allocation or not; with --launcher slurm it picks allocated nodes."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=2\n")
    r = salloc(cluster, ["-N", 2, "-n", 4, "--overcommit"], "launch", "-H", hosts,
               "--dry-run", "--", PY, EXAMPLE)
    assert r.rc == 0 and "via: ssh" in r.stdout and "srun" not in r.stdout, r.output
    hosts.write_text("n2 slots=3\n")
    r = salloc(cluster, ["-N", 2, "-n", 4, "--overcommit"], "launch", "-H", hosts,
               "--launcher", "slurm", "--dry-run", "--", PY, EXAMPLE)
    assert r.rc == 0, r.output
    assert re.findall(r"^worker\s+\d+\s+(n\d)", r.stdout, re.M) == ["n2"] * 3
    hosts.write_text("n7\n")
    r = salloc(cluster, ["-N", 2, "-n", 4, "--overcommit"], "launch", "-H", hosts,
               "--launcher", "slurm", "--dry-run", "--", PY, EXAMPLE)
    one_error(r, "n7 not in the SLURM allocation")


def test_more_workers_than_the_allocation_has_slots_is_one_line_exit_2(cluster):
    r = salloc(cluster, ["-N", 2, "-n", 2], "launch", "-n", 5, "--", PY, EXAMPLE)
    one_error(r, "-n 5 workers, but the SLURM allocation")
    assert "has only 2 task slot(s)" in r.stderr
    assert steps_left(r) == []


def test_launcher_slurm_outside_an_allocation_is_one_line_exit_2(cluster):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([PY, "-m", "mxlbbsp.launcher", "launch", "--launcher", "slurm",
                           "-n", "2", "--", PY, str(EXAMPLE)], capture_output=True, text=True,
                          env={k: str(v) for k, v in env.items()}, timeout=60,
                          stdin=subprocess.DEVNULL)
    r = Result(proc.returncode, proc.stdout, proc.stderr, "", 0.0)
    one_error(r, "--launcher slurm: this is not inside a SLURM allocation")


def test_an_sbatch_script_like_the_readme_one(cluster, tmp_path):
    """The README's batch script without the GPUs: 2 nodes x 2 tasks, 2 servers, ps-lite on
    an interface (lo here), checkpoints and restarts; sbatch --wait returns its exit code."""
    marker = uuid.uuid4().hex
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=lbbsp\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
        f"#SBATCH --output={tmp_path / 'out.txt'}\n"
        f"cd {ROOT}\n"
        f"{PY} -m mxlbbsp.launcher launch --env MXLBBSP_TEST_MARK={marker} --progress 0 "
        f"-s 2 --ps-interface lo --checkpoint-dir {tmp_path / 'ckpt'} --checkpoint-every 20 "
        f"--restarts 2 -- {PY} {EXAMPLE} {' '.join(TRAIN)}\n")
    proc = subprocess.run(["sbatch", "--wait", "--quiet", str(script)], capture_output=True,
                          text=True, timeout=600, env=job_env(cluster, marker),
                          stdin=subprocess.DEVNULL)
    out = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, proc.stderr + out
    assert "started 4 worker(s) and 2 server(s)" in out, out    # no relay under 64 workers
    assert "[worker 0@n1] done: 46 iterations" in out, out
    assert wait_no_leftovers(marker) == []
    assert cluster.steps() == []


def test_launcher_and_its_sruns_killed_leave_nothing(cluster):
    """kill -9 of the launcher and of every srun it started: the guards in the steps stop
    their roles (their stdin closes, or at the latest no heartbeat comes for 30 s)."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        salloc_argv(["-N", 2, "-n", 2, "--overcommit"],
                    ["launch", "--", PY, "-c", "import time; time.sleep(300)"], marker),
        env=job_env(cluster, marker), cwd=ROOT, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        worker_process(marker, 1)
        launcher = [p for p in processes_with(marker)
                    if p.cmdline()[1:3] == ["-m", "mxlbbsp.launcher"]]
        assert len(launcher) == 1
        assert [p.name() for p in launcher[0].children()].count("srun") == 3   # 1 + 2 roles
        sruns = [p for p in launcher[0].children(recursive=True) if p.name() == "srun"]
        for p in launcher + sruns:
            p.kill()
        assert wait_no_leftovers(marker, timeout=60) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def test_an_elastic_job_shrinks_off_a_drained_node_without_a_restart(cluster, tmp_path):
    """--min-np (horovodrun's name of --min-workers) inside an allocation makes the job
    elastic over its nodes: n2 drained mid-job, the next generation starts on n1 while the
    job trains on, the job saves at an iteration boundary and goes on on n1 alone, no
    iteration lost (no restart from a periodic checkpoint), and ends with the independent
    reference's parameters (slow iterations: the job still runs when the next generation
    is ready)."""
    from reference import difference
    marker = uuid.uuid4().hex
    job = tmp_path / "job"
    job.mkdir()
    script = ROOT / "tests" / "scripts" / "ledger_train.py"
    argv = salloc_argv(["-N", 2, "-n", 2, "--overcommit"],
                       ["launch", "--min-np", 1, "--discovery-interval", 1,
                        "--checkpoint-dir", tmp_path / "ckpt", "--emulate-compute", 2,
                        "--metrics", job / "m.jsonl", "--", PY, script, job, "--samples",
                        4000, "--epochs", 6], marker)
    proc = subprocess.Popen(argv, env=job_env(cluster, marker), cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (job / "m.jsonl").exists() or len((job / "m.jsonl").read_text()
                                                      .splitlines()) < 20:
            assert proc.poll() is None and time.monotonic() < deadline, "no iterations"
            time.sleep(0.1)
        cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=mxlbbsp-test")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert proc.returncode == 0, out + err
    assert re.search(r"resized 2 -> 1 workers at iteration \d+ in [\d.]+ s \(host n2 left\), "
                     r"0 iteration\(s\) lost", err), err
    assert "1 resize(s), 0 restart(s)" in err and "restarted" not in err, err
    assert [line for line in err.splitlines() if line.startswith("step left:")] == [], err
    ref = subprocess.run([PY, str(ROOT / "tests" / "reference.py"), str(job),
                          str(job / "ref.params"), "--samples", "4000", "--metrics",
                          str(job / "m.jsonl")], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert difference(mx.nd.load(str(job / "rank0.params")),
                      mx.nd.load(str(job / "ref.params"))) <= 1e-4
    assert wait_no_leftovers(marker) == []
