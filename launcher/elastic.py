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

import dataclasses
import logging
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional

from .discovery import Discovery, DiscoveryFailed, cap, describe_change
from .hostfile import Host

log = logging.getLogger(__name__)


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
        if problem is not None:
            return                           # the last good answer stands
        with self._lock:
            self._latest = list(hosts)
            names = {h.name for h in hosts}
            self._notice &= names            # a host gone and back is welcome again

    def preempted(self, name: str) -> None:
        """Host ``name`` was given notice (or failed the pre-flight when it joined): the job
        leaves it, until it drops out of the list and comes back."""
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


# ---- the job's side: watching a running generation, and the loop of generations ------------

#: the supervision's exit codes that mean "resized: start the next generation", and "fewer
#: hosts than --min-workers: the state is saved, the job ends" (exit 1, said once)
EXIT_RESIZE = -1
EXIT_BELOW = -2
#: how long a graceful resize may wait for its boundary (after that, the newest checkpoint);
#: also at least this many iteration times
BOUNDARY_WAIT_S = 120.0
BOUNDARY_ITERATIONS = 20
#: how long a survivor may take to save its state after a failure
SNAPSHOT_WAIT_S = 60.0
#: after the worker's saved state, how long the coordinator's own may take (its last dones)
STATE_WAIT_S = 5.0
#: failures an elastic job recovers from when --restarts does not say
FAILURES = 5
#: how long the next generation may take to start ahead (its workers all at the hold)
#: before it is given up and the resize starts it after the boundary instead
PRESTART_WAIT_S = 60.0


class Note(NamedTuple):
    """What the next generation says at its first iteration: 'resized 2 -> 3 workers at
    iteration 120 in 6.1 s (host n3 joined), 0 iterations lost'."""

    verb: str             # resized, restarted
    before: int
    after: int
    iteration: int        # the first iteration of the new generation
    why: str
    since: float          # time.monotonic() when the old generation's state was saved
    lost: int


class Watcher:
    """The elastic part of one generation's supervision (``Supervisor`` calls
    :meth:`check` every turn, and :meth:`recover` on a failure)."""

    def __init__(self, job, membership: Membership, min_workers: int):
        self.job = job
        self.membership = membership
        self.min_workers = min_workers
        self.resize: Optional[Change] = None
        self.below: Optional[str] = None       # the line that ends the job after saving
        self._asked_at: Optional[float] = None
        #: builds the next generation's job for a change of hosts (None: no start ahead);
        #: the job started ahead, the thread starting it, and its failure
        self.prepare: Optional[Callable[[List[Host]], object]] = None
        self.next = None
        self._starting: Optional[threading.Thread] = None
        self._start_error: Optional[str] = None
        self._prepared_at = 0.0
        self._held = 0
        self._failed_hosts: Dict[str, str] = {}
        self._given_up = threading.Event()
        self._saved_at: Optional[float] = None
        self._noticed: set = set()
        self.saved_iteration: Optional[int] = None
        self.saved_since: Optional[float] = None

    def _notices(self) -> None:
        for p in self.job.roles.all:
            if p.said.preempted_at is not None and p.host not in self._noticed:
                self._noticed.add(p.host)
                self.membership.preempted(p.host)
                self.job.output.say(f"host {p.host} was given notice (SIGTERM): the job "
                                    "leaves it at the next iteration boundary")

    def check(self, now: float, iteration_s: float) -> Optional[int]:
        """EXIT_RESIZE once a change of hosts has been saved at a boundary, 2 when the
        discovery script keeps failing, 1 (after its line) below --min-workers, else None.
        ``iteration_s``: the job's recent iteration time (how long a boundary may take)."""
        wait_limit = max(BOUNDARY_WAIT_S, BOUNDARY_ITERATIONS * iteration_s)
        coord = self.job.coordinator
        if self.membership.failed:
            self.job.output.say(f"error: {self.membership.failed}")
            return 2
        self._notices()
        if self.resize is None:
            if coord.progress().iteration < self.job.first_iteration:
                return None                 # nobody listens for a request before a step
            change = self.membership.change(self.job.hosts)
            if change is None:
                return None
            self.resize = change
            left = slots(change.hosts)
            if left < self.min_workers:
                self.below = (f"{left} worker slot(s) left ({change.why}), fewer than "
                              f"--min-workers {self.min_workers}")
            elif self.prepare is not None:
                self._prepare(change, now)
                return None
            self._ask(now)
            return None
        if self._asked_at is None:
            if self._ready(now):
                self._ask(now)
            return None
        saved = coord.saved
        if saved is not None and self._saved_at is None:
            self._saved_at = now
        if saved is not None and saved[2] is not None:
            self.job.output.say(f"warning: {saved[2]}; resizing from the newest checkpoint")
            return self._done(now)
        if saved is not None and (coord.state_saved == saved[0]
                                  or now > self._saved_at + STATE_WAIT_S):
            self.saved_iteration = saved[0]
            return self._done(now)
        if now > self._asked_at + wait_limit:
            self.job.output.say(f"warning: no iteration boundary within {wait_limit:.0f} s; "
                                "resizing from the newest checkpoint")
            return self._done(now)
        return None

    def _ask(self, now: float) -> None:
        self.job.coordinator.request_state(boundary=True)
        self._asked_at = now

    def _prepare(self, change: Change, now: float) -> None:
        """Start the next generation on ``change.hosts`` while this one trains on: its
        processes import MXNet and run the script's set-up, then wait at its hold; the
        boundary is asked for once they all do (:meth:`_ready`)."""
        self._prepared_at = now
        self.next, self._start_error, self._failed_hosts = None, None, {}
        self._given_up = threading.Event()
        n = slots(change.hosts)
        self.job.output.say(f"{change.why}: starting the next {n} worker(s) while training "
                            "goes on; the job moves to them at an iteration boundary")

        def start():
            try:
                self.next = self.prepare(change.hosts)
                if not self._given_up.is_set():
                    self.next.prestart()
            except Exception as exc:  # noqa: BLE001 - said, and the resize starts cold
                self._start_error = str(exc) or type(exc).__name__
                self._failed_hosts = dict(getattr(exc, "failed", None) or {})
        self._starting = threading.Thread(target=start, name="mxlbbsp-next-generation",
                                          daemon=True)
        self._starting.start()

    def _ready(self, now: float) -> bool:
        """Whether the boundary may be asked for: the next generation waits at its hold
        with every worker, or it failed, or it took longer than PRESTART_WAIT_S (then it is
        given up, said, and the next generation starts after the boundary as usual)."""
        nxt = self.next
        held = nxt.held if nxt is not None else 0
        if held != self._held:
            self._held = held
            log.debug("next generation: %d worker(s) at the hold %.2f s after the change",
                      held, now - self._prepared_at)
        if (not self._starting.is_alive() and self._start_error is None and nxt is not None
                and held == nxt.config.num_workers):
            return True
        problem = self._start_error
        if problem is None and nxt is not None and not self._starting.is_alive():
            ended = [p for p in nxt.procs if p.poll() is not None]
            if ended:
                problem = f"{ended[0].name} ended (exit code {ended[0].poll()})"
        if problem is None and now > self._prepared_at + PRESTART_WAIT_S:
            problem = f"its workers did not all get ready within {PRESTART_WAIT_S:.0f} s"
        if problem is None:
            return False
        self.discard_next()
        if self._failed_hosts:
            # a host that joined and cannot run the job: left out, the job trains on as it is
            for name in self._failed_hosts:
                self.membership.preempted(name)
            self.job.output.say(f"warning: {', '.join(self._failed_hosts)} cannot join the job "
                                f"({'; '.join(self._failed_hosts.values())}): left out until "
                                "the discovery script drops it and lists it again; the job "
                                "trains on")
            self.resize, self._failed_hosts, self._start_error = None, {}, None
            return False
        self.job.output.say(f"warning: the next generation could not start ahead ({problem}); "
                            "it starts after the boundary")
        return True

    def take_next(self):
        """The next generation's job, started ahead and ready, or None (none was, or it
        was given up: the boundary is asked for only after :meth:`_ready`)."""
        nxt, self.next = self.next, None
        return nxt

    def discard_next(self) -> None:
        """Stop the next generation started ahead, if any (the job did not resize)."""
        self._given_up.set()
        if self.next is not None:
            self.next.cancel()
        if self._starting is not None:
            self._starting.join()
        nxt, self.next = self.next, None
        if nxt is not None:
            nxt.discard()

    def _done(self, now: float) -> int:
        self.saved_since = now
        if self.below is not None:
            where = self.job.config.checkpoint_dir
            self.job.output.say(f"error: {self.below}; the job's state is in {where} "
                                f"(continue with --resume {where})")
            return EXIT_BELOW
        return EXIT_RESIZE

    def recover(self, gone, wait: float = SNAPSHOT_WAIT_S) -> None:
        """A role failed: ask a surviving worker for the state of its last finished
        iteration and wait for it (at most ``wait`` seconds), so that the next generation
        starts from there instead of the newest periodic checkpoint."""
        coord = self.job.coordinator
        if coord is None or coord.progress().iteration < self.job.first_iteration:
            return
        rank = coord.request_state(boundary=False, gone=gone)
        if rank is None:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and coord.saved is None:
            time.sleep(0.05)
        saved = coord.saved
        if saved is None:
            self.job.output.say(f"warning: worker {rank} did not save its state within "
                                f"{wait:.0f} s; restarting from the newest checkpoint")
            return
        if saved[2] is not None:
            self.job.output.say(f"warning: {saved[2]}; restarting from the newest checkpoint")
            return
        until = min(deadline, time.monotonic() + STATE_WAIT_S)
        while time.monotonic() < until and coord.state_saved != saved[0]:
            time.sleep(0.05)                # the coordinator's own state beside it
        self.saved_iteration = saved[0]
        self.saved_since = time.monotonic()


def _membership(config, say) -> Membership:
    if config.host_discovery_script is not None:
        return Membership.from_script(config.host_discovery_script, config.discovery_interval,
                                      config.max_workers, say)
    from . import slurm
    hosts = slurm.SlurmTransport(config).hosts()     # the allocation's nodes and slots

    def poll():
        """The allocation's nodes that sinfo does not call drained, down or silent (a node
        new to the job gets the full pre-flight, a step, when the next generation starts)."""
        try:
            states = slurm.node_states([h.name for h in hosts])
        except slurm.SlurmError as exc:
            return [], f"sinfo failed ({exc})"
        return [h for h in hosts if not slurm.gone(states.get(h.name, ""))], None
    return Membership(poll, config.discovery_interval, config.max_workers, say)


def generation_config(config, first: bool):
    """A generation's own copy of the launch's configuration (the next one may be built
    while this one runs): its number of workers comes from its hosts, and after the first
    it resumes from the newest checkpoint in --checkpoint-dir (the state saved at the
    boundary or after a failure), not from --resume's."""
    if first:
        return dataclasses.replace(config, num_workers=None)
    return dataclasses.replace(config, num_workers=None, resume=None)


def run_elastic(config) -> int:
    """An elastic job to its end: generations of :class:`~.job.Job` on the hosts of the
    moment, joined by resizes (module docstring), each on its own copy of ``config`` (which
    has passed its preflight); the exit code of the last."""
    from .procs import Output

    output = Output(None if config.dry_run else config.log_dir)
    return _ElasticRun(config, output, _membership(config, output.say)).run()


class _ElasticRun:
    """The loop of :func:`run_elastic`: the first hosts, then one generation after another
    until one ends in neither a resize nor a failure that may be recovered from."""

    def __init__(self, config, output, membership: Membership):
        self.config, self.output, self.membership = config, output, membership
        self.low = config.min_workers or 1
        self.limit = config.restarts or FAILURES
        self.started = time.monotonic()
        self.failures = 0
        self.launch_start: Optional[int] = None
        self.totals = {"resizes": 0, "restarts": 0, "paused_s": 0.0, "lost": 0}
        self.prepared = None       # the next generation, started ahead and taken

    def run(self) -> int:
        hosts = self._first_hosts()
        if isinstance(hosts, int):
            return hosts
        self.membership.start()
        try:
            return self._generations(hosts)
        finally:
            self.membership.stop()
            if self.prepared is not None:
                self.prepared.discard()

    def _first_hosts(self):
        """The hosts of the first generation, once they have ``--min-workers`` slots; or
        the exit code when they do not come."""
        config, low = self.config, self.low
        deadline = self.started + config.start_timeout
        while True:
            try:
                hosts = self.membership.first()
            except DiscoveryFailed as exc:
                self.output.say(f"error: {exc}")
                return 2
            if slots(hosts) >= low:
                return hosts
            if time.monotonic() > deadline:
                self.output.say(f"error: {slots(hosts)} worker slot(s) after "
                                f"{config.start_timeout:g} s, fewer than --min-workers {low}; "
                                "raise --start-timeout or lower --min-workers")
                return 1
            time.sleep(config.discovery_interval)

    def _generation(self, hosts, checked, first: bool):
        """The job of one generation on ``hosts``."""
        from .job import Job

        job = Job(generation_config(self.config, first), output=self.output, hosts=hosts)
        job.since = self.started
        job.checked_hosts = checked
        return job

    def _prepare(self, current):
        """How the watcher starts the next generation ahead (``--start-ahead``), or None."""
        if not self.config.start_ahead or self.config.dry_run:
            return None
        return lambda after: self._generation(after, {h.name for h in current.hosts}, False)

    def _generations(self, hosts):
        """The exit code of the last generation."""
        from .job import _finished

        checked: set = set()
        note: Optional[Note] = None
        while True:
            job = self.prepared or self._generation(hosts, checked, first=note is None)
            self.prepared = None
            if self.launch_start is None:
                self.launch_start = job.launch_start     # the summary counts the launch's
            job.launch_start = self.launch_start
            job.elastic = watcher = Watcher(job, self.membership, self.low)
            watcher.prepare = self._prepare(job)
            job.note, job.elastic_totals = note, self.totals
            if note is None:
                done = _finished(job)
                if done is not None:
                    return done
            rc = None
            try:
                rc = job.run()
            finally:
                if rc == EXIT_RESIZE:
                    self.prepared = watcher.take_next()
                else:
                    watcher.discard_next()
            checked = {h.name for h in hosts}
            if rc == EXIT_RESIZE:
                after = watcher.resize.hosts
                note = Note("resized", job.config.num_workers, slots(after),
                            (watcher.saved_iteration or 0) + 1, watcher.resize.why,
                            watcher.saved_since or time.monotonic(), 0)
                hosts = after
                continue
            recovered = self._after_failure(job, watcher, rc)
            if isinstance(recovered, int):
                return recovered
            note, hosts, checked = recovered

    def _after_failure(self, job, watcher, rc):
        """After a generation that ended other than in a resize: (the note, the hosts and
        the hosts checked) of the restart, or the exit code of the job."""
        from .job import NO_RESTART

        config, output, low = self.config, self.output, self.low
        if rc == EXIT_BELOW:
            return 1
        if rc in NO_RESTART or config.dry_run or job.signal is not None:
            return rc
        self.failures += 1
        if self.failures > self.limit:
            output.say(f"no restart: {self.failures - 1} failure(s) recovered from already "
                       f"(--restarts {self.limit})")
            return rc
        left = self.membership.hosts()
        failed = job.transport.preflight(left)
        usable = [h for h in left if h.name not in failed]
        if slots(usable) < low:
            output.say(f"error: {slots(usable)} worker slot(s) left after the failure, "
                       f"fewer than --min-workers {low}")
            return rc
        latest = _latest(config.checkpoint_dir)
        resumed = latest + 1 if latest is not None else 0
        reached = job.coordinator.progress().iteration if job.coordinator else -1
        note = Note("restarted", job.config.num_workers, slots(usable), resumed,
                    job.reason or f"exit code {rc}",
                    watcher.saved_since or time.monotonic(),
                    max(0, reached + 1 - resumed))
        return note, usable, {h.name for h in usable}


def _latest(directory) -> Optional[int]:
    from mxlbbsp.core import store
    path = store.latest(directory) if directory else None
    return None if path is None else int(store.read_manifest(path)["iteration"])
