"""LB-BSP vs BSP throughput on a CIFAR-sized ResNet-20, 2 workers, side by side.

Scenarios: one worker emulated 3x slower (``--emulate-slowdown 1,3``; ideal speedup 2.0x:
BSP waits 3 units per iteration, a perfect split finishes in 1.5), and two equal workers
(LB-BSP must not cost anything: >= 0.95x). Runs are interleaved round by round, alternating
which mode goes first, and the speedup is the median of the per-round ratios.

    python benchmarks/throughput.py            # 3 rounds x 60 iterations (~15 min)
    python benchmarks/throughput.py --quick    # 1 round x 30 iterations (~4 min)
"""
import argparse
import tempfile
from pathlib import Path

import _common as C

SCENARIOS = {"1:3": "1,3", "1:1": "1,1"}
MODES = {"BSP": ("bsp", []), "LB-BSP": ("lbbsp", [])}


def ideal_speedup(summary: dict) -> float:
    """Sum of the workers' compute speeds over n x the slowest: perfect balancing."""
    speeds = [r["mean_speed"] for r in summary["per_rank"].values()]
    return sum(speeds) / (len(speeds) * min(speeds))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--time-model", default=None, help="pass --time-model to LB-BSP")
    C.add_smoke(p)
    args = p.parse_args()
    scenarios = dict(SCENARIOS)
    if C.smoke(args):        # one round of 1:3, 7 iterations of a batch of 16
        args.quick, args.rounds, args.iterations, args.batch_size = True, 1, 7, 16
        scenarios = {"1:3": SCENARIOS["1:3"]}
    rounds = args.rounds or (1 if args.quick else 3)
    iters = args.iterations or (30 if args.quick else 60)
    train = ["--model", "resnet20", "--data", "synthetic", "--samples", "8192",
             "--batch-size", str(args.batch_size), "--epochs", "100",
             "--iterations", str(iters), "--log-interval", "0"]
    lb_extra = ["--time-model", args.time_model] if args.time_model else []
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in scenarios.items():
            runs = {m: [] for m in MODES}
            for r in range(rounds):
                order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
                for mode in order:
                    sync, extra = MODES[mode]
                    extra = extra + (lb_extra if sync == "lbbsp" else [])
                    C.progress(f"{name} round {r + 1}/{rounds}: {mode}")
                    s = C.launch(2, train, Path(tmp) / f"{name}-{mode}-{r}.jsonl", sync=sync,
                                 launch_args=["--emulate-slowdown", spec, *extra])
                    runs[mode].append(s)
                    C.progress(f"  {s['samples_per_s']:.1f} samples/s, wait "
                               f"{100 * s['wait_share']:.1f}%")
            ratios = [lb["samples_per_s"] / b["samples_per_s"]
                      for lb, b in zip(runs["LB-BSP"], runs["BSP"])]
            results[name] = {
                "slowdown": spec,
                "bsp_samples_per_s": C.median([s["samples_per_s"] for s in runs["BSP"]]),
                "lbbsp_samples_per_s": C.median([s["samples_per_s"] for s in runs["LB-BSP"]]),
                "bsp_wait_share": C.median([s["wait_share"] for s in runs["BSP"]]),
                "lbbsp_wait_share": C.median([s["wait_share"] for s in runs["LB-BSP"]]),
                "speedup": C.median(ratios),
                "speedup_per_round": ratios,
                "ideal_speedup": C.median([ideal_speedup(s) for s in runs["BSP"]]),
                "lbbsp_mean_batches": [round(r["mean_batch"], 1) for r in
                                       runs["LB-BSP"][-1]["per_rank"].values()],
            }
    rows = ["| workers (speed ratio) | BSP samples/s | LB-BSP samples/s | BSP wait | "
            "LB-BSP wait | LB-BSP / BSP | per round | ideal | LB-BSP mean batches |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| 2 ({name}) | {r['bsp_samples_per_s']:.1f} | "
                    f"{r['lbbsp_samples_per_s']:.1f} | {100 * r['bsp_wait_share']:.0f}% | "
                    f"{100 * r['lbbsp_wait_share']:.0f}% | **{r['speedup']:.2f}x** | "
                    f"{', '.join(f'{x:.2f}' for x in r['speedup_per_round'])} | "
                    f"{r['ideal_speedup']:.2f}x | {r['lbbsp_mean_batches']} |")
    table = (f"ResNet-20 (cifar_resnet20_v1), synthetic 3x32x32 data, global batch "
             f"{args.batch_size}, 2 workers + 1 server on this machine, {iters} iterations "
             f"per run (first 5 left out), {rounds} round(s), modes interleaved.\n\n"
             + "\n".join(rows) +
             "\n\n'ideal' = sum of the workers' measured compute speeds / (2 x the slowest), "
             "from the BSP runs.")
    C.write("throughput" + ("_quick" if args.quick and not C.SMOKE else ""),
            {"rounds": rounds, "iterations": iters, "results": results}, table)


if __name__ == "__main__":
    main()
