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

The job's workers save OUT_DIR/rank<r>.params (running statistics included) and record their
sample ledger, OUT_DIR/ledger-rank<r>.jsonl (ledger_models.Ledger: the indices each trained
on at each iteration); rank 0 writes OUT_DIR/init.params (the parameters before training)
and OUT_DIR/data.npz (the training set's arrays, as the script built them), once.

``--reference``: the independent reference, which imports nothing of mxlbbsp: the ledger of
the job's folders, checked (every iteration's ranks, each epoch a permutation) and trained
on by tests/reference.py's plain Gluon from the first folder's init.params and data.npz
(BatchNorm normalising each worker's slice on its own, its running statistics updated from
the whole global batch by MXNet's own BatchNorm; a restarted or resumed launch's lines win),
with this script's model and optimizer. Writes OUT_DIR/single.params.
"""
import argparse
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ledger_models  # noqa: E402

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
args = p.parse_args()

np.random.seed(0)
ctx = [mx.cpu()]


def training_set():
    """The training set's (images, labels) as numpy arrays (mxlbbsp's data sets module
    builds them: the workers only)."""
    from mxlbbsp.worker import datasets
    if args.model == "cnn":
        train, _ = datasets.load("digits", seed=0)
        train = train.transform_first(lambda x: x * 3.0 + 4.0)  # running means of order 1+
    else:
        train, _ = datasets.load("synthetic", samples=384, image_shape="3,32,32", seed=0)
    items = [train[i] for i in range(len(train))]
    return (np.stack([np.asarray(x.asnumpy() if hasattr(x, "asnumpy") else x) for x, _ in items]),
            np.array([float(y) for _, y in items], dtype=np.float32))


def network(samples: int):
    """(net, optimizer options): the net initialised (seeded), its shapes known."""
    mx.random.seed(0)
    if args.model == "cnn":
        net = gluon.nn.HybridSequential()
        with net.name_scope():
            net.add(gluon.nn.Conv2D(8, 3, padding=1),
                    gluon.nn.BatchNorm(momentum=args.momentum_bn),
                    gluon.nn.Activation("softrelu"),
                    gluon.nn.Conv2D(8, 3, padding=1),
                    gluon.nn.BatchNorm(momentum=args.momentum_bn),
                    gluon.nn.Activation("softrelu"), gluon.nn.AvgPool2D(2), gluon.nn.Flatten(),
                    gluon.nn.Dense(10))
        opt = {"learning_rate": 0.05, "momentum": 0.9}
        shape = (1, 8, 8)
        return _initialised(net, shape), opt
    from gluoncv.model_zoo import get_model
    # Float rounding is all that may differ between the job and one process (the order of
    # the sums), and a deep ReLU + BatchNorm net can amplify it: with 16x16 images, or a
    # learning rate of 0.05, summing the slices in reverse order alone moves weights by
    # 1e-3 within 4 steps, by 1e-2 within 12. At 32x32 and 0.01, by 2e-5 in 4 steps.
    net = get_model("cifar_resnet20_v1", classes=10, norm_kwargs={"momentum": args.momentum_bn})
    steps = args.epochs * (samples // args.batch_size + 1)
    schedule = mx.lr_scheduler.FactorScheduler(step=max(steps // 3, 1), factor=0.5,
                                               base_lr=0.01)
    opt = {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4, "lr_scheduler": schedule}
    return _initialised(net, (3, 32, 32)), opt


def _initialised(net, shape):
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net(nd.zeros((2,) + shape))      # finish the deferred initialisation
    return net


loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def batches_of(loader):
    """The gluoncv habit: split_and_load over the contexts (one CPU here)."""
    for data, label, index in loader:
        yield (gluon.utils.split_and_load(data, ctx, even_split=False),
               gluon.utils.split_and_load(label, ctx, even_split=False), data.shape[0], index)


def worker():
    import mxlbbsp
    x, y = training_set()
    net, opt = network(len(x))
    rank = mxlbbsp.rank()
    if rank == 0 and not os.path.exists(os.path.join(args.out, "init.params")):
        net.save_parameters(os.path.join(args.out, "init.params"))
        np.savez(os.path.join(args.out, "data.npz"), x=x, y=y)
    train = gluon.data.ArrayDataset(nd.array(x), nd.array(y),
                                    nd.array(np.arange(len(x), dtype=np.float32)))
    loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size, shuffle=True, seed=0)
    if args.plain_loader:
        loader = gluon.data.DataLoader(train, batch_size=args.batch_size, shuffle=True)
    net.hybridize()
    make = gluon.Trainer if args.plain_trainer else mxlbbsp.Trainer
    trainer = make(net.collect_params(), "sgd", opt)
    marker = os.path.join(args.out, "died")
    ledger = ledger_models.Ledger(args.out, rank, mxlbbsp.num_workers())
    iteration = getattr(loader, "resumed_iteration", 0)
    for epoch in range(args.epochs):
        for data, label, n, index in batches_of(loader):
            ledger.write(iteration, index)
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
            if iteration == args.die_at and rank == 1 and not os.path.exists(marker):
                # after this iteration has ended: step() only issues the pushpull to the
                # engine, and an exit before it went out would lose the iteration before
                # (the other workers' step waits for it, rank 0's checkpoint too)
                nd.waitall()
                open(marker, "w").close()
                os._exit(9)
            iteration += 1
    net.save_parameters(os.path.join(args.out, f"rank{rank}.params"))
    print(f"finished at iteration {iteration}")


def reference():
    sys.path.insert(0, os.path.dirname(HERE))
    import reference as plain        # tests/reference.py
    first = args.reference[0]
    batches = plain.read_ledger(*args.reference)
    data = np.load(os.path.join(first, "data.npz"))
    epochs = plain.check_epochs(batches, len(data["x"]))
    net, opt = network(len(data["x"]))
    net.load_parameters(os.path.join(first, "init.params"))
    plain.train(net, (data["x"], data["y"]), batches, opt, {},
                constant=args.batch_size if args.idiom == "step-b" else None)
    net.save_parameters(os.path.join(args.out, "single.params"))
    assert "mxlbbsp" not in sys.modules, "the reference must not import mxlbbsp"
    print(f"reference finished at iteration {len(batches)}, {epochs} whole epoch(s)")


if args.reference:
    reference()
else:
    worker()
