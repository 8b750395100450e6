"""Host discovery for an elastic job: which hosts the job may use now.

``--host-discovery-script PATH`` is Horovod's contract: an executable that prints the
usable hosts, one per line, ``host`` or ``host:slots`` (``user@host`` and ``[v6]:slots``
as in ``-H``), and exits 0. The launcher runs it every ``--discovery-interval`` seconds;
when the set of hosts changes, the job is resized to it (:mod:`.elastic`).

What goes wrong is said in one line and the job goes on with the hosts it has: a script
that exits non-zero, hangs past ``SCRIPT_TIMEOUT_S``, prints a line that is not a host, or
prints no host. Only a script that fails ``FAILURES_TO_END`` times in a row ends the job
(exit 2), since a job that can never learn its hosts can never be resized. More slots than
``--max-workers`` are fine: the job takes the first ones, in the script's order, and says
so once.

Pure of the job: a :class:`Discovery` runs a command and reads its output; the caller
decides what a change means.
"""
from __future__ import annotations

import logging
import os
import subprocess
from typing import Callable, List, NamedTuple, Optional, Sequence

from .errors import ConfigError
from .hostfile import Host, parse_host_list

log = logging.getLogger(__name__)

#: a run of the script that takes longer is a failure (its process group is killed)
SCRIPT_TIMEOUT_S = 10.0
#: this many failed runs in a row end the job (exit 2)
FAILURES_TO_END = 5
#: the most a script's output is read (a host per line: far more than any cluster's)
MAX_OUTPUT = 1 << 20


class DiscoveryFailed(RuntimeError):
    """The discovery script failed ``FAILURES_TO_END`` times in a row: the job ends (exit 2)."""


class Found(NamedTuple):
    """One run's hosts, or why there are none (``problem``)."""

    hosts: List[Host]
    problem: Optional[str] = None


def parse_output(text: str, source: str) -> List[Host]:
    """The hosts a discovery script printed (ConfigError naming the line if one is not a
    host); blank lines and ``#`` comments are skipped; a host listed twice is one host with
    the larger slot count."""
    hosts: List[Host] = []
    where = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            (host,) = parse_host_list(line)
        except (ConfigError, ValueError):
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise ConfigError(f"{source} line {number}: {shown!r} is not host or "
                              "host:slots") from None
        key = (host.user, host.name)
        if key in where:
            i = where[key]
            if host.slots > hosts[i].slots:
                hosts[i] = host
            continue
        where[key] = len(hosts)
        hosts.append(host)
    return hosts


def cap(hosts: Sequence[Host], most: Optional[int]) -> List[Host]:
    """The first hosts, in order, with at most ``most`` slots in all (the last one cut)."""
    if most is None:
        return list(hosts)
    out, left = [], most
    for h in hosts:
        if left <= 0:
            break
        take = min(h.slots, left)
        out.append(h if take == h.slots else Host(h.name, h.user, h.port, take))
        left -= take
    return out


class Discovery:
    """Runs the discovery command and keeps the last good answer.

    ``run`` (a hook for tests): how a command is run, returning (exit code, stdout,
    stderr); by default a subprocess in its own session, killed with its group on a
    timeout."""

    def __init__(self, command: Sequence[str], max_workers: Optional[int] = None,
                 run: Optional[Callable[[Sequence[str]], tuple]] = None):
        self.command = list(command)
        self.max_workers = max_workers
        self._run = run or _run
        self.failures = 0                  # failed runs in a row
        self.last: Optional[List[Host]] = None
        self._said_cap = False

    @property
    def source(self) -> str:
        return f"--host-discovery-script {os.path.basename(self.command[0])}"

    def poll(self) -> Found:
        """Run the script once: its hosts (capped at ``max_workers`` slots), or the last
        good ones with the problem of this run. Raises DiscoveryFailed after
        ``FAILURES_TO_END`` failures in a row."""
        problem = None
        try:
            code, out, err = self._run(self.command)
        except subprocess.TimeoutExpired:
            problem = f"{self.source} did not finish within {SCRIPT_TIMEOUT_S:g} s"
        except OSError as exc:
            problem = f"{self.source} could not run ({exc.strerror or exc})"
        else:
            if code != 0:
                said = (err or "").strip().splitlines()
                problem = (f"{self.source} exited with code {code}"
                           + (f": {said[-1][:200]}" if said else ""))
            else:
                try:
                    hosts = parse_output(out, self.source)
                except ConfigError as exc:
                    problem = str(exc)
                else:
                    if not hosts:
                        problem = f"{self.source} printed no host"
        if problem is not None:
            self.failures += 1
            if self.failures >= FAILURES_TO_END:
                raise DiscoveryFailed(f"{problem}, {self.failures} times in a row; fix the "
                                      "script (it must print host or host:slots lines and "
                                      "exit 0)")
            return Found(list(self.last or []), problem)
        self.failures = 0
        slots = sum(h.slots for h in hosts)
        if self.max_workers is not None and slots > self.max_workers:
            if not self._said_cap:
                log.warning("%s lists %d slots, more than --max-workers %d: the job uses the "
                            "first %d", self.source, slots, self.max_workers, self.max_workers)
                self._said_cap = True
            hosts = cap(hosts, self.max_workers)
        self.last = hosts
        return Found(hosts)


def _run(command: Sequence[str]) -> tuple:
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        proc.communicate()
        raise
    return proc.returncode, out[:MAX_OUTPUT], err[-4096:]


def describe_change(old: Sequence[Host], new: Sequence[Host]) -> str:
    """What changed between two host lists, in a few words: 'host n3 joined', 'host n2
    left', 'host n1 has 4 slots (was 2)'."""
    before = {h.name: h.slots for h in old}
    after = {h.name: h.slots for h in new}
    parts = [f"host {n} joined" for n in after if n not in before]
    parts += [f"host {n} left" for n in before if n not in after]
    parts += [f"host {n} has {after[n]} slot(s) (was {before[n]})" for n in after
              if n in before and after[n] != before[n]]
    return ", ".join(parts) or "no change"
