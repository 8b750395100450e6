"""The models and data of the exactness bank's ledger jobs, in plain MXNet (no mxlbbsp): the
job's script (ledger_train.py) and the independent reference (tests/reference.py) both build
them from here; and the sample ledger a job's scripts write (:class:`Ledger`).

Data: N samples of 16 features, shifted so that BatchNorm's running means are of order 1,
with 4 classes from a random linear teacher plus noise; each item is (features, label,
index): the index is how a job records which samples it trained on (its sample ledger).
"""
import hashlib
import json
import os
import time

import numpy as np
import mxnet as mx
from mxnet import gluon, nd

FEATURES, CLASSES = 16, 4
MODELS = ("mlp", "bn")


def arrays(samples: int, seed: int = 1234):
    """(features, labels) as numpy arrays."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype(np.float32) * 2.0 + 1.0
    teacher = rng.normal(size=(FEATURES, CLASSES))
    y = np.argmax(x @ teacher + rng.normal(scale=2.0, size=(samples, CLASSES)), axis=1)
    return x, y.astype(np.float32)


def dataset(samples: int, seed: int = 1234):
    x, y = arrays(samples, seed)
    index = np.arange(samples, dtype=np.float32)
    return gluon.data.ArrayDataset(nd.array(x), nd.array(y), nd.array(index))


def lr_schedule():
    """The learning-rate schedule of ``--lr-decay``: 0.7x every 10 updates."""
    return mx.lr_scheduler.FactorScheduler(step=10, factor=0.7)


def model(name: str, bn_momentum: float = 0.9):
    """``mlp``: two dense layers; ``bn``: with a BatchNorm between them (softplus, not ReLU:
    a ReLU's kink amplifies float rounding). Every shape given, so that ``initialize()``
    makes the parameters at once, the same on every worker under the same seed."""
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(32, in_units=FEATURES))
        if name == "bn":
            net.add(gluon.nn.BatchNorm(momentum=bn_momentum, in_channels=32))
        net.add(gluon.nn.Activation("softrelu"), gluon.nn.Dense(CLASSES, in_units=32))
    mx.random.seed(0)
    net.initialize(mx.init.Xavier())
    return net


class Ledger:
    """A worker's sample ledger: OUT_DIR/ledger-rank<r>.jsonl, appended, one line per
    iteration (iteration, rank, workers, launch, time, indices), which tests/reference.py
    reads. ``launch`` tells a launch's lines from an earlier one's (a restart, a resume: the
    job's token is new each time); "single" outside a job.

    Write an iteration's line before its step: the step waits for every worker's push, so
    an iteration that ended (and that a checkpoint may hold) has every worker's line, even
    when the job is killed right after it; the lines of one that did not end are
    overridden by the launch that trains it again."""

    def __init__(self, out: str, rank: int, workers: int):
        self.rank, self.workers = rank, workers
        token = os.environ.get("MXLBBSP_TOKEN", "single")
        self.launch = hashlib.sha1(token.encode()).hexdigest()[:8]
        self._file = open(os.path.join(out, f"ledger-rank{rank}.jsonl"), "a")

    def write(self, iteration: int, indices) -> None:
        """The samples (their indices: an NDArray or a list) trained on at ``iteration``."""
        if hasattr(indices, "asnumpy"):
            indices = indices.asnumpy()
        self._file.write(json.dumps({
            "iteration": iteration, "rank": self.rank, "workers": self.workers,
            "launch": self.launch, "time": time.time(),
            "indices": [int(i) for i in indices]}) + "\n")
        self._file.flush()
