"""Python functions that MXNet's engine calls once arrays are ready: a worker's clock that
never drains the engine.

MXNet runs the operators a script issues asynchronously, on the engine's threads. To read
when an iteration's gradients are ready (its report) and when its update is done (its done),
the trainer could wait for the engine from Python (``wait_to_read``, ``waitall``). Then the
Python thread sleeps twice per iteration, the engine runs dry, and each operator issued next
pays for waking it: on a model of a few milliseconds per iteration that cost a third of the
throughput against a plain MXNet script (benchmarks/results/overhead_cpu.md). Instead,
:func:`call_after` pushes a function into the engine (``MXEnginePushSyncND``) that reads or
writes the given arrays: the engine runs it on one of its threads once the operators issued
before it that write those arrays are done, and it orders the operators issued after it
that read what it writes behind it. The Python thread never waits.

The function runs on an engine thread (with the GIL, as a ctypes callback): it must not
call MXNet, and what it raises is logged, not raised: the caller's function keeps its own
errors (:class:`~mxlbbsp.worker.session.Session`).
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import threading
from typing import Callable, Dict, Sequence

from mxnet.base import _LIB, NDArrayHandle, check_call

log = logging.getLogger(__name__)

_SyncFunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class _Context(ctypes.Structure):
    """MXNet's ``Context``: the device the function runs on (the CPU: it only reads a clock
    and writes a socket, whatever device the arrays are on)."""
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


_CPU = _Context(1, 0)
_NAME = b"mxlbbsp_clock"
_pending: Dict[int, Callable[[], None]] = {}
_keys = itertools.count(1)
_lock = threading.Lock()


def _run(_run_context, key) -> None:
    with _lock:
        fn = _pending.pop(key, None)
    if fn is None:
        return
    try:
        fn()
    except Exception:  # noqa: BLE001 - an engine thread cannot raise into the script
        log.exception("mxlbbsp: a function the engine called failed")


#: kept for the process's life: the engine holds a pointer to it
_RUN = _SyncFunc(_run)


def available() -> bool:
    """Whether this MXNet can push a Python function into its engine (1.6 and later)."""
    return hasattr(_LIB, "MXEnginePushSyncND")


def call_after(fn: Callable[[], None], reads: Sequence = (), writes: Sequence = ()) -> None:
    """Have the engine call ``fn()`` once the operators issued so far that write ``reads``
    or ``writes`` (NDArrays) are done; operators issued later that read ``writes`` wait
    for it."""
    key = next(_keys)
    with _lock:
        _pending[key] = fn
    read_handles = (NDArrayHandle * len(reads))(*[a.handle for a in reads])
    write_handles = (NDArrayHandle * len(writes))(*[a.handle for a in writes])
    try:
        check_call(_LIB.MXEnginePushSyncND(
            _RUN, ctypes.c_void_p(key), None, ctypes.byref(_CPU), read_handles, len(reads),
            write_handles, len(writes), None, 0, _NAME))
    except Exception:
        with _lock:
            _pending.pop(key, None)
        raise
