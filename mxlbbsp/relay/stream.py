"""What a relay or a hub holds back for the coordinator, in the order it must leave.

A *section* gathers the reports, or the dones, of one iteration from several workers (a
relay's rows, a hub's relays' sections), to leave as one ROWS frame; any other frame (a
worker's message forwarded, a LOST, a hub's FORECAST) waits in line with them. Each worker's
messages leave in the order it sent them: an entry joins the open section of its type and
iteration only when none of its workers has anything later pending (nor a row in that section
already), else it opens a new section after them. Frames *ahead* (FORECAST, STATE) lead the
next write. The owner decides when (its hold times, :meth:`PendingStream.arm`); a flush
sends everything pending in one write.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Dict, List, Optional, Sequence, Union


class Section:
    """Pending reports or dones of one (type, iteration): its ``entries`` (the owner's: a
    relay's rows, a hub's relays' sections) and the ranks they hold."""

    __slots__ = ("key", "index", "entries", "ranks")

    def __init__(self, key: tuple, index: int):
        self.key, self.index, self.entries, self.ranks = key, index, [], set()


class PendingStream:
    """The pending stream (see the module docstring). ``encode(section, now)``: a section's
    frames at a flush; ``send(frames)``: one write of them to the coordinator."""

    def __init__(self, encode: Callable[[Section, float], List[bytes]],
                 send: Callable[[List[bytes]], None]):
        self._encode, self._send = encode, send
        self.items: List[Union[Section, bytes]] = []   # sections and frames, in order
        self.open: Dict[tuple, Section] = {}           # (type, iteration) -> its open section
        self._last_of: Dict[int, int] = {}             # rank -> index of its latest item
        #: (type, iteration) -> the ranks that sent theirs (kept a few iterations past a flush)
        self.seen: Dict[tuple, set] = {}
        self.ahead: List[bytes] = []                   # frames that lead the next write
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at = 0.0                           # when it flushes (the loop's clock)

    def add(self, key: tuple, ranks: Sequence[int], entry) -> Section:
        """``entry`` of workers ``ranks`` into the open section of ``key`` (or a new one);
        that section."""
        section, last_of = self.open.get(key), self._last_of
        fresh = section is None
        if not fresh:                   # a loop, not any(): once per message in a relay
            index, held = section.index, section.ranks
            for r in ranks:
                if last_of.get(r, -1) > index or r in held:
                    fresh = True
                    break
        if fresh:
            section = self.open[key] = Section(key, len(self.items))
            self.items.append(section)
        section.entries.append(entry)
        section.ranks.update(ranks)
        index = section.index
        for r in ranks:
            last_of[r] = index
        seen = self.seen.get(key)
        if seen is None:
            seen = self.seen[key] = set()
        seen.update(ranks)
        return section

    def forward(self, ranks: Sequence[int], frame: bytes) -> None:
        """A frame of workers ``ranks``: after whatever of theirs is pending, before whatever
        of theirs comes next."""
        for r in ranks:
            self._last_of[r] = len(self.items)
        self.items.append(frame)

    def complete(self, active: int, every: bool = True) -> bool:
        """Whether every (else any) open section holds rows of ``active`` workers."""
        test = all if every else any
        return test(len(self.seen.get(key, ())) >= active for key in self.open)

    def only(self, what: str, active: int) -> bool:
        """Whether all that is pending is sections of type ``what`` with rows of ``active``
        workers."""
        return all(not isinstance(item, bytes) and item.key[0] == what
                   and len(self.seen.get(item.key, ())) >= active for item in self.items)

    def arm(self, delay: float) -> None:
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

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def flush(self) -> None:
        """Everything pending, in order, in one write: the frames ahead, then each pending
        frame as it is and each section as ``encode`` makes it (nothing while only frames
        ahead wait: they lead the next write)."""
        self.disarm()
        if not self.items:
            return
        now = time.monotonic()
        out, self.ahead = self.ahead, []
        for item in self.items:
            if isinstance(item, bytes):
                out.append(item)
            else:
                out += self._encode(item, now)
        self.items, self.open, self._last_of = [], {}, {}
        if len(self.seen) > 8:             # keep the latest iterations' only
            latest = max(t for _, t in self.seen)
            self.seen = {k: v for k, v in self.seen.items() if k[1] >= latest - 2}
        self._send(out)
