"""The coordinator's connections: one asyncio protocol per peer, and what is written to them.

A peer is a worker connected directly (JSON lines, :mod:`mxlbbsp.core.protocol`) or a host's
relay (:mod:`mxlbbsp.relay`): its hello is a JSON line too, then frames
(:mod:`mxlbbsp.core.frames`) in both directions. :class:`Connection` splits a peer's bytes
into lines or frames and hands each to the coordinator (``Coordinator.on_line``,
``Coordinator.on_frame``); before a connection has authenticated (its hello, with the job's
token) nothing longer than :data:`~mxlbbsp.core.protocol.MAX_HELLO` is read.
:class:`Links` holds the registered workers' writers (a worker's own socket, or its relay's
with the worker's rank: :class:`ViaRelay`) and writes to them: one message, the same message
to all (one frame per relay), or every worker its own slice of the global batch (one SLICES
frame per relay); and it refuses connections that never authenticate, rate-limiting the
warnings (a port scan or a flood must not flood the user's output).

No framework import.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
from typing import Dict, List, Optional

import numpy as np

from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P

log = logging.getLogger(__name__)

#: "refused a connection" warnings: the first few one by one, then one line per interval
REFUSALS_SHOWN = 5
REFUSAL_SUMMARY_S = 10.0


class Connection(asyncio.Protocol):
    """One peer's connection: its lines (or, once it said hello as a relay, its frames) go
    to the coordinator as they arrive.

    A protocol rather than a stream reader: no coroutine resumes per message, which is most
    of the cost when hundreds of peers write at the same moment.
    """

    def __init__(self, coordinator):
        self.coordinator = coordinator
        self.transport: Optional[asyncio.Transport] = None
        self.rank: Optional[int] = None          # set by a worker's valid hello
        self.relay: Optional["RelayLink"] = None  # set by a relay's valid hello
        self._buffer = bytearray()
        self._hello_timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._hello_timer = asyncio.get_running_loop().call_later(30, self._no_hello)

    def _no_hello(self) -> None:
        if self.rank is None and self.relay is None:
            self.transport.close()

    def _limit(self) -> int:
        """The longest line read: a hello's until the connection has authenticated."""
        return P.MAX_HELLO if self.rank is None else P.MAX_LINE

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():     # refused or rejected: read nothing more
            return
        buffer = self._buffer
        buffer += data
        if self.relay is not None:
            self._frames()
            return
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
            if self.relay is not None:      # a relay's hello: frames from here on
                del buffer[:start]
                self._frames()
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

    def _frames(self) -> None:
        try:
            frames, used = F.split_frames(self._buffer)
        except F.FrameError as exc:
            self._buffer.clear()
            self.coordinator.links.reject(self, str(exc))
            return
        del self._buffer[:used]
        on_frame = self.coordinator.on_frame
        for kind, body in frames:
            if not on_frame(self, kind, body):
                self._buffer.clear()
                return

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.coordinator.on_lost(self)


class RelayLink:
    """A registered relay: its connection, its host, the ranks of its workers (as they say
    hello), and what it forwarded of each."""

    def __init__(self, index: int, conn: Connection, host: str, workers: int):
        self.index, self.conn, self.host, self.workers = index, conn, host, workers
        self.transport = conn.transport
        self.ranks: List[int] = []
        self.ranks_array = np.zeros(0, dtype=np.int64)
        self._mask: Optional[np.ndarray] = None
        self._served: set = set()            # rank sets (their bytes) found served

    def add(self, rank: int) -> None:
        self.ranks.append(rank)
        self.ranks_array = np.array(sorted(self.ranks), dtype=np.int64)
        self._mask = None

    def serves(self, ranks: np.ndarray) -> bool:
        """Whether every one of ``ranks`` registered through this relay (the sets seen
        before remembered: a host sends the same ranks every iteration)."""
        key = ranks.tobytes()
        if key in self._served:
            return True
        if self._mask is None:
            self._mask = np.zeros(self.ranks_array[-1] + 1 if self.ranks else 0, dtype=bool)
            self._mask[self.ranks_array] = True
        try:
            ok = bool(self._mask[ranks].all()) and (len(ranks) == 0 or ranks.min() >= 0)
        except IndexError:
            return False
        if ok and len(self._served) < 64:
            self._served.add(key)
        return ok

    def describe(self) -> str:
        return f"the relay of host {self.host}"


class ViaRelay:
    """What the coordinator writes to one worker behind a relay: the line in a TO_RANK frame
    (``close``: a CLOSE frame; the relay closes the worker's connection)."""

    __slots__ = ("relay", "rank")

    def __init__(self, relay: RelayLink, rank: int):
        self.relay, self.rank = relay, rank

    def write(self, data: bytes) -> None:
        self.relay.transport.write(F.rank_frame(F.TO_RANK, self.rank, data))

    def is_closing(self) -> bool:
        return self.relay.transport.is_closing()

    def close(self) -> None:
        if not self.relay.transport.is_closing():
            self.relay.transport.write(F.rank_frame(F.CLOSE, self.rank))


class _Slices:
    """Every relay's SLICES frame of an iteration, written in arrays: one int64 buffer holds
    all the frames one after the other (their fixed words written once per registration),
    each iteration fills in the iteration, the total and every worker's offset and size in
    three indexed assignments, and each relay gets its part of the buffer's bytes."""

    def __init__(self):
        self.layout = None

    def _build(self, relays: List["RelayLink"]) -> tuple:
        words, bounds, ranks, head, offsets, sizes = [], [], [], [], [], []
        at = 0
        for relay in relays:
            k = len(relay.ranks_array)
            n_words = 1 + 3 + 3 * k                 # frame header, head, three columns
            block = np.zeros(n_words, dtype="<i8")
            block[0] = F.SLICES | ((n_words - 1) * 8) << 32     # kind u8, 3 pad, length u32
            block[3] = k
            block[4:4 + k] = relay.ranks_array
            words.append(block)
            bounds.append((8 * at, 8 * (at + n_words)))
            head.append(at + 1)
            ranks.append(relay.ranks_array)
            offsets.append(at + 4 + k + np.arange(k))
            sizes.append(at + 4 + 2 * k + np.arange(k))
            at += n_words
        cat = (lambda parts, dtype=np.intp: np.concatenate(parts).astype(dtype)
               if parts else np.zeros(0, dtype=dtype))
        return (np.concatenate(words) if words else np.zeros(0, dtype="<i8"), bounds,
                np.array(head, dtype=np.intp), cat(ranks), cat(offsets), cat(sizes))

    def send(self, relays: List["RelayLink"], iteration: int, total: int,
             offsets: np.ndarray, sizes: np.ndarray) -> None:
        if self.layout is None:
            self.layout = self._build(relays)
        buffer, bounds, head, ranks, at_offsets, at_sizes = self.layout
        buffer[head] = iteration
        buffer[head + 1] = total
        buffer[at_offsets] = offsets[ranks]
        buffer[at_sizes] = sizes[ranks]
        data = memoryview(buffer.tobytes())
        for relay, (start, end) in zip(relays, bounds):
            if end - start > 32 and not relay.transport.is_closing():
                relay.transport.write(data[start:end])


class Links:
    """The registered workers' writers (rank -> a transport, or :class:`ViaRelay`), the
    relays, and the refusals.

    ``fail(message)``: a registered peer's malformed message fails the job."""

    def __init__(self, fail, num_workers: int):
        self._fail = fail
        self.writers: Dict[int, object] = {}
        self.relays: List[RelayLink] = []
        #: per rank: the index of its relay, -1 for a worker connected directly (or none)
        self.owner = np.full(num_workers, -1, dtype=np.int64)
        self._direct: List[int] = []            # ranks connected directly, in rank order
        self._slices = _Slices()
        self.refused = 0                         # connections refused before a hello
        self._refusals_unshown = 0
        self._refusal_timer = None

    def register(self, rank: int, writer, relay: Optional[RelayLink] = None) -> None:
        self.writers[rank] = writer
        if relay is None:
            bisect.insort(self._direct, rank)
        else:
            relay.add(rank)
            self.owner[rank] = relay.index
            self._slices.layout = None

    def add_relay(self, conn: Connection, host: str, workers: int) -> RelayLink:
        link = RelayLink(len(self.relays), conn, host, workers)
        self.relays.append(link)
        self._slices.layout = None
        return link

    def send(self, rank: int, msg: dict) -> None:
        w = self.writers.get(rank)
        if w is not None and not w.is_closing():
            w.write(P.encode(msg))

    def broadcast(self, msg: dict) -> None:
        data = P.encode(msg)
        for rank in self._direct:
            w = self.writers.get(rank)
            if w is not None and not w.is_closing():
                w.write(data)
        frame = F.frame(F.TO_ALL, data)
        for relay in self.relays:
            if relay.ranks and not relay.transport.is_closing():
                relay.transport.write(frame)

    def send_split(self, iteration: int, split) -> None:
        """Every worker its own slice of ``split``, iteration's global batch: a line per
        worker connected directly, one SLICES frame per relay (O(n) bytes)."""
        sizes = np.asarray(split, dtype=np.int64)
        total = int(sizes.sum())
        offsets = np.cumsum(sizes) - sizes
        if self._direct:
            writers, line = self.writers, P.alloc_line
            starts, counts = offsets.tolist(), sizes.tolist()
            for rank in self._direct:
                w = writers.get(rank)
                if w is not None and not w.is_closing():
                    w.write(line(iteration, starts[rank], counts[rank], total))
        if self.relays:
            self._slices.send(self.relays, iteration, total, offsets, sizes)

    def close_all(self) -> None:
        for rank in self._direct:
            self.writers[rank].close()
        for relay in self.relays:
            relay.transport.close()

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
        """A malformed message: a registered peer's is a job failure; close either way."""
        if conn.rank is not None:
            self._fail(f"worker {conn.rank}: protocol error: {reason}")
        elif conn.relay is not None:
            self._fail(f"{conn.relay.describe()}: protocol error: {reason}")
        conn.transport.close()
