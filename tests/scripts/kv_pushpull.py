"""A plain MXNet dist_sync script that checks every sum a pushpull returns.

Each worker pushes, for iteration t and key k, an array filled with (t + 1) * (rank + 1) +
k, pushpull in place (the pulled sum into the pushed array, as mxlbbsp's trainer does with
the gradients), and checks that every element is the sum over the workers of iteration t's
values: a server that answered before its copy of the new sum had finished would return
iteration t-1's. The keys' sizes run from a few floats to more than MXNet's big-array bound
(split over the servers); random pauses vary who pushes first. Prints ``pushpull ok N`` or
the first wrong sum, and exits 1 then.
"""
import sys
import time

import numpy as np

import mxnet as mx

iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 500
SIZES = (3, 1000, 100_000, 1_200_000)
kv = mx.kv.create("dist_sync")
n, rank = kv.num_workers, kv.rank
rng = np.random.default_rng(rank)
arrays = [mx.nd.zeros((size,)) for size in SIZES]
for k, a in enumerate(arrays):
    kv.init(k, a)
mx.nd.waitall()
base = n * (n + 1) // 2


def check(t, k, got):
    want = (t + 1) * base + k * n
    if not np.all(got == want):
        bad = got[got != want]
        sys.stderr.write(f"worker {rank}: iteration {t}, key {k} ({SIZES[k]} floats): "
                         f"{bad.size} elements are {np.unique(bad)[:4]}, not {want}\n")
        sys.exit(1)


pending = []      # (t, k, a copy of the sum): read in batches, the engine running ahead
for t in range(iterations):
    for k, a in enumerate(arrays):
        a[:] = (t + 1) * (rank + 1) + k
        kv.pushpull(k, a, out=a, priority=-k)
        pending.append((t, k, a.copy()))
    if rng.random() < 0.1:
        mx.nd.waitall()
        time.sleep(float(rng.random()) * 0.003)
    if len(pending) >= 40 * len(arrays) or t == iterations - 1:
        for t_, k, copy in pending:
            check(t_, k, copy.asnumpy())
        pending = []
print(f"pushpull ok {iterations}", flush=True)
