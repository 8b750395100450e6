"""The loader's epoch arithmetic: which samples global batch t holds, and where a job resumes.

Pure numpy; no MXNet. :class:`mxlbbsp.worker.dataloader.DataLoader` and the checkpoints
(:mod:`mxlbbsp.worker.checkpoint`) compute with these functions, and the property tests
(tests/test_props_epochs.py) check them without a process.

The slicing rule: epoch e orders the data set by a permutation that depends only on (seed, e)
(:func:`order`). With a fixed global batch B (:class:`EpochPlan`) the permutation is cut into
consecutive global batches of B samples, the last one shorter (kept, or left out with
``last_batch='discard'``); iteration t is batch t mod L of epoch t // L, L batches an epoch.
When the coordinator chooses each B(t) as the job runs (courier, goodput), global batch t is
cut right after batch t-1 (:func:`next_cap` bounds it by the rest of the epoch). A worker
takes its slice of the global batch (:func:`mxlbbsp.core.split.rescale_slice`): so every
sample is used once per epoch, on any number of workers.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

LAST_BATCH = ("keep", "discard")


def order(dataset_size: int, epoch: int, shuffle: bool, seed: int) -> np.ndarray:
    """The sample indices of ``epoch`` in the order the epoch reads them: a permutation
    seeded by (``seed``, ``epoch``) alone, the same on every worker and in every job."""
    if not shuffle:
        return np.arange(dataset_size)
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """The global batches of an epoch of ``dataset_size`` samples at a fixed
    ``global_batch``: ``full`` batches of it, then the ``rest`` (when there is one, and
    ``last_batch`` keeps it, or it is all the epoch holds)."""

    dataset_size: int
    global_batch: int
    last_batch: str = "keep"

    def __post_init__(self):
        if self.dataset_size < 1 or self.global_batch < 1:
            raise ValueError(f"an epoch plan needs a data set and a global batch of at least "
                             f"one sample, got {self.dataset_size} and {self.global_batch}")
        if self.last_batch not in LAST_BATCH:
            raise ValueError(f"last_batch must be one of {LAST_BATCH}, got {self.last_batch!r}")

    @property
    def full(self) -> int:
        """Global batches of ``global_batch`` samples in an epoch."""
        return self.dataset_size // self.global_batch

    @property
    def rest(self) -> int:
        """Samples in the epoch's last, short global batch (0 when there is none, or when
        ``last_batch='discard'`` leaves them out)."""
        rest = self.dataset_size % self.global_batch
        return rest if self.last_batch == "keep" or self.full == 0 else 0

    @property
    def length(self) -> int:
        """Global batches (iterations) in an epoch."""
        return self.full + (1 if self.rest else 0)

    @property
    def used(self) -> int:
        """Samples an epoch trains on (all but the left-out rest)."""
        return self.full * self.global_batch + self.rest

    @property
    def smallest(self) -> int:
        """The fewest samples of any global batch of the epoch."""
        return self.rest or self.global_batch

    def batch(self, k: int) -> Tuple[int, int]:
        """(start in the epoch's order, size) of global batch ``k`` of an epoch."""
        if not 0 <= k < self.length:
            raise IndexError(f"an epoch has {self.length} global batches, not {k + 1}")
        if k < self.full:
            return k * self.global_batch, self.global_batch
        return self.full * self.global_batch, self.rest

    def batches(self) -> List[Tuple[int, int]]:
        """(start, size) of every global batch of an epoch, in order."""
        return [self.batch(k) for k in range(self.length)]

    def next_size(self, k: int, ahead: int = 1) -> int:
        """The size of the global batch ``ahead`` batches after batch ``k``; past the
        epoch's last one, the next epoch's (cut the same way)."""
        return self.batch((k + ahead) % self.length)[1]

    def position(self, iteration: int) -> Tuple[int, int]:
        """(epoch, batch index in it) of ``iteration``."""
        return divmod(int(iteration), self.length)

    def first_index(self, start: int, epoch: int) -> Optional[int]:
        """The first batch of ``epoch`` a job that starts at iteration ``start`` runs (0
        after the epoch it resumes in), or None for an epoch done before ``start``."""
        first_epoch, skip = self.position(start)
        if epoch < first_epoch:
            return None
        return skip if epoch == first_epoch else 0


def next_cap(dataset_size: int, cursor: int) -> int:
    """The most samples the next global batch may hold once ``cursor`` samples of the epoch
    were cut, when each global batch is chosen as the job runs: the rest of the epoch, or a
    whole new epoch once it is used up."""
    rest = int(dataset_size) - int(cursor)
    return rest if rest > 0 else int(dataset_size)


def cuttable(samples: int, n: int, most: Optional[int] = None) -> bool:
    """Whether ``samples`` (the rest of an epoch) can be cut into global batches that ``n``
    workers can split: each of n samples at least (one a worker) and at most ``most`` (what
    the workers' caps hold together; None: no caps)."""
    if samples == 0:
        return True
    batches = 1 if most is None else -(-int(samples) // int(most))
    return samples >= batches * n


def cut(wanted: int, rest: int, n: int, most: Optional[int] = None,
        least: Optional[int] = None) -> int:
    """The global batch to cut from the ``rest`` of an epoch when ``wanted`` is asked for,
    in the modes that choose B(t) as the job runs (courier, goodput).

    Kept always: n <= B <= min(``most``, ``rest``), and a rest that can itself be cut
    (:func:`cuttable`). Kept when these allow: B of at least ``least`` (n x the least local
    batch), and a rest of 0 or at least ``least``. The answer is ``wanted`` moved into
    [``least``, ``most``] and within the rest, a rest under ``least`` joining it; else the
    closest B that keeps both, else the closest that keeps the first. ValueError when none
    does (registration refuses a job whose epoch is not :func:`cuttable`)."""
    least = max(int(n), int(least or n))
    top = int(rest) if most is None else min(int(most), int(rest))

    def kept(B: int, soft: bool) -> bool:
        left = rest - B
        if not (n <= B <= top and cuttable(left, n, most)):
            return False
        return not soft or ((B >= least or B == rest) and (left == 0 or left >= least))

    B = min(max(int(wanted), least), top)
    if 0 < rest - B < least and rest <= top:
        B = rest                    # a rest too small for the least local batch joins
    if kept(B, soft=True):
        return B
    reach = 2 * (least + n) + 2     # a gap between cuttable rests is under n wide
    for soft in (True, False):
        for d in range(1, reach + 1):
            for candidate in (B - d, B + d):
                if kept(candidate, soft):
                    return candidate
    for candidate in range(top, n - 1, -1):
        if kept(candidate, soft=False):
            return candidate
    raise ValueError(f"{rest} samples left in the epoch cannot be cut into global batches of "
                     f"{n} to {most} samples")


def checkpoint_position(iteration: int, epoch_length: Optional[int]) -> dict:
    """Where the loader stands after ``iteration``, as a checkpoint's manifest records it:
    the epoch and the index in it of the next iteration (None each without a fixed epoch
    length)."""
    if not epoch_length:
        return {"epoch_length": epoch_length, "epoch": None, "index_in_epoch": None}
    epoch, index = divmod(int(iteration) + 1, int(epoch_length))
    return {"epoch_length": int(epoch_length), "epoch": epoch, "index_in_epoch": index}


def resume_start(manifest: dict, global_batch: int, dataset_size: int,
                 epoch_length: int) -> Optional[int]:
    """The first iteration a loader resumed from a checkpoint with ``manifest`` runs, or
    None when the checkpoint was written for other data or another global batch (the data
    order would not continue where it stopped)."""
    if manifest["global_batch_size"] != global_batch or \
            manifest.get("dataset_size") not in (None, dataset_size) or \
            manifest.get("epoch_length") not in (None, epoch_length):
        return None
    return int(manifest["iteration"]) + 1
