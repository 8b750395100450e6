"""`mxlbbsp launch -H hostfile` end to end, against a real sshd on 127.0.0.1 and 127.0.0.2.

Nothing is mocked: the launcher runs the system ssh client, our own sshd (tests/sshd.py)
starts the guards, the guards start real MXNet servers and workers. Every job carries a
fresh ``MXLBBSP_TEST_MARK`` (through ``--env``); afterwards no process may carry it and no
sshd session may be left. The time bounds are the issue's failure bounds, not measurements.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid

from pathlib import Path

import psutil
import pytest

from conftest import PY, ROOT, EXAMPLE, mxlbbsp_argv, processes_with, run_mxlbbsp, \
    wait_no_leftovers
from netns import Netns
from mxlbbsp.launcher.guard import BOOT_DIR
from sshd import Sshd, ensure_installed

pytestmark = pytest.mark.ssh

#: a worker command prefix that prints how the worker was reached and what it got, then runs
#: the rest: "[worker R@HOST] probe|KEY=VALUE|KEY=VALUE..."
PROBED = {"rank": "MXLBBSP_RANK", "ssh": "SSH_CONNECTION", "omp": "OMP_NUM_THREADS",
          "mxnet": "MXNET_CPU_WORKER_NTHREADS", "venv": "VIRTUAL_ENV",
          "pythonpath": "PYTHONPATH", "ld": "LD_LIBRARY_PATH", "extra": "EXTRA",
          "mark": "MXLBBSP_TEST_MARK"}
PROBE = ["sh", "-c", 'echo "probe|pwd=$(pwd)' +
         "".join(f"|{key}=${{{var}}}" for key, var in PROBED.items()) + '"; exec "$@"', "probe"]
TRAIN = ["python", str(EXAMPLE), "--model", "mlp", "--data", "digits"]
CKPT_SCRIPT = ROOT / "tests" / "scripts" / "ckpt_train.py"


def probes(output):
    """{rank: (host in the prefix, {key: value})} from the PROBE lines in ``output``."""
    found = {}
    for m in re.finditer(r"^\[worker (\d+)@(\S+)\] probe\|(.*)$", output, re.M):
        found[int(m[1])] = (m[2], dict(kv.split("=", 1) for kv in m[3].split("|")))
    return found


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    reason = ensure_installed()
    if reason:
        pytest.skip(f"no sshd: {reason}")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two hosts, one worker each\n127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    return path


def launch(sshd, hostfile, *args):
    """The arguments of `mxlbbsp launch` for a job on ``hostfile`` through ``sshd``."""
    return ["launch", "-H", hostfile, *sshd.launch_options(), "--progress", "0", *args]


def assert_nothing_left(sshd, marker):
    assert wait_no_leftovers(marker) == [], "job processes left running"
    assert sshd.wait_no_sessions() == [], "ssh sessions left open"


class Running:
    """A launcher running in the background, its output collected line by line."""

    def __init__(self, args, marker):
        self.marker = marker
        args = [args[0], "--env", f"MXLBBSP_TEST_MARK={marker}", *map(str, args[1:])]
        self.proc = subprocess.Popen(mxlbbsp_argv(*args), cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=dict(os.environ, MXLBBSP_TEST_MARK=marker))
        self.lines = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    @property
    def output(self):
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern, timeout=90):
        """The first output line matching ``pattern``; fails the test after ``timeout``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if regex.search(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._reader.is_alive():
                    pytest.fail(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))
                self._changed.wait(min(left, 0.5))

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the launcher did not end within {timeout} s; output:\n{self.output}")
        self._reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def running():
    jobs = []

    def start(args):
        job = Running(args, uuid.uuid4().hex)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def workers_of(marker, count, timeout=60):
    """{rank: psutil.Process} of the job's worker processes, once all ``count`` are there."""
    deadline = time.monotonic() + timeout
    while True:
        found = {}
        for p in processes_with(marker):
            try:
                env = p.environ()
                if env.get("DMLC_ROLE") == "worker" and "train_gluon" in " ".join(p.cmdline()):
                    found[int(env["MXLBBSP_RANK"])] = p
            except psutil.NoSuchProcess:
                continue
        if len(found) == count:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"found worker(s) {sorted(found)} of the job, expected {count}")
        time.sleep(0.2)


def session_of(sshd, proc):
    """The sshd session process above ``proc`` (None: not started through ``sshd``)."""
    parents = proc.parents()
    if sshd.proc.pid not in [p.pid for p in parents]:
        return None
    return next(p for p in parents if p.ppid() == sshd.proc.pid)


# ---- a job that works ------------------------------------------------------------------------

def test_two_hosts_train_to_the_end(sshd, hostfile):
    forwarded = {"VIRTUAL_ENV": str(ROOT / ".venv"), "PYTHONPATH": "/no/such/python/path",
                 "LD_LIBRARY_PATH": "/no/such/lib"}
    r = run_mxlbbsp(*launch(sshd, hostfile, "--env", "EXTRA=a b;$c'd"), "--",
                    *PROBE, *TRAIN, "--batch-size", "32", "--iterations", "8",
                    "--log-interval", "4", timeout=180, env=forwarded)
    assert r.rc == 0, r.output
    got = probes(r.stdout)
    assert sorted(got) == [0, 1], r.output
    for rank, address in ((0, "127.0.0.1"), (1, "127.0.0.2")):
        host, env = got[rank]
        assert host == address                  # the output prefix names the host
        # SSH_CONNECTION: client address and port, then the sshd address and port it came in on
        assert env["ssh"].split()[2:] == [address, str(sshd.port)], env
        assert env["pwd"] == str(ROOT), env     # sshd starts a session in $HOME
        assert env["rank"] == str(rank)
        assert (env["omp"], env["mxnet"]) == ("1", "1")      # conftest sets both
        # the guard puts the workers' exit hook (launcher/_boot) first on PYTHONPATH
        assert (env["venv"], env["pythonpath"], env["ld"]) == (
            forwarded["VIRTUAL_ENV"], os.pathsep.join([BOOT_DIR, forwarded["PYTHONPATH"]]),
            forwarded["LD_LIBRARY_PATH"])
        assert (env["extra"], env["mark"]) == ("a b;$c'd", r.marker)
    assert "[worker 0@127.0.0.1] done: 8 iterations" in r.stdout, r.output
    # the launcher's figures leave the warm-up iteration out, as mxlbbsp report does
    assert re.search(r"\[mxlbbsp\] done in [\d.]+ s: 7 iterations after the warm-up",
                     r.stderr), r.output
    assert_nothing_left(sshd, r.marker)


def test_remote_python_is_what_each_host_runs(sshd, hostfile, tmp_path):
    """--remote-python: the interpreter of the pre-flight and of every role's guard on the
    hosts (--launcher ssh, as -H chooses anyway); here a wrapper that notes each start, then
    runs this one."""
    used = tmp_path / "used"
    wrapper = tmp_path / "remote-python"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {used}\nexec {PY} "$@"\n')
    wrapper.chmod(0o755)
    r = run_mxlbbsp(*launch(sshd, hostfile, "--launcher", "ssh", "--remote-python", wrapper),
                    "--", "true", timeout=180)
    assert r.rc == 0, r.output
    # the pre-flight on each host, the guards of both workers and of the server, the server
    assert sorted(used.read_text().splitlines()) == sorted(
        [f"-m mxlbbsp.launcher.guard --check {ROOT}"] * 2 + ["-m mxlbbsp.launcher.guard"] * 3
        + ["-m mxlbbsp.server"]), r.output
    assert_nothing_left(sshd, r.marker)


def test_connections_refused_by_maxstartups_are_retried(sshd, tmp_path):
    # an sshd that drops every connection beyond the first that has not logged in yet
    # (sshd's default, 10:30:100, does the same to a host with many slots)
    strict = Sshd(tmp_path / "sshd", max_startups="1:100:1")
    strict.start()
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.2 slots=3\n")
        r = run_mxlbbsp(*launch(strict, hosts), "--", *TRAIN, "--batch-size", "48",
                        "--iterations", "3", "--log-interval", "1", timeout=180)
        assert r.rc == 0, r.output
        assert "[worker 0@127.0.0.2] done: 3 iterations" in r.stdout, r.output
        assert "drop connection" in strict.log.read_text()    # it did refuse some
        assert strict.wait_no_sessions() == []
    finally:
        strict.stop()


# ---- the first failure stops every process on every host ------------------------------------

@pytest.mark.parametrize("code", [3, 255])     # 255: also ssh's own code for a lost link
def test_worker_exit_3_on_one_host_stops_the_job(sshd, hostfile, code):
    # worker 1 fails; worker 0 (with a background child in its group) waits for it forever
    failing = ('echo "probe $MXLBBSP_RANK $MXLBBSP_TEST_MARK"; '
               f'if [ "$MXLBBSP_RANK" = 1 ]; then sleep 2; exit {code}; fi; '
               'sleep 600 & exec "$@"')
    r = run_mxlbbsp(*launch(sshd, hostfile), "--", "sh", "-c", failing, "sh", *TRAIN,
                    "--epochs", "1000", timeout=60)
    assert r.rc == code, r.output
    assert r.seconds < 30, r.output
    assert f"[worker 0@127.0.0.1] probe 0 {r.marker}" in r.stdout, r.output
    assert f"[worker 1@127.0.0.2] probe 1 {r.marker}" in r.stdout, r.output
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert errors and f"worker 1 exited with code {code} on 127.0.0.2" in errors[0], r.output
    assert "mxlbbsp guard: exit" not in r.output          # the guard's line is not shown
    assert_nothing_left(sshd, r.marker)


def test_kill_9_of_a_remote_guard_is_not_called_a_lost_connection(sshd, hostfile, running):
    job = running(launch(sshd, hostfile) + ["--", *TRAIN, "--epochs", "1000"])
    job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
    guard = workers_of(job.marker, 2)[1].parent()
    assert "mxlbbsp.launcher.guard" in " ".join(guard.cmdline())
    guard.kill()                      # ssh ends with 255, but the connection never broke
    assert job.wait(30) == 255, job.output
    assert ("error: worker 1 exited on 127.0.0.2: its guard was killed, and the role with it "
            "(ssh exit 255 with the connection intact)") in job.output
    assert "lost its SSH connection" not in job.output
    assert_nothing_left(sshd, job.marker)


def test_lost_ssh_connection_stops_the_job(sshd, hostfile, running):
    job = running(launch(sshd, hostfile) + ["--", *TRAIN, "--epochs", "1000"])
    job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
    worker = workers_of(job.marker, 2)[1]
    session = session_of(sshd, worker)
    assert session is not None, "worker 1 did not run through the test sshd"
    session.kill()                              # the connection to 127.0.0.2 drops
    assert job.wait(30) == 255, job.output
    assert "error: worker 1 lost its SSH connection on 127.0.0.2 (ssh exit 255)" in job.output
    assert_nothing_left(sshd, job.marker)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_every_host(sshd, hostfile, running, sig, code):
    # a remote process tree: each worker has a child in its process group
    job = running(launch(sshd, hostfile) + ["--", "sh", "-c", 'sleep 600 & exec "$@"', "sh",
                                            *TRAIN, "--epochs", "1000"])
    job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
    workers = workers_of(job.marker, 2)
    assert all(session_of(sshd, w) for w in workers.values()), workers
    assert ["sleep", "sleep"] == [p.name() for p in processes_with(job.marker)
                                  if p.name() == "sleep"]
    job.proc.send_signal(sig)
    assert job.wait(30) == code, job.output
    assert f"{signal.Signals(sig).name}: stopping all" in job.output
    assert_nothing_left(sshd, job.marker)


def test_launcher_killed_leaves_nothing(sshd, hostfile, running):
    job = running(launch(sshd, hostfile) + ["--", *TRAIN, "--epochs", "1000"])
    job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
    assert all(session_of(sshd, w) for w in workers_of(job.marker, 2).values())
    job.proc.kill()         # no teardown: the guards notice their stdin closing
    job.wait(10)
    assert_nothing_left(sshd, job.marker)


def test_the_cpu_backstop_ends_a_plain_script_that_hangs_over_ssh(sshd, hostfile):
    # The exit hook off: worker 1 raises and hangs in ps-lite's finalize barrier, worker 0
    # in its pull. No iterations to watch: the remote guards report their workers' CPU
    # seconds, and no CPU use for the start-up floor (shrunk to 20 s) stops the job.
    script = ROOT / "tests" / "scripts" / "misbehave.py"
    r = run_mxlbbsp(*launch(sshd, hostfile), "--progress", "5",
                    "--env", "MXLBBSP_EXIT_HOOK=0", "--", "python", script, "--fail", "raise",
                    "--plain", timeout=150, env={"MXLBBSP_STALL_FLOORS": "20,4"})
    assert r.rc == 124, r.output
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "no worker used any CPU for" in errors[0], r.output
    assert re.search(r"\d+ s: 2 of 2 workers running, CPU 0%, 0%", r.stderr), r.stderr
    assert "mxlbbsp guard: cpu" not in r.output           # the guard's lines are not shown
    assert_nothing_left(sshd, r.marker)


def test_stall_timeout_leaves_a_busy_plain_script_over_ssh_alone(sshd, hostfile):
    # no iterations to watch, but CPU use: the job runs past the limit to its end (10,000
    # push/pulls with a 1 ms sleep before each: 10 s at least, twice the limit)
    script = ROOT / "tests" / "scripts" / "misbehave.py"
    r = run_mxlbbsp(*launch(sshd, hostfile, "--stall-timeout", "5"), "--", "python", script,
                    "--fail", "none", "--plain", "--iterations", "10000", "--sleep", "0.001",
                    timeout=150)
    assert r.rc == 0, r.output
    assert r.seconds > 10, r.output


def test_stall_timeout_ends_a_hung_job(sshd, hostfile, running):
    # 30 s: the limit also holds until the first iteration, which a busy 2-core machine can
    # take more than 10 s to reach (MXNet's import over two SSH sessions)
    job = running(launch(sshd, hostfile, "--stall-timeout", "30") +
                  ["--", *TRAIN, "--epochs", "1000"])
    job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
    workers_of(job.marker, 2)[1].suspend()      # a peer that hangs rather than fails
    assert job.wait(90) == 124, job.output
    assert "error: no iteration finished for 30 s (--stall-timeout" in job.output
    assert_nothing_left(sshd, job.marker)


def test_a_stopped_remote_worker_is_named_and_ends_the_job_as_locally(sshd, hostfile, running):
    """Issue 22: the remote guard says that its worker is stopped; the launcher names it in
    the progress line and ends the job after max(10 s, 20 x the median iteration), as for a
    local worker, long before the 120 s running floor."""
    job = running(launch(sshd, hostfile) + ["--progress", "2", "--", *TRAIN, "--epochs", "1000"])
    worker = None
    try:
        job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
        worker = workers_of(job.marker, 2)[1]
        worker.suspend()
        suspended = time.monotonic()
        rc = job.wait(110)
        took = time.monotonic() - suspended
    finally:
        if worker is not None:
            try:
                worker.resume()
            except psutil.Error:
                pass
    assert rc == 124, job.output
    errors = [line for line in job.lines if "error:" in line]
    assert len(errors) == 1 and "worker 1 is stopped (SIGSTOP or a debugger)" in errors[0], \
        job.output
    assert took < 100, (took, job.output)         # the 120 s running floor did not apply
    assert any("worker 1 stopped, e.g. SIGSTOP" in line for line in job.lines
               if re.search(r"\[mxlbbsp\] \d+ s: iteration", line)), job.output
    assert "mxlbbsp guard: stopped" not in job.output        # the guard's lines are not shown
    assert_nothing_left(sshd, job.marker)


def test_restarts_leave_out_a_host_that_is_gone(sshd, tmp_path, running):
    """A host dies mid-job (its sshd and every session on it stop): --restarts 1 continues
    from the latest checkpoint on the host that remains, and says so."""
    # 127.0.0.3 is served by an sshd of its own on the same port, with the same keys, so
    # that stopping it takes that host away and leaves 127.0.0.1 alone
    folder = tmp_path / "sshd3"
    folder.mkdir()
    for key in (sshd.host_key, sshd.client_key):
        for path in (key, Path(str(key) + ".pub")):
            shutil.copy(path, folder / path.name)
    gone = Sshd(folder, addresses=("127.0.0.3",), port=sshd.port)
    gone.start()
    try:
        known = tmp_path / "known_hosts"
        known.write_text(sshd.known_hosts.read_text() + gone.known_hosts.read_text())
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 slots=1\n127.0.0.3 slots=1\n")
        ckpt = tmp_path / "ckpt"
        job = running(["launch", "-H", hosts, *sshd.launch_options(known), "--progress", "0",
                       "--emulate-compute", "2", "--checkpoint-dir", ckpt,
                       "--checkpoint-every", 5, "--restarts", 1,
                       "--", PY, CKPT_SCRIPT, tmp_path, "--epochs", 6])
        deadline = time.monotonic() + 120
        while not list(ckpt.glob("ckpt-*/manifest.json")):
            assert time.monotonic() < deadline and job.proc.poll() is None, job.output
            time.sleep(0.2)
        gone.stop()
        assert job.wait(180) == 0, job.output
    finally:
        gone.stop()
    assert re.search(r"restart 1/1 from iteration \d+ on 1 worker\(s\) \(127\.0\.0\.3 "
                     r"unreachable\)", job.output), job.output
    # 6 epochs of 23 iterations: the last one, 138, on the worker that remains
    assert "[worker 0@127.0.0.1] finished at iteration 138" in job.output, job.output
    assert_nothing_left(sshd, job.marker)


# ---- pre-flight ------------------------------------------------------------------------------

@pytest.mark.parametrize("hosts, extra, needles", [
    ("127.0.0.1 slots=1\n127.0.0.3 slots=1\n", [],
     ["failed on 1 of 2 host(s)", "127.0.0.3", "Connection refused"]),
    ("127.0.0.1\n127.0.0.2\n", ["--remote-python", "/no/such/python"],
     ["failed on 2 of 2 host(s)", "127.0.0.1", "127.0.0.2", "/no/such/python not found"]),
])
def test_preflight_fails_fast_and_starts_nothing(sshd, tmp_path, hosts, extra, needles):
    path = tmp_path / "hosts"
    path.write_text(hosts)
    started = tmp_path / "started"
    r = run_mxlbbsp(*launch(sshd, path, *extra), "--", "touch", started, timeout=60)
    assert r.rc == 1, r.output
    assert r.seconds < 20, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxlbbsp launch: error: SSH pre-flight"), \
        r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "nothing was started" in lines[0]
    assert not started.exists()
    assert_nothing_left(sshd, r.marker)


# ---- secrets ---------------------------------------------------------------------------------

def test_token_is_on_no_command_line(sshd, hostfile, running):
    job = running(launch(sshd, hostfile) + ["--", *TRAIN, "--epochs", "1000"])
    job.wait_for(r"^\[worker 0@127\.0\.0\.1\] epoch 0 iteration")
    workers = workers_of(job.marker, 2)
    assert all(session_of(sshd, w) for w in workers.values()), workers
    tokens = {w.environ()["MXLBBSP_TOKEN"] for w in workers.values()}
    assert len(tokens) == 1
    token = tokens.pop()
    assert len(token) >= 16

    def command_lines_with(text):
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            if text in " ".join(p.info["cmdline"] or ()):
                found.append((p.info["pid"], p.info["cmdline"]))
        return found

    assert command_lines_with(job.marker), "the scan finds nothing (the marker is on one)"
    assert command_lines_with(token) == []
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(30) == 130, job.output
    assert_nothing_left(sshd, job.marker)


# ---- another host for real: a network namespace ----------------------------------------------

@pytest.fixture(scope="session")
def netns_host(sshd, tmp_path_factory):
    """(namespace, its sshd): a host that is not this machine as far as the network goes."""
    ns = Netns()
    reason = ns.create()
    if reason:
        pytest.skip(f"no network namespace: {reason}")
    server = Sshd(tmp_path_factory.mktemp("sshd-netns"), [ns.address], port=2222,
                  wrap=ns.exec_prefix)
    try:
        server.start()
        yield ns, server
    finally:
        server.stop()
        ns.delete()


def test_remote_host_in_a_namespace_and_a_partition(netns_host, tmp_path, running):
    ns, server = netns_host
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{ns.address} slots=2\n")
    # ssh gives up on a silent host after 2 s, the remote guards on a silent launcher after 4 s
    job = running(launch(server, hosts, "--ssh-option", "ServerAliveInterval=1",
                         "--ssh-option", "ServerAliveCountMax=2") +
                  ["--", *TRAIN, "--epochs", "1000"])
    # the scheduler and the coordinator listen on the address that faces the namespace...
    started = job.wait_for(r"^\[mxlbbsp\] started")
    assert f"scheduler {ns.host_address}:" in started, started
    assert f"coordinator {ns.host_address}:" in started, started
    # ...and the workers there, whose 127.0.0.1 is not ours, reach them
    job.wait_for(rf"^\[worker 0@{re.escape(ns.address)}\] epoch 0 iteration")
    workers = workers_of(job.marker, 2)
    ours = os.readlink("/proc/self/ns/net")
    assert [os.readlink(f"/proc/{w.pid}/ns/net") != ours for w in workers.values()] == [True] * 2
    ns.set_link(False)      # a partition: no error, no reset on either side, just silence
    try:
        assert job.wait(30) == 255, job.output
        assert f"lost its SSH connection on {ns.address} (ssh exit 255)" in job.output
        # the far side's sshd cannot tell (its sessions wait for TCP), but the guards stop
        assert wait_no_leftovers(job.marker, timeout=20) == [], "job processes left running"
        assert server.wait_no_sessions(include_sshd=False) == [], "guards left running"
    finally:
        ns.set_link(True)


def test_remote_guards_hear_the_launcher_while_the_scheduler_is_slow_to_listen(
        sshd, hostfile, tmp_path):
    """The remote guards count their silence from their start, and the launcher starts them
    at the same time as the scheduler: a scheduler slower to listen than that silence (here
    it sleeps 4 s before its import of MXNet, as on a loaded machine; keep-alives of 1 s x 1
    make the silence 2 s) must not stop them (the CI failure of stop 44)."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('DMLC_ROLE') == 'scheduler':\n    time.sleep(4)\n")
    r = run_mxlbbsp(*launch(sshd, hostfile, "--ssh-option", "ServerAliveInterval=1",
                            "--ssh-option", "ServerAliveCountMax=1",
                            "--env", f"PYTHONPATH={slow}"),
                    "--", *TRAIN, "--epochs", "1", timeout=180)
    assert r.rc == 0, r.output
    assert "no word from the launcher" not in r.output, r.output
    assert_nothing_left(sshd, r.marker)


def test_bind_address_follows_ssh_config_aliases(netns_host):
    # A hostfile name that only ssh's configuration knows (Host alias / HostName): the
    # scheduler must still listen on the address that faces the real host, not on loopback.
    from mxlbbsp.launcher import ssh
    from mxlbbsp.launcher.hostfile import Host
    ns, _ = netns_host
    alias = Host("mxlbbsp-test-alias-that-dns-does-not-know")
    opts = ssh.SshOptions(options=[("HostName", ns.address)])
    assert ssh.ssh_hostname(alias, opts) == ns.address
    assert ssh.bind_address([alias], opts) == ns.host_address
    # loopback hosts keep loopback
    assert ssh.bind_address([Host("127.0.0.2")], ssh.SshOptions()) == "127.0.0.1"


def test_over_ssh_ps_lite_itself_takes_the_interface(sshd, tmp_path):
    """With -H, no DMLC_NODE_HOST is set: ps-lite on each host reads DMLC_INTERFACE. The hosts
    are 127.0.0.1 and 127.0.0.2, where ps-lite would listen without the option."""
    from test_ps_interface import an_interface, listening_addresses
    iface, address = an_interface()
    if iface == "lo":
        pytest.skip("no non-loopback interface with an IPv4 address")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    marker = uuid.uuid4().hex
    found = listening_addresses(["-H", hosts, *sshd.launch_options(), "-s", 2,
                                 "--ps-interface", iface], marker)
    assert len(found) >= 6, found        # launcher, scheduler, 2 servers, 2 workers
    assert all(addrs == {address} for addrs in found.values()), (iface, found)
    assert wait_no_leftovers(marker) == []
    assert sshd.wait_no_sessions() == []


def test_an_inline_host_list_and_local_ranks_over_two_hosts(sshd, tmp_path):
    """`-H 127.0.0.1:2,127.0.0.2:1` (horovodrun's form, no hostfile): two workers on the
    first host, one on the second, each told its index among the job's workers on its host."""
    out = tmp_path / "argv"
    probe = ROOT / "tests" / "scripts" / "argv_probe.py"
    r = run_mxlbbsp("launch", "-H", "127.0.0.1:2,127.0.0.2:1", *sshd.launch_options(),
                    "--progress", "0", PY, probe, out, "--lr", "0.1", timeout=180)
    assert r.rc == 0, r.output
    got = [json.loads((tmp_path / f"argv.{rank}.json").read_text()) for rank in range(3)]
    assert [(p["rank"], p["local_rank"], p["local_size"]) for p in got] == [
        (0, 0, 2), (1, 1, 2), (2, 0, 1)]
    assert [p["argv"] for p in got] == [["--lr", "0.1"]] * 3
    assert_nothing_left(sshd, r.marker)


def test_two_hosts_of_two_workers_train_through_their_relays(sshd, tmp_path, running):
    """Issue 26 at its smallest: 2 emulated hosts x 2 workers over SSH, each host's workers
    behind its relay (started over SSH under a guard, like every role); the metrics load
    in `mxlbbsp report`. Then a relay killed on 127.0.0.2 ends the next job, named with its
    host."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")
    metrics = tmp_path / "m.jsonl"
    r = run_mxlbbsp(*launch(sshd, hosts, "--metrics", metrics, "--relay", "on"), "--", *TRAIN,
                    "--batch-size", "32", "--iterations", "10", "--log-interval", "0",
                    timeout=240)
    assert r.rc == 0, r.output
    assert "started 4 worker(s), 2 relay(s) and 1 server(s)" in r.stderr, r.output
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(x["iteration"], x["rank"]) for x in rows] == [(t, k) for t in range(10)
                                                         for k in range(4)]
    assert {x["host"] for x in rows} == {"127.0.0.1", "127.0.0.2"}
    report = run_mxlbbsp("report", metrics, "-o", tmp_path / "report", timeout=180)
    assert report.rc == 0, report.output
    assert (tmp_path / "report" / "index.html").exists()
    assert_nothing_left(sshd, r.marker)

    job = running(launch(sshd, hosts) + ["--progress", "1", "--relay", "on", "--", *TRAIN,
                                         "--epochs", "1000"])
    job.wait_for(r"started 4 worker\(s\), 2 relay\(s\)")
    job.wait_for(r"\[mxlbbsp\] \d+ s: iteration [1-9]", timeout=180)
    relay = next(p for p in processes_with(job.marker)
                 if "mxlbbsp.relay" in " ".join(p.cmdline())
                 and p.environ().get("MXLBBSP_HOST") == "127.0.0.2")
    relay.kill()
    assert job.wait(120) == 137, job.output
    errors = [line for line in job.lines if "error:" in line]
    assert len(errors) == 1, job.output
    assert "the relay of 127.0.0.2 was killed by SIGKILL" in errors[0], job.output
    assert "on 127.0.0.2" in errors[0], job.output
    assert_nothing_left(sshd, job.marker)


@pytest.mark.parametrize("command, needle", [
    (["./script.sh"], "permission denied: './script.sh' is not executable; make it executable"),
    (["python", "no_such_script.py"], "python: can't open file 'no_such_script.py': no such "
                                      "file"),
])
def test_a_command_that_cannot_run_on_a_remote_host_is_named(sshd, tmp_path, command, needle):
    """Over SSH the launcher cannot look at the command's host: the guard there refuses it
    (exit 2) and the launcher's line says why."""
    (tmp_path / "script.sh").write_text("#!/bin/sh\nexit 0\n")     # not executable
    r = run_mxlbbsp("launch", "-H", "127.0.0.2:1", *sshd.launch_options(), "--progress", "0",
                    "--", *command, cwd=tmp_path, timeout=120)
    assert r.rc == 2, r.output
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.output
    assert f"error: worker 0 exited with code 2 on 127.0.0.2: {needle}" in errors[0]
    assert f"(on {os.uname().nodename}, in {tmp_path})" in errors[0]
    assert "Traceback" not in r.output
    assert_nothing_left(sshd, r.marker)
