"""Cost of reading the contention signals (mxlbbsp/core/signals.py) on a worker, per iteration.

    python benchmarks/signals_cost.py            # the reads, then a job (~2 minutes)
    python benchmarks/signals_cost.py --no-job   # the reads only

A worker reads them three times per iteration (``Signals.begin`` when its compute phase starts,
the tail's snapshot in the sampler thread near its end, ``Signals.read`` when it ends). Measured: each source alone, and one begin + read, median and
99th percentile over 2000 calls after 200 warm-up calls, wall clock and process CPU time, in
this (single-threaded) process, and in a process with 12 extra threads (MXNet's engine and
data workers make a worker's thread count grow; run_delay reads one file per thread).

Then what it costs a job, side by side in one run: a tiny model (the MLP on digits, a few ms
per iteration, where the cost shows most), 2 workers, ``--signals`` none with ``--exog none``
(nothing read), none (the default --exog inputs only), auto (the default), all (the tail too,
with its sampler thread), and for scale nothing read with ``--predictor ema`` (the NARX's
own share: its forecast is on the path from the last report to the next split), in ABBA
order over ROUNDS rounds; the throughput of each against nothing read, per round.

Writes benchmarks/results/signals_cost.json and .md. The machine is shared: the load average
is recorded.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mxlbbsp.core import signals as S  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
#: the job: launcher options per variant (the first is the reference), and its size
VARIANTS = {"nothing read": ["--signals", "none", "--exog", "none"],
            "--signals none (the --exog inputs only)": ["--signals", "none"],
            "--signals auto (default)": ["--signals", "auto"],
            "--signals all (the tail too)": ["--signals", "all"],
            "nothing read, --predictor ema": ["--signals", "none", "--exog", "none",
                                              "--predictor", "ema"]}
ROUNDS = 4
JOB = ["--model", "mlp", "--data", "digits", "--iterations", "600", "--epochs", "1000",
       "--log-interval", "0"]


def job_cost(rounds: int = ROUNDS, job=JOB, variants=VARIANTS) -> dict:
    """Samples/s of the tiny job per variant and round, and the ratios to the first."""
    import tempfile
    from pathlib import Path
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import _common
    import _suite
    speed = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for v in _suite.order(list(variants), r):
                _common.progress(f"round {r + 1}/{rounds}: {v}")
                summary = _common.launch(2, job, Path(tmp) / "m.jsonl",
                                         launch_args=variants[v])
                speed[v].append(summary["samples_per_s"])
    ref = speed[next(iter(variants))]
    return {"rounds": rounds, "job": list(job), "samples_per_s": speed,
            "ratio": {v: [a / b for a, b in zip(xs, ref)] for v, xs in speed.items()}}


def measure(fn, calls=2000, warmup=200) -> dict:
    wall, cpu = [], []
    for k in range(warmup + calls):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        if k >= warmup:
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
    w, c = np.array(wall) * 1e6, np.array(cpu) * 1e6
    return {"wall_us_median": float(np.median(w)), "wall_us_p99": float(np.percentile(w, 99)),
            "cpu_us_median": float(np.median(c))}


def sources(sig) -> dict:
    sig._snapshots = 1          # the list of children is cached (refreshed every 256)
    return {
        "/proc/stat (host busy, steal, runq)": S._host_stat,
        "/proc/pressure/cpu": S._pressure,
        "run delay (/proc/self/task/*/schedstat)": lambda: S._threads(
            os.listdir("/proc/self/task")),
        "own CPU (os.times + children, cached list)": sig._own_cpu,
        "involuntary switches (psutil)": sig._ctx,
        "the tail's snapshot (sample(), in the sampler thread)": sig.sample,
        "one iteration: begin() + sample() + read()": lambda: (sig.begin(), sig.sample(),
                                                               sig.read()),
    }


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--no-job", action="store_true", help="measure the reads only")
    p.add_argument("--smoke", action="store_true",
                   help="smallest size (seconds): checks that the script runs; the results "
                        "go to $MXLBBSP_BENCH_RESULTS or a temporary folder")
    args = p.parse_args(argv)
    global RESULTS
    calls, warmup = 2000, 200
    if args.smoke:           # 50 calls per source; one round of 2 variants, 8 iterations
        import tempfile
        RESULTS = os.environ.get("MXLBBSP_BENCH_RESULTS") or tempfile.mkdtemp(
            prefix="bench-smoke-")
        calls, warmup = 50, 5
    sig = S.Signals(tail=False)     # sample() is called here, timed, instead of by its thread
    doc = {"command": "python benchmarks/signals_cost.py" + (" --no-job" if args.no_job else ""),
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python "
                      f"{platform.python_version()}, {platform.platform()}",
           "loadavg_before": [round(x, 2) for x in os.getloadavg()], "single": {},
           "threads_13": {}}
    for name, fn in sources(sig).items():
        doc["single"][name] = measure(fn, calls, warmup)
    stop = threading.Event()
    extra = [threading.Thread(target=stop.wait, daemon=True) for _ in range(12)]
    for t in extra:
        t.start()
    for name, fn in sources(sig).items():
        doc["threads_13"][name] = measure(fn, calls, warmup)
    stop.set()
    if not args.no_job:
        if args.smoke:
            job = [x if x != "600" else "8" for x in JOB]
            doc["job"] = job_cost(1, job, dict(list(VARIANTS.items())[:2]))
        else:
            doc["job"] = job_cost()
    doc["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "signals_cost.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    lines = [f"<!-- generated by {doc['command']} -->", "",
             "# Cost of the contention signals per worker", "",
             "Microseconds per call; median (p99) wall clock, median CPU. A worker makes one "
             "`begin()` + `sample()` + `read()` per iteration (`sample()` off the critical "
             "path, in a thread, while the compute phase runs). Load average "
             f"{doc['loadavg_before']} before, {doc['loadavg_after']} after, on "
             f"{os.cpu_count()} cores.", "",
             "| source | 1 thread: wall us | CPU us | 13 threads: wall us | CPU us |",
             "|---|---|---|---|---|"]
    for name in doc["single"]:
        a, b = doc["single"][name], doc["threads_13"][name]
        lines.append(f"| {name} | {a['wall_us_median']:.0f} ({a['wall_us_p99']:.0f}) | "
                     f"{a['cpu_us_median']:.0f} | {b['wall_us_median']:.0f} "
                     f"({b['wall_us_p99']:.0f}) | {b['cpu_us_median']:.0f} |")
    if "job" in doc:
        job = doc["job"]
        lines += ["", "## What it costs a job", "",
                  f"`mxlbbsp launch -n 2 ... -- python examples/train_gluon.py "
                  f"{' '.join(job['job'])}` (a few ms per iteration), {job['rounds']} rounds "
                  "in ABBA order; samples/s per round, and its ratio to nothing read in the "
                  "same round.", "",
                  "| variant | samples/s per round | ratio per round | median ratio |",
                  "|---|---|---|---|"]
        for v, xs in job["samples_per_s"].items():
            ratios = job["ratio"][v]
            lines.append(f"| {v} | {', '.join(f'{x:.0f}' for x in xs)} | "
                         f"{', '.join(f'{x:.2f}' for x in ratios)} | "
                         f"{float(np.median(ratios)):.2f} |")
    lines += ["", f"Command: `{doc['command']}`  ", f"Machine: {doc['machine']}  ",
              f"Date: {doc['date']}", ""]
    with open(os.path.join(RESULTS, "signals_cost.md"), "w") as fh:
        fh.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
