"""``goodput``: the coordinator chooses the global batch B(t) for the fastest progress.

Pollux (OSDI'21) chooses the batch that maximises *goodput*, throughput times statistical
efficiency; here the throughput is LB-BSP's on the heterogeneous workers (Cannikin's point,
Middleware'24) and the efficiency comes from the gradient noise scale measured from the
workers' own, unequal, local batches (:mod:`mxlbbsp.core.noise`)::

    goodput(B) = B / (LB-BSP makespan of B over the workers' time models + push/pull)
                 * (phi + B0) / (phi + B)

for each candidate B in ``--batch-range`` (Courier's geometric grid), phi = tr(Sigma)/|G|^2
the smoothed noise scale (the cautious one, ``NoiseScale.noise_scale_low``, recorded as
``noise_scale``; the point estimate as ``noise_scale_point``), B0 the DataLoader's
``global_batch_size``. ``--goodput-model
homo`` instead predicts the iteration time of an *equal* split (the slowest worker's time at
B/n: what a model of equal replicas such as AdaptDL's measures on these workers); the split
is LB-BSP's either way, so the two differ only in the B they choose.

The workers' time models are the split's (the predictor's speeds), with each worker's fixed
cost per iteration (a_i in t_i(b) = a_i + b/v_i) from a robust fit of its compute times
against its batch sizes over the last ``FIT_WINDOW`` iterations (``core.timemodel.
FixedCostFit``), for the throughput only (the split itself keeps the split's model). The
split's default linear model reads a fixed cost as slowness, which makes a small B look
cheaper than it is (seen on the digits MLP: predicted 19 ms at B=32 where 22 were measured,
67 ms at B=128 where 59 were), and moved B too far down. The fit needs batch sizes
that varied; so while a worker's cost is not known yet and B has not moved, B probes around
the start B (the candidates next below and above it, in turn, for at most ``EXPLORE``
iterations: the local batches vary by about a fifth, at a goodput within a few per cent),
and the fit looks at every iteration until it knows each cost. Where ``auto``'s fixed-cost
regime gives the split equal or alike speeds, the throughput starts from the measured
compute times instead of the split's model. The push/pull time is the least any worker
measured in an iteration (see :class:`~mxlbbsp.modes.lbbsp.BatchChoosingPolicy`).

Stability: B moves when the planner sees a candidate whose goodput beats the current
B's by more than ``GoodputPlanner.MIN_GAIN`` wherever the noise scale lies within its error
bar (``NoiseScale.noise_scale_range``), then to the best such candidate, up or down, at most
once per ``every`` iterations (:class:`GoodputPlanner`). While a fixed cost is not known,
the throughput has an error bar too: the move must also win with each such cost at its
largest possible value (0.8 of the worker's time; its default is 0), so that an unseen fixed
cost cannot make a small B look cheap (every job used to go to the range's minimum at its
first plan, 6 iterations in, and creep back). And it must win under the last plan's
throughput model as well as this one's: on a loaded machine a worker with a sample or two
of the batch shows almost only its fixed cost, and one plan's model could make B=128 look
best where the next one's made it 38 (seen: 13 moves in 105 iterations of a digits MLP at
1:1:3 beside two busy loops, 2-6 with this). The rate is limited by evidence and
time, not by epochs, so B follows a noise scale that keeps growing, and comes down when the
noise scale falls or the throughput model changes (a worker slows down, or leaves). Before
the noise scale (with its error bar) and the push/pull time are known (the first
iterations), B0 clipped into the range is kept.

Off the critical path: the split of t+2 goes out at the B chosen last time
(:meth:`GoodputPolicy.plan`); the next choice is made after it (``after_split``), every
``PLAN_EVERY`` iterations, every candidate scored at once in numpy
(:meth:`IterationModel.many`), and the fixed costs refitted every ``FIT_EVERY``
iterations: the coordinator's work per iteration stays close to LB-BSP's, so that the
workers wait for their slices no longer than under LB-BSP at a fixed B (on a loaded
machine any of the coordinator's CPU can become their wait).

Noise: every worker reports |sum of its local per-sample gradients|^2 (``grad_sqr``, one
scalar, computed only in this mode); rank 0 reports the same of the global sum after the
pull (``global_grad_sqr`` in its ``done``).

Learning rate (``--lr-scaling``, default ``adascale``): AdaScale's gain
r(B) = (phi/B0 + 1)/(phi/B + 1) (:func:`mxlbbsp.core.lr.adascale`), with the same phi the
batch is chosen by, so that the progress per sample is the efficiency the choice assumed.
It depends on the coordinator's estimate, so the coordinator sends it to every worker (an
``lr`` message, just before each split: ``{iteration, factor}``); the workers apply it and
report it (``lr_factor`` in the metrics), and a single process replaying the job's metrics
applies the recorded factors. Before phi is known, sqrt(B/B0). The rules of B alone
(``linear``, ``sqrt``, ``none``) are computed by the workers, as in Courier.
"""
from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional

import numpy as np

from mxlbbsp.core import env as _env
from mxlbbsp.core import lr as _lr
from mxlbbsp.core import noise as _noise
from mxlbbsp.core import planner as _planner
from mxlbbsp.core import split as _split
from mxlbbsp.core import timemodel as _tm

from ._api import Option, SyncMode, register
from .lbbsp import (
    BATCH_RANGE_OPTION,
    LR_SCALING_OPTION,
    BatchChoosingPolicy,
    batch_range_problem,
)

log = logging.getLogger(__name__)

DEFAULTS = {"batch_range": "64:1024", "lr_scaling": _lr.ADASCALE, "goodput_model": "hetero",
            "every": 4}
GOODPUT_MODELS = ("hetero", "homo")
#: iterations of (batch, compute time) per worker the fixed costs are fitted over: long, as
#: the batch sizes vary seldom (an epoch's last batch, a change of B)
FIT_WINDOW = 128
#: the fixed costs are refitted every this many iterations (a refit costs about half a
#: millisecond per worker, on the coordinator's thread)
FIT_EVERY = 16
#: the planner scores the candidates every this many iterations (B may move once per
#: ``every`` iterations, 4 by default): less of the coordinator's time per iteration, which
#: on a loaded machine is what the workers wait for
PLAN_EVERY = 4
#: at most this many iterations probe around the start B while a worker's fixed cost is
#: not known (the fit needs batch sizes that vary; ``GoodputPolicy._exploring``)
EXPLORE = 32
#: the message that carries the learning-rate factor of an iteration (adascale)
LR_MESSAGE = "lr"


def with_fixed_costs(model: _tm.TimeModel, fixed: np.ndarray, split,
                     now=None) -> _tm.TimeModel:
    """``model`` with each worker's fixed cost ``fixed`` (seconds; where ``model`` has none),
    its time at its batch in ``split`` unchanged (or ``now``, the measured times, where the
    model's times are not each worker's own): a_i within [0, 0.8 t_i(b_i)], and the rest
    of t_i(b_i) over b_i samples the marginal speed."""
    b = np.maximum(np.asarray(split, dtype=float), 1.0)
    if now is None:
        now, own = model.time(b), np.asarray(model.intercept, dtype=float)
    else:
        now, own = np.asarray(now, dtype=float), np.zeros(len(b))
    a = np.where(own > 0, own,
                 np.clip(np.nan_to_num(np.asarray(fixed, dtype=float)), 0.0, 0.8 * now))
    return _tm.TimeModel(b / np.maximum(now - a, 1e-12), a)


def equal_split_time(model: _tm.TimeModel, sync_s: float, batch: int) -> float:
    """The iteration time of an equal split of ``batch``: the slowest worker's a_i +
    (B/n)/v_i, plus the push/pull (the homogeneous throughput model)."""
    if int(batch) < len(model.speed):
        return math.inf
    split = _split.equal_split(int(batch), len(model.speed))
    return float(np.max(model.time(split))) + max(float(sync_s), 0.0)


def equal_split_times(model: _tm.TimeModel, sync_s: float, batches) -> np.ndarray:
    """:func:`equal_split_time` of every batch in ``batches`` at once."""
    B = np.asarray(batches, dtype=np.int64)
    n = len(model.speed)
    base, extra = np.divmod(B, n)
    splits = base[:, None] + (np.arange(n)[None, :] < extra[:, None])
    times = np.max(model.intercept + splits / model.speed, axis=1) + max(float(sync_s), 0.0)
    return np.where(B >= n, times, np.inf)


class IterationModel:
    """B -> predicted iteration time under the ``hetero`` (LB-BSP makespan) or ``homo``
    (equal split) throughput model; infinite below ``least`` (the split's minimum).

    Called with one B it solves that batch's integer split (``mxlbbsp plan``'s table);
    :meth:`many` gives every candidate at once in numpy (the planner's, on the
    coordinator's thread: see :func:`mxlbbsp.core.planner.iteration_times`)."""

    def __init__(self, kind: str, model: _tm.TimeModel, sync_s: float, max_batch=None,
                 least: int = 1):
        self.kind, self.model, self.sync_s = kind, model, float(sync_s)
        self.max_batch, self.least = max_batch, int(least)

    def __call__(self, B: int) -> float:
        if B < self.least:
            return math.inf
        if self.kind == "homo":
            return equal_split_time(self.model, self.sync_s, B)
        return _planner.iteration_time(self.model, self.sync_s, B, self.max_batch)

    def many(self, batches) -> np.ndarray:
        batches = np.asarray(batches, dtype=np.int64)
        if self.kind == "homo":
            out = equal_split_times(self.model, self.sync_s, batches)
        else:
            out = _planner.iteration_times(self.model, self.sync_s, batches, self.max_batch,
                                           self.least)
        return np.where(batches >= self.least, out, np.inf)


def iteration_model(kind: str, model: _tm.TimeModel, sync_s: float, max_batch=None,
                    least: int = 1) -> IterationModel:
    """B -> predicted iteration time (an :class:`IterationModel`)."""
    return IterationModel(kind, model, sync_s, max_batch, least)


class GoodputPlanner:
    """Chooses B among Courier's candidates by goodput.

    Every plan scores every candidate (in numpy) at the noise scale B goes by, and B moves
    to the candidate of the most goodput among those that beat the current B by more than
    ``min_gain`` wherever the noise scale lies within its error bar (``phi_range``: the
    ratio of two batches' goodputs is monotone in phi, so its two ends decide), up or down,
    at most once per ``min_interval`` iterations. So B follows the noise scale as far as
    the evidence goes, and as often as it changes; an estimate still uncertain moves it
    less far or not at all; and a new throughput model (a worker slows down, or leaves)
    moves it at the next plan. ``min_gain`` covers the throughput model's own error.
    """

    #: the least goodput gain a move must promise on top of the noise scale's error bar
    MIN_GAIN = 0.02

    def __init__(self, lo: int, hi: int, base_batch: int, min_interval: int = 4,
                 per_octave: int = 4, min_gain: float = MIN_GAIN):
        self.lo, self.hi = int(lo), int(hi)
        self.base_batch = int(base_batch)
        self.min_interval = max(1, int(min_interval))
        self.min_gain = float(min_gain)
        self.batches = _planner.candidates(self.lo, self.hi, per_octave)
        self.current = int(min(max(base_batch, self.lo), self.hi))
        #: the last plan's candidates and their (iteration time, throughput, efficiency,
        #: goodput), as arrays (rows are built only when asked for: ``last_rows``)
        self._last: Optional[tuple] = None
        self.changes = 0
        self.plans = 0
        self._changed_at: Optional[int] = None

    def _scores(self, iteration_s, phi: float):
        """(batches, iteration times, throughputs) of the candidates and the current B."""
        batches = np.union1d(self.batches, [self.current])
        if hasattr(iteration_s, "many"):
            times = np.asarray(iteration_s.many(batches), dtype=float)
        else:
            times = np.array([float(iteration_s(int(b))) for b in batches])
        with np.errstate(divide="ignore", invalid="ignore"):
            thr = np.where(np.isfinite(times) & (times > 0), batches / times, 0.0)
        return batches, times, thr

    def _goodput(self, batches, thr, phi: float) -> np.ndarray:
        return thr * _noise.efficiency(phi, batches, self.base_batch)

    def rows(self, iteration_s, phi: float) -> List[_noise.GoodputRow]:
        batches, times, thr = self._scores(iteration_s, phi)
        eff = _noise.efficiency(phi, batches, self.base_batch)
        return [_noise.GoodputRow(int(b), float(it), float(r), float(e), float(r * e))
                for b, it, r, e in zip(batches, times, thr, eff)]

    def update(self, iteration_s, phi: float, phi_range=None, iteration: Optional[int] = None,
               force: bool = False, also=()) -> int:
        """The batch of the next iteration, given B -> iteration time (a callable, or an
        :class:`IterationModel`), phi and its error bar ``phi_range`` (low, high; None: phi
        is taken as exact); ``iteration``: the one being planned (default: the count of
        plans), which ``min_interval`` counts in. ``also``: other B -> iteration time
        models the throughput may be as well (the ends of its own uncertainty: a fixed cost
        not known yet); a move must beat the current B under each of them too."""
        self.plans += 1
        now = self.plans if iteration is None else int(iteration)
        batches, times, thr = self._scores(iteration_s, phi)
        eff = _noise.efficiency(phi, batches, self.base_batch)
        good = thr * eff
        self._last = (batches, times, thr, eff, good)
        if force:
            self._move(int(batches[int(np.argmax(good))]), now)
            return self.current
        if self._changed_at is not None and now - self._changed_at < self.min_interval:
            return self.current
        here = int(np.searchsorted(batches, self.current))
        worst = np.full(len(batches), np.inf)
        ends = [phi] + [x for x in (phi_range or ()) if not (isinstance(x, float)
                                                              and math.isnan(x))]
        throughputs = [thr] + [self._scores(other, phi)[2] for other in also]
        for end in ends:
            for rate in throughputs:
                g = self._goodput(batches, rate, end)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(g[here] > 0, g / g[here], np.where(g > 0, np.inf, 1.0))
                worst = np.minimum(worst, ratio)
        better = worst > 1.0 + self.min_gain
        if better.any():
            pick = int(np.argmax(np.where(better, good, -np.inf)))
            self._move(int(batches[pick]), now)
        return self.current

    def _move(self, batch: int, now: int) -> None:
        if batch != self.current:
            self.changes += 1
            self._changed_at = now
        self.current = batch

    @property
    def last_rows(self) -> List[_noise.GoodputRow]:
        """The last plan's candidates (the current B among them), as rows."""
        if self._last is None:
            return []
        return [_noise.GoodputRow(int(b), float(it), float(r), float(e), float(g))
                for b, it, r, e, g in zip(*self._last)]

    def row(self, batch: Optional[int] = None) -> Optional[_noise.GoodputRow]:
        """The last plan's row of ``batch`` (default: the current B), if it scored it."""
        batch = self.current if batch is None else batch
        if self._last is None:
            return None
        at = np.flatnonzero(self._last[0] == batch)
        if not len(at):
            return None
        b, it, r, e, g = (x[at[0]] for x in self._last)
        return _noise.GoodputRow(int(b), float(it), float(r), float(e), float(g))


class GoodputPolicy(BatchChoosingPolicy):
    """Chooses B(t+2) by goodput from the reports of t, then splits it as LB-BSP
    does."""

    def __init__(self, coordinator, options=None):
        super().__init__(coordinator, options)
        opts = self.resolved(DEFAULTS, Goodput.check_options)
        self.lo, self.hi = _planner.parse_batch_range(opts["batch_range"])
        self.kind = opts["goodput_model"]
        self.every = int(opts["every"])
        self.rule = opts["lr_scaling"]
        self.planner: Optional[GoodputPlanner] = None
        self.noise: Optional[_noise.NoiseScale] = None
        #: each worker's fixed cost per iteration, fitted from its batches and compute times
        self.fit = _tm.FixedCostFit(self.num_workers, window=FIT_WINDOW, every=FIT_EVERY)
        #: (iteration, time models, split sent) for after_split
        self._to_plan: Optional[tuple] = None
        #: the last plan's B -> iteration time (a move must win under it too)
        self._last_fn: Optional[IterationModel] = None
        #: the iteration the planner chose for last (it plans every PLAN_EVERY iterations)
        self._planned: Optional[int] = None
        #: the first iteration that could probe around the start B (``_exploring``)
        self._explore_from: Optional[int] = None
        self._probes = 0
        #: iteration -> {rank: (local batch, |local gradient sum|^2)}, and the global one
        self._local: Dict[int, Dict[int, tuple]] = {}
        self._global: Dict[int, float] = {}
        #: iteration -> the figures recorded with it
        self.noted: Dict[int, dict] = {}

    def validate(self, hellos):
        problem = super().validate(hellos)
        if problem:
            return problem
        B0 = int(hellos[0]["global_batch_size"])
        self.noise = _noise.NoiseScale(B0)
        self.planner = GoodputPlanner(self.lo, self.hi, B0, min_interval=self.every)
        return None

    # ---- noise -------------------------------------------------------------------------

    def on_report(self, rank, msg):
        s = msg.get("grad_sqr")
        if isinstance(s, (int, float)) and math.isfinite(s) and s >= 0:
            t = int(msg["iteration"])
            self._local.setdefault(t, {})[rank] = (int(msg["batch_size"]), float(s))
            self._take(t)

    def on_done(self, rank, msg):
        super().on_done(rank, msg)
        t = int(msg["iteration"])
        g = msg.get("global_grad_sqr")
        if rank == 0 and isinstance(g, (int, float)) and math.isfinite(g) and g >= 0:
            self._global[t] = float(g)
            self._take(t)

    def _take(self, t: int) -> None:
        """Iteration t's norms into the estimate, once all n local ones and the global
        one are in."""
        local = self._local.get(t, {})
        if len(local) < self.num_workers or t not in self._global or self.noise is None:
            return
        split = [local[r][0] for r in range(self.num_workers)]
        sqr = [local[r][1] for r in range(self.num_workers)]
        point = self.noise.update(sqr, split, self._global.pop(t), sum(split))
        del self._local[t]
        for old in [k for k in self._local if k < t - 64]:
            del self._local[old]
        for old in [k for k in self._global if k < t - 64]:
            del self._global[old]
        if point is not None:
            self.noted.setdefault(t, {})["noise_point"] = [point.sqr, point.var]

    # ---- iterations --------------------------------------------------------------------

    def _observe_times(self):
        """The decided iteration's batches and compute times (the coordinator's) into the
        fit; (batches, compute times), None when a compute time is not finite."""
        batch, compute = self.coordinator.measured
        if not np.isfinite(compute).all():
            return None
        self.fit.observe(batch, compute)
        return batch, compute

    def plan(self, t, model, next_B, in_force):
        """The split of t+1+ahead at the B the planner chose last time, sent at once; the
        next choice is made in :meth:`after_split`, off the workers' path: a change of B
        takes effect one iteration later."""
        target = t + 1 + self.ahead
        B = self.totals.get(target - 1, self.lo) if self.planner is None \
            else self.planner.current
        if self._exploring(target, self._unknown(model)):
            B = self._probe()
        split = self._split_and_send(t, model, B, next_B)
        self._to_plan = (t, model, split)
        return split

    def _unknown(self, model) -> np.ndarray:
        """The workers whose fixed cost neither the split's model nor the fit knows (the
        fit alone where the split's model is not each worker's own: auto's fixed-cost
        regime, whose common line the throughput does not start from)."""
        if not self._per_worker:
            return ~self.fit.known
        return ~self.fit.known & ~(np.asarray(model.intercept) > 0)

    @property
    def _per_worker(self) -> bool:
        return bool(getattr(self.coordinator.speed, "per_worker", True))

    def _exploring(self, target: int, unknown: np.ndarray) -> bool:
        """Whether B(target) probes around the start B: while a worker's fixed cost is not
        known, B has not moved yet, and for at most ``EXPLORE`` iterations."""
        if self.planner is None or self.planner.changes or self.lo >= self.hi:
            return False
        if self._explore_from is None:
            self._explore_from = target
        return target - self._explore_from < EXPLORE and bool(unknown.any())

    def _probe(self) -> int:
        """The candidate next below the current B and the one next above it, in turn, one
        per split sent (the current B where there is none): the local batch sizes vary by about a fifth,
        which the fit needs, at a goodput within a few per cent of the current B's."""
        cands = self.planner.batches
        now = self.planner.current
        below = cands[(cands < now) & (cands >= self.least)]
        above = cands[cands > now]
        self._probes += 1             # in turn per split sent (a lease holds one for several)
        if self._probes % 2:
            return int(below[-1]) if len(below) else now
        return int(above[0]) if len(above) else now

    def after_split(self, t: int) -> None:
        """The planner's next choice from what iteration t measured (the split of t+1+ahead
        is out): the workers' time models with their fixed costs, the push/pull time, the
        noise scale and its error bar."""
        if self._to_plan is None or self._to_plan[0] != t:
            return
        _, model, split = self._to_plan
        self._to_plan = None
        target = t + 1 + self.ahead
        # the split goes by the split's model; the throughput, with the fixed costs
        measured = self._observe_times()
        note = self.noted.setdefault(target, {})
        for old in [k for k in self.noted if k < t - 64]:
            del self.noted[old]
        phi = self.phi
        if self._planned is not None and target - self._planned < PLAN_EVERY:
            return
        also = []
        if measured is not None:
            batches, compute = measured
            # where the split's model is not each worker's own line (auto's fixed-cost
            # regime: equal or alike speeds), the throughput starts from the measured times
            now = None if self._per_worker else compute
            unknown = self._unknown(model)         # after this iteration's observation
            if unknown.any():
                # the other end of what the fixed costs not known yet may be: the fit's
                # largest share of each one's time (with_fixed_costs' bound)
                high = with_fixed_costs(model, np.where(unknown, np.inf, self.fit.intercept),
                                        batches, now)
                also.append(high)
            model = with_fixed_costs(model, self.fit.intercept, batches, now)
            note["fixed_share"] = float(np.mean(model.intercept / model.time(batches)))
        if self.sync_s is not None and self.planner is not None and math.isfinite(phi):
            max_batch = self.coordinator.balancer.max_batch
            fn = iteration_model(self.kind, model, self.sync_s, max_batch, self.least)
            others = [iteration_model(self.kind, m, self.sync_s, max_batch, self.least)
                      for m in also]
            if self._last_fn is not None:
                # the last plan's throughput too: a move must hold on two plans' evidence
                others.append(self._last_fn)
            self.planner.update(fn, phi, self.noise.noise_scale_range, iteration=target,
                                also=others)
            self._last_fn = fn
            self._planned = target
        row = self.planner.row(int(np.sum(split))) if self.planner is not None else None
        if self.noise is not None and self.noise.known:
            point = self.noise.noise_scale
            note["noise_scale_point"] = point if math.isfinite(point) else None
            low, high = self.noise.noise_scale_range
            note["noise_scale_range"] = [low if math.isfinite(low) else None,
                                         high if math.isfinite(high) else None]
        if row is not None:
            note["goodput"] = row.goodput
            note["efficiency"] = row.efficiency

    @property
    def phi(self) -> float:
        """The noise scale B and the learning rate go by (the cautious one; nan unknown)."""
        return self.noise.noise_scale_low if self.noise is not None else math.nan

    def _before_split(self, iteration: int, split) -> None:
        """The noise scale of ``iteration`` noted (the one its B and learning rate go by);
        with ``--lr-scaling adascale``, its factor to every worker, before its split (so
        that a worker has it once it has its slice)."""
        phi = self.phi
        phi = phi if math.isfinite(phi) else None
        self.noted.setdefault(iteration, {})["noise_scale"] = phi
        if self.rule != _lr.ADASCALE or self.noise is None:
            return
        factor = _lr.adascale(phi, int(np.sum(split)), self.noise.base_batch)
        self.coordinator.broadcast({"type": LR_MESSAGE, "iteration": int(iteration),
                                    "factor": factor})

    def record_fields(self, t: int) -> dict:
        """Goodput's columns of the metrics record of iteration t."""
        note = self.noted.get(t, {})
        B = self.totals.get(t)
        phi = note.get("noise_scale")
        gain = None
        if phi is not None and self.noise is not None and B:
            gain = _noise.gain(phi, B, self.noise.base_batch)
        return {"batch_range": [self.lo, self.hi], "goodput_model": self.kind,
                "noise_scale": phi, "noise_scale_point": note.get("noise_scale_point"),
                "noise_scale_range": note.get("noise_scale_range"),
                "goodput": note.get("goodput"),
                "efficiency": note.get("efficiency"), "adascale_gain": gain,
                "noise_point": note.get("noise_point"), "fixed_share": note.get("fixed_share")}


@register
class Goodput(SyncMode):
    name = "goodput"
    label = "goodput"
    help = ("the coordinator chooses the global batch in --batch-range for the most goodput "
            "(throughput x statistical efficiency from the gradient noise), split as lbbsp "
            "(dist_sync)")
    uses_predictor = True
    sets_batch = True
    #: the workers report the squared norms of their gradient sums (mxlbbsp.trainer)
    grad_norms = True
    policy = GoodputPolicy
    options = (
        BATCH_RANGE_OPTION,
        LR_SCALING_OPTION,
        Option("goodput_model", "--goodput-model", type=GOODPUT_MODELS,
               help="the throughput model B is chosen with: hetero (default, the LB-BSP "
                    "makespan of the workers' time models) or homo (an equal split, as a "
                    "model of equal workers sees it)."),
    )

    @staticmethod
    def check_options(options: dict) -> Optional[str]:
        opts = dict(DEFAULTS, **{k: v for k, v in options.items() if v is not None})
        try:
            _planner.parse_batch_range(opts["batch_range"])
        except _planner.PlanError as exc:
            return str(exc)
        problem = _lr.rule_problem(opts["lr_scaling"], "goodput")
        if problem:
            return problem
        if opts["goodput_model"] not in GOODPUT_MODELS:
            return (f"--goodput-model {opts['goodput_model']!r}: choose one of "
                    f"{', '.join(GOODPUT_MODELS)}")
        return None

    # ---- the worker's half: the coordinator's learning-rate factors (adascale) ----------

    def attach(self, sess) -> Dict[int, float]:
        factors: Dict[int, float] = {}

        def take(msg: dict) -> None:           # the session's receiving thread
            t, f = msg.get("iteration"), msg.get("factor")
            if isinstance(t, int) and isinstance(f, (int, float)) and math.isfinite(f) \
                    and f > 0:
                factors[t] = float(f)
                for old in [k for k in factors if k < t - 4]:
                    del factors[old]

        sess.on(LR_MESSAGE, take)
        return factors

    def lr_factor(self, sess) -> Optional[float]:
        factors = sess.mode_half
        return factors.get(sess.iteration) if isinstance(factors, dict) else None

    def check_workers(self, options: dict, num_workers: int) -> Optional[str]:
        return batch_range_problem(options.get("batch_range") or DEFAULTS["batch_range"],
                                   num_workers)

    def misplaced(self, flags, sync) -> str:
        return (f"{', '.join(flags)}: only --sync goodput chooses the global batch by goodput; "
                f"--sync {sync} does not take {'them' if len(flags) > 1 else 'it'}. Drop "
                f"{'them' if len(flags) > 1 else 'it'} or use --sync goodput")

    def worker_env(self, options: dict) -> dict:
        rule = options.get("lr_scaling") or DEFAULTS["lr_scaling"]
        return {_env.LR_SCALING: rule}
