"""Baselines: the last observed speed, and its exponential moving average."""
from __future__ import annotations

import numpy as np

from ._api import Predictor, register


@register("last")
class LastValue(Predictor):
    """speed(t+1) = speed(t)."""

    separable = True

    def __init__(self, num_workers: int, num_exog: int = 2):
        super().__init__(num_workers, num_exog)
        self._last = np.full(self.num_workers, np.nan)

    def observe(self, speed, exog) -> None:
        speed, _ = self._check(speed, exog)
        self._last = speed.copy()

    def predict(self) -> np.ndarray:
        return self._last.copy()


@register("ema")
class EMA(Predictor):
    """speed(t+1) = alpha * speed(t) + (1 - alpha) * forecast(t); the first one is speed(0)."""

    separable = True

    def __init__(self, num_workers: int, num_exog: int = 2, alpha: float = 0.5):
        super().__init__(num_workers, num_exog)
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = float(alpha)
        self._value = np.full(self.num_workers, np.nan)

    def observe(self, speed, exog) -> None:
        speed, _ = self._check(speed, exog)
        fresh = np.isnan(self._value)
        self._value = np.where(fresh, speed, self.alpha * speed + (1 - self.alpha) * self._value)

    def predict(self) -> np.ndarray:
        return self._value.copy()
