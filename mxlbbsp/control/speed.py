"""The speed model: the predictor, the time-model fit and the ``auto`` regime.

Per iteration, from the workers' batch sizes, compute times and exogenous load columns, it
gives the :class:`~mxlbbsp.core.timemodel.TimeModel` the mode splits the next batch by:

* ``linear``: each worker's predicted speed (samples/s), t(b) = b / v;
* ``affine``: t(b) = a + b / v, a the AffineFit's fixed cost, v the predicted marginal speed;
* ``auto`` (the default): the linear model, or while the fixed cost dominates the job
  (:class:`AutoRegime`) the job's one line, the same for every worker (the equal split)
  unless a worker is clearly slower, then the linear model with one speed for the workers
  none of which is clearly slower than another.

The fit and the regime are updated before the split (they decide it); the predictor's
training step (``learn``) comes after the split is sent.

With a separable predictor, the workers behind relays are forecast by their relays
(:mod:`mxlbbsp.relay.forecast`, :meth:`SpeedModel.hand_off`): the predictor here then runs
over the other workers only, the relays' forecasts come with the reports, and a checkpoint
joins the relays' states with this one into the state of one predictor over all workers, as
without relays. No framework import.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from mxlbbsp import predictors as _pred
from mxlbbsp.core import timemodel as _tm
from mxlbbsp.core.store import load_object_state, object_state

log = logging.getLogger(__name__)

TIME_MODELS = ("auto", "linear", "affine")
#: ``auto``: the fixed-cost regime once the fitted fixed cost (AffineFit.job_share) is at least
#: FIXED_SHARE of the workers' time in FIXED_VOTES iterations in a row, back to the linear
#: model only once it is surely less (AffineFit.job_share_high, three standard errors above),
#: or when a slower worker balanced for RETRY_EQUAL iterations made the batch sizes vary and
#: the estimate fell below: in the fixed-cost regime the split stays equal, the batch sizes
#: stop varying and the fit learns nothing new, so leaving on the estimate alone flipped the
#: regime on noise; entering on one estimate sent compute-bound jobs to the equal split now
#: and then.
FIXED_SHARE = 0.5
FIXED_VOTES = 3
#: ... and left at a retry of the equal split when the estimate is below COMPUTE_BOUND
COMPUTE_BOUND = 0.3
#: ``auto`` in the fixed-cost regime: a worker whose time at the equal batch is at least
#: CLEARLY_SLOWER times another's at every fixed share the fit allows (AffineFit.
#: equal_split_bounds over the last SPEED_WINDOW iterations) is clearly slower, and the linear
#: model balances the workers; they count as equal again once every worker's high bound is
#: within SAME_SPEED of every low bound, or after RETRY_EQUAL iterations, when the equal split
#: is tried again (the slow worker must show itself slower again to be balanced). Far from the
#: equal split the bounds are too wide to show a recovered worker equal: without the retry
#: the linear model, which reads a fixed cost as slowness, kept walking the split to 63:1
#: long after the other tenant had gone. The retry costs little: while the fixed cost
#: dominates, even the best uneven split gains little over the equal one.
SPEED_WINDOW = 8
CLEARLY_SLOWER = 1.5
SAME_SPEED = 1.2
RETRY_EQUAL = 24
#: ``auto`` in the linear regime, while the fit cannot tell whether the fixed cost dominates
#: (AffineFit.job_share_high >= FIXED_SHARE): a split held beyond HELD_UNEVEN:1 for
#: RETRY_EQUAL iterations gets one iteration at the equal split, which shows the fit what the
#: held split cannot (seen: 1:63 held for 25 iterations after the slow worker recovered)
HELD_UNEVEN = 4.0
#: ``auto`` in the fixed-cost regime, once a clearly slower worker is being balanced: the
#: faster worker's batch grew, and its speed did not change (the tenant is on the other one).
#: If its time grew with its batch like a compute-bound worker's (median time over PROBE
#: iterations after against PROBE before, at the equal split: log time ratio at least
#: ELASTIC times the log batch ratio, for a batch that grew by MIN_GROWTH or more), that is
#: one vote that the fixed cost does not dominate; COMPUTE_VOTES of them, and the job is
#: compute-bound for good (the fixed-cost regime is not entered again). The fit cannot tell
#: this by itself while the split answers speed changes: when a tenant arrives on one
#: worker's core, its batch shrinks just as its time per sample grows, which looks like a
#: fixed cost (seen in benchmarks/contention.py: ResNet-20, fixed share ~5 %, was put back at
#: the equal split for ~5 iterations after each switch, every ~35). The faster worker's
#: time is the measurement: with 81 % fixed cost, a batch 1.3x larger takes 1.06x the time;
#: compute-bound, 1.3x. (The gap between the two closing is not: a transient slowdown that
#: passes closes it on a fixed cost too.)
#: The mark is dropped when the mean batch per worker falls below half the one it was set at
#: (Courier may shrink the global batch a lot, and a smaller batch has a larger fixed share).
PROBE = 5
ELASTIC = 0.7
MIN_GROWTH = 1.2
COMPUTE_VOTES = 2


class AutoRegime:
    """``--time-model auto``: whether the fixed cost dominates the job and, if so, whether
    a worker is clearly slower; from the AffineFit's estimates, one iteration at a time."""

    def __init__(self, num_workers: int):
        self.fixed_dominates = False     # the fixed-cost regime
        self.uneven = False              # in it: a worker is clearly slower
        self.uneven_for = 0              # iterations since it was found slower
        self.fixed_votes = 0             # iterations in a row the fit said fixed
        self.held_for = 0                # linear regime: iterations the split stayed uneven
        self.compute_bound = False       # the fixed cost does not dominate, for good
        self.compute_votes = 0           # probes that found the time growing with the batch
        self.bound_at = 0.0              # the mean batch per worker when it was marked
        self.probe = np.full(3, np.nan)  # [fast worker, its batch, its median time] at the
        #                                  equal split; the last PROBE iterations' times and
        #                                  batch sizes (NaN: not yet)
        self.times = np.full((PROBE, num_workers), np.nan)
        self.batches = np.full((PROBE, num_workers), np.nan)

    def equal_split(self, fit: _tm.AffineFit, batch: np.ndarray,
                    compute: Optional[np.ndarray] = None) -> bool:
        """Update the regime with the fit after this iteration (batch sizes ``batch``,
        compute times ``compute``: without them no probe); True when the workers count as
        equal this time (the equal model)."""
        if compute is not None:
            self.times = self._keep(self.times, compute)
            self.batches = self._keep(self.batches, batch)
        if self.compute_bound and batch.mean() < 0.5 * self.bound_at:
            self.compute_bound, self.compute_votes = False, 0     # a much smaller batch
        if self.compute_bound:
            self.fixed_dominates = self.uneven = False
            return False
        if self.fixed_dominates:
            self.fixed_dominates = fit.job_share_high >= FIXED_SHARE
            self.fixed_votes = 0
        else:
            self.fixed_votes = self.fixed_votes + 1 if fit.job_share >= FIXED_SHARE else 0
            self.fixed_dominates = self.fixed_votes >= FIXED_VOTES
        if not self.fixed_dominates:
            # The linear model, while the fit cannot yet tell whether the fixed cost
            # dominates: a split it holds uneven gives the fit nothing new to go by (and on
            # a fixed cost it may hold one long after the slow worker recovered), so the
            # equal split is tried once every RETRY_EQUAL iterations.
            self.uneven = False
            held = batch.max() > HELD_UNEVEN * batch.min() and \
                fit.job_share_high >= FIXED_SHARE
            self.held_for = self.held_for + 1 if held else 0
            if self.held_for < RETRY_EQUAL:
                return False
            self.held_for = 0
            return True
        # A worker clearly slower (a slow host, not noise) is balanced as before: the linear
        # model, the slow worker gets proportionally less. Otherwise the workers count as
        # equal: balancing noise on an iteration that hardly grows with the batch would only
        # move the split to an extreme and leave it there.
        lo, hi = fit.equal_split_bounds(batch.sum() / len(batch), recent=SPEED_WINDOW,
                                        fixed_share=(fit.job_share_low, fit.job_share_high))
        if np.isfinite(lo).all():               # else too few observations: as before
            if self.uneven:
                self.uneven_for += 1
                if self.uneven_for == PROBE and self._probe_grew():
                    self.compute_votes += 1
                    if self.compute_votes >= COMPUTE_VOTES:
                        self.compute_bound = True
                        self.bound_at = float(batch.mean())
                        self.fixed_dominates = self.uneven = False
                        return False
                self.uneven = not (hi.max() <= SAME_SPEED * lo.min()
                                   or self.uneven_for >= RETRY_EQUAL)
                if not self.uneven and fit.job_share < COMPUTE_BOUND:
                    # balancing made the batch sizes vary, and the fit no longer calls the
                    # fixed cost dominant: a compute-bound job, the linear model's
                    self.fixed_dominates = False
            else:
                self.uneven = bool(lo.max() > CLEARLY_SLOWER * hi.min())
                self.uneven_for = 0
                self.probe = self._probe_of(int(np.argmin(hi))) if self.uneven \
                    else np.full(3, np.nan)
        return self.fixed_dominates and not self.uneven

    def describe(self) -> str:
        """The regime in a few words (for ``-v``)."""
        if self.compute_bound:
            return "compute-bound for good: the linear model"
        if not self.fixed_dominates:
            return "the linear model"
        if self.uneven:
            return ("the fixed cost dominates, but a worker is clearly slower: the linear "
                    "model, alike workers one speed")
        return "the fixed cost dominates (a tiny model): the equal split"

    def _probe_of(self, worker: int) -> np.ndarray:
        """[worker, its median batch, its median time] over the last PROBE iterations (NaN
        while fewer have been seen)."""
        return np.array([worker, np.median(self.batches[:, worker]),
                         np.median(self.times[:, worker])])

    def _probe_grew(self) -> bool:
        """Whether the probed worker's time grew with its batch since the probe began, as a
        compute-bound worker's does (ELASTIC, MIN_GROWTH)."""
        if not np.isfinite(self.probe).all():
            return False
        fast, b0, t0 = int(self.probe[0]), self.probe[1], self.probe[2]
        now = self._probe_of(fast)
        b1, t1 = now[1], now[2]
        return bool(np.isfinite(now).all() and t0 > 0 and b1 >= MIN_GROWTH * b0
                    and np.log(t1 / t0) >= ELASTIC * np.log(b1 / b0))

    @staticmethod
    def _keep(rows: np.ndarray, values) -> np.ndarray:
        """The last PROBE rows of per-worker values, ``values`` the newest."""
        return np.concatenate([rows[1:], np.asarray(values, dtype=float)[None, :]])


class SpeedModel:
    """The predictor, the AffineFit and the AutoRegime of a job (``kind``: the time model).
    ``ahead``: the mode's (its reports of t split t+1+ahead): how far past the next
    iteration an oracle looks (the other predictors forecast the next one, which stands for
    both)."""

    def __init__(self, num_workers: int, predictor: str, num_exog: int, kind: str,
                 schedules=None, ahead: int = 0):
        self.n, self.predictor_name, self.num_exog, self.kind = (
            num_workers, predictor, max(num_exog, 1), kind)
        self.schedules = schedules
        self.ahead = int(ahead)
        #: the auto regime said "the equal split" at an iteration since the last model:
        #: a lease learns from several, and the regime's one-iteration retry of the equal
        #: split must not be lost among them
        self._equal = False
        self.fresh()

    def fresh(self) -> None:
        """Knowing nothing yet."""
        options = {}
        if getattr(_pred.predictor_class(self.predictor_name), "needs_schedules", False):
            options["schedules"] = self.schedules
            options["ahead"] = self.ahead
        self.predictor = _pred.create(self.predictor_name, self.n, self.num_exog, **options)
        self.fit = _tm.AffineFit(self.n)
        self.regime = AutoRegime(self.n)                 # --time-model auto
        #: the predictor's state a checkpoint gave (cut for the relays at the hand-off)
        self._saved: Optional[dict] = None
        #: per rank, whether its relay forecasts it (None: every forecast is made here)
        self.remote: Optional[np.ndarray] = None
        self.local = np.arange(self.n)       # the ranks the predictor here forecasts
        self._remote_fallbacks = np.zeros(self.n, dtype=np.int64)

    def separable(self) -> bool:
        """Whether relays may forecast their workers: a separable predictor fed the plain
        speeds (not ``affine``'s marginal ones, which need the pooled fixed cost)."""
        cls = _pred.predictor_class(self.predictor_name)
        return cls.separable and self.kind != "affine" \
            and not getattr(cls, "needs_schedules", False) and not hasattr(cls, "advance")

    def hand_off(self, remote: np.ndarray) -> Optional[dict]:
        """From now on the relays forecast the ranks of ``remote`` (bool per rank), and the
        predictor here the others; the predictor's state over all workers before the hand-off
        when it came from a checkpoint (the relays get their part of it), else None."""
        full, self._saved = self._saved, None
        self.remote = np.asarray(remote, dtype=bool)
        self.local = np.flatnonzero(~self.remote)
        self.predictor = _pred.create(self.predictor_name, len(self.local), self.num_exog) \
            if len(self.local) else None
        if full is not None and self.predictor is not None:
            self.predictor.load_state_dict(self.part_of(full, self.local))
        return full

    def part_of(self, state: dict, ranks) -> dict:
        """Ranks ``ranks``'s part of a state of the predictor over all workers."""
        return _pred.state_of_workers(self.predictor_name, self.num_exog, state, ranks)

    @property
    def fallbacks(self) -> np.ndarray:
        """Per rank, how many of its forecasts fell back to a simpler rule (the relays'
        counts as their latest forecasts said)."""
        if self.remote is None:
            return self.predictor.fallbacks
        out = self._remote_fallbacks.copy()
        if self.predictor is not None:
            out[self.local] = self.predictor.fallbacks
        return out

    def fit_step(self, t: int, batch: np.ndarray, compute: np.ndarray) -> None:
        """Iteration ``t``'s batch sizes and compute times into the fit and the ``auto``
        regime (every iteration, also those a lease of several learns from at once: the
        regime counts iterations)."""
        kind = self.kind
        if kind != "linear":
            self.fit.observe(batch, compute)
        regime = self.regime.describe()
        equal = kind == "auto" and self.regime.equal_split(self.fit, batch, compute)
        self._equal = self._equal or equal
        if kind == "auto" and self.regime.describe() != regime:
            log.debug("iteration %d: time model: %s (fitted fixed share of the time %.0f%%)",
                      t + 1, self.regime.describe(), 100 * self.fit.job_share)

    def model(self, t: int, batch: np.ndarray, compute: np.ndarray,
              exog: np.ndarray, forecast: Optional[tuple] = None,
              fitted: bool = False) -> _tm.TimeModel:
        """Learn iteration ``t``'s observations; the time model of iteration t+1.
        ``forecast``: the relays' (forecasts, fallback counts) per rank (NaN, -1: none);
        ``fitted``: the fit and the regime had iteration t already (:meth:`fit_step`), and
        ``batch``, ``compute``, ``exog`` are the mean of the iterations a lease learns
        from, for the predictor."""
        kind = self.kind
        if not fitted:
            self.fit_step(t, batch, compute)
        equal, self._equal = self._equal, False
        # The predictor sees the batch-invariant (marginal) speed; with the linear model, and
        # in the equal regime (whole-time speeds: no gaps in its lags), batch / compute time.
        fixed = np.minimum(self.fit.intercept, 0.8 * compute) if kind == "affine" \
            else np.zeros(self.n)
        speed = batch / (compute - fixed)
        self._observe(t, speed, exog, forecast)
        if equal:
            return self._equal_model(batch, compute)
        marginal = self._predict(forecast)
        bad = ~(np.isfinite(marginal) & (marginal > 0))
        marginal = np.where(bad, speed, marginal)
        if kind == "auto" and (self.regime.fixed_dominates or self._may_be_fixed()):
            marginal = self._alike(batch, compute, marginal)
        return _tm.TimeModel(marginal, fixed)

    def _may_be_fixed(self) -> bool:
        """``auto``'s linear regime while the fit cannot yet rule out a dominant fixed cost
        (AffineFit.job_share_high >= FIXED_SHARE), with more than two workers: alike
        workers get one speed here too. The linear model reads b / t as speed, and where
        the fixed cost dominates the worker given more looks faster in proportion, so every
        split of equal workers is its own fixed point and noise walks it (seen: a 1:1:3
        small CNN held its equal pair at 39:23 for the 33 iterations the fit took to call
        the fixed cost dominant). Two workers never group (:meth:`_alike`), and a
        compute-bound job's bound falls below FIXED_SHARE within a few iterations of
        varied batch sizes."""
        return self.n > 2 and not self.regime.compute_bound and \
            self.fit.job_share_high >= FIXED_SHARE

    @property
    def per_worker(self) -> bool:
        """Whether the models are each worker's own line (False in ``auto``'s fixed-cost
        regime, whose equal or alike speeds serve the split, not a time at another batch)."""
        return not (self.kind == "auto" and self.regime.fixed_dominates)

    def _observe(self, t: int, speed: np.ndarray, exog: np.ndarray,
                 forecast: Optional[tuple]) -> None:
        """The predictor here observes its workers (all of them, or after a hand-off those
        connected directly: the relays observed theirs; never ``affine`` then)."""
        if self.remote is not None:
            if forecast is not None:
                counts = forecast[1]
                np.copyto(self._remote_fallbacks, counts, casting="unsafe", where=counts >= 0)
            speed, exog = speed[self.local], exog[self.local]
        predictor = self.predictor
        if predictor is not None:
            if hasattr(predictor, "advance"):
                predictor.advance(t)
            predictor.observe(speed, exog)

    def _predict(self, forecast: Optional[tuple]) -> np.ndarray:
        """Each worker's forecast speed: the predictor's here, after a hand-off the relays'
        for theirs (NaN where none came)."""
        if self.remote is None:
            return self.predictor.predict()
        marginal = np.array(forecast[0], dtype=float) if forecast is not None \
            else np.full(self.n, np.nan)
        if self.predictor is not None:
            marginal[self.local] = self.predictor.predict()
        return marginal

    def state_dict(self, relays: Optional[list] = None) -> dict:
        """The predictor's, the fit's and the regime's state (JSON-serialisable). After a
        hand-off, ``relays``: their predictors' (ranks, state) of the same iteration, joined
        with the one here; without every one of them the predictor's state is left out (a
        job resumed from it learns afresh)."""
        if self.remote is None:
            predictor = self.predictor.state_dict()
        else:
            parts = list(relays or [])
            if self.predictor is not None:
                parts.append((self.local, self.predictor.state_dict()))
            try:
                predictor = _pred.join_states(self.predictor_name, self.num_exog, self.n, parts)
            except ValueError:
                log.warning("the checkpoint leaves the predictor's state out: a relay's part of "
                            "it did not come; a job resumed from it learns the speeds afresh")
                predictor = None
        return {"predictor_name": self.predictor_name if predictor is not None else None,
                "predictor": predictor, "fit": object_state(self.fit),
                "regime": object_state(self.regime)}

    def load_state_dict(self, state: dict) -> bool:
        """Continue from :meth:`state_dict` (the predictor's only when it is the same
        predictor); a state of other shapes (another build) is dropped with a warning, and
        the model learns afresh: then False."""
        try:
            if state.get("predictor_name") == self.predictor_name:
                self.predictor.load_state_dict(state["predictor"])
                self._saved = state["predictor"]
            load_object_state(self.fit, state["fit"])
            if state.get("regime"):
                load_object_state(self.regime, state["regime"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("the checkpoint's balancing state does not fit this build (%s); "
                        "balancing learns afresh", exc)
            self.fresh()
            return False
        return True

    def learn(self) -> None:
        """The predictor's training step: after the split is sent (off the critical
        path)."""
        if self.predictor is not None:
            self.predictor.learn()

    def _common_line(self, batch, compute) -> tuple:
        """(a, c): the job's line t(b) = a + c b, c its robust pooled slope (a non-positive
        one, time that does not grow with the batch within the noise, counts as 1 % of the
        time per mean batch), a the median over workers of each one's window level."""
        fit = self.fit
        mean_b = np.where(np.isfinite(fit.mean_batch), fit.mean_batch, batch)
        mean_t = np.where(np.isfinite(fit.mean_time), fit.mean_time, compute)
        floor = 0.01 * mean_t.sum() / mean_b.sum()
        slope = fit.pooled_slope if np.isfinite(fit.pooled_slope) else floor
        slope = min(max(slope, floor), float(np.min(mean_t / mean_b)))
        return float(np.median(np.maximum(mean_t - slope * mean_b, 0.0))), slope

    def _alike(self, batch, compute, speed) -> np.ndarray:
        """``auto`` while the fixed cost dominates and a worker is clearly slower: the linear
        model balances, but workers none of which is clearly slower than another get one
        speed, their median. "Clearly slower" is the regime's own test: the worker's time at
        the equal batch, carried there from its last SPEED_WINDOW observations at every
        fixed share the fit allows (AffineFit.equal_split_bounds), at least CLEARLY_SLOWER
        times another's in the worst case for the claim (:func:`_grouped`). Where the fixed
        cost dominates, the linear model's speed b / t grows with the batch: of two equal
        workers the one given more looked faster and was given more still, and a slow
        worker at its least batch, finishing last whatever they got, left nothing to pull
        them back (seen: two equal workers beside a 3x slower one held at 41 and 18
        samples). (Tried first: each worker's time as the job's line stretched by its own
        measured factor; it balanced a clearly slower worker less than the linear model,
        and alternating tenants, whose shrinking batch the fit reads as a fixed cost,
        stayed at the equal split 91 % of the time instead of 12 %. Then factors grouped
        within two standard errors: a real 1:1:3 job on two shared cores still held equal
        workers 1.2-1.3x apart in 3 runs of 5.)"""
        fit = self.fit

        def bounds(share: tuple) -> tuple:
            return fit.equal_split_bounds(batch.sum() / len(batch), recent=SPEED_WINDOW,
                                          fixed_share=share)
        lo, hi = bounds((fit.job_share_low, fit.job_share_high))
        out = np.asarray(speed, dtype=float).copy()
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            return out
        groups = _grouped(lo, hi)
        if groups.max() == 0 and len(groups) > 2:
            # A worker at its least batch (one sample or two) has bounds that span
            # everything (its time carried over 20x the batch at any fixed share from none
            # to all), so the worst case puts nobody clearly apart, although the regime
            # found a worker clearly slower. At the fit's own fixed share it is apart, and
            # the others then group: else they go ungrouped and the linear model walks
            # them (seen: equal workers held at 20:43 for 25 iterations beside a worker at
            # one sample). Two workers still never group.
            lo, hi = bounds((fit.job_share, fit.job_share))
            if np.isfinite(lo).all() and np.isfinite(hi).all():
                groups = _grouped(lo, hi)
        if groups.max() == 0:
            # none clearly slower any more: the regime balances on (it retries the equal
            # split in time), as it would without the groups; so two workers never group
            return out
        for label in np.unique(groups):
            members = groups == label
            out[members] = np.median(out[members])
        return out

    def _equal_model(self, batch, compute) -> _tm.TimeModel:
        """``auto`` while the fixed cost dominates (tiny models) and no worker is clearly
        slower: every worker the same line t(b) = a + c b, so the equal split. c is the
        job's robust pooled slope (AffineFit.pooled_slope; a non-positive one, time that
        does not grow with the batch within the noise, counts as 1 % of the time per mean
        batch), a the median over workers of each one's window level; the times it predicts
        are the job's, for the metrics and for Courier's planning. Not a line per worker:
        when each worker keeps its own batch size, a difference in fixed cost and the slope
        cannot be told apart, and a slope error of a few microseconds per sample made equal
        workers look unequal by milliseconds (seen: equal pairs held at 52:12 and 63:1)."""
        level, slope = self._common_line(batch, compute)
        n = len(batch)
        return _tm.TimeModel(np.full(n, 1.0 / slope), np.full(n, level))


def _grouped(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A group label per worker from each one's low and high time at the equal batch: in
    increasing order of the high bound, a worker joins the group of the one before unless
    it is clearly slower than the group's first (its low bound at least CLEARLY_SLOWER
    times the first's high bound)."""
    order = np.argsort(hi, kind="stable")
    labels = np.zeros(len(hi), dtype=np.int64)
    first, label = order[0], 0
    for j in order[1:]:
        if lo[j] >= CLEARLY_SLOWER * hi[first]:
            first, label = j, label + 1
        labels[j] = label
    return labels
