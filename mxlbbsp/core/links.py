"""Where each registered worker is reached, and what is written to it: the rank router of the
coordinator, of a hub and of a host's relay.

A worker is reached over a connection of its own (a JSON line per message: a worker connected
to the coordinator directly, or any worker to its host's relay) or behind a *relay link*, a
connection that carries the frames of :mod:`mxlbbsp.core.frames` for several workers (a
host's relay to the coordinator or to its hub, a hub to the coordinator): a line to one of
them travels in a TO_RANK frame, a line to all in one TO_ALL frame per link, a split in one
SLICES frame per link. :class:`Links` writes them all, and passes on what comes down from
upstream (:meth:`Links.pass_down`), so that the coordinator, a hub and a relay route a rank,
a broadcast and a split the same way.

No framework import; stdlib and numpy.
"""
from __future__ import annotations

import asyncio
import bisect
import json
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P


class RelayLink:
    """A registered relay's connection: its transport, its host, the number of workers its
    hello announced, and the ranks of its workers (as they say hello)."""

    def __init__(self, index: int, transport, host: str, workers: int):
        self.index, self.transport, self.host, self.workers = index, transport, host, workers
        self.ranks: List[int] = []
        self.ranks_array = np.zeros(0, dtype=np.int64)      # sorted
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
    """What is written to one worker behind a relay: its lines in TO_RANK frames, its close
    as a CLOSE frame (the relay closes the worker's connection)."""

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


#: a worker's writer: its own connection's transport, or :class:`ViaRelay`
Writer = Union[asyncio.Transport, ViaRelay]


class _Layout:
    """Where the slices of a split go: the workers with a connection of their own (a line
    each) and one SLICES frame per relay link, for the ranks of a split (``ranks``: a SLICES
    frame's, in its order; None: every rank, rank r's slice at index r)."""

    def __init__(self, links: "Links", ranks: Optional[np.ndarray]):
        self.key = None if ranks is None else ranks.tobytes()
        where = None if ranks is None else {r: i for i, r in enumerate(ranks.tolist())}

        def kept(rs: List[int]) -> List[int]:
            return rs if where is None else [r for r in rs if r in where]

        def at(rs: List[int]) -> np.ndarray:
            return np.array(rs if where is None else [where[r] for r in rs], dtype=np.intp)

        self.direct = kept(list(links.direct))
        self.direct_at = at(self.direct)
        groups = [(relay, kept(relay.ranks_array.tolist())) for relay in links.relays]
        groups = [(relay, rs) for relay, rs in groups if rs]
        self.relays = [relay for relay, _ in groups]
        self.frames = F.SliceFrames([np.array(rs, dtype=np.int64) for _, rs in groups])
        self.at = at(self.frames.ranks.tolist())


class Links:
    """The registered workers' writers (``writers``: rank -> :data:`Writer`) and the relay
    links (``relays``, in the order they said hello); what is written to the workers."""

    def __init__(self):
        self.writers: Dict[int, Writer] = {}
        self.relays: List[RelayLink] = []
        self.direct: List[int] = []              # ranks with a connection of their own, sorted
        self._layout: Optional[_Layout] = None

    # ---- who is where ---------------------------------------------------------------------

    def add_relay(self, transport, host: str, workers: int) -> RelayLink:
        link = RelayLink(len(self.relays), transport, host, workers)
        self.relays.append(link)
        self._layout = None
        return link

    def register(self, rank: int, writer: Writer) -> None:
        self.writers[rank] = writer
        if isinstance(writer, ViaRelay):
            writer.relay.add(rank)
        else:
            bisect.insort(self.direct, rank)
        self._layout = None

    def unregister(self, rank: int) -> None:
        """A worker with a connection of its own, gone (a relay's worker)."""
        if self.writers.pop(rank, None) is not None and rank in self.direct:
            self.direct.remove(rank)
        self._layout = None

    def relay_of(self, rank: int) -> Optional[RelayLink]:
        """The relay link of a registered worker behind one (else None)."""
        writer = self.writers.get(rank)
        return writer.relay if isinstance(writer, ViaRelay) else None

    def behind(self, num_workers: int) -> np.ndarray:
        """Per rank, whether it registered through a relay."""
        out = np.zeros(num_workers, dtype=bool)
        for relay in self.relays:
            out[relay.ranks_array] = True
        return out

    # ---- what is written ------------------------------------------------------------------

    def to_rank(self, rank: int, data: bytes) -> None:
        """A line (``data``, its newline included) to worker ``rank``, if registered."""
        writer = self.writers.get(rank)
        if writer is not None and not writer.is_closing():
            writer.write(data)

    def to_all(self, data: bytes) -> None:
        """A line to every registered worker: once per connection of its own, one TO_ALL
        frame per relay link."""
        writers = self.writers
        for rank in self.direct:
            writer = writers[rank]
            if not writer.is_closing():
                writer.write(data)
        if self.relays:
            frame = F.frame(F.TO_ALL, data)
            for relay in self.relays:
                if relay.ranks and not relay.transport.is_closing():
                    relay.transport.write(frame)

    def close_rank(self, rank: int) -> None:
        writer = self.writers.get(rank)
        if writer is not None:
            writer.close()

    def send(self, rank: int, msg: dict) -> None:
        """One message to worker ``rank`` (dropped when it is gone)."""
        self.to_rank(rank, P.encode(msg))

    def broadcast(self, msg: dict) -> None:
        """One message to every worker, encoded once."""
        self.to_all(P.encode(msg))

    def send_split(self, iteration: int, split, until: Optional[int] = None) -> None:
        """Every worker its own slice of ``split`` (per rank), the split of ``iteration``
        (with ``until``: of every iteration from ``iteration`` to ``until``, a lease): a
        line per connection of its own, one SLICES frame per relay link and iteration
        (O(n) bytes)."""
        split = np.asarray(split, dtype=np.int64)
        self._slices(iteration, int(split.sum()), np.cumsum(split) - split, split,
                     until=until)

    def _slices(self, iteration: int, total: int, offsets: np.ndarray, sizes: np.ndarray,
                ranks: Optional[np.ndarray] = None, until: Optional[int] = None) -> None:
        """Workers ``ranks``' slices (None: every rank's, indexed by rank); the layout is
        kept while the registrations and the split's ranks stay the same."""
        layout = self._layout
        if layout is None or layout.key != (None if ranks is None else ranks.tobytes()):
            layout = self._layout = _Layout(self, ranks)
        if layout.direct:
            writers, line = self.writers, P.slice_line
            starts = offsets[layout.direct_at].tolist()
            counts = sizes[layout.direct_at].tolist()
            for rank, start, count in zip(layout.direct, starts, counts):
                writer = writers[rank]
                if not writer.is_closing():
                    writer.write(line(iteration, start, count, total, until))
        if layout.relays:
            at = layout.at
            # a SLICES frame holds one iteration (a relay's workers get a line each)
            for t in range(iteration, (iteration if until is None else until) + 1):
                data = memoryview(layout.frames.fill(t, total, offsets[at], sizes[at]))
                for relay, (start, end) in zip(layout.relays, layout.frames.bounds):
                    if not relay.transport.is_closing():
                        relay.transport.write(data[start:end])

    def pass_down(self, kind: int, body: bytes) -> bool:
        """A frame from upstream for the workers routed here (SLICES, TO_RANK, CLOSE,
        TO_ALL), passed on; False for a frame of any other kind (the owner's)."""
        if kind == F.SLICES:
            iteration, total, (ranks, offsets, sizes) = F.read_slices(body)
            self._slices(iteration, total, offsets, sizes, ranks)
        elif kind == F.TO_RANK:
            self.to_rank(*F.split_rank(body))
        elif kind == F.CLOSE:
            self.close_rank(F.split_rank(body)[0])
        elif kind == F.TO_ALL:
            self.to_all(bytes(body))
        else:
            return False
        return True

    def hand_off(self, forecast: dict, part_of: Callable[[dict, Sequence[int]], dict]) -> int:
        """Each relay link its part of a forecast hand-off, in a CONFIG frame: ``forecast``
        (predictor, exog, from) with ``ranks``, the workers its ``state`` covers (None: no
        state), in that order; a relay gets its own ranks among them (sorted) and
        ``part_of(state, their positions)``. How many relays got one."""
        where = {int(r): i for i, r in enumerate(forecast["ranks"])}
        state = forecast.get("state")
        sent = 0
        for relay in self.relays:
            mine = sorted(r for r in relay.ranks if r in where)
            if not mine:
                continue
            part = dict(forecast, ranks=mine, state=None)
            if state:
                part["state"] = part_of(state, [where[r] for r in mine])
            # a predictor's state may hold NaN: plain JSON, not the protocol's lines
            relay.transport.write(F.frame(F.CONFIG, json.dumps({"forecast": part}).encode()))
            sent += 1
        return sent

    def close_all(self) -> None:
        for rank in self.direct:
            self.writers[rank].close()
        for relay in self.relays:
            relay.transport.close()
