"""The middleman between the launcher and every process of a job: ``python -m mxlbbsp.launcher.guard``.

The launcher starts each role (scheduler, server, worker) through a guard, locally or at the
end of an SSH session, and writes one JSON line to the guard's standard input::

    {"argv": [...], "env": {...}, "cwd": "/launch/dir", "grace": 3.0}

The guard runs ``argv`` in ``cwd`` with ``env`` added to its environment, in a new session
(its own process group), and passes its output straight through. The spec travels on stdin,
so no variable (the job's token among them) appears on a command line that ``ps`` shows.

The guard then keeps reading stdin. When stdin closes (the launcher exited or died, or the
SSH connection dropped) or a ``stop`` line arrives, or the guard itself gets SIGTERM, SIGINT or
SIGHUP, it stops the whole process group: SIGTERM, ``grace`` seconds, then SIGKILL. When the
command ends by itself, whatever it left behind in its group is killed too. The guard exits
with the command's exit code (128 + N for a signal N, like a shell).

Only the standard library is imported here: the guard starts in milliseconds.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

NOT_FOUND = 127


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    return _killpg(pgid, 0)


class Guard:
    def __init__(self, spec: dict):
        self.spec = spec
        self.grace = float(spec.get("grace", 3.0))
        self.child = None
        self._stopping = threading.Event()

    def start(self) -> None:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (self.spec.get("env") or {}).items()})
        cwd = self.spec.get("cwd") or None
        self.child = subprocess.Popen(self.spec["argv"], env=env, cwd=cwd,
                                      start_new_session=True)

    def stop(self) -> None:
        """Stop the command's whole process group (idempotent; returns at once)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        threading.Thread(target=self._terminate, daemon=True).start()

    def _terminate(self) -> None:
        pgid = self.child.pid
        _killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.05)
        _killpg(pgid, signal.SIGKILL)

    def watch_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        self.stop()

    def wait(self) -> int:
        rc = self.child.wait()
        # Leftovers of the command (e.g. data-loading processes) die with it.
        _killpg(self.child.pid, signal.SIGKILL)
        return rc if rc >= 0 else 128 - rc


def main() -> int:
    line = sys.stdin.readline()
    if not line:
        return 1
    try:
        spec = json.loads(line)
        argv = spec["argv"]
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
    except (ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"mxlbbsp guard: error: bad spec from the launcher: {exc}\n")
        return 2
    guard = Guard(spec)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: guard.stop())
    try:
        guard.start()
    except FileNotFoundError:
        sys.stderr.write(f"mxlbbsp: error: command not found: {argv[0]!r} "
                         f"(on {os.uname().nodename}, in {spec.get('cwd') or os.getcwd()})\n")
        return NOT_FOUND
    except (PermissionError, NotADirectoryError, OSError) as exc:
        sys.stderr.write(f"mxlbbsp: error: cannot run {argv[0]!r}: {exc.strerror or exc}\n")
        return 126
    threading.Thread(target=guard.watch_stdin, daemon=True).start()
    return guard.wait()


if __name__ == "__main__":
    sys.exit(main())
