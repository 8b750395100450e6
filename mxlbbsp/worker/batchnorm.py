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
        self._ref = None                      # the statistics set last (float64)
        self._layout = None                   # how the statistics combine (_pairs)
        self._pending = None                  # a start() waiting for its finish()

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
        so that the round trip can overlap the gradients' push/pull and the update.
        """
        if self.start(kvstore, local, total):
            self.finish()

    def start(self, kvstore, local: int, total: int) -> bool:
        """Push this worker's part of :meth:`combine` and pull the sums, asynchronously;
        False when there is nothing to combine (no statistics, or not initialised yet)."""
        if not self.params or self.params[0]._data is None:
            return False
        layout = self._pairs()
        values = [p.data().asnumpy().astype(np.float64).ravel() for p in self.params]
        if self._ref is None:
            # the first step of this process: a reference the workers share, by one more
            # round trip (any common value is exact; a close one keeps the precision)
            firsts = self._result(*self._push(kvstore, [v * local for v in values],
                                              key_offset=1))
            self._ref = [v / total for v in firsts]
        ref = self._ref
        centred = [v - r for v, r in zip(values, ref)]
        squares = [centred[pair.mean] ** 2 for pair in layout]
        self._pending = (self._push(kvstore, [c * local for c in centred + squares]), total,
                         len(values), layout)
        return True

    def finish(self) -> None:
        """Set the combined statistics (after :meth:`start`; waits for the pulled sums)."""
        pushed, total, count, layout = self._pending
        self._pending = None
        ref = self._ref
        sums = [s / total for s in self._result(*pushed)]
        combined = [r + s for r, s in zip(ref, sums[:count])]
        for pair, square in zip(layout, sums[count:]):
            if pair.momentum < 1.0:
                shift = sums[pair.mean]
                spread = np.maximum(square - shift ** 2, 0.0)
                combined[pair.var] = combined[pair.var] + spread / (1.0 - pair.momentum)
        self._ref = []
        for p, value in zip(self.params, combined):
            data = nd.array(value.reshape(p.shape), dtype=p.dtype)
            p.set_data(data)
            self._ref.append(data.asnumpy().astype(np.float64).ravel())

    @property
    def started(self) -> bool:
        """A :meth:`start` waits for its :meth:`finish`."""
        return self._pending is not None

    def _push(self, kvstore, parts: List[np.ndarray], key_offset: int = 0) -> tuple:
        """Push ``parts`` (float64 here, float32 on the wire) and pull their sums over the
        workers, asynchronously: what :meth:`_result` reads them from."""
        flat = nd.array(np.concatenate(parts), dtype="float32")
        key = self.key + key_offset
        if key not in self._keys:
            kvstore.init(key, nd.zeros(flat.shape, dtype="float32"))
            self._keys.add(key)
        kvstore.push(key, flat)
        kvstore.pull(key, out=flat)
        return flat, [len(part) for part in parts]

    @staticmethod
    def _result(flat, lengths) -> List[np.ndarray]:
        """The sums of a :meth:`_push`, once pulled (waits for them)."""
        sums = flat.asnumpy().astype(np.float64)
        return np.split(sums, np.cumsum(lengths)[:-1])

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

