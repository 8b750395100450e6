"""``courier``: the coordinator chooses the global batch B(t) so that the job meets a deadline.

Courier (ICPE 2021) picks the smallest batch whose predicted job time meets a latency SLO,
once, before the job starts. Here the choice is re-made as the job runs (every few
iterations, and at once when the current B is predicted to miss): for each candidate B in
``--batch-range`` the time of the remaining work is::

    ceil(samples left / B) * (LB-BSP makespan of B over the workers' predicted time models
                              + the measured push/pull time)

and the coordinator takes the smallest B that meets the time left (:mod:`mxlbbsp.core.planner`,
with hysteresis), or the fastest when none does, and says so. Each B(t) is then split among
the workers as LB-BSP does. The remaining work is ``--epochs`` epochs of the data set from
the start of the job, less what has been trained.

Worker side: the DataLoader cuts global batch t, of the size B(t) that ``total`` of the
``slice`` message carries, right after batch t-1 in the epoch's permutation (every sample
once per epoch); the learning rate follows B(t) / B0 by ``--lr-scaling`` (B0: the
DataLoader's ``global_batch_size``), and gradients are normalised by B(t) as in every
synchronous mode. B(t+2) is chosen from the reports of t (lbbsp's lookahead: the workers
never wait for it); before the first B is chosen (iterations 0 to 2: the two splits before
any report and the warm-up's), B0 clipped into the range is used.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Optional

import numpy as np

from mxlbbsp.core import env as _env
from mxlbbsp.core import lr as _lr
from mxlbbsp.core import planner as _planner

from ._api import Option, SyncMode, available, get, register
from .lbbsp import (
    BATCH_RANGE_OPTION,
    LR_SCALING_OPTION,
    BatchChoosingPolicy,
    batch_range_problem,
)

log = logging.getLogger(__name__)

DEFAULTS = {"deadline": None, "batch_range": "64:1024", "lr_scaling": "linear", "epochs": None,
            "every": 5}


class CourierPolicy(BatchChoosingPolicy):
    """Chooses B(t+2) for the deadline from the reports of t, then splits it as LB-BSP
    does."""

    def __init__(self, coordinator, options=None):
        super().__init__(coordinator, options)
        opts = self.resolved(DEFAULTS, Courier.check_options)
        self.deadline_s = _planner.parse_duration(opts["deadline"])
        self.lo, self.hi = _planner.parse_batch_range(opts["batch_range"])
        self.epochs = float(opts["epochs"])
        self.planner = _planner.BatchPlanner(self.lo, self.hi, every=int(opts["every"]))
        #: the deadline counts from the launch: the launcher hands its start time over
        #: the clock the deadline is measured on (a test may hand in a simulated one)
        self.clock = time.monotonic
        started = getattr(coordinator.config, "started", None)
        self.started = self.clock() if started is None else float(started)
        #: (t, when the reports of t were planned from): the time to the next plan is
        #: about iteration t+1's, which the planner's margin compares with its prediction
        self._planned: Optional[tuple] = None
        #: iteration -> its predicted time, from when its B was chosen
        self._predicted: dict = {}
        #: iteration -> (seconds from the start when it was planned, predicted finish)
        self.plans: dict = {}
        #: iteration -> seconds from the start when its last push/pull ended (so far)
        self.done_at: dict = {}
        self._warned = False

    # ---- iterations -------------------------------------------------------------------

    def warmup(self, t, next_B, in_force):
        self._planned = None
        return super().warmup(t, next_B, in_force)

    def plan(self, t, model, next_B, in_force):
        # ``next_B`` is only a cap here (the rest of the epoch after t+ahead)
        target = t + 1 + self.ahead
        now = self.clock()
        predicted = self._predicted.pop(t, None)
        if self._planned is not None and self._planned[0] == t - 1 and predicted is not None:
            self.planner.observe(now - self._planned[1], predicted)
        self._planned = (t, now)
        elapsed = now - self.started
        # the batches up to the one planned were chosen already: their samples are done,
        # and their time is spent
        time_left = self.deadline_s - elapsed - sum(
            self._predicted.get(k, 0.0) for k in range(t + 1, target))
        done = self.trained + sum(self.totals.get(k, 0) for k in range(t, target))
        remaining = max(self.epochs * self.dataset_size - done, 0)
        N = self.dataset_size
        in_epoch = next_B if next_B is not None and next_B < N else 0
        work = _planner.Work(min(in_epoch, remaining), N, max(remaining - in_epoch, 0) / N)
        if self.sync_s is None:
            # no push/pull measured yet: nothing to plan with; keep the batch
            B = self.totals.get(target - 1, self.lo)
        else:
            B = self.planner.update(model, self.sync_s, work, time_left,
                                    self.coordinator.balancer.max_batch,
                                    iteration=target)
            if self.planner.missing and not self._warned:
                log.warning("no global batch in %d:%d meets the deadline: %s of work left at "
                            "the fastest (B=%d), %s to the deadline; running at B=%d",
                            self.lo, self.hi,
                            _planner.format_duration(self.planner.predicted_finish()), B,
                            _planner.format_duration(time_left), B)
            self._warned = self.planner.missing
        split = self._split_and_send(t, model, B, next_B)
        if self.sync_s is not None:
            self._predicted[target] = _planner.iteration_time(
                model, self.sync_s, int(np.sum(split)), self.coordinator.balancer.max_batch)
        for old in [k for k in self._predicted if k < t]:
            del self._predicted[old]
        finish = self.planner.predicted_finish()
        self.plans[target] = (elapsed, elapsed + finish if math.isfinite(finish) else None)
        for old in [k for k in self.plans if k < t - 64]:
            del self.plans[old]
        return split

    def on_done(self, rank, msg):
        t = int(msg["iteration"])
        self.done_at[t] = time.monotonic() - self.started
        for old in [k for k in self.done_at if k < t - 64]:
            del self.done_at[old]
        super().on_done(rank, msg)

    def record_fields(self, t: int) -> dict:
        """Courier's columns of the metrics record of iteration t."""
        elapsed, finish = self.plans.get(t, (None, None))
        done = self.done_at.get(t)
        return {"deadline_s": self.deadline_s, "predicted_finish_s": finish,
                "elapsed_s": elapsed, "batch_range": [self.lo, self.hi],
                "done_s": None if done is None else round(done, 4)}


@register
class Courier(SyncMode):
    name = "courier"
    label = "Courier"
    help = ("the coordinator chooses the global batch to meet --deadline, split as lbbsp "
            "(dist_sync)")
    uses_predictor = True
    sets_batch = True
    policy = CourierPolicy
    options = (
        Option("deadline", "--deadline", metavar="DURATION",
               help="the time budget of --epochs epochs, with a unit (90s, 15m, 1h30m). The "
                    "coordinator re-chooses the global batch as the job runs: the smallest in "
                    "--batch-range predicted to meet it."),
        BATCH_RANGE_OPTION,
        LR_SCALING_OPTION,
        Option("epochs", "--epochs", type=float, metavar="E",
               help="how many epochs of the data set --deadline covers."),
    )

    @staticmethod
    def check_options(options: dict) -> Optional[str]:
        opts = dict(DEFAULTS, **{k: v for k, v in options.items() if v is not None})
        try:
            if opts["deadline"] is None:
                return ("--sync courier needs --deadline (the time budget, e.g. --deadline 15m) "
                        "and --epochs (how many epochs it covers)")
            _planner.parse_duration(opts["deadline"])
            _planner.parse_batch_range(opts["batch_range"])
        except _planner.PlanError as exc:
            return str(exc)
        epochs = opts["epochs"]
        if epochs is None:
            return "--sync courier needs --epochs: how many epochs the --deadline covers"
        if not (isinstance(epochs, (int, float)) and math.isfinite(epochs) and epochs > 0):
            return f"--epochs {epochs}: must be a positive number of epochs"
        return _lr.rule_problem(opts["lr_scaling"], "courier")

    def check_workers(self, options: dict, num_workers: int) -> Optional[str]:
        return batch_range_problem(options.get("batch_range") or DEFAULTS["batch_range"],
                                   num_workers)

    def misplaced(self, flags, sync) -> str:
        if get(sync).sets_batch:        # goodput: chooses B too, but not for a deadline
            return (f"{', '.join(flags)}: options of --sync courier (a deadline); --sync "
                    f"{sync} chooses the global batch by its own rule. Drop them or use "
                    "--sync courier")
        choosers = " or ".join(f"--sync {m}" for m in available() if get(m).sets_batch)
        return (f"{', '.join(flags)}: only {choosers} chooses the global batch; --sync "
                f"{sync} trains with the fixed batch of the DataLoader. Drop them or use "
                "--sync courier")

    def worker_env(self, options: dict) -> dict:
        rule = options.get("lr_scaling") or DEFAULTS["lr_scaling"]
        return {_env.LR_SCALING: rule}
