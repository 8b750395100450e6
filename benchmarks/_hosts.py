"""Emulated hosts for coordinator_scale.py: the simulated workers, k per host, behind their
host's relay, as ``mxlbbsp launch`` runs a job of 64+ workers (or ``--relay on``), k per
host.

The relays are the real :class:`mxlbbsp.relay.relay.Relay` (one per emulated host, each with
its own connection to the coordinator and its own abstract Unix socket), all of them on one
asyncio loop in one process on the client cores: on a cluster each runs on its own host, in
parallel; here they take turns on one core. So this process also measures, per iteration:

* its CPU time (``time.process_time``; over n/k relays: divided by n/k, what one host pays);
* when each relay sent its section of reports of iteration t, and when it got the SLICES
  frame of t + 1: the coordinator's share of the latency, relay to relay (what a cluster
  pays on top of its hosts' own hops, whatever the number of hosts);
* how long the relay whose section left last took from its host's last report read to the
  section written (its forecasts of its workers included): the host's own share of the
  path, which on a cluster each host pays in parallel.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import struct
import time
from typing import Dict, List, Tuple

import numpy as np

from mxlbbsp.core import frames as F
from mxlbbsp.relay.hub import Hub
from mxlbbsp.relay.relay import Relay


def _watch_slices(node) -> None:
    """Call ``node._slices_came(iteration)`` as each SLICES frame comes down, before it is
    passed on (its links' pass_down wrapped on this instance: instrumentation only)."""
    pass_down = node.links.pass_down

    def watched(kind, body):
        if kind == F.SLICES:
            node._slices_came(struct.unpack_from("<q", body)[0])
        return pass_down(kind, body)
    node.links.pass_down = watched


class TimedRelay(Relay):
    """A relay that notes when its report sections leave and its SLICES frames arrive."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _watch_slices(self)
        self.sent: Dict[int, float] = {}      # iteration -> its reports' section left
        self.got: Dict[int, float] = {}       # iteration -> its SLICES frame came
        self.cpu: List[Tuple[int, float]] = []   # (iteration of a SLICES frame, CPU s)
        self.path: Dict[int, float] = {}      # iteration -> last report read to section out
        self._leaving: List[int] = []         # iterations of the report sections being sent

    def _add(self, rank, msg) -> None:
        start = time.perf_counter()
        super()._add(rank, msg)
        t = msg.get("iteration")
        if msg.get("type") == "report" and self.sent.get(t, 0.0) >= start:
            self.path[t] = self.sent[t] - start

    def _encode(self, section, now):
        if section.key[0] == "report":
            self._leaving.append(section.key[1])
        return super()._encode(section, now)

    def _send(self, frames) -> None:
        super()._send(frames)
        now = time.perf_counter()
        for t in self._leaving:
            self.sent[t] = now
        self._leaving = []

    def _slices_came(self, t: int) -> None:
        self.got[t] = time.perf_counter()
        if self.cpu is not None:
            self.cpu.append((t, time.process_time()))


def hub_plan(hosts, per_hub: int) -> Tuple[list, List[str]]:
    """The hubs of ``hosts`` (``plan``'s), ``per_hub`` relays each: (name, address, relays,
    workers), and each host's relay's upstream (its hub's address)."""
    job = secrets.token_hex(4)
    hubs, upstreams = [], []
    for i, start in enumerate(range(0, len(hosts), per_hub)):
        group = hosts[start:start + per_hub]
        address = f"unix:@mxlbbsp-bench-hub-{job}-{i}"
        hubs.append((f"hub{i}", address, len(group), sum(k for _, _, k in group)))
        upstreams += [address] * len(group)
    return hubs, upstreams


class TimedHub(Hub):
    """A hub that notes its process's CPU time when its SLICES frames arrive, and per
    iteration when its merged section of reports left and how long after its last relay's
    section of them was read (its own share of the path)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _watch_slices(self)
        self.cpu: List[Tuple[int, float]] = []
        self.sent: Dict[int, float] = {}
        self.path: Dict[int, float] = {}
        self._read: Dict[int, float] = {}
        self._leaving: List[int] = []

    def _add(self, relay, body) -> None:
        what, t, _ = F.rows_head(body)
        if what == 0:
            self._read[t] = time.perf_counter()
        super()._add(relay, body)

    def _encode(self, section, now):
        if section.key[0] == 0:
            self._leaving.append(section.key[1])
        return super()._encode(section, now)

    def _send(self, frames) -> None:
        super()._send(frames)
        now = time.perf_counter()
        for t in self._leaving:
            self.sent[t] = now
            if t in self._read:
                self.path[t] = now - self._read.pop(t)
        self._leaving = []

    def _slices_came(self, t: int) -> None:
        if self.cpu is not None:
            self.cpu.append((t, time.process_time()))


def hub_process(upstream, token: str, hubs, conn, cpus=None) -> None:
    """Run a TimedHub per hub (``hub_plan``'s) until every one has ended; ("ready", None)
    once they listen, then ("ok", stats) or ("error", text) on ``conn``."""
    _process(_hubs, upstream, token, hubs, conn, cpus)


async def _hubs(upstream, token, hubs, conn) -> dict:
    from mxlbbsp.core import protocol as P
    running = [TimedHub(P.parse_address(address), tuple(upstream), token, name, relays, k)
               for name, address, relays, k in hubs]
    codes = await _serve_all(running, conn)
    return {"codes": codes, "cpu": running[0].cpu, "sent": [h.sent for h in running],
            "path": [h.path for h in running],
            "writes_up": sum(h.writes_up for h in running),
            "sections_in": sum(h.sections_in for h in running),
            "sections_up": sum(h.sections_up for h in running)}


def hub_path(stats: dict, iterations: int, skip: int) -> List[float]:
    """Per iteration, the own path (ms) of the hub whose merged section of reports left
    last: its last relay's section read to its write."""
    return [x for x in (_last_path(stats, t) for t in range(skip, iterations))
            if x is not None]


def hub_cpu(stats: dict, skip: int) -> float:
    """The hubs' process's CPU milliseconds per iteration."""
    return _cpu_per_iteration(stats["cpu"], skip)


def _process(serve, upstream, token: str, items, conn, cpus) -> None:
    """A process of relays or hubs: ``serve(upstream, token, items, conn)`` on its own loop,
    on ``cpus``; its stats (or the error) on ``conn``."""
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        conn.send(("ok", asyncio.run(serve(upstream, token, items, conn))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _serve_all(nodes, conn) -> list:
    """Run relays or hubs until every one has ended (their exit codes); ("ready", None) on
    ``conn`` once they listen. The first one samples the process's CPU."""
    for node in nodes[1:]:
        node.cpu = None
    tasks = [asyncio.ensure_future(node.run()) for node in nodes]
    while not all(node.uplink.server is not None for node in nodes):
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.01)
    conn.send(("ready", None))
    return await asyncio.gather(*tasks)


def _last_path(stats: dict, t: int):
    """The own path (ms) at iteration t of the relay or hub whose section of reports left
    last (None: not timed)."""
    sent = [s.get(t, -1.0) for s in stats["sent"]]
    last = stats["path"][int(np.argmax(sent))].get(t)
    return None if max(sent) < 0 or last is None else 1000 * last


def _cpu_per_iteration(samples, skip: int) -> float:
    """Milliseconds of CPU per iteration from (iteration, process CPU s) samples after
    ``skip``."""
    cpu = [(t, c) for t, c in samples if t > skip]
    if len(cpu) < 2 or cpu[-1][0] <= cpu[0][0]:
        return float("nan")
    return 1000 * (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0])


def plan(n: int, per_host: int) -> Tuple[List[Tuple[str, str, int]], List[str]]:
    """The emulated hosts, (host name, relay address, workers), and each rank's address:
    ranks fill the hosts in order, ``per_host`` each (the last may have fewer)."""
    job = secrets.token_hex(4)
    hosts, addresses = [], []
    for h, start in enumerate(range(0, n, per_host)):
        k = min(per_host, n - start)
        address = f"unix:@mxlbbsp-bench-{job}-{h}"
        hosts.append((f"host{h}", address, k))
        addresses += [address] * k
    return hosts, addresses


def relay_process(upstream, token: str, hosts, conn, cpus=None) -> None:
    """Run a TimedRelay per host until every one has ended; sends ("ready", None) once they
    listen, then ("ok", stats) or ("error", text) on ``conn``. ``upstream``: the coordinator's
    address, or a list of each host's relay's (its hub's: ``hub_plan``)."""
    _process(_relays, upstream, token, hosts, conn, cpus)


async def _relays(upstream, token, hosts, conn) -> dict:
    from mxlbbsp.core import protocol as P
    ups = upstream if isinstance(upstream, list) else [tuple(upstream)] * len(hosts)
    relays = [TimedRelay(P.parse_address(address), P.parse_address(up) if isinstance(up, str)
                         else up, token, name, k)
              for (name, address, k), up in zip(hosts, ups)]
    codes = await _serve_all(relays, conn)
    return {"codes": codes, "sent": [r.sent for r in relays], "got": [r.got for r in relays],
            "path": [r.path for r in relays],
            "cpu": relays[0].cpu, "frames_up": sum(r.uplink.frames_up for r in relays),
            "sections_up": sum(r.sections_up for r in relays),
            "messages_up": sum(r.messages_up for r in relays)}


def summary(stats: dict, iterations: int, skip: int, hosts: int, ahead: int = 0) -> dict:
    """Relay to relay latency per iteration (ms): from the reports of t up to the split
    they decide, of t+1+``ahead``; and the relays' CPU per iteration."""
    latency, path = [], []
    for t in range(skip, iterations):
        sent = [s.get(t) for s in stats["sent"]]
        got = [g.get(t + 1 + ahead) for g in stats["got"]]
        if None in sent or None in got:
            continue
        latency.append(1000 * (max(got) - max(sent)))
        last = _last_path(stats, t)
        if last is not None:
            path.append(last)
    per_iteration = _cpu_per_iteration(stats["cpu"], skip)
    return {"relay_latency_ms": latency, "relay_path_ms": path,
            "relays_cpu_ms_per_iteration": per_iteration,
            "relay_cpu_ms_per_iteration": per_iteration / hosts,
            "sections_per_iteration": stats["sections_up"] / max(iterations, 1),
            "messages_per_section": stats["messages_up"] / max(stats["sections_up"], 1)}
