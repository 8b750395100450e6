"""A relay's forecasts: the job's predictor run over the host's workers only.

At 1024 workers the predictor was the largest part of the coordinator's work on the path
from the last report to the split (NARX's kernel units: about 4 ms of ~9). A predictor is
*separable* (:attr:`mxlbbsp.predictors.Predictor.separable`) when worker i's forecasts never
depend on worker j's inputs, bit for bit; then the host's relay can run it over its own
workers, every host in parallel, and the coordinator's split is the same.

Once every worker of the job has said hello, the coordinator's CONFIG frame names the
predictor, the ``--exog`` columns, the first iteration it learns from (after the warm-up,
as the coordinator's own predictor), and the state
of this host's workers when the job resumed from a checkpoint. From then on, once all the
host's reports of an iteration t are in, :meth:`Forecaster.report` gives each worker's
forecast of its speed at t+1, computed from exactly the numbers the coordinator's predictor
would have read (batch_size / compute_s and the ``--exog`` fields, a missing or
non-numeric value as NaN). They travel with the reports (``_forecast`` and ``_fallbacks``
columns of the section), or in a FORECAST frame ahead of them when part of the host's
reports had already left. The predictor's training step (:meth:`learn`) follows the
section's write; at the coordinator's checkpoint iterations the relay then sends the
predictor's state (a STATE frame, with its next write: the host's dones of that iteration,
so that the coordinator reads it while the workers compute), which the coordinator joins
with the other hosts' into the checkpoint of one predictor over all workers.

Stdlib, numpy and the predictors (numpy only).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from mxlbbsp import predictors as _pred


def _number(value) -> float:
    """A report's field as the coordinator reads it into its columns (NaN: none, or not a
    number, which the coordinator refuses anyway)."""
    return float(value) if isinstance(value, (int, float)) else math.nan


class Forecaster:
    """The predictor of one host's workers (``config``: the coordinator's ``forecast``;
    ``every``: the coordinator's checkpoint period, 0 for none)."""

    def __init__(self, config: dict, every: int = 0):
        self.name = str(config["predictor"])
        exog = tuple(config.get("exog") or ())
        self.columns = exog or ("",)           # as the coordinator's Collector: one NaN column
        self.ranks = sorted(int(r) for r in config["ranks"])
        self.slot = {rank: i for i, rank in enumerate(self.ranks)}
        self.start = int(config.get("from", 0))
        self.every = every
        self.predictor = _pred.create(self.name, len(self.ranks), len(self.columns))
        if config.get("state"):
            self.predictor.load_state_dict(config["state"])
        self._open: Dict[int, list] = {}       # iteration -> [speeds, exog, which are in]
        self.latest = -1                       # the last iteration whose reports were all in
        self._due: Optional[int] = None        # an iteration whose state the coordinator wants
        self._pending = False                  # an iteration is in, its training step not run

    def report(self, rank: int, msg: dict) -> Optional[Tuple[int, np.ndarray, np.ndarray]]:
        """Take a worker's report; once it is the host's last of its iteration t (from the
        first learnt one): (t, the forecasts of t+1, the fallback counts), in rank order."""
        t = msg["iteration"]
        i = self.slot.get(rank)
        if i is None or t <= self.latest:
            return None
        entry = self._open.get(t)
        if entry is None:
            k = len(self.ranks)
            entry = self._open[t] = [np.full(k, np.nan), np.full((k, len(self.columns)), np.nan),
                                     np.zeros(k, dtype=bool)]
        speed, exog, seen = entry
        if seen[i]:
            return None
        seen[i] = True
        batch, compute = _number(msg.get("batch_size")), _number(msg.get("compute_s"))
        speed[i] = batch / compute if compute > 0 else math.nan
        exog[i] = [_number(msg.get(c)) for c in self.columns]
        if not seen.all():
            return None
        for old in [k for k in self._open if k <= t]:
            del self._open[old]
        self.latest = t
        self._pending = True
        if self.every and (t + 1) % self.every == 0:
            self._due = t
        if t < self.start:                     # the warm-up: the coordinator learns nothing
            return None
        predictor = self.predictor
        with np.errstate(all="ignore"):
            predictor.observe(speed, exog)
            return t, predictor.predict(), predictor.fallbacks.copy()

    def learn(self) -> Optional[dict]:
        """The predictor's training step (after the forecasts left), once per iteration
        (a second call does nothing); the STATE message's content when the coordinator
        checkpoints this iteration, else None."""
        if not self._pending:
            return None
        self._pending = False
        self.predictor.learn()
        t, self._due = self._due, None
        if t is None:
            return None
        return {"iteration": t, "ranks": self.ranks, "state": self.predictor.state_dict()}
