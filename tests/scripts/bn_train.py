"""Real Gluon training scripts with BatchNorm, written the ways users write them, for the
exactness bank (tests/test_exact_bn.py); and the one-process reference they are held to.

    bn_train.py OUT_DIR [--model cnn|resnet] [--idiom step|step-n|step-b|split]
                [--epochs E] [--batch-size B] [--momentum-bn M] [--die-at T] [--plain-trainer]
                [--plain-loader] [--step-with N]
    bn_train.py OUT_DIR --reference JOB_DIR [JOB_DIR ...] [same model options]

``cnn``: two conv + BatchNorm blocks on sklearn's digits, shifted so that the running means
are of order 1 and more, with softplus (``softrelu``) and average pooling. Not ReLU: this net
with ReLU is chaotic. The digits' constant background, and the regions a ReLU zeroes, reach
a BatchNorm as hundreds of equal values, which it maps to one value per channel; when that
value sits near 0, the next ReLU's kink switches all of them at once, and a 1e-6 difference
in the weights (the order of a sum) moves a worker's gradient by 1-4 %. Seen in about one
job in six under load, each time reproduced to the bit from the job's own weights, and by
one process from the reference's weights: the model's sensitivity, not the job's error.
``resnet``: gluoncv's ``cifar_resnet20_v1`` (model zoo) on synthetic 3x32x32 images,
trained the gluoncv way: ``split_and_load``, ``trainer.step(batch_size)`` with the constant
batch size, and a learning-rate scheduler.
Idioms: ``step`` (trainer.step()), ``step-n`` (trainer.step(data.shape[0])), ``step-b``
(trainer.step(global batch size)), ``split`` (allreduce_grads(), gradient clipping, then
update(data.shape[0])). BatchNorm momentum 0.99 by default, where errors persist.

The job's workers save OUT_DIR/rank<r>.params (running statistics included) and append
each iteration's local batch size to OUT_DIR/sizes-rank<r>.txt.

``--reference``: one process trains on the whole global batch of every iteration, with
BatchNorm normalising each worker's slice on its own (the split as the workers recorded it;
a restarted worker's lines, and a resumed job's folder, win), and its running statistics
updated from the whole global batch by MXNet's own BatchNorm (a copy of each layer trains on
the layer's inputs of the whole batch, gathered by a forward hook): nothing of mxlbbsp's
combination is used. Writes OUT_DIR/single.params.
"""
import argparse
import os

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxlbbsp
from mxlbbsp.worker import datasets

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--model", default="cnn", choices=["cnn", "resnet"])
p.add_argument("--idiom", default="step", choices=["step", "step-n", "step-b", "split"])
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--momentum-bn", type=float, default=0.99)
p.add_argument("--die-at", type=int, default=-1)
p.add_argument("--step-with", type=int, help="trainer.step(N) with this constant N")
p.add_argument("--plain-trainer", action="store_true", help="gluon.Trainer (a mistake)")
p.add_argument("--plain-loader", action="store_true",
               help="gluon.data.DataLoader with mxlbbsp.Trainer (a mistake)")
p.add_argument("--reference", nargs="+", metavar="DIR",
               help="the OUT_DIRs of the job (of its first part, then of a resumed part)")
p.add_argument("--float64", action="store_true", help="reference statistics in float64")
args = p.parse_args()

mx.random.seed(0)
np.random.seed(0)
ctx = [mx.cpu()]


def build():
    if args.model == "cnn":
        train, _ = datasets.load("digits", seed=0)
        train = train.transform_first(lambda x: x * 3.0 + 4.0)  # running means of order 1+
        net = gluon.nn.HybridSequential()
        with net.name_scope():
            net.add(gluon.nn.Conv2D(8, 3, padding=1),
                    gluon.nn.BatchNorm(momentum=args.momentum_bn),
                    gluon.nn.Activation("softrelu"),
                    gluon.nn.Conv2D(8, 3, padding=1),
                    gluon.nn.BatchNorm(momentum=args.momentum_bn),
                    gluon.nn.Activation("softrelu"), gluon.nn.AvgPool2D(2), gluon.nn.Flatten(),
                    gluon.nn.Dense(10))
        return train, net, {"learning_rate": 0.05, "momentum": 0.9}
    from gluoncv.model_zoo import get_model
    # Float rounding is all that may differ between the job and one process (the order of
    # the sums), and a deep ReLU + BatchNorm net can amplify it: with 16x16 images, or a
    # learning rate of 0.05, summing the slices in reverse order alone moves weights by
    # 1e-3 within 4 steps, by 1e-2 within 12. At 32x32 and 0.01, by 2e-5 in 4 steps.
    train, _ = datasets.load("synthetic", samples=384, image_shape="3,32,32", seed=0)
    net = get_model("cifar_resnet20_v1", classes=10, norm_kwargs={"momentum": args.momentum_bn})
    steps = args.epochs * (len(train) // args.batch_size + 1)
    schedule = mx.lr_scheduler.FactorScheduler(step=max(steps // 3, 1), factor=0.5,
                                               base_lr=0.01)
    return train, net, {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4,
                        "lr_scheduler": schedule}


train, net, opt = build()
net.initialize(mx.init.Xavier(), ctx=ctx)
net(nd.zeros((2,) + train[0][0].shape))      # finish the deferred initialisation
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def batches_of(loader):
    """The gluoncv habit: split_and_load over the contexts (one CPU here)."""
    for data, label in loader:
        yield (gluon.utils.split_and_load(data, ctx, even_split=False),
               gluon.utils.split_and_load(label, ctx, even_split=False), data.shape[0])


def worker():
    loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size, shuffle=True, seed=0)
    if args.plain_loader:
        loader = gluon.data.DataLoader(train, batch_size=args.batch_size, shuffle=True)
    net.hybridize()
    make = gluon.Trainer if args.plain_trainer else mxlbbsp.Trainer
    trainer = make(net.collect_params(), "sgd", opt)
    marker = os.path.join(args.out, "died")
    sizes = open(os.path.join(args.out, f"sizes-rank{mxlbbsp.rank()}.txt"), "a")
    iteration = getattr(loader, "resumed_iteration", 0)
    for epoch in range(args.epochs):
        for data, label, n in batches_of(loader):
            with autograd.record():
                losses = [loss_fn(net(x), y) for x, y in zip(data, label)]
            autograd.backward(losses)
            if args.step_with is not None:
                trainer.step(args.step_with)
            elif args.idiom == "step":
                trainer.step()
            elif args.idiom == "step-n":
                trainer.step(n)
            elif args.idiom == "step-b":
                trainer.step(args.batch_size)
            else:
                trainer.allreduce_grads()
                grads = [q.grad() for q in net.collect_params().values() if q.grad_req != "null"]
                gluon.utils.clip_global_norm(grads, 1e3 * args.batch_size)
                trainer.update(n)
            sizes.write(f"{iteration} {n}\n")
            sizes.flush()
            if iteration == args.die_at and mxlbbsp.rank() == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(9)
            iteration += 1
    net.save_parameters(os.path.join(args.out, f"rank{mxlbbsp.rank()}.params"))
    print(f"finished at iteration {iteration}")


def splits():
    """iteration -> the workers' batch sizes in rank order, as they recorded them."""
    by_iteration = {}
    for folder in args.reference:
        this = {}
        for name in os.listdir(folder):
            if name.startswith("sizes-rank"):
                rank = int(name[len("sizes-rank"):-len(".txt")])
                for line in open(os.path.join(folder, name)):
                    t, size = map(int, line.split())
                    this.setdefault(t, {})[rank] = size
        by_iteration.update(this)
    return {t: [sizes[r] for r in sorted(sizes)] for t, sizes in by_iteration.items()}


def reference():
    split = splits()
    layers = [b for b in _blocks(net) if isinstance(b, gluon.nn.BatchNorm)]
    seen = {id(b): [] for b in layers}
    for b in layers:
        b.register_forward_hook(lambda blk, inputs, out: seen[id(blk)].append(
            inputs[0].asnumpy()))
    params = [q for q in net.collect_params().values() if q.grad_req != "null"]
    for q in params:
        q.grad_req = "add"
    trainer = gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=None)
    loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size, shuffle=True, seed=0)
    t = 0
    for epoch in range(args.epochs):
        for data, label in loader:
            if t not in split:
                break
            sizes = split[t]
            assert sum(sizes) == data.shape[0], (t, sizes, data.shape)
            for q in params:
                q.zero_grad()
            before = {id(b): (b.running_mean.data().copy(), b.running_var.data().copy())
                      for b in layers}
            for v in seen.values():
                v.clear()
            offset = 0
            for size in sizes:
                x, y = data[offset:offset + size], label[offset:offset + size]
                offset += size
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                for b in layers:      # each slice starts from the same statistics
                    b.running_mean.set_data(before[id(b)][0])
                    b.running_var.set_data(before[id(b)][1])
            for b in layers:          # the whole global batch's statistics, by MXNet's op
                whole_batch_statistics(b, np.concatenate(seen[id(b)], axis=0), *before[id(b)])
            trainer.step(args.batch_size if args.idiom == "step-b" else data.shape[0])
            t += 1
    net.save_parameters(os.path.join(args.out, "single.params"))
    print(f"reference finished at iteration {t}")


def whole_batch_statistics(layer, x, mean0, var0):
    """``layer``'s running statistics := what its update from ``x``, the whole global batch,
    makes of (mean0, var0): a copy of the layer trains on ``x`` once, as one process's would
    (``--float64``: computed here in float64 instead, to see MXNet's own rounding)."""
    m = layer._kwargs["momentum"]
    if args.float64:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean = m * mean0.asnumpy().astype(np.float64) + (1 - m) * x.mean(axis=axes)
        var = m * var0.asnumpy().astype(np.float64) + (1 - m) * x.var(axis=axes)
        layer.running_mean.set_data(nd.array(mean))
        layer.running_var.set_data(nd.array(var))
        return
    twin = gluon.nn.BatchNorm(momentum=m, epsilon=layer._kwargs["eps"], in_channels=x.shape[1])
    twin.initialize()
    twin.running_mean.set_data(mean0)
    twin.running_var.set_data(var0)
    data = nd.array(x.astype(np.float32))
    with autograd.record():
        out = twin(data)
    out.backward()
    layer.running_mean.set_data(twin.running_mean.data())
    layer.running_var.set_data(twin.running_var.data())


def _blocks(block):
    yield block
    for child in block._children.values():
        yield from _blocks(child)


if args.reference:
    reference()
else:
    worker()
