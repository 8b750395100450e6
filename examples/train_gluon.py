"""Train a Gluon model with LB-BSP. Copy this script; the mxlbbsp lines are marked.

One process (the whole global batch on this machine):
    python examples/train_gluon.py --model cnn --data digits --epochs 2
A job with 3 workers, one of them emulated 3x slower:
    mxlbbsp launch -n 3 --emulate-slowdown 1,1,3 -- python examples/train_gluon.py --model cnn

Data: ``synthetic`` (random images around a fixed random template per class, so the
loss goes down), ``digits`` (scikit-learn's bundled 8x8 digits, 1797 images, no download),
or ``cifar10`` from a local folder (``--data-dir``, the python or binary version of
CIFAR-10; nothing is downloaded).
"""
import argparse
import logging
import os
import sys
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxlbbsp                                     # mxlbbsp
from mxlbbsp.models import get_model
from mxlbbsp.worker import datasets

log = logging.getLogger("train_gluon")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cnn", help="mlp, cnn, resnet20, resnet18, mobilenet, "
                   "vgg or any gluoncv model-zoo name (default: cnn)")
    p.add_argument("--width", type=int, help="mlp: hidden units (default 64); cnn: channels "
                   "(default 16)")
    p.add_argument("--data", default="digits", choices=["synthetic", "digits", "cifar10"])
    p.add_argument("--data-dir", help="folder with CIFAR-10 (for --data cifar10)")
    p.add_argument("--samples", type=int, default=4096, help="synthetic data set size")
    p.add_argument("--image-shape", default="3,32,32", help="synthetic image shape C,H,W")
    p.add_argument("--noise", type=float, default=1.0,
                   help="synthetic: the noise added to each class's template, in its units "
                   "(default 1; more is a harder task)")
    p.add_argument("--batch-size", type=int, default=64, help="global batch size B")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--iterations", type=int, default=0,
                   help="stop after this many iterations in all (0: run all epochs)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader-workers", type=int, default=0,
                   help="data loading processes per worker (gluon's num_workers)")
    p.add_argument("--last-batch", default="keep", choices=["keep", "discard"])
    p.add_argument("--save-params", help="save the trained parameters here (rank 0)")
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--update-on-kvstore", action="store_true",
                   help="run the optimizer on the servers (MXNet's default on dist_sync; "
                   "no checkpoints then) instead of on every worker (benchmarks)")
    p.add_argument("--no-bn-sync", action="store_true",
                   help="leave each worker's BatchNorm running statistics its own (benchmarks)")
    p.add_argument("--eval", action="store_true", help="report test accuracy every epoch")
    p.add_argument("--eval-interval", type=int, default=0, metavar="N",
                   help="rank 0 evaluates test accuracy every N iterations and logs 'eval: "
                   "iteration=I accuracy=A train_s=S eval_s=E time=T' (train_s: seconds since "
                   "the start without the evaluations; time: Unix time). 0: never")
    return p.parse_args(argv)


def evaluate(net, dataset, batch_size=256):
    """Test accuracy; ``dataset`` may also be a list of (data, label) batches."""
    metric = mx.metric.Accuracy()
    batches = dataset if isinstance(dataset, list) else \
        gluon.data.DataLoader(dataset, batch_size=batch_size)
    for data, label in batches:
        metric.update(label, net(data))
    return metric.get()[1]


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    try:
        train, test = datasets.load(args.data, data_dir=args.data_dir, samples=args.samples,
                                    image_shape=args.image_shape, seed=args.seed,
                                    noise=args.noise)
        width = {} if args.width is None else \
            {{"mlp": "hidden", "cnn": "channels"}.get(args.model, "width"): args.width}
        net = get_model(args.model, classes=datasets.num_classes(args.data), **width)
    except ValueError as exc:
        sys.stderr.write(f"train_gluon.py: error: {exc}\n")
        return 2
    net.initialize(mx.init.Xavier())
    net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size,    # mxlbbsp
                                shuffle=True, seed=args.seed, last_batch=args.last_batch,
                                num_workers=args.loader_workers)
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd",                   # mxlbbsp
                              {"learning_rate": args.lr, "momentum": args.momentum,
                               "wd": args.wd},
                              update_on_kvstore=True if args.update_on_kvstore else None)
    trainer.sync_aux = not args.no_bn_sync
    rank = mxlbbsp.rank()
    iteration, started = loader.resumed_iteration, time.time()  # > 0 after --resume
    eval_s = 0.0                                   # time spent in --eval-interval evaluations
    test_batches = None
    if args.eval_interval and rank == 0 and test is not None:
        # batched once: a fresh gluon DataLoader pass over digits' test set takes ~100 ms,
        # the evaluation itself ~2 ms (it stalls the other workers, so keep it short)
        test_batches = list(gluon.data.DataLoader(test, batch_size=256))
    for epoch in range(args.epochs):
        for data, label in loader:                 # len(data) varies between iterations
            with autograd.record():
                loss = loss_fn(net(data), label)   # per-sample losses
            loss.backward()                        # sums per-sample gradients
            trainer.step()                         # / B: exactly large-batch SGD  # mxlbbsp
            mxlbbsp.log(loss=loss.mean())          # the curve `mxlbbsp report` draws # mxlbbsp
            iteration += 1
            if rank == 0 and args.log_interval and iteration % args.log_interval == 0:
                log.info("epoch %d iteration %d: loss %.4f, local batch %d, %.1f samples/s "
                         "(global)", epoch, iteration, loss.mean().asscalar(), len(data),
                         iteration * args.batch_size / (time.time() - started))
            if test_batches is not None and iteration % args.eval_interval == 0:
                t0 = time.time()
                train_s = t0 - started - eval_s    # training time so far, evaluations left out
                with mxlbbsp.untimed():            # not rank 0's compute  # mxlbbsp
                    accuracy = evaluate(net, test_batches)
                mxlbbsp.log(accuracy=accuracy)                                 # mxlbbsp
                eval_s += time.time() - t0
                log.info("eval: iteration=%d accuracy=%.4f train_s=%.3f eval_s=%.3f time=%.3f",
                         iteration, accuracy, train_s, eval_s, t0)
            if args.iterations and iteration >= args.iterations:
                break
        if args.eval and rank == 0 and test is not None:
            with mxlbbsp.untimed():                                            # mxlbbsp
                log.info("epoch %d: test accuracy %.4f", epoch, evaluate(net, test))
        if args.iterations and iteration >= args.iterations:
            break
    if args.save_params and rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.save_params)), exist_ok=True)
        net.save_parameters(args.save_params)
    if rank == 0:
        log.info("done: %d iterations in %.1f s", iteration, time.time() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
