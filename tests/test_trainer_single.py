"""mxlbbsp.Trainer in one process (no launcher): the step(n) idioms mean what they mean in
Gluon, and BatchNorm's statistics are left to BatchNorm (issue 20). No cluster: seconds."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxlbbsp
from mxlbbsp.worker import session


@pytest.fixture(autouse=True)
def _fresh_session():
    session.close_session()
    yield
    session.close_session()


def train(idiom, steps=6, batch=16):
    mx.random.seed(0)
    x = np.random.RandomState(0).randn(64, 5).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.float32)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8), gluon.nn.BatchNorm(momentum=0.99), gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier())
    loader = mxlbbsp.DataLoader(gluon.data.ArrayDataset(x, y), global_batch_size=batch,
                                shuffle=True, seed=1)
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5,
                                                            "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    done = 0
    while done < steps:
        for data, label in loader:
            with autograd.record():
                loss = loss_fn(net(data), label)
                if idiom == "mean-1":
                    loss = loss.mean()
            loss.backward()
            if idiom == "step":
                trainer.step()
            elif idiom == "len":
                trainer.step(len(data))
            elif idiom == "mean-1":
                trainer.step(1)
            else:
                trainer.allreduce_grads()
                trainer.update(len(data))
            done += 1
            if done == steps:
                break
    # names differ between the two nets (gluon's prefix counter): by position
    return {k.split("_", 1)[1] + str(i): v.data().asnumpy()
            for i, (k, v) in enumerate(net.collect_params().items())}


@pytest.mark.parametrize("idiom", ["len", "mean-1", "split"])
def test_a_single_process_takes_gluons_idioms_as_gluon_does(idiom):
    reference, other = train("step"), train(idiom)
    for key in reference:
        np.testing.assert_allclose(other[key], reference[key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)


def test_step_without_a_batch_size_outside_a_loader_says_what_it_needs():
    net = gluon.nn.Dense(2)
    net.initialize()
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = net(mx.nd.ones((3, 4))).sum()
    loss.backward()
    with pytest.raises(ValueError, match="needs a batch_size unless the batches come from an "
                                         "mxlbbsp.DataLoader"):
        trainer.step()


def test_batchnorm_layers_pair_up_in_the_order_of_the_parameters_on_every_worker():
    # Every worker pushes its layers' squared mean shifts in one vector: in the garbage
    # collector's order (which differs between processes) the sums would mix layers.
    from mxlbbsp.worker.batchnorm import RunningStats
    late = gluon.nn.BatchNorm(momentum=0.8, in_channels=3)     # made first, added second
    early = gluon.nn.BatchNorm(momentum=0.9, in_channels=5)
    net = gluon.nn.HybridSequential()
    net.add(early, late)
    net.initialize()
    aux = [p for p in net.collect_params().values() if p.grad_req == "null"]
    pairs = RunningStats(aux, key=0)._pairs()
    assert [(aux[p.mean].shape, p.momentum) for p in pairs] == [((5,), 0.9), ((3,), 0.8)]
    assert [p.var for p in pairs] == [p.mean + 1 for p in pairs]


def test_batchnorm_statistics_live_in_one_buffer_that_follows_a_reinitialised_layer():
    # A step reads the running statistics as one flat array and sets them with one copy:
    # the layers' arrays are views of it. Combining one worker's statistics must leave them
    # as the forward pass left them, and a layer re-initialised since (new arrays, not
    # views) must be read from its new arrays, not from the buffer it left.
    from mxlbbsp.worker.batchnorm import RunningStats
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(6), gluon.nn.BatchNorm(momentum=0.9), gluon.nn.Dense(4),
            gluon.nn.BatchNorm(momentum=0.8))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.array(np.random.RandomState(0).randn(8, 5))
    aux = [p for p in net.collect_params().values() if p.grad_req == "null"]
    stats, kv = RunningStats(aux, key=100), mx.kv.create("local")

    def forward():
        with autograd.record():
            net(x * (1 + len(seen))).backward()
        seen.append(1)

    def flat_params():
        return np.concatenate([p.data().asnumpy().ravel() for p in stats._order])

    seen = []
    forward()                             # the layers' shapes (deferred) and statistics
    stats._flat()
    for _ in range(3):
        forward()
        before = flat_params()
        stats.combine(kv, 8, 8)           # one worker: the combined statistics are its own
        assert np.allclose(flat_params(), before, rtol=1e-5, atol=1e-6)
        assert np.array_equal(stats._flat().asnumpy(), flat_params())
    net.initialize(mx.init.Xavier(), force_reinit=True)
    forward()
    assert np.array_equal(stats._flat().asnumpy(), flat_params())
    before = flat_params()
    stats.combine(kv, 8, 8)
    assert np.allclose(flat_params(), before, rtol=1e-5, atol=1e-6)
    forward()                             # the forward pass writes into the buffer again
    assert np.array_equal(stats._flat().asnumpy(), flat_params())
