"""Write, per worker, the arguments it got and where it runs, then exit 0 (no training).

    argv_probe.py OUT [ARGS...]  ->  OUT.<rank>.json: {"argv": [ARGS...], "rank", "local_rank",
                                                       "local_size", "num_workers",
                                                       "torchrun": [RANK, WORLD_SIZE, ...]}
"""
import json
import os
import sys

import mxlbbsp

out = sys.argv[1]
with open(f"{out}.{mxlbbsp.rank()}.json", "w") as fh:
    json.dump({"argv": sys.argv[2:], "rank": mxlbbsp.rank(),
               "local_rank": mxlbbsp.local_rank(), "local_size": mxlbbsp.local_size(),
               "num_workers": mxlbbsp.num_workers(),
               "torchrun": [os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                        "LOCAL_WORLD_SIZE")]}, fh)
