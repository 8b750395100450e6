"""The per-step cost of an elastic job's kept state (mxlbbsp/worker/snapshot.py), side by side
in one process: benchmarks/elastic.py runs this as ``python _keep_cost.py JSON_ARGS``.

One mxlbbsp.Trainer step loop (a single process: no kvstore, no launcher), steps alternating
with the copies on and off (ABBA): on, the step is followed by the ``Keeper.keep`` an
elastic job's trainer makes after its step (the same call); each step timed to the engine
drained. Printed: one JSON line with every step's time per arm. Other load on the machine
only ever adds to a step's time, so the fastest steps of each arm (their lower quantiles)
compare what the copies cost, where separate jobs on a shared machine spread by more.
"""
import json
import sys
import time

import numpy as np


def main():
    args = json.loads(sys.argv[1])
    import mxnet as mx
    from mxnet import autograd, gluon, nd

    import mxlbbsp
    from mxlbbsp.models import get_model
    from mxlbbsp.worker.snapshot import Keeper

    mx.random.seed(1)
    net = get_model(args["model"], classes=10)
    net.initialize(mx.init.Xavier())
    batch = args["batch"]
    x = nd.array(np.random.RandomState(0).rand(batch, 3, 32, 32).astype("float32"))
    y = nd.array(np.random.RandomState(1).randint(0, 10, batch).astype("float32"))
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd",
                              {"learning_rate": 0.01, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)

    keeper = Keeper()
    for i in range(3):                       # graph building, the optimizer's states, the
        step()                               # copies' arrays
        keeper.keep(trainer, i)
    nd.waitall()
    times = {"on": [], "off": []}
    for b in range(2 * args["steps"]):
        arm = ("on", "off")[(b + b // 2) % 2]        # ABBA: on off off on on off ...
        began = time.perf_counter()
        step()
        if arm == "on":
            keeper.keep(trainer, b)
        nd.waitall()
        times[arm].append(time.perf_counter() - began)
    print(json.dumps(times))


if __name__ == "__main__":
    main()
