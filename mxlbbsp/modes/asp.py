"""``asp``: asynchronous parallel, the equal split on dist_async servers.

Each push is applied on its own as soon as it arrives (MXNet's dist_async), so each worker's
update is one SGD step on its own batch: the normaliser is the worker's own batch b_i(t).
Iterations are each worker's own count and are not aligned across workers.
"""
from __future__ import annotations

from typing import Tuple

from ._api import SyncMode, register


@register
class ASP(SyncMode):
    name = "asp"
    label = "ASP"
    help = "equal split, no barrier: each push applied on its own (dist_async)"
    kvstore = "dist_async"
    barrier = False
    aligned = False

    def normalisers(self, sess) -> Tuple[float, float]:
        return float(sess.batch_local), sess.global_batch_size / sess.num_workers
