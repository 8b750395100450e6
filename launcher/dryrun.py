"""``mxlbbsp launch --dry-run``: the placement and the commands of a job, nothing started.

The roles are built exactly as for a run (:class:`~.roles.RoleBuilder`), with placeholders
for what only a run chooses (the scheduler's and the coordinator's ports) and for the
job's secret token, which is never printed.
"""
from __future__ import annotations

import shlex
from typing import List, Sequence

from mxlbbsp.core import env as _env

from . import transport as _transport
from .config import LaunchConfig
from .hostfile import Host
from .roles import Roles


def describe(config: LaunchConfig, transport: _transport.Transport, hosts: Sequence[Host],
             bind: str, roles: Roles) -> str:
    """The text --dry-run prints (token hidden)."""
    lines: List[str] = [
        f"job: {config.num_workers} worker(s), {config.num_servers} server(s), "
        f"sync={config.sync}, scheduler and coordinator on {bind}; every process runs in "
        f"{config.cwd}"]
    lines += transport.bind_notes(hosts, bind)
    lines += transport.describe()
    lines.append(f"{'ROLE':<10} {'RANK':<5} {'HOST':<20} COMMAND")
    chosen = {_env.TOKEN: "<secret>", _env.PS_ROOT_PORT: "<free port>",
              _env.COORDINATOR: f"{bind}:<free port>"}
    # a hub's port, which a run chooses again: its relays' coordinator and its own address
    hubs = {p.env[_env.RELAY]: f"{bind}:<hub {p.rank} port>"
            for p in roles.hubs}
    for p in roles.all:
        shown = {k: hubs.get(v) or (v if v.startswith("unix:")      # a relay's socket
                                    else chosen.get(k, v))
                 for k, v in sorted(p.env.items())
                 if k.startswith(("DMLC_", "MXLBBSP_")) or k == "OMP_NUM_THREADS"}
        env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
        where = "local" if p is roles.scheduler or p.role == "hub" else p.host
        rank = "-" if p.rank is None else str(p.rank)
        lines.append(f"{p.role:<10} {rank:<5} {where:<20} {shlex.join(p.argv)}")
        lines.append(f"{'':<10} {'':<5} {'':<20}   env: {env_text}")
        if p.via.remote:
            lines.append(f"{'':<10} {'':<5} {'':<20}   via: {shlex.join(p.guard_argv)}")
    return "\n".join(lines)
