"""How goodput's B(t) moves as the job runs, driven through the real coordinator: worker
sessions over loopback TCP in one thread, with emulated compute times and gradient norms
(no MXNet). The noise scale grows within an epoch, and a fast worker drops out of the
throughput model."""
import math

import numpy as np
import pytest

from mxlbbsp.worker.session import Session

from conftest import in_threads
from test_coordinator import coordinator, env_for, finished_records  # noqa: F401

N_WORKERS, B0, EPOCH = 2, 64, 16000
#: emulated compute: a fixed cost per iteration and a speed per worker (samples/s): 1:3.
#: Seconds rather than milliseconds, so the threads' own time (ms, more on a loaded
#: machine) is lost in them
FIXED_S, SPEEDS = 2.0, (60.0, 20.0)
DIM = 400


def _sessions(c, epoch):
    out, errors = in_threads(lambda r: Session(
        B0, epoch, B0, None, env=dict(env_for(c, r, N_WORKERS, "goodput"),
                                       MXLBBSP_LR_SCALING="adascale")), N_WORKERS)
    assert not errors
    return out


def _run(c, iterations, noise_of, speeds_of, seed=0, epoch=EPOCH):
    """``iterations`` of the 2 workers: compute FIXED_S + b / speed (``speeds_of(t)``),
    gradient sums of b samples whose noise scale is ``noise_of(samples so far)``, epochs of
    ``epoch`` samples; returns the metrics records of rank 0 by iteration."""
    rng = np.random.default_rng(seed)
    ss = _sessions(c, epoch)
    sd = rng.uniform(0.5, 1.5, DIM)
    direction = rng.standard_normal(DIM)
    direction /= np.linalg.norm(direction)
    done = 0
    for t in range(iterations):
        sizes = [s.next_iteration(None)[2] for s in ss]
        rest = epoch - (done + sum(sizes)) % epoch     # the cap on the next B
        for s in ss:
            s.announce(rest)
        # |G|^2 = tr(Sigma) / phi: a gradient that shrinks as the noise scale grows
        G = direction * math.sqrt(float(sd @ sd) / noise_of(done))
        sums = [b * G + math.sqrt(b) * sd * rng.standard_normal(DIM) for b in sizes]
        speeds = speeds_of(t)
        for s, part, b, v in zip(ss, sums, sizes, speeds):
            s._t_end -= FIXED_S + b / v          # the emulated compute of b samples
            s.gradients_ready(float(part @ part))
        total = np.sum(sums, axis=0)
        ss[0].step_done(float(total @ total))
        for s in ss[1:]:
            s.step_done()
        done += sum(sizes)
    for s in ss:
        s.close()
    return {r["iteration"]: r for r in finished_records(c) if r["rank"] == 0}


def test_a_noise_scale_that_grows_tenfold_in_an_epoch_raises_b_more_than_twice(coordinator):
    """phi grows from 40 to 400 over the first 16 000 samples of a 64 000-sample epoch: B
    follows it up, step after step, within the epoch (a cap of changes per epoch froze it
    after two moves). The smoothed estimate lags the true phi by a few thousand samples,
    hence the long epoch. Counted after the start-up (iteration 20), where B probes one
    candidate below and above B0 while the workers' fixed costs are not known yet."""
    epoch = 64000
    c = coordinator(N_WORKERS, sync="goodput", predictor="last",
                    sync_options={"batch_range": "16:1024"})
    recs = _run(c, 900, lambda samples: 40.0 * 10 ** min(samples / 16000, 1.0),
                lambda t: SPEEDS, epoch=epoch)
    seen, batches = 0, []
    for t in sorted(recs):
        batches.append(recs[t]["global_batch"])
        seen += recs[t]["global_batch"]
        if seen >= epoch:
            break
    assert seen == epoch                     # the whole first epoch
    inner = batches[20:-1]                   # after the start-up; not the epoch's rest
    rises = [(a, b) for a, b in zip(inner, inner[1:]) if b > a]
    assert len(rises) > 2, batches
    phis = [recs[t]["noise_scale"] for t in sorted(recs)[:len(batches)]
            if recs[t]["noise_scale"] is not None]
    assert phis[-1] > 3 * phis[0]            # the estimate followed the noise scale
    assert inner[-1] > 2 * inner[0]


def test_b_comes_down_when_a_fast_worker_leaves_the_throughput_model(coordinator):
    """A steady noise scale; after iteration 150 the fast worker slows down 30x (as good as
    gone from the throughput: its share of the split falls to a few samples): the same
    efficiency now costs more time per sample, and B comes down."""
    c = coordinator(N_WORKERS, sync="goodput", predictor="last",
                    sync_options={"batch_range": "16:1024"})
    slow = (SPEEDS[0] / 30, SPEEDS[1])
    recs = _run(c, 260, lambda samples: 300.0, lambda t: SPEEDS if t < 150 else slow)
    before = [recs[t]["global_batch"] for t in range(130, 150)]
    soon = [recs[t]["global_batch"] for t in range(150, 170)]
    after = [recs[t]["global_batch"] for t in range(230, 259)]
    assert len(set(before)) == 1, before     # settled
    # down within a few iterations (the predictor's and the planner's), far down
    assert min(soon[:10]) < before[0] and min(soon) < before[0] / 1.5, (before, soon)
    assert max(after) < before[0], (before, after)   # and it stays down


@pytest.mark.parametrize("phi, near", [(40.0, (54, 128)), (300.0, (152, 362))])
def test_b_does_not_fall_to_the_range_minimum_before_the_fixed_costs_are_known(
        coordinator, phi, near):
    """A steady noise scale on workers with a large fixed cost per iteration (2 s against
    0.8 s of samples at B0): goodput B / (2 + B/80) x (phi + 64) / (phi + B) peaks at
    B = sqrt(2 x 80 x phi), about 80 at phi = 40 and 220 at 300. The linear model of the
    first iterations, which has not seen the fixed costs, puts it at the range's minimum
    (16), where this mode used to go at its first plan. Now B probes around B0 (one
    candidate below and above, in turn) until the fit knows the costs, moves only where
    every fixed cost still possible agrees, and then goes near the optimum."""
    c = coordinator(N_WORKERS, sync="goodput", predictor="last",
                    sync_options={"batch_range": "16:1024"})
    recs = _run(c, 80, lambda samples: phi, lambda t: SPEEDS)
    batches = [recs[t]["global_batch"] for t in sorted(recs)]
    assert min(batches) >= 45, batches                 # never near the minimum
    assert len(set(batches[2:16])) > 1, batches         # it probed
    assert all(near[0] <= b <= near[1] for b in batches[50:79]), batches


def test_b_does_not_follow_a_throughput_that_flips_from_one_plan_to_the_next(coordinator):
    """A steady noise scale; the workers' speeds flip between 10x their own and the fast
    one's a 30th every 4 iterations (the planner's period), as one plan's throughput model
    can on a loaded machine: each plan's model alone would move B up and down again (the
    two alone give B near 700 and near 110); a move must also hold under the last plan's
    model, and here none does after the start-up."""
    c = coordinator(N_WORKERS, sync="goodput", predictor="last",
                    sync_options={"batch_range": "16:1024"})
    fast, slow = (SPEEDS[0] * 10, SPEEDS[1] * 10), (SPEEDS[0] / 30, SPEEDS[1])
    recs = _run(c, 160, lambda samples: 300.0,
                lambda t: fast if (t // 4) % 2 == 0 else slow)
    batches = [recs[t]["global_batch"] for t in sorted(recs)]
    later = batches[60:159]
    moves = sum(1 for a, b in zip(later, later[1:]) if a != b)
    assert moves <= 2, batches
