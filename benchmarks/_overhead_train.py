"""The training loop of benchmarks/overhead.py, written the two ways a user would write it.

    --impl plain     gluon.Trainer(kvstore="dist_sync") and a fixed per-worker batch B/n from
                     a gluon DataLoader over this worker's shard: the plain MXNet script,
                     started by the benchmark's own DMLC launcher (the DMLC_* variables)
    --impl plain-local  the same with gluon.Trainer(update_on_kvstore=False): every worker
                     runs the optimizer on the summed gradients, as mxlbbsp does, where the
                     default runs it on the servers
    --impl mxlbbsp   mxlbbsp.DataLoader(global_batch_size=B) and mxlbbsp.Trainer, step()
                     without a batch size: the same loop converted, under `mxlbbsp launch`

Everything else is the same: the data (numpy arrays in memory, so that the loop is the
training and not the data loading), the model, SGD with momentum, a per-sample loss, the
iterations. Each worker measures its own throughput over the iterations after the warm-up
(the engine drained at both ends): it prints ``overhead-start`` when the clock starts and
one line ``overhead-result {json}`` at the end.
``--kvstore-only`` creates the dist_sync kvstore and ends (a job's fixed cost).
``--sections``: the main thread's CPU (``time.thread_time``) per timed iteration in each
part of the loop (loader, forward and loss, backward, step) and in the methods of the step
and of mxlbbsp's session that it calls, in microseconds, in the result (``sections_us``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

#: the models, by name: (kind, width, input shape); the MLPs have three dense layers
MODELS = {
    "mlp64": ("mlp", 64, (1, 8, 8)),
    "mlp256": ("mlp", 256, (3, 16, 16)),
    "mlp1024": ("mlp", 1024, (3, 32, 32)),
    "cnn": ("cnn", 16, (3, 32, 32)),
    "resnet20": ("resnet20", 0, (3, 32, 32)),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["plain", "plain-local", "mxlbbsp"], required=True)
    p.add_argument("--model", choices=sorted(MODELS), default="mlp256")
    p.add_argument("--batch-size", type=int, default=64, help="global batch B")
    p.add_argument("--iterations", type=int, default=200, help="timed iterations")
    p.add_argument("--warmup", type=int, default=10, help="iterations before the clock")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--kvstore-only", action="store_true",
                   help="create the dist_sync kvstore, then end")
    p.add_argument("--sections", action="store_true",
                   help="the main thread's CPU per iteration in each part of the loop")
    return p.parse_args(argv)


def build(name: str):
    from mxnet.gluon import nn
    from mxlbbsp.models import get_model
    kind, width, shape = MODELS[name]
    if kind == "mlp":
        net = nn.HybridSequential()
        net.add(nn.Flatten(), nn.Dense(width, activation="relu"),
                nn.Dense(width, activation="relu"), nn.Dense(10))
    elif kind == "cnn":
        net = get_model("cnn", classes=10, channels=width)
    else:
        net = get_model("resnet20", classes=10)
    return net, shape


def data(samples: int, shape):
    from mxnet import gluon
    rng = np.random.default_rng(0)
    templates = rng.standard_normal((10,) + shape).astype(np.float32)
    y = rng.integers(0, 10, samples)
    x = (templates[y] + rng.standard_normal((samples,) + shape)).astype(np.float32)
    return gluon.data.ArrayDataset(x, y.astype(np.float32))


class Sections:
    """CPU seconds of the calling thread per named section (time.thread_time)."""

    def __init__(self):
        self.seconds = {}
        self.on = False

    def add(self, name: str, seconds: float) -> None:
        if self.on:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def wrap(self, obj, attr: str, name: str) -> None:
        """Time every call of ``obj.attr`` (a method of an instance or a class) as ``name``."""
        inner = getattr(obj, attr)

        def timed(*a, **k):
            start = time.thread_time()
            try:
                return inner(*a, **k)
            finally:
                self.add(name, time.thread_time() - start)
        setattr(obj, attr, timed)


#: the step's methods timed with --sections: Gluon's (plain) and mxlbbsp.Trainer's, and the
#: session's that the loader and the step call
PLAIN_SECTIONS = ("_allreduce_grads", "_update")
MXLBBSP_SECTIONS = ("_read_loss", "_normalisers", "_reduce", "_apply", "_first_step",
                    "_before_pushpull", "_pushpull_grads", "_report", "_update",
                    "_engine_clock", "_sums_on_servers")
SESSION_SECTIONS = ("next_iteration", "slice", "announce", "wait_finished", "send_pending",
                    "report_when_ready", "done_when_finished")


def main(argv=None) -> int:
    args = parse_args(argv)
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    if args.kvstore_only:
        kv = mx.kv.create("dist_sync")
        print("overhead-result " + json.dumps({"rank": kv.rank}), flush=True)
        return 0
    mx.random.seed(0)
    np.random.seed(0)
    net, shape = build(args.model)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    train = data(args.samples, shape)
    B = args.batch_size
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    sections = Sections()
    if args.impl != "mxlbbsp":
        n = int(os.environ["DMLC_NUM_WORKER"])
        kv = mx.kv.create("dist_sync")
        rank = kv.rank
        trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv,
                                update_on_kvstore=False if args.impl == "plain-local" else None)
        loader = gluon.data.DataLoader(train.shard(n, rank), batch_size=B // n, shuffle=True,
                                       last_batch="discard")

        def step():
            trainer.step(B)
        if args.sections:
            for name in PLAIN_SECTIONS:
                sections.wrap(trainer, name, f"step: {name}")
    else:
        import mxlbbsp
        rank = mxlbbsp.rank()
        trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", opt)
        loader = mxlbbsp.DataLoader(train, global_batch_size=B, shuffle=True, seed=0,
                                    last_batch="discard")
        step = trainer.step
        if args.sections:
            from mxlbbsp.worker import session as _session
            for name in MXLBBSP_SECTIONS:
                sections.wrap(trainer, name, f"step: {name}")
            for name in SESSION_SECTIONS:
                sections.wrap(_session.Session, name, f"session: {name}")
    total = args.warmup + args.iterations
    done, started = 0, None
    # the loop's own clock readings only with --sections: the other runs time as before
    clock = time.thread_time if args.sections else float
    while done < total:
        batches = iter(loader)
        while done < total:
            t0 = clock()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            t1 = clock()
            with autograd.record():
                loss = loss_fn(net(x), y)
            t2 = clock()
            loss.backward()
            t3 = clock()
            step()
            if sections.on:
                t4 = clock()
                for name, seconds in (("loader", t1 - t0), ("forward and loss", t2 - t1),
                                      ("backward", t3 - t2), ("step", t4 - t3)):
                    sections.add(name, seconds)
            done += 1
            if done == args.warmup:
                nd.waitall()
                started = time.perf_counter()
                sections.on = args.sections
                print("overhead-start", flush=True)
    nd.waitall()
    seconds = time.perf_counter() - started
    result = {"rank": rank, "iterations": args.iterations, "seconds": seconds,
              "samples_per_s": args.iterations * B / seconds}
    if args.sections:
        result["sections_us"] = {k: 1e6 * v / args.iterations
                                 for k, v in sections.seconds.items()}
    print("overhead-result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
