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

import time

from mxlbbsp import modes as _modes
from mxlbbsp.control.collect import WorkerError
from mxlbbsp.control.connection import Connection, ViaRelay
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P

#: how long a relay may hold back a section until every worker of its host has sent its part,
#: in a mode with a barrier per iteration (where the coordinator waits for every worker
#: anyway); 0 in the others (a relay then sends what it has read at once)
RELAY_HOLD_S = 0.05


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
        hold = RELAY_HOLD_S if _modes.get(self.config.sync).barrier else 0.0
        conn.transport.write(F.frame(F.CONFIG, P.encode({"hold_s": hold})))
        return True

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

