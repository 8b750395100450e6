"""The guard (``python -m mxlbbsp.launcher.guard``) on its own: spec on stdin, environment,
exit code. Real processes, no launcher."""
import json
import os
import subprocess
import sys

import pytest

from mxlbbsp.launcher.guard import CPU, STARTED

PRINT_OMP = "import os; print('OMP=' + os.environ.get('OMP_NUM_THREADS', '-'))"


def run_guard(spec_env: dict, parent_env: dict, cpus=None, code=PRINT_OMP,
              **more) -> subprocess.CompletedProcess:
    spec = {"argv": [sys.executable, "-c", code], "env": spec_env, "cwd": os.getcwd(), **more}
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(parent_env)
    pre = []
    if cpus is not None:
        pre = ["taskset", "-c", ",".join(map(str, cpus))]
    # stdin stays open while the command runs: its end would mean "the launcher is gone"
    with subprocess.Popen(pre + [sys.executable, "-m", "mxlbbsp.launcher.guard"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as proc:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()
        proc.stdin.close()
        return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.read(),
                                           proc.stderr.read())


def omp_of(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == STARTED
    return [ln for ln in lines if ln.startswith("OMP=")][0][4:]


def test_guard_divides_the_cores_of_its_own_host():
    cores = len(os.sched_getaffinity(0))
    assert omp_of(run_guard({"MXLBBSP_SHARE_CORES": "1"}, {})) == str(cores)
    # more processes than cores: at least one thread each
    assert omp_of(run_guard({"MXLBBSP_SHARE_CORES": str(cores + 5)}, {})) == "1"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not os.path.exists("/usr/bin/taskset"),
                    reason="needs 2 cores and taskset")
def test_guard_counts_the_cores_it_may_use_not_the_launch_machines():
    # a host with fewer cores: the guard runs restricted to one core
    assert omp_of(run_guard({"MXLBBSP_SHARE_CORES": "1"}, {}, cpus=[0])) == "1"


def test_an_explicit_omp_num_threads_wins():
    assert omp_of(run_guard({"MXLBBSP_SHARE_CORES": "1", "OMP_NUM_THREADS": "7"}, {})) == "7"
    assert omp_of(run_guard({"MXLBBSP_SHARE_CORES": "1"}, {"OMP_NUM_THREADS": "5"})) == "5"
    assert omp_of(run_guard({}, {})) == "-"          # nothing asked, nothing set


#: busy for 1.5 s of CPU in a child process (the group's time counts, not the leader's
#: alone), then idle for 1.5 s
BUSY_CHILD = ("import subprocess, sys, time\n"
              "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
              "while time.process_time() - t < 1.5: pass'])\n"
              "time.sleep(1.5)")


def test_the_guard_reports_its_commands_cpu_seconds_when_asked():
    res = run_guard({}, {}, code=BUSY_CHILD, cpu_every=0.25)
    assert res.returncode == 0, res.stderr
    reports = [float(ln[len(CPU):]) for ln in res.stdout.splitlines() if ln.startswith(CPU)]
    assert len(reports) >= 6, res.stdout
    assert reports == sorted(reports)                       # CPU time only grows
    assert 1.3 <= reports[-1] <= 3.0, reports               # the child's 1.5 s, reaped
    idle = reports[-3:]                                     # the last 0.5 s: asleep
    assert idle[-1] - idle[0] < 0.1, reports


def test_the_guard_says_nothing_of_cpu_unless_asked():
    res = run_guard({}, {}, code=BUSY_CHILD)
    assert res.returncode == 0 and CPU not in res.stdout, res.stdout


def test_the_launcher_takes_the_cpu_lines_and_shows_the_rest():
    # a stand-in for a remote guard: a CPU line alone, and one written after a partial line
    # of the command's (its newline not written yet)
    import io
    from mxlbbsp.launcher.guard import EXITED
    from mxlbbsp.launcher.procs import Output, RoleProcess
    fake = (f"import sys, time\nsys.stdin.readline()\nw = sys.stdout.write\n"
            f"w('{STARTED}\\n'); w('{CPU} 1.25\\n'); w('half'); w('{CPU} 2.50\\n')\n"
            f"w('line\\n'); w('{EXITED} 0\\n'); sys.stdout.flush()\n")
    out, err = io.StringIO(), io.StringIO()
    role = RoleProcess("worker", 0, "h", ["true"], {}, os.getcwd(),
                       [sys.executable, "-c", fake], Output(stdout=out, stderr=err),
                       cpu_every=1.0)
    assert role.spec["cpu_every"] == 1.0
    role.start()
    assert role.wait(30) == 0
    role.finish_output()
    assert out.getvalue() == "[worker 0] half\n[worker 0] line\n"
    assert role.said.cpu_report[1] == 2.5 and role.cpu_sample() == role.said.cpu_report


STOPS_ITSELF = ("import os, signal, subprocess, sys, time\n"
                "time.sleep(0.5)\n"
                "subprocess.Popen(['sh', '-c', 'sleep 1.5; kill -CONT %d' % os.getpid()])\n"
                "os.kill(os.getpid(), signal.SIGSTOP)\n"
                "time.sleep(0.5)\n"
                "print('resumed', flush=True)\n")


def test_the_guard_says_when_its_command_is_stopped_and_runs_again():
    from mxlbbsp.launcher.guard import CONTINUED, STOPPED
    res = run_guard({}, {}, code=STOPS_ITSELF, cpu_every=5.0)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln in (STOPPED, CONTINUED, "resumed")]
    assert lines == [STOPPED, CONTINUED, "resumed"], res.stdout


def test_the_guard_says_nothing_of_stops_unless_asked():
    from mxlbbsp.launcher.guard import STOPPED
    res = run_guard({}, {}, code=STOPS_ITSELF)
    assert res.returncode == 0 and STOPPED not in res.stdout, res.stdout


def test_the_launcher_takes_the_state_lines_and_the_exit_hooks_end():
    # a stand-in for a remote guard and its worker: stopped (a line written after a partial
    # line of the command's), then the worker's normal end
    import io
    from mxlbbsp.launcher.guard import CONTINUED, EXITED, STOPPED
    from mxlbbsp.launcher.procs import Output, RoleProcess
    from mxlbbsp.launcher.said import ENDED_MARKER
    fake = (f"import sys, time\nsys.stdin.readline()\nw = sys.stdout.write\n"
            f"w('{STARTED}\\n'); w('half'); w('{STOPPED}\\n'); sys.stdout.flush()\n"
            f"time.sleep(3)\n"
            f"w('line\\n'); w('{CONTINUED}\\n'); sys.stdout.flush()\n"
            f"sys.stderr.write('{ENDED_MARKER}\\n'); sys.stderr.flush()\n"
            f"time.sleep(3)\n"
            f"w('{EXITED} 0\\n'); sys.stdout.flush()\n")
    out, err = io.StringIO(), io.StringIO()
    role = RoleProcess("worker", 0, "h", ["true"], {}, os.getcwd(),
                       [sys.executable, "-c", fake], Output(stdout=out, stderr=err),
                       cpu_every=1.0)
    role.start()
    seen = []
    while role.poll() is None:
        seen.append((role.stopped(), role.said.ended_at is not None))
        role.wait(0.1)
    role.finish_output()
    assert role.wait(1) == 0
    assert out.getvalue() == "[worker 0] half\n[worker 0] line\n"
    assert err.getvalue() == ""
    assert (True, False) in seen and (False, True) in seen, seen
    assert seen.index((True, False)) < seen.index((False, True))
    assert not role.stopped()                                   # it ended


def _started_guard(spec):
    proc = subprocess.Popen([sys.executable, "-m", "mxlbbsp.launcher.guard"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(spec) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == STARTED
    return proc


def _wait_for(predicate, seconds=10.0):
    import time
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("who", ["guard", "command"])
def test_sigterm_to_a_preemptible_role_is_a_notice(tmp_path, who):
    """An elastic job's role (spec ``preemptible``): SIGTERM to the guard, or to the command
    (a worker, through the exit hook), is said once and the command runs on; the launcher's
    end (stdin closed) still stops it at once (SIGUSR2)."""
    import signal
    import time
    from mxlbbsp.launcher.guard import PREEMPTED
    pid_file = tmp_path / "pid"
    code = (f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n")
    proc = _started_guard({"argv": [sys.executable, "-c", code], "cwd": os.getcwd(),
                           "boot": True, "preemptible": True, "grace": 5})
    try:
        _wait_for(pid_file.exists)
        _wait_for(lambda: pid_file.read_text() != "")
        child = int(pid_file.read_text())
        target = proc.pid if who == "guard" else child
        os.kill(target, signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None
        os.kill(child, 0)                              # still running
        started = time.monotonic()
        proc.stdin.close()                             # the launcher is done with it
        assert proc.wait(timeout=10) == 128 + signal.SIGUSR2
        assert time.monotonic() - started < 4          # not the grace: SIGUSR2 ends it
        out, err = proc.stdout.read(), proc.stderr.read()
        if who == "guard":
            assert out.splitlines().count(PREEMPTED) == 1, out
        else:
            assert err.splitlines().count("mxlbbsp-exit-hook: preempted") == 1, err
    finally:
        proc.kill()


def test_sigterm_to_a_plain_role_still_stops_it(tmp_path):
    import signal
    proc = _started_guard({"argv": [sys.executable, "-c", "import time; time.sleep(60)"],
                           "cwd": os.getcwd(), "boot": True, "grace": 5})
    try:
        import time
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        proc.kill()
