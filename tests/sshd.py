"""A private OpenSSH server for the SSH tests: its own keys, its own port, loopback only.

:func:`ensure_installed` installs Debian's ``openssh-server`` when ``/usr/sbin/sshd`` is
missing (CI runs as root on a clean Debian machine); :class:`Sshd` generates a host key and a
client key in a folder of its own, writes an ``sshd_config`` that listens on the given
loopback addresses on a free port and lets only this user in, with that key only, and runs
``sshd -D`` until :meth:`Sshd.stop`. Nothing outside that folder is changed: the client side
gets a ``known_hosts`` file of its own (:meth:`Sshd.launch_options`).
"""
from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Sequence

import psutil

import apt_fixture  # tests/apt_fixture.py

SSHD = "/usr/sbin/sshd"


def ensure_installed() -> Optional[str]:
    """None when ``sshd`` is there (installed now if needed), else why it cannot be."""
    if os.path.exists(SSHD):
        return None
    failed = apt_fixture.install(["openssh-server"], SSHD)
    if failed:
        return failed
    return None if os.path.exists(SSHD) else f"openssh-server is installed but {SSHD} is not"


def _free_port(addresses: Sequence[str]) -> int:
    """A TCP port free on every address (sshd binds it a moment later: retried on a race)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no TCP port is free on all of {addresses}")


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


class Sshd:
    """``sshd -D`` on ``addresses`` (all of them on this machine) and a free port."""

    def __init__(self, folder: Path, addresses: Sequence[str] = ("127.0.0.1", "127.0.0.2"),
                 port: Optional[int] = None, wrap: Sequence[str] = (),
                 max_startups: str = "100"):
        """``port``: a fixed port (default: a free one); ``wrap``: a command prefix for
        sshd, e.g. ``ip netns exec NAME`` to run it in a network namespace;
        ``max_startups``: sshd's limit on connections that have not logged in yet."""
        self.folder = Path(folder)
        self.addresses = list(addresses)
        self.fixed_port = port
        self.wrap = list(wrap)
        self.max_startups = max_startups
        self.user = getpass.getuser()
        self.host_key = self.folder / "ssh_host_ed25519_key"
        self.client_key = self.folder / "id_ed25519"
        self.known_hosts = self.folder / "known_hosts"
        self.config = self.folder / "sshd_config"
        self.log = self.folder / "sshd.log"
        self.port: Optional[int] = None
        self.proc: Optional[subprocess.Popen] = None

    # ---- setup ----------------------------------------------------------------------------

    def _keys(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        for key, comment in ((self.host_key, "mxlbbsp-test-host"),
                             (self.client_key, "mxlbbsp-test-client")):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                                "-f", str(key)], check=True, stdin=subprocess.DEVNULL)
        (self.folder / "authorized_keys").write_text(
            Path(str(self.client_key) + ".pub").read_text())

    def _write_config(self, use_pam: bool) -> None:
        listen = "".join(f"ListenAddress {a}\n" for a in self.addresses)
        self.config.write_text(
            f"Port {self.port}\n{listen}"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.folder / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.folder / 'authorized_keys'}\n"
            f"AllowUsers {self.user}\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "HostbasedAuthentication no\n"
            f"UsePAM {'yes' if use_pam else 'no'}\n"
            # the key lives in a temporary folder, not in ~/.ssh
            "StrictModes no\n"
            "X11Forwarding no\n"
            "AllowTcpForwarding no\n"
            "PermitUserEnvironment no\n"
            "PrintMotd no\n"
            # a job opens one session per remote process, all at once
            f"MaxStartups {self.max_startups}\n"
            "LogLevel VERBOSE\n")
        hosts = ",".join(f"[{a}]:{self.port}" for a in self.addresses)
        pub = Path(str(self.host_key) + ".pub").read_text().split()
        self.known_hosts.write_text(f"{hosts} {pub[0]} {pub[1]}\n")

    def start(self, timeout: float = 20.0) -> None:
        """Start sshd and wait until a login works; raises RuntimeError with its log if not."""
        self._keys()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # its privilege-separation folder
        problem = ""
        for use_pam in (False, True):
            for _ in range(3):              # the free port may be taken before sshd binds it
                self.port = self.fixed_port or _free_port(self.addresses)
                self._write_config(use_pam)
                check = subprocess.run([SSHD, "-t", "-f", str(self.config)],
                                       capture_output=True, text=True)
                if check.returncode != 0:
                    raise RuntimeError(f"sshd rejects its config: {check.stderr.strip()}")
                self.log.write_text("")
                self.proc = subprocess.Popen(self.wrap + [SSHD, "-D", "-f", str(self.config),
                                                          "-E", str(self.log)],
                                             stdin=subprocess.DEVNULL)
                if self._listening(timeout):
                    break
                self.stop()
            else:
                raise RuntimeError(f"sshd did not start; its log:\n{self.log.read_text()}")
            for _ in range(5):   # the readiness check's connections may still count as startups
                probe = self.run(self.addresses[0], "true")
                if probe.returncode != 255:
                    break
                time.sleep(0.3)
            if probe.returncode == 0:
                return
            problem = probe.stderr.strip() + "\n" + self.log.read_text()
            self.stop()
            if "locked" not in problem:   # without PAM sshd refuses a locked account
                break
        raise RuntimeError(f"cannot log in to the test sshd: {problem}")

    def _listening(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if all(_accepts(a, self.port) for a in self.addresses):
                return True
            time.sleep(0.05)
        return False

    # ---- client side ----------------------------------------------------------------------

    def ssh_options(self, known_hosts: Optional[Path] = None) -> List[str]:
        """``ssh -o`` options that trust this server's host key (and no other; or those of
        ``known_hosts``)."""
        return [f"UserKnownHostsFile={known_hosts or self.known_hosts}",
                "StrictHostKeyChecking=yes", "IdentitiesOnly=yes"]

    def launch_options(self, known_hosts: Optional[Path] = None) -> List[str]:
        """The options of ``mxlbbsp launch`` that reach this server (``known_hosts``: a
        known_hosts file of one's own, e.g. for a second server with the same keys)."""
        out = ["--ssh-port", str(self.port), "--ssh-identity", str(self.client_key)]
        for option in self.ssh_options(known_hosts):
            out += ["--ssh-option", option]
        return out

    def run(self, address: str, *command: str, timeout: float = 20.0):
        """Run ``command`` on ``address`` through this server (for checks)."""
        argv = ["ssh", "-T", "-p", str(self.port), "-i", str(self.client_key),
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
        for option in self.ssh_options():
            argv += ["-o", option]
        return subprocess.run(argv + [f"{self.user}@{address}", *command],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)

    def sessions(self, include_sshd: bool = True) -> List[str]:
        """The command lines of every process below sshd: what the sessions left running
        (without sshd's own session processes when ``include_sshd`` is false)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                if include_sshd or not child.cmdline()[0].startswith("sshd"):
                    out.append(f"{child.pid} {' '.join(child.cmdline())}")
            except (psutil.NoSuchProcess, IndexError):
                continue
        return out

    def wait_no_sessions(self, timeout: float = 10.0, include_sshd: bool = True) -> List[str]:
        """[] once no session process is left; else what is left after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.sessions(include_sshd)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop sshd and whatever its sessions left running."""
        if self.proc is None:
            return
        try:
            left = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            left = []
        for child in left:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
