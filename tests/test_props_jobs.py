"""Whole jobs of the pure core: every iteration's split, and the sample ledger of every epoch.

A generated job (tests/props.py) that registration accepts runs two epochs on the real
coordinator with simulated workers (tests/simjob.py: their loaders and sessions through the
functions mxlbbsp.DataLoader uses), in courier and goodput with the global batches their
planner is made to choose, and with resumes at any iteration onto any number of workers.
Every iteration the workers ran must:

* tile its global batch B(t): the workers' slices, in rank order, one after another;
* respect every bound that can be respected: each worker at least min(least local batch,
  B(t) // n) samples (the least local batch: --min-batch-size, or BatchNorm's default) and
  at most its cap; in bsp, the equal split;
* be what each worker took on its own: the same B(t) on every worker;

and every sample index must be used exactly once per epoch (a ledger of the indices the
workers' slices read from the epoch's permutation, and of their positions in it).
"""
import dataclasses

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from mxlbbsp.core import epochs, split
from props import per_worker, setups, share, spread
from simjob import Job, Setup

#: worker-iterations per epoch at most, so that an example runs in milliseconds
BUDGET = 2000
#: a data set up to this size has its ledger kept by index as well as by position
BY_INDEX = 200_000


def where(bad, sizes, bound) -> str:
    """The first few workers out of bounds, for a failure's message."""
    ranks = np.flatnonzero(bad)[:4].tolist()
    return ", ".join(f"worker {r}: {sizes[r]} (bound {bound[r]})" for r in ranks)


def check_step(s: Setup, step) -> None:
    n, total, sizes = s.n, step.total, step.split
    assert int(sizes.sum()) == total, f"iteration {step.t}: {int(sizes.sum())} of {total}"
    assert step.starts[0] + total == step.starts[-1] + sizes[-1]
    assert np.array_equal(step.starts[1:], step.starts[:-1] + sizes[:-1]), step.t
    caps = np.array([10 ** 12 if c is None else c for c in s.caps()])
    least = np.maximum(np.minimum(np.minimum(s.least_batch(), total // n), caps), 1)
    assert np.all(sizes >= least), \
        f"iteration {step.t} of {total}: below the least, {where(sizes < least, sizes, least)}"
    assert np.all(sizes <= caps), \
        f"iteration {step.t} of {total}: above the cap, {where(sizes > caps, sizes, caps)}"
    if s.sync == "bsp":
        assert sizes.tolist() == split.equal_split(total, n).tolist(), step.t


def check_ledger(s: Setup, steps, complete) -> None:
    """Every epoch in ``complete`` uses each sample of its epoch exactly once: by position in
    the epoch's order (the slices tile it), and by index (the permutation read through
    them)."""
    fixed = epochs.EpochPlan(s.N, s.B, s.last_batch)
    used = s.N if s.sync in ("courier", "goodput") else fixed.used
    for e in complete:
        ran = [st for st in steps if st.epoch == e]
        starts = np.concatenate([st.starts for st in ran])
        sizes = np.concatenate([st.split for st in ran])
        by = np.argsort(starts, kind="stable")
        starts, sizes = starts[by], sizes[by]
        assert starts[0] == 0 and starts[-1] + sizes[-1] == used, (e, starts, sizes)
        assert np.array_equal(starts[1:], starts[:-1] + sizes[:-1]), f"epoch {e}: overlap/gap"
        if s.N <= BY_INDEX:
            order = epochs.order(s.N, e, s.shuffle, s.seed)
            seen = np.concatenate([order[a:a + b] for a, b in zip(starts, sizes)])
            counts = np.bincount(seen, minlength=s.N)
            assert np.all(counts[order[:used]] == 1) and counts.sum() == used, e


@share(1.0, props=0.4)
@given(setups(budget=BUDGET))
def test_every_iteration_splits_within_its_bounds_and_uses_each_sample_once_per_epoch(s):
    with Job(s) as job:
        assume(job.register() is None)
        steps = job.run(until_epoch=2)
    for step in steps:
        check_step(s, step)
    check_ledger(s, steps, complete=(0, 1))


@st.composite
def resumed(draw):
    """A job of lbbsp or bsp (the modes with checkpoints), and the launches that resume
    it: each at any iteration of the two epochs, onto any number of workers with caps and
    speeds of their own."""
    s = draw(setups(syncs=("lbbsp", "bsp"), budget=BUDGET))
    plan = epochs.EpochPlan(s.N, s.B, s.last_batch)
    launches = [s]
    at = sorted(draw(st.lists(st.integers(0, 2 * plan.length - 1), max_size=3)))
    for _ in at:
        n = draw(spread(1, max(1, min(1024, BUDGET // plan.length, plan.smallest))))
        share_ = -(-s.B // n)
        low = share_ if s.sync == "bsp" else max(1, share_ // 2)
        caps = None
        if draw(st.booleans()):
            caps = per_worker(draw, n, st.one_of(st.none(), st.integers(low, 2 * share_ + 2)),
                              lambda rng, k: [None if rng.random() < 0.3 else
                                              int(rng.integers(low, 2 * share_ + 3))
                                              for _ in range(k)])
        speed = per_worker(draw, n, st.floats(0.05, 1000.0),
                           lambda rng, k: rng.lognormal(3, 1.5, k).clip(0.05, 1000.0))
        launches.append(dataclasses.replace(s, n=n, hello_caps=caps, speed=speed,
                                            intercept=None))
    return launches, at


@share(1.0, props=0.4)
@given(resumed())
def test_resumes_at_any_iteration_onto_any_workers_use_each_sample_once_per_epoch(case):
    launches, at = case
    steps, manifest, state = [], None, None
    for k, s in enumerate(launches):
        with Job(s, manifest, state) as job:
            assume(job.register() is None)
            last = at[k] if k < len(at) else None
            if last is not None and last < job.start:
                last = job.start            # a checkpoint at most every iteration
            ran = job.run(until_epoch=2, last=last)
            if ran:
                manifest, state = job.checkpoint()
        for step in ran:
            check_step(s, step)
        steps += ran
    assert [st.t for st in steps] == list(range(len(steps)))
    check_ledger(launches[0], steps, complete=(0, 1))
