"""The roles of a job and their environments: the scheduler (always on this machine), the
servers, the hosts' relays and the workers, each a :class:`~.procs.RoleProcess` built, not
started.

A host with two or more workers gets a relay (``python -m mxlbbsp.relay``) with ``--relay
on``, and with ``--relay auto`` in a job of ``RELAY_FROM`` (64) workers or more: its workers'
``MXLBBSP_COORDINATOR`` is the relay's Unix socket on that host
(``unix:/tmp/mxlbbsp-JOB-I.sock``: the relay removes it once its workers have connected, its
guard or the launcher if it was killed first), and the relay reaches the coordinator
(``_env.relay_env``); a host of one worker has it talk to the coordinator itself, as every
worker does with ``--relay off`` (and in a smaller job with ``auto``).

What each role gets: ``PYTHONUNBUFFERED``; what the transport forwards from this process
(over SSH: ``PATH``, ``MXNET_*``, ...); ps-lite's ``DMLC_*`` variables (``_env.ps_env``); the
scheduler and the servers one OpenMP thread, the workers a share of their host's cores (the
guard divides them: ``MXLBBSP_SHARE_CORES``); the workers their rank, the coordinator's
address and token, their slowdown, the sync mode's variables and the checkpoint settings
(``_env.worker_env``, ``_env.checkpoint_env``); and ``--env`` last, with the last word.
"""
from __future__ import annotations

import dataclasses
import os
import random
import secrets
import socket
import sys
from typing import Dict, List, Optional

from mxlbbsp import modes
from mxlbbsp.core import env as _env
from mxlbbsp.core import protocol as P

from . import transport as _transport
from .config import HUB_FROM, RELAY_FROM, RELAYS_PER_HUB, LaunchConfig
from .guard import SHARE_CORES
from .hostfile import Host, Placement, local_ranks
from .procs import Output, RoleProcess, local_transport

#: where a relay's Unix socket is, on its host (a file, not Linux's abstract namespace, which
#: is per network namespace: a worker started under ``ip netns exec`` could not reach it)
SOCKET_DIR = "/tmp"
#: a remote worker's guard reports its CPU seconds this often (see guard.CPU), and whether
#: its command is stopped (see guard.STOPPED) within this
CPU_EVERY = 1.0


#: where :func:`free_port` looks first: ports this far below the kernel's ephemeral range
FIXED_PORTS = 12000


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for a bind to port 0 (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the scheduler's, a hub's), taken below the kernel's
    ephemeral range where one is free: every ps-lite node (this job's servers, starting
    meanwhile, or another job's) takes its own port by a bind to port 0, and one handed the
    scheduler's chosen port before the scheduler bound it got the others' registrations
    and aborted (van.cc: "Check failed: is_scheduler_"). Outside that range only a
    process that asks for that very port can take it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    high = _ephemeral_low()
    low = max(1024, high - FIXED_PORTS)
    rng = random.SystemRandom()
    for _ in range(32 if high > low else 0):
        with socket.socket(family) as s:
            try:
                s.bind((host, rng.randrange(low, high)))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket(family) as s:        # none free there: any the kernel gives
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Roles:
    scheduler: RoleProcess
    servers: List[RoleProcess]
    workers: List[RoleProcess]
    #: the hosts' relays (on each host of two or more workers), and the hubs between
    #: groups of them and the coordinator (on this machine)
    relays: List[RoleProcess] = dataclasses.field(default_factory=list)
    hubs: List[RoleProcess] = dataclasses.field(default_factory=list)

    @property
    def all(self) -> List[RoleProcess]:
        """Every role, in the order they start: the scheduler, the servers, the hubs, the
        relays, the workers."""
        return [self.scheduler] + self.servers + self.hubs + self.relays + self.workers

    @property
    def started_after_the_scheduler(self) -> List[RoleProcess]:
        return self.servers + self.hubs + self.relays + self.workers


class RoleBuilder:
    """Builds the roles of one job attempt (again for each scheduler port tried)."""

    def __init__(self, config: LaunchConfig, transport: _transport.Transport,
                 placement: Placement, token: str, resume_from: Optional[str],
                 output: Output):
        self.config = config
        self.transport = transport
        self.placement = placement
        self.token = token
        self.resume_from = resume_from
        #: the hold's address, for workers started ahead of their job (launcher/hold.py):
        #: they wait there to be told the checkpoint instead of reading MXLBBSP_RESUME
        self.hold = None
        self.output = output
        self._local = _transport.Transport(config)     # the scheduler's: this machine
        #: the relays' Unix sockets are named after this (unique on every host)
        self.job_id = secrets.token_hex(6)

    def build(self, bind: str, scheduler_port: int, coordinator_addr) -> Roles:
        cfg = self.config
        per_host: Dict[str, int] = {}
        for h in self.placement.workers:
            per_host[h.name] = per_host.get(h.name, 0) + 1
        here = Host(bind)
        env = self._ps_env("scheduler", here, bind, scheduler_port, None)
        scheduler = self._role("scheduler", None, here,
                               [sys.executable, "-m", "mxlbbsp.server"], env,
                               guard_argv=local_transport())
        servers = []
        for r, host in enumerate(self.placement.servers):
            env = self._ps_env("server", host, bind, scheduler_port, None)
            argv = [self.transport.python(host), "-m", "mxlbbsp.server"]
            servers.append(self._role("server", r, host, argv, env))
        relay_hosts: List[Host] = []
        if cfg.relay == "on" or (cfg.relay == "auto" and cfg.num_workers >= RELAY_FROM):
            for host in self.placement.workers:
                if per_host[host.name] >= 2 and all(h.name != host.name for h in relay_hosts):
                    relay_hosts.append(host)
        hubs, upstreams = self._hubs(relay_hosts, bind, coordinator_addr, per_host)
        relays, relay_of = [], {}
        for i, (host, upstream) in enumerate(zip(relay_hosts, upstreams)):
            listen = f"{SOCKET_DIR}/mxlbbsp-{self.job_id}-{i}.sock"
            relay_of[host.name] = listen
            env = self._base_env(None)
            env.update(_env.relay_env(listen, upstream, self.token, host.name,
                                      per_host[host.name]))
            relays.append(self._role("relay", i, host,
                                     [self.transport.python(host), "-m", "mxlbbsp.relay"],
                                     env, name=f"the relay of {host.name}",
                                     sockets=[listen]))
        workers = []
        local = local_ranks(self.placement.workers)
        for r, host in enumerate(self.placement.workers):
            env = self._ps_env("worker", host, bind, scheduler_port, per_host[host.name])
            env.update(_env.worker_env(r, cfg.sync, relay_of.get(host.name, coordinator_addr),
                                       self.token, host.name,
                                       cfg.slowdown[r].encode() if cfg.emulate_slowdown else None,
                                       (cfg.emulate_compute or 0.0) / 1000.0,
                                       cfg.signal_columns, local[r],
                                       len(self.placement.workers)))
            env.update(modes.get(cfg.sync).worker_env(cfg.sync_options))
            env.update(_env.checkpoint_env(cfg.checkpoint_dir, cfg.checkpoint_every or 0,
                                           None if self.hold else self.resume_from,
                                           cfg.recovers))
            if self.hold is not None:
                env[_env.HOLD] = P.format_address(self.hold)
            workers.append(self._role("worker", r, host, list(cfg.command), env,
                                      boot=True, watched=True))
        return Roles(scheduler, servers, workers, relays, hubs)

    def _base_env(self, procs_on_host: Optional[int]) -> Dict[str, str]:
        """``procs_on_host``: the job's workers on the host; None for the scheduler and the
        servers, which run on one thread."""
        env: Dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        env.update(self.transport.forwarded())
        if procs_on_host is None:
            env["OMP_NUM_THREADS"] = "1"
        elif "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self.config.env:
            # like torchrun: don't let n processes each take every core. The guard divides
            # the cores of the host it runs on (a remote host's, not this one's).
            env[SHARE_CORES] = str(max(procs_on_host, 1))
        return env

    def _ps_env(self, role: str, host: Host, bind: str, port: int,
                per_host: Optional[int]) -> Dict[str, str]:
        env = self._base_env(per_host)
        node_host = self.transport.node_host(Host(bind) if role == "scheduler" else host, bind)
        env.update(_env.ps_env(role, bind, port, self.config.num_servers,
                               self.config.num_workers, node_host, self.config.ps_interface))
        return env

    def _hubs(self, relay_hosts: List[Host], bind: str, coordinator_addr,
              per_host: Dict[str, int]) -> tuple:
        """With ``--hubs on`` (or ``auto`` and HUB_FROM relays or more), a hub on this
        machine for each RELAYS_PER_HUB relays (on a free port of ``bind``): they reach the
        coordinator through it. (The hubs, to start before the relays; each relay's
        upstream: its hub's address, or the coordinator's.)"""
        cfg = self.config
        count = len(relay_hosts)
        if not count or cfg.hubs == "off" or (cfg.hubs == "auto" and count < HUB_FROM):
            return [], [coordinator_addr] * count
        here = Host(bind)
        hubs, upstreams = [], []
        for i, start in enumerate(range(0, count, RELAYS_PER_HUB)):
            group = relay_hosts[start:start + RELAYS_PER_HUB]
            listen = (bind, free_port(bind))
            upstreams += [listen] * len(group)
            env = self._base_env(None)
            env.update(_env.hub_env(listen, coordinator_addr, self.token, f"hub-{i}",
                                    len(group), sum(per_host[h.name] for h in group)))
            names = group[0].name if len(group) == 1 else f"{group[0].name}..{group[-1].name}"
            hubs.append(self._role("hub", i, here,
                                   [sys.executable, "-m", "mxlbbsp.relay.hub"], env,
                                   guard_argv=local_transport(),
                                   name=f"hub {i} (the relays of hosts {names})"))
        return hubs, upstreams

    def _role(self, role: str, rank: Optional[int], host: Host, argv: List[str],
              env: Dict[str, str], guard_argv: Optional[List[str]] = None,
              boot: bool = False, watched: bool = False,
              name: Optional[str] = None,
              sockets: Optional[List[str]] = None) -> RoleProcess:
        """``guard_argv``: this machine's (the scheduler, the hubs); None: the job's
        transport's for ``host``. ``watched``: a
        remote guard reports the command's CPU use and its stopped state. ``name``: what the
        launcher's lines call it (default: role and rank)."""
        env = dict(env)
        env.update(self.config.env)       # --env has the last word
        keepalive = self.transport.keepalive
        silence = None
        if guard_argv is None and keepalive:     # e.g. over SSH: see ssh.keepalive
            silence = keepalive[1]
        label = role if rank is None else f"{role}-{rank}"
        local = guard_argv is not None
        proc = RoleProcess(role, rank, host.name, argv, env, self.config.cwd,
                           guard_argv or self.transport.guard_argv(host, label), self.output,
                           show_host=self.transport.remote, silence=silence, boot=boot,
                           cpu_every=CPU_EVERY if watched and self.transport.reports_cpu
                           else None, name=name, sockets=sockets,
                           preemptible=self.config.elastic and not local)
        proc.via = self._local if local else self.transport
        proc.hide = proc.via.hide
        return proc
