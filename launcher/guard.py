"""The middleman between the launcher and every process of a job: ``python -m mxlbbsp.launcher.guard``.

The launcher starts each role (scheduler, server, worker) through a guard, locally or at the
end of an SSH session, and writes one JSON line to the guard's standard input::

    {"argv": [...], "env": {...}, "cwd": "/launch/dir", "grace": 3.0}

Its first line on stdout is ``mxlbbsp guard: started`` (the launcher knows from it that the
transport is connected). It runs ``argv`` in ``cwd`` with ``env`` added to its environment,
in a new session (its own process group), and passes its output straight through. The spec
travels on stdin, so no variable (the job's token among them) appears on a command line that
``ps`` shows.

The guard then keeps reading stdin. When stdin closes (the launcher exited or died, or the
SSH connection dropped) or a ``stop`` line arrives, or the guard itself gets SIGTERM, SIGINT or
SIGHUP, or, with ``"silence": S`` in the spec, nothing arrives on stdin for S seconds (the
launcher sends an empty line now and then: a partitioned network closes nothing on the remote
side), it stops the whole process group: SIGTERM (SIGUSR2 with ``"preemptible": true``,
below), ``grace`` seconds, then SIGKILL. When the
command ends by itself, whatever it left behind in its group is killed too. The guard exits
with the command's exit code (128 + N for a signal N, like a shell), after a last line
``mxlbbsp guard: exit N`` on stdout (the launcher does not show it), and before it, when a
signal N ended the command, ``mxlbbsp guard: signal N`` (so that the launcher can name it).

Unless the environment sets ``OMP_NUM_THREADS``, a spec with ``MXLBBSP_SHARE_CORES=k`` in its
``env`` (the launcher's: k processes of the job on this host) gets ``OMP_NUM_THREADS`` = this
host's cores // k, so that each host divides its own cores, not the launch machine's.

``python -m mxlbbsp.launcher.guard --check FOLDER`` is the launcher's SSH pre-flight: it
succeeds when this host has mxlbbsp (the guard) and the launch folder.

With ``"sockets": [PATH, ...]`` in the spec (a relay's), the guard removes those Unix sockets
once the command has ended, however it ended.

With ``"boot": true`` in the spec (the launcher's workers), the guard puts its folder
``_boot`` first on ``PYTHONPATH``: its ``sitecustomize`` makes a Python worker that ends with an
uncaught exception or a non-zero ``SystemExit`` exit at once instead of hanging in ps-lite's
finalize barrier (see ``_boot/sitecustomize.py``).

With ``"cpu_every": S`` in the spec (the launcher's remote workers), the guard writes a line
``mxlbbsp guard: cpu SECONDS`` on stdout every S seconds: the CPU time used so far by the
command and its descendants (Linux ``/proc``; no line where there is none). The launcher does not
show these lines; they let it see over SSH what it measures locally: a job whose workers all
sit idle (e.g. in ps-lite's finalize barrier) hangs. With ``cpu_every``, the guard also writes
``mxlbbsp guard: stopped`` when the command is stopped (SIGSTOP, a debugger: state ``T`` or
``t`` in ``/proc/PID/stat``, looked at every STATE_EVERY s) and ``mxlbbsp guard: continued``
when it runs again: the launcher names a stopped remote worker as it names a local one.

With ``"preemptible": true`` (the roles of an elastic job) SIGTERM is a preemption notice,
as a cloud or SLURM sends it to a host's processes before taking the host away: the guard
writes ``mxlbbsp guard: preempted`` on stdout and keeps the command running (the launcher
resizes the job around this host at an iteration boundary, then closes stdin; after
``preempt_grace`` seconds, 60 by default, the guard stops the command anyway), and the
command gets ``MXLBBSP_PREEMPTIBLE=1``, with which mxlbbsp's workers, servers and relays
take their own SIGTERM as a notice too. So the guard ends the command with SIGUSR2.

The command gets a parent-death signal (Linux ``PR_SET_PDEATHSIG``, SIGKILL): if the guard
itself is killed (``kill -9``), its role dies with it, locally and over SSH.

Only the standard library is imported here: the guard starts in milliseconds. (Long for
what it does, half of it this description: one small program that runs on every host.)
"""
import ctypes
import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Optional

#: the guard's exit code when it refuses to start the command (not found, not executable,
#: python's script missing): bad input, as everywhere in mxlbbsp
BAD_COMMAND = 2
#: python's command-line options that take a value (the script comes after them)
_PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")
STDIN = 0
#: the guard's first line on stdout: it runs, so the transport (e.g. ssh) is connected
STARTED = "mxlbbsp guard: started"
#: the guard's last line on stdout, with the command's exit code: over SSH it tells a command
#: that exited 255 from ssh's own 255 (connection lost)
EXITED = "mxlbbsp guard: exit"
#: the guard's line before its last when a signal ended the command: the signal's number
SIGNALLED = "mxlbbsp guard: signal"
#: the guard's periodic line (spec ``cpu_every``): the command's CPU seconds so far
CPU = "mxlbbsp guard: cpu"
#: the guard's lines (spec ``cpu_every``) when the command was stopped, and runs again
STOPPED = "mxlbbsp guard: stopped"
CONTINUED = "mxlbbsp guard: continued"
#: how often the guard looks whether its command is stopped (spec ``cpu_every``)
STATE_EVERY = 0.25
#: the guard's line (spec ``preemptible``) when it got SIGTERM: a preemption notice
PREEMPTED = "mxlbbsp guard: preempted"
#: (spec ``preemptible``) the command's variable that makes SIGTERM a notice, not an end
PREEMPTIBLE = "MXLBBSP_PREEMPTIBLE"
#: (spec ``preemptible``) how long after its own SIGTERM the guard keeps the command
#: running, waiting for the launcher to resize the job around this host; then it stops it
PREEMPT_GRACE = 60.0
#: k processes of the job on this host: unless OMP_NUM_THREADS is set, each gets this host's
#: cores // k threads
SHARE_CORES = "MXLBBSP_SHARE_CORES"
#: the folder whose sitecustomize.py is the workers' exit hook
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int):
    """A preexec_fn: the child gets SIGKILL when the guard (``parent``) dies. None where
    there is no prctl (not Linux): the stdin watch is all there is."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up before the fork
    except (OSError, AttributeError):
        return None

    def preexec():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:         # the guard died before prctl took effect
            os._exit(137)
    return preexec


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    return _killpg(pgid, 0)


def _cores() -> int:
    """The cores this process may run on (its affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _stat_cpu(pid) -> Optional[int]:
    """utime + stime + cutime + cstime of process ``pid`` in clock ticks (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
    except OSError:
        return None
    # after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    return sum(int(f) for f in fields[11:15]) if len(fields) > 14 else None


def is_stopped(pid) -> Optional[bool]:
    """Whether process ``pid`` is stopped (state T, or t: by a debugger); None: not known
    (gone, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0] in (b"T", b"t") if fields else None


def tree_cpu_seconds(pid: int) -> Optional[float]:
    """CPU seconds (user + system, with the reaped children's) of process ``pid`` and its
    live descendants, walked through ``/proc/PID/task/TID/children``: a few small reads per
    process of the tree, however many processes the host runs. None where there is no such
    file (no ``/proc``, or a kernel without CONFIG_PROC_CHILDREN) or ``pid`` is gone."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return None
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        ticks = _stat_cpu(p)
        if ticks is None:
            if p == pid:
                return None
            continue                             # ended meanwhile
        total += ticks
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children", "rb") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except FileNotFoundError:
                if p == pid and tid == str(pid):
                    return None                  # no children files on this kernel
            except OSError:
                continue
    return total / tick


def python_script(argv) -> Optional[str]:
    """The script of a ``python [OPTIONS] SCRIPT ...`` command; None for another command, for
    ``python -m``/``-c``, or for python reading its standard input."""
    if not re.fullmatch(r"python[0-9.]*", os.path.basename(argv[0])):
        return None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-" or (arg.startswith(("-m", "-c")) and not arg.startswith("--")):
            return None
        if arg in _PYTHON_VALUE_OPTIONS:
            next(args, None)
        elif arg == "--":
            return next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def command_problem(argv, cwd: str, path: Optional[str] = None) -> Optional[str]:
    """Why ``argv`` cannot run in ``cwd`` (``path``: the PATH it runs with), in a few words
    that say what to do; None when it can. The launcher asks before it starts a local job,
    the guard before it starts the command (over SSH: on the command's host)."""
    prog = argv[0]
    if os.sep in prog:
        full = os.path.join(cwd, prog)
        if os.path.isdir(full):
            return f"{prog!r} is a folder, not a command"
        if not os.path.isfile(full):
            return f"command not found: {prog!r}"
        if not os.access(full, os.X_OK):
            runner = "python" if prog.endswith(".py") else "sh"
            return (f"permission denied: {prog!r} is not executable; make it executable "
                    f"(chmod +x {prog}) or run it with {runner}, e.g. -- {runner} {prog}")
    elif shutil.which(prog, path=path) is None:
        return f"command not found: {prog!r} is not on PATH"
    script = python_script(argv)
    if script is not None and not os.path.exists(os.path.join(cwd, script)):
        return f"{prog}: can't open file {script!r}: no such file"
    return None


class Guard:
    def __init__(self, spec: dict):
        self.spec = spec
        self.grace = float(spec.get("grace", 3.0))
        #: an elastic job's role: SIGTERM is a preemption notice (for the guard and for the
        #: command), and the guard ends the command with SIGUSR2, which no hook catches
        self.preemptible = bool(spec.get("preemptible"))
        self.end_signal = signal.SIGUSR2 if self.preemptible else signal.SIGTERM
        self.child = None
        self._stopping = threading.Event()
        self._preempted = False

    def start(self) -> None:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (self.spec.get("env") or {}).items()})
        share = env.get(SHARE_CORES, "")
        if "OMP_NUM_THREADS" not in env and share.isdigit() and int(share) > 0:
            env["OMP_NUM_THREADS"] = str(max(1, _cores() // int(share)))
        if self.preemptible:
            env[PREEMPTIBLE] = "1"
        if self.spec.get("boot"):
            env["PYTHONPATH"] = os.pathsep.join(
                [BOOT_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        cwd = self.spec.get("cwd") or None
        # stdin is the launcher's line to this guard: the command must not read it
        self.child = subprocess.Popen(self.spec["argv"], env=env, cwd=cwd,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=_die_with_parent(os.getpid()))

    def stop(self) -> None:
        """Stop the command's whole process group (idempotent; returns at once)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        threading.Thread(target=self._terminate, daemon=True).start()

    def preempted(self) -> None:
        """SIGTERM to a preemptible role's guard: say so once on stdout (the launcher
        resizes the job around this host, then closes stdin), and stop the command after
        ``preempt_grace`` seconds if that never comes."""
        if self._preempted or self._stopping.is_set():
            return
        self._preempted = True
        try:
            os.write(1, f"{PREEMPTED}\n".encode())
        except OSError:
            pass
        timer = threading.Timer(float(self.spec.get("preempt_grace", PREEMPT_GRACE)), self.stop)
        timer.daemon = True
        timer.start()

    def _terminate(self) -> None:
        pgid = self.child.pid
        _killpg(pgid, self.end_signal)
        _killpg(pgid, signal.SIGCONT)   # a stopped process sees its SIGTERM only once resumed
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.05)
        _killpg(pgid, signal.SIGKILL)

    def watch_stdin(self, pending: bytes = b"") -> None:
        """Stop the command when stdin closes or says ``stop``, or, when the spec gives
        ``silence``, when nothing (not even the launcher's empty heartbeat lines) arrives for
        that many seconds: a network partition closes no SSH session on this side."""
        silence = self.spec.get("silence")
        while True:
            *lines, pending = pending.split(b"\n")
            if any(line.strip() == b"stop" for line in lines):
                break
            ready, _, _ = select.select([STDIN], [], [], silence)
            if not ready:
                sys.stderr.write(f"mxlbbsp guard: no word from the launcher for {silence:g} s "
                                 f"(connection lost?); stopping\n")
                break
            chunk = os.read(STDIN, 4096)
            if not chunk:
                break
            pending += chunk
        self.stop()

    def report_cpu(self, every: float) -> None:
        """Every ``every`` s, the command's CPU seconds on stdout (see the docstring)."""
        while not self._stopping.wait(every) and self.child.poll() is None:
            seconds = tree_cpu_seconds(self.child.pid)
            if seconds is None:
                return
            try:
                os.write(1, f"{CPU} {seconds:.2f}\n".encode())
            except OSError:
                return                                # nobody listens any more

    def report_state(self, every: float) -> None:
        """A line on stdout each time the command is stopped or runs again (see the
        docstring)."""
        stopped = False
        while not self._stopping.wait(every) and self.child.poll() is None:
            now = is_stopped(self.child.pid)
            if now is None:
                return
            if now != stopped:
                stopped = now
                try:
                    os.write(1, f"{STOPPED if now else CONTINUED}\n".encode())
                except OSError:
                    return                            # nobody listens any more

    def wait(self) -> int:
        rc = self.child.wait()
        # Leftovers of the command (e.g. data-loading processes) die with it.
        _killpg(self.child.pid, signal.SIGKILL)
        remove_sockets(self.spec.get("sockets") or ())
        return rc if rc >= 0 else 128 - rc


def remove_sockets(paths) -> None:
    """Remove the Unix sockets a command left (a relay killed before it could): only
    sockets, never another kind of file."""
    for path in paths:
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except (OSError, TypeError):
            pass


def check(folder: str) -> int:
    """Pre-flight (``guard --check FOLDER``): 0 when this host can run a role in ``folder``."""
    if not os.path.isdir(folder):
        sys.stderr.write(f"no folder {folder} on {os.uname().nodename}: the launch folder "
                         "must exist on every host (e.g. a shared file system)\n")
        return 3
    return 0


def _read_line(fd: int):
    """The first line on ``fd`` and what was read after it (stdin is read unbuffered, so
    that ``select`` sees everything that follows)."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def main() -> int:
    if sys.argv[1:2] == ["--check"] and len(sys.argv) == 3:
        return check(sys.argv[2])
    os.write(1, (STARTED + "\n").encode())
    line, pending = _read_line(STDIN)
    if not line.strip():
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
    if guard.preemptible:
        signal.signal(signal.SIGTERM, lambda *_: guard.preempted())
    cwd = spec.get("cwd") or os.getcwd()
    here = f"on {os.uname().nodename}, in {cwd}"
    if not os.path.isdir(cwd):
        sys.stderr.write(f"mxlbbsp: error: no folder {cwd} on {os.uname().nodename}\n")
        return 126
    path = (spec.get("env") or {}).get("PATH", os.environ.get("PATH"))
    problem = command_problem(argv, cwd, path)
    if problem:
        sys.stderr.write(f"mxlbbsp: error: {problem} ({here})\n")
        return BAD_COMMAND
    try:
        guard.start()
    except OSError as exc:
        sys.stderr.write(f"mxlbbsp: error: cannot run {argv[0]!r}: {exc.strerror or exc} "
                         f"({here})\n")
        return 126
    threading.Thread(target=guard.watch_stdin, args=(pending,), daemon=True).start()
    if spec.get("cpu_every"):
        threading.Thread(target=guard.report_cpu, args=(float(spec["cpu_every"]),),
                         daemon=True).start()
        threading.Thread(target=guard.report_state, args=(STATE_EVERY,), daemon=True).start()
    rc = guard.wait()
    try:
        if guard.child.returncode < 0:
            os.write(1, f"{SIGNALLED} {-guard.child.returncode}\n".encode())
        os.write(1, f"{EXITED} {rc}\n".encode())
    except OSError:
        pass                                      # nobody listens any more
    return rc


if __name__ == "__main__":
    sys.exit(main())
