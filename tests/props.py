"""What the property tests (tests/test_props_*.py) generate: the configurations a user can
write, and each test's share of the examples.

``make test`` runs the seeded profile (tests/conftest.py): a fixed seed, and each property's
share of 40 examples; ``make test-props`` the profile "props": a new seed and each
property's share of 1000.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from mxlbbsp.core import planner
from simjob import SYNCS, Setup


def share(fraction: float, props: Optional[float] = None) -> settings:
    """Settings for a property that runs ``fraction`` of the profile's examples (a slow
    one less, a fast one more), at least one; ``props``: its fraction in ``make
    test-props`` instead, when that would take too long (CI runs it in a few minutes)."""
    if props is not None and settings._current_profile == "props":
        fraction = props
    return settings(max_examples=max(1, round(fraction * settings.default.max_examples)))


@st.composite
def spread(draw, lo: int, hi: int) -> int:
    """Integers in [lo, hi], small ones as likely as large ones (every order of magnitude
    reached), shrinking towards ``lo``. (Drawn here, not with ``.map``: a mapped strategy
    made in a test, whose function closes over the test's values, made hypothesis report
    its generation inconsistent when it replayed an example.)"""
    if hi <= lo + 16:
        return draw(st.integers(lo, hi))
    how = draw(st.integers(0, 3))
    if how == 0:
        return draw(st.integers(lo, lo + 16))
    if how == 1:
        return draw(st.integers(lo, min(hi, max(lo, 1000))))
    if how == 2:
        k = draw(st.integers(0, int(math.log2(hi - lo + 1) * 8)))
        return min(hi, lo + int(2 ** (k / 8)) - 1)
    return draw(st.integers(lo, hi))


#: workers in a job, and samples in a data set
WORKERS = spread(1, 1024)
DATASETS = spread(1, 10 ** 7)
#: iterations per epoch at most in a job that runs (the coordinator's work per iteration is
#: a millisecond or two)
ITERATIONS = 48


def per_worker(draw, n: int, value: st.SearchStrategy, numbers) -> list:
    """A value per worker: drawn one by one for a few workers (they shrink), else
    ``numbers(rng, n)`` from a drawn seed (a thousand draws would crowd the example)."""
    if n <= 8:
        return draw(st.lists(value, min_size=n, max_size=n))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    return list(numbers(rng, n))


@st.composite
def setups(draw, syncs=SYNCS, budget: int = 0) -> Setup:
    """A job as a user may write it: any data set, global batch and workers, caps on some
    workers or all, a least local batch (given, or BatchNorm's default), and in the modes
    that choose B(t) their --batch-range and the choices their planner makes; the
    coordinator's time model (linear, or the fitted fixed costs of affine and auto).

    ``budget`` = 0: anything, most of it refused at registration (its test). Else a job to
    run, registration's refusals the exception: at most ``budget`` worker-iterations and
    ITERATIONS iterations per epoch; its short last batch any size (under n workers too),
    caps around the equal share, and a least local batch it can give every worker.
    """
    sync = draw(st.sampled_from(syncs))
    if not budget:
        n, N = draw(WORKERS), draw(DATASETS)
        B = draw(st.one_of(spread(1, 10 ** 7), st.integers(max(1, n - 2), n + 16),
                           st.integers(max(1, N - 8), N + 8),
                           st.integers(max(1, N // 3), N // 2 + 1)))
    else:
        n = draw(spread(1, min(1024, budget // 2)))
        length = draw(spread(1, max(1, min(ITERATIONS, budget // n))))
        B = draw(st.one_of(st.integers(n, n + 16), spread(n, max(n, 10 ** 7 // length))))
        rest = B if length == 1 else draw(st.one_of(st.just(B), st.integers(1, B),
                                                    st.integers(1, min(B, 2 * n))))
        N = B * (length - 1) + rest
    share_ = max(1, -(-B // n))
    # caps from half the equal share (bsp: the share, which its equal split needs)
    low = 1 if not budget else share_ if sync == "bsp" else max(1, share_ // 2)
    cap = st.one_of(st.none(), st.integers(low, 2 * share_ + 2))
    hello_caps = None
    if draw(st.booleans()):           # the DataLoader's max_batch_size on some workers
        hello_caps = per_worker(draw, n, cap, lambda rng, k: [
            None if rng.random() < 0.3 else int(rng.integers(low, 2 * share_ + 3))
            for _ in range(k)])
    max_batch = draw(st.one_of(st.none(), st.integers(low if not budget else share_,
                                                      2 * share_ + 2)))
    min_batch = draw(st.one_of(st.none(), st.integers(1, 3),
                               st.integers(1, max(1, B // n) if budget else 2 * share_ + 2)))
    batch_range, choices = None, ()
    if sync in ("courier", "goodput"):
        # in a job that runs, a B(t) no smaller than N / ITERATIONS
        least = max(1, n - 2) if not budget else \
            max(n, -(-N // min(ITERATIONS, max(1, budget // n))))
        lo = draw(st.one_of(st.integers(least, least + 16),
                            spread(least if budget else 1, max(least, 2 * B))))
        hi = draw(st.integers(lo, max(lo, 4 * lo)))
        batch_range = f"{lo}:{hi}"
        grid = planner.candidates(lo, hi).tolist()
        choices = draw(st.lists(st.sampled_from(grid), min_size=1, max_size=6))
    speed = per_worker(draw, n, st.floats(0.05, 1000.0),
                       lambda rng, k: rng.lognormal(3, 1.5, k).clip(0.05, 1000.0))
    fixed = draw(st.booleans())
    intercept = per_worker(draw, n, st.floats(0.0, 0.05),
                           lambda rng, k: rng.uniform(0, 0.05, k)) if fixed else None
    return Setup(n=n, N=N, B=B, sync=sync,
                 last_batch=draw(st.sampled_from(("keep", "discard"))),
                 shuffle=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)),
                 hello_caps=hello_caps, max_batch=max_batch, min_batch=min_batch,
                 batchnorm=draw(st.booleans()), batch_range=batch_range,
                 time_model=draw(st.sampled_from(("linear", "auto", "affine"))),
                 speed=speed, intercept=intercept, choices=choices)
