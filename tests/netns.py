"""A test host of our own: a network namespace joined to this one by a veth pair.

It has its own loopback and one address on a private /24 that this machine reaches through
the veth, so a process in it is "another host" as far as the network goes (it shares our
file system and process table, which the tests use). Only traffic between this machine and
the namespace is involved. Needs root and ``ip`` (iproute2).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Optional


def _ip(*args: str, netns: Optional[str] = None) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", netns, "ip"] if netns else ["ip"]
    return subprocess.run(prefix + list(args), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)


class Netns:
    """Namespace ``name``; this machine is ``host_address`` on the veth, the namespace is
    ``address``."""

    def __init__(self):
        tag = f"mxb{os.getpid() % 100000}"
        self.name = f"{tag}-ns"
        self.veth_here, self.veth_there = f"{tag}h", f"{tag}n"
        self.host_address = self.address = None

    def _free_subnet(self) -> Optional[str]:
        used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
        for n in range(200, 255):
            if f"10.251.{n}." not in used:
                return f"10.251.{n}"
        return None

    def create(self) -> Optional[str]:
        """None when the namespace is up, else why it cannot be."""
        if os.geteuid() != 0 or shutil.which("ip") is None:
            return "needs root and ip (iproute2)"
        subnet = self._free_subnet()
        if subnet is None:
            return "no free 10.251.x.0/24 subnet"
        self.host_address, self.address = f"{subnet}.1", f"{subnet}.2"
        steps = [
            (("netns", "add", self.name), None),
            (("link", "add", self.veth_here, "type", "veth", "peer", "name", self.veth_there),
             None),
            (("link", "set", self.veth_there, "netns", self.name), None),
            (("link", "set", "lo", "up"), self.name),
            (("addr", "add", f"{self.address}/24", "dev", self.veth_there), self.name),
            (("link", "set", self.veth_there, "up"), self.name),
            (("addr", "add", f"{self.host_address}/24", "dev", self.veth_here), None),
            (("link", "set", self.veth_here, "up"), None),
        ]
        for args, netns in steps:
            res = _ip(*args, netns=netns)
            if res.returncode != 0:
                self.delete()
                return f"`ip {' '.join(args)}` failed: {res.stderr.strip()}"
        return None

    @property
    def exec_prefix(self) -> List[str]:
        """Prefix a command with this to run it in the namespace."""
        return ["ip", "netns", "exec", self.name]

    def set_link(self, up: bool) -> None:
        """Cut (or restore) the namespace's network: no error, no reset, just silence."""
        res = _ip("link", "set", self.veth_there, "up" if up else "down", netns=self.name)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip())

    def delete(self) -> None:
        """Remove the namespace (and with it the veth pair)."""
        _ip("netns", "delete", self.name)
        _ip("link", "delete", self.veth_here)
