"""A worker started ahead of its job waits here for the checkpoint it resumes from.

An elastic job's next generation is launched while the current one still trains
(``launcher/elastic.py``): its processes import MXNet and run the script's set-up meanwhile,
which is most of what a new process costs. The only thing they cannot know yet is the
iteration they continue from: the current generation saves its state at an iteration
boundary once the next one is ready. So a worker with ``MXLBBSP_HOLD`` (the launcher's
address) connects there at its first need of that checkpoint (:func:`resume`, which
:class:`mxlbbsp.Trainer` and :class:`mxlbbsp.DataLoader` call when they are built), says
its token and rank (``hold``), and waits for one line: ``release`` with the checkpoint
(``resume``; null: the job starts from scratch). The connection closing without that line
means the generation was given up (the current one failed, or ended): the process ends at
once, quietly, with 0 (it has touched neither the kvstore nor any file; the launcher stops
it anyway).

Outside an elastic job's next generation this is :func:`mxlbbsp.core.env.resume`.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from mxlbbsp.core import env as _env
from mxlbbsp.core import protocol as P

#: how long the launcher's hold may take to accept the connection
CONNECT_TIMEOUT_S = 30.0


def resume() -> Optional[str]:
    """The checkpoint folder this worker continues from (None: from scratch), after waiting
    at the launcher's hold when it was started ahead of its job (module docstring; once:
    the release takes MXLBBSP_HOLD out of the environment)."""
    address = _env.hold()
    if address is not None:
        _wait(address)
    return _env.resume()


def _wait(address) -> None:
    try:
        sock = P.connect(address, timeout=CONNECT_TIMEOUT_S)
        sock.settimeout(None)
        sock.sendall(P.encode(P.hold(_env.rank(), _env.token())))
        line = sock.makefile("rb").readline(P.MAX_LINE)
        sock.close()
        answer = P.decode(line) if line.endswith(b"\n") else None
    except (OSError, P.ProtocolError):
        answer = None
    if answer is None or answer["type"] != P.RELEASE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)              # given up: nothing of this process was used
    os.environ.pop(_env.HOLD, None)          # not for the script's own children
    if answer.get("resume"):
        os.environ[_env.RESUME] = str(answer["resume"])
    else:
        os.environ.pop(_env.RESUME, None)
