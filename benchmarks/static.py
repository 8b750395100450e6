"""Static heterogeneity: BSP vs LB-BSP with 3 workers at fixed speed ratios, side by side.

Main setting (EMULATED compute): 3 workers train a small MLP on synthetic data, and every
sample costs 2 ms of *emulated* compute (``--emulate-compute 2``: the worker sleeps, using no
CPU), stretched by each worker's fixed slowdown factor (``--emulate-slowdown 1,1,3`` and
``1,2,4``). This keeps the emulated cluster's CPU demand well within this machine's 2 cores,
so the numbers measure balancing, not CPU contention between the workers.

Optional (``--real``, on by default in full mode): 2 workers, ResNet-20 with REAL compute on
synthetic CIFAR-sized images, one of them 3x slower (``--emulate-slowdown 1,3``: its real
compute phase is stretched by sleeping).

For each scenario the modes are interleaved round by round (ABBA); per round the script
computes LB-BSP's speedup over BSP, the ideal speedup from that round's BSP run (sum of the
workers' measured speeds / (n x the slowest)) and LB-BSP's fraction of it; the table shows
medians over rounds and the per-round values.

    python benchmarks/static.py --quick     # 2 rounds x 60 iterations (~3 min)
    python benchmarks/static.py             # 4 rounds x 150 iterations + ResNet-20 (~20 min)
"""
import argparse
import tempfile
from pathlib import Path

import _common as C
import _suite as S

MODES = {"BSP": "bsp", "LB-BSP": "lbbsp"}


def scenarios(args):
    emulated = ["--model", "mlp", "--data", "synthetic", "--samples", "4096",
                "--batch-size", str(args.batch_size), "--epochs", "1000",
                "--iterations", str(args.iterations), "--log-interval", "0"]
    out = [
        dict(name="1:1:3", workers=3, slowdown="1,1,3", train=emulated,
             launch=["--emulate-compute", str(args.emulate_compute)],
             setting=f"MLP, emulated compute {args.emulate_compute} ms/sample"),
        dict(name="1:2:4", workers=3, slowdown="1,2,4", train=emulated,
             launch=["--emulate-compute", str(args.emulate_compute)],
             setting=f"MLP, emulated compute {args.emulate_compute} ms/sample"),
    ]
    if args.real:
        real_iters = max(30, args.iterations // 3)
        out.append(dict(
            name="1:3 (ResNet-20, real)", workers=2, slowdown="1,3",
            train=["--model", "resnet20", "--data", "synthetic", "--samples", "8192",
                   "--batch-size", "128", "--epochs", "1000", "--iterations",
                   str(real_iters), "--log-interval", "0"],
            launch=[], setting="ResNet-20, real compute (B=128)"))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds x 60 iterations")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--emulate-compute", type=float, default=2.0, metavar="MS")
    p.add_argument("--real", action=argparse.BooleanOptionalAction, default=None,
                   help="add the 2-worker real-compute ResNet-20 row (default: full mode only)")
    p.add_argument("--figures", action=argparse.BooleanOptionalAction, default=None,
                   help="write the report figures (default: in full mode, not with --quick)")
    p.add_argument("--only", help="comma-separated scenario names to run, e.g. 1:1:3")
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):        # one round of 1:1:3, 8 iterations: BSP and LB-BSP
        args.quick, args.rounds, args.iterations = True, 1, 8
        args.real, args.figures, args.only = False, False, args.only or "1:1:3"
    args.rounds = args.rounds or (2 if args.quick else 4)
    args.iterations = args.iterations or (60 if args.quick else 150)
    if args.real is None:
        args.real = not args.quick
    if args.figures is None:
        args.figures = not args.quick
    name = "static" + ("_quick" if args.quick else "")
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()

    results, figure_runs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [sc for sc in scenarios(args) if not args.only
                  or sc["name"].split(" ")[0] in args.only.split(",")]
        if not chosen:
            p.error(f"--only {args.only!r} matches no scenario")
        for sc in chosen:
            runs = {m: [] for m in MODES}
            paths = {m: [] for m in MODES}
            for r in range(args.rounds):
                for mode in S.order(MODES, r):
                    tag = sc["slowdown"].replace(",", "-")
                    path = Path(tmp) / f"{MODES[mode]}-{tag}-round{r + 1}.jsonl"
                    C.progress(f"{sc['name']} round {r + 1}/{args.rounds}: {mode} "
                               f"(load {S.load():.1f})")
                    s = C.launch(sc["workers"], sc["train"], path, sync=MODES[mode],
                                 launch_args=["--emulate-slowdown", sc["slowdown"],
                                              *sc["launch"]])
                    runs[mode].append(s)
                    paths[mode].append(path)
                    C.progress(f"  {s['samples_per_s']:.1f} samples/s, wait "
                               f"{100 * s['wait_share']:.1f}%")
            speedup = [lb["samples_per_s"] / b["samples_per_s"]
                       for lb, b in zip(runs["LB-BSP"], runs["BSP"])]
            ideal = [S.ideal_speedup(b) for b in runs["BSP"]]
            fraction = [s / i for s, i in zip(speedup, ideal)]
            results[sc["name"]] = {
                "workers": sc["workers"], "slowdown": sc["slowdown"], "setting": sc["setting"],
                "bsp_samples_per_s": C.median([s["samples_per_s"] for s in runs["BSP"]]),
                "lbbsp_samples_per_s": C.median([s["samples_per_s"] for s in runs["LB-BSP"]]),
                "bsp_wait_share": C.median([s["wait_share"] for s in runs["BSP"]]),
                "lbbsp_wait_share": C.median([s["wait_share"] for s in runs["LB-BSP"]]),
                "speedup": C.median(speedup), "speedup_per_round": speedup,
                "ideal_speedup": C.median(ideal), "ideal_per_round": ideal,
                "fraction_of_ideal": C.median(fraction), "fraction_per_round": fraction,
                "lbbsp_predictor": S.predictor_of(paths["LB-BSP"][-1]),
                "lbbsp_mean_batches": [round(x, 1) for x in
                                       S.summary_row(runs["LB-BSP"][-1])["per_rank_batch"]],
                "runs": {m: [S.summary_row(s) for s in runs[m]] for m in MODES},
            }
            if sc["name"] == "1:1:3":
                figure_runs = {m: paths[m][-1] for m in MODES}
        figures = S.figures({"bsp-1-1-3": figure_runs["BSP"],
                             "lbbsp-1-1-3": figure_runs["LB-BSP"]},
                            C.RESULTS / name) if figure_runs and args.figures else None

    rows = ["| workers (slowdown) | setting | BSP samples/s | LB-BSP samples/s | BSP wait | "
            "LB-BSP wait | LB-BSP / BSP | ideal | fraction of ideal | per round (speedup / "
            "ideal) | LB-BSP mean batches |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        per_round = "; ".join(f"{s:.2f}/{i:.2f}" for s, i in
                              zip(r["speedup_per_round"], r["ideal_per_round"]))
        rows.append(
            f"| {r['workers']} ({label.split(' ')[0]}) | {r['setting']} | "
            f"{r['bsp_samples_per_s']:.0f} | {r['lbbsp_samples_per_s']:.0f} | "
            f"{100 * r['bsp_wait_share']:.0f}% | {100 * r['lbbsp_wait_share']:.0f}% | "
            f"**{r['speedup']:.2f}x** | {r['ideal_speedup']:.2f}x | "
            f"**{100 * r['fraction_of_ideal']:.0f}%** | {per_round} | "
            f"{r['lbbsp_mean_batches']} |")
    table = (
        f"Static heterogeneity. Slowdown factors per worker (1:1:3 = the third worker takes 3x "
        f"as long per sample). MLP rows: synthetic 3x32x32 data, global batch "
        f"{args.batch_size}, **emulated compute** of {args.emulate_compute} ms per sample "
        f"(slept, no CPU) stretched by the factor; {args.iterations} iterations per run, first "
        f"5 left out; {args.rounds} round(s), BSP and LB-BSP (predictor "
        f"{next(iter(results.values()))['lbbsp_predictor']}, the default) interleaved (ABBA). "
        f"Values are medians over rounds; speedup and fraction of ideal are per-round "
        f"ratios.\n\n"
        + "\n".join(rows) +
        "\n\n'wait' = mean share of a worker's iteration spent waiting for the others. "
        "'ideal' = sum of the workers' measured compute speeds / (n x the slowest), from the "
        "same round's BSP run: the speedup of a perfect split with no cost. 'fraction of "
        "ideal' = speedup / ideal."
        + (f"\n\nFigures (1:1:3, last round): [{figures}]({figures})" if figures else "")
        + f"\n\nLoad average at start: {load_at_start:.2f}.")
    C.write(name, {"rounds": args.rounds, "iterations": args.iterations,
                   "batch_size": args.batch_size,
                   "emulate_compute_ms": args.emulate_compute,
                   "load_at_start": load_at_start, "figures": figures,
                   "results": results}, table)


if __name__ == "__main__":
    main()
