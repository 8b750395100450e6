"""The loader's epoch arithmetic (mxlbbsp.core.epochs) and the checkpoint's position in it.

Generated: data sets of 1 to 10^7 samples, any global batch, keep or discard the short last
batch, any iteration. Invariants:

* an epoch's global batches tile the samples it uses, in order, each of B but the last;
* iteration t is batch t mod L of epoch t // L, and a job resumed at t runs, from each
  epoch, exactly the batches not run before t;
* the next global batch the loader announces is the one it then cuts;
* when B(t) is chosen as the job runs, the cuts within next_cap tile the epoch;
* a checkpoint written after iteration t (its manifest through mxlbbsp.core.store) resumes
  at t + 1, at the epoch and index its manifest records; one written for other data or
  another global batch does not resume.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxlbbsp.core import epochs, store
from props import DATASETS, share, spread


@st.composite
def plans(draw):
    N = draw(DATASETS)
    B = draw(st.one_of(spread(1, 10 ** 7), st.integers(max(1, N - 4), N + 4),
                       st.integers(max(1, N // 1000), max(1, N // 2))))
    return epochs.EpochPlan(N, B, draw(st.sampled_from(epochs.LAST_BATCH)))


def batches(plan, at_most=2000):
    """Up to ``at_most`` of the epoch's batches: the first and the last ones."""
    L = plan.length
    ks = range(L) if L <= at_most else [*range(at_most // 2), *range(L - at_most // 2, L)]
    return [(k, *plan.batch(k)) for k in ks]


@share(3.0)
@given(plans())
def test_an_epochs_global_batches_tile_the_samples_it_uses(plan):
    N, B, L = plan.dataset_size, plan.global_batch, plan.length
    assert L >= 1 and plan.used <= N
    assert plan.used == N or (plan.last_batch == "discard" and plan.used == L * B)
    assert plan.used == (L - 1) * B + plan.batch(L - 1)[1]
    shown = batches(plan)
    for k, start, size in shown:
        assert start == k * B
        assert size == B or k == L - 1
        assert 1 <= size <= B
    assert shown[-1][1] + shown[-1][2] == plan.used
    assert plan.smallest == min(plan.batch(0)[1], plan.batch(L - 1)[1])
    for k, _, _ in shown:
        assert plan.next_size(k) == plan.batch((k + 1) % L)[1]
    with pytest.raises(IndexError):
        plan.batch(L)


@share(3.0)
@given(plans(), st.integers(0, 10 ** 9), st.integers(0, 10 ** 9))
def test_a_resumed_job_runs_each_batch_of_each_epoch_once(plan, t, start):
    L = plan.length
    epoch, k = plan.position(t)
    assert 0 <= k < L and epoch * L + k == t
    # the loader of a job that starts at `start`, at the epoch of iteration t: it runs t
    # iff t >= start, and its first batch there is start's when in the same epoch
    first = plan.first_index(start, epoch)
    assert (first is not None and first <= k) == (t >= start)
    if first is not None and first > 0:
        assert plan.position(start) == (epoch, first)


@share(2.0)
@given(DATASETS, st.data())
def test_global_batches_chosen_as_the_job_runs_tile_the_epoch(N, data):
    """DataLoader._iter_following: each B(t) within what next_cap allowed."""
    cursor, cap, cuts = 0, N, 0
    while cursor < N and cuts < 200:
        total = data.draw(st.one_of(st.just(cap), st.integers(1, cap)))
        cursor += total
        cuts += 1
        cap = epochs.next_cap(N, cursor)
        assert 1 <= cap <= N
        assert cap == (N - cursor if cursor < N else N)
    assert cursor <= N


@share(3.0)
@given(st.integers(1, 10 ** 7), st.integers(0, 10 ** 6), st.data())
def test_epoch_orders_are_permutations_seeded_by_seed_and_epoch_alone(N, epoch, data):
    N = min(N, 20_000)
    seed = data.draw(st.integers(0, 2 ** 31))
    shuffled = epochs.order(N, epoch, True, seed)
    assert np.array_equal(np.sort(shuffled), np.arange(N))
    assert np.array_equal(shuffled, epochs.order(N, epoch, True, seed))
    assert np.array_equal(epochs.order(N, epoch, False, seed), np.arange(N))


@share(0.5)
@given(plans(), st.integers(0, 10 ** 6), st.data())
def test_a_checkpoint_resumes_at_the_position_its_manifest_records(tmp_path_factory, plan, t,
                                                                   data):
    L = plan.length
    manifest = {"global_batch_size": plan.global_batch, "dataset_size": plan.dataset_size,
                **epochs.checkpoint_position(t, L), "params": []}
    folder = store.write_checkpoint(str(tmp_path_factory.mktemp("ckpt")), t, {}, manifest)
    read = store.read_manifest(folder)
    assert read["iteration"] == t
    start = epochs.resume_start(read, plan.global_batch, plan.dataset_size, L)
    assert start == t + 1
    assert plan.position(start) == (read["epoch"], read["index_in_epoch"])
    # another global batch, data set or epoch length: not this job's position
    other = data.draw(st.sampled_from(["global_batch_size", "dataset_size", "epoch_length"]))
    changed = dict(read, **{other: read[other] + data.draw(st.integers(1, 10))})
    assert epochs.resume_start(changed, plan.global_batch, plan.dataset_size, L) is None


@st.composite
def epochs_to_cut(draw):
    """(n, most, least, rest) with a cuttable rest, as registration lets a job through."""
    n = draw(spread(1, 1024))
    most = draw(st.one_of(st.none(), st.integers(n, 2 * n + 2), spread(n, 10 ** 6)))
    least = draw(st.one_of(st.just(n), st.integers(n, 8 * n)))
    rest = draw(st.one_of(spread(0, 10 ** 6), st.integers(0, 4 * n)))
    return n, most, least, rest


@share(3.0)
@given(epochs_to_cut(), st.lists(spread(1, 10 ** 6), min_size=1, max_size=50))
def test_cutting_the_batches_chosen_as_the_job_runs_never_strands_a_rest(case, wanted):
    """epochs.cut (courier and goodput's B(t)): every global batch of n to `most` samples
    within the rest, what it leaves cuttable, the whole epoch cut."""
    n, most, least, rest = case
    if not epochs.cuttable(rest, n, most):
        return
    for w in wanted:
        if rest == 0:
            break
        B = epochs.cut(w, rest, n, most, least)
        assert n <= B <= rest and (most is None or B <= most)
        rest -= B
        assert epochs.cuttable(rest, n, most)
