"""``bsp``: bulk synchronous parallel, the equal split B/n on dist_sync.

The workers cut their equal slices themselves and never wait for the coordinator; it still
predicts every worker's speed, so that predictors can be compared on any run.
"""
from __future__ import annotations

from ._api import SyncMode, register


@register
class BSP(SyncMode):
    checkpoints = True
    name = "bsp"
    label = "BSP"
    help = "equal split B/n, a barrier every iteration (dist_sync)"
