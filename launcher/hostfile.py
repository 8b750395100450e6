"""Hostfiles and placement: which role runs where.

A hostfile has one host per line::

    # comments and blank lines are ignored
    node1                    # one slot
    node2 slots=4            # horovod's form: four workers may run here
    alice@node3:2222         # user and SSH port
    [fe80::1]:22 slots=2     # IPv6 literals in brackets

Placement: the scheduler and the coordinator run on the launch node; servers are spread over
the hosts round-robin; workers fill the slots in hostfile order.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import List, Optional

from .config import ConfigError

# names start with a letter, digit or _ so that ssh never takes one for an option
_HOST = re.compile(r"^(?:(?P<user>\w[\w.-]*)@)?"
                   r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>\w[\w.-]*))"
                   r"(?::(?P<port>\d+))?$", re.ASCII)
_SLOTS = re.compile(r"^slots=(?P<n>\d+)$")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    user: Optional[str] = None
    port: Optional[int] = None
    slots: int = 1

    @property
    def target(self) -> str:
        """What to hand to ssh: [user@]name."""
        return f"{self.user}@{self.name}" if self.user else self.name

    @property
    def address(self) -> Optional[str]:
        """The host as an IP address when it is a literal (or localhost), else None."""
        if self.name == "localhost":
            return "127.0.0.1"
        try:
            return str(ipaddress.ip_address(self.name))
        except ValueError:
            return None

    def __str__(self) -> str:
        return self.name


LOCAL = Host("localhost")


def parse_hostfile(path: str) -> List[Host]:
    """The hosts of a hostfile; a malformed line raises ConfigError naming file and line."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read hostfile {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"hostfile {path!r} is not a text file") from None
    hosts: List[Host] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path}:{number}"
        fields = text.split()
        m = _HOST.match(fields[0])
        if not m:
            raise ConfigError(f"{where}: {fields[0]!r} is not a host; expected host, host:port, "
                              "user@host or 'host slots=N'")
        slots = 1
        for k, extra in enumerate(fields[1:]):
            s = _SLOTS.match(extra)
            if not s:
                raise ConfigError(f"{where}: unexpected {extra!r}; the only option after a host "
                                  "is slots=N")
            if k:
                raise ConfigError(f"{where}: slots= given {len(fields) - 1} times; give it once, "
                                  f"e.g. '{fields[0]} {extra}'")
            slots = int(s.group("n"))
            if slots < 1:
                raise ConfigError(f"{where}: slots must be at least 1")
        port = m.group("port")
        if port is not None and not 0 < int(port) < 65536:
            raise ConfigError(f"{where}: port {port} is outside 1..65535")
        hosts.append(Host(m.group("ipv6") or m.group("name"), m.group("user"),
                          int(port) if port else None, slots))
    if not hosts:
        raise ConfigError(f"hostfile {path!r} lists no hosts")
    return hosts


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where every role of a job runs."""

    servers: List[Host]
    workers: List[Host]


def place(hosts: List[Host], num_workers: int, num_servers: int) -> Placement:
    """Servers round-robin over the hosts; workers fill the slots in order."""
    slots = [h for h in hosts for _ in range(h.slots)]
    if num_workers > len(slots):
        raise ConfigError(f"-n {num_workers} workers, but the hostfile has only {len(slots)} "
                          "slot(s); add hosts, raise slots=N, or lower -n")
    servers = [hosts[i % len(hosts)] for i in range(num_servers)]
    return Placement(servers, slots[:num_workers])
