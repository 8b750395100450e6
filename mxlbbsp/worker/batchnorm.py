"""BatchNorm's running statistics, combined after every step into those of one process that
saw the whole global batch (the mean, and the variance with the spread of the workers' batch
means), through the job's kvstore. Used by :class:`mxlbbsp.worker.trainer.Trainer`.
"""
from __future__ import annotations

import gc
import logging
from typing import List, NamedTuple

import numpy as np
from mxnet import nd
from mxnet.gluon import Block

log = logging.getLogger(__name__)


class RunningStats:
    """The non-differentiable parameters of a trainer (BatchNorm's running mean and
    variance) and how to combine them over the workers."""

    def __init__(self, params, key: int):
        self.params = list(params)
        self.members = set(self.params)
        self.key = key                        # kvstore key of the combined statistics
        self._keys = set()                    # kvstore keys of the statistics, once initialised
        self._ref = None                      # the statistics set last (flat, float32)
        self._layout = None                   # how the statistics combine (_pairs)
        self._pending = None                  # a start() waiting for its finish()
        # the flat layout (_flat): the parameters in its order, each one's (begin, end), the
        # number of statistics and of running means, the variances' 1 / (1 - m)
        self._order = None
        self._bounds: List[tuple] = []
        self._count = self._means = 0
        self._spread = None
        # the statistics' own arrays as views of one flat float32 buffer (_bind), so that a
        # step reads them and sets them with one operator each instead of one per parameter
        # (42 on ResNet-20: 8 ms of the main thread's CPU per step); None where they cannot
        # be (several contexts, another dtype or storage) or were replaced since (_bound)
        self._buffer = None
        self._views: List = []

    def combine(self, kvstore, local: int, total: int) -> None:
        """Running statistics := those of one process on the whole global batch.

        Every worker starts the step with the same statistics and updates them from its own
        b_i samples: mean_i = m * mean0 + (1 - m) * mu_i, and var_i likewise with its local
        batch variance (MXNet keeps the biased one, divided by the batch). With a reference
        r the same on every worker (the statistics this trainer set last), each worker pushes
        b_i * (mean_i - r), b_i * (var_i - r_var) and b_i * (mean_i - r)^2; from the sums S1,
        S2, S3 over the workers::

            mean = r + S1 / B                                     (linear in the batch mean)
            var  = r_var + S2 / B + (S3 / B - (S1 / B)^2) / (1 - m)

        since mean_i - mean = (1 - m)(mu_i - mu), and the global batch's variance is the
        b_i-weighted mean of the local variances plus that of (mu_i - mu)^2, the spread of the
        local means. Centred on r the pushed values are small, so float32 (the servers sum
        in float32 whatever the dtype) loses nothing that matters. Statistics of a layer
        whose momentum is unknown (not a Gluon BatchNorm) get the linear rule alone.

        :meth:`start` and :meth:`finish` are its two halves: the push (once this worker's
        forward pass is done) and the combined statistics set (once the sums are pulled),
        so that the round trip can overlap the gradients' push/pull and the update; both
        are operators of MXNet's engine, which the Python thread does not wait for.
        """
        if self.start(kvstore, local, total):
            self.finish()

    def start(self, kvstore, local: int, total: int) -> bool:
        """Push this worker's part of :meth:`combine` and pull the sums, asynchronously;
        False when there is nothing to combine (no statistics, or not initialised yet).

        Every step is an operator of MXNet's engine (no wait from Python): the statistics
        are read once this worker's forward pass has written them, and the Python thread
        goes on issuing the next iteration meanwhile. The statistics are laid out flat, the
        running means of the Gluon BatchNorm layers first, then their variances in the same
        order (element by element the same layer), then any other: the spread of the batch
        means is one elementwise expression on the two blocks."""
        if not self.params or self.params[0]._data is None:
            return False
        flat = self._flat()
        if self._ref is None:
            # the first step of this process: a reference the workers share, by one more
            # round trip (any common value is exact; a close one keeps the precision)
            firsts = self._push(kvstore, flat * local, key_offset=1)
            self._ref = firsts / total
        centred = flat - self._ref
        means = self._means
        squares = nd.square(centred[:means]) if means else None
        pushed = centred if squares is None else nd.concat(centred, squares, dim=0)
        self._pending = (self._push(kvstore, pushed * local), total)
        return True

    def finish(self) -> None:
        """Set the combined statistics (after :meth:`start`): engine operators too, which
        the next forward pass waits for."""
        pushed, total = self._pending
        self._pending = None
        count, means = self._count, self._means
        sums = pushed / total
        combined = self._ref + sums[:count]
        if means:
            shift = sums[:means]
            spread = nd.maximum(sums[count:] - nd.square(shift), 0.0) * self._spread
            parts = [combined[:means], combined[means:2 * means] + spread]
            if 2 * means < count:
                parts.append(combined[2 * means:])
            combined = nd.concat(*parts, dim=0)
        self._ref = combined
        if self._bound():
            combined.copyto(self._buffer)
            return
        for p, (begin, end) in zip(self._order, self._bounds):
            p.set_data(combined[begin:end].reshape(p.shape).astype(p.dtype, copy=False))

    @property
    def started(self) -> bool:
        """A :meth:`start` waits for its :meth:`finish`."""
        return self._pending is not None

    def _flat(self):
        """The statistics as one float32 array, in the layout of :meth:`start`."""
        if self._order is None:
            layout = self._pairs()
            paired = [self.params[pair.mean] for pair in layout] + \
                [self.params[pair.var] for pair in layout]
            chosen = set(id(p) for p in paired)
            self._order = paired + [p for p in self.params if id(p) not in chosen]
            sizes = [int(np.prod(p.shape)) for p in self._order]
            ends = np.cumsum(sizes).tolist()
            self._bounds = list(zip([0] + ends[:-1], ends))
            self._count = int(sum(sizes))
            self._means = int(sum(sizes[:len(layout)]))
            # per element of the variances' block: 1 / (1 - m) of its layer (0: m >= 1)
            self._spread = nd.array(np.concatenate(
                [np.full(size, 1.0 / (1.0 - pair.momentum) if pair.momentum < 1.0 else 0.0)
                 for pair, size in zip(layout, sizes[:len(layout)])] or [np.zeros(0)]),
                dtype="float32")
        if self._bound() or self._bind():
            return self._buffer
        return nd.concat(*[p.data().astype("float32", copy=False).reshape(-1)
                           for p in self._order], dim=0)

    def _bind(self) -> bool:
        """Make each statistic's array a view of one flat float32 buffer in the layout of
        :meth:`start` (its values copied in): BatchNorm's forward pass then updates the
        buffer in place, :meth:`_flat` is the buffer, and :meth:`finish` one copy into it.
        Only for one context, float32 and dense storage; False (the per-parameter path)
        otherwise."""
        self._buffer, self._views = None, []
        arrays = []
        for p in self._order:
            data = p._data
            if data is None or len(data) != 1 or data[0].dtype != np.float32 \
                    or data[0].stype != "default":
                return False
            arrays.append(data[0])
        if len({a.context for a in arrays}) != 1:
            return False
        buffer = nd.concat(*[a.reshape(-1) for a in arrays], dim=0)
        views = [buffer[begin:end].reshape(a.shape)
                 for a, (begin, end) in zip(arrays, self._bounds)]
        for p, view in zip(self._order, views):
            p._data[0] = view
        self._buffer, self._views = buffer, views
        return True

    def _bound(self) -> bool:
        """The statistics' arrays are still the buffer's views (a re-initialised parameter
        gets arrays of its own: bound again at the next :meth:`_flat`)."""
        if self._buffer is None:
            return False
        for p, view in zip(self._order, self._views):
            data = p._data
            if data is None or len(data) != 1 or data[0] is not view:
                self._buffer, self._views = None, []
                return False
        return True

    def _push(self, kvstore, flat, key_offset: int = 0):
        """Push ``flat`` (float32: the servers sum in float32 whatever the dtype) and pull
        the sums over the workers into it, asynchronously."""
        key = self.key + key_offset
        if key not in self._keys:
            kvstore.init(key, nd.zeros(flat.shape, dtype="float32"))
            self._keys.add(key)
        kvstore.pushpull(key, flat, out=flat)
        return flat

    def _pairs(self) -> List["_StatsPair"]:
        """The (running mean, running variance, momentum) of each BatchNorm layer of ours.

        The momentum lives on the layer, not on its parameters, and the trainer is given
        parameters only: the layers are found once among the live Gluon blocks.
        """
        if self._layout is not None:
            return self._layout
        index = {id(p): i for i, p in enumerate(self.params)}
        layout = []
        for obj in gc.get_objects():
            if not isinstance(obj, Block):
                continue
            mean, var = getattr(obj, "running_mean", None), getattr(obj, "running_var", None)
            momentum = getattr(obj, "_kwargs", {}).get("momentum")
            if id(mean) in index and id(var) in index and momentum is not None:
                layout.append(_StatsPair(index[id(mean)], index[id(var)], float(momentum)))
        found = {pair.var for pair in layout}
        unknown = [p.name for i, p in enumerate(self.params)
                   if i not in found and p.name.endswith("running_var")]
        if unknown:
            log.warning("mxlbbsp: warning: %s combined without the spread of the workers' "
                        "batch means (the layer's momentum is unknown: not a Gluon BatchNorm)",
                        ", ".join(unknown))
        # In the order of the trainer's parameters, the same on every worker: the garbage
        # collector's order is not, and every worker must push its squares in one order.
        layout = sorted(set(layout))
        self._layout = layout
        return layout


class _StatsPair(NamedTuple):
    """One BatchNorm layer: indices of its running mean and variance in ``RunningStats.params``."""
    mean: int
    var: int
    momentum: float

