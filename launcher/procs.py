"""The processes of a job: each one a guard (see :mod:`.guard`), reached locally, over SSH or
with srun.

A :class:`RoleProcess` is one role (scheduler, server r, worker r) on one host. Its
``guard_argv`` starts a guard there (from the job's :mod:`.transport`): ``python -m mxlbbsp.launcher.guard``
on this machine, ``ssh ... host <python> -m mxlbbsp.launcher.guard`` on another (:mod:`.ssh`),
or ``srun ... --nodelist=node <python> -m mxlbbsp.launcher.guard`` in a SLURM allocation
(:mod:`.slurm`). Either way
the launcher writes the spec (argv, environment, folder) to the transport's stdin, reads its
output line by line with a ``[role rank]`` prefix (what the guard, the exit hook and a
refusal say among those lines is taken out and kept: :mod:`.said`), and stops it by closing
that stdin.

The guard's first line says that it started; what comes before it is the transport's own
(e.g. ssh failing to connect), so a role whose transport ended before that line can be
started again without running anything twice (:meth:`RoleProcess.reconnect`).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Optional, Tuple

from .guard import STARTED
from .said import ERROR_PREFIX, Said

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
        self._broken_logs: set = set()      # log files a write failed on (e.g. disk full)
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    def open_log(self, name: str) -> Optional[IO]:
        if not self.log_dir:
            return None
        return open(os.path.join(self.log_dir, name + ".log"), "w", buffering=1)

    def line(self, label: str, text: str, to_stderr: bool, log: Optional[IO]) -> None:
        """One line of a process, with its label (and in its log)."""
        dest = self._err if to_stderr else self._out
        with self._lock:
            dest.write(f"[{label}] {text}\n")
            dest.flush()
            if log is not None and log not in self._broken_logs:
                try:
                    log.write(text + "\n")
                except OSError as exc:
                    # the output still reaches the terminal: say so once, stop this log
                    self._broken_logs.add(log)
                    self._err.write(f"[mxlbbsp] warning: cannot write {log.name} "
                                    f"({exc.strerror}); {label}'s output goes on here only\n")
                    self._err.flush()

    def say(self, message: str) -> None:
        """A line of the launcher's own, on stderr."""
        with self._lock:
            self._err.write(f"[mxlbbsp] {message}\n")
            self._err.flush()


class RoleProcess:
    """One role of the job on one host, run by a guard."""

    def __init__(self, role: str, rank: Optional[int], host: str, argv: List[str],
                 env: Dict[str, str], cwd: str, guard_argv: List[str], output: Output,
                 show_host: bool = False, grace: float = 3.0, silence: Optional[float] = None,
                 boot: bool = False, cpu_every: Optional[float] = None,
                 name: Optional[str] = None, sockets: Optional[List[str]] = None,
                 preemptible: bool = False):
        self.role, self.rank, self.host = role, rank, host
        self.argv, self.env, self.cwd = argv, env, cwd
        #: the command that starts this role's guard on its host (locally, ssh, srun)
        self.guard_argv = guard_argv
        #: the job's transport object that settles this process's end (roles.py sets it)
        self.via = None
        #: the transport's own lines on stderr that the launcher's failure line says better
        #: (e.g. srun's "task 0: Exited with exit code N"): kept in the log, not shown
        self.hide = None
        self.output = output
        self.grace = grace
        #: the guard stops the role after this long without a line (see :meth:`beat`)
        self.silence = silence
        #: the guard installs the exit hook (workers: see ``_boot/sitecustomize.py``)
        self.boot = boot
        #: the guard reports the command's CPU seconds this often (remote workers)
        self.cpu_every = cpu_every
        #: Unix sockets the command creates, which its guard removes once it has ended
        self.sockets = list(sockets or [])
        #: an elastic job's role: SIGTERM to it is a preemption notice (see guard.py)
        self.preemptible = preemptible
        #: what its guard, its exit hook and its refusals said (see :mod:`.said`)
        self.said = Said()
        short = role if rank is None else f"{role} {rank}"
        self.label = f"{short}@{host}" if show_host else short
        #: what the launcher's lines call it ("worker 3", "the relay of node2")
        self.name = name or short
        self.proc: Optional[subprocess.Popen] = None
        #: set when the guard has said it started: the transport is connected
        self.connected = threading.Event()
        self.attempts = 0
        self._threads: List[threading.Thread] = []
        self._log = None
        self._stdin_lock = threading.Lock()
        self._stopping = False
        self._retry_at: Optional[float] = None
        #: lines before the guard started (ssh's own messages): shown unless we try again
        self._early: List[Tuple[str, bool]] = []
        self._early_lock = threading.Lock()
        self.started_at = None

    @property
    def spec(self) -> dict:
        spec = {"argv": self.argv, "env": self.env, "cwd": self.cwd, "grace": self.grace}
        if self.silence is not None:
            spec["silence"] = self.silence
        if self.boot:
            spec["boot"] = True
        if self.cpu_every:
            spec["cpu_every"] = self.cpu_every
        if self.sockets:
            spec["sockets"] = self.sockets
        if self.preemptible:
            spec["preemptible"] = True
        return spec

    def start(self) -> None:
        log_name = self.role if self.rank is None else f"{self.role}.{self.rank}"
        self._log = self.output.open_log(log_name)
        self._spawn()

    def _spawn(self) -> None:
        self.attempts += 1
        with self._early_lock:
            self._early = []
        with self._stdin_lock:            # the spec is the guard's first line, before any beat
            self.proc = subprocess.Popen(self.guard_argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True)
            self.started_at = time.monotonic()
            self._threads = [self._pump(self.proc.stdout, False),
                             self._pump(self.proc.stderr, True)]
            try:
                self.proc.stdin.write((json.dumps(self.spec) + "\n").encode())
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass  # the transport died at once; poll() reports it
            os.set_blocking(self.proc.stdin.fileno(), False)   # beat() must never hang

    def _pump(self, stream, to_stderr: bool) -> threading.Thread:
        def run():
            for raw in iter(stream.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if self.said.refusal(text, to_stderr):
                    if self._log is not None:
                        self._log.write(text + "\n")
                    continue
                with self._early_lock:
                    if not self.connected.is_set():
                        if text == STARTED and not to_stderr:
                            self.connected.set()
                            self._flush_early()
                        else:
                            self._early.append((text, to_stderr))
                        continue
                shown, logged = self.said.take(text, to_stderr, self.hide)
                if shown is not None:
                    self.output.line(self.label, shown, to_stderr, self._log)
                elif logged and self._log is not None:
                    self._log.write(text + "\n")
            stream.close()

        thread = threading.Thread(target=run, name=f"output {self.label}", daemon=True)
        thread.start()
        return thread

    def _flush_early(self) -> None:
        early, self._early = self._early, []
        for text, to_stderr in early:
            self.output.line(self.label, text, to_stderr, self._log)

    def release_error(self) -> None:
        """Show the held-back error line after all (nothing failed because of it)."""
        line, self.said.error_line = self.said.error_line, None
        if line is not None:
            self.output.line(self.label, ERROR_PREFIX + line, True, None)

    def flush_early(self) -> Optional[str]:
        """Show the lines held back before the guard started; returns the last one."""
        with self._early_lock:
            last = self._early[-1][0] if self._early else None
            self._flush_early()
        return last

    def reconnect(self, attempts: int) -> bool:
        """The transport ended before the guard started (ssh could not connect, e.g. an
        sshd at its MaxStartups limit): start it again after a pause that grows with every
        attempt, up to ``attempts`` in all. True while trying again, False once connected
        or out of attempts. The guard had not started, so nothing of the role ran yet."""
        if self.connected.is_set() or self._stopping or self.attempts >= attempts:
            return False
        now = time.monotonic()
        if self._retry_at is None:
            self._retry_at = now + random.uniform(0.5, 1.5) * self.attempts
        elif now >= self._retry_at:
            self._retry_at = None
            for t in self._threads:
                t.join(2.0)
            self._close_stdin()
            self._spawn()
        return True

    def beat(self) -> None:
        """Tell the guard that the launcher is alive: an empty line on its stdin."""
        with self._stdin_lock:
            if self.proc is None or self.proc.stdin.closed:
                return
            try:
                os.write(self.proc.stdin.fileno(), b"\n")
            except OSError:
                pass  # a full pipe (the guard hears from us anyway) or a dead transport

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def local_tree(self) -> list:
        """psutil processes of this role on this machine (the command and its children),
        [] for a role over SSH or one that ended: the guard's descendants."""
        if self.proc is None or self.proc.poll() is not None or \
                self.guard_argv != local_transport():
            return []
        import psutil
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def cpu_sample(self) -> Optional[Tuple[float, float]]:
        """(when, CPU seconds used so far by the role's processes): measured here, or the
        remote guard's last report; None when neither is known."""
        seconds = self.cpu_seconds()
        if seconds is not None:
            return time.monotonic(), seconds
        return self.said.cpu_report

    def cpu_seconds(self) -> Optional[float]:
        """CPU time used so far by the role's processes on this machine (None: not here)."""
        import psutil
        tree = self.local_tree()
        if not tree:
            return None
        total = 0.0
        for p in tree:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        return total

    def stopped(self) -> bool:
        """The role's command is stopped (SIGSTOP, a debugger): seen on this machine, or as
        its remote guard said."""
        import psutil
        tree = self.local_tree()
        if not tree:
            return self.said.stopped and self.poll() is None
        try:
            return bool(tree) and tree[0].status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return False

    @property
    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.returncode

    def stop(self) -> None:
        """Ask the guard to stop the role (closes its stdin); returns at once."""
        self._stopping = True
        self._close_stdin()

    def _close_stdin(self) -> None:
        with self._stdin_lock:
            if self.proc is not None and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass  # unsent spec of a transport that died: nothing to tell it

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

    def drain_output(self, timeout: float = 1.0) -> None:
        """Wait until the ended transport's output has been read to its end."""
        for t in self._threads:
            t.join(timeout)

    def finish_output(self, timeout: float = 2.0) -> None:
        self.drain_output(timeout)
        self.flush_early()
        if self._log is not None:
            try:
                self._log.close()
            except OSError:          # already reported by Output.line
                pass
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
