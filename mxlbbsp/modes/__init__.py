"""Sync modes behind one interface (:class:`SyncMode`) and a registry by name.

The first registered mode is the default. A new mode is one new module here, imported below
(the order of these imports is the order of ``available()``: not sorted on purpose).
"""
# isort: skip_file
import importlib
import os
import sys

from mxlbbsp.core import env as _env
from ._api import (Control, ControlConfig, CoordinatorPolicy, Option, SyncMode, UnknownMode,
                   WorkerSession, all_options, available, from_env, get, labels, register)
from . import lbbsp, bsp, asp  # noqa: F401  (registers lbbsp first: the default)
from . import r2sp  # noqa: F401
from . import courier  # noqa: F401
from . import goodput  # noqa: F401

DEFAULT = available()[0]


def _import_more() -> None:
    """Modes from outside the package: the modules named in MXLBBSP_MODE_MODULES
    (comma-separated, importable where the job runs) register theirs. The launcher forwards
    the variable to every role, so the workers know the same modes."""
    for name in filter(None, (n.strip() for n in os.environ.get(_env.MODE_MODULES, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            sys.stderr.write(f"mxlbbsp: error: {_env.MODE_MODULES}: cannot import {name!r} "
                             f"({exc}); put its folder on PYTHONPATH or fix the name\n")
            raise SystemExit(2) from None


_import_more()

__all__ = ["Control", "ControlConfig", "CoordinatorPolicy", "Option", "SyncMode", "UnknownMode",
           "WorkerSession", "all_options", "available", "from_env", "get", "labels", "register",
           "DEFAULT"]
