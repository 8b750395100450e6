"""A hub: a relay of relays, between the hosts' relays and the coordinator in a large job.

At 1024 workers, 8 to a host, the coordinator has 128 relays to read and write to every
iteration: one wake-up, one read and one write per relay, two sections to parse per relay
(a host's dones, then its reports), which is most of its CPU per iteration once the model is
cheap (benchmarks/README.md, coordinator scale). A hub takes a group of relays (``mxlbbsp
launch --hubs``: 8 hosts each, launcher/config.py's RELAYS_PER_HUB) and is one relay to the
coordinator: ``python -m mxlbbsp.relay.hub``, on the launcher's machine, under a guard like
every role.

To the relays it is the coordinator: they say hello to it (the job's token, checked here),
it hands them the coordinator's CONFIG (their part of a ``forecast`` hand-off: their ranks
and the part of the predictor's state that is theirs) and passes on what comes down:

* a SLICES frame cut into one per relay, TO_RANK and CLOSE to the relay of the rank, TO_ALL
  to every relay;

and up:

* the relays' sections of reports or dones of one iteration merge into one section
  (:func:`mxlbbsp.core.frames.merge_rows`: the same rows, their waits grown by the time they
  spent here), which leaves once every worker of the hub has its row in every open section
  (a host's dones and next reports come in one write: both complete with the last relay's
  write, and leave together), or after the CONFIG's ``hold_s``; with ``hold_s`` 0 (modes
  without a barrier) what was read at once leaves at once;
* FORWARD, LOST and FORECAST frames as they are, each worker's messages in the order it
  sent them (a section is only joined by rows of workers with nothing later pending, as a
  relay's sections are: a worker's log line between its done and its next report starts
  no section of its own; a FORECAST frame comes after the sections of its workers that left
  without forecasts, or they would undo it); STATE frames ahead of the next write.

A relay whose connection closes before its workers said bye: LOST for each of them (the
coordinator fails the job, naming them; the launcher names the relay's host). When the
coordinator's connection breaks the hub closes its relays' (they end as with a lost
coordinator) and exits 1 with one line; once every relay of its group has come and gone, 0.

Stdlib, numpy and the predictors' state helpers; no MXNet.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from typing import Dict, List, Optional

import numpy as np

from mxlbbsp import predictors as _pred
from mxlbbsp.core import env as _env
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.relay.uplink import Node

log = logging.getLogger(__name__)

#: a relay's connection without a hello for this long is closed
HELLO_S = 30.0


class _Section:
    """Pending sections of one (type, iteration): (relay id, ROWS body, when it was read)."""

    __slots__ = ("key", "index", "parts")

    def __init__(self, key, index):
        self.key, self.index, self.parts = key, index, []


class Hub(Node):
    """A group of relays' hub (see the module docstring): ``await run()`` serves until it
    ends and returns the exit code. ``relays``: how many relays of the job connect to it;
    ``workers``: how many workers they serve in all."""

    def __init__(self, listen: P.Address, upstream: P.Address, token: str, name: str,
                 relays: int, workers: int):
        self.listen, self.upstream, self.token = listen, upstream, token
        self.name, self.expected_relays, self.expected = name, int(relays), int(workers)
        self.hold_s = 0.0
        self.links: List["_RelayLink"] = []     # relays that said hello, in that order
        self.child_of: Dict[int, "_RelayLink"] = {}    # rank -> its relay
        self.active: set = set()                # registered ranks that have not said bye
        self._config: Optional[bytes] = None    # the coordinator's first CONFIG, for late relays
        self.label = name
        self._init_node()       # its pending stream: per rank; _seen: the rows come of each
        self._server = None     # (type, iteration); _ahead: STATE frames
        self.sections_in = self.sections_up = 0  # statistics (tests, benchmarks)

    # ---- lifecycle --------------------------------------------------------------------

    async def run(self) -> int:
        return await self._serve(self.upstream, self.listen, self.name, self.expected,
                                 lambda: _RelayLink(self))

    def _closing(self) -> None:
        for link in self.links:
            link.transport.close()

    def upstream_lost(self) -> None:
        if len(self.links) >= self.expected_relays and not self.active \
                and len(self.child_of) >= self.expected:
            self._end(0)                        # every worker had said bye
        else:
            self._end(1, f"{self.name} lost its connection to the coordinator")

    # ---- from the coordinator -----------------------------------------------------------

    def on_frame(self, kind: int, body) -> None:
        if kind == F.SLICES:
            self._slices(body)
        elif kind == F.TO_RANK or kind == F.CLOSE:
            rank, _ = F.split_rank(body)
            link = self.child_of.get(rank)
            if link is not None:
                link.transport.write(F.frame(kind, body))
        elif kind == F.TO_ALL:
            data = F.frame(kind, body)
            for link in self.links:
                link.transport.write(data)
        elif kind == F.CONFIG:
            config = json.loads(body)
            if "hold_s" in config:
                self.hold_s = float(config["hold_s"])
                self._config = F.frame(kind, body)
                for link in self.links:
                    link.transport.write(self._config)
            if config.get("forecast"):
                self._hand_off(config["forecast"])
        else:
            raise F.FrameError(f"a frame of unknown kind {kind}")

    def _slices(self, body) -> None:
        """One SLICES frame per relay, of its workers' slices."""
        t, total, data = F.read_slices(body)
        owner = np.array([self.child_of[r].id if r in self.child_of else -1
                          for r in data[0].tolist()])
        for link in self.links:
            mine = owner == link.id
            if mine.any():
                ranks, offsets, sizes = data[:, mine]
                link.transport.write(F.slices_frame(t, total, ranks, offsets, sizes))

    def _hand_off(self, forecast: dict) -> None:
        """Each relay forecasts its workers: its ranks, and its part of the state."""
        ranks = [int(r) for r in forecast["ranks"]]
        where = {r: i for i, r in enumerate(ranks)}
        state = forecast.get("state")
        columns = len(forecast.get("exog") or ()) or 1
        for link in self.links:
            mine = sorted(r for r in link.ranks if r in where)
            if not mine:
                continue
            part = dict(forecast, ranks=mine, state=None)
            if state:
                part["state"] = _pred.state_of_workers(str(forecast["predictor"]), columns,
                                                       state, [where[r] for r in mine])
            link.transport.write(F.frame(F.CONFIG, json.dumps({"forecast": part}).encode()))

    # ---- from the relays ----------------------------------------------------------------

    def on_hello(self, link: "_RelayLink", msg: dict) -> bool:
        workers = msg.get("workers")
        if type(workers) is not int or workers < 1 or not isinstance(msg.get("host"), str):
            return False
        link.host, link.id = msg["host"], len(self.links)
        self.links.append(link)
        if self._config is not None:
            link.transport.write(self._config)
        return True

    def on_frames(self, link: "_RelayLink", frames) -> None:
        """A read's frames of one relay; then, once every open section is complete (or
        with ``hold_s`` 0), everything pending leaves in one write."""
        for kind, body in frames:
            if kind == F.ROWS:
                self._add(link, body)
            elif kind == F.FORWARD or kind == F.LOST:
                rank, line = F.split_rank(body)
                if kind == F.FORWARD and rank not in self.child_of:    # its hello
                    self.child_of[rank] = link
                    link.ranks.append(rank)
                    self.active.add(rank)
                elif kind == F.LOST or (b'"bye"' in line and _type(line) == P.BYE):
                    self.active.discard(rank)
                self._forward([rank], F.frame(kind, body))
            elif kind == F.FORECAST:
                # after the sections of its workers that left before it (without forecasts,
                # which would undo it), ahead of the one after it, as the relay sent them
                self._forward(F.read_forecast(body)[1].tolist(), F.frame(kind, body))
            elif kind == F.STATE:
                self._ahead.append(F.frame(kind, body))
            else:
                raise F.FrameError(f"a frame of unknown kind {kind}")
        if self._pending:
            self._arm(0.0 if self.hold_s <= 0 or self._complete() else self.hold_s)

    def on_lost(self, link: "_RelayLink") -> None:
        """A relay's connection closed: its workers that had not said bye are lost."""
        for rank in link.ranks:
            if rank in self.active:
                self.active.discard(rank)
                self._forward([rank], F.rank_frame(F.LOST, rank))
        link.closed = True
        self.flush()
        if len(self.links) >= self.expected_relays and all(x.closed for x in self.links):
            self._end(0)

    def _add(self, link: "_RelayLink", body) -> None:
        what, t, ranks = F.rows_head(body)
        key = (what, t)
        ranks = ranks.tolist()
        last_of = self._last_of
        latest = max((last_of.get(r, -1) for r in ranks), default=-1)
        section = self._open.get(key)
        if section is None or section.index < latest:
            section = self._open[key] = _Section(key, len(self._pending))
            self._pending.append(section)
        section.parts.append((link.id, body, time.monotonic()))
        self.sections_in += 1
        for r in ranks:
            last_of[r] = section.index
        self._seen[key] = self._seen.get(key, 0) + len(ranks)

    def _complete(self) -> bool:
        active = len(self.active)
        return all(self._seen.get(key, 0) >= active for key in self._open)

    def _forward(self, ranks, data: bytes) -> None:
        """A frame for ``ranks`` in the pending stream: after whatever of theirs is pending,
        before whatever of theirs comes next."""
        for r in ranks:
            self._last_of[r] = len(self._pending)
        self._pending.append(data)

    def _encode(self, section: _Section, now: float) -> List[bytes]:
        # the relays in one order: the same rank order every iteration
        parts = sorted(section.parts, key=lambda part: part[0])
        try:
            merged = F.merge_rows([(body, now - at) for _, body, at in parts])
        except F.FrameError:            # as they came: the coordinator says what is wrong
            merged = [F.frame(F.ROWS, body) for _, body, _ in parts]
        self.sections_up += len(merged)
        return merged


def _type(line: bytes) -> Optional[str]:
    """A forwarded message's type (None: not a message; the coordinator says so)."""
    try:
        return P.decode(line).get("type")
    except P.ProtocolError:
        return None


class _RelayLink(asyncio.Protocol):
    """One relay's connection to the hub: its hello line, then frames."""

    def __init__(self, hub: Hub):
        self.hub = hub
        self.transport: Optional[asyncio.Transport] = None
        self.host: Optional[str] = None         # set by its hello
        self.id = -1
        self.ranks: List[int] = []
        self.closed = False
        self._buffer = bytearray()
        self._hello_timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._hello_timer = asyncio.get_running_loop().call_later(HELLO_S, self._no_hello)

    def _no_hello(self) -> None:
        if self.host is None:
            self.transport.close()

    def _refuse(self, reason: str) -> None:
        self.hub._refuse(self.transport, reason)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        buffer = self._buffer
        buffer += data
        if self.host is None:
            end = buffer.find(b"\n", 0, P.MAX_HELLO + 1)
            if end < 0:
                if len(buffer) > P.MAX_HELLO:
                    self._refuse(f"first line longer than {P.MAX_HELLO} bytes")
                return
            try:
                msg = P.decode(bytes(buffer[:end]), P.MAX_HELLO)
            except P.ProtocolError as exc:
                self._refuse(str(exc))
                return
            if msg["type"] != P.RELAY or not P.token_ok(msg, self.hub.token) \
                    or not self.hub.on_hello(self, msg):
                self._refuse("not a relay's hello with the job's token")
                return
            del buffer[:end + 1]
        try:
            frames, used = F.split_frames(buffer)
            del buffer[:used]
            self.hub.on_frames(self, frames)
        except (F.FrameError, P.ProtocolError, ValueError) as exc:
            buffer.clear()
            log.warning("%s: a malformed frame from the relay of host %s (%s)", self.hub.name,
                        self.host, exc)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self.host is not None:
            self.hub.on_lost(self)


def main() -> int:
    """``python -m mxlbbsp.relay.hub``: a hub, from the launcher's variables."""
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    try:
        listen, upstream = _env.relay(), _env.coordinator()
        workers, relays = _env.local_size(), _env.hub_relays()
        if listen is None or upstream is None:
            raise _env.EnvError(f"{_env.RELAY} and {_env.COORDINATOR} must be set; `mxlbbsp "
                                "launch` starts the hubs itself")
        if workers < 1 or relays < 1:
            raise _env.EnvError(f"{_env.LOCAL_SIZE}={workers}, {_env.HUB_RELAYS}={relays}: a "
                                "hub serves at least one relay and one worker")
    except _env.EnvError as exc:
        raise _env.refuse(exc) from None
    hub = Hub(listen, upstream, _env.token(), _env.host(), relays, workers)
    try:
        return asyncio.run(hub.run())
    except ConnectionError as exc:
        sys.stderr.write(f"mxlbbsp: error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
