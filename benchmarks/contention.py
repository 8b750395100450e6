"""Real contention: BSP vs LB-BSP (NARX, EMA) while CPU tenants switch on and off on this
machine's cores. No emulation: real compute, real load.

2 workers train a real model (ResNet-20 on synthetic CIFAR-sized images by default), each
pinned to one core (benchmarks/_pin.py: worker r on core r). Background tenants are busy-loop
processes that this script starts and kills on a schedule, pinned to the workers' cores too.
While a tenant runs, its core's worker gets about half of the core. Two schedules
(``--schedules``):

* ``alternating``: tenant A (core 0) and tenant B (core 1) take turns of ``--period`` s, so
  one worker is always slowed and which one changes every period;
* ``independent``: A 6 s on / 6 s off, B 9 s on / 11 s off from 4 s: sometimes one worker is
  slowed, sometimes both, sometimes neither.

Neither BSP nor the predictors know the schedule; it restarts with every job. Modes: BSP,
LB-BSP with NARX and with EMA, interleaved round by round (ABBA); the ratios are per round.
The ideal speedup comes from the BSP runs' measured speeds. Every tenant is killed when a job
ends and at the end (try/finally); a tenant also exits by itself if this script dies.

    python benchmarks/contention.py --quick    # 1 round x 120 iterations (~5 min)
    python benchmarks/contention.py            # 3 rounds x 300 iterations (~25 min)
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common as C
import _suite as S

MODES = {"BSP": ("bsp", None), "LB-BSP narx": ("lbbsp", "narx"),
         "LB-BSP ema": ("lbbsp", "ema")}
PIN = Path(__file__).resolve().parent / "_pin.py"

#: a busy loop pinned to core argv[1] (-1: not pinned); it exits when its parent (this
#: script) is gone
TENANT = ("import os, sys\n"
          "if int(sys.argv[1]) >= 0:\n"
          "    os.sched_setaffinity(0, {int(sys.argv[1])})\n"
          "parent = os.getppid()\n"
          "while os.getppid() == parent:\n"
          "    for _ in range(200000):\n"
          "        pass\n")


class Tenants:
    """Starts and kills busy-loop processes on a schedule, in a background thread.

    ``schedule``: (core, on_s, off_s, start_s) per tenant; tenant k is on during
    [start + j (on + off), start + j (on + off) + on) for j = 0, 1, ...
    """

    def __init__(self, schedule):
        self.schedule = schedule
        self.procs = {}                    # tenant index -> Popen while on
        self.on_seconds = [0.0] * len(schedule)
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()

    def __enter__(self):
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tenants", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.kill_all()

    def _wanted(self, k: int, now: float) -> bool:
        core, on, off, start = self.schedule[k]
        t = now - self._t0 - start
        return t >= 0 and (t % (on + off)) < on

    def _run(self):
        last = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                for k, (core, *_rest) in enumerate(self.schedule):
                    if k in self.procs:
                        self.on_seconds[k] += now - last
                    want = self._wanted(k, now)
                    if want and k not in self.procs:
                        self.procs[k] = subprocess.Popen(
                            [sys.executable, "-c", TENANT, str(core)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                    elif not want and k in self.procs:
                        self._kill(self.procs.pop(k))
            last = now
            self._stop.wait(0.05)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def kill_all(self):
        with self._lock:
            for proc in self.procs.values():
                self._kill(proc)
            self.procs.clear()


def schedules(cores, period: float):
    """name -> (description, [(core, on_s, off_s, start_s) per tenant])."""
    return {
        "independent": (
            f"A on core {cores[0]} 6 s on / 6 s off, B on core {cores[1]} 9 s on / 11 s off "
            f"from 4 s: sometimes one worker is slowed, sometimes both, sometimes none",
            [(cores[0], 6.0, 6.0, 0.0), (cores[1], 9.0, 11.0, 4.0)]),
        "alternating": (
            f"A on core {cores[0]} and B on core {cores[1]} take turns, {period:g} s each: "
            f"one worker is always slowed, and which one changes every {period:g} s",
            [(cores[0], period, period, 0.0), (cores[1], period, period, period)]),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round x 120 iterations")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--schedules", default="alternating,independent",
                   help="tenant schedules to run: alternating, independent")
    p.add_argument("--period", type=float, default=8.0,
                   help="seconds per turn of the alternating schedule")
    p.add_argument("--figures", action=argparse.BooleanOptionalAction, default=None,
                   help="write the report figures (default: in full mode, not with --quick)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin workers and tenants (Linux balances the load)")
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):        # one round of one schedule, 8 iterations of a small batch
        args.quick, args.rounds, args.iterations, args.figures = True, 1, 8, False
        args.schedules, args.batch_size = "alternating", 8
    rounds = args.rounds or (1 if args.quick else 3)
    iters = args.iterations or (120 if args.quick else 300)
    want_figures = (not args.quick) if args.figures is None else args.figures
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        p.error("needs at least 2 cores")
    known = schedules(cores, args.period)
    chosen = [x.strip() for x in args.schedules.split(",")]
    if not chosen or any(x not in known for x in chosen):
        p.error(f"--schedules: choose from {', '.join(known)}")
    name = "contention" + ("_quick" if args.quick else "")
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()
    train = ["--model", args.model, "--data", "synthetic", "--samples", "8192",
             "--batch-size", str(args.batch_size), "--epochs", "1000",
             "--iterations", str(iters), "--log-interval", "0"]
    command = [C.PY, *([] if args.no_pin else [str(PIN), C.PY]), str(C.EXAMPLE), *train]

    results, figures = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for sched_name in chosen:
            description, schedule = known[sched_name]
            if args.no_pin:
                schedule = [(-1, *rest) for _core, *rest in schedule]
            runs = {m: [] for m in MODES}
            paths = {m: [] for m in MODES}
            tenant_duty = []
            for r in range(rounds):
                for mode in S.order(MODES, r):
                    sync, predictor = MODES[mode]
                    extra = ["--predictor", predictor] if predictor else []
                    path = Path(tmp) / f"{sched_name}-{predictor or 'bsp'}-round{r + 1}.jsonl"
                    C.progress(f"{sched_name} round {r + 1}/{rounds}: {mode} "
                               f"(load {S.load():.1f})")
                    tenants = Tenants(schedule)
                    started = time.monotonic()
                    try:
                        with tenants:
                            s = C.launch(2, [], path, sync=sync, launch_args=extra,
                                         command=command)
                    finally:
                        tenants.kill_all()
                    wall = time.monotonic() - started
                    tenant_duty.append([x / wall for x in tenants.on_seconds])
                    runs[mode].append(s)
                    paths[mode].append(path)
                    C.progress(f"  {s['samples_per_s']:.1f} samples/s, wait "
                               f"{100 * s['wait_share']:.1f}%")
            rows = {}
            for mode in MODES:
                tput = [s["samples_per_s"] for s in runs[mode]]
                sp = [a / b for a, b in zip(tput, [s["samples_per_s"] for s in runs["BSP"]])]
                rows[mode] = {"samples_per_s": C.median(tput), "per_round": tput,
                              "speedup_over_bsp": C.median(sp), "speedup_per_round": sp,
                              "wait_share": C.median([s["wait_share"] for s in runs[mode]]),
                              "runs": [S.summary_row(s) for s in runs[mode]]}
            ideal = [S.ideal_speedup_over_time(q) for q in paths["BSP"]]
            results[sched_name] = {
                "description": description, "schedule": schedule,
                "tenant_duty": [C.median([d[k] for d in tenant_duty])
                                for k in range(len(schedule))],
                "ideal_speedup": C.median(ideal), "ideal_per_round": ideal, "modes": rows}
            if want_figures:
                figures[sched_name] = S.figures(
                    {"bsp": paths["BSP"][-1], "narx": paths["LB-BSP narx"][-1]},
                    C.RESULTS / name / sched_name)

    lines = ["| tenants | mode | samples/s | speedup over BSP | per round | fraction of ideal "
             "| wait |", "|---|---|---|---|---|---|---|"]
    for sched_name, res in results.items():
        for mode, r in res["modes"].items():
            fraction = ("-" if mode == "BSP" else
                        f"{100 * r['speedup_over_bsp'] / res['ideal_speedup']:.0f}%")
            r["fraction_of_ideal"] = (None if mode == "BSP" else
                                      r["speedup_over_bsp"] / res["ideal_speedup"])
            lines.append(f"| {sched_name} | {mode} | {r['samples_per_s']:.1f} | "
                         f"**{r['speedup_over_bsp']:.2f}x** | "
                         f"{S.rounds_text(r['speedup_per_round'])} | "
                         f"{fraction} | {100 * r['wait_share']:.0f}% |")
    pinning = ("each worker pinned to its own core (worker r on core r), tenants pinned to "
               "those cores" if not args.no_pin else "nothing pinned")
    notes = "\n".join(
        f"* **{k}**: {res['description']} (share of a job's wall time with each tenant on: "
        f"{', '.join(f'{100 * d:.0f}%' for d in res['tenant_duty'])}); ideal speedup "
        f"{res['ideal_speedup']:.2f}x (per round {S.rounds_text(res['ideal_per_round'])})"
        + (f"; figures: [{figures[k]}]({figures[k]})" if k in figures else "")
        for k, res in results.items())
    table = (
        f"Real contention, no emulation. 2 workers + 1 server on this 2-core machine, "
        f"{args.model} with REAL compute on synthetic 3x32x32 data, global batch "
        f"{args.batch_size}; {pinning}. CPU tenants are busy loops that the script starts "
        f"and kills on a schedule that restarts with every job. {iters} iterations per run, "
        f"first 5 left out; {rounds} round(s), modes interleaved (ABBA); medians of "
        f"per-round values.\n\n" + "\n".join(lines) + "\n\n" + notes +
        "\n\n'ideal' = time average of the perfect split's speedup over BSP, from the BSP "
        "runs' measured per-iteration speeds (sum(v) / (n min v) per iteration, weighted by "
        "time); 'fraction of ideal' = speedup / ideal. 'wait' = mean share of a worker's "
        "iteration spent waiting for the others (including push/pull)."
        f"\n\nLoad average at start: {load_at_start:.2f}.")
    C.write(name, {"rounds": rounds, "iterations": iters, "model": args.model,
                   "batch_size": args.batch_size, "pinned": not args.no_pin,
                   "load_at_start": load_at_start, "figures": figures,
                   "results": results}, table)


if __name__ == "__main__":
    main()
