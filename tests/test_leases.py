"""One decision per control period on fast iterations: leases of a split.

With ``--control-period P`` the workers hold their reports, dones and logs for up to P
seconds and send them in one write, and on iterations shorter than P the coordinator plans
a split for a lease of k = P / (iteration time) iterations, so far ahead that a worker never
waits for it (mxlbbsp.control.coordinator.Coordinator._lease). Generated (the pure
coordinator, simulated reports): workers, global batches, data set sizes with a short last
batch or without, iteration times from far below to far above the period, and periods.
Invariants:

* every iteration is planned exactly once, in order: the leases sent tile the iterations;
* each lease holds one global batch: it never crosses an epoch's short last batch, and its
  split sums to the B the DataLoaders ask for at every one of its iterations;
* the coordinator is never behind: after the reports of t, iteration t+1+ahead is planned,
  and with leases of k > 1 also the 2k + 1 after it (the reports come a period late);
* on iterations longer than the period: a split per iteration, as without a period;
* far fewer decisions than iterations when the iterations are short.

And real sessions over loopback TCP (threads play the workers): the workers' writes are
held for the period, the slices still tile every global batch, the short last batch gets
its own split within the least batch, the split balances, and every record is written.
"""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxlbbsp.control.coordinator import LEASE_MOST, RATE_OVER, Coordinator
from mxlbbsp.control.coordinator import CoordinatorConfig
from mxlbbsp.control.registration import epoch_plan
from mxlbbsp.core.frames import Rows
from props import share

from test_coordinator import coordinator, env_for  # noqa: F401 - the fixture
from conftest import in_threads


def _hello(B, N, last_batch):
    return {"global_batch_size": B, "dataset_size": N,
            "order": {"shuffle": True, "seed": 0, "last_batch": last_batch}}


def simulate(n, B, N, last_batch, each_s, period, iterations, sync="lbbsp"):
    """The coordinator's leases for ``iterations`` iterations of ``each_s`` seconds each,
    the reports of every iteration complete in turn (as coalesced writes deliver them):
    the leases sent [(first, last, split)] and, per iteration t, the last planned after
    the reports of t."""
    c = Coordinator(CoordinatorConfig(num_workers=n, token="t", predictor="last",
                                      control_period=period, sync=sync))
    sent = []
    c.links.send_split = lambda t, split, until=None: sent.append(
        (t, t if until is None else until, np.array(split)))
    c._hellos = {r: _hello(B, N, last_batch) for r in range(n)}
    c._open()
    plan = epoch_plan(c._hellos[0])
    B_at = lambda t: plan.batch(plan.position(t)[1])[1]     # noqa: E731
    planned = []
    for t in range(iterations):
        split = c._splits[t]
        for r in range(n):
            decided = c.collect.reports(Rows.from_messages([r], [{
                "type": "report", "iteration": t, "batch_size": int(split[r]),
                "compute_s": 1e-3 + 1e-5 * int(split[r]),
                "next_global_batch": B_at(t + 1),
                "after_next_global_batch": B_at(t + 2)}], 0.0))
        c.decide(*decided)
        # the dones of t: the job's rate as the coordinator measures it
        c._recent.append((t * each_s, 0))
        del c._recent[:-50]
        c._iteration = t
        planned.append(c._planned)
    return sent, planned, B_at, c


@share(0.5)
@given(n=st.integers(1, 12), B=st.integers(16, 200), extra=st.integers(0, 700),
       last_batch=st.sampled_from(["keep", "discard"]),
       each_ms=st.sampled_from([0.3, 2.0, 7.0, 30.0, 400.0]),
       period=st.sampled_from([0.0, 0.02, 0.05, 0.2]))
def test_leases_plan_every_iteration_once_within_one_global_batch(n, B, extra, last_batch,
                                                                 each_ms, period):
    B = max(B, 2 * n)
    N = B * 2 + extra
    iterations = 160
    sent, planned, B_at, c = simulate(n, B, N, last_batch, each_ms / 1000, period,
                                         iterations)
    # the first split came with the welcome (iteration 0); the leases tile the rest
    assert sent[0][0] == 1
    for (a0, b0, _), (a1, _, _) in zip(sent, sent[1:]):
        assert a1 == b0 + 1, sent
    for first, last, split in sent:
        assert first <= last
        Bs = {B_at(t) for t in range(first, last + 1)}
        assert Bs == {int(split.sum())}, (first, last, split, Bs)
    ahead = c._policy.ahead
    for t, p in enumerate(planned):
        assert p >= t + 1 + ahead
    longest = max(last - first + 1 for first, last, _ in sent)
    assert longest <= LEASE_MOST
    if period == 0 or each_ms / 1000 > 1.5 * period:
        assert longest == 1                        # a split per iteration
    elif each_ms / 1000 * 4 < period and N // B > 8:
        assert len(sent) < iterations / 2          # far fewer decisions than iterations


@pytest.mark.parametrize("each_ms", [0.5, 3.0])
def test_with_leases_the_coordinator_plans_a_period_and_more_ahead(each_ms):
    """The reports of t come up to a period and an iteration late, and a worker's main
    thread runs two iterations ahead of its engine: after the reports of t, the split of
    iteration t+1+ahead+2k+1 is known (k: the lease's length)."""
    period = 0.05
    sent, planned, _, c = simulate(2, 64, 64 * 1000, "keep", each_ms / 1000, period, 300)
    k = min(LEASE_MOST, round(period / (each_ms / 1000)))
    for t in range(RATE_OVER + 40, 300):
        assert planned[t] >= t + 1 + c._policy.ahead + 2 * k + 1, (t, planned[t])
    assert max(last - first + 1 for first, last, _ in sent[-5:]) >= k


def test_bsp_decides_once_per_period_and_sends_nothing():
    """bsp's workers split the batch themselves: the coordinator only forecasts, once per
    lease (its predictor's observations), and sends no split."""
    sent, planned, _, c = simulate(3, 96, 96 * 100, "keep", 0.002, 0.05, 200, sync="bsp")
    assert sent == []
    assert planned[-1] >= 199 + 1 + 2 * 12 + 1


def test_a_loader_off_the_epoch_plan_turns_leases_off():
    """A loader whose B is not the epochs' plan (e.g. made anew within an epoch): the
    coordinator goes back to a decision per iteration, following B as rank 0 announces."""
    c = Coordinator(CoordinatorConfig(num_workers=2, token="t", predictor="last",
                                      control_period=0.05))
    c._hellos = {r: _hello(64, 640, "keep") for r in range(2)}
    c.links.send_split = lambda t, split, until=None: None
    c._open()
    c._recent = [(i * 0.001, 0) for i in range(20)]
    assert c._lease_length(5, 64, 7) > 1
    assert c._lease_length(6, 32, 8) == 1 and c._leases_off
    assert c._lease_length(7, 64, 9) == 1


def test_sessions_hold_their_writes_and_follow_the_leases(coordinator, tmp_path):  # noqa: F811
    """Real sessions: 2 workers at 1:3 per sample, an epoch of 4 batches of 64 and one of
    20 (--min-batch-size 8), 60 iterations in a few milliseconds each: leases of several
    iterations come (fewer splits than iterations), each global batch is tiled, the short
    batch's split keeps the least batch, the split favours the fast worker, and a record
    per worker per iteration is written."""
    from mxlbbsp.worker.session import Session
    metrics = tmp_path / "m.jsonl"
    c = coordinator(2, predictor="last", min_batch_size=8, control_period=0.02,
                    metrics=str(metrics))
    plan = [64, 64, 64, 64, 20]
    ss, errors = in_threads(lambda r: Session(64, 4 * 64 + 20, 20, None,
                                              env=env_for(c, r, 2)), 2)
    assert not errors
    assert all(s._period == 0.02 for s in ss)
    iterations = 60
    got = {}

    def work(rank):
        s, cost = ss[rank], (0.00005, 0.00015)[rank]
        for t in range(iterations):
            s.announce(plan[(t + 1) % 5], plan[(t + 2) % 5])
            tt, offset, local = s.next_iteration(plan[t % 5])
            assert tt == t
            got[t, rank] = (offset, local)
            s._t_end -= cost * local
            s.gradients_ready()
            s.step_done()

    _, errors = in_threads(work, 2, timeout=60)
    assert not errors
    for t in range(iterations):
        pieces = [got[t, 0], got[t, 1]]
        B = plan[t % 5]
        assert pieces[0] == (0, B - pieces[1][1]) and pieces[1][0] == pieces[0][1], (t, pieces)
        assert min(b for _, b in pieces) >= min(8, B // 2), (t, pieces)
    for s in ss:
        s.close()
    assert c.finished.wait(10) and c.failure is None
    c.stop()
    assert len(c.split_latency) < iterations - 10          # decisions: fewer than iterations
    late = [(got[t, 0], got[t, 1]) for t in range(30, iterations) if plan[t % 5] == 64]
    assert sum(a[1] > b[1] for a, b in late) >= 0.8 * len(late)     # balanced towards 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert sorted((r["iteration"], r["rank"]) for r in records) == \
        [(t, r) for t in range(iterations) for r in range(2)]


def test_with_relays_the_workers_send_at_once_and_every_iteration_is_decided():
    """Relays hold their host's sections per iteration and forecast per iteration: the
    welcome then holds no period (the workers send each report at once) and no lease."""
    c = Coordinator(CoordinatorConfig(num_workers=2, token="t", predictor="last",
                                      control_period=0.05))
    c._hellos = {r: _hello(64, 640, "keep") for r in range(2)}
    welcomes = []
    c.links.broadcast = welcomes.append
    c.links.send_split = lambda t, split, until=None: None
    assert c._period == 0.05
    c.links.relays.append(SimpleNamespace(ranks=[]))       # a relay with no worker yet
    c._open()
    assert "period_s" not in welcomes[0]
    c._recent = [(i * 0.001, 0) for i in range(20)]
    assert c._lease_length(5, 64, 7) == 1
