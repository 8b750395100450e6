"""The cost of exact BatchNorm statistics (issue 20), side by side in one run.

A BatchNorm ResNet-20 (cifar_resnet20_v1: 21 BatchNorm layers) on synthetic CIFAR-sized
data, 2 workers at 1:3 with LB-BSP. Three arms, interleaved round by round with the order
rotated, throughput (samples/s after the warm-up) compared per round:

* ``exact``: this tree: running statistics combined into the whole global batch's, the
  spread of the workers' batch means included (three centred values per statistic, and one
  more round trip on the first step);
* ``linear``: the combination of commit ``--baseline`` (default 6a5b529, the code before the
  change: one value per statistic, weighted mean, no spread term): the whole job on that
  commit's code from a temporary git worktree, its launcher and coordinator too (a worker
  speaks only to a coordinator of its own commit: the wire messages were renamed since);
* ``off``: no combination at all (``--no-bn-sync`` of examples/train_gluon.py).

    python benchmarks/bn_stats_cost.py            # 3 rounds x 60 iterations
    python benchmarks/bn_stats_cost.py --quick    # 1 round x 30 iterations
    python benchmarks/bn_stats_cost.py --smoke    # 1 round x 8 iterations (CI: it runs)
    python benchmarks/bn_stats_cost.py --rounds 3 --iterations 40   # the recorded run
"""
import argparse
import tempfile
from pathlib import Path

import _common as C

BASELINE = "6a5b529"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    C.add_smoke(p)
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--baseline", default=BASELINE, metavar="REV",
                   help=f"the commit whose combination is 'linear' (default {BASELINE})")
    args = p.parse_args()
    if C.smoke(args):              # the smallest size, whatever else the command says
        args.rounds, args.iterations = 1, 8
    rounds = args.rounds or (1 if args.quick else 3)
    iters = args.iterations or (30 if args.quick else 60)
    train = ["--model", "resnet20", "--data", "synthetic", "--samples", "4096",
             "--batch-size", str(args.batch_size), "--epochs", "100",
             "--iterations", str(iters), "--log-interval", "0"]
    # --relay off in this tree's arms: the baseline has no relays (every worker speaks to
    # the coordinator over TCP), and the arms must differ in the BatchNorm statistics alone
    slow = ["--emulate-slowdown", "1,3"]
    launch = [*slow, "--relay", "off"]
    with C.worktree(args.baseline) as tree, tempfile.TemporaryDirectory() as tmp:
        arms = {"exact": (train, launch, None),
                "linear": (train, slow, C.importable(tree)),
                "off": ([*train, "--no-bn-sync"], launch, None)}
        runs = {name: [] for name in arms}
        for r in range(rounds):
            order = list(arms)[r % 3:] + list(arms)[:r % 3]
            for name in order:
                train_args, launch_args, code = arms[name]
                C.progress(f"round {r + 1}/{rounds}: {name}")
                s = C.launch(2, train_args, Path(tmp) / f"{name}-{r}.jsonl",
                             launch_args=launch_args, tree=code)
                runs[name].append(s["samples_per_s"])
                C.progress(f"  {s['samples_per_s']:.1f} samples/s")
    ratio = {other: [e / o for e, o in zip(runs["exact"], runs[other])]
             for other in ("linear", "off")}
    rows = ["| arm | samples/s (median) | per round | exact / arm (median) | per round |",
            "|---|---|---|---|---|"]
    for name, values in runs.items():
        per = ", ".join(f"{v:.1f}" for v in values)
        if name == "exact":
            rows.append(f"| exact | {C.median(values):.1f} | {per} | 1 | |")
        else:
            rows.append(f"| {name} | {C.median(values):.1f} | {per} | "
                        f"**{C.median(ratio[name]):.3f}x** | "
                        f"{', '.join(f'{x:.3f}' for x in ratio[name])} |")
    table = (f"BatchNorm statistics combined exactly vs linearly ({args.baseline}) vs not at "
             f"all: ResNet-20, synthetic 3x32x32, global batch {args.batch_size}, 2 workers "
             f"at 1:3 (LB-BSP) + 1 server, {iters} iterations per run (first 5 left out), "
             f"{rounds} round(s), arms interleaved.\n\n" + "\n".join(rows))
    suffix = "_quick" if args.quick else ""
    C.write("bn_stats_cost" + suffix, {"rounds": rounds, "iterations": iters,
                                       "baseline": args.baseline, "samples_per_s": runs,
                                       "ratio": ratio}, table)


if __name__ == "__main__":
    main()
