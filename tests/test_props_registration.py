"""Registration refuses exactly the configurations that some iteration could not split.

Generated jobs (tests/props.py: any data set size, global batch, workers, caps, least local
batch, BatchNorm or not, --batch-range) register with the real coordinator (its hello
handler: registration.check_hellos, then the mode's validate; tests/simjob.py), and the
answer is compared with what the job's iterations need, worked out here from the epoch's
global batches alone. A refusal that is deliberate, although every iteration could be split,
is a documented exception below, with its reason.
"""
import math
from typing import Optional

import numpy as np
from hypothesis import given

from mxlbbsp.core import split
from mxlbbsp.core.epochs import EpochPlan
from props import setups, share
from simjob import Job, Setup


def capacity(s: Setup) -> float:
    """The most samples the workers can hold together in one iteration."""
    caps = s.caps()
    return math.inf if any(c is None for c in caps) else float(sum(caps))


def unsplittable(s: Setup) -> Optional[str]:
    """Why some iteration of ``s`` could not be split within the workers' bounds (every
    worker at least one sample, at most its cap), or None. The least local batch is no
    bound here: it gives way to a global batch too small for it (split.Balancer.lower)."""
    n, most = s.n, capacity(s)
    if s.sync in ("courier", "goodput"):
        # each epoch is cut into global batches as the job runs: a cut into batches of n to
        # `most` samples each exists iff ceil(N / most) batches can each have n samples
        batches = 1 if math.isinf(most) else math.ceil(s.N / most)
        if batches * n > s.N:
            return (f"an epoch of {s.N} samples cannot be cut into global batches of "
                    f"{n} to {most:g} samples")
        return None
    plan = EpochPlan(s.N, s.B, s.last_batch)
    for size in sorted({plan.batch(0)[1], plan.batch(plan.length - 1)[1]}):
        if size < n:
            return f"a global batch of {size} among {n} workers"
        if size > most:
            return f"a global batch of {size} over caps adding up to {most:g}"
        if s.sync == "bsp":
            caps = np.array([np.inf if c is None else c for c in s.caps()])
            over = np.flatnonzero(split.equal_split(size, n) > caps)
            if over.size:
                return (f"bsp's equal split of {size} gives worker {over[0]} more than its "
                        f"cap {caps[over[0]]:g}")
    return None


def deliberate(s: Setup) -> Optional[str]:
    """The refusals of configurations whose every iteration could be split, and why."""
    n, low = s.n, s.min_batch
    if s.N < s.B:
        # a global batch larger than the data set is a slip in the script: the job would
        # train on batches of N, never on the B it names
        return "the data set is smaller than one global batch"
    if s.B > capacity(s):
        # the same slip: a global batch the workers cannot hold together (courier and
        # goodput could run B(t) within the caps, but not the B the script names)
        return "the DataLoader's global batch is more than the workers' caps hold"
    if s.B < n:
        # in courier and goodput the DataLoader's B is B0, the batch the learning rate is
        # scaled from, and B(0) when it lies in --batch-range: a B0 below the number of
        # workers is the same slip as in the other modes
        return "the DataLoader's global batch is below the number of workers"
    # an explicit --min-batch-size that even a full global batch, or the smallest B of
    # --batch-range, cannot give every worker (or that a worker's cap forbids) is a promise
    # the job could not keep: said at the start, not lowered in silence
    if low is not None and low * n > s.B:
        return "--min-batch-size above the equal share of the global batch"
    if low is not None and any(c is not None and c < low for c in s.caps()):
        return "--min-batch-size above a worker's cap"
    if s.sync in ("courier", "goodput"):
        lo, _ = (int(x) for x in s.batch_range.split(":"))
        # --batch-range names the global batches the job may run: one that no split can
        # give every worker a sample, or that the workers cannot hold together, is a slip
        if lo < n:
            return "--batch-range's minimum below the number of workers"
        if low is not None and low * n > lo:
            return "--min-batch-size above the equal share of --batch-range's minimum"
        if lo > capacity(s):
            return "--batch-range's minimum above the workers' caps together"
    return None


@share(5.0, props=2.5)
@given(setups())
def test_registration_refuses_exactly_the_jobs_some_iteration_could_not_split(s):
    job = Job(s)
    refused = job.register()
    why = unsplittable(s) or deliberate(s)
    if refused is None:
        assert why is None, f"accepted although {why}: {s}"
    else:
        assert why is not None, f"refused although every iteration splits: {refused!r}: {s}"
        assert job.coordinator.failure_kind == "config"
        assert "\n" not in refused
