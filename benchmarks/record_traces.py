"""Record real speed traces: a 2-worker job shares this machine's cores with a CPU tenant.

For each recording: start the tenant (``--tenant-procs`` busy-loop processes that switch on
and off on a schedule, so that the load is real), run
``mxlbbsp launch -n 2 --metrics ... -- python examples/train_gluon.py ...``, stop the tenant,
and convert the metrics log with ``mxlbbsp.trace.from_metrics`` (iteration 0 left out) into
benchmarks/traces/<name>.csv. A sidecar <name>.json records the command, the tenant
schedule and the machine, for benchmarks/predictors.py to put into its report.

One more exogenous column is added to each trace: ``runq``, the host's run queue
(``procs_running`` of /proc/stat, sampled every 20 ms by this script) averaged over the
iteration's compute phase ``[time - compute_s, time]`` of the metrics record. Reason: the
workers' cpu_percent (psutil, whole host) saturates at 100 % whenever the 2 cores have more
runnable threads than cores (2 workers, a server, the tenant, other people's jobs), so it
shows the tenant only weakly (~90 % vs 100 %); the run queue keeps counting. The coordinator
does not receive this column (workers report cpu_percent and mem_percent only); the
benchmark replays NARX with and without it to show what a non-saturating signal is worth.

    python benchmarks/record_traces.py                 # every recording, one after another
    python benchmarks/record_traces.py resnet20_bsp_5s # one of them

Each recording takes 1-2 minutes on 2 cores. Run them one at a time, on an otherwise idle
machine if you can (other jobs show up in the traces as more load).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mxlbbsp import metrics as _metrics  # noqa: E402
from mxlbbsp import trace as _trace  # noqa: E402

#: name -> job and tenant; schedule "periodic": on_s on, off_s off; "random": exponential
#: on and off durations with mean on_s and off_s (seeded)
RECORDINGS = {
    "resnet20_bsp_5s": dict(model="resnet20", batch=64, iterations=200, sync="bsp",
                            schedule="periodic", on_s=5.0, off_s=5.0),
    "resnet20_lbbsp_random": dict(model="resnet20", batch=64, iterations=200, sync="lbbsp",
                                  predictor="ema", schedule="random", on_s=3.0, off_s=3.0),
    "cnn_bsp_2s": dict(model="cnn", batch=512, iterations=200, sync="bsp",
                       schedule="periodic", on_s=2.0, off_s=2.0),
}

# The tenant: busy-loops while "on", sleeps while "off", for ever (killed by the recorder).
TENANT = r"""
import random, sys, time
schedule, on_s, off_s, seed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
def length(mean):
    return rng.expovariate(1.0 / mean) if schedule == "random" else mean
while True:
    end = time.monotonic() + length(off_s)
    while time.monotonic() < end:
        time.sleep(0.05)
    end = time.monotonic() + length(on_s)
    while time.monotonic() < end:
        x = 0
        for i in range(20000):
            x += i * i
"""


class RunQueue(threading.Thread):
    """Samples procs_running of /proc/stat every ``period`` seconds: (time, count) pairs."""

    def __init__(self, period: float = 0.02):
        super().__init__(name="runq", daemon=True)
        self.period = period
        self.samples = []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            with open("/proc/stat") as fh:
                for line in fh:
                    if line.startswith("procs_running"):
                        self.samples.append((time.time(), int(line.split()[1])))
                        break
            self.done.wait(self.period)

    def mean(self, start: float, end: float) -> str:
        inside = [n for t, n in self.samples if start <= t <= end]
        if not inside:       # a phase shorter than the period: the nearest sample
            near = min(self.samples, key=lambda s: abs(s[0] - end), default=None)
            return "" if near is None else repr(float(near[1]))
        return repr(sum(inside) / len(inside))


def add_runq(csv_path: str, metrics_path: str, runq: RunQueue) -> None:
    """Append the runq column to the trace written by mxlbbsp.trace.from_metrics."""
    phase = {(int(r["iteration"]), int(r["rank"])): (r["time"] - r["compute_s"], r["time"])
             for r in _metrics.load(metrics_path)}
    with open(csv_path, newline="") as fh:
        rows = list(csv.reader(fh))
    rows[0].append("runq")
    for row in rows[1:]:
        row.append(runq.mean(*phase[int(row[0]), int(row[1])]))
    with open(csv_path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)


def record(name: str, spec: dict, out_dir: str, tenant_procs: int, keep: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1")
    work = keep or tempfile.mkdtemp(prefix="mxlbbsp-trace-")
    os.makedirs(work, exist_ok=True)
    metrics = os.path.join(work, f"{name}.jsonl")
    launch = [sys.executable, "-m", "mxlbbsp.launcher", "launch", "-n", "2",
              "--sync", spec["sync"], "--metrics", metrics, "--progress", "0"]
    if spec.get("predictor"):
        launch += ["--predictor", spec["predictor"]]
    launch += ["--", sys.executable, os.path.join(ROOT, "examples", "train_gluon.py"),
               "--model", spec["model"], "--data", "synthetic", "--batch-size",
               str(spec["batch"]), "--iterations", str(spec["iterations"]),
               "--epochs", "1000", "--log-interval", "0"]
    tenants = [subprocess.Popen([sys.executable, "-c", TENANT, spec["schedule"],
                                 str(spec["on_s"]), str(spec["off_s"]), str(seed)],
                                stdin=subprocess.DEVNULL)
               for seed in range(tenant_procs)]
    runq = RunQueue()
    runq.start()
    started = time.time()
    try:
        proc = subprocess.run(launch, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    finally:
        runq.done.set()
        runq.join()
        for t in tenants:
            t.terminate()
        for t in tenants:
            try:
                t.wait(timeout=5)
            except subprocess.TimeoutExpired:
                t.kill()
                t.wait()
    seconds = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"record_traces.py: the job of {name!r} failed (exit "
                         f"{proc.returncode}); its metrics are in {metrics}")
    csv_path = os.path.join(out_dir, f"{name}.csv")
    rows = _trace.from_metrics(metrics, csv_path, skip=1)
    add_runq(csv_path, metrics, runq)
    if not keep:
        shutil.rmtree(work)
    info = {"name": name, "rows": rows, "seconds": round(seconds, 1),
            "tenant_procs": tenant_procs, **spec,
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
    p.add_argument("--tenant-procs", type=int, default=1,
                   help="busy-loop processes of the tenant (default 1)")
    p.add_argument("--keep-metrics", metavar="DIR", help="keep the metrics logs here")
    args = p.parse_args(argv)
    names = args.names or list(RECORDINGS)
    unknown = [n for n in names if n not in RECORDINGS]
    if unknown:
        p.error(f"unknown recording(s) {', '.join(unknown)}; choose from {', '.join(RECORDINGS)}")
    os.makedirs(args.out, exist_ok=True)
    command = "python benchmarks/record_traces.py " + " ".join(
        names + ["--tenant-procs", str(args.tenant_procs)])
    print(f"reproduce with: {command}", flush=True)
    for name in names:
        info = record(name, RECORDINGS[name], args.out, args.tenant_procs, args.keep_metrics)
        info["command"] = f"python benchmarks/record_traces.py {name} --tenant-procs " \
            f"{args.tenant_procs}"
        with open(os.path.join(args.out, f"{name}.json"), "w") as fh:
            json.dump(info, fh, indent=2)
            fh.write("\n")
        print(f"{name}: {info['rows']} rows in {info['seconds']} s -> "
              f"{os.path.relpath(os.path.join(args.out, name + '.csv'), ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
