"""Sync modes behind one interface (:class:`SyncMode`) and a registry by name.

The first registered mode is the default. A new mode is one new module here, imported below.
"""
from ._api import CoordinatorPolicy, SyncMode, UnknownMode, available, get, labels, register
from . import lbbsp, bsp, asp  # noqa: F401  (registers lbbsp first: the default)
from . import r2sp  # noqa: F401
from . import courier  # noqa: F401

DEFAULT = available()[0]

__all__ = ["CoordinatorPolicy", "SyncMode", "UnknownMode", "available", "get", "labels",
           "register", "DEFAULT"]
