"""Goodput mode: time to a target accuracy against LB-BSP at fixed batches and BSP.

The MLP on scikit-learn's digits (real data, real training), workers at slowdown 1:3 and
1:1:3; every sample also costs ``--emulate-compute`` ms of EMULATED compute (slept, as in the
other benchmarks), so a larger batch pays only by amortising the per-iteration cost (push/
pull, Python). Rank 0 evaluates the test accuracy every ``--eval-interval`` iterations
(``examples/train_gluon.py``; evaluation time left out of the training time).

Arms, per cluster and seed, run side by side (the order reversed every other seed):

* **goodput**: ``--sync goodput --batch-range LO:HI`` (LB-BSP throughput model);
* **goodput homo**: the same with ``--goodput-model homo`` (an equal split's throughput,
  as AdaptDL models equal replicas): what heterogeneity-awareness adds;
* **LB-BSP B=b** for each b of ``--fixed``: the best of them per seed, in hindsight, is
  the reference;
* **BSP**: ``--sync bsp`` at the default B0.

Every arm starts from the same learning rate at B0 and scales it by the same rule with its
batch: sqrt(B / B0) (``--lr-scaling sqrt``, the goodput mode's default).

Figures: per cluster, the median over seeds of time-to-target ratios taken per seed:
goodput / best fixed B, goodput / BSP, goodput / goodput homo; and the goodput runs' noise
scale trajectory (the coordinator's smoothed estimate, by iteration).

    python benchmarks/goodput.py --smoke     # one seed, 1:3 only, a few iterations
    python benchmarks/goodput.py --quick     # 1 seed, both clusters (~8 min)
    python benchmarks/goodput.py             # 3 seeds, both clusters
"""
import argparse
import math
import re
import tempfile
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

import _common as C
import _suite as S
import mxlbbsp
from mxlbbsp.core import metrics as _metrics
from mxlbbsp.models import get_model

EVAL = re.compile(r"eval: iteration=(\d+) accuracy=([\d.]+) train_s=([\d.]+)")


def curve(log_text: str):
    return [(int(m[1]), float(m[2]), float(m[3])) for m in EVAL.finditer(log_text)]


def reach(points, target):
    return next((p for p in points if p[1] >= target), None)


def arms(fixed, B0):
    out = {"goodput": ("goodput", B0, []),
           "goodput homo": ("goodput", B0, ["--goodput-model", "homo"])}
    for b in fixed:
        out[f"LB-BSP B={b}"] = ("lbbsp", b, [])
    out[f"BSP B={B0}"] = ("bsp", B0, [])
    return out


def noise_trajectory(path: Path):
    """[(iteration, noise scale, global batch)] of a goodput run (rank 0's records)."""
    out = []
    for r in _metrics.load(str(path)):
        if r.get("rank") == 0 and r.get("noise_scale") is not None:
            out.append((int(r["iteration"]), float(r["noise_scale"]), r.get("global_batch")))
    return out


def norm_cost(reps: int = 30):
    """The worker's extra work in goodput mode, side by side in one process: the squared
    norm of the gradient (Trainer.grad_sqr) against one forward + backward pass, for the
    digits MLP (B=64) and a BatchNorm ResNet-20 on 32x32 images (B=32)."""
    out = {}
    for model, shape, B in (("mlp", (1, 8, 8), 64), ("resnet20", (3, 32, 32), 32)):
        mx.random.seed(0)
        net = get_model(model, classes=10)
        net.initialize(mx.init.Xavier())
        net.hybridize()
        trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        x = nd.random.normal(shape=(B,) + shape)
        y = nd.array(np.random.default_rng(0).integers(0, 10, B))
        step, norm = [], []
        for k in range(reps + 3):
            t0 = time.perf_counter()
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            nd.waitall()
            t1 = time.perf_counter()
            trainer.grad_sqr()
            t2 = time.perf_counter()
            if k >= 3:                      # graph building, allocation
                step.append(t1 - t0)
                norm.append(t2 - t1)
        # ABBA is not needed: both are timed in every repetition, the ratio per repetition
        ratios = [n / s for n, s in zip(norm, step)]
        out[model] = {"batch": B, "step_ms": 1e3 * C.median(step),
                      "norm_ms": 1e3 * C.median(norm), "ratio": C.median(ratios)}
        C.progress(f"grad_sqr cost, {model} B={B}: {out[model]['norm_ms']:.3f} ms against "
                   f"{out[model]['step_ms']:.2f} ms forward+backward "
                   f"({100 * out[model]['ratio']:.1f} %)")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="1 seed (unless --seeds), no waiting for a quiet machine")
    p.add_argument("--seeds", type=int, help="seeds per cluster (default 3, --quick 1)")
    p.add_argument("--clusters", default="1,3;1,1,3", help="slowdown factors; ';' between")
    p.add_argument("--fixed", default="32,64,128,256", help="LB-BSP arms' global batches")
    p.add_argument("--batch-size", type=int, default=64, help="B0 (BSP's, goodput's start)")
    p.add_argument("--batch-range", default="16:512")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at B0")
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--iterations", type=int, default=400, help="most iterations per run")
    p.add_argument("--emulate-compute", type=float, default=0.5, metavar="MS")
    p.add_argument("--eval-interval", type=int, default=5)
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):
        args.seeds, args.clusters, args.fixed, args.iterations = 1, "1,3", "64", 12
    seeds = args.seeds or (1 if args.quick else 3)
    B0 = args.batch_size
    fixed = [int(x) for x in args.fixed.split(",")]
    table = arms(fixed, B0)
    name = "goodput" + ("_quick" if args.quick else "")
    if args.clusters != p.get_default("clusters"):
        name += "_" + args.clusters.replace(",", "").replace(";", "_")
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()
    cost = norm_cost(5 if C.SMOKE else 30)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cluster in args.clusters.split(";"):
            workers = len(cluster.split(","))
            runs = {a: [] for a in table}
            trajectories = []
            for seed in range(seeds):
                for arm in S.order(list(table), seed):
                    sync, B, extra = table[arm]
                    lr = args.lr * math.sqrt(B / B0)
                    train = ["--model", "mlp", "--data", "digits", "--batch-size", str(B),
                             "--lr", f"{lr:.6g}", "--momentum", "0.9", "--seed", str(seed),
                             "--epochs", "1000", "--iterations", str(args.iterations),
                             "--log-interval", "0", "--eval-interval", str(args.eval_interval)]
                    launch = ["--emulate-slowdown", cluster,
                              "--emulate-compute", str(args.emulate_compute)]
                    if sync == "goodput":
                        launch += ["--batch-range", args.batch_range, "--lr-scaling", "sqrt",
                                   *extra]
                    tag = f"{cluster.replace(',', '')}-{arm.replace(' ', '_')}-s{seed}"
                    path, log = Path(tmp) / f"{tag}.jsonl", Path(tmp) / f"{tag}.log"
                    C.progress(f"cluster {cluster}, seed {seed}: {arm} (load {S.load():.1f})")
                    s = C.launch(workers, train, path, sync=sync, launch_args=launch, log=log)
                    pts = curve(log.read_text())
                    hit = reach(pts, args.target)
                    Bs = {}
                    for r in _metrics.load(str(path)):
                        Bs[r["iteration"]] = Bs.get(r["iteration"], 0) + int(r["batch_size"])
                    run = {"seconds_to_target": hit[2] if hit else None,
                           "iterations_to_target": hit[0] if hit else None,
                           "final_accuracy": pts[-1][1] if pts else None,
                           "samples_per_s": s["samples_per_s"],
                           "batches": [Bs[t] for t in sorted(Bs)]}
                    if sync == "goodput":
                        run["noise"] = noise_trajectory(path)
                        if arm == "goodput":
                            trajectories.append(run["noise"])
                    runs[arm].append(run)
                    C.progress("  " + (f"target at iteration {hit[0]}, {hit[2]:.1f} s" if hit
                                       else "target not reached")
                               + f"; {s['samples_per_s']:.0f} samples/s; B "
                               + f"{run['batches'][0]}..{run['batches'][-1]}")
            results[cluster] = {"runs": runs, "summary": summarise(runs, fixed, B0)}

    def fmt(x, spec="{:.2f}"):
        return "-" if x is None else spec.format(x)

    lines = [f"MLP on digits, target test accuracy {args.target}, {seeds} seed(s), "
             f"emulated compute {args.emulate_compute} ms/sample, B0 = {B0}, goodput in "
             f"{args.batch_range}; load at start {load_at_start:.1f}", "",
             "| cluster | arm | reached | median s to target | median final B | samples/s |",
             "|---|---|---|---|---|---|"]
    for cluster, res in results.items():
        for arm, rs in res["runs"].items():
            secs = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
            lines.append(f"| {cluster} | {arm} | {len(secs)}/{len(rs)} | "
                         f"{fmt(C.median(secs) if secs else None, '{:.1f}')} | "
                         f"{C.median([r['batches'][-1] for r in rs]):.0f} | "
                         f"{C.median([r['samples_per_s'] for r in rs]):.0f} |")
    lines += ["", "| cluster | goodput / best fixed B | goodput / BSP | goodput / homo | "
              "noise scale (first, last) |", "|---|---|---|---|---|"]
    for cluster, res in results.items():
        sm = res["summary"]
        noise = [n for r in res["runs"]["goodput"] for n in [r.get("noise")] if n]
        first_last = (f"{noise[0][0][1]:.0f}, {noise[0][-1][1]:.0f}" if noise else "-")
        lines.append(f"| {cluster} | {fmt(sm['vs_best_fixed'])} | {fmt(sm['vs_bsp'])} | "
                     f"{fmt(sm['vs_homo'])} | {first_last} |")
    lines += ["", "Worker cost of the noise scale's norm (Trainer.grad_sqr, one process, median "
              "of 30): " + "; ".join(f"{m} B={c['batch']}: {c['norm_ms']:.3f} ms = "
                                     f"{100 * c['ratio']:.1f} % of forward+backward "
                                     f"({c['step_ms']:.2f} ms)" for m, c in cost.items())]
    C.write(name, {"args": vars(args), "results": results, "norm_cost": cost},
            "\n".join(lines))


def summarise(runs, fixed, B0):
    """Per-seed ratios of seconds to target (None when an arm missed it), their medians."""
    def secs(arm, k):
        return runs[arm][k]["seconds_to_target"]

    out = {"vs_best_fixed_per_seed": [], "vs_bsp_per_seed": [], "vs_homo_per_seed": [],
           "best_fixed_per_seed": []}
    for k in range(len(runs["goodput"])):
        g = secs("goodput", k)
        fx = {b: secs(f"LB-BSP B={b}", k) for b in fixed}
        reached = {b: s for b, s in fx.items() if s is not None}
        best = min(reached, key=reached.get) if reached else None
        out["best_fixed_per_seed"].append(best)
        if g is None:
            continue
        if best is not None:
            out["vs_best_fixed_per_seed"].append(g / reached[best])
        if secs(f"BSP B={B0}", k) is not None:
            out["vs_bsp_per_seed"].append(g / secs(f"BSP B={B0}", k))
        if secs("goodput homo", k) is not None:
            out["vs_homo_per_seed"].append(g / secs("goodput homo", k))
    for key in ("vs_best_fixed", "vs_bsp", "vs_homo"):
        xs = out[key + "_per_seed"]
        out[key] = C.median(xs) if xs else None
    return out


if __name__ == "__main__":
    main()
