"""The hold: where the workers of an elastic job's next generation wait until it may start.

The next generation is launched while the current one trains (:mod:`.elastic`); its
workers import MXNet and run their script's set-up meanwhile, then connect here at their
first need of the checkpoint they resume from (:mod:`mxlbbsp.worker.hold`), each saying its
token and rank, and wait. :meth:`Hold.release` tells them all the checkpoint (saved by the
current generation at its last iteration boundary); :meth:`Hold.close` without a release
gives the generation up (they end, quietly).

A connection without the job's token, or with a rank already held or out of range, is
closed at once.
"""
from __future__ import annotations

import socket
import threading
from typing import Dict, Optional

from mxlbbsp.core import protocol as P

#: how long a connection may take to say who it is
HELLO_TIMEOUT_S = 10.0


class Hold:
    """Listens on ``bind`` (any free port: :attr:`address`) for the ``num_workers`` workers
    of a generation with ``token``."""

    def __init__(self, bind: str, token: str, num_workers: int):
        self.token = token
        self.num_workers = num_workers
        self._lock = threading.Lock()
        self._held: Dict[int, socket.socket] = {}
        self._closed = False
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((bind, 0))
        self._sock.listen(max(128, num_workers))
        self.address = self._sock.getsockname()[:2]
        threading.Thread(target=self._accept, name="mxlbbsp-hold", daemon=True).start()

    @property
    def held(self) -> int:
        """How many workers wait here now."""
        with self._lock:
            return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return                        # closed
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(HELLO_TIMEOUT_S)
            hello = P.decode(conn.makefile("rb").readline(P.MAX_HELLO), P.MAX_HELLO)
            rank = hello.get("rank")
            ok = (hello["type"] == P.HOLD and P.token_ok(hello, self.token)
                  and type(rank) is int and 0 <= rank < self.num_workers)
        except (OSError, P.ProtocolError):
            ok = False
        with self._lock:
            if ok and not self._closed and rank not in self._held:
                conn.settimeout(None)
                self._held[rank] = conn
                return
        conn.close()

    def release(self, resume: Optional[str]) -> int:
        """Tell every worker held the checkpoint to resume from (None: none); returns how
        many were told. Workers that come later are closed (given up)."""
        line = P.encode(P.release(resume))
        with self._lock:
            held, self._held = self._held, {}
            self._closed = True
        told = 0
        for conn in held.values():
            try:
                conn.sendall(line)
                told += 1
            except OSError:
                pass
            conn.close()
        self._stop_listening()
        return told

    def close(self) -> None:
        """Give the generation up: every worker held ends."""
        with self._lock:
            held, self._held = self._held, {}
            self._closed = True
        for conn in held.values():
            conn.close()
        self._stop_listening()

    def _stop_listening(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)     # wakes the accept (a close alone may not)
        except OSError:
            pass
        self._sock.close()
