"""Courier's question, answered from our own time models: which global batch B meets a deadline?

Courier (ICPE 2021) picks, once before a job starts, the smallest batch size whose predicted
job time meets a latency SLO: a larger batch finishes a fixed number of epochs sooner (the
per-iteration cost is amortised) but reaches a lower accuracy, so the smallest B that still
meets the deadline is the best one. Its predictions come from regressions fitted offline.

Here the prediction comes from the same per-worker time models that LB-BSP balances with::

    iteration_s(b) = makespan(split of b over the workers' time models) + sync_s
    finish_s(B)    = sum over the batches left, each at its own size b, of iteration_s(b)

where the batches left at B are, per epoch, floor(N / B) batches of B and one short batch of
the rest N mod B (the epoch's last), so it can be re-made while the job runs, whenever the
workers' predicted speeds change. :class:`BatchPlanner` adds a safety margin from the
measured spread of iteration times, and hysteresis with a bound on changes per epoch, so that
B moves only when a prediction says it must.

Pure numpy, no MXNet: used by the Courier mode's policy, by ``mxlbbsp plan`` and by tests.
The replay of a job's recorded global batches and learning-rate factors
(:func:`replay_from_metrics`) is here too.
"""
from __future__ import annotations

import logging
import math
import os
import re
import time
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from mxlbbsp.core import metrics as _metrics
from mxlbbsp.core import split as _split
from mxlbbsp.core import timemodel as _tm

_log = logging.getLogger(__name__)

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhd])", re.IGNORECASE)


class PlanError(ValueError):
    """Bad input to planning (a deadline, a batch range): one line that says what to do."""


def parse_duration(text: str, what: str = "--deadline") -> float:
    """Seconds in ``text``: '90s', '15m', '1h30m', '2.5h'. A unit is required."""
    raw = str(text).strip()
    if raw.startswith("-"):
        raise PlanError(f"{what} {text!r}: must be positive, e.g. {what} 15m")
    pos, total = 0, 0.0
    for match in _DURATION.finditer(raw):
        if raw[pos:match.start()].strip():
            break
        total += float(match.group(1)) * _UNITS[match.group(2).lower()]
        pos = match.end()
    if pos == 0 or raw[pos:].strip():
        raise PlanError(f"{what} {text!r}: give a duration with a unit (s, m, h, d), e.g. "
                        f"{what} 15m or {what} 1h30m")
    if not math.isfinite(total) or total <= 0:
        raise PlanError(f"{what} {text!r}: must be positive, e.g. {what} 15m")
    return total


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "inf"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def parse_batch_range(text: str, num_workers: Optional[int] = None) -> tuple:
    """(lo, hi) from 'LO:HI' with 1 <= LO <= HI (and LO >= the number of workers)."""
    lo_s, sep, hi_s = str(text).partition(":")
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        lo = hi = None
    if not sep or lo is None:
        raise PlanError(f"--batch-range {text!r}: expected MIN:MAX global batch sizes, e.g. "
                        "--batch-range 64:1024")
    if lo < 1 or hi < lo:
        raise PlanError(f"--batch-range {text!r}: the range is empty or inverted; give "
                        "1 <= MIN <= MAX, e.g. --batch-range 64:1024")
    if num_workers is not None and lo < num_workers:
        raise PlanError(f"--batch-range {text!r}: the minimum {lo} is below the number of "
                        f"workers ({num_workers}); every worker needs at least one sample, so "
                        f"use a minimum >= {num_workers}")
    return lo, hi


def candidates(lo: int, hi: int, per_octave: int = 4) -> np.ndarray:
    """Global batch sizes to consider: a geometric grid from ``lo`` to ``hi`` (both in),
    ``per_octave`` sizes per doubling (Courier's grid is {64, 128, 256, 512})."""
    if hi <= lo:
        return np.array([lo], dtype=np.int64)
    steps = max(1, int(math.ceil(math.log2(hi / lo) * per_octave)))
    grid = np.round(lo * (hi / lo) ** (np.arange(steps + 1) / steps)).astype(np.int64)
    return np.unique(np.clip(grid, lo, hi))


class Work(NamedTuple):
    """What is left to train: the rest of this epoch, then ``epochs`` whole epochs (may be
    fractional) of ``epoch_size`` samples. The last global batch of an epoch is short."""

    in_epoch: int
    epoch_size: int
    epochs: float = 0.0

    def iterations(self, batch: int) -> float:
        return sum(count for _, count in self.batches(batch))

    def batches(self, batch: int, min_size: int = 1) -> List[tuple]:
        """[(size, count)]: the global batches left at ``batch``: those of the rest of this
        epoch, then per epoch floor(N / batch) of ``batch`` and the short last one (the
        epoch's rest; ``count`` is fractional for a fraction of an epoch). A rest smaller
        than ``min_size`` (the number of workers) joins the batch before it, as the courier
        mode does."""
        out: dict = {}

        def add(samples: int, times: float) -> None:
            if samples <= 0 or times <= 0:
                return
            full, rest = divmod(int(samples), int(batch))
            if 0 < rest < min_size:
                if full:
                    full -= 1
                    rest += batch
            if full:
                out[batch] = out.get(batch, 0.0) + full * times
            if rest:
                out[rest] = out.get(rest, 0.0) + times

        add(max(self.in_epoch, 0), 1.0)
        add(self.epoch_size, float(self.epochs))
        return sorted(out.items(), reverse=True)

    @property
    def samples(self) -> float:
        return max(self.in_epoch, 0) + self.epoch_size * self.epochs


class Row(NamedTuple):
    """One candidate of the plan."""

    batch: int
    iteration_s: float      # predicted: LB-BSP makespan of the batch + push/pull
    finish_s: float         # predicted time of the remaining work at this batch
    meets: bool             # finish_s <= the time left (True when there is no deadline)


def plan(model: _tm.TimeModel, sync_s: float, work: Work, batches: Sequence[int],
         time_left: Optional[float] = None, max_batch=None) -> List[Row]:
    """The predicted iteration and finish times of each candidate global batch.

    ``model``: the workers' time models; ``sync_s``: the measured push/pull time of an
    iteration; ``max_batch``: per-worker caps (None: none). A batch that cannot be split
    within the caps gets an infinite time.
    """
    n = len(model.speed)
    cache: dict = {}

    def iteration_s(b: int) -> float:
        if b not in cache:
            try:
                split = _split.solve(model, b, 1, max_batch)
                cache[b] = _tm.makespan(model, split) + max(float(sync_s), 0.0)
            except _split.SplitError:
                cache[b] = math.inf
            if b < n:
                cache[b] = math.inf
        return cache[b]

    rows = []
    for B in batches:
        B = int(B)
        it = iteration_s(B)
        finish = 0.0 if math.isfinite(it) else math.inf
        if math.isfinite(it):
            # the short last batch of an epoch costs what a batch of its size costs
            finish = sum(count * iteration_s(b) for b, count in work.batches(B, n))
        rows.append(Row(B, it, finish, time_left is None or finish <= time_left))
    return rows


def choose(rows: Sequence[Row]) -> tuple:
    """(batch, meets): the smallest batch that meets the deadline, else the fastest one."""
    meeting = [r for r in rows if r.meets]
    if meeting:
        return min(meeting, key=lambda r: r.batch).batch, True
    return min(rows, key=lambda r: (r.finish_s, -r.batch)).batch, False


class BatchPlanner:
    """Re-plans the global batch as the job runs: B moves only when a prediction says it must.

    Every iteration it computes :func:`plan` for the remaining work and the time left, and:

    * **margin**: a batch is chosen when it finishes within (1 - margin) of the time left.
      With ``margin=None`` (the default) the margin follows the measured spread of iteration
      times: ``MARGIN_Z`` x the coefficient of variation of measured / predicted iteration
      time over the last ``WINDOW`` iterations (:meth:`observe`), within
      [``MIN_MARGIN``, ``MAX_MARGIN``] (``START_MARGIN`` before ``MIN_OBSERVED`` are in).
      The predictions are also corrected by the median of that ratio (a cluster that is
      steadily 10 % slower than its time models predict is planned as such);
    * moves **up** at once to the smallest batch that meets the deadline with the whole
      margin when the current one is predicted to miss the deadline itself; when it is only
      predicted to eat into half the margin, it moves up the same way once ``min_interval``
      iterations have passed since the last change (hysteresis: noise moves a prediction
      across one line, not across the band between them);
    * moves **down** only when, at each of the last ``every`` plans, a batch at least
      ``min_step`` times smaller met the deadline with the whole margin, then to the largest
      of those, and only ``min_interval`` iterations or more after the last change;
    * when no batch meets the deadline, takes the fastest one and says so (``missing``).

    The rate of change is limited in time and evidence, not per epoch (as goodput's): with
    steady speeds (no prediction of an outright miss) B changes at most once per
    ``min_interval`` iterations, and only on a prediction outside the margin.
    """

    START_MARGIN = 0.1
    MIN_MARGIN, MAX_MARGIN = 0.03, 0.3
    MARGIN_Z = 1.5
    WINDOW = 50
    MIN_OBSERVED = 5

    def __init__(self, lo: int, hi: int, every: int = 5, margin: Optional[float] = None,
                 min_step: float = 1.15, per_octave: int = 4, min_interval: int = 5):
        if margin is not None and not 0 <= margin < 1:
            raise ValueError("margin must be in [0, 1)")
        self.lo, self.hi = int(lo), int(hi)
        self.every = max(1, int(every))
        self.fixed_margin = margin
        self.min_step = float(min_step)
        self.min_interval = max(1, int(min_interval))
        self.batches = candidates(self.lo, self.hi, per_octave)
        self.current: Optional[int] = None
        self.missing = False              # no candidate meets the deadline
        self.last_rows: List[Row] = []
        self.changes = 0                  # every change of B so far
        self.plans = 0
        self._now = 0
        self._changed_at: Optional[int] = None
        self._down: List[int] = []
        self._ratios: List[float] = []

    # ---- what the iterations measured --------------------------------------------------

    def observe(self, measured_s: float, predicted_s: float) -> None:
        """One iteration's measured time against the time predicted for it."""
        if (math.isfinite(measured_s) and math.isfinite(predicted_s) and measured_s > 0
                and predicted_s > 0):
            self._ratios.append(measured_s / predicted_s)
            del self._ratios[:-self.WINDOW]

    @property
    def bias(self) -> float:
        """Median measured / predicted iteration time (1 until enough are observed)."""
        if len(self._ratios) < self.MIN_OBSERVED:
            return 1.0
        return float(np.clip(np.median(self._ratios), 0.5, 2.0))

    @property
    def margin(self) -> float:
        if self.fixed_margin is not None:
            return self.fixed_margin
        if len(self._ratios) < self.MIN_OBSERVED:
            return self.START_MARGIN
        r = np.asarray(self._ratios)
        cv = float(np.std(r) / np.mean(r))
        return float(np.clip(self.MARGIN_Z * cv, self.MIN_MARGIN, self.MAX_MARGIN))

    # ---- choosing ----------------------------------------------------------------------

    def update(self, model: _tm.TimeModel, sync_s: float, work: Work, time_left: float,
               max_batch=None, force: bool = False, iteration: Optional[int] = None) -> int:
        """The global batch for the next iteration (``iteration``: its number, which
        ``min_interval`` counts in; default: the count of plans)."""
        self.plans += 1
        self._now = self.plans if iteration is None else int(iteration)
        rested = self._changed_at is None or self._now - self._changed_at >= self.min_interval
        # predictions corrected by what the iterations measured: compare against the time
        # left over the bias instead of scaling every row
        budget = max(time_left, 0.0) / self.bias
        margin = self.margin
        rows = plan(model, sync_s, work, self.batches, budget * (1.0 - margin), max_batch)
        bias = self.bias
        self.last_rows = [r._replace(iteration_s=r.iteration_s * bias,
                                     finish_s=r.finish_s * bias) for r in rows]
        best, meets = choose(rows)
        self.missing = not meets
        cur = self.current
        if cur is None or force:
            self.current, self._down = best, []
            return best
        row = next((r for r in rows if r.batch == cur), None)
        keep = row is not None and row.finish_s <= budget * (1.0 - margin / 2)
        if not keep:
            # Behind: move at once (to the smallest that meets it, or the fastest) when the
            # current B is predicted to miss the deadline itself; when it only eats into the
            # margin, only once min_interval iterations passed since the last change.
            self._down = []
            must = row is None or row.finish_s > budget
            if must or rested:
                return self._change(best)
            return self.current
        # Ahead: a smaller batch only after it met the deadline at every one of the last
        # `every` plans, then the largest of those choices (the most cautious), and only
        # once min_interval iterations passed since the last change.
        if meets and best * self.min_step <= cur:
            self._down.append(best)
        else:
            self._down = []
        if len(self._down) >= self.every and rested:
            pick, self._down = max(self._down), []
            return self._change(pick)
        return self.current

    def _change(self, batch: int) -> int:
        if batch != self.current:
            self.changes += 1
            self._changed_at = self._now
            self.current = batch
        return self.current

    def predicted_finish(self, batch: Optional[int] = None) -> float:
        """Predicted seconds to finish at ``batch`` (the current one by default)."""
        batch = self.current if batch is None else batch
        for r in self.last_rows:
            if r.batch == batch:
                return r.finish_s
        return math.nan


def iteration_time(model: _tm.TimeModel, sync_s: float, batch: int, max_batch=None) -> float:
    """The predicted time of one iteration of global batch ``batch`` (inf: no split)."""
    return plan(model, sync_s, Work(0, int(batch), 0.0), [int(batch)], None,
                max_batch)[0].iteration_s


def iteration_times(model: _tm.TimeModel, sync_s: float, batches, max_batch=None,
                    least: int = 1) -> np.ndarray:
    """The predicted seconds per iteration of every global batch in ``batches`` at once:
    LB-BSP's makespan over ``model`` plus ``sync_s``, in numpy, for goodput's many
    candidates on the coordinator's thread (each :func:`iteration_time` solves one integer
    split; this is one sort of the workers and one search per batch).

    The makespan is the continuous one: the least T with sum_i clip(v_i (T - a_i), l, c_i)
    >= B, l = ``least`` // n samples per worker (the split's minimum), c_i its cap
    (``max_batch``), and at least every worker's time at l. The integer split's is at most
    one sample per worker more (max_i 1/v_i seconds). Infinite below ``least`` or n, or
    above the caps."""
    v = np.asarray(model.speed, dtype=float)
    a = np.maximum(np.asarray(model.intercept, dtype=float), 0.0)
    B = np.asarray(batches, dtype=float)
    n = len(v)
    out = np.full(B.shape, np.inf)
    if n == 0 or not (np.all(np.isfinite(v)) and np.all(v > 0)):
        return out
    low = max(int(least) // n, 1)
    cap = np.full(n, np.inf) if max_batch is None else \
        np.broadcast_to(np.asarray(max_batch, dtype=float), (n,))
    # f(T), the samples the workers finish by T, is piecewise linear: worker i adds v_i per
    # second from p_i (its time at l samples) to q_i (its time at its cap)
    p = a + low / v
    q = a + cap / v
    when = np.concatenate([p, q])
    rate = np.concatenate([v, -v])
    keep = np.isfinite(when)
    when, rate = when[keep], rate[keep]
    order = np.argsort(when, kind="stable")
    when, rate = when[order], rate[order]
    slope = np.cumsum(rate)                        # on [when[k], when[k+1])
    done = n * low + np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(when))])
    k = np.searchsorted(done, B, side="left") - 1   # the last event with done < B
    k = np.clip(k, 0, len(done) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        T = np.where(slope[k] > 0, when[k] + (B - done[k]) / slope[k], np.inf)
    T = np.where(B <= n * low, when[0], T)
    T = np.maximum(T, float(np.max(p)))
    ok = (B >= max(int(least), n)) & (B <= np.sum(cap))
    out[ok] = T[ok] + max(float(sync_s), 0.0)
    return out


def launch_clock() -> float:
    """``time.monotonic()`` of the moment this process started (the launch, for the
    launcher): a deadline counts from there, not from when the coordinator is built.

    From /proc (the process's start in clock ticks since boot against the uptime: 10 ms
    resolution; psutil's create_time rounds the boot time to the second); where there is no
    /proc, now."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age = 0.0
    return time.monotonic() - max(age, 0.0)


def replay_from_metrics(path: str) -> Tuple[List[int], List[float]]:
    """(B(0), B(1), ...; the learning-rate factor of each iteration) of a job, from its
    metrics file: the sum of the workers' batches of each iteration, and the ``lr_factor``
    its workers applied (rank 0's record; 1 where none was recorded), for a single process
    to replay both exactly (the factor of ``--lr-scaling adascale`` came from the job's
    coordinator, so only the record has it)."""
    totals: dict = {}
    factors: dict = {}
    for rec in _metrics.load(path):
        t = int(rec["iteration"])
        totals[t] = totals.get(t, 0) + int(rec["batch_size"])
        if rec.get("rank") == 0 or t not in factors:
            f = rec.get("lr_factor")
            factors[t] = float(f) if isinstance(f, (int, float)) and f > 0 else 1.0
    if sorted(totals) != list(range(len(totals))):
        raise PlanError(f"{path}: the iterations are not 0..{len(totals) - 1}; give the "
                        "metrics file of one whole job")
    return [totals[t] for t in range(len(totals))], [factors[t] for t in range(len(totals))]
