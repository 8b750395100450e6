"""The coordinator's connections: one asyncio protocol per worker, and what is written to them.

:class:`Connection` splits a worker's bytes into lines and hands each to the coordinator
(``Coordinator.on_line``); before a connection has authenticated (its ``hello``, with the
job's token) nothing longer than :data:`~mxlbbsp.core.protocol.MAX_HELLO` is read.
:class:`Links` holds the registered workers' transports and writes to them: one message, the
same message to all, or every worker its own slice of the global batch; and it refuses
connections that never authenticate, rate-limiting the warnings (a port scan or a flood must
not flood the user's output).

No framework import.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Dict, Optional

from mxlbbsp.core import protocol as P

log = logging.getLogger(__name__)

#: "refused a connection" warnings: the first few one by one, then one line per interval
REFUSALS_SHOWN = 5
REFUSAL_SUMMARY_S = 10.0


class Connection(asyncio.Protocol):
    """One worker's connection: its lines go to the coordinator as they arrive.

    A protocol rather than a stream reader: no coroutine resumes per message, which is most
    of the cost when hundreds of workers report at the same moment.
    """

    def __init__(self, coordinator):
        self.coordinator = coordinator
        self.transport: Optional[asyncio.Transport] = None
        self.rank: Optional[int] = None          # set by a valid hello
        self._buffer = bytearray()
        self._hello_timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._hello_timer = asyncio.get_running_loop().call_later(30, self._no_hello)

    def _no_hello(self) -> None:
        if self.rank is None:
            self.transport.close()

    def _limit(self) -> int:
        """The longest line read: a hello's until the connection has authenticated."""
        return P.MAX_HELLO if self.rank is None else P.MAX_LINE

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():     # refused or rejected: read nothing more
            return
        buffer = self._buffer
        buffer += data
        start = 0
        on_line = self.coordinator.on_line
        while True:
            end = buffer.find(b"\n", start, start + self._limit() + 1)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if not on_line(self, line):
                buffer.clear()
                return
        del buffer[:start]
        limit = self._limit()
        if len(buffer) > limit:
            buffer.clear()
            links = self.coordinator.links
            if self.rank is None:
                links.refuse(self, f"first line longer than {limit} bytes")
            else:
                links.reject(self, f"message longer than {limit} bytes")

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.coordinator.on_lost(self)


class Links:
    """The registered workers' transports (rank -> transport), and the refusals.

    ``fail(message)``: a registered worker's malformed message fails the job."""

    def __init__(self, fail):
        self._fail = fail
        self.writers: Dict[int, asyncio.Transport] = {}
        self.refused = 0                         # connections refused before a hello
        self._refusals_unshown = 0
        self._refusal_timer = None

    def send(self, rank: int, msg: dict) -> None:
        w = self.writers.get(rank)
        if w is not None and not w.is_closing():
            w.write(P.encode(msg))

    def broadcast(self, msg: dict) -> None:
        data = P.encode(msg)
        for w in self.writers.values():
            if not w.is_closing():
                w.write(data)

    def send_split(self, iteration: int, split) -> None:
        """Every worker its own slice of ``split``, iteration's global batch (O(n) bytes)."""
        total = int(sum(split))
        offset = 0
        writers, line = self.writers, P.alloc_line
        for rank, size in enumerate(split):
            size = int(size)
            w = writers.get(rank)
            if w is not None and not w.is_closing():
                w.write(line(iteration, offset, size, total))
            offset += size

    def close_all(self) -> None:
        for transport in list(self.writers.values()):
            transport.close()

    def refuse(self, conn: Connection, reason: str) -> None:
        """Close a connection that never authenticated; warn about the first few only, then
        one line per REFUSAL_SUMMARY_S seconds with the count."""
        self.refused += 1
        if self.refused <= REFUSALS_SHOWN:
            more = " (further refusals are counted, one line per " \
                   f"{REFUSAL_SUMMARY_S:g} s)" if self.refused == REFUSALS_SHOWN else ""
            log.warning("refused a connection from %s: %s%s",
                        conn.transport.get_extra_info("peername"), reason, more)
        else:
            self._refusals_unshown += 1
            if self._refusal_timer is None:
                self._refusal_timer = asyncio.get_running_loop().call_later(
                    REFUSAL_SUMMARY_S, self._refusal_summary)
        conn.transport.close()

    def _refusal_summary(self) -> None:
        self._refusal_timer = None
        if self._refusals_unshown:
            log.warning("refused %d more connection(s) in the last %g s (bad, oversized or "
                        "unauthenticated hello; "
                        "%d in all)", self._refusals_unshown, REFUSAL_SUMMARY_S, self.refused)
            self._refusals_unshown = 0

    def reject(self, conn: Connection, reason: str) -> None:
        """A malformed message: a registered worker's is a job failure; close either way."""
        if conn.rank is not None:
            self._fail(f"worker {conn.rank}: protocol error: {reason}")
        conn.transport.close()
