"""The defects the generated checks found (tests/test_props_*.py), each at the minimal
example hypothesis shrank it to: a job of tests/simjob.py (the real coordinator, simulated
workers), or the core function it came down to."""
import numpy as np

from mxlbbsp.core import split
from simjob import Job, Setup


def run(setup: Setup, epochs: int = 2):
    """The job's iterations (the coordinator's refusal fails the test)."""
    job = Job(setup)
    refused = job.register()
    assert refused is None, refused
    return job.run(until_epoch=epochs)


def test_the_first_split_and_the_warm_up_keep_the_workers_caps():
    """Setup(n=2, N=4, B=4, hello_caps=[1, None]) ran [2, 2] at iterations 0 and 1: the first
    split was the equal split whatever the caps, and the warm-up kept it (rescaled)."""
    steps = run(Setup(n=2, N=4, B=4, hello_caps=[1, None]))
    assert [st.split.tolist() for st in steps] == [[1, 3], [1, 3]]
    bal = split.Balancer(max_batch=np.array([1, 4]))
    assert bal.even(4, 2).tolist() == [1, 3]
    assert bal.scale([2, 2], 3).tolist() == [1, 2]


def test_bsp_refuses_caps_below_its_equal_split_at_registration():
    """Setup(n=2, N=4, B=4, sync='bsp', hello_caps=[1, None]) was accepted, and its workers
    split every batch [2, 2], above worker 0's cap of 1: bsp splits equally, whatever the
    caps, so registration must refuse what no iteration can keep."""
    refused = Job(Setup(n=2, N=4, B=4, sync="bsp", hello_caps=[1, None])).register()
    assert refused is not None and refused.startswith("--sync bsp splits every global batch "
                                                      "equally: worker 0 would get 2 samples")
    assert Job(Setup(n=2, N=4, B=4, sync="bsp", hello_caps=[2, None])).register() is None


def test_courier_and_goodput_cut_every_epoch_into_batches_the_workers_can_split():
    """Three examples of one defect, in the modes that choose B(t) (courier, goodput):

    - Setup(n=2, N=3, B=3, sync='courier', batch_range='2:2') (goodput alike): B(0) = 2 left
      one sample in the epoch, and the warm-up's split of it failed (an SplitError in
      the coordinator's thread): the first B(t) was not cut by the rest of the epoch;
    - Setup(n=2, N=5, B=3, sync='courier', batch_range='4:4', hello_caps=[2, 2]): the same
      after B(0) = 4, whose rest of 1 could not join it (the caps hold 4);
    - Setup(n=2, N=3, B=2, sync='courier', batch_range='15:15') was refused ("the last
      global batch of each epoch has 1 samples"): the DataLoader's B of 2 leaves a rest of 1,
      but courier never cuts batches of that B; it cuts B(0) = 3, the whole epoch.
    """
    for sync in ("courier", "goodput"):
        steps = run(Setup(n=2, N=3, B=3, sync=sync, batch_range="2:2"))
        assert [(st.total, st.split.tolist()) for st in steps] == [(3, [2, 1])] * 2
    steps = run(Setup(n=2, N=5, B=3, sync="courier", batch_range="4:4", hello_caps=[2, 2]))
    assert [(st.epoch, st.total) for st in steps] == [(0, 3), (0, 2), (1, 2), (1, 3)]
    assert all(st.split.max() <= 2 for st in steps)
    steps = run(Setup(n=2, N=3, B=2, sync="courier", batch_range="15:15"))
    assert [st.total for st in steps] == [3, 3]


def resume(first: Setup, at: int, then: Setup):
    """``first`` run through iteration ``at``, then resumed from its checkpoint as
    ``then``: the iterations of the resumed launch."""
    with Job(first) as job:
        assert job.register() is None
        job.run(until_epoch=2, last=at)
        manifest, state = job.checkpoint()
    with Job(then, manifest, state) as job:
        refused = job.register()
        assert refused is None, refused
        return job.run(until_epoch=2)


def test_a_resumed_job_keeps_the_saved_split_only_within_its_own_caps():
    """Setup(n=2, N=4, B=4) checkpointed after iteration 0 and resumed as Setup(n=2, N=4,
    B=4, hello_caps=[1, None]) ran [2, 2] at iteration 1, above worker 0's new cap: the
    coordinator's saved split was taken back whatever the new launch's bounds."""
    steps = resume(Setup(n=2, N=4, B=4), 0, Setup(n=2, N=4, B=4, hello_caps=[1, None]))
    assert [(st.t, st.split.tolist()) for st in steps] == [(1, [1, 3])]


def test_a_job_resumed_at_an_epochs_short_batch_is_welcomed_with_a_split_of_that_batch():
    """Setup(n=2, N=15, B=10, hello_caps=[2, None], min_batch=2) resumed after iteration 0
    started with [1, 4] of the short batch of 5, worker 0 under its least local batch of 2:
    the welcome carried the split of B, [2, 8], which each worker scaled down to the short
    batch by itself (split.rescale_slice: proportions, no bounds). The same in bsp, Setup(
    n=3, N=10, B=6, sync='bsp') resumed after iteration 0 started with [1, 2, 1], not
    bsp's equal split [2, 1, 1]."""
    s = Setup(n=2, N=15, B=10, hello_caps=[2, None], min_batch=2)
    assert [(st.t, st.total, st.split.tolist()) for st in resume(s, 0, s)][0] == (1, 5, [2, 3])
    s = Setup(n=3, N=10, B=6, sync="bsp")
    assert [(st.t, st.split.tolist()) for st in resume(s, 0, s)][0] == (1, [2, 1, 1])
