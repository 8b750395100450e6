"""R2SP where communication is the bottleneck: BSP, ASP, LB-BSP and R2SP side by side with
the parameter servers behind a link of limited bandwidth; then heterogeneous workers
(1:1:3:1) under R2SP with and without batch tuning.

On loopback the servers' link is never the bottleneck, so this script makes one: a network
namespace joined to this machine by a veth pair (tests/netns.py), with a `tc` token bucket
(tbf, ``--rate`` Mbit/s) on *both* ends of the veth. The workers run inside the namespace
(``ip netns exec``, announcing the namespace's address to ps-lite), the scheduler, the
parameter servers and the coordinator outside it: every push (worker -> servers) shares the
one rate-limited direction, every pull the other, as on a parameter server whose NIC is the
bottleneck. (The issue suggested putting the servers in the namespace; with the workers there
instead the launcher needs no change, and the link between all workers and all servers is the
same single bottleneck.) Needs root and iproute2; only traffic to the namespace it made.

The model is a wide MLP (``mlp --width``, 64 -> W -> 10: 75*W parameters, 2.5 MB at W=8192)
whose parameters are large next to its compute, on scikit-learn's digits (real data, real
training). Every sample also costs ``--compute`` ms of emulated compute (slept, no CPU: 2
cores cannot hold 4 workers' real compute). Rank 0 evaluates every ``--eval-interval``
iterations (train_gluon.py's ``eval:`` lines; evaluation time left out).

Each of BSP, ASP and R2SP trains at every learning rate of a small grid (``--lr-grid``; SGD,
momentum 0: server-side momentum with R2SP's fixed staleness of n-1 updates converges badly,
see mxlbbsp/modes/r2sp.py) and is compared at its own best one (the shortest time to the
target, else the best final accuracy): with one learning rate for all, each of the n pushes
of ASP or R2SP moves the weights about as far as one whole BSP step, which flatters them
n-fold per sample. LB-BSP (as synchronous as BSP, the same curve) and the heterogeneous part
run at BSP's and R2SP's best rate. In the asynchronous modes an "iteration" is each worker's
own (one push of its batch); for R2SP one per round. All runs are made in one invocation,
grid points interleaved (ABBA between rounds).

    sudo .venv/bin/python benchmarks/r2sp.py --quick    # 1 round, grid 0.05,0.2,0.8
    sudo .venv/bin/python benchmarks/r2sp.py            # 2 rounds, longer runs
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _common as C
import _suite as S
from time_to_accuracy import parse_curve, reach

sys.path.insert(0, str(C.ROOT / "tests"))
from netns import Netns  # noqa: E402

MODES = {"BSP": ("bsp", []), "ASP": ("asp", []), "LB-BSP": ("lbbsp", []),
         "R2SP": ("r2sp", [])}
TUNED = ["BSP", "ASP", "R2SP"]          # each tried at every learning rate of the grid
FOLLOW = {"LB-BSP": "BSP"}              # runs at that mode's best learning rate
HETERO = {"R2SP, no tuning": ["--r2sp-tuning", "none"],
          "R2SP, paper rule": ["--r2sp-tuning", "paper"],
          "R2SP, balancer": ["--r2sp-tuning", "balancer"]}


def shape_link(ns: Netns, rate_mbit: float) -> None:
    """A token bucket of ``rate_mbit`` on both ends of the veth (one per direction)."""
    spec = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "256kb", "limit", "32mb"]
    for prefix, dev in ((ns.exec_prefix, ns.veth_there), ([], ns.veth_here)):
        res = subprocess.run([*prefix, "tc", "qdisc", "add", "dev", dev, *spec],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"r2sp.py: error: tc on {dev} failed: {res.stderr.strip()}")


def run(ns: Netns, label: str, sync: str, extra_launch, args, out: Path, slowdown=None,
        lr=None) -> dict:
    lr = float(lr)
    train = ["--model", "mlp", "--width", str(args.width), "--data", "digits",
             "--batch-size", str(args.batch_size), "--epochs", "1000",
             "--iterations", str(args.iterations), "--lr", str(lr), "--momentum", "0",
             "--log-interval", "0", "--eval-interval", str(args.eval_interval)]
    # The scheduler and servers bind to this side of the veth (--ps-interface); a worker, in
    # the namespace, announces the namespace's address (ps-lite's DMLC_NODE_HOST wins).
    command = [*ns.exec_prefix, "env", f"DMLC_NODE_HOST={ns.address}",
               f"DMLC_INTERFACE={ns.veth_there}", C.PY, str(C.EXAMPLE), *train]
    launch = ["--ps-interface", ns.veth_here,
              "--emulate-compute", str(args.compute), "--stall-timeout", "90", *extra_launch]
    if slowdown:
        launch += ["--emulate-slowdown", slowdown]
    tag = f"{label.replace(' ', '').replace(',', '_').lower()}_lr{lr:g}"
    metrics, log = out / f"{tag}.jsonl", out / f"{tag}.log"
    C.progress(f"{label}: {sync} {' '.join(extra_launch)} lr {lr:g}")
    for attempt in range(2):
        try:
            summary = C.launch(args.workers, [], metrics, sync=sync, launch_args=launch,
                               command=command, log=log)
            break
        except SystemExit as exc:          # a failed job: keep its log, try once more
            failed = out / f"{tag}.failed{attempt}.log"
            if log.exists():
                log.rename(failed)
            C.progress(f"  {label}: job failed ({exc}); log kept in {failed}")
            if attempt:
                raise
    curve = parse_curve(log.read_text())
    hit = reach(curve, args.target)
    row = {"label": label, "sync": sync, "lr": lr, "iteration_s": summary["mean_iteration_s"],
           "samples_per_s": summary["samples_per_s"], "wait_share": summary["wait_share"],
           "final_accuracy": curve[-1][1] if curve else None,
           "time_to_target_s": hit[2] if hit else None,
           "iterations_to_target": hit[0] if hit else None, "wall_s": summary["wall_s"],
           "curve": [[it, acc, train_s] for it, acc, train_s, _ in curve]}
    C.progress(f"  {label}: {row['iteration_s']:.3f} s/iteration, "
               f"{row['samples_per_s']:.0f} samples/s, to {args.target}: "
               f"{row['time_to_target_s']} s / {row['iterations_to_target']} it, "
               f"final {row['final_accuracy']}")
    return row


def fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, shorter runs")
    C.add_smoke(p)
    p.add_argument("--rounds", type=int)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", type=float, default=400, help="link rate, Mbit/s each way")
    p.add_argument("--width", type=int, default=8192, help="MLP hidden units")
    p.add_argument("--compute", type=float, default=10, help="emulated ms per sample")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr-grid", help="learning rates each of BSP, ASP and R2SP is tried at "
                   "(default 0.05,0.2,0.8 quick, 0.05,0.1,0.2,0.4,0.8 full)")
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--iterations", type=int, help="per run (default 120 quick, 200 full)")
    p.add_argument("--eval-interval", type=int, default=5)
    p.add_argument("--slowdown", default="1,1,3,1", help="heterogeneous part's factors")
    p.add_argument("--skip-hetero", action="store_true")
    args = p.parse_args()
    hetero_labels, tuned, follow = list(HETERO), list(TUNED), dict(FOLLOW)
    if C.smoke(args):        # 3 short jobs: BSP, R2SP, R2SP 1:3 tuned; 2 workers, one lr
        tuned, follow = ["BSP", "R2SP"], {}
        args.quick, args.workers, args.width, args.compute = True, 2, 256, 1
        args.iterations, args.eval_interval, args.lr_grid = 6, 2, args.lr_grid or "0.2"
        hetero_labels = ["R2SP, paper rule"]
        args.slowdown = "1,3"
    rounds = args.rounds or (1 if args.quick else 2)
    args.iterations = args.iterations or (120 if args.quick else 200)
    try:
        grid = [float(x) for x in (args.lr_grid or ("0.05,0.2,0.8" if args.quick else
                                                     "0.05,0.1,0.2,0.4,0.8")).split(",")]
    except ValueError:
        raise SystemExit(f"r2sp.py: error: --lr-grid {args.lr_grid!r}: expected numbers "
                         "separated by commas, e.g. --lr-grid 0.05,0.2,0.8") from None
    if os.geteuid() != 0:
        raise SystemExit("r2sp.py: error: needs root (network namespace and tc); run it as "
                         "root or with sudo")
    load_at_start = S.load() if args.quick else S.wait_for_quiet()
    ns = Netns()
    why = ns.create()
    if why:
        raise SystemExit(f"r2sp.py: error: cannot make the network namespace: {why}")
    # runs[label][lr]: one row per round
    runs = {label: {lr: [] for lr in grid} for label in tuned}
    runs.update({label: {} for label in follow})
    hetero = {label: [] for label in hetero_labels}
    best = {}
    try:
        shape_link(ns, args.rate)
        tmp = Path(tempfile.mkdtemp(prefix="mxlbbsp-r2sp-"))   # kept for inspection
        C.progress(f"jobs' logs and metrics in {tmp}")
        points = [(label, lr) for label in tuned for lr in grid]
        for k in range(rounds):
            for label, lr in S.order(points, k):
                sync, extra = MODES[label]
                runs[label][lr].append(run(ns, label, sync, extra, args, tmp, lr=lr))
        best = {label: pick_lr(runs[label]) for label in tuned}
        C.progress("best learning rates: " + ", ".join(f"{m} {lr:g}" for m, lr in best.items()))
        for k in range(rounds):
            for label in S.order(list(follow), k):
                sync, extra = MODES[label]
                lr = best[follow[label]]
                runs[label].setdefault(lr, []).append(
                    run(ns, label, sync, extra, args, tmp, lr=lr))
            if not args.skip_hetero:
                for label in S.order(hetero_labels, k):
                    hetero[label].append(run(ns, label, "r2sp", HETERO[label], args, tmp,
                                             slowdown=args.slowdown, lr=best["R2SP"]))
    finally:
        ns.delete()
    for label in follow:
        best[label] = best[follow[label]]
    shown = [label for label in MODES if label in runs]
    at_best = {label: runs[label][best[label]] for label in shown}

    def med(rows, key):
        xs = [r[key] for r in rows if r[key] is not None]
        return C.median(xs) if xs else None

    def per_round(rows, base, key):
        return [ratio(a[key], b[key]) for a, b in zip(rows, base)]

    summary = {"best_lr": best, "grid": grid}
    grid_rows = ["| mode | " + " | ".join(f"lr {lr:g}" for lr in grid) + " |",
                 "|---|" + "---|" * len(grid)]
    for label in tuned:
        cells = []
        for lr in grid:
            rows = runs[label][lr]
            tt, acc = med(rows, "time_to_target_s"), med(rows, "final_accuracy")
            cell = f"{fmt(tt, '.1f')} s / {fmt(acc, '.3f')}"
            cells.append(f"**{cell}**" if lr == best[label] else cell)
        grid_rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows = ["| mode (best lr) | iteration (s) | vs BSP | samples/s | wait share | "
            "time to target (s) | vs BSP | iterations to target | final accuracy |",
            "|---|---|---|---|---|---|---|---|---|"]
    for label in shown:
        mine = at_best[label]
        it_r = [x for x in per_round(mine, at_best["BSP"], "iteration_s") if x is not None]
        tt_r = [x for x in per_round(mine, at_best["BSP"], "time_to_target_s")
                if x is not None]
        summary[label] = {"lr": best[label],
                          "iteration_ratio": C.median(it_r) if it_r else None,
                          "time_to_target_ratio": C.median(tt_r) if tt_r else None}
        rows.append(f"| {label} ({best[label]:g}) | {fmt(med(mine, 'iteration_s'), '.3f')} | "
                    f"{S.rounds_text(it_r) if it_r else '—'} | "
                    f"{fmt(med(mine, 'samples_per_s'), '.0f')} | "
                    f"{fmt(100 * med(mine, 'wait_share'), '.0f')}% | "
                    f"{fmt(med(mine, 'time_to_target_s'), '.1f')} | "
                    f"{S.rounds_text(tt_r) if tt_r else '—'} | "
                    f"{fmt(med(mine, 'iterations_to_target'), '.0f')} | "
                    f"{fmt(med(mine, 'final_accuracy'), '.3f')} |")
    hrows = []
    if not args.skip_hetero:
        base = "R2SP, no tuning" if "R2SP, no tuning" in hetero else hetero_labels[0]
        hrows = ["| R2SP, slowdown " + args.slowdown.replace(",", ":") + " | iteration (s) | "
                 "samples/s | time to target (s) | vs " + base + " | iterations to target | "
                 "final accuracy |", "|---|---|---|---|---|---|---|"]
        for label in hetero_labels:
            tt_r = [x for x in per_round(hetero[label], hetero[base], "time_to_target_s")
                    if x is not None]
            summary[label] = {"time_to_target_ratio": C.median(tt_r) if tt_r else None}
            hrows.append(f"| {label} | {fmt(med(hetero[label], 'iteration_s'), '.3f')} | "
                         f"{fmt(med(hetero[label], 'samples_per_s'), '.0f')} | "
                         f"{fmt(med(hetero[label], 'time_to_target_s'), '.1f')} | "
                         f"{S.rounds_text(tt_r) if tt_r else '—'} | "
                         f"{fmt(med(hetero[label], 'iterations_to_target'), '.0f')} | "
                         f"{fmt(med(hetero[label], 'final_accuracy'), '.3f')} |")
    table = (
        f"R2SP with the parameter servers behind a {args.rate:g} Mbit/s link each way (tc tbf "
        f"on a veth into a network namespace holding the {args.workers} workers). `mlp` of "
        f"width {args.width} ({75 * args.width / 1e6:.2f} M parameters) on scikit-learn "
        f"digits, global batch {args.batch_size}, SGD momentum 0, "
        f"{args.compute:g} ms emulated compute per sample, {args.iterations} iterations per "
        f"run, rank 0 evaluates every {args.eval_interval}; target {100 * args.target:.0f}% "
        f"test accuracy. {rounds} round(s), runs interleaved (ABBA); medians; the ratio "
        f"columns list one ratio per round. Iteration time: each worker's own, averaged "
        f"(first 5 left out). The machine (2 cores) was shared with other engineers' runs.\n\n"
        f"Learning-rate grid (time to target / final accuracy; **bold**: the mode's best, "
        f"the shortest time to target):\n\n" + "\n".join(grid_rows)
        + "\n\nEach mode at its own best learning rate (LB-BSP at BSP's):\n\n"
        + "\n".join(rows)
        + (f"\n\nHeterogeneous workers, R2SP only, at its best learning rate "
           f"({best['R2SP']:g}):\n\n" + "\n".join(hrows) if hrows else "")
        + f"\n\nLoad average at start: {load_at_start:.2f}.")
    C.write("r2sp_quick" if args.quick and not C.SMOKE else "r2sp",
            {"rounds": rounds, "args": vars(args), "load_at_start": load_at_start,
             "summary": summary, "runs": {label: {str(lr): rs for lr, rs in by_lr.items()}
                                          for label, by_lr in runs.items()},
             "hetero": hetero}, table)


def pick_lr(by_lr: dict) -> float:
    """The learning rate with the shortest median time to the target; when none reaches
    it, the best median final accuracy."""
    def key(lr):
        rows = by_lr[lr]
        tts = [r["time_to_target_s"] for r in rows if r["time_to_target_s"] is not None]
        accs = [r["final_accuracy"] for r in rows if r["final_accuracy"] is not None]
        reached = len(tts) == len(rows) and rows
        return (0 if reached else 1, C.median(tts) if reached else -(C.median(accs) if accs
                                                                      else 0.0))
    return min(by_lr, key=key)


if __name__ == "__main__":
    main()
