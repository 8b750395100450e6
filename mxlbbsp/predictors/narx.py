"""NARX: nonlinear autoregression with exogenous inputs, in two parts that learn in one pass:
kernel units (a generalised regression network, GRNN, per input) and an output layer fitted
by recursive least squares (RLS). No gradient descent.

Worker i's log speed ``ly = log(speed)`` one step ahead, in units of S = 0.1 (10 %)::

    x~_t  = clip((x_t - m_x) / s_x, +-CLIP)          E exogenous columns, running mean / sd
    u_t   = [x~_t, x~_{t-1}, .., x~_{t-dx+1}]         (dx*E inputs)
    v_t   = [x_t, x_{t-1}, .., x_{t-dx+1}]            the raw readings (dx*E inputs)
    g_j(v_t) = (sum_s K_sj rho^age(s) ly_{s+1} + PRIOR l_j(v_tj)) / (sum_s K_sj rho^age(s) + PRIOR)
          K_sj = K((v_sj - v_tj) / h_j)               kernel unit j: biweight K, the last
                                                      MEMORY pairs (v_s, ly_{s+1}) remembered
    phi_t = [1, (ly_t - m_y)/S, (ly_{t-k} - ly_t)/S for k = 1..dy-1, u_t, (g_j(v_t) - ly_t)/S]
    r_t   = theta . phi_t                             forecast of (ly_{t+1} - ly_t) / S
    net_{t+1} = y_t exp(S r_t)

A kernel unit is a nonparametric regression of the next log speed on one input: it knows a
load level's speed as soon as it has seen that level once, whatever the shape of the curve
(step, convex, sigmoid), and one unit per input keeps an irrelevant input from blurring the
others. Its width h_j is BANDWIDTH times the input's noise scale, the median |x_t - x_{t-1}|
over the last DIFF_WINDOW iterations (load switches are rare, so the median is the reading's
own noise): two readings of one load level fall within a width of each other, two levels
apart do not, whatever the units and however early (the memory keeps raw readings, so a
later change of the running mean and sd does not move what it remembers). K(d) = (1 -
d^2/7)_+^2 has the variance of a unit Gaussian, compact support and no exp. Where little or
nothing is remembered near v_tj, the prior l_j takes over: the weighted least-squares line
of the log speed on input j through the memory (ridge h_j^2, within the remembered range
widened by itself), so that a load level never seen is extrapolated from the ones seen
rather than unknown. Its weighted sums are updated incrementally as pairs come and go
(recounted exactly in ``learn`` once per turn of the memory). (A basis of tanh units per
input, ``knots``, is available but off by default: where a load level sits on a steep unit,
the reading's noise becomes forecast noise.)

The output layer theta is linear in its parameters and fitted exactly at every step by RLS
with forgetting factor lam::

    k     = P phi / (lam + phi' P phi)
    theta = theta + k e,            e = clip(r - theta . phi, +-CLIP_ERR * running |e|)
    P     = (P - k phi' P) / lam    (not divided while trace(P) > MAX_TRACE: no wind-up)

from theta = 0 (the last value) and P = DELTA I (a ridge prior towards it). With lam = 1,
theta is exactly the ridge least-squares solution over all pairs so far (checked against
np.linalg.lstsq in tests/test_predictors.py). The error clip keeps one unpredictable jump
from dragging theta away (a robust, Huber-like RLS).

The forecast is then a combination of candidates: the RLS output, each kernel unit alone
(y^ = exp(g_j)), last value and EMA (alpha 0.5), weighed by their running absolute
percentage errors over ~``gate_window`` iterations (from the past only). A step on which
every candidate failed (a switch to a load never seen) says nothing about which one to
trust, so each candidate is scored by its regret, its error beyond the best candidate's at
that step, and e_c = running regret + f, f the running error of the best candidate with
each step's value clipped to 2 f (the learnt candidates' e_c count HANDICAP = 3 % more)::

    y^_{t+1} = sum_c w_c f_c,     w_c ~ (e_c / min e)^-GATE_POWER

so that on series with nothing to learn NARX stays close to the better baseline, and where a
learnt candidate is clearly better it gets nearly all the weight.

Training is series-parallel (inputs are observed speeds) and off the critical path:
``observe`` remembers the newest pair (the kernel units use it at once) and forecasts with
theta before it; ``learn`` (or the next observe) folds the pair into theta. Vectorised over
workers: theta (n, F), P (n, F, F), memory (n, dx*E, MEMORY) (one row per input, so that
numpy's inner loops run along the memory); worker i's numbers never depend on worker j's.
``observe`` is on the coordinator's critical path (the forecast is what the next split
waits for), so it avoids numpy's Python-level overhead on small arrays (np.clip, np.median)
and allocations of the (n, dx*E, MEMORY) work array at large n.

Fallbacks (the forecast is the last observed speed): the first ``warmup`` observations (not
counted); a non-finite, non-positive or absurd network forecast (outside [lo - M, hi + M],
M = max(hi - lo, hi/2), lo/hi the extreme speeds of the last ``window`` and of the kernel
units' memory), counted in ``fallbacks`` (a kernel unit's forecast, a weighted mean of
remembered speeds, is only replaced when it is not finite). A worker whose theta
or P became non-finite starts afresh. Missing exogenous values (NaN) carry the last finite
value forward (the running mean before the first; 0 in the kernel units' memory). A NaN or non-positive speed repeats the
last one, and its pair is not learnt.

Hyperparameters were chosen on the generator families of benchmarks/predictors.py with
tuning seeds (100, 101) that differ from the reported ones (1, 2, 3); ``python
benchmarks/predictors.py --tune`` scores the variants. Results and cost:
benchmarks/results/predictors.md. Where the remaining gap to the oracle comes from (measured
per phase on the tuning seeds): mostly the first switch of each trace to a load never seen,
which no learner without the curve can forecast (the report's "curve-free floor": 1.03-1.20x
the oracle on the families, the most at 1 % noise), then the first few switches while the
gate gathers evidence.
"""
from __future__ import annotations

import numpy as np

from ._api import Predictor, register

D_Y = 2          # speed lags (the level, and dy - 1 differences)
D_X = 2          # exogenous lags (per column)
KNOTS = ()       # tanh units per input, centred here (normalised units)
SHARPNESS = 3.0  # their slope
BANDWIDTH = 1.2  # kernel unit: its width in units of the input's noise scale (0: no kernel unit)
KERNEL = "biweight"  # kernel unit's shape: "biweight" (compact, no exp) or "gauss"
PRIOR = 0.05     # kernel unit: weight (in pairs) of its prior, a line through the memory
DIFF_WINDOW = 32  # the noise scale: median |change| of the reading over this many iterations
MEMORY = 256     # kernel unit: pairs remembered per worker
LINEAR_X = True  # the readings themselves are inputs of the output layer too
RECENCY = 0.998   # kernel unit: weight of a pair decays by this per iteration of age
LAMBDA = 0.995   # RLS forgetting factor
DELTA = 1.0      # prior: P0 = DELTA I (ridge 1/DELTA towards the last value)
MAX_TRACE = 1e4  # P is not inflated beyond this (no wind-up when inputs do not vary)
CLIP_ERR = 3.0   # an RLS error is clipped to this many running mean |errors|
WARMUP = 3       # observations before the network is used
GATE_WINDOW = 60  # horizon of the running errors that weigh the forecasts
HANDICAP = 0.03  # the learnt candidates' running errors count this much more (Occam)
GATE_POWER = 16.0 # weight ~ (error / smallest error)^-GATE_POWER
GATE_REGRET = True   # the gate scores each candidate's error beyond the best one's
NORM_WINDOW = 500  # horizon of the running statistics of the exogenous inputs
CLIP = 4.0       # a reading enters clipped to its running mean +- CLIP deviations
WINDOW = 64      # speeds kept for the sanity range
SCALE = 0.1      # log-speed unit of the features and the target



def _clip(x, lo, hi):
    """np.clip without its Python-level checks (a few microseconds per call, and NARX's
    observe is on the coordinator's critical path): the same numbers, NaN included."""
    return np.minimum(np.maximum(x, lo), hi)


def _median(x):
    """np.median over the last axis of finite values, without its Python-level overhead
    (~10x the work on a few workers' few dozen values): the same numbers."""
    k = x.shape[-1]
    return _middle(np.partition(x, k // 2 if k % 2 else (k // 2 - 1, k // 2), axis=-1))


def _middle(s):
    """The median over the last axis of ``s``, whose middle elements are in place (sorted,
    or partitioned around them)."""
    k = s.shape[-1]
    if k % 2:
        return s[..., k // 2].copy()
    return (s[..., k // 2 - 1] + s[..., k // 2]) / 2.0


def _slide(window: np.ndarray, new: np.ndarray, old=None) -> np.ndarray:
    """Each row of ``window`` (sorted) with ``new[row]`` inserted and, unless ``old`` is None,
    one element equal to ``old[row]`` taken out: sorted again, in a few passes over the
    (rows, k) array (np.partition or np.sort of it costs ~0.35 us per row). Rows of finite
    values only (a NaN does not sort by ``<``)."""
    rows, k = window.shape
    base = (np.arange(rows) * k)[:, None]
    if old is None:                                  # the window grows by one
        cols = np.arange(k + 1)
        at = np.count_nonzero(window < new[:, None], axis=1)
        source = np.minimum(cols - (cols > at[:, None]), max(k - 1, 0))
        out = window.ravel()[source + base] if k else np.empty((rows, 1))
    else:                                            # the oldest leaves, the newest comes
        cols = np.arange(k)
        at = np.count_nonzero(window < new[:, None], axis=1) - (old < new)
        gone = np.count_nonzero(window < old[:, None], axis=1)
        kept = cols - (cols > at[:, None])           # index in the window without `old`
        source = np.minimum(kept + (kept >= gone[:, None]), k - 1)
        out = window.ravel()[source + base]
    out[np.arange(rows), at] = new
    return out


def running_moments(seen: np.ndarray, mean: np.ndarray, var: np.ndarray, values: np.ndarray,
                    window: int) -> np.ndarray:
    """One step of the running mean and variance of every entry of ``values`` (NaN: no
    reading this time): cumulative over the first ``window`` readings, exponential after.
    ``seen`` and ``mean`` are updated in place; returns the new variance."""
    finite = np.isfinite(values)
    seen += finite
    rate = np.where(finite, 1.0 / np.maximum(np.minimum(seen, window), 1), 0)
    delta = np.where(finite, values - mean, 0.0)
    mean += rate * delta
    return (1 - rate) * (var + rate * delta * delta)   # West's weighted update

@register("narx")
class NARX(Predictor):
    """NARX of kernel units with an RLS output layer, per worker (see the module docstring).

    One long class, on purpose: the kernel units, the RLS output layer and
    the gate over the candidates update the same per-worker arrays (vectorised over the
    workers) in one pass per iteration, and each step reads what the one before wrote (the
    work arrays that keep its critical path short are part of that pass). The
    predictor's figures are accepted as they stand (benchmarks/README.md, Predictors).
    """

    separable = True

    def __init__(self, num_workers: int, num_exog: int = 2, *, d_y: int = D_Y, d_x: int = D_X,
                 knots=KNOTS, sharpness: float = SHARPNESS, bandwidth: float = BANDWIDTH,
                 memory: int = MEMORY, recency: float = RECENCY, linear_x: bool = LINEAR_X, lam: float = LAMBDA, delta: float = DELTA,
                 clip_err: float = CLIP_ERR, warmup: int = WARMUP,
                 gate_window: int = GATE_WINDOW, gate_power: float = GATE_POWER,
                 diff_window: int = DIFF_WINDOW,
                 gate_regret: bool = GATE_REGRET, prior: float = PRIOR,
                 kernel: str = KERNEL,
                 handicap: float = HANDICAP,
                 norm_window: int = NORM_WINDOW, window: int = WINDOW,
                 ):
        super().__init__(num_workers, num_exog)
        if d_y < 1 or d_x < 0 or warmup < 0 or gate_window < 1 \
                or norm_window < 1 or window < 1:
            raise ValueError("narx: d_y, gate_window, norm_window, window >= 1; d_x, hidden, "
                             "warmup >= 0")
        if not 0 < lam <= 1 or not delta > 0 or not clip_err > 0 or gate_power < 0:
            raise ValueError("narx: 0 < lam <= 1, delta > 0, clip_err > 0, gate_power >= 0")
        self.d_y, self.d_x, self.lam, self.delta = int(d_y), int(d_x), float(lam), float(delta)
        self.clip_err, self.warmup = float(clip_err), int(warmup)
        self.gate_window, self.gate_power = int(gate_window), float(gate_power)
        self.handicap = float(handicap)
        self.diff_window = max(int(diff_window), 1)
        self.gate_regret = bool(gate_regret)
        self.prior = float(prior)
        if kernel not in ("gauss", "biweight"):
            raise ValueError("narx: kernel is 'gauss' or 'biweight'")
        self.kernel = kernel
        self.norm_window, self.window = int(norm_window), int(window)
        n, E = self.num_workers, self.num_exog
        U = self._U = self.d_x * E
        self.hidden = U * len(knots)
        self.bandwidth, self.memory, self.recency = float(bandwidth), int(memory), float(recency)
        self._kernel = U > 0 and self.bandwidth > 0
        self.linear_x = bool(linear_x)
        F = self._F = 1 + self.d_y + U * int(self.linear_x) + self.hidden + U * int(self._kernel)
        # the kernel unit's memory: normalised inputs u_s, the log speed that followed
        M = max(self.memory, 1)
        # raw readings (lagged), one row of M per input: numpy's loops then run along M
        self._mem_in = np.zeros((n, U, M), dtype=np.float32)
        self._scratch = {}                           # work arrays (not state: not saved)
        self._mem_lo, self._mem_hi = np.full(n, np.inf), np.full(n, -np.inf)  # log speeds
        self._xr = np.zeros((n, max(self.d_x, 1), E))  # raw readings, most recent first
        self._dx = np.zeros((n, E, self.diff_window))  # |changes| of the readings, ring
        self._dx_count = 0
        self._support = np.zeros((n, U), dtype=bool)   # the kernel units recalled something
        # what _refit derives from the memory: widths, prior line
        self._h = np.ones((n, U))
        self._sums = np.zeros((n, 5, U))            # weighted sums over the memory
        self._line_u, self._line_v = np.zeros((n, U)), np.zeros((n, U))
        self._line_slope = np.zeros((n, U))
        self._line_lo, self._line_hi = np.zeros((n, 1)), np.zeros((n, 1))
        self._line_ok = np.zeros((n, U), dtype=bool)
        self._stale = False                          # the memory changed since _refit
        self._mem_v = np.zeros((n, M))
        self._mem_ok = np.zeros((n, M), dtype=bool)
        self._mem_age = np.zeros(M)
        self._mem_slot = 0
        self._knots = np.asarray(knots, dtype=float) if U else np.zeros(0)
        self.sharpness = float(sharpness)
        self._theta = np.zeros((n, F))
        self._P = np.tile(self.delta * np.eye(F), (n, 1, 1))
        self._abs_err = np.full(n, np.nan)          # running mean |RLS error|
        # statistics of the exogenous inputs and of the log speed
        self._mean = np.zeros((n, E))
        self._var = np.zeros((n, E))
        self._seen = np.zeros((n, E))
        self._m_y = np.full(n, np.nan)
        self._last_x = np.full((n, E), np.nan)
        self._ly = np.full((n, self.d_y), np.nan)   # log speeds, most recent first
        self._xl = np.zeros((n, max(self.d_x, 1), E))  # normalised readings, most recent first
        self._recent = np.full((n, self.window), np.nan)
        self._last = np.full(n, np.nan)             # the last good speed
        self._slot = 0
        self._count = 0
        self._xl_prev = np.zeros((n, U))
        self._phi = np.full((n, F), np.nan)         # features of the newest observation
        self._pending = None                        # (phi, target, ok): learnt by learn()
        # forecasting candidates (network, last, EMA): their last forecasts and running errors
        self._ema = np.full(n, np.nan)
        C = 3 + (U if self._kernel else 0)
        self._cand = np.full((n, C), np.nan)
        self._err = np.zeros((n, C))
        self._handicaps = np.ones(C)                 # the learnt candidates' Occam factor
        self._handicaps[[0] + list(range(3, C))] = 1.0 + self.handicap
        self._floor = np.full(n, np.nan)             # robust running error of the best
        self._forecast = np.full(n, np.nan)

    # ---- the interface -------------------------------------------------------------------

    def observe(self, speed, exog) -> None:
        speed, exog = self._check(speed, exog)
        if exog.shape[1] != self.num_exog:
            raise ValueError(f"narx: expected {self.num_exog} exogenous column(s), got "
                             f"{exog.shape[1]}")
        with np.errstate(all="ignore"):       # non-finite results are caught by the guards
            self._observe(speed, exog)

    def predict(self) -> np.ndarray:
        return self._forecast.copy()

    def load_state_dict(self, state: dict) -> None:
        # an older layout kept the memory as _mem_u (n, M, U) and the ring as (n, W, E): the
        # same sizes in another order, which load_object_state would reshape without a word
        if "_mem_u" in state:
            raise ValueError("narx: a state saved by an older mxlbbsp (another memory layout)")
        super().load_state_dict(state)

    def learn(self) -> None:
        """Fold the newest pair into the fit (the forecast came from theta before it)."""
        pending, self._pending = self._pending, None
        with np.errstate(all="ignore"):
            if pending is not None:
                self._rls(*pending)
            if self._stale and self._mem_slot == 0:
                self._refit()                        # once per turn of the memory
            self._stale = False

    # ---- internals -----------------------------------------------------------------------

    def _observe(self, speed, exog) -> None:
        self.learn()
        n = self.num_workers
        good = np.isfinite(speed) & (speed > 0)
        y = self._last = np.where(good, speed, self._last)   # a bad speed repeats the last
        self._score(speed, good)
        ly = np.log(y)
        if self._count:                              # the pair (phi_{t-1}, r_t)
            target = (ly - self._ly[:, 0]) / SCALE
            ok = good & np.isfinite(target) & np.isfinite(self._phi).all(axis=1)
            self._pending = (self._phi, np.where(ok, target, 0.0), ok)
        # statistics, then the delay lines
        exog = np.where(np.isfinite(exog), exog, self._last_x)
        self._last_x = exog
        self._update_stats(exog)
        sd = np.sqrt(self._var)
        sd = np.maximum(sd, 1e-2 * np.abs(self._mean) + 1e-6)
        xn = _clip((exog - self._mean) / sd, -CLIP, CLIP)
        xn = np.where(np.isfinite(xn), xn, 0.0)
        raw = np.where(np.isfinite(exog), exog, 0.0)
        if self._count:
            self._push_dx(np.abs(raw - self._xr[:, 0]))
        if self.d_x:
            self._xl = np.concatenate([xn[:, None, :], self._xl[:, :-1]], axis=1)
            self._xr = np.concatenate([raw[:, None, :], self._xr[:, :-1]], axis=1)
        if self._kernel and self._count:             # remember (u_{t-1}, ly_t)
            k = self._mem_slot
            old = self._mem_ok[:, k] * self.recency ** self._mem_age[k]
            self._sums -= old[:, None, None] * self._moments(self._mem_in[:, :, k],
                                                             self._mem_v[:, k])
            self._sums *= self.recency
            self._sums += good[:, None, None] * self._moments(self._xl_prev, ly)
            self._mem_in[:, :, k] = self._xl_prev
            self._mem_v[:, k] = ly
            self._mem_ok[:, k] = good
            self._mem_age += 1.0
            self._mem_age[k] = 0.0
            self._mem_slot = (k + 1) % self.memory
            self._stale = True
            self._line()
        self._xl_prev = self._xr.reshape(n, -1).copy()
        self._ly = np.concatenate([ly[:, None], self._ly[:, :-1]], axis=1)
        rate = 1.0 / min(self._count + 1, self.norm_window)
        self._m_y = np.where(np.isfinite(self._m_y), self._m_y + rate * (ly - self._m_y), ly)
        self._recent[:, self._slot] = np.where(good, speed, np.nan)
        self._slot = (self._slot + 1) % self.window
        self._ema = np.where(np.isfinite(self._ema), 0.5 * y + 0.5 * self._ema, y)
        self._count += 1
        self._phi = self._features(ly)
        r = np.einsum("nf,nf->n", self._phi, self._theta)
        kernels = y[:, None] * np.exp(SCALE * self._phi[:, self._F - self._U:]) \
            if self._kernel else np.zeros((n, 0))
        if self._kernel:                             # nothing similar remembered: the network
            kernels = np.where(self._support, kernels, (y * np.exp(SCALE * r))[:, None])
        self._forecast = self._combine(y, y * np.exp(SCALE * r), kernels)

    def _features(self, ly) -> np.ndarray:
        n, d_y = self.num_workers, self.d_y
        lags = self._ly
        parts = [np.ones((n, 1)), ((ly - self._m_y) / SCALE)[:, None]]
        if d_y > 1:
            parts.append((lags[:, 1:] - ly[:, None]) / SCALE)
        if self._U:
            u = self._xl.reshape(n, -1)
            if self.linear_x:
                parts.append(u)
            if self.hidden:
                parts.append(np.tanh(self.sharpness * (u[:, :, None] - self._knots)).reshape(n, -1))
            if self._kernel:
                g = self._recall(self._xr.reshape(n, -1))
                self._support = np.isfinite(g)
                parts.append((g - ly[:, None]) / SCALE)
        phi = np.concatenate(parts, axis=1)
        phi[~np.isfinite(phi)] = 0.0               # lags not filled yet
        phi[~np.isfinite(ly)] = np.nan             # no speed yet: nothing to learn from
        return phi

    def _recall(self, u) -> np.ndarray:
        """The kernel units, one per input j: a kernel-weighted mean of the log speeds
        that followed a value of input j like u_j (a generalised regression network per
        input, one hidden unit per remembered pair; the kernel ``self.kernel``, biweight by
        default, or Gaussian), the kernel's width BANDWIDTH times
        the input's noise scale (the median change of the reading from one iteration to the
        next); with the prior (a straight line through the memory, of weight ``prior``
        pairs) where little or nothing similar is remembered; NaN before any pair. Per
        input, so that an irrelevant input does not blur the others: the gate weighs them.
        The scale and the line come from ``_refit`` (in ``learn``, off the critical path)."""
        n, M = self._mem_v.shape
        scratch = self._scratch
        if "a" not in scratch:                       # work arrays, reused: no page faults
            dtype = np.float32 if self.kernel == "biweight" else np.float64
            scratch.update(d=np.empty(self._mem_in.shape, dtype=dtype),
                           a=np.empty((n, M), dtype=dtype), av=np.empty((n, M), dtype=dtype),
                           av64=np.empty((n, M)))
        ok = self._mem_ok
        recency = self.recency ** self._mem_age      # (M,): the same for every worker
        # a = where(ok, recency, 0) and a * where(ok, v, 0) in the kernel's dtype, in as few
        # passes as give the same numbers: a bool times a weight is the weight or +0.0
        a = np.multiply(ok, recency.astype(scratch["a"].dtype), out=scratch["a"])
        av = np.multiply(self._mem_v, recency, out=scratch["av64"])
        if not ok.all():                             # a NaN log speed of a bad pair: 0
            av = np.where(ok, av, 0.0)
        scratch["av"][...] = av
        av = scratch["av"]
        d = scratch["d"]
        if self.kernel == "biweight":                # (1 - d^2 / 7)_+^2: the same variance
            np.subtract(self._mem_in, u.astype(np.float32)[:, :, None], out=d)
            d *= (1.0 / (7.0 ** 0.5 * self._h)).astype(np.float32)[:, :, None]
            d *= d
            np.subtract(1.0, d, out=d)
            inside = scratch.setdefault("inside", np.empty(d.shape, dtype=bool))
            np.greater(d, 0.0, out=inside)           # (x)_+ as x * (x > 0): no NaN here,
            np.multiply(d, inside, out=d)            # and faster than np.maximum
            d *= d
            w = d
        else:                                        # Gaussian
            np.subtract(self._mem_in, u[:, :, None], out=d)
            d *= (1.0 / self._h)[:, :, None]
            d *= d
            d *= -0.5
            w = np.exp(d, out=d)
        # (n, U): einsum is ~2.5x faster than a batched matmul over n small matrices
        total = np.einsum("num,nm->nu", w, a).astype(float)
        near = np.einsum("num,nm->nu", w, av).astype(float)
        if self.prior > 0:
            line = _clip(self._line_v + self._line_slope * (u - self._line_u),
                           self._line_lo, self._line_hi)
            mean = (near + self.prior * line) / (total + self.prior)
            return np.where(self._line_ok, mean, np.nan)
        mean = near / np.maximum(total, 1e-300)
        return np.where(total > 1e-3, mean, np.nan)

    @staticmethod
    def _moments(u, v) -> np.ndarray:
        """(n, 5, U): 1, u, v, u^2, u v of pairs (u (n, U), v (n,))."""
        v = np.where(np.isfinite(v), v, 0.0)[:, None]
        out = np.empty((u.shape[0], 5, u.shape[1]), dtype=np.result_type(u, v))
        out[:, 0] = 1.0
        out[:, 1] = u
        out[:, 2] = v
        out[:, 3] = u * u
        out[:, 4] = u * v
        return out

    def _refit(self) -> None:
        """Recompute the memory's weighted sums exactly (they are updated incrementally
        in observe; this keeps rounding from accumulating). Off the critical path."""
        a = (self.recency ** self._mem_age)[None, :] * self._mem_ok             # (n, M)
        v = np.where(self._mem_ok, self._mem_v, 0.0)
        u = self._mem_in
        self._sums = np.stack([
            np.broadcast_to(a.sum(axis=1)[:, None], (self.num_workers, self._U)),
            np.einsum("nm,num->nu", a, u), np.broadcast_to((a * v).sum(axis=1)[:, None],
                                                           (self.num_workers, self._U)),
            np.einsum("nm,num->nu", a, u * u), np.einsum("nm,num->nu", a * v, u)], axis=1)

    def _push_dx(self, change: np.ndarray) -> None:
        """The newest |change| of each reading into its ring, and into the ring's sorted copy
        (a work array, rebuilt when missing: the median of the window is then two reads)."""
        W = self.diff_window
        slot = self._dx_count % W
        old = self._dx[:, :, slot].copy() if self._dx_count >= W else None
        self._dx[:, :, slot] = change
        self._dx_count += 1
        window = self._scratch.get("dx_sorted")
        if window is not None and window[0] == self._dx_count - 1 \
                and np.isfinite(change).all():
            rows = change.size
            self._scratch["dx_sorted"] = (self._dx_count, _slide(
                window[1], change.reshape(rows), None if old is None else old.reshape(rows)))
        else:
            self._scratch.pop("dx_sorted", None)

    def _dx_median(self) -> np.ndarray:
        """The median |change| of each reading over the window (np.median's number)."""
        n, E = self._dx.shape[:2]
        k = min(self._dx_count, self.diff_window)
        window = self._scratch.get("dx_sorted")
        if window is None or window[0] != self._dx_count:
            values = self._dx[:, :, :k].reshape(n * E, k)
            if not np.isfinite(values).all():
                return _median(self._dx[:, :, :k])
            window = (self._dx_count, np.sort(values, axis=1))
            self._scratch["dx_sorted"] = window
        return _middle(window[1].reshape(n, E, k))

    def _line(self) -> None:
        """The kernel units' widths and prior lines from the memory as it is now: weighted
        least squares of the log speed on each input, never beyond the remembered range
        widened by itself on each side."""
        n, U = self.num_workers, self._U
        k = min(self._dx_count, self.diff_window)
        scale = self._dx_median() if k else np.zeros((n, self.num_exog))
        scale = np.maximum(scale, 1e-3 * np.abs(self._mean) + 1e-9)
        self._h = self.bandwidth * np.concatenate([scale] * max(self.d_x, 1), axis=1)[:, :U]
        s0, su, sv, suu, suv = (self._sums[:, i] for i in range(5))
        s0 = np.maximum(s0, 1e-300)
        mu, mv = su / s0, sv / s0
        var = np.maximum(suu / s0 - mu * mu, 0.0)
        cov = suv / s0 - mu * mv
        slope = cov / (var + self._h * self._h)
        if self._mem_ok.all():                       # the same extremes, without the mask
            self._mem_lo, self._mem_hi = self._mem_v.min(axis=1), self._mem_v.max(axis=1)
        else:
            self._mem_lo = self._mem_v.min(axis=1, where=self._mem_ok, initial=np.inf)
            self._mem_hi = self._mem_v.max(axis=1, where=self._mem_ok, initial=-np.inf)
        lo, hi = self._mem_lo[:, None], self._mem_hi[:, None]
        self._line_u, self._line_v = mu, mv
        self._line_slope = np.where(np.isfinite(slope), slope, 0.0)
        self._line_lo, self._line_hi = lo - (hi - lo), hi + (hi - lo)
        self._line_ok = np.repeat(self._mem_ok.any(axis=1, keepdims=True), U, axis=1)

    def _update_stats(self, values: np.ndarray) -> None:
        self._var = running_moments(self._seen, self._mean, self._var, values, self.norm_window)

    def _rls(self, phi, target, ok) -> None:
        """One recursive-least-squares step per worker whose pair is usable (``ok``)."""
        if not ok.any():
            return
        phi = np.where(ok[:, None], phi, 0.0)
        e = target - np.einsum("nf,nf->n", phi, self._theta)
        scale = self._abs_err
        bound = self.clip_err * np.where(np.isfinite(scale), scale, np.inf)
        e_used = np.where(ok, _clip(e, -bound, bound), 0.0)
        rate = 1.0 / min(self._count, self.gate_window)
        self._abs_err = np.where(ok, np.where(np.isfinite(scale),
                                              scale + rate * (np.abs(e) - scale), np.abs(e)),
                                 scale)
        Pphi = np.einsum("nij,nj->ni", self._P, phi)
        gain = Pphi / (self.lam + np.einsum("ni,ni->n", phi, Pphi))[:, None]
        self._theta += gain * e_used[:, None]
        P = self._P - gain[:, :, None] * Pphi[:, None, :]
        inflate = ok & (np.trace(P, axis1=1, axis2=2) <= MAX_TRACE)
        if self.lam < 1:
            P /= np.where(inflate, self.lam, 1.0)[:, None, None]
        self._P = np.where(ok[:, None, None], P, self._P)
        broken = ~(np.isfinite(self._theta).all(axis=1) & np.isfinite(self._P).all(axis=(1, 2)))
        if broken.any():                             # start that worker afresh
            self._theta[broken] = 0.0
            self._P[broken] = self.delta * np.eye(self._F)
            self._abs_err[broken] = np.nan

    def _score(self, speed, good) -> None:
        """Running absolute relative errors of the candidates' forecasts of ``speed``."""
        scored = good & np.isfinite(self._cand).all(axis=1)
        if not scored.any():
            return
        rate = np.where(scored, 1.0 / min(self._count, self.gate_window), 0.0)
        err = np.abs(self._cand / speed[:, None] - 1.0)
        err = np.where(np.isfinite(err), np.minimum(err, 10.0), 10.0)
        if self.gate_regret:                         # what the best candidate missed too
            best = err.min(axis=1)                   # does not count, beyond a robust floor
            floor = self._floor
            fresh = ~np.isfinite(floor)
            clipped = np.where(fresh, best, np.minimum(best, 2.0 * floor))
            self._floor = np.where(scored, np.where(fresh, best, floor + rate * (clipped - floor)),
                                   floor)
            err = err - best[:, None]
        self._err += rate[:, None] * (np.where(scored[:, None], err, 0.0) - self._err)

    def _combine(self, last, net, kernels) -> np.ndarray:
        """Guard the network's forecast and the kernel units' (one per input, alone), then
        weigh them against last value and EMA."""
        seen = np.isfinite(self._recent)
        lo = np.fmin(self._recent.min(axis=1, where=seen, initial=np.inf), last)
        hi = np.fmax(self._recent.max(axis=1, where=seen, initial=-np.inf), last)
        if self._kernel:                             # and the speeds the kernel units remember
            lo = np.fmin(lo, np.exp(self._mem_lo))  # (_line: the memory as it is now)
            hi = np.fmax(hi, np.exp(self._mem_hi))
        margin = np.maximum(hi - lo, 0.5 * hi)
        sane = np.isfinite(net) & (net > 0) & (net >= lo - margin) & (net <= hi + margin)
        warm = self._count <= self.warmup
        if not warm:
            self.fallbacks += ~sane & np.isfinite(last)
        net = np.where(sane & ~warm, net, last)
        # a kernel unit's forecast is a weighted mean of remembered speeds: sane by design
        kernels = np.where(np.isfinite(kernels) & (kernels > 0) & ~warm, kernels, last[:, None])
        cand = self._cand = np.empty((len(last), 3 + kernels.shape[1]))
        cand[:, 0], cand[:, 1], cand[:, 2], cand[:, 3:] = net, last, self._ema, kernels
        if warm:
            return last.copy()
        err = self._err.copy()
        if self.gate_regret:
            err += np.where(np.isfinite(self._floor), self._floor, 0.0)[:, None]
        err *= self._handicaps
        if np.isinf(self.gate_power):               # hard: the best one so far
            w = np.zeros_like(err)
            w[np.arange(len(w)), np.argmin(err, axis=1)] = 1.0
        else:
            w = (err / np.maximum(err.min(axis=1, keepdims=True), 1e-18)) ** -self.gate_power
            w /= w.sum(axis=1, keepdims=True)
        out = (w * cand).sum(axis=1)
        return np.where(np.isfinite(out) & (out > 0), out, last)
