"""`make demo`: 3 workers on this machine, one emulated 3x slower; BSP, then LB-BSP.

Each job trains ResNet-20 on CIFAR-shaped synthetic data (no download) with
`mxlbbsp launch -n 3 --emulate-slowdown 1,1,3`, first with `--sync bsp` (equal split: the
two fast workers wait for the slow one every iteration), then with `--sync lbbsp`. It ends
with a table of throughput, iteration time and waiting, the speedup, and a plotted report.

    python examples/demo.py [--iterations 40] [--model resnet20] [--out runs/demo]
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mxlbbsp.core import metrics  # noqa: E402


#: iterations left out of the table and the report: graph building, and LB-BSP's first splits
WARMUP = 3


def run(mode: str, args, out: Path) -> Path:
    path = out / f"{mode}.jsonl"
    cmd = [sys.executable, "-m", "mxlbbsp.launcher", "launch", "-n", "3",
           "--emulate-slowdown", "1,1,3", "--sync", mode, "--metrics", str(path),
           "--progress", "5", "--",
           sys.executable, str(ROOT / "examples" / "train_gluon.py"), "--model", args.model,
           "--data", "synthetic", "--samples", "8192", "--batch-size", str(args.batch_size),
           "--epochs", "100", "--iterations", str(args.iterations), "--log-interval", "10"]
    print(f"\n=== {mode.upper()}: {' '.join(cmd[2:])}\n", flush=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    if rc != 0:
        sys.exit(f"demo: the {mode} job failed with exit code {rc}")
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--out", default=str(ROOT / "runs" / "demo"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    paths = {mode: run(mode, args, out) for mode in ("bsp", "lbbsp")}
    s = {mode: metrics.summarize(metrics.load(str(path)), skip=WARMUP)
         for mode, path in paths.items()}

    print("\n" + "=" * 72)
    print(f"3 workers, worker 2 emulated 3x slower, {args.model}, global batch "
          f"{args.batch_size}, {args.iterations} iterations each (first {WARMUP} left out)\n")
    print(f"{'mode':<8} {'samples/s':>10} {'iteration':>11} {'waiting':>9}   mean batch per worker")
    for mode, label in (("bsp", "BSP"), ("lbbsp", "LB-BSP")):
        r = s[mode]
        batches = ", ".join(f"{p['mean_batch']:.0f}" for p in r["per_rank"].values())
        print(f"{label:<8} {r['samples_per_s']:>10.1f} {1000 * r['mean_iteration_s']:>9.0f}ms "
              f"{100 * r['wait_share']:>8.0f}%   [{batches}]")
    speedup = s["lbbsp"]["samples_per_s"] / s["bsp"]["samples_per_s"]
    print(f"\nLB-BSP speedup over BSP: {speedup:.2f}x (ideal for 1:1:3 speeds: "
          f"(1 + 1 + 1/3) / (3 x 1/3) = 2.33x)")
    try:
        from mxlbbsp.analysis.report import write_report
        # the same iterations left out as in the table, so that the two agree
        index = write_report([str(paths["bsp"]), str(paths["lbbsp"])], str(out / "report"),
                             warmup=WARMUP)
        print(f"plots: {index}")
    except ImportError:
        pass
    print(f"metrics: {paths['bsp']}, {paths['lbbsp']}  ({time.time() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
