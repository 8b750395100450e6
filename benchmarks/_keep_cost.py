"""The per-step cost of an elastic job's kept state (mxlbbsp/worker/snapshot.py), side by side
in one process: benchmarks/elastic.py runs this as ``python _keep_cost.py JSON_ARGS``.

One mxlbbsp.Trainer step loop (a single process: no kvstore, no launcher), blocks of
``block`` steps alternating with the copies on and off: on, each step is followed by the
``Keeper.keep`` an elastic job's trainer makes after its step (the same call); the engine
drained at each block's ends. Printed: one JSON line
with every block's mean step time per arm. Interleaving small blocks in one process takes
out what separate jobs on a shared machine spread by (other load, the processes' start).
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
    for b in range(2 * args["blocks"]):
        arm = ("on", "off")[(b + b // 2) % 2]        # ABBA: on off off on on off ...
        nd.waitall()
        began = time.perf_counter()
        for i in range(args["block"]):
            step()
            if arm == "on":
                keeper.keep(trainer, i)
        nd.waitall()
        times[arm].append((time.perf_counter() - began) / args["block"])
    print(json.dumps(times))


if __name__ == "__main__":
    main()
