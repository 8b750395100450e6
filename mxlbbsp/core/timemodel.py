"""Per-worker time models, their makespan, and their fit from measured iterations.

Pure numpy; no MXNet. Time model of worker i (a :class:`TimeModel`, vectorised over workers)::

    t_i(b) = intercept_i + b / speed_i            # seconds for a local batch of b samples

``intercept = 0`` is the linear model of the LB-BSP paper on CPUs (b_i proportional to
speed_i); a positive intercept is the fixed per-iteration cost that makes small batches
inefficient (GPUs, Python overhead). :class:`AffineFit` fits the intercepts from the
workers' measured (batch, seconds) pairs; :mod:`mxlbbsp.core.split` solves for the split.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np


class TimeModel(NamedTuple):
    """t_i(b) = intercept_i + b / speed_i, one entry per worker."""

    speed: np.ndarray       # samples per second (marginal), > 0
    intercept: np.ndarray   # seconds, >= 0

    @classmethod
    def linear(cls, speed) -> "TimeModel":
        speed = np.asarray(speed, dtype=float)
        return cls(speed, np.zeros_like(speed))

    def time(self, batch) -> np.ndarray:
        """Predicted time of each worker for its batch size."""
        return self.intercept + np.asarray(batch, dtype=float) / self.speed


def makespan(model: TimeModel, batch) -> float:
    """Predicted time of the iteration: the slowest worker's."""
    return float(np.max(model.time(batch)))


def nanmedian_last(x) -> np.ndarray:
    """The median along the last axis with NaNs left out (NaN where nothing is left): what
    ``np.nanmedian(x, axis=-1)`` returns, without its warnings, and at a fraction of its
    cost on the small arrays of a time-model window (numpy goes through masked arrays for
    those: ~1 ms a call, and the coordinator makes several per iteration before it can send
    the next split)."""
    x = np.sort(np.asarray(x, dtype=float), axis=-1)     # NaNs sort last
    k = x.shape[-1]
    if k and not np.isnan(x[..., -1]).any():             # no NaN (the usual case): the
        return (x[..., (k - 1) // 2] + x[..., k // 2]) / 2   # same sums, a third the cost
    count = (~np.isnan(x)).sum(axis=-1)
    rows = x.reshape(-1, x.shape[-1])                    # plain indexing: take_along_axis
    pick = np.arange(len(rows))                          # costs ~100 us more per call

    def at(index):
        index = np.minimum(np.maximum(index, 0), x.shape[-1] - 1).reshape(-1)
        return rows[pick, index].reshape(count.shape)
    return np.where(count > 0, (at((count - 1) // 2) + at(count // 2)) / 2, np.nan)


#: pooled_slope looks at most this many workers (the ones whose batch sizes varied most):
#: enough for a robust slope, and the coordinator's per-iteration cost stays flat in n
POOLED_WORKERS = 32


def _std_rows(x, valid) -> np.ndarray:
    """Per row, the standard deviation of the valid values: ``np.nanstd`` of them, the same
    number by the same steps, without its generic machinery (~0.3 ms on 256 x 32)."""
    count = valid.sum(axis=1, keepdims=True)
    x = np.where(valid, x, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        dev = np.where(valid, x - x.sum(axis=1, keepdims=True) / count, 0.0)
        return np.sqrt((dev * dev).sum(axis=1) / count[:, 0])


def pooled_slope(b, t, valid, spread=None) -> tuple:
    """One slope (seconds per sample) for several workers' windows, robust to outliers, and
    its standard error: (slope, se).

    ``b``, ``t``, ``valid``: (workers, window) batch sizes, times, and which are observed;
    ``spread``: each row's standard deviation of its valid batch sizes, if the caller has it
    (AffineFit.observe does; else computed here, the same numbers), which picks the rows kept
    beyond POOLED_WORKERS.
    Two steps. A robust start: every pair of observations of one worker with different batch
    sizes gives a slope (t_j - t_k) / (b_j - b_k); each observation's median slope to the
    others, then the median of those over all workers' observations (Siegel's repeated
    median, pooled over workers: half the observations may be wild before it moves). Then
    efficiency: the observations whose residual from that line (each worker about its own
    median level) is within 3 robust standard deviations are fitted by least squares, one
    slope over every worker's deviations from its own means.

    Plain least squares is not good enough here: the balancer itself makes the batch sizes
    vary, often a few samples at a time, and one iteration stretched by a passing tenant at
    the one batch that stands out sets the slope (seen: 8-25x the true one, which made equal
    workers look unequal for a whole window). The repeated median alone is robust but
    noisy: most pairs differ by a sample or two, their slopes are mostly noise (seen: half
    the true slope now and then, enough to call a compute-bound job fixed-cost bound).
    Whatever the estimate, a split that hardly varies cannot tell the slope: the standard
    error says so, and the caller decides only on what the error allows.
    (NaN, inf) when no pair differs in batch size; (slope, inf) when least squares has
    nothing left to fit.
    """
    b, t, valid = np.asarray(b, float), np.asarray(t, float), np.asarray(valid, bool)
    if len(b) > POOLED_WORKERS:
        spread = _std_rows(b, valid) if spread is None else np.asarray(spread, float)
        keep = np.argsort(-spread, kind="stable")[:POOLED_WORKERS]
        b, t, valid = b[keep], t[keep], valid[keep]
    db = b[:, :, None] - b[:, None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        pair = (t[:, :, None] - t[:, None, :]) / db
    pair[~(valid[:, :, None] & valid[:, None, :] & (db != 0))] = np.nan
    per_point = nanmedian_last(pair)         # NaN for points with no partner
    start = per_point[np.isfinite(per_point)]
    if not start.size:
        return float("nan"), float("inf")
    c0 = float(nanmedian_last(start))        # np.median's number, at a fraction of its cost
    resid = np.where(valid, t - c0 * b, np.nan)
    resid -= nanmedian_last(resid)[:, None]
    scale = 1.4826 * float(nanmedian_last(np.abs(resid).ravel()))
    kept = valid & (np.abs(np.nan_to_num(resid, nan=np.inf)) <= 3.0 * scale)
    count = kept.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mb = np.where(kept, b, 0.0).sum(axis=1, keepdims=True) / count
        mt = np.where(kept, t, 0.0).sum(axis=1, keepdims=True) / count
    dbk = np.where(kept, b - mb, 0.0)
    dtk = np.where(kept, t - mt, 0.0)
    sbb = float((dbk * dbk).sum())
    dof = int(kept.sum()) - int((count[:, 0] > 0).sum()) - 1
    if sbb <= 0 or dof < 1:
        return c0, float("inf")
    slope = float((dbk * dtk).sum() / sbb)
    rss = float(((dtk - slope * dbk) ** 2).sum())
    return slope, float(np.sqrt(rss / dof / sbb))


class AffineFit:
    """Per-worker fit of the fixed cost ``intercept_i`` in t_i(b) = intercept_i + b / v_i.

    Keeps the last ``window`` (batch, time) observations of each worker and fits a line by
    least squares. The intercept is only identifiable when the batch sizes in the window
    differ; until they do (and whenever the fit is implausible), the last good estimate is
    kept, starting from 0, i.e. the linear model. The estimate is clamped to
    [0, ``max_share`` * the smallest observed time] so it can never explain away the whole
    iteration.
    """

    def __init__(self, num_workers: int, window: int = 32, max_share: float = 0.8,
                 min_spread: float = 0.1):
        self.window = window
        self.max_share = max_share
        self.min_spread = min_spread
        self._b = np.full((num_workers, window), np.nan)
        self._t = np.full((num_workers, window), np.nan)
        self._next = 0
        self.intercept = np.zeros(num_workers)
        #: fitted intercept / mean time of the window, per worker, in [0, 1] (0 until fitted)
        self.share = np.zeros(num_workers)
        #: the share of the time that is fixed cost, for the whole job (one slope pooled
        #: over the workers; 0 until any worker's batch sizes varied)
        self.job_share = 0.0
        #: bounds on it, three standard errors of the pooled slope either side: (0, 1) while
        #: the batch sizes have hardly varied, whatever job_share says
        self.job_share_low, self.job_share_high = 0.0, 1.0
        #: that pooled slope, seconds per sample (NaN until any worker's batch sizes varied):
        #: robust (see :func:`pooled_slope`), one slow iteration does not move it
        self.pooled_slope = float("nan")
        #: fitted seconds per sample, per worker (NaN until fitted; may be <= 0: noise)
        self.slope = np.full(num_workers, np.nan)
        #: the window's mean batch and mean time per worker
        self.mean_batch = np.full(num_workers, np.nan)
        self.mean_time = np.full(num_workers, np.nan)

    def observe(self, batch, seconds) -> None:
        col = self._next % self.window
        self._b[:, col] = batch
        self._t[:, col] = seconds
        self._next += 1
        b, t = self._b, self._t
        valid = np.isfinite(b) & np.isfinite(t) & (t > 0)
        # a full window of good observations (the usual case): the same numbers without
        # the masks, which then select every value (where(valid, x, y) is x)
        full = bool(valid.all())
        count = valid.sum(axis=1)
        bz = b if full else np.where(valid, b, 0.0)
        tz = t if full else np.where(valid, t, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mb = bz.sum(axis=1) / count
            mt = tz.sum(axis=1) / count
            db = b - mb[:, None]
            dt = t - mt[:, None]
            if not full:
                db = np.where(valid, db, 0.0)
                dt = np.where(valid, dt, 0.0)
            sbb = (db * db).sum(axis=1)
            slope = (db * dt).sum(axis=1) / sbb
            intercept = mt - slope * mb
            sd = np.sqrt(sbb / count)           # the batch sizes' spread, in samples
            spread = sd / mb
        tmin = t.min(axis=1) if full else np.where(valid, t, np.inf).min(axis=1)
        fitted = (count >= 4) & (spread >= self.min_spread) & np.isfinite(intercept)
        # A time that does not grow with the batch (slope <= 0 within the noise): all of it
        # is fixed cost, as far as this window can tell; clamped below like any estimate.
        intercept = np.where(slope > 0, intercept, mt)
        self.intercept = np.where(fitted, np.minimum(np.maximum(intercept, 0.0),
                                                     self.max_share * tmin), self.intercept)
        # the share of the mean time that the fit calls fixed, before the clamp (which
        # depends on the fastest iteration and so on the noise)
        self.share = np.where(fitted, np.minimum(np.maximum(intercept / mt, 0.0), 1.0),
                              self.share)
        self.slope = np.where(fitted, slope, self.slope)
        self.mean_batch, self.mean_time = mb, mt
        # The job's fixed-cost share from one slope pooled over the workers' windows whose
        # batch sizes varied enough: n times the data of one worker's fit, and robust, so
        # far less noisy. While no window varies, the last estimate and its bounds hold.
        varied = (count >= 4) & (spread >= self.min_spread)
        if varied.any():
            pooled, se = pooled_slope(b[varied], t[varied], valid[varied], sd[varied])
            if np.isfinite(pooled):
                self.pooled_slope = pooled
                ratio = mb[varied] / mt[varied]
                # the share at the slope and at 3 standard errors either side, in one call
                c = np.maximum(np.array([pooled, pooled + 3 * se, pooled - 3 * se]), 0.0)
                shares = np.minimum(np.maximum(
                    nanmedian_last(1.0 - c[:, None] * ratio), 0.0), 1.0)
                self.job_share, self.job_share_low, self.job_share_high = map(float, shares)

    def equal_split_bounds(self, equal_batch: float, recent: Optional[int] = None,
                           fixed_share: tuple = (0.0, 1.0)) -> tuple:
        """Per worker, a low and a high estimate of its time at ``equal_batch`` samples.

        Each observation (b, t) of the last ``recent`` iterations (default: the window) is
        carried to the equal batch by the time models whose fixed cost is any share phi in
        ``fixed_share`` of t: t * (phi + (1 - phi) * equal_batch / b). With the default
        (0, 1), all fixed cost (t) to none (t * equal_batch / b), the true time at the
        equal batch lies between them whatever the fixed cost; with the job's bounds on its
        fixed share (job_share_low, job_share_high) the interval narrows as far as the fit
        is sure. The medians of the two carried values are returned, (low, high). Near the
        equal split the bounds are tight; far from it they are wide, and a worker can only
        be shown slower than another when it is at every fixed share allowed: no point
        estimate of a slope enters, so none can make an equal worker look slower (the trap
        an extrapolated per-worker fit fell into). NaN for every worker while any has fewer
        than 8 observations (or ``recent``) to go by."""
        b, t = self._b, self._t
        if recent is not None and recent < self.window:
            cols = (self._next - 1 - np.arange(recent)) % self.window
            b, t = b[:, cols], t[:, cols]
        valid = np.isfinite(b) & np.isfinite(t) & (t > 0) & (b > 0)
        full = bool(valid.all())        # the usual case: no mask to apply
        if not full and valid.sum(axis=1).min() < min(b.shape[1], 8):
            nan = np.full(len(b), np.nan)       # too few observations to tell
            return nan, nan
        # (the coordinator calls this every iteration: plain floats and one median call
        # for both bounds, the same numbers at a third of the cost)
        with np.errstate(invalid="ignore", divide="ignore"):
            carried = [t * (phi + (1.0 - phi) * equal_batch / b)
                       for phi in (min(max(float(p), 0.0), 1.0) for p in fixed_share)]
        bounds = np.stack([np.minimum(*carried), np.maximum(*carried)])
        if not full:
            bounds = np.where(valid, bounds, np.nan)
        lo, hi = nanmedian_last(bounds)
        return lo, hi

    def model(self, batch, predicted_time) -> TimeModel:
        """The time model through the predicted point (batch_i, predicted_time_i)."""
        batch = np.asarray(batch, dtype=float)
        predicted_time = np.asarray(predicted_time, dtype=float)
        a = np.minimum(self.intercept, self.max_share * predicted_time)
        return TimeModel(batch / (predicted_time - a), a)


class FixedCostFit:
    """Each worker's fixed cost per iteration a_i in t_i(b) = a_i + b / v_i, robustly, from
    its last ``window`` (batch, time) observations (goodput's throughput model).

    Per worker: the slope by :func:`pooled_slope` over its own observations (repeated
    medians, then least squares on the inliers: a passing tenant's slow iteration does not
    set it), the intercept the median of t - slope * b, within [0, ``max_share`` x its least
    time]. Only a worker whose batch sizes in the window varied by ``min_spread`` of their
    mean or more, 3 of them or more that far from the median (epochs' short last batches, a
    change of the global batch), can show it;
    until then, and when a fit gives no positive slope, the last estimate stays (0 at
    first: the linear model). ``known`` says which workers' costs a fit has set. Refitted
    every ``every`` observations, and at every observation while a worker's cost is not
    known yet, so that it is known as soon as its batch sizes have varied. One worker's fit
    costs about a quarter of a millisecond at a window of 128, so one observation refits at
    most ``rows`` workers: beyond that many, the workers are refitted in groups of ``rows``,
    one group per observation (each every max(``every``, groups) observations), and the
    ones not known yet take turns (seen: 210-365 ms of the coordinator's thread per refit
    at 1024 workers when all were refitted at once).
    """

    def __init__(self, num_workers: int, window: int = 128, min_spread: float = 0.1,
                 max_share: float = 0.8, every: int = 4, rows: int = 32):
        self.window, self.min_spread, self.max_share = window, min_spread, max_share
        self.every, self.rows = max(1, int(every)), max(1, int(rows))
        self._group = np.arange(num_workers) // self.rows
        self._period = max(self.every, int(self._group[-1]) + 1 if num_workers else 1)
        self._b = np.full((num_workers, window), np.nan)
        self._t = np.full((num_workers, window), np.nan)
        self._seen = 0
        self.intercept = np.zeros(num_workers)
        #: the workers whose fixed cost a fit has set (the others' 0 is only a default)
        self.known = np.zeros(num_workers, dtype=bool)

    def observe(self, batch, seconds) -> None:
        col = self._seen % self.window
        self._b[:, col] = batch
        self._t[:, col] = seconds
        self._seen += 1
        due = (self._seen - self._group) % self._period == 0
        if due.any() or not self.known.all():
            self._refit(due)

    def _refit(self, due) -> None:
        """Refit the workers ``due`` (a mask) and up to ``rows`` of those whose cost is
        not known yet."""
        ok_all = np.isfinite(self._b) & np.isfinite(self._t) & (self._t > 0)
        count = ok_all.sum(axis=1)
        per = np.maximum(count, 1)
        mean = np.where(ok_all, self._b, 0.0).sum(axis=1) / per
        spread = np.sqrt(np.where(ok_all, (self._b - mean[:, None]) ** 2, 0.0).sum(axis=1)
                         / per)
        # only the workers whose batch sizes varied can show a fixed cost
        varied = (count >= 8) & (spread >= self.min_spread * mean)
        waiting = np.flatnonzero(varied & ~self.known & ~due)
        if len(waiting) > self.rows:             # they take turns
            start = (self._seen * self.rows) % len(waiting)
            waiting = np.roll(waiting, -start)[:self.rows]
        for i in np.concatenate([np.flatnonzero(varied & due), waiting]):
            ok = ok_all[i]
            b, t = self._b[i, ok], self._t[i, ok]
            middle = float(np.median(b))
            if np.count_nonzero(np.abs(b - middle) >= self.min_spread * middle) < 3:
                continue          # 3 or more away from the middle, not one short last batch
            slope, _ = pooled_slope(b[None, :], t[None, :], np.ones((1, len(b)), bool))
            if not (np.isfinite(slope) and slope > 0):
                continue
            level = float(np.median(t - slope * b))
            self.intercept[i] = min(max(level, 0.0), self.max_share * float(t.min()))
            self.known[i] = True
