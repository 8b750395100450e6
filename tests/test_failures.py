"""A job never hangs (issue 10, items 1-5): each failure ends the job, names its cause, and
leaves nothing behind. Real schedulers, servers and workers on loopback.

The wall-clock bounds only prove that the job ends (a hang would run into them); the
launcher's own output says how fast. Each job is small: -n 2, -s 1, a 3-weight model.
"""
import glob
import os
import re
import subprocess
import time
import uuid

import psutil
import pytest

from conftest import PY, ROOT, mxlbbsp_argv, processes_with, run_mxlbbsp, wait_no_leftovers

pytestmark = pytest.mark.cluster

SCRIPT = ROOT / "tests" / "scripts" / "misbehave.py"
#: the bound that proves a job ends: far beyond what a failure takes, far below a hang
BOUND = 150


def launch(*script_args, n=2, env=None):
    return run_mxlbbsp("launch", "-n", n, "-s", 1, "--progress", "2", "--", PY, SCRIPT,
                       *script_args, timeout=BOUND, env=env)


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("[mxlbbsp] error")]


def one_error(result, rc):
    """The job ended with ``rc`` and said why in exactly one error line: that line."""
    assert result.rc == rc, result.output
    errors = error_lines(result)
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.mark.parametrize("plain", [False, True], ids=["mxlbbsp-api", "plain-kvstore"])
def test_an_exception_ends_the_job_and_names_the_worker_and_the_exception(plain):
    r = launch("--fail", "raise", *(["--plain"] if plain else []))
    assert "worker 1 exited with code 1: RuntimeError: boom at iteration 5" in one_error(r, 1)
    assert "[worker 1] Traceback (most recent call last):" in r.stderr   # printed as usual
    assert "mxlbbsp-exit-hook" not in r.output                             # the marker is ours
    if plain:   # a plain script never says "waiting for the first iteration"; its progress
        # lines, if the job lasted long enough for one (not asserted: timing), count workers
        assert "waiting for the first iteration" not in r.stderr
        progress = [line for line in r.stderr.splitlines()
                    if re.match(r"\[mxlbbsp\] \d+ s: ", line)]
        assert all(re.search(r"\d+ s: \d of 2 workers? running", line) for line in progress), \
            progress


def test_a_script_with_its_own_excepthook_ends_the_job_too():
    r = launch("--fail", "raise", "--plain", "--own-excepthook")
    assert "worker 1 exited with code 1: RuntimeError: boom at iteration 5" in one_error(r, 1)
    assert "[worker 1] my handler: RuntimeError: boom at iteration 5" in r.stderr


def test_the_backstop_ends_a_plain_script_that_hangs_anyway():
    # The exit hook off: the failed worker hangs in ps-lite's finalize barrier, the other
    # in its pull. No iterations to watch, so the stall is: no worker uses any CPU for the
    # start-up floor (shrunk from 300 s to 20 s through MXLBBSP_STALL_FLOORS).
    r = run_mxlbbsp("launch", "-n", 2, "-s", 1, "--progress", "5",
                    "--env", "MXLBBSP_EXIT_HOOK=0", "--", PY, SCRIPT, "--fail", "raise",
                    "--plain", timeout=BOUND, env={"MXLBBSP_STALL_FLOORS": "20,4"})
    assert "no worker used any CPU for" in one_error(r, 124)
    assert re.search(r"\d+ s: 2 of 2 workers running, CPU 0%, 0%", r.stderr), r.stderr


def test_a_non_zero_sys_exit_ends_the_job_with_its_code():
    r = launch("--fail", "exit3", "--plain")
    assert r.rc == 3, r.output
    assert "worker 1 exited with code 3: SystemExit: 3" in error_lines(r)[0]


def test_raise_systemexit_ends_the_job_with_its_code():
    r = launch("--fail", "systemexit3")
    assert r.rc == 3, r.output
    assert "worker 1 exited with code 3: SystemExit: 3" in error_lines(r)[0]


def test_workers_with_different_iteration_counts_end_the_job_with_one_line():
    r = launch("--fail", "stop", "--iterations", "10")
    error = one_error(r, 1)
    assert "worker 1 ended after iteration 4 while worker 0 went on to iteration 5" in error
    assert "every worker must run the same number of iterations" in error
    assert "use the DataLoader's epochs" in error


def test_a_plain_script_with_uneven_iteration_counts_ends_soon_after_the_first_end():
    """Issue 22: worker 1 (no mxlbbsp API) ends its script after 5 of 10 iterations while
    worker 0 waits in its push/pull; before, only the 300 s start-up floor ended the job."""
    job = Running(["-n", 2, "-s", 1, "--progress", "5", "--", PY, SCRIPT, "--plain",
                   "--fail", "stop", "--iterations", 10])
    try:
        job.wait_for(r"\[worker 1\] rank 1 finished after")
        ended = time.monotonic()
        rc = job.finish()
        took = time.monotonic() - ended
    finally:
        job.close()
    assert rc == 1, job.output
    errors = [line for line in job.lines if "error:" in line]
    assert len(errors) == 1, job.output
    assert re.search(r"error: worker 1 ended normally (\d+) s ago \(its script returned\), "
                     r"while worker 0 still runs", errors[0]), errors[0]
    assert int(re.search(r"ended normally (\d+) s ago", errors[0])[1]) <= 30, errors[0]
    assert "every worker must run the same number of iterations" in errors[0]
    assert took < BOUND / 2, (took, job.output)       # the 300 s floor did not apply
    assert "mxlbbsp-exit-hook" not in job.output
    assert any("worker 1 ended its script and waits for the others" in line
               for line in job.lines), job.output
    assert wait_no_leftovers(job.marker) == []


@pytest.mark.parametrize("busy, linger", [(True, 28), (False, 8)], ids=["busy", "asleep"])
def test_a_worker_that_ends_first_is_not_failed_while_the_other_finishes(busy, linger):
    """Worker 0 ends its script first; worker 1 spends ``linger`` s more after the same
    iterations: computing (longer than the 20 s the launcher waits without CPU use), or asleep
    (shorter). Both end normally, and so does the job."""
    r = launch("--plain", "--fail", "none", "--iterations", 10, "--linger", linger,
               *(["--busy"] if busy else []))
    assert r.rc == 0, r.output
    assert f"[worker 1] rank 1 lingered {linger:g} s" in r.stdout, r.output
    assert r.seconds > linger, r.output
    assert not error_lines(r), r.output


class Running:
    """A job in the background, with its output collected line by line."""

    def __init__(self, args, env=None):
        self.marker = uuid.uuid4().hex
        full = dict(os.environ, MXLBBSP_TEST_MARK=self.marker, **(env or {}))
        self.proc = subprocess.Popen(
            mxlbbsp_argv("launch", "--env", f"MXLBBSP_TEST_MARK={self.marker}", *map(str, args)),
            cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL)
        self.lines = []
        import threading
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=BOUND):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.output, re.M):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in:\n{self.output}")

    def worker(self, rank, timeout=60):
        """The worker process of ``rank`` (the user's command, not its guard)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in processes_with(self.marker):
                try:
                    if p.environ().get("MXLBBSP_RANK") == str(rank) and \
                            str(SCRIPT) in " ".join(p.cmdline()):
                        return p
                except psutil.Error:
                    continue
            time.sleep(0.2)
        raise AssertionError(f"no worker {rank}:\n{self.output}")

    def finish(self, timeout=BOUND):
        try:
            rc = self.proc.wait(timeout)
        finally:
            self.close()
        return rc

    def close(self):
        """Stop the job if it still runs (a failed test): the launcher tears it down."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def test_a_frozen_worker_is_caught_by_default():
    # Default stall detection, its floors shrunk through MXLBBSP_STALL_FLOORS (start-up 60 s,
    # running 4 s, instead of 300 s and 120 s) so that the test runs in seconds.
    job = Running(["-n", 2, "-s", 1, "--progress", "2", "--", PY, SCRIPT, "--fail", "none",
                   "--iterations", 100000, "--sleep", "0.2"],
                  env={"MXLBBSP_STALL_FLOORS": "60,4"})
    rc, _ = stop_worker_1(job)
    assert rc == 124, job.output
    stall = [line for line in job.lines if "error: no iteration finished" in line]
    assert len(stall) == 1, job.output
    assert "20 x the median iteration time" in stall[0]
    assert "worker 1 never sent its report of iteration" in stall[0] or \
        re.search(r"push/pull of workers? [0-9, ]*1", stall[0]), stall[0]
    assert "worker 1 stopped" in stall[0]
    assert "server" not in stall[0].split("(")[0]
    assert wait_no_leftovers(job.marker) == []


def stop_worker_1(job):
    """SIGSTOP worker 1 once the job runs; (the launcher's exit code, seconds from the stop to
    the end). Whatever happens, every process of the job is resumed and the job closed."""
    try:
        job.wait_for(r"iteration \d+, [\d.]+ samples/s")
        job.worker(1).suspend()
        suspended = time.monotonic()
        rc = job.finish()
        return rc, time.monotonic() - suspended
    finally:
        for p in processes_with(job.marker):
            try:
                p.resume()
            except psutil.Error:
                pass
        job.close()


def test_a_stopped_worker_is_named_and_ends_the_job_long_before_the_running_floor():
    """Issue 22: with the default floors (120 s while running), a worker known to be stopped
    ends the job after max(10 s, 20 x the median iteration time), naming it."""
    job = Running(["-n", 2, "-s", 1, "--progress", "2", "--", PY, SCRIPT, "--fail", "none",
                   "--iterations", 100000, "--sleep", "0.1"])
    rc, took = stop_worker_1(job)
    assert rc == 124, job.output
    errors = [line for line in job.lines if "error:" in line]
    assert len(errors) == 1 and "worker 1 is stopped (SIGSTOP or a debugger)" in errors[0], \
        job.output
    assert took < 100, took          # the 120 s running floor did not apply
    assert any("worker 1 stopped, e.g. SIGSTOP" in line for line in job.lines
               if "no iteration finished for" in line and "error" not in line), job.output
    assert wait_no_leftovers(job.marker) == []


def test_kill_9_of_a_guard_ends_its_role_and_the_job():
    job = Running(["-n", 2, "-s", 1, "--progress", "0", "--", PY, SCRIPT, "--fail", "none",
                   "--iterations", 100000, "--sleep", "0.05"])
    try:
        job.wait_for(r"\[mxlbbsp\] started 2 worker")
        worker = job.worker(1)
        guard = worker.parent()
        assert "mxlbbsp.launcher.guard" in " ".join(guard.cmdline())
        guard.kill()
        rc = job.finish()
    finally:
        job.close()
    assert rc == 137, job.output
    assert "error: worker 1 exited with code 137: its guard was killed (SIGKILL)" in job.output
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert wait_no_leftovers(job.marker) == []


def relay_sockets() -> set:
    """The relays' socket files on this machine now (launcher/roles.py: SOCKET_DIR)."""
    return set(glob.glob("/tmp/mxlbbsp-*.sock"))


def relay_of(job):
    """The job's relay process (psutil)."""
    return next(p for p in processes_with(job.marker)
                if " -m mxlbbsp.relay" in " ".join(p.cmdline()) and "hub" not in " ".join(p.cmdline()))


def _killed_mid_run(options: list, started: str, pick):
    """A job of 2 workers with ``options`` that runs until killed: once the launcher said
    ``started`` (a pattern) and an iteration went by, the process ``pick(job)`` is killed
    with -9. The job (closed), its exit code, and the launcher's error lines."""
    job = Running(["-n", 2, "-s", 1, "--progress", "1", *options, "--", PY, SCRIPT,
                   "--fail", "none", "--iterations", 100000, "--sleep", "0.05"])
    try:
        job.wait_for(started)
        job.wait_for(r"\[mxlbbsp\] \d+ s: iteration [1-9]")    # the job runs through it
        pick(job).kill()
        rc = job.finish()
    finally:
        job.close()
    return job, rc, [line for line in job.lines if "error:" in line and "[mxlbbsp]" in line]


class _SeenLate:
    """The relay killed while its guard is stopped for 1.5 s: the guard reports the relay's
    end only then, after the relay's workers ended on their lost connection (as over SSH,
    where their exits may come in first)."""

    def __init__(self, relay):
        self.relay = relay

    def kill(self):
        guard = self.relay.parent()
        guard.suspend()
        try:
            self.relay.kill()
            time.sleep(1.5)
        finally:
            guard.resume()


@pytest.mark.parametrize("what", ["relay", "guard", "relay seen late"])
def test_a_killed_relay_ends_the_job_naming_its_host(what):
    """Issue 26: the host's relay (--relay on: two workers on this host) killed with -9,
    itself or its guard, or itself with its end reported after its workers' (they lost
    their connection): the job ends with one line that names it and its host, not its
    workers' lost connections, and leaves nothing behind."""
    sockets_before = relay_sockets()
    pick = {"relay": relay_of, "guard": lambda job: relay_of(job).parent(),
            "relay seen late": lambda job: _SeenLate(relay_of(job))}[what]
    job, rc, errors = _killed_mid_run(
        ["--relay", "on"], r"\[mxlbbsp\] started 2 worker\(s\), 1 relay\(s\)", pick)
    assert rc == 137, job.output
    assert len(errors) == 1, job.output
    said = ("the relay of localhost exited with code 137: its guard was killed (SIGKILL)"
            if what == "guard" else "the relay of localhost was killed by SIGKILL")
    assert said in errors[0], job.output
    assert wait_no_leftovers(job.marker) == []
    assert relay_sockets() <= sockets_before     # nor its socket


def test_a_killed_hub_ends_the_job_naming_it():
    """Issue 26: the hub between the relays and the coordinator (--hubs on) killed with -9:
    the job ends with one line that names it and the hosts of its relays, and leaves
    nothing behind."""
    job, rc, errors = _killed_mid_run(
        ["--relay", "on", "--hubs", "on"],
        r"\[mxlbbsp\] started 2 worker\(s\), 1 relay\(s\) through 1 hub\(s\)",
        lambda job: next(p for p in processes_with(job.marker)
                         if "mxlbbsp.relay.hub" in " ".join(p.cmdline())))
    assert rc == 137, job.output
    assert len(errors) == 1, job.output
    assert "hub 0 (the relays of hosts localhost) was killed by SIGKILL" in errors[0], job.output
    assert wait_no_leftovers(job.marker) == []


def test_a_relay_killed_before_its_workers_connected_leaves_no_socket():
    """The relay's guard killed with -9 while the relay still waits for its workers (they
    never connect: `sleep`): the relay dies with its guard, before it could remove its
    socket file; the launcher removes it (a relay on this machine)."""
    before = relay_sockets()
    job = Running(["-n", 2, "-s", 1, "--progress", "0", "--relay", "on", "--", "sleep", "600"])
    try:
        job.wait_for(r"\[mxlbbsp\] started 2 worker\(s\), 1 relay\(s\)")
        deadline = time.monotonic() + 30
        while not relay_sockets() - before:
            assert time.monotonic() < deadline, "the relay never listened"
            time.sleep(0.1)
        relay_of(job).parent().kill()
        rc = job.finish()
    finally:
        job.close()
    assert rc == 137, job.output
    assert wait_no_leftovers(job.marker) == []
    assert relay_sockets() <= before


# ---- the stall limit and its option (no processes) -------------------------------------------

def test_the_automatic_stall_limit_follows_the_jobs_own_iteration_times():
    from mxlbbsp.launcher.watch import STALL_MEDIANS, stall_limit
    floors = (300.0, 120.0)
    assert stall_limit(None, floors, -1, None) == 300.0           # until the first iteration
    assert stall_limit(None, floors, 5, 0.5) == 120.0             # fast iterations: the floor
    assert stall_limit(None, floors, 5, 30.0) == STALL_MEDIANS * 30.0
    assert stall_limit(45.0, floors, 5, 30.0) == 45.0             # --stall-timeout 45
    assert stall_limit(0.0, floors, 5, 30.0) is None              # --stall-timeout 0 / off


@pytest.mark.parametrize("value, expected", [(None, None), ("off", 0.0), ("OFF", 0.0),
                                             ("0", 0.0), ("45", 45.0)])
def test_stall_timeout_option(value, expected):
    from click.testing import CliRunner
    from mxlbbsp.launcher import cli, job
    seen = {}

    class Probe:
        def __init__(self, config):
            seen["stall"] = config.stall_timeout
            self.config, self.resume_from = config, None

        def run(self):
            return 0
    args = ["launch", "-n", "1"] + ([] if value is None else ["--stall-timeout", value])
    original = job.Job
    job.Job = Probe
    try:
        result = CliRunner().invoke(cli.cli, args + ["--", PY, "-c", "pass"])
    finally:
        job.Job = original
    assert result.exit_code == 0, result.output
    assert seen["stall"] == expected


@pytest.mark.parametrize("value", ["-1", "soon"])
def test_a_bad_stall_timeout_is_one_line_exit_2(value):
    r = run_mxlbbsp("launch", "-n", 1, "--stall-timeout", value, "--", PY, "-c", "pass")
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxlbbsp launch: error: --stall-timeout")


def test_the_stall_floors_variable_is_checked():
    from mxlbbsp.core import env as _env
    assert _env.stall_floors({}) == _env.DEFAULT_STALL_FLOORS
    assert _env.stall_floors({_env.STALL_FLOORS: "20,3"}) == (20.0, 3.0)
    for bad in ("20", "a,b", "0,3", "nan,3"):
        with pytest.raises(_env.EnvError):
            _env.stall_floors({_env.STALL_FLOORS: bad})


def test_the_progress_line_shows_no_stale_speed_when_nothing_advances():
    from mxlbbsp.control.coordinator import Progress
    from mxlbbsp.launcher.progress import progress_line
    now = time.monotonic()
    moving = Progress(40, 2560, now, 123.4, [40, 24], 0.5)
    still = Progress(40, 2560, now - 60, 123.4, [40, 24], 0.5)
    assert progress_line(30.0, moving, 2, 2, 2, [], [], now) == \
        "30 s: iteration 40, 123.4 samples/s, batch sizes 40,24"
    assert progress_line(90.0, still, 2, 2, 2, [], [], now) == \
        "90 s: iteration 40, no iteration finished for 60 s, batch sizes 40,24"
