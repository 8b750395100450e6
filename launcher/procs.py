"""The processes of a job: each one a guard (see :mod:`.guard`), reached locally or over SSH.

A :class:`RoleProcess` is one role (scheduler, server r, worker r) on one host. Its transport
is the argv that starts a guard there: ``python -m mxlbbsp.launcher.guard`` on this machine,
or ``ssh ... host <python> -m mxlbbsp.launcher.guard`` on another (:mod:`.ssh`). Either way
the launcher writes the spec (argv, environment, folder) to the transport's stdin, reads its
output line by line with a ``[role rank]`` prefix, and stops it by closing that stdin.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, IO, List, Optional

GUARD = ["-m", "mxlbbsp.launcher.guard"]


def local_transport() -> List[str]:
    return [sys.executable, *GUARD]


class Output:
    """Writes the lines of every process to our stdout/stderr with its label, and optionally
    each process's raw output to ``log_dir/<role>.<rank>.log``."""

    def __init__(self, log_dir: Optional[str] = None, stdout: IO = None, stderr: IO = None):
        self.log_dir = log_dir
        self._lock = threading.Lock()
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    def open_log(self, name: str) -> Optional[IO]:
        if not self.log_dir:
            return None
        return open(os.path.join(self.log_dir, name + ".log"), "w", buffering=1)

    def pump(self, stream, label: str, to_stderr: bool, log: Optional[IO]) -> threading.Thread:
        dest = self._err if to_stderr else self._out

        def run():
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                with self._lock:
                    dest.write(f"[{label}] {line}\n")
                    dest.flush()
                    if log is not None:
                        log.write(line + "\n")
            stream.close()

        thread = threading.Thread(target=run, name=f"output {label}", daemon=True)
        thread.start()
        return thread

    def say(self, message: str) -> None:
        """A line of the launcher's own, on stderr."""
        with self._lock:
            self._err.write(f"[mxlbbsp] {message}\n")
            self._err.flush()


class RoleProcess:
    """One role of the job on one host, run by a guard."""

    def __init__(self, role: str, rank: Optional[int], host: str, argv: List[str],
                 env: Dict[str, str], cwd: str, transport: List[str], output: Output,
                 show_host: bool = False, grace: float = 3.0):
        self.role, self.rank, self.host = role, rank, host
        self.argv, self.env, self.cwd = argv, env, cwd
        self.transport = transport
        self.output = output
        self.grace = grace
        name = role if rank is None else f"{role} {rank}"
        self.label = f"{name}@{host}" if show_host else name
        self.proc: Optional[subprocess.Popen] = None
        self._threads: List[threading.Thread] = []
        self._log = None
        self.started_at = None

    @property
    def spec(self) -> dict:
        return {"argv": self.argv, "env": self.env, "cwd": self.cwd, "grace": self.grace}

    def start(self) -> None:
        self.proc = subprocess.Popen(self.transport, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.started_at = time.monotonic()
        log_name = self.role if self.rank is None else f"{self.role}.{self.rank}"
        self._log = self.output.open_log(log_name)
        self._threads = [self.output.pump(self.proc.stdout, self.label, False, self._log),
                         self.output.pump(self.proc.stderr, self.label, True, self._log)]
        try:
            self.proc.stdin.write((json.dumps(self.spec) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the transport died at once; poll() reports it

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    @property
    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.returncode

    def stop(self) -> None:
        """Ask the guard to stop the role (closes its stdin); returns at once."""
        if self.proc is not None and self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """Last resort: kill the transport (the guard, or ssh and so the remote guard)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def finish_output(self, timeout: float = 2.0) -> None:
        for t in self._threads:
            t.join(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_all(procs: List[RoleProcess], grace: float) -> None:
    """Stop every process: close every guard's stdin, wait, then kill what is left."""
    for p in procs:
        p.stop()
    deadline = time.monotonic() + grace + 2.0
    for p in procs:
        p.wait(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(2.0)
    for p in procs:
        p.finish_output()
