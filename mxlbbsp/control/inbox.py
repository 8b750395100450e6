"""What comes in on the coordinator's connections, parsed and handed to its handlers.

A connection's first line is a hello: a worker's (it registers the worker) or a relay's (its
connection carries frames from then on: :mod:`mxlbbsp.core.frames`). A registered worker's
lines, and the frames of a relay (a section of reports or dones, a worker's message
forwarded with its rank, a worker's connection lost), become calls of the coordinator's
handlers: reports and dones as batches (:class:`~mxlbbsp.core.frames.Rows`), every other
message as the worker sent it. A malformed message of a registered worker fails the job,
naming the worker; a malformed frame, naming the relay; a connection that never said a
valid hello is refused.

:class:`Inbox` is a part of :class:`~mxlbbsp.control.coordinator.Coordinator` (its state is
the coordinator's), kept in a room of its own. No framework import.
"""
from __future__ import annotations

import json
import logging
import time

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp.control.collect import WorkerError
from mxlbbsp.control.connection import Connection, ViaRelay
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P

log = logging.getLogger(__name__)

#: how long a relay may hold back a section until every worker of its host has sent its part,
#: in a mode with a barrier per iteration (where the coordinator waits for every worker
#: anyway); 0 in the others (a relay then sends what it has read at once)
RELAY_HOLD_S = 0.05
#: how long a relay may hold back a complete section of dones, in a mode with a barrier and
#: nothing that waits for dones (they go with the host's next reports, in one write: the
#: coordinator handles one write per host per iteration, not two); 0 in the others
RELAY_DONE_HOLD_S = 1.0


class Inbox:
    """The coordinator's side of its connections (see the module docstring)."""

    def on_line(self, conn: Connection, line: bytes) -> bool:
        """One line of a connection (a worker's, or a relay's hello); False when the
        connection is done with."""
        rank = conn.rank
        try:
            # before authentication nothing longer than a hello is parsed
            msg = P.decode(line, P.MAX_HELLO if rank is None else P.MAX_LINE)
            if rank is None:
                kind = msg["type"]
                if kind not in (P.HELLO, P.RELAY) or not P.token_ok(msg, self.config.token):
                    self.links.refuse(conn, "bad hello or token")
                    return False
                if kind == P.RELAY:
                    return self._on_relay(conn, msg)
                conn.rank = self._on_hello(msg, conn.transport)
                if conn.rank is None:       # refused, its connection closed
                    return False
            else:
                self._dispatch(rank, msg)
        except WorkerError as exc:
            self.links.reject(conn, str(exc))
            return False
        except (P.ProtocolError, ValueError, KeyError, TypeError, RecursionError) as exc:
            if rank is None:
                self.links.refuse(conn, str(exc) if isinstance(exc, P.ProtocolError)
                                  else "malformed hello")
            else:
                self.links.reject(conn, str(exc) if not isinstance(exc, RecursionError)
                                  else "message nested too deeply")
            return False
        return True

    def on_frame(self, conn: Connection, kind: int, body: bytes) -> bool:
        """One frame of a relay; False when the connection is done with."""
        relay = conn.relay
        rank = None
        try:
            if kind == F.ROWS:
                rows = F.decode_rows(body, time.time())
                if not relay.serves(rows.ranks):
                    raise F.FrameError("a section of workers it does not serve")
                self._on_rows(rows)
            elif kind == F.FORECAST:
                t, ranks, values, fallbacks = F.read_forecast(body)
                if not relay.serves(ranks):
                    raise F.FrameError("forecasts of workers it does not serve")
                self.collect.forecasts(t, ranks, values, fallbacks)
            elif kind == F.STATE:
                self._on_state(relay, body)
            elif kind in (F.FORWARD, F.LOST):
                rank, line = F.split_rank(body)
                registered = self.links.writers.get(rank)
                mine = isinstance(registered, ViaRelay) and registered.relay is relay
                if kind == F.LOST:
                    if mine:
                        self._on_lost_rank(rank)
                elif mine:
                    self._dispatch(rank, P.decode(line, P.MAX_LINE))
                else:                   # a worker's first message: its hello
                    msg = P.decode(line, P.MAX_HELLO)
                    if msg["type"] != P.HELLO or msg.get("rank") != rank:
                        raise F.FrameError(f"a first message of worker {rank} that is not "
                                           "its hello")
                    self._on_hello(msg, ViaRelay(relay, rank), relay)
            else:
                raise F.FrameError(f"a frame of unknown kind {kind}")
        except WorkerError as exc:
            self._fail(f"worker {exc.rank}: protocol error: {exc}")
        except F.FrameError as exc:
            self.links.reject(conn, str(exc))
            return False
        except (P.ProtocolError, ValueError, KeyError, TypeError, RecursionError) as exc:
            if rank is None:
                self.links.reject(conn, str(exc))
                return False
            self._fail(f"worker {rank}: protocol error: "
                       + (str(exc) if not isinstance(exc, RecursionError)
                          else "message nested too deeply"))
        return True

    def _on_relay(self, conn: Connection, msg: dict) -> bool:
        """A relay's hello: its connection carries frames from now on."""
        host, workers = msg.get("host"), msg.get("workers")
        if not isinstance(host, str) or type(workers) is not int or workers < 1:
            raise P.ProtocolError("a relay's hello needs its host and its number of workers")
        conn.relay = self.links.add_relay(conn, host, workers)
        barrier = _modes.get(self.config.sync).barrier
        hold = RELAY_HOLD_S if barrier else 0.0
        done_hold = RELAY_DONE_HOLD_S if barrier and not self._hooks[P.DONE] else 0.0
        every = self.config.checkpoint_every if self.config.checkpoint_dir else 0
        conn.transport.write(F.frame(F.CONFIG, P.encode({"hold_s": hold,
                                                         "done_hold_s": done_hold,
                                                         "checkpoint_every": every})))
        return True

    def _hand_off_forecasts(self) -> None:
        """Every worker has said hello: with a separable predictor, each relay forecasts its
        own workers from now on (its CONFIG's ``forecast``; the part of a checkpoint's
        predictor state that is theirs, when the job resumed)."""
        relays = [relay for relay in self.links.relays if relay.ranks]
        speed, cfg = self.speed, self.config
        if not relays or not speed.separable():
            return
        full = speed.hand_off(self.links.owner >= 0)
        for relay in relays:
            ranks = relay.ranks_array
            forecast = {"predictor": speed.predictor_name, "exog": list(cfg.exog),
                        "from": self._start + cfg.warmup, "ranks": ranks.tolist(),
                        "state": None if full is None else speed.part_of(full, ranks)}
            # a predictor's state may hold NaN: plain JSON, not the protocol's lines
            relay.transport.write(F.frame(F.CONFIG, json.dumps({"forecast": forecast}).encode()))
        log.debug("the relays (%d connection(s)) forecast their %d workers (%s); the coordinator "
                  "the other %d", len(relays), int(speed.remote.sum()), speed.predictor_name,
                  len(speed.local))

    def _on_state(self, relay, body: bytes) -> None:
        """A relay's predictor state after an iteration the coordinator checkpoints."""
        msg = json.loads(body)
        t, ranks = msg.get("iteration"), msg.get("ranks")
        # a hub's relays send theirs one by one: any ranks of this relay's
        if type(t) is not int or not isinstance(ranks, list) or not isinstance(
                msg.get("state"), dict) or not ranks or not all(type(r) is int for r in ranks) \
                or not relay.serves(np.array(ranks, dtype=np.int64)):
            raise F.FrameError("a STATE frame without its iteration, ranks and state")
        states = self._relay_states.setdefault(t, [])
        states.append((ranks, msg["state"]))
        for old in [k for k in self._relay_states if k < t - 2 * max(self.config.checkpoint_every, 1)]:
            del self._relay_states[old]

    def _dispatch(self, rank: int, msg: dict) -> None:
        """A registered worker's message (directly or through its relay)."""
        kind = msg["type"]
        if kind == P.REPORT or kind == P.DONE:
            F.check_iteration(msg)
            self._on_rows(F.Rows.from_messages([rank], [msg], time.time()))
        elif kind == P.LOG:
            self._on_log(rank, msg)
        elif kind == P.BYE:
            self._on_bye(rank, msg)
        elif not self._policy.on_message(rank, msg):
            raise P.ProtocolError(f"unexpected message {kind!r}")

    def on_lost(self, conn: Connection) -> None:
        rank, relay = conn.rank, conn.relay
        if rank is not None and self.links.writers.get(rank) is conn.transport:
            self._on_lost_rank(rank)
        elif relay is not None and self.failure is None \
                and not self._byes[relay.ranks_array].all():
            self._fail(f"{relay.describe()} lost its connection to the coordinator before its "
                       "workers finished", fatal_for_workers=False)

    def _on_lost_rank(self, rank: int) -> None:
        if not self._byes[rank] and self.failure is None:
            self._fail(f"worker {rank} lost its connection to the coordinator before it "
                       "finished", fatal_for_workers=False)

