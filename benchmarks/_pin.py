"""Run a worker command pinned to one CPU core: core = MXLBBSP_RANK mod the number of cores.

Used by contention.py so that each worker owns one of this machine's cores and a CPU tenant
on a core slows down exactly the worker placed there (unpinned, Linux spreads a tenant's
load over both workers and the cluster stays homogeneous)::

    mxlbbsp launch -n 2 -- python benchmarks/_pin.py python examples/train_gluon.py ...

The affinity survives the exec; every thread MXNet starts inherits it.
"""
import os
import sys


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: _pin.py COMMAND [ARGS...]")
    cores = sorted(os.sched_getaffinity(0))
    rank = int(os.environ.get("MXLBBSP_RANK", "0"))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
