"""An elastic job: a sequence of jobs of fixed membership, joined where hosts come and go
without losing a finished iteration.

ps-lite fixes a job's workers when it starts, so a change of hosts means new processes. What
makes it cheap and exact is LB-BSP itself: the global batch B does not depend on the number
of workers (nobody's learning rate changes), every worker holds the whole job's parameters
and optimizer state (any one of them can save it), the data order depends only on (seed,
epoch, iteration) (the next sample is known on any number of workers), and a checkpoint
resumes exactly onto any n, the balancer giving a new host its share at once.

So a resize is: one worker (rank 0; after a failure, the lowest surviving rank) is asked for
its state (``Coordinator.request_snapshot``); it waits until it is not inside an update,
halts before its next push (so no worker can finish another iteration: each needs its
push), and saves the state of its last finished iteration k into ``--checkpoint-dir``
(``mxlbbsp.worker.trainer``); the coordinator saves its own state of k beside it. Then every
process is stopped and the job starts again on the new hosts from k+1. A graceful resize (a
host joined or left the discovery script's list, or a host was given notice: SIGTERM to its
processes) loses nothing; a failure (a worker killed, a host lost) loses at most the
iteration in flight, whatever the periodic checkpoint interval.

:class:`Membership` says which hosts the job may use now: the discovery script's (polled in
a thread of its own, :mod:`.discovery`), or inside a SLURM allocation its nodes that pass
the pre-flight, less the hosts given notice.
"""
from __future__ import annotations

import threading
from typing import Callable, List, NamedTuple, Optional

from .discovery import Discovery, DiscoveryFailed, cap, describe_change
from .hostfile import Host


def slots(hosts) -> int:
    return sum(h.slots for h in hosts)


class Change(NamedTuple):
    """A new set of hosts for the job, and why, in a few words."""

    hosts: List[Host]
    why: str


class Membership:
    """The hosts an elastic job may use now (module docstring).

    ``poll``: one look at the hosts (the discovery script's :meth:`Discovery.poll`, or the
    SLURM allocation's nodes that pass the pre-flight), returning (hosts, problem);
    ``say``: one line for the user. The first look is :meth:`first`; then a thread looks
    every ``interval`` seconds (:meth:`start`), and :meth:`hosts` is the latest answer less
    the hosts given notice (:meth:`preempted`)."""

    def __init__(self, poll: Callable[[], tuple], interval: float, max_workers: Optional[int],
                 say: Callable[[str], None]):
        self._poll = poll
        self.interval = float(interval)
        self.max_workers = max_workers
        self._say = say
        self._lock = threading.Lock()
        self._latest: List[Host] = []
        self._notice: set = set()            # host names given notice, while still listed
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.failed: Optional[str] = None    # the discovery script kept failing: the end
        self._last_problem: Optional[str] = None

    @classmethod
    def from_script(cls, script: str, interval: float, max_workers: Optional[int],
                    say: Callable[[str], None]) -> "Membership":
        discovery = Discovery([script], max_workers)

        def poll():
            found = discovery.poll()
            return found.hosts, found.problem
        return cls(poll, interval, max_workers, say)

    def first(self) -> List[Host]:
        """The hosts at the start (DiscoveryFailed propagates)."""
        self._look()
        return self.hosts()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mxlbbsp-discovery",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._look()
            except DiscoveryFailed as exc:
                self.failed = str(exc)
                return

    def _look(self) -> None:
        hosts, problem = self._poll()
        if problem is not None and problem != self._last_problem:
            self._say(f"warning: {problem}; keeping the hosts it listed before")
        self._last_problem = problem
        with self._lock:
            self._latest = list(hosts)
            names = {h.name for h in hosts}
            self._notice &= names            # a host gone and back is welcome again

    def preempted(self, name: str) -> None:
        """Host ``name`` was given notice: the job leaves it, until it drops out of the
        list and comes back."""
        with self._lock:
            self._notice.add(name)

    def hosts(self) -> List[Host]:
        with self._lock:
            usable = [h for h in self._latest if h.name not in self._notice]
        return cap(usable, self.max_workers)

    def change(self, current: List[Host]) -> Optional[Change]:
        """The hosts to resize to, when they differ from ``current``; None when not."""
        now = self.hosts()
        if _key(now) == _key(current):
            return None
        with self._lock:
            notice = set(self._notice)
        why = describe_change(current, now)
        for name in notice:
            why = why.replace(f"host {name} left", f"host {name} was given notice")
        return Change(now, why)


def _key(hosts) -> list:
    return sorted((h.name, h.user, h.port, h.slots) for h in hosts)
