"""What a host's relay and a hub share: their connection to the coordinator (frames in),
how they reach it at their start, how they end, and their flush timer.

An owner (:class:`~.relay.Relay`, :class:`~.hub.Hub`) has ``token``, ``label`` (what its
error lines call it), ``on_frame(kind, body)``, ``upstream_lost()``, ``_encode(section,
now)`` (a pending section's frames) and ``_closing()`` for its end; :class:`Node` gives it
the rest: the pending stream's state and its flush.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from typing import Dict, List, Optional

from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P

log = logging.getLogger(__name__)

#: how long a relay or a hub tries to reach the coordinator at its start
CONNECT_S = 60.0
#: refused connections warned about one by one, then only counted
REFUSALS_SHOWN = 5


class Node:
    """The upstream connection's state, the end of ``run()`` and the flush timer."""

    label = "the relay"

    def _init_node(self) -> None:
        self._pending: List[object] = []     # sections and ready frames, in arrival order
        self._open: Dict[tuple, object] = {}  # (type, iteration) -> its open section
        self._last_of: Dict[int, int] = {}   # a source -> index of its latest pending item
        self._seen: Dict[tuple, object] = {}  # (type, iteration) -> what of it came
        self._ahead: List[bytes] = []        # frames ahead of the next write
        self.refused = 0                     # connections refused
        self.frames_up = 0                   # statistics (tests, benchmarks)
        self.writes_up = 0
        self._up: Optional[asyncio.Transport] = None
        self._up_buffer = bytearray()
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at = 0.0                 # when it flushes (the loop's clock)
        self._done: Optional[asyncio.Future] = None
        self._up_closed: Optional[asyncio.Future] = None

    async def _serve(self, upstream: P.Address, listen: P.Address, name: str, workers: int,
                     factory) -> int:
        """Reach the coordinator, say hello (``name`` and ``workers`` as a relay's hello),
        listen at ``listen`` for ``factory``'s connections, and serve until ``_end``; the
        exit code. ``_closing()`` then closes what the owner holds."""
        loop = asyncio.get_running_loop()
        await self._connect(upstream)
        self._up.write(P.encode(P.relay_hello(self.token, name, workers, os.getpid())))
        if isinstance(listen, str):
            self._server = await loop.create_unix_server(factory, listen, backlog=1024)
        else:
            self._server = await loop.create_server(factory, *listen, backlog=1024)
        try:
            return await self._done
        finally:
            self._server.close()
            self._closing()
            await self._close_up()

    async def _connect(self, upstream: P.Address) -> None:
        """Connect to the coordinator (retrying for CONNECT_S; ConnectionError then)."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._up_closed = loop.create_future()
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                if isinstance(upstream, str):
                    await loop.create_unix_connection(lambda: Uplink(self), upstream)
                else:
                    await loop.create_connection(lambda: Uplink(self), *upstream)
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"cannot reach the coordinator at "
                                          f"{P.format_address(upstream)}: {exc}") from None
                await asyncio.sleep(0.2)

    async def _close_up(self) -> None:
        """What is written leaves, then the connection closes (at most 5 s)."""
        if self._up is not None:
            self.flush()
            self._up.close()
            try:
                await asyncio.wait_for(asyncio.shield(self._up_closed), 5.0)
            except asyncio.TimeoutError:
                pass

    def _end(self, code: int, message: Optional[str] = None) -> None:
        if message:
            sys.stderr.write(f"mxlbbsp: error: {message}\n")
            sys.stderr.flush()
        if self._done is not None and not self._done.done():
            self._done.set_result(code)

    def _arm(self, delay: float) -> None:
        """Flush within ``delay`` seconds (0: once what was read is handled), or sooner if
        already due."""
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer_at = due
        self._timer = loop.call_later(delay, self.flush) if delay > 0 \
            else loop.call_soon(self.flush)

    def flush(self) -> None:
        """Everything pending to the coordinator, in order, in one write: the frames ahead
        (FORECAST, STATE), then each pending frame as it is and each section as
        ``_encode(section, now)`` makes it."""
        self._disarm()
        if not self._pending:
            return
        now = time.monotonic()
        out, self._ahead = self._ahead, []
        for item in self._pending:
            if isinstance(item, bytes):
                out.append(item)
            else:
                out += self._encode(item, now)
        self._pending, self._open, self._last_of = [], {}, {}
        if len(self._seen) > 8:             # keep the latest iterations' only
            latest = max(t for _, t in self._seen)
            self._seen = {k: v for k, v in self._seen.items() if k[1] >= latest - 2}
        self._send(out)

    def _send(self, frames: List[bytes]) -> None:
        self.frames_up += len(frames)
        if self._up is not None and not self._up.is_closing():
            self.writes_up += 1
            self._up.write(b"".join(frames))

    def _refuse(self, transport, reason: str) -> None:
        """Close a connection that did not say a valid hello (the first REFUSALS_SHOWN
        with a warning)."""
        self.refused += 1
        if self.refused <= REFUSALS_SHOWN:
            log.warning("%s refused a connection: %s", self.label, reason)
        transport.close()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _encode(self, section, now: float) -> List[bytes]:   # pragma: no cover - owners'
        raise NotImplementedError

    def _closing(self) -> None:           # pragma: no cover - the owners'
        raise NotImplementedError

    def on_frame(self, kind: int, body) -> None:   # pragma: no cover - the owners'
        raise NotImplementedError

    def upstream_lost(self) -> None:      # pragma: no cover - the owners'
        raise NotImplementedError


class Uplink(asyncio.Protocol):
    """A relay's or a hub's connection to the coordinator: frames in."""

    def __init__(self, node: Node):
        self.node = node

    def connection_made(self, transport) -> None:
        self.node._up = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        node = self.node
        buffer = node._up_buffer
        buffer += data
        try:
            frames, used = F.split_frames(buffer)
            del buffer[:used]
            for kind, body in frames:
                node.on_frame(kind, body)
        except (F.FrameError, P.ProtocolError, ValueError, KeyError) as exc:
            node._end(1, f"{node.label}: a malformed frame from the coordinator ({exc})")

    def connection_lost(self, exc) -> None:
        node = self.node
        node._up = None
        if not node._up_closed.done():
            node._up_closed.set_result(None)
        node.upstream_lost()
