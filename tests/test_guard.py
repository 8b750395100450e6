"""The guard (``python -m mxlbbsp.launcher.guard``) on its own: spec on stdin, environment,
exit code. Real processes, no launcher."""
import json
import os
import subprocess
import sys

import pytest

from mxlbbsp.launcher.guard import STARTED

PRINT_OMP = "import os; print('OMP=' + os.environ.get('OMP_NUM_THREADS', '-'))"


def run_guard(spec_env: dict, parent_env: dict, cpus=None) -> subprocess.CompletedProcess:
    spec = {"argv": [sys.executable, "-c", PRINT_OMP], "env": spec_env, "cwd": os.getcwd()}
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
