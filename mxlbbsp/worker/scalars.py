"""The script's own training curves: :func:`mxlbbsp.log` (loss, accuracy, any named scalar).

Inside a launched job every call sends the values to the coordinator (a ``log`` message of
:mod:`mxlbbsp.core.protocol`), which puts them into this worker's metrics record of the current
iteration, as its ``scalars`` object (see docs/ARCHITECTURE.md, "Metrics"); ``mxlbbsp report``
plots them and ``--tensorboard DIR`` writes them for TensorBoard. Without the launcher (one
process), the values are only kept here, in :func:`history`: nothing fails, nothing is written.

A value is a Python number, or anything with exactly one element that numpy can read: a numpy
scalar or array, an MXNet NDArray (read with ``asnumpy()``, which waits for the engine), e.g.
``loss.mean()``. NaN and infinities are accepted (a diverging loss is worth seeing): the
metrics file holds them as null, TensorBoard gets them as they are. Anything else is bad
input: one line on stderr and exit code 2 (the launcher names the worker).

No framework import: NDArrays are recognised by their ``asnumpy`` method.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from mxlbbsp.worker import session as _session

#: at most this many names per call, and this long each (the coordinator refuses more)
MAX_NAMES = 32
MAX_NAME = 64
#: the in-process history keeps the last HISTORY calls
HISTORY = 10000

_lock = threading.Lock()
_history: List[Tuple[int, float, Dict[str, float]]] = []


class ScalarError(ValueError):
    """A value given to :func:`log` that is not one number."""


def _fail(message: str):
    sys.stderr.write(f"mxlbbsp: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def to_number(name: str, value) -> float:
    """``value`` as a float; :class:`ScalarError` saying what is wrong when it is not one
    number."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        raise ScalarError(f"{name}={value!r} is not a number")
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:           # an int beyond the float range
            return math.copysign(math.inf, value)
    if hasattr(value, "asnumpy"):       # an MXNet NDArray
        value = value.asnumpy()
    try:
        import numpy as np
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise ScalarError(f"{name}: a {type(value).__name__} is not a number") from None
    if arr.dtype.kind not in "biuf" or arr.dtype.kind == "b":
        raise ScalarError(f"{name}: a {type(value).__name__} of {arr.dtype} is not a number")
    if arr.size != 1:
        raise ScalarError(f"{name}: an array of shape {tuple(arr.shape)} is not one number")
    return float(arr.reshape(()))


def check(values: Dict[str, object]) -> Dict[str, float]:
    """The named values as floats; :class:`ScalarError` for the first bad one."""
    if len(values) > MAX_NAMES:
        raise ScalarError(f"{len(values)} values in one call; at most {MAX_NAMES}")
    out = {}
    for name, value in values.items():
        if not name or len(name) > MAX_NAME:
            raise ScalarError(f"the name {name[:80]!r} must have 1 to {MAX_NAME} characters")
        out[name] = to_number(name, value)
    return out


def log(loss=None, accuracy=None, **scalars) -> None:
    """Record the script's own values (``loss``, ``accuracy``, any other named number) for
    the current iteration; see the module docstring."""
    given = {}
    if loss is not None:
        given["loss"] = loss
    if accuracy is not None:
        given["accuracy"] = accuracy
    given.update(scalars)
    if not given:
        return
    try:
        values = check(given)
    except ScalarError as exc:
        _fail(f"mxlbbsp.log: {exc}; give a Python number or a one-element array "
              "(e.g. loss.mean())")
    sess = _session.current()
    iteration = sess.iteration if sess is not None else -1
    with _lock:
        _history.append((iteration, time.time(), values))
        del _history[:-HISTORY]
    if sess is not None and iteration >= 0:
        sess.send_scalars(iteration, values)


def history() -> List[Tuple[int, float, Dict[str, float]]]:
    """This process's logged values: (iteration, wall time, {name: value}) per call, the last
    :data:`HISTORY` calls; iteration -1 for a value logged before the first iteration."""
    with _lock:
        return list(_history)


def json_value(x: float) -> Optional[float]:
    """NaN and infinities as null (JSON has no such numbers)."""
    return x if math.isfinite(x) else None
