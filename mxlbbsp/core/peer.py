"""One connection of the control plane, on whichever side: the coordinator's, a host's relay's
and a hub's peers, and a relay's or a hub's own connection up to the coordinator.

A listening side checks a connection's first line through its :class:`Gate`: a hello of a
type it takes (a worker's ``hello``, a relay's ``relay``) with the job's token, in at most
:data:`~mxlbbsp.core.protocol.MAX_HELLO` bytes and :data:`HELLO_S` seconds; nothing longer
is read or parsed before it. What fails is refused: closed, counted, and warned about
(:class:`Refusals`: the first few one by one, then a count per interval, so that a port scan
or a flood cannot flood the user's output). After a worker's hello come lines (at most
:data:`~mxlbbsp.core.protocol.MAX_LINE` bytes each), after a relay's the frames of
:mod:`mxlbbsp.core.frames`; a connection a relay or a hub opened itself (its hello said)
carries frames from the start.

:class:`Peer` is the asyncio protocol, one per connection: it splits the bytes and hands them
to its owner, a :class:`PeerHandler`. A protocol rather than a stream reader: no coroutine
resumes per message, which is most of the cost when hundreds of peers write at once.

Stdlib only (asyncio), no framework import.
"""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import List, Optional, Protocol, Sequence, Tuple

from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P

log = logging.getLogger(__name__)

#: a connection without a valid hello for this long is closed
HELLO_S = 30.0
#: "refused a connection" warnings: the first few one by one, then one line per interval
REFUSALS_SHOWN = 5
REFUSAL_SUMMARY_S = 10.0


class Refusals:
    """The connections a side closed before a valid hello: counted; the first ``shown`` each
    with a warning (``label``: who refused), then one line per ``every`` seconds with the
    count."""

    def __init__(self, label: str, shown: int, every: float):
        self.label, self.shown, self.every = label, shown, every
        self.count = 0
        self._unshown = 0
        self._timer: Optional[asyncio.TimerHandle] = None

    def refuse(self, transport: asyncio.BaseTransport, reason: str) -> None:
        self.count += 1
        who = f"{self.label} refused" if self.label else "refused"
        if self.count <= self.shown:
            more = (f" (further refusals are counted, one line per {self.every:g} s)"
                    if self.count == self.shown else "")
            peer = transport.get_extra_info("peername")
            log.warning("%s a connection%s: %s%s", who, f" from {peer}" if peer else "",
                        reason, more)
        else:
            self._unshown += 1
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.every, self._summary,
                                                                   who)
        transport.close()

    def _summary(self, who: str) -> None:
        self._timer = None
        if self._unshown:
            log.warning("%s %d more connection(s) in the last %g s (bad, oversized or "
                        "unauthenticated hello; %d in all)", who, self._unshown, self.every,
                        self.count)
            self._unshown = 0


class Gate:
    """What a listening side lets in: a first line that is a hello of one of ``accepts``'
    types (:data:`~mxlbbsp.core.protocol.HELLO`, :data:`~mxlbbsp.core.protocol.RELAY`) with
    ``token``; the rest goes to ``refusals``."""

    __slots__ = ("token", "accepts", "refusals")

    def __init__(self, token: str, accepts: Sequence[str], refusals: Refusals):
        self.token, self.accepts, self.refusals = token, tuple(accepts), refusals


class PeerHandler(Protocol):
    """What a :class:`Peer` calls of the side that owns it.

    Behind a :class:`Gate`: ``on_hello`` with the first line, then ``on_line`` for each line
    of a worker, or ``on_frames`` for each read's frames of a relay. A connection the owner
    opened itself calls ``on_frames`` only. ``on_malformed`` when frames cannot be read or
    taken; ``on_lost`` once a connection whose hello was taken (or that the owner opened)
    closes. An owner implements those its connections can reach.
    """

    def on_hello(self, peer: "Peer", msg: dict, line: bytes) -> bool:
        """A hello the gate lets in: True once taken (the owner sets ``peer.rank`` or
        ``peer.relay``), False once answered and closed by the owner; ProtocolError,
        ValueError, KeyError or TypeError refuse it."""

    def on_line(self, peer: "Peer", line: bytes) -> bool:
        """A line after a worker's hello (or the first MAX_LINE + 1 bytes of a longer one);
        False when the connection is done with."""

    def on_frames(self, peer: "Peer", frames: List[Tuple[int, bytes]]) -> bool:
        """The complete frames of one read, (kind, body); False when the connection is done
        with; ProtocolError, ValueError, KeyError or TypeError: ``on_malformed``."""

    def on_malformed(self, peer: "Peer", reason: str) -> None:
        """Frames that could not be read or taken: nothing more is read of them."""

    def on_lost(self, peer: "Peer") -> None:
        """The connection closed."""


class Peer(asyncio.Protocol):
    """One connection (see the module docstring): ``gate`` for one a side accepted, None for
    one it opened (frames from the start). ``rank`` (a worker's) and ``relay`` (a relay's
    link) are its owner's, set when it takes the hello."""

    def __init__(self, handler: PeerHandler, gate: Optional[Gate] = None):
        self.handler, self.gate = handler, gate
        self.transport: Optional[asyncio.Transport] = None
        self.rank: Optional[int] = None
        self.relay = None
        self.greeted = gate is None             # its hello taken
        self.frames = gate is None              # frames from here on: a relay's hello
        self._buffer = bytearray()
        self._timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # every write is a whole message or a whole iteration's frames: none may wait
            # for Nagle's algorithm (asyncio sets it too; said here whatever the transport)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.gate is not None:
            self._timer = asyncio.get_running_loop().call_later(HELLO_S, self._no_hello)

    def _no_hello(self) -> None:
        if not self.greeted:
            self.transport.close()

    def refuse(self, reason: str) -> None:
        """Close a connection that did not say a valid hello (counted, warned about)."""
        self.gate.refusals.refuse(self.transport, reason)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():     # refused or rejected: read nothing more
            return
        buffer = self._buffer
        buffer += data
        if self.frames:
            self._read_frames()
            return
        start = 0
        while True:
            limit = P.MAX_LINE if self.greeted else P.MAX_HELLO
            end = buffer.find(b"\n", start, start + limit + 1)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if not (self.handler.on_line(self, line) if self.greeted else self._hello(line)):
                buffer.clear()
                return
            if self.frames:                 # a relay's hello: frames from here on
                del buffer[:start]
                self._read_frames()
                return
        del buffer[:start]
        limit = P.MAX_LINE if self.greeted else P.MAX_HELLO
        if len(buffer) > limit:
            head = bytes(buffer[:limit + 1])
            buffer.clear()
            if self.greeted:                # the owner's parser says what is wrong with it
                self.handler.on_line(self, head)
            else:
                self.refuse(f"first line longer than {limit} bytes")

    def _hello(self, line: bytes) -> bool:
        gate = self.gate
        try:
            msg = P.decode(line, P.MAX_HELLO)
            if msg["type"] not in gate.accepts or not P.token_ok(msg, gate.token):
                raise P.ProtocolError("bad hello or token")
            if not self.handler.on_hello(self, msg, line):
                return False
        except (P.ProtocolError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.refuse(str(exc) if isinstance(exc, P.ProtocolError) else "malformed hello")
            return False
        self.greeted = True
        self.frames = msg["type"] == P.RELAY
        return True

    def _read_frames(self) -> None:
        buffer = self._buffer
        try:
            frames, used = F.split_frames(buffer)
            del buffer[:used]
            if frames and not self.handler.on_frames(self, frames):
                buffer.clear()
        except (P.ProtocolError, ValueError, KeyError, TypeError) as exc:
            buffer.clear()
            self.handler.on_malformed(self, str(exc))

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.greeted:
            self.handler.on_lost(self)
