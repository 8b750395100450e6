"""What comes in on the coordinator's connections, parsed and handed to the coordinator.

A connection's first line is a hello (:mod:`.connection` lets it in): a worker's, which the
coordinator registers, or a relay's, whose connection carries frames from then on
(:mod:`mxlbbsp.core.frames`): the inbox adds its link and sends it the coordinator's CONFIG.
A registered worker's lines and a relay's frames (a section of reports or dones, forecasts,
a predictor's state, a worker's message forwarded with its rank, a worker's connection lost)
become calls of an :class:`InboxHandler`: reports and dones as batches
(:class:`~mxlbbsp.core.frames.Rows`), every other message as the worker sent it. A malformed
message of a registered worker fails the job, naming the worker; a malformed frame, naming
the relay.

:class:`Inbox` is the :class:`~mxlbbsp.core.peer.PeerHandler` of the coordinator's peers; the
coordinator is its handler. A new frame type is one more branch of :meth:`Inbox._frame`.
No framework import.
"""
from __future__ import annotations

import json
import time
from typing import List, Optional, Protocol, Tuple

import numpy as np

from mxlbbsp.control.collect import WorkerError
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.core.links import Links, RelayLink, ViaRelay, Writer
from mxlbbsp.core.peer import Peer

#: how long a relay may hold back a section until every worker of its host has sent its part,
#: in a mode with a barrier per iteration (where the coordinator waits for every worker
#: anyway); 0 in the others (a relay then sends what it has read at once)
RELAY_HOLD_S = 0.05
#: how long a relay may hold back a complete section of dones, in a mode with a barrier and
#: nothing that waits for dones (they go with the host's next reports, in one write: the
#: coordinator handles one write per host per iteration, not two); 0 in the others
RELAY_DONE_HOLD_S = 1.0


def relay_config(barrier: bool, reads_dones: bool, checkpoint_every: int) -> dict:
    """The CONFIG a relay gets after its hello (:mod:`mxlbbsp.core.frames`): in a mode with
    a ``barrier`` per iteration, its sections may wait RELAY_HOLD_S for the host's late
    workers, and when no policy ``reads_dones``, a complete section of dones RELAY_DONE_HOLD_S
    for the host's next reports; ``checkpoint_every``: the coordinator's period (0: none)."""
    return {"hold_s": RELAY_HOLD_S if barrier else 0.0,
            "done_hold_s": RELAY_DONE_HOLD_S if barrier and not reads_dones else 0.0,
            "checkpoint_every": checkpoint_every}


class InboxHandler(Protocol):
    """The coordinator as its inbox sees it: what comes in, parsed
    (:class:`~mxlbbsp.control.coordinator.Coordinator` implements it)."""

    def on_hello(self, msg: dict, writer: Writer) -> Optional[int]:
        """A worker's hello (``writer``: its own transport, or :class:`ViaRelay`): its rank
        once registered, else None (the worker was told why and closed)."""

    def on_rows(self, rows: F.Rows) -> None:
        """Reports, or dones, of one iteration; WorkerError for a malformed one."""

    def on_forecasts(self, iteration: int, ranks: np.ndarray, forecasts: np.ndarray,
                     fallbacks: np.ndarray) -> None:
        """A relay's forecasts of its workers' speeds at ``iteration`` + 1."""

    def on_state(self, iteration: int, ranks: List[int], state: dict) -> None:
        """A relay's predictor state after ``iteration`` (one the coordinator checkpoints)."""

    def on_message(self, rank: int, msg: dict) -> None:
        """Any other message of a registered worker (log, bye, a mode's own); ProtocolError
        for one nobody takes."""

    def on_lost(self, rank: int) -> None:
        """A registered worker's connection closed (its own, or at its relay)."""

    def on_relay_lost(self, relay: RelayLink) -> None:
        """A relay's connection closed."""

    def on_malformed(self, message: str) -> None:
        """A registered peer's malformed message or frame: the job fails with ``message``."""


class Inbox:
    """The coordinator's side of its connections (see the module docstring): ``links``
    registers the relays; ``config``, the CONFIG a relay gets after its hello."""

    def __init__(self, handler: InboxHandler, links: Links, config: dict):
        self.handler, self.links = handler, links
        self._config = F.frame(F.CONFIG, P.encode(config))

    # ---- the peers (mxlbbsp.core.peer.PeerHandler) ----------------------------------------

    def on_hello(self, peer: Peer, msg: dict, line: bytes) -> bool:
        if msg["type"] == P.RELAY:          # frames from now on
            host, workers = P.relay_of(msg)
            peer.relay = self.links.add_relay(peer.transport, host, workers)
            peer.transport.write(self._config)
            return True
        peer.rank = self.handler.on_hello(msg, peer.transport)
        return peer.rank is not None

    def on_line(self, peer: Peer, line: bytes) -> bool:
        """One line of a worker connected directly."""
        try:
            self._message(peer.rank, P.decode(line, P.MAX_LINE))
        except (P.ProtocolError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.on_malformed(peer, _reason(exc))
            return False
        return True

    def on_frames(self, peer: Peer, frames: List[Tuple[int, bytes]]) -> bool:
        """A relay's frames of one read."""
        for kind, body in frames:
            if not self._frame(peer, kind, body):
                return False
        return True

    def on_malformed(self, peer: Peer, reason: str) -> None:
        who = f"worker {peer.rank}" if peer.rank is not None else peer.relay.describe()
        self.handler.on_malformed(f"{who}: protocol error: {reason}")
        peer.transport.close()

    def on_lost(self, peer: Peer) -> None:
        if peer.relay is not None:
            self.handler.on_relay_lost(peer.relay)
        elif self.links.writers.get(peer.rank) is peer.transport:
            self.handler.on_lost(peer.rank)

    # ---- what they say --------------------------------------------------------------------

    def _frame(self, peer: Peer, kind: int, body: bytes) -> bool:
        """One frame of a relay; False when its connection is done with."""
        relay, handler = peer.relay, self.handler
        rank = None
        try:
            if kind == F.ROWS:
                rows = F.decode_rows(body, time.time())
                if not relay.serves(rows.ranks):
                    raise F.FrameError("a section of workers it does not serve")
                handler.on_rows(rows)
            elif kind == F.FORECAST:
                t, ranks, values, fallbacks = F.read_forecast(body)
                if not relay.serves(ranks):
                    raise F.FrameError("forecasts of workers it does not serve")
                handler.on_forecasts(t, ranks, values, fallbacks)
            elif kind == F.STATE:
                handler.on_state(*self._state(relay, body))
            elif kind in (F.FORWARD, F.LOST):
                rank, line = F.split_rank(body)
                mine = self.links.relay_of(rank) is relay
                if kind == F.LOST:
                    if mine:
                        handler.on_lost(rank)
                elif mine:
                    self._message(rank, P.decode(line, P.MAX_LINE))
                else:                   # a worker's first message: its hello
                    msg = P.decode(line, P.MAX_HELLO)
                    if msg["type"] != P.HELLO or msg.get("rank") != rank:
                        raise F.FrameError(f"a first message of worker {rank} that is not "
                                           "its hello")
                    handler.on_hello(msg, ViaRelay(relay, rank))
            else:
                raise F.FrameError(f"a frame of unknown kind {kind}")
        except WorkerError as exc:
            handler.on_malformed(f"worker {exc.rank}: protocol error: {exc}")
        except F.FrameError as exc:
            self.on_malformed(peer, str(exc))
            return False
        except (P.ProtocolError, ValueError, KeyError, TypeError, RecursionError) as exc:
            if rank is None:
                self.on_malformed(peer, str(exc))
                return False
            handler.on_malformed(f"worker {rank}: protocol error: {_reason(exc)}")
        return True

    @staticmethod
    def _state(relay: RelayLink, body: bytes) -> Tuple[int, List[int], dict]:
        """A STATE frame's iteration, ranks (any of the relay's: a hub's relays send theirs
        one by one) and predictor state."""
        msg = json.loads(body)
        t, ranks, state = msg.get("iteration"), msg.get("ranks"), msg.get("state")
        if type(t) is not int or not isinstance(ranks, list) or not isinstance(state, dict) \
                or not ranks or not all(type(r) is int for r in ranks) \
                or not relay.serves(np.array(ranks, dtype=np.int64)):
            raise F.FrameError("a STATE frame without its iteration, ranks and state")
        return t, ranks, state

    def _message(self, rank: int, msg: dict) -> None:
        """A registered worker's message (directly or through its relay)."""
        if msg["type"] in F.BATCHED:
            F.check_iteration(msg)
            self.handler.on_rows(F.Rows.from_messages([rank], [msg], time.time()))
        else:
            self.handler.on_message(rank, msg)


def _reason(exc: Exception) -> str:
    return str(exc) if not isinstance(exc, RecursionError) else "message nested too deeply"
