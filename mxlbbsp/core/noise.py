"""The gradient noise scale from the workers' local gradient sums, and what it says about B.

LB-BSP's workers compute gradients over *different* local batch sizes b_i every iteration.
With g_b the mean gradient over b samples drawn from the data, G the true gradient and
Sigma the per-sample gradient covariance::

    E |g_b|^2 = |G|^2 + tr(Sigma) / b                                   (1)

so the squared norms of the workers' local gradients (at b_1..b_n) and of the global one
(at B = sum b_i) are points of a line in 1/b: its intercept is S = |G|^2, its slope
V = tr(Sigma). Workers report the squared norm of their gradient **sum** s_i (what
``backward()`` leaves with a per-sample loss), so |g_{b_i}|^2 = |s_i|^2 / b_i^2; the global
sum is the servers' sum of the pushes.

Per iteration the line is fitted by weighted least squares over the n + 1 points, weight b
(the samples behind a point). Its coefficients depend only on the b's, so by (1) the fit is
unbiased for any split; with equal b_i it is AdaptDL's two-point estimator (the mean local
norm against the global one). Single iterations are noisy (V can come out negative), so S
and V are smoothed over iterations by an exponential moving average with the start-up bias
corrected, each iteration weighted by its samples: the decay per iteration is
``smoothing ** (B / B0)`` (B0 the base batch), as in Pollux/AdaptDL. Late in training |G|^2
is small against tr(Sigma)/B and its smoothed estimate can reach 0 or below (phi "infinite":
every batch would look fully efficient); planning therefore uses ``noise_scale_low``, with
|G|^2 raised by one standard error of its smoothed estimate. Every estimate comes with an
error bar (the standard errors of the smoothed S and V, from the spread of the
per-iteration points), so none exists before ``NoiseScale.MIN_COUNT`` iterations; the
planner moves B only by what holds across ``noise_scale_range``, phi with S and V one
standard error apart.

What follows from S and V (Pollux, OSDI'21; AdaScale, ICML'20), with B0 the base batch::

    noise scale    phi = V / S                          (samples: B_noise, McCandlish 2018)
    AdaScale gain  r(B) = (V/B0 + S) / (V/B + S)        (lr(B) = r(B) * lr0; 1 <= r <= B/B0)
    efficiency     E(B) = r(B) / (B/B0) = (phi + B0) / (phi + B)
    goodput        G(B) = B / iteration_s(B) * E(B)     (samples of B0-equivalent progress / s)

Pure numpy, no MXNet: the coordinator, ``mxlbbsp plan`` and tests use it.
"""
from __future__ import annotations

import math
from typing import Callable, List, NamedTuple, Optional, Sequence

import numpy as np

from mxlbbsp.core import lr as _lr


class NoisePoint(NamedTuple):
    """One iteration's (unsmoothed) estimate: S = |G|^2, V = tr(Sigma) (per-sample)."""

    sqr: float
    var: float


def fit_line(sqr_sums: Sequence[float], split: Sequence[int],
             global_sqr_sum: Optional[float] = None,
             global_size: Optional[int] = None) -> Optional[NoisePoint]:
    """S and V of one iteration, from squared norms of gradient **sums**.

    ``sqr_sums[i]``: |sum of the per-sample gradients of worker i's b_i = ``split[i]``
    samples|^2; ``global_sqr_sum``: the same for the whole global batch of ``global_size``
    (default: sum of ``split``). Points are (1/b, |s|^2/b^2), weighted by b. None when the
    points do not determine a line (fewer than two distinct batch sizes, or non-finite input).
    """
    b = [float(x) for x in split]
    y = [float(s) / (x * x) for s, x in zip(sqr_sums, b) if x > 0]
    b = [x for x in b if x > 0]
    if global_sqr_sum is not None:
        B = float(global_size if global_size is not None else sum(b))
        if B > 0:
            b.append(B)
            y.append(float(global_sqr_sum) / (B * B))
    if len(b) < 2:
        return None
    x = 1.0 / np.asarray(b)
    yv = np.asarray(y)
    w = np.asarray(b)
    if not (np.all(np.isfinite(yv)) and np.all(yv >= 0)):
        return None
    xm = np.sum(w * x) / np.sum(w)
    dx = x - xm
    sxx = np.sum(w * dx * dx)
    if sxx <= 1e-12 * max(np.sum(w * x * x), 1e-300):
        return None            # one batch size only: no slope to see
    var = float(np.sum(w * dx * (yv - np.sum(w * yv) / np.sum(w))) / sxx)
    sqr = float(np.sum(w * yv) / np.sum(w) - var * xm)
    return NoisePoint(sqr, var)


class NoiseScale:
    """S = |G|^2 and V = tr(Sigma), smoothed over iterations (bias-corrected EMA), with their
    standard errors.

    ``base_batch``: B0, the batch the learning rate was tuned for (the loader's
    global_batch_size). ``smoothing``: the decay per B0 samples (an iteration at B decays
    the old estimate by smoothing ** (B / B0)).

    No estimate exists (every property is NaN) until ``MIN_COUNT`` iterations are in: the
    standard errors come from the spread of the per-iteration points, which one or two
    points cannot tell (a first |G|^2 estimate may well be negative).
    """

    #: iterations before any estimate, so that it comes with an error bar
    MIN_COUNT = 4

    def __init__(self, base_batch: int, smoothing: float = 0.99):
        if base_batch < 1:
            raise ValueError("base_batch must be >= 1")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError("smoothing must be in [0, 1)")
        self.base_batch = int(base_batch)
        self.smoothing = float(smoothing)
        self._sqr = self._var = self._norm = 0.0
        # for the standard errors of the smoothed S and V
        self._sqr2 = self._var2 = self._norm2 = 0.0
        self.count = 0                       # iterations taken in

    # ---- updating ----------------------------------------------------------------------

    def update(self, sqr_sums: Sequence[float], split: Sequence[int],
               global_sqr_sum: Optional[float] = None,
               global_size: Optional[int] = None) -> Optional[NoisePoint]:
        """Take in one iteration (see :func:`fit_line`); returns its raw point, or None
        when it told nothing (then nothing changes)."""
        point = fit_line(sqr_sums, split, global_sqr_sum, global_size)
        if point is None or not (math.isfinite(point.sqr) and math.isfinite(point.var)):
            return None
        B = float(global_size if global_size is not None else sum(split))
        self.add(point, B)
        return point

    def add(self, point: NoisePoint, batch: float) -> None:
        decay = self.smoothing ** (max(float(batch), 1.0) / self.base_batch)
        self._sqr = decay * self._sqr + (1.0 - decay) * point.sqr
        self._var = decay * self._var + (1.0 - decay) * point.var
        self._norm = decay * self._norm + (1.0 - decay)
        self._sqr2 = decay * self._sqr2 + (1.0 - decay) * point.sqr ** 2
        self._var2 = decay * self._var2 + (1.0 - decay) * point.var ** 2
        self._norm2 = decay ** 2 * self._norm2 + (1.0 - decay) ** 2
        self.count += 1

    # ---- estimates ---------------------------------------------------------------------

    @property
    def known(self) -> bool:
        """Enough iterations for an estimate with an error bar (``MIN_COUNT``)."""
        return self.count >= self.MIN_COUNT and self._norm > 0 and self._norm2 > 0

    @property
    def sqr(self) -> float:
        """Smoothed |G|^2 (may be <= 0: no signal above the noise); nan until known."""
        return self._sqr / self._norm if self.known else math.nan

    @property
    def var(self) -> float:
        """Smoothed tr(Sigma) per sample (floored at 0); nan until known."""
        return max(self._var / self._norm, 0.0) if self.known else math.nan

    def _stderr(self, total: float, squares: float) -> float:
        """The standard error of a smoothed mean: the spread of the per-iteration values
        over the effective number of iterations in the average."""
        if not self.known:
            return math.nan
        mean = total / self._norm
        spread = max(squares / self._norm - mean * mean, 0.0)
        n_eff = self._norm * self._norm / self._norm2
        return math.sqrt(spread / max(n_eff, 1.0))

    @property
    def sqr_stderr(self) -> float:
        """Standard error of the smoothed S (nan until known)."""
        return self._stderr(self._sqr, self._sqr2)

    @property
    def var_stderr(self) -> float:
        """Standard error of the smoothed V (nan until known)."""
        return self._stderr(self._var, self._var2)

    @property
    def noise_scale(self) -> float:
        """The point estimate phi = V / S, in samples: nan until known, inf while S <= 0
        (the noise hides the gradient: no finite estimate)."""
        if not self.known:
            return math.nan
        return self.var / self.sqr if self.sqr > 0 else math.inf

    @property
    def noise_scale_low(self) -> float:
        """A cautious phi: tr(Sigma) over max(|G|^2, 0) plus one standard error of its
        estimate (nan until known).

        Late in training |G|^2 is small against tr(Sigma)/B and its estimate may be near or
        below 0, which would make phi huge and every batch look fully efficient; the one
        standard error keeps phi to what the measurements can support (B and the learning
        rate go by this one)."""
        if not self.known:
            return math.nan
        upper = max(self.sqr, 0.0) + self.sqr_stderr
        return self.var / upper if upper > 0 else math.nan

    @property
    def noise_scale_range(self) -> tuple:
        """(low, high): phi with S and V one standard error apart, each the way that
        lowers or raises it; high is inf while S is within one standard error of 0.
        (nan, nan) until known. What the planner's margin is derived from."""
        if not self.known:
            return math.nan, math.nan
        S, V = self.sqr, self.var
        se_s, se_v = self.sqr_stderr, self.var_stderr
        up = max(S, 0.0) + se_s
        low = max(V - se_v, 0.0) / up if up > 0 else math.nan
        high = (V + se_v) / (S - se_s) if S - se_s > 0 else math.inf
        return low, high

    def gain(self, batch: float) -> float:
        """AdaScale's gain at ``batch`` against B0 (1 before any estimate)."""
        return gain(self.noise_scale, batch, self.base_batch)

    def efficiency(self, batch) -> np.ndarray:
        return efficiency(self.noise_scale, batch, self.base_batch)

    def state(self) -> dict:
        return {"sqr": self._sqr, "var": self._var, "norm": self._norm, "count": self.count,
                "sqr2": self._sqr2, "var2": self._var2, "norm2": self._norm2}

    def load(self, state: dict) -> None:
        self._sqr, self._var = float(state["sqr"]), float(state["var"])
        self._norm, self.count = float(state["norm"]), int(state["count"])
        self._sqr2, self._norm2 = float(state["sqr2"]), float(state["norm2"])
        self._var2 = float(state.get("var2", 0.0))


def efficiency(phi: float, batch, base_batch: float):
    """Pollux's statistical efficiency (phi + B0) / (phi + B): progress per sample at B
    against B0 (1 at B0; every batch counts as 1 while phi is unknown)."""
    batch = np.asarray(batch, dtype=float)
    if not (isinstance(phi, (int, float)) and math.isfinite(phi)):
        return np.ones_like(batch)
    phi = max(float(phi), 0.0)
    return (phi + base_batch) / (phi + batch)


def gain(phi: float, batch: float, base_batch: float) -> float:
    """AdaScale's gain r = E(B) * B / B0, in [1, B/B0] for B >= B0 (1 while phi is
    unknown): :func:`mxlbbsp.core.lr.adascale`, the ``--lr-scaling adascale`` factor."""
    if not (isinstance(phi, (int, float)) and math.isfinite(phi)):
        return 1.0
    return _lr.adascale(phi, batch, base_batch)


class GoodputRow(NamedTuple):
    """One candidate global batch."""

    batch: int
    iteration_s: float     # predicted seconds per iteration at this batch
    throughput: float      # samples / s
    efficiency: float      # statistical efficiency against B0
    goodput: float         # throughput * efficiency


def goodput_rows(batches: Sequence[int], iteration_s: Callable[[int], float], phi: float,
                 base_batch: float) -> List[GoodputRow]:
    """Goodput of each candidate: ``iteration_s(B)`` the predicted iteration time (the
    LB-BSP makespan plus push/pull, or another throughput model), ``phi`` the noise scale."""
    rows = []
    for B in batches:
        it = float(iteration_s(int(B)))
        thr = int(B) / it if math.isfinite(it) and it > 0 else 0.0
        eff = float(efficiency(phi, int(B), base_batch))
        rows.append(GoodputRow(int(B), it, thr, eff, thr * eff))
    return rows


def best(rows: Sequence[GoodputRow]) -> GoodputRow:
    """The row of the highest goodput (the smaller batch on a tie)."""
    return max(rows, key=lambda r: (r.goodput, -r.batch))
