"""A plain MXNet dist_sync script (no mxlbbsp API) that keeps its ps-lite sockets open for a
while: the test reads which addresses the job's processes listen on."""
import sys
import time

import mxnet as mx

kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((2,)))
kv.push(3, mx.nd.ones((2,)))
out = mx.nd.zeros((2,))
kv.pull(3, out=out)
out.wait_to_read()
print("pulled", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
