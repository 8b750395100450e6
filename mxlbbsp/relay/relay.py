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
* down: a ``slice`` line for each of its workers from one SLICES frame, the frames for one
  worker (TO_RANK) or all (TO_ALL) as they come, and CLOSE.

When the job's predictor is separable, the coordinator hands the forecasts of this host's
workers to the relay (:mod:`.forecast`): their forecasts leave with the host's last report
of each iteration, and the predictor learns after the write.

It ends (exit 0) once every worker of the host has registered and closed its connection;
when the coordinator's connection breaks first it closes its workers' (they stop as with a
lost coordinator) and exits 1 with one line. Its own CPU time is what one host pays for the
job's control plane (benchmarks/coordinator_scale.py measures it).

Its parts: its workers' connections are :class:`mxlbbsp.core.peer.Peer` (the hello gate,
lines) with the relay as their handler; what comes down is routed by
:class:`mxlbbsp.core.links.Links`; what goes up waits in a :class:`.stream.PendingStream` and
leaves through its :class:`.uplink.Uplink`. This module is the relay's policy: when a section
leaves, and its forecasts.

Stdlib and numpy only, no MXNet: it starts in a fraction of a second.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import List, Optional

from mxlbbsp.core import env as _env
from mxlbbsp.core import frames as F
from mxlbbsp.core import protocol as P
from mxlbbsp.core.links import Links
from mxlbbsp.core.peer import Peer
from mxlbbsp.relay.forecast import Forecaster
from mxlbbsp.relay.stream import PendingStream, Section
from mxlbbsp.relay.uplink import Uplink

log = logging.getLogger(__name__)


class Relay:
    """One host's relay (see the module docstring). ``await run()`` serves until it ends and
    returns the exit code. ``listen``: its address; ``upstream``: the coordinator's;
    ``workers``: how many workers of the job run on this host.

    The :class:`~mxlbbsp.core.peer.PeerHandler` of its workers' connections (a hello, lines,
    a connection lost) and the :class:`~.uplink.UplinkOwner` of its own."""

    def __init__(self, listen: P.Address, upstream: P.Address, token: str, host: str,
                 workers: int):
        self.listen, self.upstream = listen, upstream
        self.host, self.expected = host, int(workers)
        self.hold_s = 0.0                    # until the coordinator's CONFIG says otherwise
        self.done_hold_s = 0.0
        self.checkpoint_every = 0            # the dones of a checkpoint's iteration: at once
        self.forecaster: Optional[Forecaster] = None   # the CONFIG's, when it sends one
        self.active: set = set()             # registered ranks that have not said bye
        self.registered = 0                  # workers that ever registered here
        self.label = f"the relay of host {host}"
        self.links = Links()                 # its registered workers
        self.uplink = Uplink(self, self.label, token, (P.HELLO,), self.links)
        self.stream = PendingStream(self._encode, self._send)
        self.sections_up = 0                 # sections sent (reports or dones of a t)
        self.messages_up = 0                 # reports and dones in them
        self.forecasts_ahead = 0             # FORECAST frames sent (a section left early)

    refused = property(lambda self: self.uplink.gate.refusals.count,
                       doc="connections refused before a valid hello")

    # ---- lifecycle (the uplink's owner) ---------------------------------------------------

    async def run(self) -> int:
        return await self.uplink.serve(self.upstream, self.listen, self.host, self.expected)

    def closing(self) -> None:
        self._unlink()
        self.links.close_all()
        self.stream.flush()

    def _unlink(self) -> None:
        """Remove the socket's file (none in the abstract namespace): at the end, or once
        every worker has connected (nobody else may, and a killed relay leaves nothing)."""
        if isinstance(self.listen, str) and not self.listen.startswith("\0"):
            try:
                os.unlink(self.listen)
            except OSError:
                pass

    def on_config(self, config: dict, body: bytes) -> None:
        if "hold_s" in config:
            self.hold_s = float(config["hold_s"])
            self.done_hold_s = float(config.get("done_hold_s", 0.0))
            self.checkpoint_every = int(config.get("checkpoint_every") or 0)
        if config.get("forecast"):
            self.forecaster = Forecaster(config["forecast"], self.checkpoint_every)

    def upstream_lost(self) -> None:
        if self.registered >= self.expected and not self.active:
            self.uplink.end(0)          # every worker had said bye
        else:
            self.uplink.end(1, f"{self.label} lost its connection to the coordinator")

    # ---- from the workers (their connections' handler) ------------------------------------

    def on_hello(self, peer: Peer, msg: dict, line: bytes) -> bool:
        """A worker's hello with the job's token: registered here and passed on."""
        rank = msg.get("rank")
        if type(rank) is not int or rank < 0 or rank in self.links.writers:
            peer.transport.write(P.encode(P.error(
                f"rank {rank!r} connected twice to {self.label}"
                if rank in self.links.writers else f"rank {rank!r} is not a worker's rank")))
            peer.transport.close()
            return False
        peer.rank = rank
        self.links.register(rank, peer.transport)
        self.active.add(rank)
        self.registered += 1
        if self.registered == self.expected:
            self._unlink()
        self._forward(rank, F.rank_frame(F.FORWARD, rank, line))
        return True

    def on_line(self, peer: Peer, line: bytes) -> bool:
        """One line of a registered worker."""
        rank = peer.rank
        try:
            msg = P.decode(line)
        except P.ProtocolError:
            msg = None                  # the coordinator reads it and fails the job
        kind = msg.get("type") if msg is not None else None
        if kind in F.BATCHED and type(msg.get("iteration")) is int:
            self._add(rank, msg)
            return True
        if kind == P.BYE:
            self.active.discard(rank)
        self._forward(rank, F.rank_frame(F.FORWARD, rank, line))
        if kind == P.BYE and self.stream.complete(len(self.active), every=False):
            self.stream.flush()
        return True

    def on_lost(self, peer: Peer) -> None:
        rank = peer.rank
        if self.links.writers.get(rank) is not peer.transport:
            return
        self.links.unregister(rank)
        self.active.discard(rank)
        self._forward(rank, F.rank_frame(F.LOST, rank))
        self.stream.flush()
        if not self.links.writers and self.registered >= self.expected:
            self.uplink.end(0)

    # ---- the pending stream ---------------------------------------------------------------

    def _add(self, rank: int, msg: dict) -> None:
        key = (msg["type"], msg["iteration"])
        stream = self.stream
        section = stream.add(key, (rank,), (rank, msg, time.monotonic()))
        if self.forecaster is not None and key[0] == P.REPORT:
            self._forecast(rank, msg, section)
        if len(stream.seen[key]) < len(self.active):
            stream.arm(self.hold_s)
        elif key[0] == P.DONE and self.done_hold_s > 0 and not (
                self.checkpoint_every and (key[1] + 1) % self.checkpoint_every == 0):
            # with the next reports; not those of an iteration the coordinator checkpoints
            # once they are in (its state's JSON would then delay the next split)
            self._hold_dones()
        else:
            if key[0] == P.DONE and self.forecaster is not None:
                # the training step of these dones' reports first (it was only scheduled
                # after them): at a checkpoint its state must lead them, and a worker that
                # need not wait for its next split sends its done right after its report
                self._learn()
            stream.flush()

    def _forecast(self, rank: int, msg: dict, section: Section) -> None:
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
        for r, m, _ in section.entries:
            m["_forecast"], m["_fallbacks"] = values[slot[r]], counts[slot[r]]
        if len(section.ranks) < len(forecaster.ranks):      # the others' left before
            self.stream.ahead.append(F.forecast_frame(t, forecaster.ranks, forecasts,
                                                      fallbacks))
            self.forecasts_ahead += 1

    def _learn(self) -> None:
        state = self.forecaster.learn()
        if state is not None:               # NaN in a fresh state: plain JSON, not the line's
            # with the next write (the host's dones of that iteration, which the coordinator
            # checkpoints after): read while the workers compute, not before the split
            self.stream.ahead.append(F.frame(F.STATE, json.dumps(state).encode()))

    def _forward(self, rank: int, data: bytes) -> None:
        if not self.stream.items:       # nothing to keep in order with: at once
            self._send([data])
            return
        self.stream.forward((rank,), data)
        self.stream.arm(self.hold_s)

    def _hold_dones(self) -> None:
        """A section of dones is complete: when nothing else pending is waited for (the
        host's workers' dones came before any of their next reports), everything pending
        may wait ``done_hold_s``, else it leaves as it would have."""
        if not self.stream.only(P.DONE, len(self.active)):
            self.stream.arm(self.hold_s)
            return
        self.stream.disarm()
        self.stream.arm(self.done_hold_s)

    def _encode(self, section: Section, now: float) -> List[bytes]:
        self.sections_up += 1
        self.messages_up += len(section.entries)
        return F.encode_rows([(r, m, now - at) for r, m, at in section.entries])

    def _send(self, frames: List[bytes]) -> None:
        """One write to the coordinator."""
        self.uplink.send(frames)


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
    if _env.preemptible():
        # an elastic job's host given notice: serve its workers on until the job is resized
        # around it (the guard then ends this process with SIGUSR2)
        signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        return asyncio.run(relay.run())
    except ConnectionError as exc:
        sys.stderr.write(f"mxlbbsp: error: {exc}\n")
        return 1
