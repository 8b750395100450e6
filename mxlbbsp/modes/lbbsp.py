"""``lbbsp``: load-balanced BSP, the default mode.

Once all n reports of iteration t are in, the balancer splits B(t+2) so that every worker is
predicted to finish together (kept unchanged when the predicted gain is under
``--threshold``), and each worker gets its own slice of t+2: the split of t+1 went out an
iteration before, so a worker has it before it needs it unless the coordinator is a whole
iteration late. (Splitting t+1 from the reports of t, the worker waited for the answer after
its push/pull: on a model of a few milliseconds that was the coordinator's latency, whose
Python shares the workers' cores.) The forecast of t+1 stands for t+2. The first two splits
come before any report: the equal split, in ``welcome`` and right after it. The workers wait
for their slice from their second iteration on (normally it has long been there).
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np

from mxlbbsp.core import epochs as _epochs
from mxlbbsp.core import lr as _lr
from mxlbbsp.core import planner as _planner

from ._api import CoordinatorPolicy, Option, SyncMode, register


class LBBSPPolicy(CoordinatorPolicy):
    """The reports of t split iteration t+2 (``ahead``; see the module docstring), of
    B(t+2) as rank 0's loader announced it (``after_next_global_batch``; else B(t+1), and a
    worker whose B(t+2) differs rescales its slice)."""
    sends = True
    ahead = 1
    #: a split sent for the iterations :attr:`Control.planning` names (a lease)
    windowed = True

    def opening(self, iteration: int, in_force: np.ndarray) -> np.ndarray:
        # within the bounds for the B the loaders will ask for (an epoch's short last batch
        # among them), not rescaled by each worker without them
        coordinator = self.coordinator
        in_force = coordinator.balancer.scale(in_force, coordinator.opening_batch(iteration))
        coordinator.send_split(iteration, in_force)
        return in_force

    def first_split(self, global_batch: int) -> np.ndarray:
        """The equal split within the workers' caps: no speed is known yet."""
        return self.coordinator.balancer.even(global_batch, self.num_workers)

    def warmup(self, t: int, next_B: Optional[int], in_force: np.ndarray) -> np.ndarray:
        # within the workers' caps and least local batches (``in_force`` comes rescaled to
        # B(t+2) without them; an epoch's short last batch keeps every worker's least)
        split = self.coordinator.balancer.scale(in_force, next_B)
        self._send_planned(split)
        return split

    def plan(self, t, model, next_B, in_force):
        split = self.coordinator.balancer.split(model, next_B, in_force)
        self._send_planned(split)
        return split

    def _send_planned(self, split) -> None:
        """The split out, for the iterations being planned (t+2, or a lease)."""
        first, last = self.coordinator.planning
        if last == first:
            self.coordinator.send_split(first, split)
        else:
            self.coordinator.send_split(first, split, until=last)


@register
class LBBSP(SyncMode):
    checkpoints = True
    name = "lbbsp"
    label = "LB-BSP"
    help = "split B by predicted speed so that all finish together (dist_sync)"
    uses_predictor = True
    policy = LBBSPPolicy


#: the options of every mode that chooses the global batch B(t) (courier, goodput): one
#: declaration, which each of them lists
BATCH_RANGE_OPTION = Option("batch_range", "--batch-range", metavar="MIN:MAX",
                            help="the global batch sizes to choose from (default 64:1024).")
LR_SCALING_OPTION = Option("lr_scaling", "--lr-scaling", type=_lr.RULES,
                           help="the learning rate follows B(t)/B0 (B0: the DataLoader's "
                                "global_batch_size): linear (courier's default, Goyal et "
                                "al.), sqrt, none, or adascale (goodput only, its default: "
                                "AdaScale's gain from the measured noise scale).")


def batch_range_problem(text: str, num_workers: int) -> Optional[str]:
    """For a mode's ``check_workers``: the smallest global batch of ``--batch-range`` must
    give every worker a sample (the problem in one line, or None)."""
    try:
        _planner.parse_batch_range(text, num_workers)
    except _planner.PlanError as exc:
        return str(exc)
    return None


class BatchChoosingPolicy(LBBSPPolicy):
    """The part that every mode choosing the global batch B(t) within ``--batch-range``
    shares (``courier``, ``goodput``): the range against the workers and the data, the first
    split, B kept within the rest of the epoch, the batches decided so far, the warm-up, and
    the measured push/pull time. A subclass sets ``lo`` and ``hi`` and decides B in ``plan``;
    ``_before_split`` is its say just before a split goes out (goodput: the learning rate).

    As in lbbsp the reports of t split t+2 (``ahead``): B(t+2) is chosen then, within the
    rest of the epoch after B(t+1), which was chosen an iteration before (rank 0 reports
    the rest after t, ``next_global_batch``: the rest after t+1 is that less B(t+1), or a
    new epoch). B(1) is B(0) again, within the epoch, sent before any report.

    The push/pull time of an iteration is the least any worker measured (``sync_s``): in
    dist_sync every worker's push waits for the last worker's, so the others' times add the
    wait for it (an imbalance, or a worker pausing, e.g. rank 0 evaluating untimed between
    two iterations); the last worker to push waits for nobody.
    """

    #: weight of the newest push/pull time in its running mean
    SYNC_ALPHA = 0.2
    #: B(t) is chosen every iteration, from the reports of each
    windowed = False

    def __init__(self, coordinator, options=None):
        super().__init__(coordinator, options)
        self.lo = self.hi = 0
        self.dataset_size = 0
        self.trained = 0                 # samples of the iterations before the one decided
        self.totals: Dict[int, int] = {}  # iteration -> B(t) as sent
        self.sync_s: Optional[float] = None
        #: iteration -> [dones counted, the least push/pull time among them]
        self._syncs: Dict[int, list] = {}

    def validate(self, hellos):
        n = self.num_workers
        if self.lo < n:
            return (f"--batch-range {self.lo}:{self.hi}: the minimum is below the number of "
                    f"workers ({n}); use a minimum >= {n}")
        self.dataset_size = int(hellos[0]["dataset_size"])
        if self.dataset_size < n:
            return f"the data set has {self.dataset_size} samples, fewer than the {n} workers"
        most = self.most
        if most is not None:
            if most < self.lo:
                return (f"--batch-range {self.lo}:{self.hi}: the workers' maximum batch sizes "
                        f"add up to {most}, less than the range's minimum; lower the minimum "
                        "to at most that, or raise --max-batch-size")
            if not _epochs.cuttable(self.dataset_size, n, most):
                return (f"the data set's {self.dataset_size} samples cannot be cut into global "
                        f"batches of {n} to {most} samples (a sample for each of the {n} "
                        f"workers, at most their maximum batch sizes together); raise "
                        "--max-batch-size, or use fewer workers")
        return None

    def first_split(self, global_batch):
        B = int(min(max(global_batch, self.lo), self.hi))
        B = self._cap(B, self.dataset_size or None)
        self.totals[0] = B
        return self.coordinator.balancer.even(B, self.num_workers)

    def _rest(self, rest: Optional[int], B: int) -> Optional[int]:
        """The rest of the epoch after a batch of B taken from ``rest`` (a new epoch when
        nothing is left): the most the batch after it may be."""
        if rest is None:
            return None
        left = rest - B
        return left if left > 0 else self.dataset_size

    def opening(self, iteration, in_force):
        # B(0) again, within the rest of the epoch (a job of these modes starts at one:
        # they are not checkpointed)
        rest = self.dataset_size
        for k in range(iteration - 1):
            rest = self._rest(rest, self.totals[k])
        before = self.totals[iteration - 1]
        B = self._cap(before, self._rest(rest, before))
        split = self.coordinator.balancer.scale(in_force, B)
        self._send(iteration, split)
        return split

    def global_batch(self, t, next_B, after_B):
        """The most B(t+1+ahead) may be: rank 0's ``next_global_batch`` is the rest of the
        epoch after t, less B(t+1) when splitting ahead."""
        for k in range(t + 1, t + 1 + self.ahead):
            next_B = self._rest(next_B, self.totals.get(k, 0))
        return next_B

    @property
    def least(self) -> int:
        """The smallest global batch that can be split: every worker its least local batch
        (``--min-batch-size``; 8 by default once a worker reports BatchNorm layers)."""
        return self.num_workers * max(int(self.coordinator.balancer.min_batch), 1)

    @property
    def most(self) -> Optional[int]:
        """The largest global batch the workers can hold together (None: a worker has no
        cap)."""
        caps = self.coordinator.balancer.max_batch
        return None if caps is None else int(np.sum(caps))

    def _cap(self, B: int, cap: Optional[int]) -> int:
        """B, at least :attr:`least` and at most :attr:`most`, cut from the rest of the
        epoch (``cap``) so that what it leaves can be split too (:func:`mxlbbsp.core.epochs.
        cut`: a rest smaller than :attr:`least` joins this batch)."""
        if cap is None:
            B = max(B, self.least)
            return B if self.most is None else min(B, self.most)
        return _epochs.cut(B, cap, self.num_workers, self.most, self.least)

    def _send(self, iteration: int, split) -> None:
        """The split of ``iteration`` out (the subclass's say first), its B noted."""
        self._before_split(iteration, split)
        self.coordinator.send_split(iteration, split)
        self.totals[iteration] = int(np.sum(split))

    def _decided(self, t: int) -> None:
        """The reports of t were split from: iteration t counts as trained."""
        self.trained += self.totals.get(t, 0)
        for old in [k for k in self.totals if k < t - 1]:
            del self.totals[old]

    def _split_and_send(self, t: int, model, B: int, next_B: Optional[int]) -> np.ndarray:
        """B (within the rest of the epoch, ``next_B``) split as LB-BSP splits, from the
        split in force, sent as the split of t+1+ahead, and noted as decided."""
        B = self._cap(B, next_B)
        in_force = self.coordinator.current_split
        if in_force is not None:
            in_force = self.coordinator.balancer.scale(in_force, B, bounds=False)
        split = self.coordinator.balancer.split(model, B, in_force)
        self._send(t + 1 + self.ahead, split)
        self._decided(t)
        return split

    def _before_split(self, iteration: int, split) -> None:
        """Just before the split of ``iteration`` is sent (a subclass's messages go first,
        so a worker has them once it has its slice)."""

    def warmup(self, t, next_B, in_force):
        # the B before it again (``in_force`` comes scaled to next_B, here only a cap)
        target = t + 1 + self.ahead
        in_force = self.coordinator.current_split
        B = self._cap(self.totals.get(target - 1, int(in_force.sum())), next_B)
        split = self.coordinator.balancer.scale(in_force, B)
        self._send(target, split)
        self._decided(t)
        return split

    def on_done(self, rank, msg):
        t = int(msg["iteration"])
        if t < self.coordinator.config.warmup:
            return
        s = msg.get("sync_s")
        seen = self._syncs.setdefault(t, [0, math.inf])
        seen[0] += 1
        if isinstance(s, (int, float)) and math.isfinite(s) and s >= 0:
            seen[1] = min(seen[1], float(s))
        if seen[0] < self.num_workers:
            return
        del self._syncs[t]
        for old in [k for k in self._syncs if k < t - 64]:
            del self._syncs[old]
        s = seen[1]
        if math.isfinite(s):
            self.sync_s = s if self.sync_s is None else \
                self.sync_s + self.SYNC_ALPHA * (s - self.sync_s)
