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
  to every relay of registered workers (:class:`mxlbbsp.core.links.Links`, as at the
  coordinator);

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

Glue: its relays' connections are :class:`mxlbbsp.core.peer.Peer` (the hello gate, then
frames) with the hub as their handler; what comes down is routed by
:class:`mxlbbsp.core.links.Links`, as at the coordinator; what goes up waits in a
:class:`.stream.PendingStream`, as in a relay, and leaves through its :class:`.uplink.Uplink`.

Stdlib, numpy and the predictors' state helpers; no MXNet.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import List, Optional, Tuple

from mxlbbsp import predictors as _pred
from mxlbbsp.core import env as _env
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.core.links import Links, RelayLink, ViaRelay
from mxlbbsp.core.peer import Peer
from mxlbbsp.relay.stream import PendingStream, Section
from mxlbbsp.relay.uplink import Uplink

log = logging.getLogger(__name__)


class Hub:
    """A group of relays' hub (see the module docstring): ``await run()`` serves until it
    ends and returns the exit code. ``relays``: how many relays of the job connect to it;
    ``workers``: how many workers they serve in all.

    The :class:`~mxlbbsp.core.peer.PeerHandler` of its relays' connections (a hello, frames,
    a connection lost) and the :class:`~.uplink.UplinkOwner` of its own."""

    def __init__(self, listen: P.Address, upstream: P.Address, token: str, name: str,
                 relays: int, workers: int):
        self.listen, self.upstream = listen, upstream
        self.name, self.expected_relays, self.expected = name, int(relays), int(workers)
        self.hold_s = 0.0
        self.active: set = set()                # registered ranks that have not said bye
        self._config: Optional[bytes] = None    # the coordinator's first CONFIG, for late relays
        self._gone = 0                          # relays whose connection closed
        self.links = Links()                    # its relays, and their workers by rank
        self.uplink = Uplink(self, name, token, (P.RELAY,), self.links)
        self.stream = PendingStream(self._encode, self._send)
        self.sections_in = self.sections_up = 0  # statistics (tests, benchmarks)

    writes_up = property(lambda self: self.uplink.writes_up,
                         doc="writes to the coordinator (statistics: tests, benchmarks)")

    # ---- lifecycle (the uplink's owner) ---------------------------------------------------

    async def run(self) -> int:
        return await self.uplink.serve(self.upstream, self.listen, self.name, self.expected)

    def closing(self) -> None:
        self.links.close_all()
        self.stream.flush()

    def upstream_lost(self) -> None:
        if len(self.links.relays) >= self.expected_relays and not self.active \
                and len(self.links.writers) >= self.expected:
            self.uplink.end(0)                  # every worker had said bye
        else:
            self.uplink.end(1, f"{self.name} lost its connection to the coordinator")

    def on_config(self, config: dict, body: bytes) -> None:
        """The coordinator's CONFIG: to every relay (the first also to those that come
        later), a forecast hand-off cut per relay. (SLICES, TO_RANK, CLOSE and TO_ALL reach
        the relays through the uplink's links, as at the coordinator.)"""
        if "hold_s" in config:
            self.hold_s = float(config["hold_s"])
            self._config = F.frame(F.CONFIG, body)
            for relay in self.links.relays:
                relay.transport.write(self._config)
        forecast = config.get("forecast")
        if forecast:
            name, columns = str(forecast["predictor"]), len(forecast.get("exog") or ()) or 1
            self.links.hand_off(forecast, lambda state, index: _pred.state_of_workers(
                name, columns, state, index))

    # ---- from the relays (their connections' handler) -------------------------------------

    def on_hello(self, peer: Peer, msg: dict, line: bytes) -> bool:
        host, workers = P.relay_of(msg)
        peer.relay = self.links.add_relay(peer.transport, host, workers)
        if self._config is not None:
            peer.transport.write(self._config)
        return True

    def on_frames(self, peer: Peer, frames: List[Tuple[int, bytes]]) -> bool:
        """A read's frames of one relay; then, once every open section is complete (or
        with ``hold_s`` 0), everything pending leaves in one write."""
        relay, stream = peer.relay, self.stream
        for kind, body in frames:
            if kind == F.ROWS:
                self._add(relay, body)
            elif kind == F.FORWARD or kind == F.LOST:
                rank, line = F.split_rank(body)
                if kind == F.FORWARD and rank not in self.links.writers:    # its hello
                    self.links.register(rank, ViaRelay(relay, rank))
                    self.active.add(rank)
                elif kind == F.LOST or (b'"bye"' in line and _type(line) == P.BYE):
                    self.active.discard(rank)
                stream.forward((rank,), F.frame(kind, body))
            elif kind == F.FORECAST:
                # after the sections of its workers that left before it (without forecasts,
                # which would undo it), ahead of the one after it, as the relay sent them
                stream.forward(F.read_forecast(body)[1].tolist(), F.frame(kind, body))
            elif kind == F.STATE:
                stream.ahead.append(F.frame(kind, body))
            else:
                raise F.FrameError(f"a frame of unknown kind {kind}")
        if stream.items:
            stream.arm(0.0 if self.hold_s <= 0 or stream.complete(len(self.active))
                       else self.hold_s)
        return True

    def on_malformed(self, peer: Peer, reason: str) -> None:
        log.warning("%s: a malformed frame from %s (%s)", self.name, peer.relay.describe(),
                    reason)
        peer.transport.close()

    def on_lost(self, peer: Peer) -> None:
        """A relay's connection closed: its workers that had not said bye are lost."""
        for rank in peer.relay.ranks:
            if rank in self.active:
                self.active.discard(rank)
                self.stream.forward((rank,), F.rank_frame(F.LOST, rank))
        self._gone += 1
        self.stream.flush()
        if len(self.links.relays) >= self.expected_relays and self._gone >= len(self.links.relays):
            self.uplink.end(0)

    # ---- the pending stream ---------------------------------------------------------------

    def _add(self, relay: RelayLink, body) -> None:
        what, t, ranks = F.rows_head(body)
        self.stream.add((what, t), ranks.tolist(), (relay.index, body, time.monotonic()))
        self.sections_in += 1

    def _encode(self, section: Section, now: float) -> List[bytes]:
        # the relays in one order: the same rank order every iteration
        parts = sorted(section.entries, key=lambda part: part[0])
        try:
            merged = F.merge_rows([(body, now - at) for _, body, at in parts])
        except F.FrameError:            # as they came: the coordinator says what is wrong
            merged = [F.frame(F.ROWS, body) for _, body, _ in parts]
        self.sections_up += len(merged)
        return merged

    def _send(self, frames: List[bytes]) -> None:
        """One write to the coordinator."""
        self.uplink.send(frames)


def _type(line: bytes) -> Optional[str]:
    """A forwarded message's type (None: not a message; the coordinator says so)."""
    try:
        return P.decode(line).get("type")
    except P.ProtocolError:
        return None


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
