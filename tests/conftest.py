"""Shared test helpers: real processes, a unique marker per job, and a leftover check.

Every job a test starts gets ``MXLBBSP_TEST_MARK=<uuid>`` in its environment (``--env``
forwards it to every process of the job, over SSH too); after the job, no process on this
machine may still carry that marker.
"""
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from hypothesis import settings

# Property tests (tests/test_props_*.py, tests/test_balancer.py) draw their examples from a
# seed: in `make test` the fixed one below, the same examples on every run and in CI; `make
# test-props` gives a new one (--hypothesis-seed) and the profile "props", 25 times the
# examples (a slow property fewer: tests/props.py's share). Either way the seed is printed
# (header and summary): `make test-props SEED=N` draws a run's examples again. No example
# database in `make test`: what it runs is the seed's examples and the tests' own
# @example's, nothing a previous run left behind.
HYPOTHESIS_SEED = 0
settings.register_profile("seeded", max_examples=40, deadline=None, database=None)
settings.register_profile("props", max_examples=1000, deadline=None)
settings.load_profile("seeded")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_gluon.py"
PY = sys.executable

# 2 cores: one thread per process, in this process and in every child.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
os.environ["PATH"] = os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # before hypothesis's own plugin reads it: a run without --hypothesis-seed is seeded too
    if config.getoption("--hypothesis-seed") is None:
        config.option.hypothesis_seed = str(HYPOTHESIS_SEED)


def _hypothesis_line(config) -> str:
    return (f"hypothesis: seed {config.getoption('--hypothesis-seed')}, profile "
            f"{settings._current_profile!r} ({settings.default.max_examples} examples per "
            "property, times its share in tests/props.py)")


def pytest_report_header(config):
    return _hypothesis_line(config)


def pytest_terminal_summary(terminalreporter, config):
    terminalreporter.write_line(_hypothesis_line(config))


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    marker: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def processes_with(marker: str):
    """Processes on this machine whose environment carries ``marker``."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("MXLBBSP_TEST_MARK") == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(p) -> bool:
    """Not a zombie, and still there (a process of a dying job may go between the calls)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def wait_no_leftovers(marker: str, timeout: float = 10.0):
    """[] once nothing carries the marker; else what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in processes_with(marker) if _alive(p)]
        if not left or time.monotonic() > deadline:
            return [(p.pid, " ".join(p.cmdline())) for p in left]
        time.sleep(0.2)


def newest_checkpoint(directory) -> int:
    """The iteration of the newest complete checkpoint in ``directory`` (-1: none yet), as
    the launcher finds it (mxlbbsp.core.store.latest). A test waits for "one from iteration
    t on", never for one by name: only the newest two are kept, and a loaded machine can
    look after the one named is gone."""
    from mxlbbsp.core import store
    path = store.latest(str(directory))
    return -1 if path is None else int(store.read_manifest(path)["iteration"])


def in_threads(make, n, timeout=20.0):
    """``make(r)`` for r in 0..n-1, each in a thread of its own, all at once (workers'
    sessions: registration waits for every worker); (results by r, the exceptions raised)."""
    import threading
    out, errors = [None] * n, []

    def one(r):
        try:
            out[r] = make(r)
        except BaseException as exc:  # noqa: BLE001 - collected for the test
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out, errors


def mxlbbsp_argv(*args):
    return [PY, "-m", "mxlbbsp.launcher", *map(str, args)]


def run_mxlbbsp(*args, timeout=300, env=None, cwd=ROOT, marker=None, check_leftovers=True):
    """Run the ``mxlbbsp`` command to its end; the job's processes carry a fresh marker."""
    marker = marker or uuid.uuid4().hex
    args = list(map(str, args))
    if args and args[0] == "launch":
        args = ["launch", "--env", f"MXLBBSP_TEST_MARK={marker}", *args[1:]]
    full_env = dict(os.environ, MXLBBSP_TEST_MARK=marker, **(env or {}))
    started = time.monotonic()
    proc = subprocess.run(mxlbbsp_argv(*args), capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd, stdin=subprocess.DEVNULL)
    result = Result(proc.returncode, proc.stdout, proc.stderr, marker,
                    time.monotonic() - started)
    if check_leftovers:
        left = wait_no_leftovers(marker)
        assert not left, f"processes left running after the job: {left}"
    return result


@pytest.fixture
def mxlbbsp():
    return run_mxlbbsp
