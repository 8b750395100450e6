"""Reaching other hosts with the system OpenSSH client.

The user's ~/.ssh/config, agent and known_hosts apply, as for any ``ssh``. Commands are
argument lists (never ``shell=True``); the one string the remote shell sees is built with
``shlex.quote`` and contains no secrets: the job's environment, token included, travels on the
SSH session's stdin to the guard (:mod:`.guard`), which also ties the remote process tree's
life to the session.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
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


def _check(host: Host, opts: SshOptions, python: str, attempts: int = 2,
           timeout: int = 5) -> Optional[str]:
    """None when ``host`` is reachable and can run the guard, else what is wrong."""
    probe = [python, "-c", "import mxlbbsp.launcher.guard"]
    last = ""
    for attempt in range(attempts):
        try:
            res = subprocess.run(command(host, opts, probe, connect_timeout=timeout),
                                 stdin=subprocess.DEVNULL, capture_output=True,
                                 timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            last = f"{host.target}: no answer within {timeout + 5} s"
            continue
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        detail = err[-1] if err else f"exit {res.returncode}"
        if res.returncode == 0:
            return None
        if res.returncode == 255:              # ssh itself failed: maybe transient, retry
            last = f"{host.target}: {detail}"
            if attempt + 1 < attempts:
                time.sleep(1.0)
            continue
        if res.returncode == 127:
            return f"{host.target}: {python} not found there (set --remote-python)"
        return (f"{host.target}: mxlbbsp is not importable by {python} there ({detail}); "
                "install it on every host at the same path, or set --remote-python")
    return last


def preflight(hosts: Sequence[Host], opts: SshOptions, python: str) -> List[str]:
    """Check every host in parallel; returns one message per host that failed."""
    unique = list(dict.fromkeys(hosts))
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(unique))) as pool:
        results = list(pool.map(lambda h: _check(h, opts, python), unique))
    return [r for r in results if r]


def local_address_towards(host: Host) -> str:
    """The address of this machine that ``host`` can reach us on (for the scheduler and the
    coordinator). Loopback when the host is on this machine."""
    try:
        target = host.address or socket.gethostbyname(host.name)
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    if target.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
