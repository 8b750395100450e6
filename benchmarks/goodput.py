"""Goodput mode: time to a target accuracy against LB-BSP at fixed batches and BSP.

Two workloads (``--workload``), real training with ``examples/train_gluon.py``, workers at
slowdown 1:3 and 1:1:3 (``--clusters``):

* ``mlp``: the MLP on scikit-learn's digits; every sample also costs ``--emulate-compute``
  ms of EMULATED compute (slept, as in the other benchmarks), so a larger batch pays only by
  amortising the per-iteration cost (push/pull, Python). Target test accuracy 0.95.
* ``resnet20``: gluoncv's BatchNorm ResNet-20 (``cifar_resnet20_v1``) on a CIFAR-like
  synthetic set: 4096 3x32x32 images, each its class's random template plus 3x as much
  noise, 512 held-out images of the same classes; real compute only. Target 0.8.

Rank 0 evaluates the test accuracy every ``--eval-interval`` iterations (evaluation time
left out of the training time); a run ends at the first evaluation at or above the target
(the launcher is interrupted there), or after ``--iterations``.

Arms, per cluster and seed, run side by side (the order reversed every other seed):

* **goodput**: ``--sync goodput --batch-range LO:HI`` with its defaults (the LB-BSP
  throughput model, ``--lr-scaling adascale``: AdaScale's gain from the measured noise);
* **goodput sqrt**: the same with ``--lr-scaling sqrt`` (the rule of B alone);
* **goodput homo**: the same with ``--goodput-model homo`` (an equal split's throughput,
  as AdaptDL models equal replicas): what heterogeneity-awareness adds;
* **LB-BSP B=b** for each b of ``--fixed``: the best of them per seed, in hindsight, is
  the reference;
* **BSP**: ``--sync bsp`` at the default B0.

The fixed-B arms start from the same learning rate at B0 and scale it by sqrt(B / B0).

Figures: per cluster, time-to-target ratios taken per seed and their median: goodput / the
best fixed B of that seed (the least of the fixed arms' times: with noisy runs, a minimum of
several is biased low), goodput / the one fixed B with the least median time over the seeds,
goodput / BSP, goodput / goodput homo, goodput / goodput sqrt; the goodput runs' noise scale
and B(t) by iteration (``<name>.png``).

    python benchmarks/goodput.py --smoke                      # one seed, 1:3, a few iterations
    python benchmarks/goodput.py --workload resnet20 --smoke
    python benchmarks/goodput.py --workload mlp --seeds 3     # both clusters
"""
import argparse
import math
import tempfile
from pathlib import Path

import _common as C
import _goodput_runs as R
import _suite as S

#: the synthetic workloads' worker script (examples/train_gluon.py for the others)
BLOBS = str(Path(__file__).resolve().parent / "_goodput_train.py")
WORKLOADS = {
    "mlp": {"label": "MLP on digits", "train": ["--model", "mlp", "--data", "digits"],
            "compute": 0.5, "target": 0.95, "batch_range": "16:512", "fixed": "32,64,128",
            "eval_interval": 5, "iterations": 300, "clusters": "1,3;1,1,3"},
    "resnet20": {"label": "BatchNorm ResNet-20 on synthetic 3x32x32 (4096 images, noise 3)",
                 "train": ["--model", "resnet20", "--data", "synthetic", "--samples", "4096",
                           "--noise", "3", "--image-shape", "3,32,32"],
                 "compute": 0.0, "target": 0.8, "batch_range": "16:256",
                 "fixed": "32,64,128", "eval_interval": 10, "iterations": 300,
                 "clusters": "1,3;1,1,3"},
    # larger batches save many iterations: 10 % of the labels flipped (a high noise scale)
    "labelnoise": {"label": "4-class MLP on 16 000 Gaussian samples, 10 % label noise",
                   "script": BLOBS, "train": ["--separation", "3", "--label-noise", "0.1"],
                   "compute": 0.1, "target": 0.78, "batch_range": "16:512",
                   "fixed": "32,64,128,256", "eval_interval": 5, "iterations": 600,
                   "clusters": "1,3"},
    # they save few: clean labels, well separated classes (a low noise scale), a small
    # learning rate (the progress per iteration is the rate's, which a larger B raises only
    # by sqrt(B/B0) or its gain) and a larger cost per sample
    "lownoise": {"label": "4-class MLP on 16 000 Gaussian samples, clean labels",
                 "script": BLOBS, "train": ["--separation", "4", "--label-noise", "0"],
                 "compute": 1.0, "target": 0.87, "batch_range": "16:512", "lr": 0.01,
                 "fixed": "32,64,128", "eval_interval": 5, "iterations": 400,
                 "clusters": "1,3"},
    # the noise scale grows during the run: three blobs per class (a boundary that is not
    # linear) and 10 % of the labels flipped; in one process (plain Gluon, sqrt(B/B0)
    # scaling, 2 seeds) B=32 and 512 need 80-120 and 30-40 iterations to 0.75 (few saved)
    # but 230-390 and 50-80 to 0.79 (almost all): no fixed B is right for the whole run
    "growing": {"label": "4-class MLP on 16 000 samples, 3 Gaussian blobs per class in 16 "
                         "dimensions, 10 % label noise",
                "script": BLOBS, "train": ["--separation", "4", "--label-noise", "0.1",
                                           "--blobs-per-class", "3", "--dim", "16"],
                "compute": 0.25, "target": 0.79, "batch_range": "16:512",
                "fixed": "32,64,128,256,512", "eval_interval": 5, "iterations": 800,
                "clusters": "1,3"},
}
SMOKE = {"mlp": {"iterations": 12}, "resnet20": {
    "iterations": 6, "eval_interval": 3, "label": "ResNet-20 smoke (512 images)",
    "train": ["--model", "resnet20", "--data", "synthetic", "--samples", "512", "--noise", "3",
              "--image-shape", "3,32,32"]}, "labelnoise": {"iterations": 12},
    "lownoise": {"iterations": 12}, "growing": {"iterations": 12}}
#: (the workload's key, the option that overrides it, its tag in the results' name): a run
#: off a workload's default goes beside the default's results, named by the value
#: (goodput_growing_13_t077: ``--target 0.77``), not over them
OVERRIDES = (("fixed", "fixed", "f"), ("batch_range", "batch_range", "r"),
             ("target", "target", "t"), ("iterations", "iterations", "i"),
             ("eval_interval", "eval_interval", "e"), ("compute", "emulate_compute", "c"))
#: the arms beside goodput (its defaults), the fixed-B ones and BSP (``--arms all``)
VARIANTS = {"goodput sqrt": ["--lr-scaling", "sqrt"],
            "goodput homo": ["--goodput-model", "homo"]}


def _in_name(value) -> str:
    """An option's value as part of a file name: 0.77 -> 077, 16:512 -> 16-512."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text.replace(".", "").replace(",", "-").replace(":", "-")


def arms(fixed, B0, variants=True):
    """{arm: (sync, B, extra launch options)}."""
    out = {"goodput": ("goodput", B0, [])}
    if variants:
        out.update({name: ("goodput", B0, extra) for name, extra in VARIANTS.items()})
    for b in fixed:
        out[f"LB-BSP B={b}"] = ("lbbsp", b, [])
    out[f"BSP B={B0}"] = ("bsp", B0, [])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    p.add_argument("--seeds", type=int, default=3, help="seeds per cluster (default 3)")
    p.add_argument("--clusters", help="slowdown factors; ';' between (default: the "
                   "workload's: 1,3;1,1,3 for mlp and resnet20, 1,3 for the others)")
    p.add_argument("--arms", default="all", choices=["all", "core"],
                   help="all: goodput, goodput sqrt, goodput homo, the fixed B's and BSP; "
                        "core: without the two goodput variants")
    p.add_argument("--fixed", help="LB-BSP arms' global batches (default: the workload's)")
    p.add_argument("--batch-size", type=int, default=64, help="B0 (BSP's, goodput's start)")
    p.add_argument("--batch-range", help="goodput's (default: the workload's)")
    p.add_argument("--lr", type=float,
                   help="learning rate at B0 (default: the workload's; 0.05 but lownoise's)")
    p.add_argument("--target", type=float, help="test accuracy (default: the workload's)")
    p.add_argument("--iterations", type=int, help="most iterations per run")
    p.add_argument("--emulate-compute", type=float, metavar="MS")
    p.add_argument("--eval-interval", type=int)
    p.add_argument("--coordinator-cost", action="store_true",
                   help="instead: the coordinator's allocation latency and goodput's planning "
                        "time, goodput against LB-BSP at a fixed B, with emulated workers "
                        "in this process (2 and 16 workers, 5 rounds)")
    C.add_smoke(p)
    args = p.parse_args()
    if args.coordinator_cost:
        return coordinator_cost(args)
    work = dict(WORKLOADS[args.workload])
    args.clusters = args.clusters or work["clusters"]
    if C.smoke(args):
        work.update(SMOKE[args.workload], fixed="64")
        args.seeds, args.clusters, args.arms = 1, "1,3", "core"
    suffix = ""
    for key, option, tag in OVERRIDES:
        value = getattr(args, option)
        if value is not None:
            if value != WORKLOADS[args.workload][key]:
                suffix += f"_{tag}{_in_name(value)}"
            work[key] = value
    B0 = args.batch_size
    args.lr = args.lr if args.lr is not None else work.get("lr", 0.05)
    work["lr"] = args.lr
    fixed = [int(x) for x in str(work["fixed"]).split(",")]
    table = arms(fixed, B0, variants=args.arms == "all")
    name = f"goodput_{args.workload}_" + args.clusters.replace(",", "").replace(";", "_") + suffix
    load_at_start = S.load()
    cost = R.norm_cost(5 if C.SMOKE else 30)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cluster in args.clusters.split(";"):
            runs = {a: [] for a in table}
            loads = []
            for seed in range(args.seeds):
                for arm in S.order(list(table), seed):
                    sync, B, extra = table[arm]
                    train = [*work["train"], "--batch-size", str(B),
                             "--lr", f"{args.lr * math.sqrt(B / B0):.6g}", "--momentum", "0.9",
                             "--seed", str(seed), "--epochs", "1000",
                             "--iterations", str(work["iterations"]),
                             "--eval-interval", str(work["eval_interval"])]
                    if "script" not in work:
                        train += ["--log-interval", "0"]
                    launch = ["--emulate-slowdown", cluster]
                    if work["compute"]:
                        launch += ["--emulate-compute", str(work["compute"])]
                    if sync == "goodput":           # B = B0: it scales the rate itself
                        launch += ["--batch-range", work["batch_range"], *extra]
                    tag = f"{cluster.replace(',', '')}-{arm.replace(' ', '_')}-s{seed}"
                    loads.append(S.load())
                    C.progress(f"{args.workload} {cluster}, seed {seed}: {arm} "
                               f"(load {loads[-1]:.1f})")
                    run = R.run_to_target(len(cluster.split(",")), train, Path(tmp) / tag,
                                          sync, launch, work["target"],
                                          script=work.get("script"))
                    runs[arm].append(run)
                    C.progress("  " + (f"target at iteration {run['iterations_to_target']}, "
                                       f"{run['seconds_to_target']:.1f} s"
                                       if run["seconds_to_target"] is not None
                                       else "target not reached")
                               + f"; {run['samples_per_s']:.0f} samples/s; median B "
                               + f"{C.median(run['batches']):.0f}; allocation wait "
                               + f"{run['alloc_wait_ms']:.2f} ms")
            results[cluster] = {"runs": runs, "summary": summarise(runs, fixed, B0),
                                "load": [min(loads), max(loads)]}
    C.write(name, {"args": vars(args), "workload": work, "load_at_start": load_at_start,
                   "results": results, "norm_cost": cost},
            R.tables(work, args, B0, load_at_start, results, cost))
    if not C.SMOKE:
        R.trajectory_png(results, C.RESULTS / f"{name}.png", work["label"])


def coordinator_cost(args):
    """``--coordinator-cost``: R.coordinator_cost, written as goodput_coordinator_cost."""
    smoke = C.smoke(args)
    load_at_start = S.load()
    cost = R.coordinator_cost(workers=(2,) if smoke else (2, 16),
                              iterations=30 if smoke else 300, rounds=1 if smoke else 5)
    lines = [f"The coordinator's side of the allocation wait, goodput (`--batch-range 16:1024`, "
             f"adascale) against LB-BSP at B=64, emulated workers in one process, NARX, the "
             f"modes interleaved over the rounds; load average {load_at_start:.1f} at the "
             f"start (ms)", "",
             "| workers | mode | alloc latency median | p99 | planning after the split: "
             "median | p99 |", "|---|---|---|---|---|---|"]
    for n, modes in cost.items():
        for mode, c in modes.items():
            lines.append(f"| {n} | {mode} | {c['alloc_latency_median_ms']:.3f} | "
                         f"{c['alloc_latency_p99_ms']:.3f} | "
                         f"{R._fmt(c['after_split_median_ms'], '{:.3f}')} | "
                         f"{R._fmt(c['after_split_p99_ms'], '{:.3f}')} |")
    C.write("goodput_coordinator_cost", {"load_at_start": load_at_start, "cost": cost},
            "\n".join(lines))


def summarise(runs, fixed, B0):
    """Per-seed ratios of seconds to target (None when an arm missed it), their medians."""
    def secs(arm, k):
        return runs[arm][k]["seconds_to_target"] if arm in runs else None

    keys = ("vs_best_fixed", "vs_fixed_B", "vs_bsp", "vs_homo", "vs_sqrt")
    out = {k + "_per_seed": [] for k in keys}
    out["best_fixed_per_seed"] = []
    # one B in hindsight: the fixed arm of the least median time (an arm that missed the
    # target in a seed counts as infinitely slow there)
    medians = {b: C.median([x if x is not None else math.inf
                            for x in (r["seconds_to_target"] for r in runs[f"LB-BSP B={b}"])])
               for b in fixed}
    out["fixed_B"] = min(medians, key=medians.get)
    for k in range(len(runs["goodput"])):
        g = secs("goodput", k)
        fx = {b: secs(f"LB-BSP B={b}", k) for b in fixed}
        reached = {b: s for b, s in fx.items() if s is not None}
        best = min(reached, key=reached.get) if reached else None
        out["best_fixed_per_seed"].append(best)
        ref = {"vs_best_fixed": reached.get(best), "vs_fixed_B": fx[out["fixed_B"]],
               "vs_bsp": secs(f"BSP B={B0}", k),
               "vs_homo": secs("goodput homo", k), "vs_sqrt": secs("goodput sqrt", k)}
        for key, r in ref.items():
            out[key + "_per_seed"].append(g / r if g is not None and r else None)
    for key in keys:
        xs = [x for x in out[key + "_per_seed"] if x is not None]
        out[key] = C.median(xs) if xs else None
    return out


if __name__ == "__main__":
    main()
