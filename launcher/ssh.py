"""Reaching other hosts with the system OpenSSH client.

The user's ~/.ssh/config, agent and known_hosts apply, as for any ``ssh``. Commands are
argument lists (never ``shell=True``); the one string the remote shell sees is built with
``shlex.quote`` and contains no secrets: the job's environment, token included, travels on the
SSH session's stdin to the guard (:mod:`.guard`), which also ties the remote process tree's
life to the session. Keep-alives work both ways: ssh's ServerAlive* options end a session
whose host went silent (the launcher then stops the job), and the launcher's heartbeat lines
let a remote guard stop its process when the launcher went silent (:func:`keepalive`).
"""
from __future__ import annotations

import dataclasses
import re
import shlex
import socket
import subprocess
import time
from typing import List, Optional, Sequence, Tuple

from .hostfile import Host

#: keep-alives notice a dead peer in about 15 s
BASE_OPTIONS = (("BatchMode", "yes"), ("ConnectTimeout", "10"), ("ServerAliveInterval", "5"),
                ("ServerAliveCountMax", "3"), ("LogLevel", "ERROR"))


@dataclasses.dataclass(frozen=True)
class SshOptions:
    port: Optional[int] = None
    identity: Optional[str] = None
    options: Sequence[Tuple[str, str]] = ()


def _option(opts: SshOptions, key: str) -> str:
    """The value of an ``ssh -o`` option: the user's, else ours."""
    for k, value in list(opts.options) + list(BASE_OPTIONS):
        if k.lower() == key.lower():
            return value
    raise KeyError(key)


def keepalive(opts: SshOptions) -> Optional[Tuple[float, float]]:
    """(interval, silence): how often the launcher writes a line to each remote guard, and
    how long a guard waits for one before it stops its process. ssh gives up on a silent
    server after ServerAliveInterval x ServerAliveCountMax seconds and the launcher then
    ends the job; the remote guards follow after twice that. None: keep-alives are off."""
    try:
        interval = float(_option(opts, "ServerAliveInterval"))
        count = max(1, int(_option(opts, "ServerAliveCountMax")))
    except ValueError:
        return None
    return (interval, 2.0 * interval * count) if interval > 0 else None


def base_argv(host: Host, opts: SshOptions, connect_timeout: Optional[int] = None) -> List[str]:
    argv = ["ssh", "-T"]
    user_keys = {k.lower() for k, _ in opts.options}
    for key, value in BASE_OPTIONS:
        if key == "ConnectTimeout" and connect_timeout is not None:
            value = str(connect_timeout)
        if key.lower() not in user_keys:
            argv += ["-o", f"{key}={value}"]
    for key, value in opts.options:
        argv += ["-o", f"{key}={value}"]
    port = host.port or opts.port
    if port:
        argv += ["-p", str(port)]
    if opts.identity:
        argv += ["-i", opts.identity]
    return argv


def command(host: Host, opts: SshOptions, remote_argv: Sequence[str],
            connect_timeout: Optional[int] = None) -> List[str]:
    """The local argv that runs ``remote_argv`` on ``host``."""
    return base_argv(host, opts, connect_timeout) + [
        host.target, "exec " + " ".join(shlex.quote(a) for a in remote_argv)]


#: pre-flight: ssh's ConnectTimeout (s), and how often a quick failure is tried
PREFLIGHT_TIMEOUT = 5
PREFLIGHT_ATTEMPTS = 3


#: what OpenSSH's client prints when the connection itself goes (reset, closed by the far
#: side, ServerAlive timeout, a write that fails); it prints nothing when the remote command
#: ends by a signal, which it reports as exit 255 too
_CONNECTION_LOST = re.compile(r"Connection to \S+ closed|Timeout, server \S+ not responding|"
                              r"Broken pipe|Connection reset|Read from remote host|"
                              r"packet_write_wait|client_loop|Connection timed out")


def says_connection_lost(line: Optional[str]) -> bool:
    """Whether ``line``, the last on an ssh transport's stderr, is ssh's own word that the
    connection was lost."""
    return bool(line and _CONNECTION_LOST.search(line))


def check_host(host: Host, opts: SshOptions, python: str, folder: str) -> Optional[str]:
    """None when ``host`` is reachable and can run a role in ``folder``, else what is wrong.

    A quick failure of ssh itself (exit 255: connection refused or reset, e.g. a host that is
    booting or an sshd at its MaxStartups limit) is tried again after a second; a host that
    did not answer within the timeout is reported at once.
    """
    probe = command(host, opts, [python, "-m", "mxlbbsp.launcher.guard", "--check", folder],
                    connect_timeout=PREFLIGHT_TIMEOUT)
    limit = PREFLIGHT_TIMEOUT + 5                 # connected, but nothing answers
    port = host.port or opts.port
    where = host.target + (f" (port {port})" if port else "")
    try_this = f"ssh{f' -p {port}' if port else ''} {host.target} true"
    for attempt in range(PREFLIGHT_ATTEMPTS):
        started = time.monotonic()
        try:
            res = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True,
                                 timeout=limit)
        except subprocess.TimeoutExpired:
            return f"{where}: no answer within {limit} s"
        if res.returncode == 0:
            return None
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        detail = err[-1] if err else f"exit {res.returncode}"
        if res.returncode == 255:
            quick = time.monotonic() - started < PREFLIGHT_TIMEOUT
            if quick and attempt + 1 < PREFLIGHT_ATTEMPTS:
                time.sleep(1.0)
                continue
            return f"{where}: {detail} (`{try_this}` must work here without a prompt)"
        if res.returncode == 127:
            return f"{where}: {python} not found there (set --remote-python)"
        if res.returncode == 3:                    # guard --check: no launch folder there
            return f"{where}: {detail}"
        return (f"{where}: {python} cannot run mxlbbsp there ({detail}); install it on every "
                "host at the same path, or set --remote-python")
    return None  # not reached


def distinct(hosts: Sequence[Host]) -> List[Host]:
    """The different SSH destinations among ``hosts`` (slots aside), in order."""
    return list(dict.fromkeys(dataclasses.replace(h, slots=1) for h in hosts))


def bind_address(hosts: Sequence[Host], opts: Optional[SshOptions] = None) -> str:
    """The address of this machine for the scheduler and the coordinator: the one facing the
    first host that is not this machine, or loopback when every host is."""
    for host in hosts:
        address = local_address_towards(host, opts)
        if not address.startswith("127.") and address != "::1":
            return address
    return "127.0.0.1"


def ssh_hostname(host: Host, opts: Optional[SshOptions] = None) -> str:
    """The name ssh really connects to for ``host``: ~/.ssh/config may map an alias to
    another name (``Host node1`` / ``HostName 10.0.0.5``) that DNS alone does not know.
    ``ssh -G`` prints the effective configuration without connecting."""
    argv = base_argv(host, opts or SshOptions()) + ["-G", host.target]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return host.name
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key.lower() == "hostname" and value.strip():
            return value.strip()
    return host.name


def local_address_towards(host: Host, opts: Optional[SshOptions] = None) -> str:
    """The address of this machine that ``host`` can reach us on (for the scheduler and the
    coordinator). Loopback when the host is on this machine."""
    try:
        target = host.address or socket.gethostbyname(ssh_hostname(host, opts))
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    if target.startswith("127.") or target == "::1":
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))       # UDP: picks the route, sends nothing
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
