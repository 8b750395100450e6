"""The cost of one model on every worker and of checkpoints, side by side in one run.

ResNet-20 (BatchNorm in every block) on synthetic CIFAR-sized data, 2 workers at 1:3, LB-BSP.
Modes, interleaved round by round (order alternating):

* ``servers``: MXNet's default on dist_sync, the optimizer on the servers, every worker's
  BatchNorm statistics its own (mxlbbsp before issue 11);
* ``workers``: the optimizer on every worker (update_on_kvstore=False), statistics not combined;
* ``workers+bn``: the default now, BatchNorm running statistics combined after every step;
* ``workers+bn+ckpt``: the same with ``--checkpoint-dir --checkpoint-every N``.

Bytes per iteration are counted from the model: each worker pushes and pulls one float32 per
trainable parameter in both update modes, plus one per running statistic with the combination.

    python benchmarks/checkpoint.py            # 3 rounds x 60 iterations, checkpoint every 10
    python benchmarks/checkpoint.py --quick    # 1 round x 30 iterations
"""
import argparse
import os
import tempfile
from pathlib import Path

import _common as C

MODES = {
    "servers": (["--update-on-kvstore", "--no-bn-sync"], False),
    "workers": (["--no-bn-sync"], False),
    "workers+bn": ([], False),
    "workers+bn+ckpt": ([], True),
}


def model_sizes(model: str):
    """(trainable floats, running-statistic floats) of ``model`` on 3x32x32 inputs."""
    import mxnet as mx
    from mxlbbsp.models import get_model
    net = get_model(model, classes=10)
    net.initialize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    train = aux = 0
    for p in net.collect_params().values():
        size = int(p.data().size)
        if getattr(p, "_differentiable", True):
            train += size
        else:
            aux += size
    return train, aux


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N iterations")
    p.add_argument("--batch-size", type=int, default=64)
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):        # one round of 7 iterations of a batch of 16, a checkpoint at 6
        args.quick, args.rounds, args.iterations, args.batch_size = True, 1, 7, 16
        args.every = 6
    rounds = args.rounds or (1 if args.quick else 3)
    iters = args.iterations or (30 if args.quick else 60)
    train = ["--model", "resnet20", "--data", "synthetic", "--samples", "4096",
             "--batch-size", str(args.batch_size), "--epochs", "100",
             "--iterations", str(iters), "--log-interval", "0"]
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
            for mode in order:
                extra, ckpt = MODES[mode]
                launch_args = ["--emulate-slowdown", "1,3"]
                if ckpt:
                    launch_args += ["--checkpoint-dir", str(Path(tmp) / f"ckpt-{r}"),
                                    "--checkpoint-every", str(args.every)]
                C.progress(f"round {r + 1}/{rounds}: {mode}")
                s = C.launch(2, train + extra, Path(tmp) / f"{mode}-{r}.jsonl",
                             launch_args=launch_args)
                runs[mode].append(s)
                C.progress(f"  {s['samples_per_s']:.1f} samples/s")
    base = runs["servers"]
    train_floats, aux_floats = model_sizes("resnet20")
    results = {}
    for mode, ss in runs.items():
        ratios = [s["samples_per_s"] / b["samples_per_s"] for s, b in zip(ss, base)]
        floats = train_floats + (aux_floats if mode.startswith("workers+bn") else 0)
        results[mode] = {"samples_per_s": C.median([s["samples_per_s"] for s in ss]),
                         "vs_servers": C.median(ratios), "per_round": ratios,
                         "bytes_per_worker_iteration": 2 * 4 * floats}
    bn_cost = C.median([a["samples_per_s"] / b["samples_per_s"]
                        for a, b in zip(runs["workers+bn"], runs["workers"])])
    ck_cost = C.median([a["samples_per_s"] / b["samples_per_s"]
                        for a, b in zip(runs["workers+bn+ckpt"], runs["workers+bn"])])
    rows = ["| mode | samples/s | vs servers (per round) | bytes pushed+pulled per worker "
            "per iteration |", "|---|---|---|---|"]
    for mode, r in results.items():
        rows.append(f"| {mode} | {r['samples_per_s']:.1f} | **{r['vs_servers']:.3f}x** "
                    f"({', '.join(f'{x:.3f}' for x in r['per_round'])}) | "
                    f"{r['bytes_per_worker_iteration']:,} |")
    table = (f"ResNet-20, synthetic 3x32x32, global batch {args.batch_size}, 2 workers at 1:3 "
             f"(LB-BSP) + 1 server on this machine, {iters} iterations per run (first 5 left "
             f"out), {rounds} round(s), modes interleaved; checkpoint every {args.every}. "
             f"Load average at the start: {os.getloadavg()[0]:.1f}. Ratios, not absolute "
             "figures.\n\n" + "\n".join(rows) +
             f"\n\nBatchNorm combination: workers+bn / workers = **{bn_cost:.3f}x** "
             f"({aux_floats:,} running-statistic floats next to {train_floats:,} trainable). "
             f"Checkpoints: workers+bn+ckpt / workers+bn = **{ck_cost:.3f}x**.")
    C.write("checkpoint" + ("_quick" if args.quick else ""),
            {"rounds": rounds, "iterations": iters, "every": args.every,
             "results": results, "bn_ratio": bn_cost, "checkpoint_ratio": ck_cost,
             "trainable_floats": train_floats, "aux_floats": aux_floats}, table)


if __name__ == "__main__":
    main()
