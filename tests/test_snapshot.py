"""The kept state of an elastic job's last finished iteration (mxlbbsp/worker/snapshot.py):
the copies hold the trainer's state of the step they were made after, the later steps do not
touch them, and a new array (the first step's optimizer states) makes new copies. Against
the arrays read from the trainer at that moment (plain numpy); one process, no job."""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

import mxlbbsp
from mxlbbsp.worker.snapshot import Keeper


def setup():
    mx.random.seed(3)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=4), gluon.nn.BatchNorm(in_channels=8),
            gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd",
                              {"learning_rate": 0.1, "momentum": 0.9})
    rng = np.random.RandomState(0)
    x, y = nd.array(rng.rand(16, 4)), nd.array(rng.randint(0, 3, 16))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            out = loss(net(x), y)
        out.backward()
        trainer.step(16)
    return trainer, step


def state(trainer):
    updater = trainer._updaters[0]
    return ([p.data().asnumpy() for p in trainer._params],
            {k: v.asnumpy() for k, v in updater.states.items()}, updater.optimizer.num_update)


def test_the_copies_hold_the_step_they_were_made_after():
    trainer, step = setup()
    keeper = Keeper()
    step()
    keeper.keep(trainer, 0)                       # before: no optimizer state at all
    for t in range(1, 4):
        step()
        keeper.keep(trainer, t)
    params, states, updates = state(trainer)
    step()
    step()                                        # the live state moved on
    t, kept, kept_states, optimizer = keeper.arrays()
    assert t == 3 and optimizer.num_update == updates
    assert len(kept) == len(params) and len(params) > 4      # BatchNorm's statistics too
    for a, b in zip(kept, params):
        assert np.array_equal(a, b)
    assert kept_states.keys() == states.keys() and states
    for k in states:
        assert np.array_equal(kept_states[k], states[k])
    live, _, _ = state(trainer)
    assert any(not np.array_equal(a, b) for a, b in zip(kept, live))


def test_nothing_kept_is_nothing_to_save():
    import pytest
    from mxlbbsp.worker.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="no finished iteration"):
        Keeper().arrays()
