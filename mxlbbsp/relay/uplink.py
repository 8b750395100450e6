"""A relay's or a hub's connection to the coordinator (a relay behind a hub: to its hub, which
is the coordinator to it): reaching it at the start, the hello, the writes up, the frames
that come down (to the workers below, routed by the owner's
:class:`~mxlbbsp.core.links.Links`, or the CONFIG, to the owner), its own port for the
connections below it, and the end of the process.

Its owner (:class:`~.relay.Relay`, :class:`~.hub.Hub`) is an :class:`UplinkOwner`, and the
:class:`~mxlbbsp.core.peer.PeerHandler` of the connections its port lets in.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import List, Optional, Protocol, Tuple

from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.core.links import Links
from mxlbbsp.core.peer import REFUSAL_SUMMARY_S, REFUSALS_SHOWN, Gate, Peer, Refusals

#: how long a relay or a hub tries to reach the coordinator at its start
CONNECT_S = 60.0


class UplinkOwner(Protocol):
    """What an :class:`Uplink` calls of the relay or hub that owns it."""

    def on_config(self, config: dict, body: bytes) -> None:
        """The coordinator's CONFIG (``body``: the frame's); ProtocolError, ValueError,
        KeyError or TypeError for one it cannot take, which ends the process."""

    def upstream_lost(self) -> None:
        """The connection closed: the owner ends (:meth:`Uplink.end`)."""

    def closing(self) -> None:
        """The end: close what it holds, flush what is pending (before the connection
        closes)."""


class Uplink:
    """The connection (see the module docstring); ``label``: what the owner's error and
    warning lines call it. Its port lets in hellos of ``accepts``' types with ``token``;
    ``links`` route what comes down to the workers below. ``transport`` once connected,
    ``server`` once it listens."""

    def __init__(self, owner: UplinkOwner, label: str, token: str, accepts: Tuple[str, ...],
                 links: Links):
        self.owner, self.label, self.links = owner, label, links
        self.gate = Gate(token, accepts, Refusals(label, REFUSALS_SHOWN, REFUSAL_SUMMARY_S))
        self.transport: Optional[asyncio.Transport] = None
        self.server: Optional[asyncio.AbstractServer] = None
        self.frames_up = 0                   # statistics (tests, benchmarks)
        self.writes_up = 0
        self._done: Optional[asyncio.Future] = None
        self._closed: Optional[asyncio.Future] = None

    async def serve(self, upstream: P.Address, listen: P.Address, name: str,
                    workers: int) -> int:
        """Reach the coordinator at ``upstream`` and say a relay's hello (``name``, serving
        ``workers``), listen at ``listen``, and serve until :meth:`end`; the exit code.
        ConnectionError when the coordinator cannot be reached for CONNECT_S."""
        loop = asyncio.get_running_loop()
        self._done, self._closed = loop.create_future(), loop.create_future()
        self.transport = await self._connect(upstream)
        self.transport.write(P.encode(P.relay_hello(self.gate.token, name, workers,
                                                    os.getpid())))

        def factory() -> Peer:
            return Peer(self.owner, self.gate)
        if isinstance(listen, str):
            self.server = await loop.create_unix_server(factory, listen, backlog=1024)
        else:
            self.server = await loop.create_server(factory, *listen, backlog=1024)
        try:
            return await self._done
        finally:
            self.server.close()
            self.owner.closing()
            self.transport.close()        # what is written leaves first (at most 5 s)
            try:
                await asyncio.wait_for(asyncio.shield(self._closed), 5.0)
            except asyncio.TimeoutError:
                pass

    async def _connect(self, upstream: P.Address) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                if isinstance(upstream, str):
                    transport, _ = await loop.create_unix_connection(lambda: Peer(self), upstream)
                else:
                    transport, _ = await loop.create_connection(lambda: Peer(self), *upstream)
                return transport
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"cannot reach the coordinator at "
                                          f"{P.format_address(upstream)}: {exc}") from None
                await asyncio.sleep(0.2)

    def send(self, frames: List[bytes]) -> None:
        """Frames to the coordinator, in one write (none once the connection is closing)."""
        self.frames_up += len(frames)
        if self.transport is not None and not self.transport.is_closing():
            self.writes_up += 1
            self.transport.write(b"".join(frames))

    def end(self, code: int, message: Optional[str] = None) -> None:
        """End the process's service with exit code ``code`` (``message``: its one line)."""
        if message:
            sys.stderr.write(f"mxlbbsp: error: {message}\n")
            sys.stderr.flush()
        if self._done is not None and not self._done.done():
            self._done.set_result(code)

    # ---- the connection (mxlbbsp.core.peer.PeerHandler: frames from the coordinator) --------

    def on_frames(self, peer: Peer, frames: List[Tuple[int, bytes]]) -> bool:
        for kind, body in frames:
            if self.links.pass_down(kind, body):
                continue
            if kind != F.CONFIG:
                raise F.FrameError(f"a frame of unknown kind {kind}")
            self.owner.on_config(json.loads(body), body)
        return True

    def on_malformed(self, peer: Peer, reason: str) -> None:
        self.end(1, f"{self.label}: a malformed frame from the coordinator ({reason})")

    def on_lost(self, peer: Peer) -> None:
        if not self._closed.done():
            self._closed.set_result(None)
        self.owner.upstream_lost()
