"""AR(p): the classical linear autoregressive baseline, fitted online by recursive least squares.

Worker i's speed, in units of its first observed speed s_i (u = y / s_i), follows::

    u_{t+1} = c + a_1 u_t + a_2 u_{t-1} + ... + a_p u_{t-p+1} + e_{t+1}

No exogenous inputs: this is what a classical time-series model (ARIMA without differencing or
moving-average terms) can know. theta = (c, a_1..a_p) is updated at every observation by
recursive least squares with forgetting factor lam (phi_t = (1, u_t, .., u_{t-p+1}))::

    k     = P phi / (lam + phi' P phi)
    theta = theta + k (u_{t+1} - phi' theta)
    P     = (P - k phi' P) / lam            (not divided while trace(P) > MAX_TRACE: no wind-up)

starting from theta = (0, 1, 0, ..) (the last value) and P = DELTA * I, so that few
observations keep it close to last-value. Warm-up: the last value for the first ``warmup``
observations. A non-finite, non-positive or absurd forecast (outside
``[lo - M, hi + M]``, ``M = max(hi - lo, hi / 2)`` over the last ``window`` speeds) falls back
to the last value and counts in ``fallbacks``. Vectorised over workers.

p, lam and DELTA were chosen by measurement on the trace groups of narx.py (MAPE / MAPE of the
best of last-value and EMA; p in 1, 2, 3, 5; lam in 0.98, 0.995, 1; DELTA in 1, 10): p = 3,
lam = 0.995, DELTA = 1 is within 0.02 of the best setting on every group -- lead 1.27, no
signal 1.09, AR(1) 0.97, real 1.04. Least squares chases the jumps of switching traces, so
there AR loses to last-value in MAPE; on smooth (AR-like) speed it is the best baseline.
"""
from __future__ import annotations

import numpy as np

from ._api import Predictor, register

P_ORDER = 3
LAMBDA = 0.995
DELTA = 1.0
MAX_TRACE = 1e4
WARMUP = 10
WINDOW = 48


@register("ar")
class AR(Predictor):
    """Online AR(p) per worker, recursive least squares (see the module docstring)."""

    separable = True

    def __init__(self, num_workers: int, num_exog: int = 2, *, p: int = P_ORDER,
                 lam: float = LAMBDA, warmup: int = WARMUP, window: int = WINDOW):
        super().__init__(num_workers, num_exog)
        if p < 1 or not 0 < lam <= 1 or warmup < 0 or window < 1:
            raise ValueError("ar: p >= 1, 0 < lam <= 1, warmup >= 0, window >= 1")
        self.p, self.lam, self.warmup, self.window = int(p), float(lam), int(warmup), int(window)
        n, q = self.num_workers, self.p + 1
        self._theta = np.zeros((n, q))
        self._theta[:, 1] = 1.0
        self._P = np.tile(DELTA * np.eye(q), (n, 1, 1))
        self._scale = np.full(n, np.nan)
        self._lags = np.full((n, self.p), np.nan)          # u_t .. u_{t-p+1}
        self._recent = np.full((n, self.window), np.nan)   # raw speeds, ring
        self._slot = 0
        self._count = 0
        self._forecast = np.full(n, np.nan)
        self._last = np.full(n, np.nan)                   # last good speed

    def observe(self, speed, exog) -> None:
        speed, _ = self._check(speed, exog)
        with np.errstate(all="ignore"):     # non-finite results are caught by the guards
            self._observe(speed)

    def predict(self) -> np.ndarray:
        return self._forecast.copy()

    def _observe(self, speed) -> None:
        good = np.isfinite(speed) & (speed > 0)
        self._scale = np.where(np.isnan(self._scale) & good, speed, self._scale)
        last_u = self._lags[:, 0]
        u = np.where(good, speed / self._scale, last_u)
        phi = np.concatenate([np.ones((self.num_workers, 1)), self._lags], axis=1)
        learn = good & np.all(np.isfinite(phi), axis=1)
        if learn.any():
            phi0 = np.where(learn[:, None], phi, 0.0)
            Pphi = np.einsum("nij,nj->ni", self._P, phi0)
            gain = Pphi / (self.lam + np.einsum("ni,ni->n", phi0, Pphi))[:, None]
            err = np.where(learn, u - np.einsum("ni,ni->n", phi0, self._theta), 0.0)
            self._theta += gain * err[:, None]
            P = self._P - np.einsum("ni,nj->nij", gain, Pphi)
            wound = np.trace(P, axis1=1, axis2=2) > MAX_TRACE
            P = np.where((learn & ~wound)[:, None, None], P / self.lam, P)
            self._P = np.where(learn[:, None, None], P, self._P)
            broken = ~(np.isfinite(self._theta).all(axis=1)
                       & np.isfinite(self._P).all(axis=(1, 2)))
            if broken.any():             # start that worker afresh from last-value
                self._theta[broken] = np.eye(1, self.p + 1, 1)
                self._P[broken] = DELTA * np.eye(self.p + 1)
        self._lags = np.concatenate([u[:, None], self._lags[:, :-1]], axis=1)
        self._recent[:, self._slot] = np.where(good, speed, np.nan)
        self._slot = (self._slot + 1) % self.window
        self._count += 1
        self._last = last = np.where(good, speed, self._last)
        if self._count <= self.warmup:
            self._forecast = last
            return
        phi = np.concatenate([np.ones((self.num_workers, 1)), self._lags], axis=1)
        forecast = np.einsum("ni,ni->n", phi, self._theta) * self._scale
        seen = np.isfinite(self._recent)
        lo = np.fmin(self._recent.min(axis=1, where=seen, initial=np.inf), last)
        hi = np.fmax(self._recent.max(axis=1, where=seen, initial=-np.inf), last)
        margin = np.maximum(hi - lo, 0.5 * hi)
        sane = np.isfinite(forecast) & (forecast > 0) & (forecast >= lo - margin) \
            & (forecast <= hi + margin)
        self.fallbacks += ~sane & np.isfinite(last)
        self._forecast = np.where(sane, forecast, last)
