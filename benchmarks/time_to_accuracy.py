"""Time to accuracy: BSP, ASP and LB-BSP training a CNN on scikit-learn's digits (real data,
real training), 3 workers with slowdown factors 1:1:3.

Every sample also costs ``--emulate-compute`` ms of EMULATED compute (slept, no CPU), so
that the per-sample cost is that of a realistic model and compute dominates synchronisation,
as on a real cluster (the CNN on 8x8 digits alone takes well under 0.1 ms per sample); the
slowdown factors stretch the whole compute phase. Rank 0 (a fast worker) evaluates the test
accuracy every ``--eval-interval`` iterations (``examples/train_gluon.py --eval-interval``;
the time spent evaluating is left out of the training time it reports).

Per mode: the training time and the iterations until the test accuracy first reaches the
target. ASP runs twice: with the same hyperparameters as BSP (lr 0.05, momentum 0.9), and
with momentum 0.5 (asynchrony acts like extra momentum; with 0.9 ASP oscillates here). For
ASP an "iteration" of rank 0 is one of its own pushes of B/3 samples; the table also gives
the samples all workers had processed by then, in units of B. LB-BSP is the same algorithm
as BSP (large-batch SGD; the CNN is batch-independent), so its accuracy-per-iteration curve
must match BSP's: the script reports the largest difference.

    python benchmarks/time_to_accuracy.py --quick    # 1 round, up to 200 iterations (~4 min)
    python benchmarks/time_to_accuracy.py            # 3 rounds, up to 200 iterations (~12 min)
"""
import argparse
import re
import tempfile
from pathlib import Path

import _common as C
import _suite as S
from mxlbbsp.core import metrics as _metrics

#: label -> (sync mode, extra training options); ASP runs once with the same hyperparameters
#: and once with momentum 0.5 (asynchrony adds implicit momentum: with 0.9 it oscillates)
MODES = {"BSP": ("bsp", []), "ASP": ("asp", []),
         "ASP, momentum 0.5": ("asp", ["--momentum", "0.5"]), "LB-BSP": ("lbbsp", [])}
EVAL = re.compile(r"eval: iteration=(\d+) accuracy=([\d.]+) train_s=([\d.]+) eval_s=([\d.]+) "
                  r"time=([\d.]+)")


def parse_curve(log_text: str):
    """[(iteration, accuracy, train_s, unix_time)] from rank 0's eval lines."""
    return [(int(m[1]), float(m[2]), float(m[3]), float(m[5]))
            for m in EVAL.finditer(log_text)]


def reach(curve, target):
    """The first point of the curve with accuracy >= target, or None."""
    for point in curve:
        if point[1] >= target:
            return point
    return None


def global_batches(metrics_path: Path, times, B: int):
    """For each Unix time: samples processed by all workers (records reported up to that
    moment) / B -- ASP's progress in units of the synchronous modes' iterations."""
    recs = sorted((r["time"], int(r["batch_size"])) for r in _metrics.load(str(metrics_path)))
    out, done, k = [], 0, 0
    for t in times:
        while k < len(recs) and recs[k][0] <= t:
            done += recs[k][1]
            k += 1
        out.append(done / B)
    return out


def plot_curves(curves: dict, target: float, path: Path) -> None:
    """Accuracy per iteration and per second of training, one line per mode (last round)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"BSP": "#4c72b0", "ASP": "#8c8c8c", "ASP, momentum 0.5": "#55a868",
              "LB-BSP": "#dd8452"}
    styles = {"LB-BSP": "--"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), dpi=90)
    for mode, (curve, x) in curves.items():
        if not curve:
            continue
        acc, sec = [p[1] for p in curve], [p[2] for p in curve]
        kw = dict(color=colors.get(mode), lw=1.6)
        axes[0].plot(x, acc, styles.get(mode, "-"), label=mode, **kw)
        axes[1].plot(sec, acc, styles.get(mode, "-"), label=mode, **kw)
    for ax, xlabel in zip(axes, ("iteration (ASP: samples processed / B)",
                                 "training time (s)")):
        ax.axhline(target, color="#999", lw=0.8, ls=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.5, 1.0)
        ax.grid(True, color="#e3e3e3")
    axes[0].set_title("Accuracy per iteration (LB-BSP dashed over BSP)", fontsize=10)
    axes[1].set_title("Accuracy over training time", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False,
               fontsize=8.5)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    S.shrink_png(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, up to 200 iterations")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int, help="most iterations per run")
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy")
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--emulate-compute", type=float, default=2.0, metavar="MS")
    p.add_argument("--slowdown", default="1,1,3")
    p.add_argument("--eval-interval", type=int, default=5)
    p.add_argument("--figures", action=argparse.BooleanOptionalAction, default=None,
                   help="write the report figures (default: in full mode, not with --quick)")
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):        # one round of 10 iterations, evaluating every 5
        args.quick, args.rounds, args.iterations, args.figures = True, 1, 10, False
    rounds = args.rounds or (1 if args.quick else 3)
    iters = args.iterations or 200
    name = "time_to_accuracy" + ("_quick" if args.quick else "")
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()
    workers = len(args.slowdown.split(","))
    train = ["--model", "cnn", "--data", "digits", "--batch-size", str(args.batch_size),
             "--lr", str(args.lr), "--epochs", "1000", "--iterations", str(iters),
             "--log-interval", "0", "--eval-interval", str(args.eval_interval)]
    launch_args = ["--emulate-slowdown", args.slowdown,
                   "--emulate-compute", str(args.emulate_compute)]
    runs = {m: [] for m in MODES}
    paths = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for k, mode in enumerate(S.order(MODES, r)):
                sync, extra = MODES[mode]
                path = Path(tmp) / f"{k}-{sync}-round{r + 1}.jsonl"
                log = Path(tmp) / f"{k}-{sync}-round{r + 1}.log"
                C.progress(f"round {r + 1}/{rounds}: {mode} (load {S.load():.1f})")
                s = C.launch(workers, train + extra, path, sync=sync,
                             launch_args=launch_args, log=log)
                curve = parse_curve(log.read_text())
                hit = reach(curve, args.target)
                x = ([p[0] for p in curve] if sync != "asp" else
                     global_batches(path, [p[3] for p in curve], args.batch_size))
                run = {"samples_per_s": s["samples_per_s"], "wait_share": s["wait_share"],
                       "curve": curve, "x": x, "reached": hit is not None,
                       "iterations_to_target": hit[0] if hit else None,
                       "seconds_to_target": hit[2] if hit else None,
                       "final_accuracy": curve[-1][1] if curve else None,
                       "predictor": S.predictor_of(path)}
                if hit and sync == "asp":
                    run["global_batches_to_target"] = x[curve.index(hit)]
                runs[mode].append(run)
                paths[mode].append(path)
                C.progress(f"  {s['samples_per_s']:.0f} samples/s; target {args.target} "
                           + (f"at iteration {hit[0]}, {hit[2]:.1f} s" if hit else
                              "not reached") + f"; final accuracy {run['final_accuracy']}")
        figures = None
        if (not args.quick) if args.figures is None else args.figures:
            figures = S.figures({"bsp": paths["BSP"][-1], "lbbsp": paths["LB-BSP"][-1]},
                                C.RESULTS / name)
            plot_curves({m: (runs[m][-1]["curve"], runs[m][-1]["x"]) for m in MODES},
                        args.target, C.RESULTS / name / "accuracy.png")

    def med(mode, key):
        xs = [x[key] for x in runs[mode] if x.get(key) is not None]
        return C.median(xs) if xs else None

    # per round: LB-BSP's time and iterations relative to BSP's; curve difference
    time_ratio, iter_ratio, max_diff = [], [], []
    for bsp, lb in zip(runs["BSP"], runs["LB-BSP"]):
        if bsp["reached"] and lb["reached"]:
            time_ratio.append(lb["seconds_to_target"] / bsp["seconds_to_target"])
            iter_ratio.append(lb["iterations_to_target"] / bsp["iterations_to_target"])
        a = {p[0]: p[1] for p in bsp["curve"]}
        common = [(a[p[0]], p[1]) for p in lb["curve"] if p[0] in a]
        max_diff.append(max(abs(x - y) for x, y in common) if common else float("nan"))
    vs_bsp = {}
    for mode in MODES:
        ratios = [a["seconds_to_target"] / b["seconds_to_target"]
                  for a, b in zip(runs[mode], runs["BSP"]) if a["reached"] and b["reached"]]
        vs_bsp[mode] = {"median": C.median(ratios) if ratios else None, "per_round": ratios}
    summary = {"lbbsp_time_ratio": vs_bsp["LB-BSP"]["median"],
               "lbbsp_time_ratio_per_round": time_ratio,
               "lbbsp_iteration_ratio": C.median(iter_ratio) if iter_ratio else None,
               "lbbsp_iteration_ratio_per_round": iter_ratio,
               "max_accuracy_difference_lbbsp_vs_bsp": max(max_diff) if max_diff else None,
               "time_to_target_vs_bsp": vs_bsp}

    def fmt(x, spec, suffix=""):
        return "-" if x is None else format(x, spec) + suffix

    rows = ["| mode | reached (rounds) | training time to target | vs BSP | iterations to "
            "target | final accuracy | samples/s | wait |", "|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        reached = sum(x["reached"] for x in runs[mode])
        secs = med(mode, "seconds_to_target")
        its = med(mode, "iterations_to_target")
        ratio = fmt(vs_bsp[mode]["median"], ".2f", "x")
        it_text = fmt(its, ".0f")
        if med(mode, "global_batches_to_target") is not None:
            it_text += (f" of rank 0 (all workers: {med(mode, 'global_batches_to_target'):.0f}"
                        f" x B samples)")
        rows.append(f"| {mode} | {reached}/{rounds} | {fmt(secs, '.1f', ' s')} | **{ratio}** | "
                    f"{it_text} | {fmt(med(mode, 'final_accuracy'), '.3f')} | "
                    f"{med(mode, 'samples_per_s'):.0f} | {100 * med(mode, 'wait_share'):.0f}% |")
    table = (
        f"Time to {100 * args.target:.0f}% test accuracy. scikit-learn digits (1437 train / "
        f"360 test images, 8x8), the `cnn` model, SGD lr {args.lr} momentum 0.9, global batch "
        f"{args.batch_size}, {workers} workers with slowdown {args.slowdown.replace(',', ':')}"
        f", plus **{args.emulate_compute} ms of emulated compute per sample** (slept, no CPU; "
        f"stretched by the slowdown). Real training, real data: only the per-sample cost is "
        f"emulated. Rank 0 evaluates every {args.eval_interval} iterations; at most {iters} "
        f"iterations per run; {rounds} round(s), modes interleaved (ABBA); medians. LB-BSP "
        f"uses the default predictor ({runs['LB-BSP'][0]['predictor']}).\n\n"
        + "\n".join(rows) +
        f"\n\nLB-BSP vs BSP per round: training time ratio "
        f"{S.rounds_text(time_ratio)}; iterations ratio {S.rounds_text(iter_ratio)}; largest "
        f"difference between their accuracy-per-iteration curves "
        f"{fmt(summary['max_accuracy_difference_lbbsp_vs_bsp'], '.4f')} "
        f"(same iterations evaluated). Training time excludes rank 0's evaluations."
        + (f"\n\n![accuracy curves]({name}/accuracy.png)\n\nFigures (last round; BSP, "
           f"LB-BSP): [{figures}]({figures})" if figures else "")
        + f"\n\nLoad average at start: {load_at_start:.2f}.")
    C.write(name, {"rounds": rounds, "iterations": iters, "target": args.target,
                   "batch_size": args.batch_size, "lr": args.lr,
                   "emulate_compute_ms": args.emulate_compute,
                   "slowdown": args.slowdown, "load_at_start": load_at_start,
                   "summary": summary, "figures": figures,
                   "runs": runs}, table)


if __name__ == "__main__":
    main()
