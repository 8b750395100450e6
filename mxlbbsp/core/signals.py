"""Contention signals: how much the *other* tenants of a worker's host get in its way.

``cpu_percent`` (psutil, whole host) saturates at 100 % as soon as the cores are
oversubscribed, and the worker's own load is part of it, so it says little about the others.
These signals measure contention from everything else, over one window (a worker's compute
phase: :meth:`Signals.begin` when it starts, :meth:`Signals.read` when it ends):

=================  ==========================================================================
column             meaning (over the window)
=================  ==========================================================================
``others_cpu``     CPU time of everything on the host except this worker's process tree, as a
                   percent of the host's capacity (100 = every core busy with others):
                   host busy time (/proc/stat: user+nice+system+irq+softirq) minus this
                   process's own CPU time (``os.times``, all threads) and its children's
                   (data-loading workers; the list is refreshed every ``CHILDREN_EVERY``
                   snapshots, because listing them costs ~8 ms). The job's other workers and
                   servers on the same host count as "others": telling them apart would need
                   their pids on every worker, and they contend for the same cores anyway.
``ctx_invol``      involuntary context switches per second (the scheduler took the CPU away),
                   as ``psutil.Process().num_ctx_switches()`` gives them (/proc/self/status:
                   on Linux, the main thread's; the Python thread that drives MXNet)
``run_delay``      time this process's threads spent runnable but waiting for a CPU
                   (/proc/self/task/*/schedstat, 2nd field; the thread list refreshed every
                   ``CHILDREN_EVERY`` snapshots), as a share of the window (summed over
                   threads, so it can exceed 1)
``cpu_pressure``   Linux pressure stall information: the growth of /proc/pressure/cpu "some
                   total" (microseconds during which some task waited for a CPU) as a share
                   of the window; NaN where the file does not exist (kernel < 4.20, PSI off)
``steal``          CPU steal time (a hypervisor ran someone else), percent of host CPU time
``runq``           runnable tasks on the host at the end of the window (procs_running of
                   /proc/stat, which counts this worker's running thread too)
=================  ==========================================================================

The tail: ``others_cpu_tail``, ``run_delay_tail`` and ``cpu_pressure_tail`` are the same three
over the window's last ``TAIL`` share only (a background thread takes a snapshot when that
share begins, timed by the previous window's length; where the window ended before it, the
tail is the whole window). They are the freshest look at the other tenants before the next
iteration: a tenant that starts or stops during an iteration moves a whole-window reading
only by the share of the window it was there for, and the tail by nearly all of it. (On the
recorded traces they help NARX only where each worker has its own core:
benchmarks/results/predictors.md.)

Any signal the platform lacks is NaN, never an error (no /proc: everything but ``ctx_invol``).
A worker reads only the columns it is asked for (``Signals(columns=...)``; the launcher's
``--signals``, plus what ``--exog`` needs): each source is read only when a column needs it,
and the sampler thread runs only when a tail column is asked for. Reading one window costs a
few small /proc reads, twice per iteration, and once more in the sampler thread for the tail
(``python benchmarks/signals_cost.py``; results in benchmarks/results/signals_cost.md). The
sampler thread costs more than its reads: on a tiny model (a few ms per iteration) its
wake-up in the middle of the compute phase, and the GIL it takes there, cost a 2-worker job
on 2 cores 15-20 % of its throughput, hence not read by default (benchmarks/README.md).

No MXNet import.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Dict, List, Optional

#: the signals over the window's last TAIL share (see the module docstring)
TAIL_NAMES = ("others_cpu_tail", "run_delay_tail", "cpu_pressure_tail")
#: the signal columns, in the order they travel and are recorded
NAMES = ("others_cpu", "ctx_invol", "run_delay", "cpu_pressure", "steal", "runq") + TAIL_NAMES
#: the tail: this share of a window, at its end
TAIL = 0.25
#: the columns a worker reads unless told otherwise (launcher ``--signals auto``): all but
#: the tail, which needs the sampler thread
AUTO = ("cpu_percent", "mem_percent") + tuple(n for n in NAMES if n not in TAIL_NAMES)
#: which source each column needs
_SOURCES = {"others_cpu": ("host", "own"), "others_cpu_tail": ("host", "own"),
            "steal": ("host",), "runq": ("host",), "ctx_invol": ("ctx",),
            "run_delay": ("delay",), "run_delay_tail": ("delay",),
            "cpu_pressure": ("psi",), "cpu_pressure_tail": ("psi",)}
#: refresh the list of child processes every this many windows
CHILDREN_EVERY = 256
_NAN = float("nan")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _ProcFiles:
    """The /proc files a worker reads at every snapshot, each kept open and read again from
    its start with ``pread`` (a /proc file makes its text anew on every read from offset 0;
    no shared offset, so the tail's sampler thread and the main thread may read at once).
    That spares an open and a close per read: about 30 of them in a worker's iteration, half
    of what the signals cost on a model of a few milliseconds. A process forked from this
    one starts afresh (its /proc/self is another process)."""

    #: a file this long or longer is read the usual way (its text might not fit one pread)
    MOST = 1 << 16

    def __init__(self):
        self._fds: Dict[str, int] = {}

    def forked(self) -> None:
        """In a child just forked: the inherited descriptors are the parent's files (its
        /proc/self), closed here so that this process opens its own."""
        for path in list(self._fds):
            self._drop(path)

    def read(self, path: str) -> Optional[bytes]:
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            data = os.pread(fd, self.MOST, 0)
        except OSError:             # missing, or a thread that ended: open it again next time
            self._drop(path)
            return None
        if len(data) < self.MOST:
            return data
        self._drop(path)
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def forget(self, prefix: str, keep) -> None:
        """Close the files under ``prefix`` other than ``keep`` (the threads that ended
        since the list of threads was last read: their files are not read again)."""
        for path in [p for p in self._fds if p.startswith(prefix) and p not in keep]:
            self._drop(path)

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


_proc_files = _ProcFiles()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_proc_files.forked)


def read_proc(path: str) -> Optional[bytes]:
    """The text of ``path`` (a /proc file read at every iteration), or None where it cannot
    be read."""
    return _proc_files.read(path)


def _host_stat():
    """(busy seconds, total seconds, steal seconds, procs_running) from /proc/stat, or None."""
    data = read_proc("/proc/stat")
    if data is None:
        return None
    busy = total = steal = _NAN
    running = _NAN
    for line in data.split(b"\n"):
        if line.startswith(b"cpu "):
            f = [int(x) for x in line.split()[1:]]
            f += [0] * (8 - len(f))
            # user nice system idle iowait irq softirq steal (guest is inside user)
            busy = (f[0] + f[1] + f[2] + f[5] + f[6]) / _TICK
            steal = f[7] / _TICK
            total = sum(f[:8]) / _TICK
        elif line.startswith(b"procs_running"):
            running = float(line.split()[1])
            break
    return busy, total, steal, running


def _pressure() -> float:
    """/proc/pressure/cpu "some total" in seconds, NaN where missing."""
    data = read_proc("/proc/pressure/cpu")
    if not data:
        return _NAN
    for part in data.split(b"\n", 1)[0].split():
        if part.startswith(b"total="):
            return int(part[6:]) / 1e6
    return _NAN


def _schedstat(tid: str) -> str:
    return f"/proc/self/task/{tid}/schedstat"


def _threads(tids=None):
    """Seconds this process's threads waited runnable for a CPU, summed over the threads
    ``tids`` (default: all; /proc/self/task/<tid>/schedstat, 2nd field, ns); NaN where
    missing."""
    delay, read = 0.0, 0
    if tids is None:
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return _NAN
    for tid in tids:
        data = read_proc(_schedstat(tid))
        if data is None:        # the thread ended meanwhile, or no schedstat here
            continue
        try:
            delay += int(data.split()[1]) / 1e9
        except (IndexError, ValueError):
            return _NAN
        read += 1
    return delay if read else _NAN


class Signals:
    """Reads the contention signals of this process's host over windows. ``begin`` and
    ``read`` are called from one thread; with ``tail`` (and a tail column among ``columns``)
    a daemon thread of this object takes the tail's snapshot (``sample``: tests call it
    themselves with ``tail=False``). ``columns``: the NAMES to read (default: all); ``read``
    returns those only."""

    def __init__(self, tail: bool = True, columns=None):
        self.columns = tuple(n for n in NAMES if columns is None or n in columns)
        self._needs = {source for n in self.columns for source in _SOURCES[n]}
        self._cpus = os.cpu_count() or 1
        self._snapshots = 0
        self._children: List = []
        self._tids: Optional[List[str]] = None
        self._start: Optional[dict] = None
        self._lock = threading.Condition()   # guards the snapshots and the fields below
        self._mid: Optional[dict] = None     # the tail's snapshot of the current window
        self._due: Optional[float] = None    # when the sampler takes it (monotonic)
        self._length: Optional[float] = None  # the last window's length
        #: the last read's tail in seconds (0: its window ended before the tail began)
        self.tail_s = 0.0
        try:
            import psutil
            self._proc = psutil.Process()
        except Exception:  # noqa: BLE001 - psutil missing or broken: those columns are NaN
            self._proc = None
        self._tail = any(n in TAIL_NAMES for n in self.columns)
        if tail and self._tail:
            threading.Thread(target=self._sampler, name="mxlbbsp-signals",
                             daemon=True).start()

    def _sampler(self) -> None:
        """Take the tail's snapshot when it is due, for ever (a daemon thread)."""
        with self._lock:
            while True:
                due = self._due
                if due is None:
                    self._lock.wait()
                    continue
                delay = due - time.monotonic()
                if delay > 0:
                    self._lock.wait(delay)          # begin/read may move or cancel it
                    continue
                self._due = None
                self._mid = self._snapshot()

    def sample(self) -> None:
        """Take the tail's snapshot of the current window now."""
        with self._lock:
            self._due = None
            self._mid = self._snapshot()

    def _own_cpu(self) -> float:
        """CPU seconds of this process (all threads) and its live children."""
        t = os.times()
        own = t.user + t.system
        if self._proc is None:
            return own
        if self._snapshots % CHILDREN_EVERY == 0:
            try:
                self._children = self._proc.children(recursive=True)
            except Exception:  # noqa: BLE001 - psutil.Error: keep the old list
                pass
        for child in self._children:
            try:
                c = child.cpu_times()
                own += c.user + c.system
            except Exception:  # noqa: BLE001 - the child exited: psutil.NoSuchProcess
                pass
        return own

    def _ctx(self) -> float:
        """This process's involuntary context switches: the line psutil's
        ``num_ctx_switches`` reads from /proc/self/status, read here without opening it."""
        data = read_proc("/proc/self/status")
        if data is not None:
            at = data.find(b"nonvoluntary_ctxt_switches:")
            if at >= 0:
                try:
                    return float(data[at + 27:].split(None, 1)[0])
                except (IndexError, ValueError):
                    pass
        if self._proc is None:
            return _NAN
        try:
            return float(self._proc.num_ctx_switches().involuntary)
        except Exception:  # noqa: BLE001 - psutil.Error
            return _NAN

    def _snapshot(self) -> dict:
        """The sources the columns need, now (the others NaN)."""
        needs = self._needs
        if "delay" in needs and self._snapshots % CHILDREN_EVERY == 0:
            try:                                     # threads come and go rarely
                self._tids = os.listdir("/proc/self/task")
            except OSError:
                self._tids = None
            _proc_files.forget("/proc/self/task/", {_schedstat(t) for t in self._tids or ()})
        host = _host_stat() if "host" in needs else None
        snap = {"wall": time.monotonic(),
                "own": self._own_cpu() if "own" in needs else _NAN,
                "ctx": self._ctx() if "ctx" in needs else _NAN,
                "delay": _threads(self._tids) if "delay" in needs else _NAN,
                "psi": _pressure() if "psi" in needs else _NAN}
        self._snapshots += 1
        if host is None:
            snap.update(busy=_NAN, total=_NAN, steal=_NAN, running=_NAN)
        else:
            snap.update(busy=host[0], total=host[1], steal=host[2], running=host[3])
        return snap

    def begin(self) -> None:
        """Start a window (e.g. at the start of the compute phase)."""
        with self._lock:
            self._start = self._snapshot()
            self._arm()

    def _arm(self) -> None:
        """Schedule the tail's snapshot of the window that starts now (lock held)."""
        self._mid = None
        self._due = None if self._length is None or not self._tail else \
            self._start["wall"] + (1.0 - TAIL) * self._length
        self._lock.notify()

    def read(self) -> Dict[str, float]:
        """The signals over the window since :meth:`begin` (or the previous read), and start
        the next window. The first read without a begin gives NaN everywhere."""
        with self._lock:
            end = self._snapshot()
            start, mid, self._start = self._start, self._mid, end
            if start is not None:
                self._length = end["wall"] - start["wall"]
            self._arm()
        if start is None:
            return {name: _NAN for name in self.columns}
        out = dict.fromkeys(NAMES, _NAN)
        self._over(start, end, out, "")
        self.tail_s = 0.0
        if mid is not None and start["wall"] < mid["wall"] < end["wall"]:
            self.tail_s = end["wall"] - mid["wall"]
            self._over(mid, end, out, "_tail")
        else:                                   # the window ended before its tail began
            for name in TAIL_NAMES:
                out[name] = out[name[:-5]]
        total = end["total"] - start["total"]
        out["runq"] = end["running"]
        if total > 0:
            out["steal"] = 100.0 * (end["steal"] - start["steal"]) / total
        return {k: (out[k] if isinstance(out[k], float) and math.isfinite(out[k]) else _NAN)
                for k in self.columns}

    def _over(self, start: dict, end: dict, out: dict, suffix: str) -> None:
        """others_cpu, run_delay, cpu_pressure (+ suffix) and ctx_invol (no suffix only)
        between two snapshots, into ``out``."""
        wall = end["wall"] - start["wall"]
        if not wall > 0:
            return
        others = (end["busy"] - start["busy"]) - (end["own"] - start["own"])
        # /proc/stat ticks are 10 ms: short windows are coarse (seen: 115 over a ~20 ms
        # window on a busy host); within [0, 100], NaN stays NaN
        cpu = 100.0 * others / (wall * self._cpus)
        out["others_cpu" + suffix] = 0.0 if cpu < 0 else 100.0 if cpu > 100 else cpu
        out["run_delay" + suffix] = (end["delay"] - start["delay"]) / wall
        out["cpu_pressure" + suffix] = (end["psi"] - start["psi"]) / wall
        if not suffix:
            out["ctx_invol"] = (end["ctx"] - start["ctx"]) / wall


#: every exogenous column a worker reports: psutil's host load, then the signals above
COLUMNS = ("cpu_percent", "mem_percent") + NAMES
#: the predictor's inputs unless --exog says otherwise (see benchmarks/results/predictors.md)
DEFAULT = ("others_cpu", "run_delay", "cpu_pressure")


def _column_list(option: str, spec: str, available) -> tuple:
    """The names of a comma-separated ``spec``; ValueError (one line) for one not in
    ``available``."""
    names = tuple(p.strip() for p in spec.split(","))
    for name in names:
        if name not in available:
            raise ValueError(f"{option}: unknown column {name!r}; choose from "
                             f"{', '.join(available)} (or auto, all, none)")
    return names


def parse_exog(spec: str, available=COLUMNS) -> tuple:
    """``--exog``: "auto" (the default inputs among ``available``, else all of them), "all"
    (every available column), "none", or a comma-separated list of column names.

    Raises ValueError with a one-line message for an unknown or repeated name.
    """
    spec = (spec or "auto").strip()
    available = tuple(available)
    if spec == "all":
        return available
    if spec == "none":
        return ()
    if spec == "auto":
        chosen = tuple(c for c in DEFAULT if c in available)
        return chosen or available
    names = _column_list("--exog", spec, available)
    if len(set(names)) != len(names):
        raise ValueError(f"--exog {spec!r}: a column appears twice")
    return names


def parse_signals(spec: str, exog=()) -> tuple:
    """``--signals``: the columns every worker reads and reports, besides the predictor's
    inputs ``exog`` (always read): "auto" (AUTO: all but the tail), "all", "none", or a
    comma-separated list of COLUMNS. Returns them in COLUMNS order. Raises ValueError with a
    one-line message for an unknown name."""
    spec = (spec or "auto").strip()
    if spec == "auto":
        chosen = AUTO
    elif spec == "all":
        chosen = COLUMNS
    elif spec == "none":
        chosen = ()
    else:
        chosen = _column_list("--signals", spec, COLUMNS)
    wanted = set(chosen) | set(exog)
    return tuple(c for c in COLUMNS if c in wanted)
