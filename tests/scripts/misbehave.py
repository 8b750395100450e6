"""A worker that fails in a chosen way, for tests/test_failures.py.

    misbehave.py [--plain] [--iterations N] [--rank R] [--at T] [--fail MODE] [--sleep S]
                 [--own-excepthook] [--linger S] [--busy]

--plain: a plain MXNet kvstore script (dist_sync push/pull, no mxlbbsp import); otherwise a
tiny Gluon model on mxlbbsp.DataLoader + mxlbbsp.Trainer. Worker R (the launcher's rank) does
MODE at iteration T: raise (RuntimeError), exit3 (sys.exit(3)), systemexit3 (raise
SystemExit(3)), stop (ends its loop there: fewer iterations than the others). Each iteration
sleeps S seconds first (a slower step, so that a SIGSTOP lands in it). --own-excepthook: the
script replaces sys.excepthook with its own (as some logging set-ups do). --linger S: worker R
spends S seconds after its loop before it ends (the others end first): asleep, or computing
with --busy.
"""
import argparse
import os
import sys
import time

import numpy as np
import mxnet as mx

p = argparse.ArgumentParser()
p.add_argument("--plain", action="store_true")
p.add_argument("--iterations", type=int, default=10)
p.add_argument("--rank", type=int, default=1)
p.add_argument("--at", type=int, default=5)
p.add_argument("--fail", default="raise", choices=["raise", "exit3", "systemexit3", "stop", "none"])
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--own-excepthook", action="store_true")
p.add_argument("--linger", type=float, default=0.0)
p.add_argument("--busy", action="store_true")
args = p.parse_args()
if args.own_excepthook:
    def _log_and_die(exc_type, exc, tb):
        print(f"my handler: {exc_type.__name__}: {exc}", file=sys.stderr, flush=True)
    sys.excepthook = _log_and_die
rank = int(os.environ.get("MXLBBSP_RANK", "0"))


def misbehave(t):
    if rank != args.rank or t != args.at:
        return False
    print(f"rank {rank} misbehaves at iteration {t}: {args.fail}", flush=True)
    if args.fail == "raise":
        raise RuntimeError(f"boom at iteration {t}")
    if args.fail == "exit3":
        sys.exit(3)
    if args.fail == "systemexit3":
        raise SystemExit(3)
    return args.fail == "stop"


if args.plain:
    kv = mx.kv.create("dist_sync")
    kv.init(3, mx.nd.zeros((4,)))
    out = mx.nd.zeros((4,))
    for t in range(args.iterations):
        time.sleep(args.sleep)
        if misbehave(t):
            break
        kv.push(3, mx.nd.ones((4,)))
        kv.pull(3, out=out)
        out.wait_to_read()
else:
    from mxnet import autograd, gluon, nd
    import mxlbbsp
    N, B = 64, 4
    x = np.random.RandomState(0).rand(N, 3).astype(np.float32)
    dataset = gluon.data.ArrayDataset(nd.array(x), nd.array(x.sum(axis=1)))
    net = gluon.nn.Dense(1)
    net.initialize(mx.init.Constant(0.1))
    loader = mxlbbsp.DataLoader(dataset, global_batch_size=B, shuffle=True, seed=0)
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    t = 0
    done = False
    while not done:
        for data, label in loader:
            time.sleep(args.sleep)
            if misbehave(t):
                done = True
                break
            with autograd.record():
                loss = (net(data).reshape(-1) - label) ** 2
            loss.backward()
            trainer.step()
            t += 1
            if t >= args.iterations:
                done = True
                break
print(f"rank {rank} finished after {t} iterations", flush=True)
if rank == args.rank and args.linger:
    until = time.monotonic() + args.linger
    while time.monotonic() < until:
        if not args.busy:
            time.sleep(max(0.0, until - time.monotonic()))
    print(f"rank {rank} lingered {args.linger:g} s", flush=True)
