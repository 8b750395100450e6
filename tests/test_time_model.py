"""The default time model (auto) on a tiny model.

A tiny MLP's iteration is mostly fixed cost (a few ms whatever the batch), so the linear
model reads the worker given fewer samples as slower per sample and, with nothing to stop
it, walks the split to 63:1 (seen with ``--time-model linear``). ``auto`` must notice the
fixed cost and keep the split near equal, and still balance workers that differ.

Two kinds of test: one real job (processes, kvstore, the MLP), and the coordinator's
balancing alone, fed simulated iteration times through its report handler (no sockets, no
clock) so that many noisy runs with fixed seeds take seconds and always give the same
answer. The simulated times are what the real MLP showed: a fixed cost, a small cost per
sample, +-30 % noise and now and then an iteration stretched 3x by another tenant.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLE, PY, run_mxlbbsp
from mxlbbsp.control.speed import RETRY_EQUAL
from mxlbbsp.control.speed import SPEED_WINDOW

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
# the simulation of benchmarks/time_model.py: a real Coordinator fed simulated times
from time_model import median_ratio, run as simulate  # noqa: E402

NOISE = 0.3         # +-30 %, and 5 % of iterations stretched 3x: as the real MLP


def test_equal_workers_on_a_fixed_cost_stay_near_the_equal_split():
    # 4 ms fixed + 30 us per sample: 80 % of a 32-sample iteration is fixed cost
    late = [median_ratio(simulate(seed, 0.004, 3e-5, 1.0, NOISE)[60:])
            for seed in range(12)]
    # (the time model before this test: 4 of these 12 runs held a split beyond 1.5:1)
    assert sum(r <= 1.5 for r in late) >= 11, late


@pytest.mark.parametrize("fixed_s,per_sample_s,best_b0", [
    (0.004, 3e-5, 63),      # fixed cost: the slow worker is best left one sample
    (0.001, 3e-4, 50),      # compute-bound: about 3:1, as the linear model balances
])
def test_a_worker_three_times_slower_still_gets_fewer_samples(fixed_s, per_sample_s,
                                                              best_b0):
    for seed in range(3):
        b0 = simulate(seed, fixed_s, per_sample_s, 3.0, NOISE)[30:]
        assert abs(np.median(b0) - best_b0) <= 4, (seed, b0)


def test_tenants_switching_between_workers_do_not_send_a_compute_bound_job_to_equal():
    """benchmarks/contention.py's alternating tenants, simulated: worker 0 2x slower for 35
    iterations, then worker 1, and so on; compute-bound (9 % fixed cost, 10 % noise). While
    the split answers each switch, the fit reads the shrinking batch of the slowed worker as
    a fixed cost; the faster worker's time, growing with its batch, must show otherwise.
    It takes a few switches (coordinator.COMPUTE_VOTES probes); after the fourth, the split
    goes to the equal one (the worst at every moment but the switch itself) only in passing.
    Before the probe, ~20 % of the iterations went there."""
    for seed in range(3):
        b0 = simulate(seed, 0.001, 3e-4, 1.0, 0.1, 300, period=35)
        late = b0[140:]
        # at each switch the split passes through 32 on its way: a few iterations, not runs
        assert sum(b == 32 for b in late) <= 6, (seed, b0)
        # and it sits on the right side: the best split is 2:1 against the slowed worker
        for start in range(140, 300, 35):
            phase = [b for t, b in enumerate(b0) if start + 5 <= t + 1 < start + 35]
            slowed = 0 if (start // 35) % 2 == 0 else 1     # b0[t]: iteration t + 1's split
            median = np.median(phase)
            assert (median <= 26) if slowed == 0 else (median >= 38), (seed, start, phase)


def records(path, planned=None):
    """[{rank: (batch_size, compute_s)}] per iteration, in order; into ``planned`` (a dict),
    iteration -> planned_from (the last iteration whose reports decided its split)."""
    by_iter = {}
    for line in open(path):
        r = json.loads(line)
        by_iter.setdefault(r["iteration"], {})[r["rank"]] = (r["batch_size"], r["compute_s"])
        if planned is not None and "planned_from" in r:
            planned[r["iteration"]] = r["planned_from"]
    return [by_iter[t] for t in sorted(by_iter)]


@pytest.mark.cluster
def test_auto_keeps_two_equal_workers_near_an_equal_split(tmp_path):
    metrics = tmp_path / "m.jsonl"
    r = run_mxlbbsp("launch", "-n", 2, "--metrics", metrics, "--progress", "0", "--", PY,
                    EXAMPLE, "--model", "mlp", "--data", "digits", "--batch-size", "64",
                    "--epochs", "100", "--iterations", "120", "--log-interval", "0")
    assert r.rc == 0, r.output
    planned = {}
    its = records(metrics, planned)
    assert len(its) == 120
    ratios = [max(b for b, _ in it.values()) / min(b for b, _ in it.values()) for it in its]
    # No drift: after the first 30 iterations, a split beyond 1.5:1 comes back to the equal
    # split to check within coordinator.RETRY_EQUAL + SPEED_WINDOW iterations of evidence:
    # between the reports that the run's first and its last split were decided from (the
    # records' planned_from). With a decision per iteration that is the run's length; on
    # iterations shorter than the control period a lease is decided some 2k+1 iterations
    # ahead and holds k of them (k = period / iteration time, 25 here), so a run lasts up
    # to that much longer than the evidence it was decided on.
    for start, length in uneven_runs(ratios, 1.5, first=30):
        last = start + length - 1
        first_from, last_from = planned.get(start, start - 2), planned.get(last, last - 2)
        if last_from < 30:
            continue
        assert last_from - first_from + 1 <= RETRY_EQUAL + SPEED_WINDOW, \
            (start, length, first_from, last_from, ratios)
    # Two processes on two shared cores are not always equal: the launcher, a server or
    # another program can make one of them measurably slower for a while, and then auto
    # rightly gives it fewer samples. So every uneven episode that begins after the first 30
    # iterations (by then the fixed cost is identified; before, the linear model balances
    # noise by design) must be earned: the worker given fewer samples took 1.3x the other's
    # time (median or mean) over the SPEED_WINDOW iterations the split was decided from (the
    # coordinator asks 1.5x at every fixed share the fit allows): those before the episode,
    # or on iterations shorter than the control period those before its record's
    # planned_from (a lease of several iterations is planned ahead: this job's iterations of
    # about 2 ms are planned some 40-60 iterations ahead), and decided after the first 30
    # iterations as well. Where those were themselves
    # split unevenly, the episode goes on balancing what an earlier one found (raw times say
    # nothing then: balanced workers take the same time), and that one is checked. An episode
    # is a stretch beyond 1.5:1 with dips of fewer than SPEED_WINDOW iterations below: the
    # balancing goes on through a dip.
    for start, length in uneven_runs(ratios, 1.5, first=30, gap=SPEED_WINDOW):
        if start < 30 or length < 3:
            continue
        end = min(planned.get(start, start - 1) + 1, start)
        if end < 30 or max(ratios[end - SPEED_WINDOW:end]) >= 1.5:
            continue            # decided in the first 30 iterations, or balancing on
        before = its[end - SPEED_WINDOW:end]
        fewer = min(its[start], key=lambda rank: its[start][rank][0])
        other = 1 - fewer
        mine = [it[fewer][1] for it in before]
        theirs = [it[other][1] for it in before]
        # in the median, or on the mean (a worker slowed 3x in one iteration of four costs
        # the job what a steady 1.5x does, and the linear model balances mean speeds)
        slower = max(np.median(mine) / np.median(theirs), np.mean(mine) / np.mean(theirs))
        assert slower >= 1.3, (start, slower, ratios)


def uneven_runs(ratios, limit, first, gap=1):
    """(start, length) of every run of iterations beyond ``limit``:1 that reaches past
    ``first`` (a run's start may be earlier); runs less than ``gap`` iterations apart count
    as one."""
    runs = []
    for t, ratio in enumerate(ratios):
        if ratio <= limit:
            continue
        if runs and t - (runs[-1][0] + runs[-1][1]) < gap:
            runs[-1][1] = t + 1 - runs[-1][0]
        else:
            runs.append([t, 1])
    return [(start, length) for start, length in runs if start + length > first]


def test_the_compute_bound_mark_is_dropped_when_the_batch_shrinks_a_lot():
    """A job marked compute-bound by the probe (coordinator.AutoRegime) at 32 samples per
    worker is checked again once Courier shrinks its batch below half: a smaller batch has a
    larger fixed share."""
    from mxlbbsp.core.timemodel import AffineFit
    from mxlbbsp.control.speed import AutoRegime
    regime, fit = AutoRegime(2), AffineFit(2)
    regime.compute_bound, regime.compute_votes, regime.bound_at = True, 2, 32.0
    assert not regime.equal_split(fit, np.array([20.0, 20.0]))
    assert regime.compute_bound                      # 20 of 32: still marked
    regime.equal_split(fit, np.array([10.0, 12.0]))
    assert not regime.compute_bound and regime.compute_votes == 0


def split_of_three(seed, fixed_s, per_sample_s, slow, iterations=120, B=64):
    """The coordinator's split of every iteration for 3 simulated workers whose times are
    ``slow_i * (fixed + per_sample * b_i)``, with the module's noise (as time_model.run)."""
    from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
    from mxlbbsp.core.frames import Rows
    rng = np.random.default_rng(seed)
    c = Coordinator(CoordinatorConfig(num_workers=3, token="t"))
    sent = {}                           # no workers: each split kept for its iteration
    c.links.send_split = lambda t, sizes: sent.__setitem__(t, np.array(sizes))
    sizes = np.array([22, 21, 21])
    c._in_force = sizes.copy()
    out = []
    for t in range(iterations):
        stretch = rng.lognormal(0, NOISE, 3) * np.where(rng.random(3) < 0.05, 3, 1)
        compute = (fixed_s + per_sample_s * sizes) * np.asarray(slow) * stretch
        for r in range(3):
            decided = c.collect.reports(Rows.from_messages([r], [{
                "type": "report", "iteration": t, "batch_size": int(sizes[r]),
                "compute_s": float(compute[r]), "next_global_batch": B}], 0.0))
        c.decide(*decided)
        sizes = sent.pop(t + 1, sizes)      # the split of the next iteration, if any came
        out.append(sizes.copy())
    return np.array(out)


@pytest.mark.parametrize("per_sample_s", [3e-5, 3e-6])   # 80 % and 98 % fixed cost
def test_two_equal_workers_beside_a_slower_one_get_equal_shares(per_sample_s):
    """1:1:3 where the fixed cost dominates (a small CNN): a worker is clearly slower, so
    the linear model balances, and it read the fixed cost as speed (of two equal workers,
    the one given more looked faster and got more) while the slow worker, at its least
    batch and last whatever they got, made every split of the others equally long: the
    real job held the equal workers at mean batches of 41 and 18. Their mean local batches
    must be within 10 % of each other (before: 1.13-1.74x over these seeds at 80 %)."""
    for seed in range(4):
        mean = split_of_three(seed, 0.004, per_sample_s, [1.0, 1.0, 3.0])[10:].mean(axis=0)
        assert max(mean[:2]) <= 1.1 * min(mean[:2]), (seed, mean)
        assert mean[2] < min(mean[:2]), (seed, mean)


def _speeds(n, batch, base, slow, iterations=30, seed=0, vary=0, noise=0.1):
    """The ``auto`` speed model's speeds for the next iteration after ``iterations`` of
    simulated reports (predictor ``last``): worker i at ``batch[i]`` samples (+- ``vary``
    at random), its time ``base(b)`` x ``slow[i]`` with ``noise`` (lognormal sigma)."""
    from mxlbbsp.control.speed import SpeedModel
    rng = np.random.default_rng(seed)
    model = SpeedModel(n, "last", 1, "auto")
    batch = np.asarray(batch, dtype=float)
    for t in range(iterations):
        b = np.maximum(batch + rng.integers(-vary, vary + 1, n), 1) if vary else batch
        compute = base(b) * np.asarray(slow) * rng.lognormal(0, noise, n)
        out = model.model(t, b, compute, np.zeros((n, 1)))
    return out.speed, model


def test_equal_workers_beside_one_at_its_least_batch_get_one_speed_while_the_fit_cannot_tell():
    """A 1:1:3 small CNN, before the fit can tell that the fixed cost dominates (the batch
    sizes have not varied: its bounds on the fixed share still reach 1): the linear model
    read the equal pair's b / t as their speeds, 43 and 20 samples in the same time, so
    every split of theirs was its own fixed point and noise walked it (seen: 39:23 and
    20:43 held for 30 iterations). Alike workers get one speed; the slow one keeps its
    own. (Fails without SpeedModel._may_be_fixed: speeds about 2.1:1.)"""
    speed, model = _speeds(3, [43, 20, 1], lambda b: np.full(len(b), 0.008), [1, 1, 2])
    assert model.regime.describe() == "the linear model"
    assert model.fit.job_share_high >= 0.5
    assert speed[0] == pytest.approx(speed[1]), speed
    assert speed[2] < 0.2 * speed[0], speed


@pytest.mark.parametrize("n", [2, 3])
def test_a_compute_bound_job_keeps_each_workers_own_speed(n):
    """Where the batch sizes varied and the time grows with them (no fixed cost to speak
    of), a worker 1.3x slower keeps its own speed beside a 3x slower one; and two workers
    never share one speed."""
    slow = [1.0, 1.3, 3.0][:n]
    speed, model = _speeds(n, [40, 30, 13][:n], lambda b: 0.0003 * b, slow, vary=6,
                           noise=0.03)
    if n > 2:
        assert model.fit.job_share_high < 0.5
    assert speed[0] / speed[1] == pytest.approx(1.3, rel=0.15), speed


def test_alike_workers_group_at_the_fits_own_share_when_its_worst_case_parts_nobody():
    """The fixed-cost regime with a worker found clearly slower, whose time at its one
    sample now is as long as the equal pair's (at 43 and 20): carried over 21x the batch at
    any fixed share the fit allows, up to all of it, it is apart from nobody, so nobody
    grouped and the linear model walked the pair (seen: 20:43 for 25 iterations). At the
    fit's own share (80 %) it is apart, and the pair gets one speed. (Fails without that
    fallback in SpeedModel._alike: 4722 and 2696 samples/s.)"""
    from mxlbbsp.control.speed import SpeedModel
    rng = np.random.default_rng(0)
    model = SpeedModel(3, "last", 1, "auto")
    batch = np.array([43.0, 20.0, 1.0])
    for _ in range(SPEED_WINDOW):
        model.fit.observe(batch, 0.008 * rng.lognormal(0, 0.05, 3))
    fit = model.fit
    fit.job_share, fit.job_share_low, fit.job_share_high = 0.8, 0.0, 1.0
    speed = model._alike(batch, np.full(3, 0.008), batch / 0.008)
    assert speed[0] == pytest.approx(speed[1]), speed
    assert speed[2] == pytest.approx(1 / 0.008), speed
