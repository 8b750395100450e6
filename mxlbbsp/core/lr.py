"""How the learning rate follows the global batch B(t), and when momentum makes that unsafe.

``lr(B) = lr0 * LR_SCALING[rule](B / B0)``, applied by the worker's trainer
(:mod:`mxlbbsp.worker.trainer`) in every mode that changes B. Pure Python; the warning reads
an optimizer's ``momentum`` attribute without importing MXNet.
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


def rule_problem(rule) -> Optional[str]:
    """The one-line problem with an ``--lr-scaling`` rule name, or None."""
    if rule not in LR_SCALING:
        return f"--lr-scaling {rule!r}: choose one of {', '.join(LR_SCALING)}"
    return None
