"""A host's relay: its workers talk to it, and it talks to the coordinator in one connection.

The launcher starts one per host with two or more workers (``--relay on``, or ``auto`` from 64
workers), under a guard like every role: ``python -m mxlbbsp.relay``. It listens on a Unix socket (``MXLBBSP_RELAY``,
``unix:PATH``), which is the ``MXLBBSP_COORDINATOR`` of the host's workers: a file, not Linux's
abstract namespace, which is per network namespace (a worker started under ``ip netns exec``
reaches a file too). It removes the file once all its workers have connected, or when it ends;
its guard does if it was killed, and the launcher if both were (a relay on its machine). The workers speak :mod:`mxlbbsp.core.protocol` with it
exactly as with the coordinator. It checks each worker's hello (the job's token, the size of
the line) itself, opens one TCP connection to the coordinator (its own hello, then the frames
of :mod:`mxlbbsp.core.frames`) and relays:

* up: each report and each done goes into a *section* (one per type and iteration), which
  leaves as one ROWS frame, a column per field, once every worker of the host has sent its
  message of that type and iteration, or after ``hold_s`` (the coordinator's CONFIG: 50 ms
  in a mode with a barrier per iteration, where the coordinator waits for every worker
  anyway; 0 elsewhere: what was read at once leaves at once), a complete section of dones
  after ``done_hold_s`` (1 s in lbbsp and bsp, where nothing waits for the dones: they
  leave with the host's next reports, in one write, and the coordinator wakes up once per
  iteration for the host, not twice; 0 elsewhere, and for an iteration the coordinator
  checkpoints); any other message (hello,
  log, bye, a mode's own) leaves as a FORWARD frame with the worker's rank, and a closed
  connection as LOST. Each worker's messages reach the coordinator in the order it sent
  them: a message joins an open section only if that worker has nothing later pending;
* down: an ``alloc`` line for each of its workers from one SLICES frame, the frames for one
  worker (TO_RANK) or all (TO_ALL) as they come, and CLOSE.

When the job's predictor is separable, the coordinator hands the forecasts of this host's
workers to the relay (:mod:`.forecast`): their forecasts leave with the host's last report
of each iteration, and the predictor learns after the write.

It ends (exit 0) once every worker of the host has registered and closed its connection;
when the coordinator's connection breaks first it closes its workers' (they stop as with a
lost coordinator) and exits 1 with one line. Its own CPU time is what one host pays for the
job's control plane (benchmarks/coordinator_scale.py measures it).

Stdlib and numpy only, no MXNet: it starts in a fraction of a second. (About 420 lines: the
relay, its upstream connection and its workers' connections share its pending stream.)
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Dict, List, Optional

from mxlbbsp.core import env as _env
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.relay.forecast import Forecaster
from mxlbbsp.relay.uplink import Node

log = logging.getLogger(__name__)

#: a worker's connection without a hello for this long is closed
HELLO_S = 30.0


class _Section:
    """Pending reports or dones of one iteration: (rank, message, when it arrived)."""

    __slots__ = ("key", "index", "rows", "ranks")

    def __init__(self, key, index):
        self.key, self.index, self.rows, self.ranks = key, index, [], set()


class Relay(Node):
    """One host's relay (see the module docstring). ``await run()`` serves until it ends and
    returns the exit code. ``listen``: its address; ``upstream``: the coordinator's;
    ``workers``: how many workers of the job run on this host."""

    def __init__(self, listen: P.Address, upstream: P.Address, token: str, host: str,
                 workers: int):
        self.listen, self.upstream, self.token = listen, upstream, token
        self.host, self.expected = host, int(workers)
        self.hold_s = 0.0                    # until the coordinator's CONFIG says otherwise
        self.done_hold_s = 0.0
        self.checkpoint_every = 0            # the dones of a checkpoint's iteration: at once
        self.forecaster: Optional[Forecaster] = None   # the CONFIG's, when it sends one
        self.workers: Dict[int, "_WorkerLink"] = {}   # rank -> its connection (registered)
        self.active: set = set()             # registered ranks that have not said bye
        self.registered = 0                  # workers that ever registered here
        self.label = f"the relay of host {host}"
        self._init_node()                    # its pending stream: per rank; _seen: the
        self._server = None                  # ranks that sent each (type, iteration)
        self.sections_up = 0                 # sections sent (reports or dones of a t)
        self.messages_up = 0                 # reports and dones in them
        self.forecasts_ahead = 0             # FORECAST frames sent (a section left early)

    # ---- lifecycle --------------------------------------------------------------------

    async def run(self) -> int:
        return await self._serve(self.upstream, self.listen, self.host, self.expected,
                                 lambda: _WorkerLink(self))

    def _closing(self) -> None:
        self._unlink()
        for link in list(self.workers.values()):
            link.transport.close()

    def _unlink(self) -> None:
        """Remove the socket's file (none in the abstract namespace): at the end, or once
        every worker has connected (nobody else may, and a killed relay leaves nothing)."""
        if isinstance(self.listen, str) and not self.listen.startswith("\0"):
            try:
                os.unlink(self.listen)
            except OSError:
                pass

    # ---- from the coordinator -----------------------------------------------------------

    def on_frame(self, kind: int, body) -> None:
        if kind == F.SLICES:
            workers = self.workers
            for rank, line in F.alloc_lines(body):
                link = workers.get(rank)
                if link is not None:
                    link.transport.write(line)
        elif kind == F.TO_RANK or kind == F.CLOSE:
            rank, line = F.split_rank(body)
            link = self.workers.get(rank)
            if link is not None:
                if kind == F.CLOSE:
                    link.transport.close()
                else:
                    link.transport.write(line)
        elif kind == F.TO_ALL:
            line = bytes(body)
            for link in self.workers.values():
                link.transport.write(line)
        elif kind == F.CONFIG:
            config = json.loads(body)
            if "hold_s" in config:
                self.hold_s = float(config["hold_s"])
                self.done_hold_s = float(config.get("done_hold_s", 0.0))
                self.checkpoint_every = int(config.get("checkpoint_every") or 0)
            if config.get("forecast"):
                self.forecaster = Forecaster(config["forecast"], self.checkpoint_every)
        else:
            raise F.FrameError(f"a frame of unknown kind {kind}")

    def upstream_lost(self) -> None:
        if self.registered >= self.expected and not self.active:
            self._end(0)                # every worker had said bye
        else:
            self._end(1, f"the relay of host {self.host} lost its connection to the "
                         "coordinator")

    # ---- from the workers ---------------------------------------------------------------

    def on_hello(self, link: "_WorkerLink", msg: dict) -> bool:
        """A worker's hello with the job's token: registered here and passed on."""
        rank = msg.get("rank")
        if type(rank) is not int or rank < 0 or rank in self.workers:
            link.transport.write(P.encode(P.error(
                f"rank {rank!r} connected twice to the relay of host {self.host}"
                if rank in self.workers else f"rank {rank!r} is not a worker's rank")))
            return False
        link.rank = rank
        self.workers[rank] = link
        self.active.add(rank)
        self.registered += 1
        if self.registered == self.expected:
            self._unlink()
        return True

    def on_message(self, rank: int, line: bytes) -> None:
        """One line of a registered worker."""
        try:
            msg = P.decode(line)
        except P.ProtocolError:
            msg = None                  # the coordinator reads it and fails the job
        kind = msg.get("type") if msg is not None else None
        if kind in F.BATCHED and type(msg.get("iteration")) is int:
            self._add(rank, msg)
            return
        if kind == P.BYE:
            self.active.discard(rank)
        self._forward(rank, F.rank_frame(F.FORWARD, rank, line))
        if kind == P.BYE:
            self._check_complete()

    def on_lost(self, link: "_WorkerLink") -> None:
        rank = link.rank
        if rank is None or self.workers.get(rank) is not link:
            return
        del self.workers[rank]
        self.active.discard(rank)
        self._forward(rank, F.rank_frame(F.LOST, rank))
        self.flush()
        if not self.workers and self.registered >= self.expected:
            self._end(0)

    # ---- the pending stream ---------------------------------------------------------------

    def _add(self, rank: int, msg: dict) -> None:
        key = (msg["type"], msg["iteration"])
        section = self._open.get(key)
        if section is None or section.index < self._last_of.get(rank, -1) \
                or rank in section.ranks:
            section = self._open[key] = _Section(key, len(self._pending))
            self._pending.append(section)
        section.rows.append((rank, msg, time.monotonic()))
        section.ranks.add(rank)
        self._last_of[rank] = section.index
        if self.forecaster is not None and key[0] == P.REPORT:
            self._forecast(rank, msg, section)
        seen = self._seen.setdefault(key, set())
        seen.add(rank)
        if len(seen) < len(self.active):
            self._arm(self.hold_s)
        elif key[0] == P.DONE and self.done_hold_s > 0 and not (
                self.checkpoint_every and (key[1] + 1) % self.checkpoint_every == 0):
            # with the next reports; not those of an iteration the coordinator checkpoints
            # once they are in (its state's JSON would then delay the next split)
            self._hold_dones()
        else:
            self.flush()

    def _forecast(self, rank: int, msg: dict, section: _Section) -> None:
        """The forecasts of the host's workers once its last report of an iteration is in:
        columns of the section when it holds all of them, else a FORECAST frame that leaves
        ahead of it; the predictor learns after the write."""
        forecaster = self.forecaster
        got = forecaster.report(rank, msg)
        if forecaster.latest == msg["iteration"]:
            asyncio.get_running_loop().call_soon(self._learn)
        if got is None:
            return
        t, forecasts, fallbacks = got
        slot, values, counts = forecaster.slot, forecasts.tolist(), fallbacks.tolist()
        for r, m, _ in section.rows:
            m["_forecast"], m["_fallbacks"] = values[slot[r]], counts[slot[r]]
        if len(section.ranks) < len(forecaster.ranks):      # the others' left before
            self._ahead.append(F.forecast_frame(t, forecaster.ranks, forecasts, fallbacks))
            self.forecasts_ahead += 1

    def _learn(self) -> None:
        state = self.forecaster.learn()
        if state is not None:               # NaN in a fresh state: plain JSON, not the line's
            # with the next write (the host's dones of that iteration, which the coordinator
            # checkpoints after): read while the workers compute, not before the split
            self._ahead.append(F.frame(F.STATE, json.dumps(state).encode()))

    def _forward(self, rank: int, data: bytes) -> None:
        if not self._pending:           # nothing to keep in order with: at once
            self._send([data])
            return
        self._last_of[rank] = len(self._pending)
        self._pending.append(data)
        self._arm(self.hold_s)

    def _check_complete(self) -> None:
        if any(len(self._seen.get(key, ())) >= len(self.active) for key in self._open):
            self.flush()

    def _hold_dones(self) -> None:
        """A section of dones is complete: when nothing else pending is waited for (the
        host's workers' dones came before any of their next reports), everything pending
        may wait ``done_hold_s``, else it leaves as it would have."""
        active = len(self.active)
        if any(isinstance(item, bytes) or item.key[0] != P.DONE
               or len(self._seen.get(item.key, ())) < active for item in self._pending):
            self._arm(self.hold_s)
            return
        self._disarm()
        self._arm(self.done_hold_s)

    def _encode(self, section: _Section, now: float) -> List[bytes]:
        self.sections_up += 1
        self.messages_up += len(section.rows)
        return F.encode_rows([(r, m, now - at) for r, m, at in section.rows])


class _WorkerLink(asyncio.Protocol):
    """One worker's connection to the relay: lines in."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.transport: Optional[asyncio.Transport] = None
        self.rank: Optional[int] = None
        self._buffer = bytearray()
        self._hello_timer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        # a connection that says no hello is closed, as the coordinator's are
        self._hello_timer = asyncio.get_running_loop().call_later(HELLO_S, self._no_hello)

    def _no_hello(self) -> None:
        if self.rank is None:
            self.transport.close()

    def _refuse(self, reason: str) -> None:
        self.relay._refuse(self.transport, reason)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        buffer = self._buffer
        buffer += data
        start = 0
        relay = self.relay
        while True:
            limit = P.MAX_HELLO if self.rank is None else P.MAX_LINE
            end = buffer.find(b"\n", start, start + limit + 1)
            if end < 0:
                break
            line = bytes(buffer[start:end])
            start = end + 1
            if self.rank is not None:
                relay.on_message(self.rank, line)
                continue
            try:
                msg = P.decode(line, P.MAX_HELLO)
            except P.ProtocolError as exc:
                self._refuse(str(exc))
                return
            if msg["type"] != P.HELLO or not P.token_ok(msg, relay.token):
                self._refuse("bad hello or token")
                return
            if not relay.on_hello(self, msg):
                self.transport.close()
                return
            relay._forward(self.rank, F.rank_frame(F.FORWARD, self.rank, line))
        del buffer[:start]
        limit = P.MAX_HELLO if self.rank is None else P.MAX_LINE
        if len(buffer) > limit:
            head = bytes(buffer[:limit + 1])
            buffer.clear()
            if self.rank is None:
                self._refuse(f"first line longer than {limit} bytes")
            else:                       # the coordinator fails the job, naming the worker
                relay.on_message(self.rank, head)

    def connection_lost(self, exc) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.relay.on_lost(self)


def main() -> int:
    """``python -m mxlbbsp.relay``: the relay of this host, from the launcher's variables."""
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    try:
        listen, upstream = _env.relay(), _env.coordinator()
        workers = _env.local_size()
        if listen is None or upstream is None:
            raise _env.EnvError(f"{_env.RELAY} and {_env.COORDINATOR} must be set; `mxlbbsp "
                                "launch` starts the relays itself")
        if workers < 1:
            raise _env.EnvError(f"{_env.LOCAL_SIZE}={workers}: a relay serves at least one "
                                "worker")
    except _env.EnvError as exc:
        raise _env.refuse(exc) from None
    relay = Relay(listen, upstream, _env.token(), _env.host(), workers)
    try:
        return asyncio.run(relay.run())
    except ConnectionError as exc:
        sys.stderr.write(f"mxlbbsp: error: {exc}\n")
        return 1
