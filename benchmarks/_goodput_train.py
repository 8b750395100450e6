"""The worker script of ``benchmarks/goodput.py``'s synthetic workloads: an MLP on Gaussian
classes, some of whose training labels are flipped at random.

Each class is a Gaussian blob in ``--dim`` dimensions around a random centre, the centres
``--separation`` standard deviations apart on average; ``--label-noise`` of the training
labels are replaced by a uniformly random class (the test labels are clean). Label noise
keeps the per-sample gradients spread out while the mean gradient shrinks, so the gradient
noise scale is high and larger batches save many iterations; without it, on well
separated classes, it is low and they save few. With ``--blobs-per-class`` above 1 the
noise scale grows during the run: the first, coarse, progress is cheap at a small batch, the
fine boundary late in the run needs the large one.

Rank 0 evaluates the test accuracy every ``--eval-interval`` iterations and logs it as
``examples/train_gluon.py`` does (``eval: iteration=I accuracy=A train_s=S``, the training
time without the evaluations), which ``_goodput_runs.run_to_target`` reads.
"""
import argparse
import logging
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

import mxlbbsp

log = logging.getLogger("goodput_train")


def blobs(samples, classes, dim, separation, label_noise, seed, test_samples, per_class=1):
    """(train x, train y, test x, test y): the same centres for both; noisy train labels.
    ``per_class`` blobs make up each class (blob j belongs to class j % classes): with more
    than one the boundary is not linear, and the net keeps learning it long after the
    first, easy, progress."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes * per_class, dim)) * separation / np.sqrt(2 * dim)

    def draw(count, r):
        blob = r.integers(0, classes * per_class, count)
        return (centres[blob] + r.standard_normal((count, dim))).astype(np.float32), \
            blob % classes

    x, y = draw(samples, rng)
    flip = rng.random(samples) < label_noise
    y = np.where(flip, rng.integers(0, classes, samples), y)
    tx, ty = draw(test_samples, np.random.default_rng([seed, 1]))
    return x, y.astype(np.float32), tx, ty.astype(np.float32)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=16000)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--separation", type=float, default=2.0,
                   help="mean distance between class centres, in standard deviations")
    p.add_argument("--label-noise", type=float, default=0.1)
    p.add_argument("--blobs-per-class", type=int, default=1,
                   help="Gaussian blobs per class (more than one: a boundary that is not "
                        "linear)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0, help="the initialisation and the order")
    p.add_argument("--data-seed", type=int, default=0,
                   help="the data set (the same for every --seed: one workload)")
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--iterations", type=int, default=0)
    p.add_argument("--eval-interval", type=int, default=5)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    mx.random.seed(args.seed)
    x, y, tx, ty = blobs(args.samples, args.classes, args.dim, args.separation,
                         args.label_noise, args.data_seed, 2000, args.blobs_per_class)
    train = gluon.data.ArrayDataset(nd.array(x), nd.array(y))
    test = [(nd.array(tx), nd.array(ty))]
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(args.hidden, activation="relu"),
            gluon.nn.Dense(args.hidden, activation="relu"), gluon.nn.Dense(args.classes))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    loader = mxlbbsp.DataLoader(train, global_batch_size=args.batch_size, shuffle=True,
                                seed=args.seed)
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd",
                              {"learning_rate": args.lr, "momentum": args.momentum})
    rank, iteration, started, eval_s = mxlbbsp.rank(), 0, time.time(), 0.0
    for _ in range(args.epochs):
        for data, label in loader:
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step()
            iteration += 1
            if rank == 0 and args.eval_interval and iteration % args.eval_interval == 0:
                t0 = time.time()
                train_s = t0 - started - eval_s
                with mxlbbsp.untimed():
                    metric = mx.metric.Accuracy()
                    for d, lab in test:
                        metric.update(lab, net(d))
                    accuracy = metric.get()[1]
                eval_s += time.time() - t0
                log.info("eval: iteration=%d accuracy=%.4f train_s=%.3f eval_s=%.3f",
                         iteration, accuracy, train_s, eval_s)
            if args.iterations and iteration >= args.iterations:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
