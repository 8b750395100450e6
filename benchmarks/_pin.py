"""Run a worker command pinned to one CPU core: core = MXLBBSP_RANK mod the number of cores.

Used by contention.py so that each worker owns one of this machine's cores and a CPU tenant
on a core slows down exactly the worker placed there (unpinned, Linux spreads a tenant's
load over both workers and the cluster stays homogeneous)::

    mxlbbsp launch -n 2 -- python benchmarks/_pin.py python examples/train_gluon.py ...

The affinity survives the exec; every thread MXNet starts inherits it. With
MXLBBSP_BENCH_CGROUP set (contention.py --cgroup), the worker also joins the cgroup
$MXLBBSP_BENCH_CGROUP<core>, as the exec's threads do.
"""
import os
import sys


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: _pin.py COMMAND [ARGS...]")
    cores = sorted(os.sched_getaffinity(0))
    rank = int(os.environ.get("MXLBBSP_RANK", "0"))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    cgroup = os.environ.get("MXLBBSP_BENCH_CGROUP")
    if cgroup:
        with open(f"{cgroup}{core}/cgroup.procs", "w") as fh:
            fh.write(str(os.getpid()))
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
