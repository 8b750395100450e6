"""Elastic jobs end to end: hosts come and go through a real discovery script, over a real
sshd on 127.0.0.1-3 (three hosts on this machine), and the job ends with the parameters of
the independent reference (tests/reference.py: plain Gluon on the global batches the workers
recorded, every sample once per epoch), BatchNorm's running statistics included.

Two jobs carry the scenarios (each real job costs a start-up per resize):

* grow 2 -> 3 when the script lists a third host, shrink 3 -> 2 when it drops it (each
  time the next workers start while the job trains, --start-ahead), a listed host that
  cannot run the job left out, then kill -9 of a worker with --checkpoint-every 50: each
  resize loses no finished iteration, the failure (while the third host's generation starts
  ahead: given up, the job restarts on three hosts) none either (the iteration in flight is
  trained again), where restarting from the periodic checkpoint would have redone up to 49;
* SIGTERM to one host's processes (its guard and its worker: a preemption notice) shrinks
  the job 3 -> 2 gracefully, the next workers started after the boundary
  (--no-start-ahead); then the script drops a host below --min-workers: one line naming
  it, exit 1, nothing left running.
"""
import re
import signal
import stat
import subprocess
import time
import uuid

import mxnet as mx
import psutil
import pytest

from conftest import PY, ROOT, run_mxlbbsp, wait_no_leftovers
from reference import difference
from sshd import Sshd, ensure_installed
from test_ssh import Running

pytestmark = pytest.mark.ssh

SCRIPT = ROOT / "tests" / "scripts" / "ledger_train.py"
REFERENCE = ROOT / "tests" / "reference.py"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
PROGRESS = re.compile(r"\[mxlbbsp\] [\d.]+ s: iteration (\d+),")


@pytest.fixture(scope="module")
def sshd3(tmp_path_factory):
    reason = ensure_installed()
    if reason:
        pytest.skip(f"no sshd: {reason}")
    server = Sshd(tmp_path_factory.mktemp("sshd3"), addresses=HOSTS)
    server.start()
    yield server
    server.stop()


class Hosts:
    """The discovery script's answer: a file the test edits, and the script that prints it."""

    def __init__(self, folder):
        self.listing = folder / "hosts.txt"
        self.script = folder / "discover.sh"
        self.script.write_text(f"#!/bin/sh\ncat {self.listing}\n")
        self.script.chmod(self.script.stat().st_mode | stat.S_IEXEC)

    def set(self, *hosts):
        tmp = self.listing.with_suffix(".tmp")
        tmp.write_text("".join(f"{h}:1\n" for h in hosts))
        tmp.replace(self.listing)


def start(sshd, tmp, hosts, *options, samples=6000, epochs=2, compute=0.5):
    job = tmp / "job"
    job.mkdir()
    run = Running(["launch", "--host-discovery-script", hosts.script, "--discovery-interval",
                   1, *sshd.launch_options(), "--checkpoint-dir", tmp / "ck", "--metrics",
                   job / "m.jsonl", "--progress", 1, "--emulate-compute", compute, *options,
                   "--", PY, SCRIPT, job, "--model", "bn", "--samples", samples, "--epochs",
                   epochs], uuid.uuid4().hex)
    return run, job


def reached(run, iteration, timeout=120):
    """Wait until a progress line says ``iteration`` or later; the line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(run.lines):
            m = PROGRESS.search(line)
            if m and int(m.group(1)) >= iteration:
                return int(m.group(1))
        if run.proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"iteration {iteration} never came; output:\n{run.output}")


def exact(job, samples):
    """The job's parameters against the independent reference's (and one model on every
    worker)."""
    ref = subprocess.run([PY, str(REFERENCE), str(job), str(job / "ref.params"), "--model",
                          "bn", "--samples", str(samples), "--metrics", str(job / "m.jsonl")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    params = mx.nd.load(str(job / "rank0.params"))
    for other in job.glob("rank*.params"):
        assert difference(mx.nd.load(str(other)), params) == 0, other
    return difference(params, mx.nd.load(str(job / "ref.params")))


def worker_of(marker, rank):
    """The worker of ``rank`` of the running generation (the oldest: a next generation's,
    started ahead, may be waiting beside it)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            if env.get("MXLBBSP_TEST_MARK") == marker and env.get("MXLBBSP_RANK") == str(rank) \
                    and "ledger_train.py" in " ".join(p.cmdline()):
                found.append((p.create_time(), p.pid, p))
        except psutil.Error:
            continue
    return min(found)[2] if found else None


def count(run, pattern):
    return len([line for line in list(run.lines) if re.search(pattern, line)])


def test_grow_shrink_and_a_killed_worker_lose_no_finished_iteration(sshd3, tmp_path):
    hosts = Hosts(tmp_path)
    hosts.set(*HOSTS[:2])
    # the next workers start while the job trains (--start-ahead): slow iterations, so
    # that the job is still running when they are ready, on a loaded machine too
    run, job = start(sshd3, tmp_path, hosts, "--checkpoint-every", 50, "--max-np", 3,
                     epochs=4, compute=3)
    try:
        reached(run, 10)
        hosts.set(*HOSTS)
        run.wait_for(r"host 127.0.0.3 joined: starting the next 3 worker\(s\) while "
                     "training goes on")
        grew = run.wait_for(r"resized 2 -> 3 workers at iteration \d+ in [\d.]+ s "
                            r"\(host 127.0.0.3 joined\), 0 iteration\(s\) lost")
        at = int(re.search(r"iteration (\d+)", grew).group(1))
        reached(run, at + 10)
        hosts.set(*HOSTS[:2])
        shrank = run.wait_for(r"resized 3 -> 2 workers at iteration \d+ in [\d.]+ s "
                              r"\(host 127.0.0.3 left\), 0 iteration\(s\) lost")
        at = int(re.search(r"iteration (\d+)", shrank).group(1))
        # a host that cannot run the job (no sshd there) is left out; the job trains on
        hosts.set(*HOSTS[:2], "127.0.0.4")
        run.wait_for(r"warning: 127.0.0.4 cannot join the job \(.*\): left out until the "
                     "discovery script drops it and lists it again; the job trains on")
        # past a periodic checkpoint, and far enough from the next one that restarting from
        # it would redo many iterations
        now = reached(run, max(at + 10, (at // 50 + 1) * 50 + 5))
        # the third host is back: while its generation starts ahead, a worker dies; the
        # generation started ahead is given up, the job restarts on the three hosts
        victim = worker_of(run.marker, 1)
        assert victim is not None, run.output
        hosts.set(*HOSTS)
        joined = r"host 127.0.0.3 joined: starting the next 3 worker"
        deadline = time.monotonic() + 60
        while count(run, joined) < 2:
            assert time.monotonic() < deadline, run.output
            time.sleep(0.1)
        victim.send_signal(signal.SIGKILL)
        restarted = run.wait_for(r"restarted 2 -> 3 workers at iteration \d+ in [\d.]+ s "
                                 r"\(worker 1 was killed by SIGKILL.*\), 0 iteration\(s\) lost")
        resumed = int(re.search(r"at iteration (\d+)", restarted).group(1))
        assert resumed >= now, (now, restarted)     # from the survivor's state, not the
        assert resumed % 50 != 0 or resumed > now   # periodic checkpoint
        rc = run.wait(600)
    finally:
        run.kill()
    assert rc == 0, run.output
    assert "2 resize(s), 1 restart(s)" in run.output and "0 iteration(s) lost; metrics" \
        in run.output, run.output
    assert "could not start ahead" not in run.output, run.output
    assert wait_no_leftovers(run.marker) == []
    assert exact(job, 6000) <= 1e-4, run.output


def test_sigterm_is_a_graceful_shrink_and_below_min_workers_ends_the_job(sshd3, tmp_path):
    hosts = Hosts(tmp_path)
    hosts.set(*HOSTS)
    # the next generation started after the boundary (what a failed start ahead falls
    # back to)
    run, job = start(sshd3, tmp_path, hosts, "--min-workers", 2, "--no-start-ahead")
    try:
        reached(run, 10)
        victim = worker_of(run.marker, 2)
        assert victim is not None, run.output
        for p in (victim, victim.parent()):         # the host's worker and its guard
            p.send_signal(signal.SIGTERM)
        run.wait_for(r"host 127.0.0.3 was given notice \(SIGTERM\)")
        shrank = run.wait_for(r"resized 3 -> 2 workers at iteration \d+ in [\d.]+ s \(host "
                              r"127.0.0.3 was given notice\), 0 iteration\(s\) lost")
        at = int(re.search(r"iteration (\d+)", shrank).group(1))
        reached(run, at + 5)
        hosts.set(HOSTS[0])
        rc = run.wait(300)
    finally:
        run.kill()
    assert rc == 1, run.output
    errors = [line for line in run.lines if "error:" in line]
    assert len(errors) == 1 and "1 worker slot(s) left (host 127.0.0.2 left), fewer than " \
        "--min-workers 2; the job's state is in" in errors[0], run.output
    assert wait_no_leftovers(run.marker) == []
    assert sshd3.wait_no_sessions() == []


def test_a_discovery_script_that_keeps_failing_is_exit_2(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 'no such cluster' >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    r = run_mxlbbsp("launch", "--host-discovery-script", script, "--discovery-interval", 0.2,
                    "--checkpoint-dir", tmp_path / "ck", "--", PY, SCRIPT, tmp_path)
    assert r.rc == 2, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1] == ("[mxlbbsp] error: --host-discovery-script discover.sh exited with "
                         "code 3: no such cluster, 5 times in a row; fix the script (it must "
                         "print host or host:slots lines and exit 0)"), r.output
    assert len([line for line in lines if "warning:" in line]) == 1, r.output


def test_too_few_slots_until_the_start_timeout_ends_the_job_saying_what_to_change(tmp_path):
    """The discovery script lists one slot for the whole --start-timeout: the job ends with
    exit 1 and one line, having started nothing (the script was asked more than once)."""
    script = tmp_path / "discover.sh"
    calls = tmp_path / "calls"
    script.write_text(f"#!/bin/sh\necho x >> {calls}\necho 127.0.0.1:1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    r = run_mxlbbsp("launch", "--host-discovery-script", script, "--discovery-interval", 0.2,
                    "--min-workers", 2, "--start-timeout", 1, "--checkpoint-dir",
                    tmp_path / "ck", "--", PY, SCRIPT, tmp_path)
    assert r.rc == 1, r.output
    assert r.stderr.strip().splitlines()[-1] == (
        "[mxlbbsp] error: 1 worker slot(s) after 1 s, fewer than --min-workers 2; raise "
        "--start-timeout or lower --min-workers"), r.output
    assert len(calls.read_text().split()) >= 3, r.output
    assert "Traceback" not in r.output, r.output
    ck = tmp_path / "ck"
    assert not ck.exists() or not any(ck.iterdir()), list(ck.iterdir())   # nothing trained
    assert wait_no_leftovers(r.marker) == []


@pytest.mark.parametrize("args, said", [
    (["--min-workers", 3, "--max-workers", 2], "--min-workers 3 is above --max-workers 2"),
    (["--max-workers", 0], "--max-workers 0: must be in 1..65536"),
    # horovodrun's spellings of the same two options
    (["--min-np", 3, "--max-np", 2], "is above --max-workers 2"),
    (["-n", 2], "-n with an elastic job"),
    (["--discovery-interval", 0], "--discovery-interval 0: must be a positive number"),
])
def test_contradictory_elastic_options_are_refused_at_launch(tmp_path, args, said):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    r = run_mxlbbsp("launch", "--host-discovery-script", script, *args, "--checkpoint-dir",
                    tmp_path / "ck", "--", PY, SCRIPT, tmp_path)
    assert r.rc == 2 and said in r.stderr and "Traceback" not in r.output, r.output
    assert len(r.stderr.strip().splitlines()) == 1, r.output
