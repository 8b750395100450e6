"""The independent reference of the exactness bank: plain Gluon, no mxlbbsp.

A job's workers record their sample ledger (tests/scripts/ledger_train.py: at each iteration
the indices of the samples each worker trained on, read from the items it was given). This
module checks the ledger (every iteration's global batch whole, each epoch a permutation of
the data set) and trains one process on exactly those global batches with ``gluon.Trainer``
and no kvstore: per-sample losses summed, ``step(B(t) / f(t))`` with B(t) the iteration's
global batch and f(t) the learning-rate factor the job's metrics recorded (1 when none), the
optimizer's own momentum. BatchNorm normalises each worker's slice on its own, as the job's
workers did, and its running statistics are updated once per iteration from the whole global
batch's inputs to the layer, by MXNet's own BatchNorm (a copy of the layer steps on them).
Nothing of mxlbbsp is imported: the test compares the job's parameters with what this makes.

    python tests/reference.py JOB_DIR OUT.params --model M --samples N [--lr LR]
        [--momentum M] [--lr-decay] [--metrics METRICS.jsonl]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np
from mxnet import autograd, gluon, nd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import ledger_models  # noqa: E402


class LedgerError(AssertionError):
    """The job's ledger breaks the slicing rule (a sample twice, a gap, a rank missing)."""


def read_ledger(*job_dirs: str) -> List[List[List[int]]]:
    """Per iteration 0..T-1, the workers' slices in rank order, from the ledgers in
    ``job_dirs`` (one job's folders: a resumed launch may write to another). Where launches
    overlap (a restart trains again what it lost), the launch that wrote the iteration last
    wins."""
    lines = []
    for job_dir in job_dirs:
        for path in glob.glob(os.path.join(job_dir, "ledger-rank*.jsonl")):
            lines += [json.loads(line) for line in open(path) if line.strip()]
    if not lines:
        raise LedgerError(f"no ledger in {', '.join(job_dirs)}")
    by_launch: Dict[int, Dict[str, list]] = {}
    for row in lines:
        by_launch.setdefault(row["iteration"], {}).setdefault(row["launch"], []).append(row)
    iterations = sorted(by_launch)
    if iterations != list(range(len(iterations))):
        raise LedgerError(f"iterations missing from the ledger: {iterations[:5]}...")
    batches = []
    for t in iterations:
        rows = max(by_launch[t].values(), key=lambda rs: max(r["time"] for r in rs))
        n = rows[0]["workers"]
        ranks = sorted(r["rank"] for r in rows)
        if ranks != list(range(n)):
            raise LedgerError(f"iteration {t}: ranks {ranks} of {n} workers")
        batches.append([r["indices"] for r in sorted(rows, key=lambda r: r["rank"])])
    return batches


def check_epochs(batches: List[List[List[int]]], samples: int) -> int:
    """Every epoch a permutation of the data set (the last one may be cut short only when
    the job was); returns the number of whole epochs."""
    stream = [i for slices in batches for piece in slices for i in piece]
    epochs, rest = divmod(len(stream), samples)
    for e in range(epochs + (1 if rest else 0)):
        part = stream[e * samples:(e + 1) * samples]
        if len(set(part)) != len(part) or not set(part) <= set(range(samples)):
            raise LedgerError(f"epoch {e} uses a sample twice or one outside the data set")
        if len(part) == samples and sorted(part) != list(range(samples)):
            raise LedgerError(f"epoch {e} is not a permutation of the data set")
    for t, slices in enumerate(batches):
        if any(len(piece) == 0 for piece in slices):
            raise LedgerError(f"iteration {t}: a worker without samples")
    return epochs


def lr_factors(metrics_path) -> Dict[int, float]:
    """iteration -> the learning-rate factor the job recorded (rank 0's record)."""
    factors = {}
    if metrics_path:
        for line in open(metrics_path):
            rec = json.loads(line)
            if rec.get("rank") == 0 and rec.get("lr_factor") is not None:
                factors[rec["iteration"]] = float(rec["lr_factor"])
    return factors


def _blocks(block):
    yield block
    for child in block._children.values():
        yield from _blocks(child)


def _whole_batch_statistics(layer, x, mean0, var0):
    """``layer``'s running statistics := a copy of it stepped once on ``x``, the whole
    global batch's inputs, from (mean0, var0)."""
    twin = gluon.nn.BatchNorm(momentum=layer._kwargs["momentum"], epsilon=layer._kwargs["eps"],
                              in_channels=x.shape[1])
    twin.initialize()
    twin.running_mean.set_data(mean0)
    twin.running_var.set_data(var0)
    with autograd.record():
        out = twin(nd.array(x))
    out.backward()
    layer.running_mean.set_data(twin.running_mean.data())
    layer.running_var.set_data(twin.running_var.data())


def train(net, data, batches, opt: dict, factors: Dict[int, float],
          constant: Optional[int] = None) -> None:
    """Plain Gluon on the recorded global batches (module docstring); ``data``: the data
    set's (features, labels) arrays. ``constant``: every step is ``step(constant)`` (a
    script that passes its constant batch size: the short last batch is divided by it too)."""
    layers = [b for b in _blocks(net) if isinstance(b, gluon.nn.BatchNorm)]
    seen = {id(b): [] for b in layers}
    for b in layers:
        b.register_forward_hook(lambda blk, inputs, out: seen[id(blk)].append(
            inputs[0].asnumpy()))
    params = [q for q in net.collect_params().values() if q.grad_req != "null"]
    for q in params:
        q.grad_req = "add"
    trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x_all, y_all = (nd.array(a) for a in data)
    for t, slices in enumerate(batches):
        for q in params:
            q.zero_grad()
        before = {id(b): (b.running_mean.data().copy(), b.running_var.data().copy())
                  for b in layers}
        for v in seen.values():
            v.clear()
        for piece in slices:
            index = nd.array(piece, dtype="int64")
            x, y = nd.take(x_all, index), nd.take(y_all, index)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            for b in layers:          # each slice starts from the same statistics
                b.running_mean.set_data(before[id(b)][0])
                b.running_var.set_data(before[id(b)][1])
        for b in layers:
            _whole_batch_statistics(b, np.concatenate(seen[id(b)], axis=0), *before[id(b)])
        total = constant or sum(len(piece) for piece in slices)
        trainer.step(total / factors.get(t, 1.0))


def difference(job: dict, reference: dict) -> float:
    """The largest difference between two sets of parameters (``mx.nd.load``'s dicts),
    relative to each parameter's largest value, or absolute where that is under 1 (a bias
    that BatchNorm cancels trains on rounding noise around 0)."""
    if job.keys() != reference.keys():
        raise AssertionError(f"other parameters: {sorted(job)} != {sorted(reference)}")
    worst = 0.0
    for k in job:
        a, b = job[k].asnumpy(), reference[k].asnumpy()
        worst = max(worst, float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1.0))
    return worst


def command(job_dir, out, *, samples: int, model: str = "mlp", lr: float = 0.1,
            momentum: float = 0.9, lr_decay: bool = False, metrics=None) -> List[str]:
    """The command line that runs this reference on ``job_dir`` (a process of its own)."""
    argv = [sys.executable, os.path.abspath(__file__), str(job_dir), str(out), "--model", model,
            "--samples", str(samples), "--lr", str(lr), "--momentum", str(momentum)]
    return argv + (["--lr-decay"] if lr_decay else []) + (
        ["--metrics", str(metrics)] if metrics else [])


def against(job_dir, params: str = "rank0.params", **options) -> Tuple[float, int]:
    """Run the reference on the ledger in ``job_dir`` (:func:`command`'s ``options``) in a
    process of its own; (the largest :func:`difference` between the job's ``params`` there
    and the reference's, the number of whole epochs it trained). Its output is in the
    AssertionError when it fails."""
    out = os.path.join(str(job_dir), "ref.params")
    p = subprocess.run(command(job_dir, out, **options), capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"the reference failed on {job_dir}:\n{p.stdout}{p.stderr}")
    epochs = int(re.search(r"(\d+) whole epoch", p.stdout)[1])
    diff = difference(nd.load(os.path.join(str(job_dir), params)), nd.load(out))
    print(f"the largest difference from the reference: {diff:.2e} ({job_dir})")
    return diff, epochs


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("job_dir")
    p.add_argument("out")
    p.add_argument("--model", default="mlp", choices=ledger_models.MODELS)
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--lr-decay", action="store_true")
    p.add_argument("--metrics")
    args = p.parse_args(argv)
    batches = read_ledger(args.job_dir)
    epochs = check_epochs(batches, args.samples)
    net = ledger_models.model(args.model)
    net.load_parameters(os.path.join(args.job_dir, "init.params"))
    opt = {"learning_rate": args.lr, "momentum": args.momentum}
    if args.lr_decay:
        opt["lr_scheduler"] = ledger_models.lr_schedule()
    train(net, ledger_models.arrays(args.samples), batches, opt, lr_factors(args.metrics))
    net.save_parameters(args.out)
    assert "mxlbbsp" not in sys.modules, "the reference must not import mxlbbsp"
    print(f"reference: {len(batches)} iterations, {epochs} whole epoch(s)")


if __name__ == "__main__":
    main()
