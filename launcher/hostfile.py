"""Hosts and placement: which role runs where.

``-H`` takes a hostfile or an inline list. An existing file is a hostfile; anything else with
a ``,`` or a ``:`` in it is an inline list; anything else is a missing file (a single host
inline is ``-H node1:1``, its slots always written).

An inline list is horovodrun's: ``host[:slots]`` items, comma-separated, e.g.
``-H node1:4,alice@node2:4,[fe80::1]:2``; the number after ``:`` is the number of slots
(workers that may run there), 1 when absent. The SSH port is ``--ssh-port`` (or a hostfile).

A hostfile has one host per line::

    # comments and blank lines are ignored
    node1                    # one slot
    node2 slots=4            # horovod's and MPI's form: four workers may run here
    node3 port=22 slots=2    # the SSH port as an option: any port, no doubt
    alice@node4:2222         # user and SSH port
    [fe80::1]:22 slots=2     # IPv6 literals in brackets

In a hostfile ``host:N`` is the SSH port N (``user@host:port``, as ssh URIs write it), but a
horovodrun user means N slots. So the port form is taken only where it cannot mean slots:
N >= 1024 (no host has that many slots, and most custom SSH ports are above it), or with
``slots=`` on the same line. ``node1:2`` alone is refused with a line that says to write
``node1 slots=2`` or ``node1 port=2``.

At most MAX_WORKERS workers (and servers, and slots per host): a bigger number is a typo.

Placement: the scheduler and the coordinator run on the launch node; servers are spread over
the hosts round-robin; workers fill the slots in hostfile order.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from typing import List, Optional

from .errors import ConfigError

# names start with a letter, digit or _ so that ssh never takes one for an option
_HOST = re.compile(r"^(?:(?P<user>\w[\w.-]*)@)?"
                   r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>\w[\w.-]*))"
                   r"(?::(?P<port>\d+))?$", re.ASCII)
_OPTION = re.compile(r"^(?P<key>slots|port)=(?P<n>\d+)$", re.ASCII)
#: in a hostfile, ``host:N`` without ``slots=`` is a port only from here on (see above)
MIN_BARE_PORT = 1024
#: the most workers (and servers, and slots on one host) of a job
MAX_WORKERS = 65536


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


def _count(where: str, what: str, text: str, high: int) -> int:
    n = int(text)
    if n < 1:
        raise ConfigError(f"{where}: {what} must be at least 1")
    if n > high:
        raise ConfigError(f"{where}: {what} {text} is more than {high}")
    return n


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
            raise ConfigError(f"{where}: {fields[0]!r} is not a host; expected host, "
                              "user@host, 'host slots=N', 'host port=P' or host:P (P >= "
                              f"{MIN_BARE_PORT})")
        options = {}
        for extra in fields[1:]:
            o = _OPTION.match(extra)
            if not o:
                raise ConfigError(f"{where}: unexpected {extra!r}; the options after a host "
                                  "are slots=N and port=P")
            key = o.group("key")
            if key in options:
                given = sum(f.startswith(key + "=") for f in fields[1:])
                raise ConfigError(f"{where}: {key}= given {given} times; give it once, "
                                  f"e.g. '{fields[0]} {extra}'")
            options[key] = o.group("n")
        slots = _count(where, "slots", options["slots"], MAX_WORKERS) if "slots" in options \
            else 1
        port = m.group("port")
        if port is not None and "port" in options:
            raise ConfigError(f"{where}: the port is given twice ({fields[0]!r} and "
                              f"port={options['port']}); give it once")
        if port is not None and not 0 < int(port) < 65536:
            raise ConfigError(f"{where}: port {port} is outside 1..65535")
        if port is not None and "slots" not in options and int(port) < MIN_BARE_PORT:
            host = fields[0].rpartition(":")[0]
            raise ConfigError(f"{where}: is {fields[0]!r} {port} slots (as in horovodrun -H) "
                              f"or SSH port {port}? write '{host} slots={port}' or "
                              f"'{host} port={port}'")
        port = options.get("port", port)
        if port is not None and not 0 < int(port) < 65536:
            raise ConfigError(f"{where}: port {port} is outside 1..65535")
        hosts.append(Host(m.group("ipv6") or m.group("name"), m.group("user"),
                          int(port) if port else None, slots))
    if not hosts:
        raise ConfigError(f"hostfile {path!r} lists no hosts")
    return hosts


def parse_host_list(text: str) -> List[Host]:
    """An inline ``-H`` list, ``host[:slots],...`` (horovodrun's); ConfigError if malformed."""
    hosts: List[Host] = []
    for item in text.split(","):
        item = item.strip()
        m = _HOST.match(item)
        if not m:
            shown = repr(item) if item else "an empty item"
            raise ConfigError(f"-H {text!r}: {shown} is not host or host:slots; expected a "
                              "hostfile or a list such as -H node1:4,node2:4")
        slots = m.group("port")
        n = _count(f"-H {text!r}: {item!r}", "slots", slots, MAX_WORKERS) if slots else 1
        hosts.append(Host(m.group("ipv6") or m.group("name"), m.group("user"), None, n))
    return hosts


def parse_hosts(spec: str) -> List[Host]:
    """``-H``: a hostfile when ``spec`` is an existing file, else an inline list when it has
    a ``,`` or ``:``; else ConfigError (no such file)."""
    if os.path.isfile(spec):
        return parse_hostfile(spec)
    if os.path.exists(spec):
        raise ConfigError(f"-H/--hostfile {spec!r} is not a file; give a hostfile or a list "
                          "of hosts such as -H node1:4,node2:4")
    if "," in spec or ":" in spec:
        return parse_host_list(spec)
    hint = f" (one host inline: -H {spec}:1)" if _HOST.match(spec) else ""
    raise ConfigError(f"-H/--hostfile {spec!r}: no such file{hint}")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where every role of a job runs."""

    servers: List[Host]
    workers: List[Host]


def place(hosts: List[Host], num_workers: int, num_servers: int) -> Placement:
    """Servers round-robin over the hosts; workers fill the slots in order."""
    total = sum(h.slots for h in hosts)
    if num_workers > total:
        raise ConfigError(f"-n {num_workers} workers, but the hosts of -H have only {total} "
                          "slot(s); add hosts, raise their slots, or lower -n")
    workers: List[Host] = []
    for h in hosts:
        workers.extend([h] * min(h.slots, num_workers - len(workers)))
    servers = [hosts[i % len(hosts)] for i in range(num_servers)]
    return Placement(servers, workers)


def local_ranks(workers: List[Host]) -> List[tuple]:
    """(local rank, local size) of each worker: its index among the job's workers on its
    host (by name, as the cores are shared), and their number."""
    size: dict = {}
    for h in workers:
        size[h.name] = size.get(h.name, 0) + 1
    seen: dict = {}
    out = []
    for h in workers:
        out.append((seen.get(h.name, 0), size[h.name]))
        seen[h.name] = seen.get(h.name, 0) + 1
    return out
