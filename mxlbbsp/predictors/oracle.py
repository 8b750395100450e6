"""The oracle: knows every worker's emulated slowdown factor of the iteration it forecasts.

Only meaningful with ``--emulate-slowdown``: it is the upper bound that shows what prediction
costs (benchmarks compare each predictor with it). It strips the known factor from each
observation to get the worker's undisturbed speed u_i, smooths u_i with an EMA (the noise
that no predictor can know), and forecasts::

    speed_i(t+1+ahead) = u_i / factor_i(t+1+ahead)

``ahead``: the mode's (lbbsp splits t+2 from the reports of t: 1), so that it knows the
factor of the iteration the split is for.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ._api import Predictor, register


@register("oracle")
class Oracle(Predictor):
    #: the coordinator passes the workers' slowdown schedules and calls advance(t)
    needs_schedules = True

    def __init__(self, num_workers: int, num_exog: int = 2,
                 schedules: Optional[Sequence] = None, alpha: float = 0.5, ahead: int = 0):
        super().__init__(num_workers, num_exog)
        self.schedules = list(schedules) if schedules else []
        self.alpha = alpha
        self.ahead = int(ahead)
        self._t = 0
        self._base = np.full(self.num_workers, np.nan)

    def _factors(self, t: int) -> np.ndarray:
        if not self.schedules:
            return np.ones(self.num_workers)
        return np.array([s.factor(t) for s in self.schedules], dtype=float)

    def advance(self, t: int) -> None:
        """The next observation (and the prediction after it) is of iteration t."""
        self._t = t

    def observe(self, speed, exog) -> None:
        speed, _ = self._check(speed, exog)
        base = speed * self._factors(self._t)
        fresh = np.isnan(self._base)
        self._base = np.where(fresh, base, self.alpha * base + (1 - self.alpha) * self._base)
        self._t += 1

    def predict(self) -> np.ndarray:
        return self._base / self._factors(self._t + self.ahead)
