"""The state of the last finished iteration, kept so that a surviving worker can save it when
another one fails (an elastic job, or one with ``--restarts``: ``MXLBBSP_SNAPSHOTS``).

When a worker dies in iteration k+1, the others wait forever in its push/pull, and their
own state may already be in motion: the optimizer's update of k+1 is queued on MXNet's
engine behind the pull that never comes (reading a parameter would wait for it), BatchNorm's
running statistics moved with the forward pass of k+1, the optimizer's update counts went up
when the update was queued. So at the end of every step the :class:`Keeper` copies what a
checkpoint holds (every parameter of the trainer, the running statistics included; the
optimizer's state arrays; the optimizer itself, pickled, with its counts and schedule) into
arrays of its own, on the engine (no wait for them: they run before the next step writes
anything they read). Asked to (:meth:`Keeper.write`, on the session's thread while the
worker's own thread is stuck), it writes those copies as the checkpoint of k, the iteration
they hold; a lock keeps the copies of k+1 from starting while they are read.

What it costs: one copy of the model and its optimizer state per iteration in memory, and
the copy's time on the engine (benchmarks/elastic_cost.py).
"""
from __future__ import annotations

import pickle
import threading
from typing import Optional

from mxnet import nd

from mxlbbsp.worker import checkpoint as _ckpt


def _copy_into(value, into):
    """``value`` (an NDArray, a tuple/list of them, or None) copied into ``into`` (made
    when None); returns ``into``."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        into = into or [None] * len(value)
        return type(value)(_copy_into(v, i) for v, i in zip(value, into))
    if into is None or into.shape != value.shape or into.dtype != value.dtype:
        into = nd.zeros(value.shape, ctx=value.context, dtype=value.dtype)
    value.copyto(into)
    return into


class Keeper:
    """A trainer's state of its last finished iteration (module docstring)."""

    def __init__(self):
        self.iteration = -1                  # the iteration the copies hold
        self._params: list = []
        self._states: dict = {}
        self._optimizer: Optional[bytes] = None
        self._lock = threading.Lock()

    def keep(self, trainer, iteration: int) -> None:
        """After ``trainer``'s step of ``iteration`` has finished (the engine drained):
        copy. (The trainer is passed, not kept: one freed late aborts ps-lite's finalize.)"""
        updater = trainer._updaters[0]
        with self._lock:
            if len(self._params) != len(trainer._params):
                self._params = [None] * len(trainer._params)
            for i, p in enumerate(trainer._params):
                self._params[i] = _copy_into(p.data(), self._params[i])
            self._states = {k: _copy_into(v, self._states.get(k))
                            for k, v in updater.states.items()}
            self._optimizer = pickle.dumps(updater.optimizer)
            self.iteration = iteration

    def write(self, trainer, directory: str, sess) -> tuple:
        """Write the copies as ``trainer``'s checkpoint; (its iteration, its folder).
        CheckpointError when nothing was kept yet."""
        with self._lock:
            if self.iteration < 0 or self._optimizer is None:
                raise _ckpt.CheckpointError("no finished iteration to save yet")
            _ckpt.check_saveable(trainer)
            arrays = {f"p{i}": a.asnumpy() for i, a in enumerate(self._params)}
            states = {k: _to_numpy(v) for k, v in self._states.items()}
            optimizer = pickle.loads(self._optimizer)
            t = self.iteration
        blob = pickle.dumps((_to_nd(states), optimizer))
        return t, _ckpt.write_state(directory, sess, trainer._params, t, arrays, blob)


def _to_numpy(value):
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(_to_numpy(v) for v in value)
    return value.asnumpy()


def _to_nd(value):
    """Back to NDArrays (on the CPU), the Updater's pickled format."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _to_nd(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to_nd(v) for v in value)
    return nd.array(value, dtype=value.dtype)
