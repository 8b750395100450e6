"""A small training script for the checkpoint tests: SGD with momentum on sklearn digits,
every worker saves its own parameters at the end (BatchNorm statistics included).

    ckpt_train.py OUT_DIR [--bn] [--epochs E] [--batch-size B] [--die-at T] [--lr-decay]
                  [--sleep S]

``--bn``: a conv net with BatchNorm (else an MLP). ``--die-at T``: rank 1 exits with code 9
after iteration T, once (a marker file in OUT_DIR), to test --restarts. ``--lr-decay``: a
learning-rate schedule, whose position the checkpoint must carry. ``--sleep S``: S seconds
more per iteration, so that a test can act mid-run however fast the machine is.
Files: OUT_DIR/rank<r>.params (OUT_DIR/single.params in a single process).
"""
import argparse
import os
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxlbbsp
from mxlbbsp.worker import datasets

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--bn", action="store_true")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--die-at", type=int, default=-1)
p.add_argument("--lr-decay", action="store_true")
p.add_argument("--hidden", type=int, default=32)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--freeze-conv", action="store_true",
               help="lr_mult 0 on the conv layer: the BatchNorm statistics then depend only "
               "on the data, so a single process must reach the same running mean")
args = p.parse_args()

mx.random.seed(0)
np.random.seed(0)
train, _ = datasets.load("digits", seed=0)
net = gluon.nn.HybridSequential()
with net.name_scope():
    if args.bn:
        net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"), gluon.nn.MaxPool2D(2), gluon.nn.Flatten(),
                gluon.nn.Dense(10))
    else:
        net.add(gluon.nn.Flatten(), gluon.nn.Dense(args.hidden, activation="relu"),
                gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
if args.bn and args.freeze_conv:
    net[0].collect_params().setattr("lr_mult", 0.0)
net.hybridize()
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size, shuffle=True, seed=0)
opt = {"learning_rate": 0.1, "momentum": 0.9}
if args.lr_decay:
    opt["lr_scheduler"] = mx.lr_scheduler.FactorScheduler(step=10, factor=0.7)
trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", opt)
marker = os.path.join(args.out, "died")
iteration = loader.resumed_iteration
for epoch in range(args.epochs):
    for data, label in loader:
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step()
        if iteration == args.die_at and mxlbbsp.rank() == 1 and not os.path.exists(marker):
            nd.waitall()      # the iteration has ended (step() only issues the pushpull)
            open(marker, "w").close()
            os._exit(9)
        iteration += 1
        if args.sleep:
            time.sleep(args.sleep)
        if os.environ.get("CKPT_DEBUG"):
            print("dbg", iteration, len(data), [float(v.data().norm().asscalar()) for v in trainer._params])
name = f"rank{mxlbbsp.rank()}" if mxlbbsp.num_workers() > 1 else "single"
net.save_parameters(os.path.join(args.out, name + ".params"))
print(f"finished at iteration {iteration}")
