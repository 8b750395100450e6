"""Sync modes behind one interface (:class:`SyncMode`) and a registry by name.

The first registered mode is the default. A new mode is one new module here, imported below
(the order of these imports is the order of ``available()``: not sorted on purpose).
"""
# isort: skip_file
from ._api import (Control, ControlConfig, CoordinatorPolicy, SyncMode, UnknownMode,
                   WorkerSession, available, from_env, get, labels, register)
from . import lbbsp, bsp, asp  # noqa: F401  (registers lbbsp first: the default)
from . import r2sp  # noqa: F401
from . import courier  # noqa: F401
from . import goodput  # noqa: F401

DEFAULT = available()[0]

__all__ = ["Control", "ControlConfig", "CoordinatorPolicy", "SyncMode", "UnknownMode",
           "WorkerSession", "available", "from_env", "get", "labels", "register", "DEFAULT"]
