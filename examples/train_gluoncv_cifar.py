"""gluoncv's CIFAR-10 training recipe (scripts/classification/cifar/train_cifar10.py), converted
to mxlbbsp. The four changed lines are marked ``# mxlbbsp``; everything else is gluoncv's
habit: a model from ``gluoncv.model_zoo``, ``split_and_load`` over the contexts, a cosine
``LRScheduler``, NAG with weight decay, ``trainer.step(batch_size)`` with the constant batch
size, and an evaluation at the end of each epoch.

One process:
    python examples/train_gluoncv_cifar.py --data synthetic --epochs 2
Three workers, one of them emulated 3x slower:
    mxlbbsp launch -n 3 --emulate-slowdown 1,1,3 -- python examples/train_gluoncv_cifar.py

Data: ``--data cifar10 --data-dir DIR`` (CIFAR-10's python or binary version in a local
folder; nothing is downloaded), or ``synthetic`` (random 3x32x32 images around a template per
class, so the accuracy goes up). ``--model`` is any gluoncv CIFAR model name
(cifar_resnet20_v1 by default; cifar_resnet56_v1, cifar_wideresnet16_10, ...).
On GPUs, each worker takes its own: ``--gpus 1`` uses mx.gpu(mxlbbsp.local_rank()) if this
version of mxlbbsp has local ranks, else mx.gpu(0).
"""
import argparse
import logging
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon
from gluoncv.model_zoo import get_model
from gluoncv.utils import LRScheduler

import mxlbbsp                                                                    # mxlbbsp
from mxlbbsp.worker import datasets

log = logging.getLogger("train_gluoncv_cifar")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cifar_resnet20_v1")
    p.add_argument("--data", default="synthetic", choices=["synthetic", "cifar10"])
    p.add_argument("--data-dir", help="a folder with CIFAR-10 (for --data cifar10)")
    p.add_argument("--samples", type=int, default=2048, help="synthetic data set size")
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--gpus", type=int, default=0, help="0: CPU; 1: one GPU per worker")
    p.add_argument("--save-params", help="rank 0 saves the trained parameters here")
    return p.parse_args(argv)


def test_accuracy(net, dataset, ctx):
    metric = mx.metric.Accuracy()
    for data, label in gluon.data.DataLoader(dataset, batch_size=256):
        data = gluon.utils.split_and_load(data, ctx_list=ctx, batch_axis=0)
        label = gluon.utils.split_and_load(label, ctx_list=ctx, batch_axis=0)
        metric.update(label, [net(x) for x in data])
    return metric.get()[1]


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    mx.random.seed(0)
    local = getattr(mxlbbsp, "local_rank", lambda: 0)()
    ctx = [mx.gpu(local)] if args.gpus else [mx.cpu()]
    try:
        train, test = datasets.load(args.data, data_dir=args.data_dir, samples=args.samples,
                                    image_shape="3,32,32")
    except ValueError as exc:
        sys.stderr.write(f"train_gluoncv_cifar.py: error: {exc}\n")
        return 2
    if test is None:       # synthetic: hold out the last eighth
        cut = len(train) * 7 // 8
        test = gluon.data.SimpleDataset([train[i] for i in range(cut, len(train))])
        train = gluon.data.SimpleDataset([train[i] for i in range(cut)])
    net = get_model(args.model, classes=10)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize()

    batch_size = args.batch_size
    train_data = mxlbbsp.DataLoader(train, global_batch_size=batch_size,          # mxlbbsp
                                    shuffle=True, last_batch="discard")
    iters_per_epoch = len(train_data)
    schedule = LRScheduler("cosine", base_lr=args.lr, target_lr=0, nepochs=args.epochs,
                           iters_per_epoch=iters_per_epoch)
    trainer = mxlbbsp.Trainer(net.collect_params(), "nag",                         # mxlbbsp
                              {"learning_rate": args.lr, "wd": args.wd,
                               "momentum": args.momentum, "lr_scheduler": schedule})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    metric = mx.metric.Accuracy()
    started = time.time()
    for epoch in range(args.epochs):
        metric.reset()
        for data, label in train_data:
            data = gluon.utils.split_and_load(data, ctx_list=ctx, batch_axis=0)
            label = gluon.utils.split_and_load(label, ctx_list=ctx, batch_axis=0)
            with autograd.record():
                output = [net(x) for x in data]
                loss = [loss_fn(yhat, y) for yhat, y in zip(output, label)]
            for part in loss:
                part.backward()
            trainer.step(batch_size)     # gluoncv's habit; inside a job it means step()
            metric.update(label, output)
        if mxlbbsp.rank() == 0:                                                      # mxlbbsp
            with mxlbbsp.untimed():
                accuracy = test_accuracy(net, test, ctx)
            log.info("[Epoch %d] train accuracy %.4f (this worker's batches), test accuracy "
                     "%.4f, lr %.4f, %.1f s", epoch, metric.get()[1], accuracy,
                     trainer.learning_rate, time.time() - started)
    if args.save_params and mxlbbsp.rank() == 0:
        net.save_parameters(args.save_params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
