"""Record real speed traces: a 2-worker job shares this machine's cores with tenants.

For each recording: start the tenants (processes that switch on and off on a schedule, so
that the contention is real), run
``mxlbbsp launch -n 2 --metrics ... -- python examples/train_gluon.py ...``, stop the tenants,
and convert the metrics log with ``mxlbbsp.analysis.trace.from_metrics`` (iteration 0 left out) into
benchmarks/traces/<name>.csv. A sidecar <name>.json records the command, the tenants and the
machine, for benchmarks/predictors.py to put into its report.

Tenants (``TENANT`` below), each with its own on/off schedule ("periodic": on_s on, off_s
off; "random": exponential durations with those means, seeded):

* ``cpu``: a Python busy loop; ``duty`` < 1 busy-loops that share of every 50 ms (a tenant
  of lower intensity);
* ``mem``: numpy streaming a ``mb`` MB array (copy + sum, over and over): memory bandwidth
  and last-level cache, little CPU beyond its one core.

A tenant with a ``core`` runs pinned to that core. Recordings with ``pin`` run each worker
pinned to its own core too (benchmarks/_pin.py: worker r on core r, as in
benchmarks/contention.py), so that a tenant slows down exactly the worker it shares a core
with: the dedicated-core setting of a shared cluster, where the noise of Linux spreading three
busy threads over two cores from one 4 ms slice to the next is gone.

The traces carry every signal the workers can report (``--signals all``; mxlbbsp/core/signals.py:
others_cpu, ctx_invol, run_delay, cpu_pressure, steal, runq, and the three tail columns) next
to cpu_percent and mem_percent.

    python benchmarks/record_traces.py                 # every recording, one after another
    python benchmarks/record_traces.py cnn_cpu_levels  # one of them

Each recording takes 1-2 minutes on 2 cores. Run them one at a time, on an otherwise idle
machine if you can: other jobs show up in the traces as more, uncontrolled, contention (the
sidecar records the load average after the recording).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mxlbbsp.analysis import trace as _trace  # noqa: E402

CPU_FULL = dict(kind="cpu", duty=1.0)
CPU_HALF = dict(kind="cpu", duty=0.5)
MEM = dict(kind="mem", duty=1.0, mb=256)

#: name -> job and tenants (each: kind, intensity, schedule, mean on / off seconds)
RECORDINGS = {
    "cnn_cpu_levels": dict(model="cnn", batch=512, iterations=250, sync="bsp", tenants=[
        dict(CPU_FULL, schedule="periodic", on_s=4.0, off_s=4.0),
        dict(CPU_HALF, schedule="random", on_s=3.0, off_s=3.0)]),
    "cnn_mem_bandwidth": dict(model="cnn", batch=512, iterations=250, sync="bsp", tenants=[
        dict(MEM, schedule="periodic", on_s=3.0, off_s=3.0)]),
    "resnet20_cpu_random": dict(model="resnet20", batch=64, iterations=200, sync="lbbsp",
                                predictor="ema", tenants=[
        dict(CPU_FULL, schedule="random", on_s=3.0, off_s=3.0)]),
    "resnet20_mixed": dict(model="resnet20", batch=64, iterations=200, sync="bsp", tenants=[
        dict(CPU_HALF, schedule="periodic", on_s=5.0, off_s=5.0),
        dict(MEM, schedule="random", on_s=4.0, off_s=4.0)]),
    "resnet20_pinned_cpu": dict(model="resnet20", batch=128, iterations=200, sync="bsp",
                                pin=True, tenants=[
        dict(CPU_FULL, core=0, schedule="random", on_s=2.0, off_s=2.0),
        dict(CPU_HALF, core=1, schedule="random", on_s=3.0, off_s=3.0)]),
    "cnn_pinned_levels": dict(model="cnn", batch=1024, iterations=250, sync="bsp", pin=True,
                              tenants=[
        dict(CPU_FULL, core=0, schedule="random", on_s=2.0, off_s=3.0),
        dict(CPU_HALF, core=0, schedule="random", on_s=3.0, off_s=2.0),
        dict(CPU_FULL, core=1, schedule="periodic", on_s=3.0, off_s=3.0)]),
}

# A tenant: works while "on", sleeps while "off", for ever (killed by the recorder).
TENANT = r"""
import os, random, sys, time
kind, duty, mb, schedule, on_s, off_s, seed, core = sys.argv[1:9]
if int(core) >= 0:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[int(core)]})
duty, mb, on_s, off_s = float(duty), int(mb), float(on_s), float(off_s)
rng = random.Random(int(seed))
if kind == "mem":
    import numpy as np
    a = np.ones(mb * 2**20 // 8)
    b = np.empty_like(a)
def length(mean):
    return rng.expovariate(1.0 / mean) if schedule == "random" else mean
while True:
    end = time.monotonic() + length(off_s)
    while time.monotonic() < end:
        time.sleep(0.05)
    end = time.monotonic() + length(on_s)
    while time.monotonic() < end:
        if kind == "mem":
            np.copyto(b, a)
            a.sum()
            continue
        busy = time.monotonic() + 0.05 * duty
        while time.monotonic() < busy:
            x = 0
            for i in range(2000):
                x += i * i
        if duty < 1:
            time.sleep(0.05 * (1 - duty))
"""


def start_tenants(tenants) -> list:
    return [subprocess.Popen([sys.executable, "-c", TENANT, t["kind"], str(t.get("duty", 1.0)),
                              str(t.get("mb", 0)), t["schedule"], str(t["on_s"]),
                              str(t["off_s"]), str(seed), str(t.get("core", -1))],
                             stdin=subprocess.DEVNULL)
            for seed, t in enumerate(tenants)]


def stop_tenants(procs) -> None:
    for t in procs:
        t.terminate()
    for t in procs:
        try:
            t.wait(timeout=5)
        except subprocess.TimeoutExpired:
            t.kill()
            t.wait()


def record(name: str, spec: dict, out_dir: str, keep: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1")
    work = keep or tempfile.mkdtemp(prefix="mxlbbsp-trace-")
    os.makedirs(work, exist_ok=True)
    metrics = os.path.join(work, f"{name}.jsonl")
    launch = [sys.executable, "-m", "mxlbbsp.launcher", "launch", "-n", "2",
              "--sync", spec["sync"], "--metrics", metrics, "--progress", "0",
              "--signals", "all"]
    if spec.get("predictor"):
        launch += ["--predictor", spec["predictor"]]
    launch += ["--", sys.executable]
    if spec.get("pin"):
        launch += [os.path.join(ROOT, "benchmarks", "_pin.py"), sys.executable]
    launch += [os.path.join(ROOT, "examples", "train_gluon.py"),
               "--model", spec["model"], "--data", "synthetic", "--batch-size",
               str(spec["batch"]), "--iterations", str(spec["iterations"]),
               "--epochs", "1000", "--log-interval", "0"]
    tenants = start_tenants(spec["tenants"])
    started = time.time()
    try:
        proc = subprocess.run(launch, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    finally:
        stop_tenants(tenants)
    seconds = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"record_traces.py: the job of {name!r} failed (exit "
                         f"{proc.returncode}); its metrics are in {metrics}")
    csv_path = os.path.join(out_dir, f"{name}.csv")
    rows = _trace.from_metrics(metrics, csv_path, skip=1)
    if not keep:
        shutil.rmtree(work)
    info = {"name": name, "rows": rows, "seconds": round(seconds, 1),
            **spec,
            "launch": " ".join(shlex.quote(os.path.relpath(a, ROOT) if a.startswith(ROOT)
                                           else a) for a in launch[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{platform.python_implementation()} {platform.python_version()}",
            "recorded": time.strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help=f"recordings to make (default: all of "
                   f"{', '.join(RECORDINGS)})")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "traces"))
    p.add_argument("--keep-metrics", metavar="DIR", help="keep the metrics logs here")
    p.add_argument("--smoke", action="store_true",
                   help="smallest size (seconds): the first recording (or those named), 8 "
                        "iterations of a batch of at most 32, written to "
                        "$MXLBBSP_BENCH_RESULTS or a temporary folder, not traces/")
    args = p.parse_args(argv)
    names = args.names or list(RECORDINGS)
    recordings = dict(RECORDINGS)
    if args.smoke:
        names = args.names or names[:1]
        args.out = os.environ.get("MXLBBSP_BENCH_RESULTS") or tempfile.mkdtemp(
            prefix="bench-smoke-")
        recordings = {n: dict(spec, iterations=8, batch=min(spec["batch"], 32))
                      for n, spec in RECORDINGS.items()}
    unknown = [n for n in names if n not in RECORDINGS]
    if unknown:
        p.error(f"unknown recording(s) {', '.join(unknown)}; choose from {', '.join(RECORDINGS)}")
    os.makedirs(args.out, exist_ok=True)
    command = "python benchmarks/record_traces.py " + " ".join(names)
    print(f"reproduce with: {command}", flush=True)
    for name in names:
        info = record(name, recordings[name], args.out, args.keep_metrics)
        info["command"] = f"python benchmarks/record_traces.py {name}"
        with open(os.path.join(args.out, f"{name}.json"), "w") as fh:
            json.dump(info, fh, indent=2)
            fh.write("\n")
        print(f"{name}: {info['rows']} rows in {info['seconds']} s -> "
              f"{os.path.relpath(os.path.join(args.out, name + '.csv'), ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
