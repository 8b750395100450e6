"""Train a tiny model on a data set whose labels are the sample indices, and record, per
iteration, which samples this worker trained on: tests check the slicing rule with it.

    record_batches.py OUT_DIR N B EPOCHS LOADER_WORKERS LAST_BATCH [MOMENTUM]

Rank 0 (or the single process) also saves the trained parameters in OUT_DIR.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxlbbsp

out_dir, N, B, epochs, loader_workers, last_batch = sys.argv[1:7]
N, B, epochs, loader_workers = int(N), int(B), int(epochs), int(loader_workers)
mx.random.seed(0)
x = np.arange(N, dtype=np.float32).reshape(N, 1) / N
dataset = gluon.data.ArrayDataset(nd.array(x), nd.array(np.arange(N, dtype=np.float32)))
net = gluon.nn.Dense(1)
net.initialize()
loader = mxlbbsp.DataLoader(dataset, global_batch_size=B, shuffle=True, seed=7,
                            last_batch=last_batch, num_workers=loader_workers)
momentum = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                        "momentum": momentum})
seen = []
for _ in range(epochs):
    for data, label in loader:
        seen.append([int(i) for i in label.asnumpy()])
        with autograd.record():
            loss = (net(data).reshape(-1) - data.reshape(-1)) ** 2
        loss.backward()
        trainer.step()
name = f"rank{mxlbbsp.rank()}" if mxlbbsp.num_workers() > 1 else "single"
with open(os.path.join(out_dir, name + ".json"), "w") as fh:
    json.dump({"rank": mxlbbsp.rank(), "batches": seen}, fh)
if mxlbbsp.rank() == 0:
    net.save_parameters(os.path.join(out_dir, name + ".params"))
