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
the copy's time on the engine (benchmarks/elastic.py).
"""
from __future__ import annotations

import ctypes
import pickle
import threading
from typing import List, Optional

from mxnet import nd
from mxnet.base import _LIB, c_str, check_call

from mxlbbsp.worker import checkpoint as _ckpt

_COPY = ctypes.c_void_p()
check_call(_LIB.NNGetOpHandle(c_str("_copyto"), ctypes.byref(_COPY)))


class _Copies:
    """Copies of a fixed list of arrays into arrays of their own, on the engine, one call of
    MXNet's C API each: NDArray.copyto's Python checks cost more than a small model's copies
    (ResNet-20's 172 arrays: 4.7 ms per step through copyto, 0.85 ms this way)."""

    def __init__(self, sources: list):
        self.sources = list(sources)
        self.copies = [nd.zeros(a.shape, ctx=a.context, dtype=a.dtype) for a in self.sources]
        # the C arrays of one handle each, kept alive as long as the arrays they name
        self._inputs = [(ctypes.c_void_p * 1)(a.handle.value) for a in self.sources]
        self._held = [(ctypes.c_void_p * 1)(c.handle.value) for c in self.copies]
        self._outputs = [ctypes.cast(h, ctypes.POINTER(ctypes.c_void_p)) for h in self._held]
        self._count = ctypes.c_int(1)

    def matches(self, sources: list) -> bool:
        return len(sources) == len(self.sources) and all(
            a is b for a, b in zip(sources, self.sources))

    def run(self) -> None:
        count = ctypes.byref(self._count)
        for i, o in zip(self._inputs, self._outputs):
            check_call(_LIB.MXImperativeInvoke(_COPY, 1, i, count, ctypes.byref(o), 0, None,
                                               None))


def _layout(value, leaves: list):
    """``value`` (an NDArray, a tuple/list of them, or None) with each array replaced by its
    index in ``leaves``, where it is appended."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(_layout(v, leaves) for v in value)
    leaves.append(value)
    return len(leaves) - 1


def _fill(layout, leaves: list):
    """The inverse of :func:`_layout`, with ``leaves`` (numpy arrays)."""
    if layout is None:
        return None
    if isinstance(layout, (tuple, list)):
        return type(layout)(_fill(v, leaves) for v in layout)
    return leaves[layout]


class Keeper:
    """A trainer's state of its last finished iteration (module docstring)."""

    def __init__(self):
        self.iteration = -1                  # the iteration the copies hold
        self._copies: Optional[_Copies] = None
        self._layout: dict = {}              # the optimizer's states, arrays as indices
        self._params = 0                     # the copies of the parameters come first
        self._optimizer: Optional[bytes] = None
        self._lock = threading.Lock()

    def keep(self, trainer, iteration: int) -> None:
        """After ``trainer``'s step of ``iteration`` has finished (the engine drained):
        copy. (The trainer is passed, not kept: one freed late aborts ps-lite's finalize.)
        The same arrays as at the last step are copied into the same copies (a new array,
        e.g. the first step's optimizer states, makes new copies)."""
        updater = trainer._updaters[0]
        params = [p.data() for p in trainer._params]
        leaves: List = []
        layout = {k: _layout(v, leaves) for k, v in updater.states.items()}
        sources = params + leaves
        with self._lock:
            if self._copies is None or layout != self._layout \
                    or not self._copies.matches(sources):
                self._copies = _Copies(sources)
                self._layout, self._params = layout, len(params)
            self._copies.run()
            self._optimizer = pickle.dumps(updater.optimizer)
            self.iteration = iteration

    def arrays(self) -> tuple:
        """(iteration, the parameters' copies, the optimizer's states, the optimizer) as
        numpy arrays and the unpickled optimizer. CheckpointError when nothing was kept."""
        with self._lock:
            if self.iteration < 0 or self._optimizer is None:
                raise _ckpt.CheckpointError("no finished iteration to save yet")
            values = [c.asnumpy() for c in self._copies.copies]
            params = values[:self._params]
            states = {k: _fill(v, values[self._params:]) for k, v in self._layout.items()}
            return self.iteration, params, states, pickle.loads(self._optimizer)

    def write(self, trainer, directory: str, sess) -> tuple:
        """Write the copies as ``trainer``'s checkpoint; (its iteration, its folder).
        CheckpointError when nothing was kept yet."""
        _ckpt.check_saveable(trainer)
        t, params, states, optimizer = self.arrays()
        arrays = {f"p{i}": a for i, a in enumerate(params)}
        blob = pickle.dumps((_to_nd(states), optimizer))
        return t, _ckpt.write_state(directory, sess, trainer._params, t, arrays, blob)


def _to_nd(value):
    """Back to NDArrays (on the CPU), the Updater's pickled format."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _to_nd(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to_nd(v) for v in value)
    return nd.array(value, dtype=value.dtype)
