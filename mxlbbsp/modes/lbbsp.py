"""``lbbsp``: load-balanced BSP, the default mode.

Once all n reports of iteration t are in, the balancer splits B(t+1) so that every worker is
predicted to finish together (kept unchanged when the predicted gain is under
``--threshold``), and each worker gets its own ``alloc(t+1)``. The workers wait for it from
iteration 1 on (normally it is already there).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from mxlbbsp.core import split as _split

from ._api import CoordinatorPolicy, SyncMode, register


class LBBSPPolicy(CoordinatorPolicy):
    sends = True

    def warmup(self, t: int, next_B: Optional[int], current: np.ndarray) -> np.ndarray:
        if next_B is None:
            return current
        sizes = _split.rescale(current, next_B)
        self.coordinator.send_split(t + 1, sizes)
        return sizes

    def plan(self, t, model, next_B, current):
        sizes = self.coordinator.balancer.allocate(model, next_B, current)
        self.coordinator.send_split(t + 1, sizes)
        return sizes


@register
class LBBSP(SyncMode):
    checkpoints = True
    name = "lbbsp"
    label = "LB-BSP"
    help = "split B by predicted speed so that all finish together (dist_sync)"
    uses_predictor = True
    policy = LBBSPPolicy
