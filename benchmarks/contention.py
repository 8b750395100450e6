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
  slowed, sometimes both, sometimes neither;
* ``static`` (not run by default): tenant A on core 0 for the whole job, about 1:2;
* ``none`` (not run by default): no tenant, equal workers, which should get equal shares.

Neither BSP nor the predictors know the schedule; it restarts with every job. Modes: BSP,
LB-BSP with NARX and with EMA, interleaved round by round (ABBA); the ratios are per round.
The ideal speedup comes from the BSP runs' measured speeds. Every tenant is killed when a job
ends and at the end (try/finally); a tenant also exits by itself if this script dies.

Whether the splits follow the tenants: per run, worker 0's mean share of the global batch in
the iterations during which only A, only B, both or neither were on (by the time the
coordinator received the iteration's reports).

``--cgroup`` (root, cgroup v1's cpu controller) puts each core's worker and tenant in a cgroup
of their own with a high cpu.shares: on a machine busy with other, unpinned processes, Linux
would otherwise move those off the tenant's core and the workers would stay about equal; in
the cgroup the tenant takes half of its core whatever else runs.

``--baseline REV`` runs every mode also on the code of commit REV (a temporary worktree:
its launcher, workers and example), NAME@REV next to NAME in each round, so that a change to
the workers is compared side by side under the same tenants.

    python benchmarks/contention.py --quick    # 1 round x 120 iterations (~5 min)
    python benchmarks/contention.py            # 3 rounds x 300 iterations (~25 min)
    python benchmarks/contention.py --quick --baseline main --modes bsp,narx
    python benchmarks/contention.py --quick --cgroup --baseline main --modes bsp,narx
"""
import argparse
import contextlib
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
#: --modes: the short names
SHORT = {"bsp": "BSP", "narx": "LB-BSP narx", "ema": "LB-BSP ema"}
PIN = Path(__file__).resolve().parent / "_pin.py"

#: --cgroup: cgroup v1's cpu controller, one cgroup per core (CGROUP + core number)
CGROUP = Path("/sys/fs/cgroup/cpu/mxlbbsp_bench_core")
#: --cgroup: each cgroup's weight (an ordinary process's is 1024)
SHARES = 8192

#: a busy loop pinned to core argv[1] (-1: not pinned), in the cgroup whose cgroup.procs is
#: argv[2] if given; it exits when its parent (this script) is gone
TENANT = ("import os, sys\n"
          "if int(sys.argv[1]) >= 0:\n"
          "    os.sched_setaffinity(0, {int(sys.argv[1])})\n"
          "if len(sys.argv) > 2:\n"
          "    open(sys.argv[2], 'w').write(str(os.getpid()))\n"
          "parent = os.getppid()\n"
          "while os.getppid() == parent:\n"
          "    for _ in range(200000):\n"
          "        pass\n")


class Tenants:
    """Starts and kills busy-loop processes on a schedule, in a background thread.

    ``schedule``: (core, on_s, off_s, start_s) per tenant; tenant k is on during
    [start + j (on + off), start + j (on + off) + on) for j = 0, 1, ...
    """

    def __init__(self, schedule, cgroup: bool = False):
        self.schedule = schedule
        self.cgroup = cgroup
        self.procs = {}                    # tenant index -> Popen while on
        self.on_seconds = [0.0] * len(schedule)
        #: (tenant index, started, killed or None) in time.time(), as the metrics' times
        self.spans = []
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
                        where = [f"{CGROUP}{core}/cgroup.procs"] if self.cgroup else []
                        self.procs[k] = subprocess.Popen(
                            [sys.executable, "-c", TENANT, str(core), *where],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                        self.spans.append([k, time.time(), None])
                    elif not want and k in self.procs:
                        self._kill(self.procs.pop(k))
                        self._ended(k)
            last = now
            self._stop.wait(0.05)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def _ended(self, k: int) -> None:
        for span in self.spans:
            if span[0] == k and span[2] is None:
                span[2] = time.time()

    def kill_all(self):
        with self._lock:
            for k, proc in self.procs.items():
                self._kill(proc)
                self._ended(k)
            self.procs.clear()

    def on_at(self, when: float) -> str:
        """Which tenants were on at ``when`` (time.time()): "A", "B", "AB" or "none"."""
        on = "".join(sorted({"AB"[k] for k, a, b in self.spans
                             if a <= when and (b is None or when < b)}))
        return on or "none"


def shares_by_state(metrics: Path, tenants: Tenants, skip: int = 5) -> dict:
    """Worker 0's mean share of the global batch per tenant state ("A", "B", "AB", "none"),
    and how many iterations each state had: does the split follow the tenants?"""
    from mxlbbsp.core import metrics as _metrics
    its = {}
    for rec in _metrics.load(str(metrics)):
        if rec["iteration"] >= skip:
            its.setdefault(rec["iteration"], []).append(rec)
    by = {}
    for recs in its.values():
        total = sum(float(r["batch_size"]) for r in recs)
        if total <= 0:
            continue
        share = sum(float(r["batch_size"]) for r in recs if r["rank"] == 0) / total
        by.setdefault(tenants.on_at(max(float(r["time"]) for r in recs)), []).append(share)
    return {state: {"worker0_share": sum(v) / len(v), "iterations": len(v)}
            for state, v in sorted(by.items())}


@contextlib.contextmanager
def cgroups(cores):
    """--cgroup: a cgroup per core (cpu.shares SHARES) that _pin.py puts that core's worker
    in (MXLBBSP_BENCH_CGROUP) and the Tenants their tenant; removed afterwards."""
    made = []
    try:
        for core in cores:
            d = Path(f"{CGROUP}{core}")
            d.mkdir(exist_ok=True)
            made.append(d)
            (d / "cpu.shares").write_text(str(SHARES))
        os.environ["MXLBBSP_BENCH_CGROUP"] = str(CGROUP)
        yield
    finally:
        os.environ.pop("MXLBBSP_BENCH_CGROUP", None)
        for d in made:
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):     # gone meanwhile
                    (d.parent / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                d.rmdir()


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
        "static": (
            f"A on core {cores[0]} for the whole job: worker 0 gets about half its core "
            f"(about 1:2)", [(cores[0], 1e9, 1.0, 0.0)]),
        "none": ("no tenant: equal workers, each should get half of the batch", []),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round x 120 iterations")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--schedules", default="alternating,independent",
                   help="tenant schedules to run: alternating, independent, static, none")
    p.add_argument("--period", type=float, default=8.0,
                   help="seconds per turn of the alternating schedule")
    p.add_argument("--figures", action=argparse.BooleanOptionalAction, default=None,
                   help="write the report figures (default: in full mode, not with --quick)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin workers and tenants (Linux balances the load)")
    p.add_argument("--cgroup", action="store_true",
                   help="each core's worker and tenant in a cgroup with a high cpu.shares "
                        "(root, cgroup v1): tenants slow their worker on a busy machine too")
    p.add_argument("--modes", default="bsp,narx,ema",
                   help="modes to run: bsp (always run: the ratios' base), narx, ema")
    p.add_argument("--baseline", metavar="REV",
                   help="run every mode also on the code of commit REV, side by side")
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):        # one round of one schedule, 8 iterations of a small batch
        args.quick, args.rounds, args.iterations, args.figures = True, 1, 8, False
        args.schedules, args.batch_size = "alternating", 8
        if args.baseline:    # one mode on each tree: the baseline's path runs
            args.modes = "bsp"
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
    picked = {x.strip() for x in args.modes.split(",")} | {"bsp"}
    if any(x not in SHORT for x in picked):
        p.error(f"--modes: choose from {', '.join(SHORT)}")
    modes = [m for short, m in SHORT.items() if short in picked]
    if args.cgroup and (args.no_pin or not os.access(CGROUP.parent, os.W_OK)):
        p.error(f"--cgroup: needs pinned workers and a writable {CGROUP.parent} (root, "
                f"cgroup v1's cpu controller); run without --cgroup")
    name = "contention" + ("_quick" if args.quick else "")
    if args.schedules != "alternating,independent":
        name += "_" + "_".join(chosen)
    if args.cgroup:
        name += "_cgroup"
    if args.baseline:
        name += f"_baseline_{args.baseline}"
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()
    train = ["--model", args.model, "--data", "synthetic", "--samples", "8192",
             "--batch-size", str(args.batch_size), "--epochs", "1000",
             "--iterations", str(iters), "--log-interval", "0"]
    pin = [] if args.no_pin else [str(PIN), C.PY]

    results, figures = {}, {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if args.cgroup:
            stack.enter_context(cgroups(cores[:2]))
        # arm -> (mode, the tree whose code runs it: None for this one)
        arms = {m: (m, None) for m in modes}
        if args.baseline:
            tree = C.importable(stack.enter_context(C.worktree(args.baseline)))
            arms = {a: v for m in modes
                    for a, v in ((m, (m, None)), (f"{m}@{args.baseline}", (m, tree)))}
        for sched_name in chosen:
            description, schedule = known[sched_name]
            if args.no_pin:
                schedule = [(-1, *rest) for _core, *rest in schedule]
            runs = {a: [] for a in arms}
            paths = {a: [] for a in arms}
            follow = {a: [] for a in arms}
            tenant_duty = []
            for r in range(rounds):
                for arm in S.order(arms, r):
                    mode, tree = arms[arm]
                    sync, predictor = MODES[mode]
                    extra = ["--predictor", predictor] if predictor else []
                    example = C.EXAMPLE if tree is None else tree / "examples" / "train_gluon.py"
                    tag = "" if tree is None else f"-{args.baseline}"
                    path = Path(tmp) / (f"{sched_name}-{predictor or 'bsp'}{tag}"
                                        f"-round{r + 1}.jsonl")
                    C.progress(f"{sched_name} round {r + 1}/{rounds}: {arm} "
                               f"(load {S.load():.1f})")
                    tenants = Tenants(schedule, args.cgroup)
                    started = time.monotonic()
                    load_before = S.load()
                    try:
                        with tenants:
                            s = C.launch(2, [], path, sync=sync, launch_args=extra,
                                         command=[C.PY, *pin, str(example), *train], tree=tree)
                    finally:
                        tenants.kill_all()
                    wall = time.monotonic() - started
                    s["load"] = [load_before, S.load()]
                    tenant_duty.append([x / wall for x in tenants.on_seconds])
                    runs[arm].append(s)
                    paths[arm].append(path)
                    follow[arm].append(shares_by_state(path, tenants))
                    C.progress(f"  {s['samples_per_s']:.1f} samples/s, wait "
                               f"{100 * s['wait_share']:.1f}%, worker 0's share by tenants "
                               f"on: {follow_text(follow[arm][-1])}")
            rows = {}
            for arm, (mode, tree) in arms.items():
                base = "BSP" if tree is None else f"BSP@{args.baseline}"
                tput = [s["samples_per_s"] for s in runs[arm]]
                sp = [a / b for a, b in zip(tput, [s["samples_per_s"] for s in runs[base]])]
                rows[arm] = {"samples_per_s": C.median(tput), "per_round": tput,
                             "speedup_over_bsp": C.median(sp), "speedup_per_round": sp,
                             "wait_share": C.median([s["wait_share"] for s in runs[arm]]),
                             "worker0_share_by_tenants": follow[arm],
                             "runs": [dict(S.summary_row(s), load=s["load"])
                                      for s in runs[arm]]}
            ideal = [S.ideal_speedup_over_time(q) for q in paths["BSP"]]
            results[sched_name] = {
                "description": description, "schedule": schedule,
                "tenant_duty": [C.median([d[k] for d in tenant_duty])
                                for k in range(len(schedule))],
                "ideal_speedup": C.median(ideal), "ideal_per_round": ideal, "modes": rows}
            if want_figures and "LB-BSP narx" in arms:
                figures[sched_name] = S.figures(
                    {"bsp": paths["BSP"][-1], "narx": paths["LB-BSP narx"][-1]},
                    C.RESULTS / name / sched_name)

    lines = ["| tenants | mode | samples/s | speedup over BSP | per round | fraction of ideal "
             "| wait | worker 0's share by tenants on (last round) | mean local batch "
             "(last round) | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for sched_name, res in results.items():
        for mode, r in res["modes"].items():
            bsp = mode.split("@")[0] == "BSP"
            fraction = ("-" if bsp else
                        f"{100 * r['speedup_over_bsp'] / res['ideal_speedup']:.0f}%")
            r["fraction_of_ideal"] = (None if bsp else
                                      r["speedup_over_bsp"] / res["ideal_speedup"])
            last = r["runs"][-1]
            lines.append(f"| {sched_name} | {mode} | {r['samples_per_s']:.1f} | "
                         f"**{r['speedup_over_bsp']:.2f}x** | "
                         f"{S.rounds_text(r['speedup_per_round'])} | "
                         f"{fraction} | {100 * r['wait_share']:.0f}% | "
                         f"{follow_text(r['worker0_share_by_tenants'][-1])} | "
                         f"{':'.join(f'{b:.1f}' for b in last['per_rank_batch'])} | "
                         f"{S.rounds_text(last['load'], '.1f')} |")
    pinning = ("each worker pinned to its own core (worker r on core r), tenants pinned to "
               "those cores" if not args.no_pin else "nothing pinned")
    if args.cgroup:
        pinning += (f", each core's worker and tenant in a cgroup of cpu.shares {SHARES} "
                    f"(other processes 1024)")
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
        "iteration spent waiting for the others (including push/pull). 'worker 0's share': "
        "its mean share of the global batch in the iterations with only tenant A (on worker "
        "0's core), only B, both or neither on, and how many iterations; 'load': the "
        "1-minute load average before and after the run."
        + (f" NAME@{args.baseline}: the same on the code of {args.baseline}, its speedup "
           f"over BSP@{args.baseline} of the same round." if args.baseline else "")
        + f"\n\nLoad average at start: {load_at_start:.2f}.")
    C.write(name, {"rounds": rounds, "iterations": iters, "model": args.model,
                   "batch_size": args.batch_size, "pinned": not args.no_pin,
                   "baseline": args.baseline, "cgroup": args.cgroup,
                   "load_at_start": load_at_start, "figures": figures,
                   "results": results}, table)


def follow_text(by_state: dict) -> str:
    return ", ".join(f"{k} {v['worker0_share']:.2f} ({v['iterations']})"
                     for k, v in by_state.items())


if __name__ == "__main__":
    main()
