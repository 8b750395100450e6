"""A small training script that logs its loss (mxlbbsp.log), for the curve and diagnosis tests.

    log_train.py [--batch-size B] [--epochs E] [--iterations N] [--momentum M] [--hidden H]
                 [--bad VALUE] [--bn]

Every worker logs the mean loss of its batch each iteration; rank 0 logs ``accuracy`` (on
the training set's first 256 samples) at the end of each epoch. ``--bad VALUE``: after the
first step, ``mxlbbsp.log(loss=VALUE)`` with VALUE as a string (``nan`` as float('nan'),
``pair`` as a 2-element array). ``--hidden 0``: one Dense layer (a tiny model). ``--bn``: a
BatchNorm layer (the default --min-batch-size is then 8, at most B / 2n).
"""
import argparse

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxlbbsp
from mxlbbsp.worker import datasets

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--iterations", type=int, default=0)
p.add_argument("--momentum", type=float, default=0.0)
p.add_argument("--hidden", type=int, default=32)
p.add_argument("--bad")
p.add_argument("--bn", action="store_true")
args = p.parse_args()

mx.random.seed(0)
train, _ = datasets.load("digits", seed=0)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Flatten())
if args.hidden:
    net.add(gluon.nn.Dense(args.hidden, activation="relu"))
if args.bn:
    net.add(gluon.nn.BatchNorm())
net.add(gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net.hybridize()
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size, shuffle=True, seed=0)
trainer = mxlbbsp.Trainer(net.collect_params(), "sgd",
                          {"learning_rate": 0.1, "momentum": args.momentum})
probe_x, probe_y = next(iter(gluon.data.DataLoader(train, batch_size=256)))
iteration = 0
for epoch in range(args.epochs):
    for data, label in loader:
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step()
        mxlbbsp.log(loss=loss.mean())
        if args.bad is not None:
            value = {"nan": float("nan"), "pair": np.ones(2)}.get(args.bad, args.bad)
            mxlbbsp.log(loss=value)
        iteration += 1
        if args.iterations and iteration >= args.iterations:
            break
    if mxlbbsp.rank() == 0:
        with mxlbbsp.untimed():
            pred = net(probe_x).argmax(axis=1)
            mxlbbsp.log(accuracy=(pred == probe_y.astype(pred.dtype)).mean())
    if args.iterations and iteration >= args.iterations:
        break
print(f"finished after {iteration} iterations", flush=True)
