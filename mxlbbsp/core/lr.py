"""How the learning rate follows the global batch B(t), and when momentum makes that unsafe.

``lr(B) = lr0 * factor``, applied by the worker's trainer (:mod:`mxlbbsp.worker.trainer`) in
every mode that changes B, with B0 the DataLoader's ``global_batch_size`` and the factor
given by the ``--lr-scaling`` rule:

* ``linear``, ``sqrt``, ``none``: ``LR_SCALING[rule](B / B0)``, a function of B alone, which
  every worker (and a replay) computes by itself;
* ``adascale`` (``--sync goodput`` only): AdaScale's gain (Johnson et al., ICML'20; the rate
  Pollux, OSDI'21, assumes), which depends on the gradient noise scale phi measured by the
  coordinator (:mod:`mxlbbsp.core.noise`)::

      r(B) = (V/B0 + S) / (V/B + S) = (phi/B0 + 1) / (phi/B + 1),   phi = V / S

  with S = |G|^2 and V = tr(Sigma) per sample; r = 1 at B0, r -> B/B0 (linear) when the
  noise dominates, r -> 1 when there is none, and Pollux's efficiency is r / (B/B0). So the
  coordinator computes it (:func:`adascale`) and sends it with each iteration's split; the
  workers apply what they got, the metrics record it (``lr_factor``) and a replay applies the
  recorded factors. Before the noise scale is known (the first iterations) it is sqrt(B/B0).

Pure Python; the warning reads an optimizer's ``momentum`` attribute without importing MXNet.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

_log = logging.getLogger(__name__)


#: how the learning rate follows the global batch: lr(B) = lr0 * factor(B / B0)
LR_SCALING = {
    "linear": lambda ratio: ratio,           # Goyal et al. 2017
    "sqrt": lambda ratio: math.sqrt(ratio),  # Krizhevsky 2014; Hoffer et al. 2017
    "none": lambda ratio: 1.0,
}
#: AdaScale's gain from the coordinator's noise scale (``--sync goodput``): see above
ADASCALE = "adascale"
#: every ``--lr-scaling`` rule
RULES = (*LR_SCALING, ADASCALE)
#: the modes whose coordinator measures the noise scale, so can give AdaScale's gain
ADASCALE_MODES = ("goodput",)


def factor(rule: str, ratio: float) -> float:
    """The factor of a rule at B / B0 = ``ratio`` as a worker computes it by itself:
    ``adascale`` without the coordinator's noise scale (the first iterations) is sqrt."""
    if rule == ADASCALE:
        rule = "sqrt"
    return float(LR_SCALING[rule](ratio))


def adascale(phi: Optional[float], batch: float, base_batch: float) -> float:
    """AdaScale's gain r(B) = (phi/B0 + 1) / (phi/B + 1) at ``batch`` against
    ``base_batch`` = B0, for the noise scale ``phi`` (samples); sqrt(B/B0) while phi is
    unknown (None, NaN)."""
    if phi is None or not math.isfinite(phi):
        return math.sqrt(float(batch) / float(base_batch))
    phi = max(float(phi), 0.0)
    return (phi / base_batch + 1.0) / (phi / batch + 1.0)


#: above this learning-rate factor, momentum (the update's memory of earlier, smaller steps)
#: makes a linearly scaled step much larger than the rule intends (Goyal et al. 2017 warm up
#: for it): warned once per worker
MOMENTUM_FACTOR = 4.0
_momentum_warned = set()


def momentum_warning(momentum: float, factor: float) -> Optional[str]:
    """The warning when momentum and a large learning-rate factor meet, else None."""
    if momentum and momentum > 0 and factor >= MOMENTUM_FACTOR:
        return (f"the learning rate is scaled {factor:.1f}x with the global batch "
                f"(--lr-scaling) while SGD momentum is {momentum:g}: with momentum a large "
                "factor overshoots (the step carries the earlier, smaller steps); if the loss "
                "jumps, use --lr-scaling sqrt, a narrower --batch-range, or less momentum")
    return None


def warn_momentum(optimizer, factor: float) -> None:
    """Logs :func:`momentum_warning` once per optimizer (a worker's one-time line)."""
    key = id(optimizer)
    if key in _momentum_warned:
        return
    text = momentum_warning(float(getattr(optimizer, "momentum", 0.0) or 0.0), factor)
    if text:
        _momentum_warned.add(key)
        _log.warning(text)


def rule_problem(rule, sync: Optional[str] = None) -> Optional[str]:
    """The one-line problem with an ``--lr-scaling`` rule name (under ``--sync sync``), or
    None."""
    if rule not in RULES:
        return f"--lr-scaling {rule!r}: choose one of {', '.join(RULES)}"
    if rule == ADASCALE and sync is not None and sync not in ADASCALE_MODES:
        return (f"--lr-scaling adascale needs the gradient noise scale, which only --sync "
                f"{' or '.join(ADASCALE_MODES)} measures; with --sync {sync} use "
                f"{', '.join(LR_SCALING)}")
    return None
