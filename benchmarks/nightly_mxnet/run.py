"""MXNet 1.9.1's own distributed-kvstore nightly tests, under `mxlbbsp launch` and under a plain
launcher that only sets the DMLC_* variables (as MXNet's tools/launch.py --launcher local).

    .venv/bin/python benchmarks/nightly_mxnet/run.py [-n 7] [--timeout 600] [--only SUBSTR]

The test scripts in this folder (dist_sync_kvstore.py, dist_async_kvstore.py and the
test_kvstore.py they import) are copied unchanged, license headers intact, from the 1.9.1
tag of apache/mxnet (tests/nightly/); the variants are the ones of MXNet's CI
(ci/docker/runtime_functions.sh, integrationtest_ubuntu_cpu_dist_kvstore), plus
dist_async_kvstore.py. dist_device_sync_kvstore*.py need GPUs and are left out.

Writes benchmarks/results/nightly_mxnet.md: pass / fail (a worker exited non-zero) / hang
(no end within --timeout) per variant and launcher, and the seconds each took. The plain
launcher ends a run as soon as a worker exits non-zero (its workers would otherwise hang in
ps-lite's finalize barrier): a failing variant counts as failed there, not as hung.
"""
import argparse
import datetime
import os
import platform
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = sys.executable
VARIANTS = [
    ("dist_sync_kvstore.py", ["--type=gluon_step_cpu"]),
    ("dist_sync_kvstore.py", ["--type=gluon_sparse_step_cpu"]),
    ("dist_sync_kvstore.py", ["--type=invalid_cpu"]),
    ("dist_sync_kvstore.py", ["--type=gluon_type_cpu"]),
    ("dist_sync_kvstore.py", []),
    ("dist_sync_kvstore.py", ["--no-multiprecision"]),
    ("dist_sync_kvstore.py", ["--type=compressed_cpu"]),
    ("dist_sync_kvstore.py", ["--type=compressed_cpu", "--no-multiprecision"]),
    ("dist_async_kvstore.py", []),
]
#: as MXNet's CI sets them, plus one thread per process (15 processes, 2 cores)
ENV = {"MXNET_STORAGE_FALLBACK_LOG_VERBOSE": "0", "MXNET_SUBGRAPH_VERBOSE": "0",
       "MXNET_USE_OPERATOR_TUNING": "0", "DMLC_LOG_STACK_TRACE_DEPTH": "10",
       "OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def plain(script, args, n, timeout, log):
    """scheduler + n servers + n workers with DMLC_* only, like tools/launch.py local."""
    port = _free_port()
    base = dict(os.environ, **ENV, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
                DMLC_NUM_SERVER=str(n), DMLC_NUM_WORKER=str(n))

    def start(role, argv):
        return subprocess.Popen(argv, cwd=HERE, env=dict(base, DMLC_ROLE=role), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    others = [start("scheduler", [PY, "-c", "import mxnet"])]
    others += [start("server", [PY, "-c", "import mxnet"]) for _ in range(n)]
    workers = [start("worker", [PY, script, *args]) for _ in range(n)]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            codes = [w.poll() for w in workers]
            if any(c not in (None, 0) for c in codes):
                return "fail"
            if all(c == 0 for c in codes):
                return "pass"
            time.sleep(0.2)
        return "hang"
    finally:
        _kill(workers + others)


def mxlbbsp(script, args, n, timeout, log):
    argv = [PY, "-m", "mxlbbsp.launcher", "launch", "-n", str(n), "-s", str(n),
            "--progress", "60", "--", PY, script, *args]
    proc = subprocess.Popen(argv, cwd=HERE, env=dict(os.environ, **ENV), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)       # the launcher stops its job
        try:
            proc.wait(30)
        finally:
            _kill([proc])
        return "hang"
    return "pass" if rc == 0 else f"fail (exit {rc})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=7, help="workers (and servers), as MXNet's CI")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--only", help="run only the variants whose name contains this")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "nightly_mxnet.md"))
    ap.add_argument("--logs", default="/tmp/mxlbbsp_nightly_logs",
                    help="folder for each run's output")
    opt = ap.parse_args()
    rows = []
    logs = opt.logs
    os.makedirs(logs, exist_ok=True)
    for script, args in VARIANTS:
        name = " ".join([script, *args])
        if opt.only and opt.only not in name:
            continue
        row = [name]
        for launcher, run in (("plain", plain), ("mxlbbsp", mxlbbsp)):
            slug = f"{launcher}_{script[:-3]}{''.join(a.strip('-').replace('=', '_') for a in args)}"
            with open(os.path.join(logs, slug + ".log"), "w") as log:
                started = time.monotonic()
                outcome = run(os.path.join(HERE, script), args, opt.n, opt.timeout, log)
            row += [outcome, f"{time.monotonic() - started:.0f}"]
            print(f"{name} [{launcher}]: {row[-2]} in {row[-1]} s", flush=True)
        rows.append(row)
    agree = all((r[1] == "pass") <= (r[3] == "pass") for r in rows)
    with open(opt.out, "w") as fh:
        fh.write("# MXNet 1.9.1's distributed-kvstore nightly tests: plain launcher vs "
                 "`mxlbbsp launch`\n\n")
        fh.write(f"Command: `.venv/bin/python benchmarks/nightly_mxnet/run.py -n {opt.n} "
                 f"--timeout {opt.timeout:g}`  \n")
        fh.write(f"Date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; machine: "
                 f"{os.cpu_count()} cores, {platform.python_version()} Python; {2 * opt.n + 1} "
                 "processes per run (1 scheduler, n servers, n workers), one run at a time; "
                 "other helpers' tests were loading the same machine, so the seconds are only "
                 "indicative.\n\n")
        fh.write("| variant | plain launcher | s | mxlbbsp launch | s |\n|---|---|---|---|---|\n")
        for r in rows:
            fh.write("| " + " | ".join(r) + " |\n")
        fh.write(f"\nEvery variant that passes under the plain launcher passes under "
                 f"`mxlbbsp launch`: **{'yes' if agree else 'NO'}**.\n")
    print(f"written {opt.out}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
