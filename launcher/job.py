"""Run one job: place the roles, start them, supervise them, tear everything down.

Order of start: coordinator (a thread of this process), then the ps-lite scheduler (on a
free port), the servers, the relays and the workers at once (all again on another port if
the scheduler's was taken meanwhile: it ends before it listens). Then
the supervision (:mod:`.supervise`) watches them until the job ends; whatever ended it,
every process of it on every host is stopped before :meth:`Job.run` returns.

:func:`run_job` wraps it for checkpoints: with ``--restarts N`` a failed job (not bad input,
not an interrupt) is started again from the latest checkpoint, up to N times; the hosts that
fail the transport's pre-flight are left out (the workers' number shrinks to the slots left).

The rooms of the job: how the roles reach their hosts (this machine, SSH, srun) is the
job's transport (:mod:`.transport`), which the job asks and never branches on; the roles
and their environments are built by :mod:`.roles`; ``--dry-run`` prints them
(:mod:`.dryrun`); the supervision, stall detection (:mod:`.watch`), failure diagnosis
(:mod:`.diagnosis`, a pure table) and progress lines (:mod:`.progress`) are their own
modules.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import secrets
import signal
import socket
import threading
import time
from typing import Dict, List, Optional

from mxlbbsp.control.coordinator import Coordinator
from mxlbbsp.core import env as _env
from mxlbbsp.core import store as _store
from mxlbbsp.core.env import NO_MXNET

from . import transport as _transport
from .config import ConfigError, LaunchConfig, interface_addresses
from .dryrun import describe
from .guard import remove_sockets
from .hold import Hold
from .hostfile import Host, Placement, place
from .procs import Output, RoleProcess, stop_all
from .roles import RoleBuilder, Roles, free_port
from .slurm import SlurmTransport
from .supervise import EXIT_CONFIG, Supervisor

log = logging.getLogger(__name__)


class JobFailed(RuntimeError):
    """The job could not start (not bad input): exit code 1, one line."""


class HostsFailed(JobFailed):
    """Hosts failed the pre-flight (``failed``: what is wrong with each, by host name): a
    job started ahead leaves them out instead of failing (launcher/elastic.py)."""

    def __init__(self, message: str, failed: Dict[str, str]):
        super().__init__(message)
        self.failed = failed


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def choose_transport(config: LaunchConfig,
                     hosts: Optional[List[Host]] = None) -> _transport.Transport:
    """The transport of a job: --launcher if given; else SSH with a hostfile, SLURM inside an
    allocation, local otherwise. ``hosts``: the hosts left for a restart."""
    name = config.launcher
    if name is None:
        if config.hostfile is not None or config.host_discovery_script is not None:
            name = "ssh"
        elif _env.in_slurm_allocation():
            name = "slurm"
        else:
            name = "local"
    if name == "ssh":
        return _transport.SshTransport(config, hosts)
    if name == "slurm":
        return SlurmTransport(config, hosts)
    if name == "local":
        if config.hostfile is not None:
            raise ConfigError("--launcher local runs every process on this machine: drop "
                              "-H/--hostfile, or use --launcher ssh")
        return _transport.LocalTransport(config)
    raise ConfigError(f"--launcher {name!r}: choose one of {', '.join(_transport.NAMES)}")


class Job:
    """One attempt of a job: its placement, its roles, their lifecycle."""

    def __init__(self, config: LaunchConfig, output: Optional[Output] = None,
                 hosts: Optional[List[Host]] = None):
        self.output = output or Output(None if config.dry_run else config.log_dir)
        self.reason: Optional[str] = None        # why the job failed, in a few words
        self.since: Optional[float] = None       # monotonic start of the first attempt
        self.attempt = 0                          # restarts before this attempt
        self.resume_from = config.resume_from()
        #: an elastic job's (launcher/elastic.py): its watcher, the resize or restart that
        #: started this generation (said at its first iteration), the whole job's counts
        self.elastic = None
        self.note = None
        self.elastic_totals = None
        #: hosts that passed the pre-flight a moment ago (an elastic job's previous
        #: generation ran on them): not checked again
        self.checked_hosts: set = set()
        #: the first iteration this launch trains (> 0 when it resumed a checkpoint; a
        #: restart keeps its launch's): the summary counts what the launch trained
        self.launch_start = 0
        if self.resume_from:
            self.launch_start = int(_store.read_manifest(self.resume_from)["iteration"]) + 1
        #: the first iteration this job (one attempt, one generation) trains
        self.first_iteration = self.launch_start
        self.transport = choose_transport(config, hosts)
        self.hosts = self.transport.hosts()
        n = self.transport.default_workers(self.hosts)
        slots = sum(h.slots for h in self.hosts)
        if n > slots:
            raise ConfigError(self.transport.too_many_workers(n, slots))
        # the transport sized the job from the configuration as given; from here on the
        # job's own copy, for its n workers (the launch's is shared by its restarts)
        self.config = config = config.for_workers(n)
        self.placement: Placement = place(self.hosts, n, config.num_servers)
        self.token = secrets.token_hex(16)
        self.bind = config.bind         # None: the transport's (see _resolve_bind)
        if config.ps_interface and not config.bind:
            self.bind = interface_addresses(config.ps_interface)[0]
        self.builder = RoleBuilder(config, self.transport, self.placement, self.token,
                                   self.resume_from, self.output)
        self.roles: Optional[Roles] = None
        self.coordinator: Optional[Coordinator] = None
        #: started ahead (:meth:`prestart`): the workers' hold, the coordinator's socket
        #: (listening before the coordinator exists) and the scheduler's port
        self.hold: Optional[Hold] = None
        self._coordinator_sock: Optional[socket.socket] = None
        self._port: Optional[int] = None
        self._cancelled = threading.Event()
        #: the signal (SIGINT, SIGTERM) that asks the job to stop, once one came
        self.signal: Optional[int] = None
        self._keepalive = self.transport.keepalive
        self._stopped = threading.Event()
        self._heartbeat_thread: Optional[threading.Thread] = None
        try:
            self.floors = _env.stall_floors()
        except _env.EnvError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def procs(self) -> List[RoleProcess]:
        return self.roles.all if self.roles is not None else []

    # ---- dry run --------------------------------------------------------------------------

    def describe(self) -> str:
        """The placement and the commands, as --dry-run prints them (token hidden)."""
        self._resolve_bind()
        roles = self.builder.build(self.bind, 0, (self.bind, 0))
        return describe(self.config, self.transport, self.hosts, self.bind, roles)

    # ---- run ------------------------------------------------------------------------------

    def _resolve_bind(self) -> None:
        if self.bind is None:
            self.bind = self.transport.bind_address(self.hosts)

    def _on_signal(self, signum, frame) -> None:
        if self.signal is not None:       # a second Ctrl-C: stop waiting politely
            for p in self.procs:
                p.kill()
        self.signal = signum

    def run(self) -> int:
        cfg = self.config
        self.transport.check_command()
        if cfg.dry_run:
            print(self.describe())
            return 0
        if not self.transport.remote and importlib.util.find_spec("mxnet") is None:
            raise ConfigError(NO_MXNET)      # the scheduler and the servers need it here
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.hold is None:
                self._preflight()
            if self.signal is not None:
                return self.interrupted()
            self._resolve_bind()
            return self._run()
        finally:
            self._teardown()
            for s, h in old.items():
                signal.signal(s, h)

    def _preflight(self) -> None:
        """HostsFailed when a host not checked yet cannot run a role now."""
        fresh = [h for h in self.hosts if h.name not in self.checked_hosts]
        failed = self.transport.preflight(fresh) if fresh else None
        if failed:
            raise HostsFailed(self.transport.preflight_failed(failed, self.hosts), failed)

    def prestart(self) -> None:
        """Start this job ahead of its turn (an elastic job's next generation, while the
        current one trains; from a thread of its own): the pre-flight of the hosts not
        checked, then the scheduler, the servers and the workers, which wait at the hold
        (:mod:`.hold`) to be told the checkpoint they resume from; the coordinator's port
        listens already, the coordinator comes in :meth:`run`, which starts nothing more.
        HostsFailed, JobFailed, ConfigError or OSError when it cannot start; :meth:`discard`
        then stops what did."""
        self.transport.check_command()
        if not self.transport.remote and importlib.util.find_spec("mxnet") is None:
            raise ConfigError(NO_MXNET)
        began = time.monotonic()
        self._preflight()
        log.debug("next generation: pre-flight in %.2f s", time.monotonic() - began)
        self._resolve_bind()
        self.hold = Hold(self.bind, self.token, self.config.num_workers)
        family = socket.AF_INET6 if ":" in self.bind else socket.AF_INET
        sock = self._coordinator_sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind((self.bind, 0))
        sock.listen(4096)
        self.builder.hold = self.hold.address
        if self._cancelled.is_set():
            return
        self._port = self._start_roles(sock.getsockname()[:2])
        log.debug("next generation: scheduler listening %.2f s after the start",
                  time.monotonic() - began)
        if self._cancelled.is_set():
            return
        if self._port is None:
            raise JobFailed("the ps-lite scheduler of the next generation did not start")

    @property
    def held(self) -> int:
        """Workers of a job started ahead that wait at its hold now."""
        return self.hold.held if self.hold is not None else 0

    def discard(self) -> None:
        """Give up a job started ahead: its workers end, every process of it is stopped."""
        if self.hold is not None:
            self.hold.close()
        if self._coordinator_sock is not None:
            self._coordinator_sock.close()
        self._teardown()

    def _run(self) -> int:
        cfg = self.config
        if self.hold is not None:
            # started ahead: the checkpoint is the newest now (saved at the boundary)
            self.resume_from = cfg.resume_from()
            if self.resume_from:
                start = int(_store.read_manifest(self.resume_from)["iteration"]) + 1
                self.first_iteration = start
        manifest = state = None
        if self.resume_from:
            manifest = _store.read_manifest(self.resume_from)
            state = _store.coordinator_state(self.resume_from)
            kept = _store.truncate_metrics(cfg.metrics, manifest["iteration"])
            self.output.say(f"resuming from iteration {manifest['iteration'] + 1} "
                            f"({self.resume_from}; written by {manifest.get('num_workers')} "
                            f"worker(s), now {cfg.num_workers})"
                            + (f"; {kept} metrics records kept" if cfg.metrics else ""))
        self.coordinator = Coordinator(cfg.coordinator_config(
            self.token, self.bind, self._coordinator_sock, manifest, state))
        try:
            coord_addr = self.coordinator.start()
        except OSError as exc:
            raise ConfigError(f"--bind {self.bind}: cannot listen there ({exc.strerror})") from None
        if self.hold is not None:
            port = self._port
            self.hold.release(self.resume_from)
        else:
            port = self._start_roles(coord_addr)
        if port is None:
            return self.interrupted() if self.signal else 1
        hubs, relays = len(self.roles.hubs), len(self.roles.relays)
        self.output.say(f"started {len(self.roles.workers)} worker(s)"
                        + (f", {relays} relay(s)" if relays else "")
                        + (f" through {hubs} hub(s)" if hubs else "")
                        + f" and {len(self.roles.servers)} server(s); sync={cfg.sync}, "
                        f"predictor={cfg.predictor}; scheduler {self.bind}:{port}, "
                        f"coordinator {coord_addr[0]}:{coord_addr[1]}")
        return Supervisor(self).run()

    def _start_roles(self, coord_addr) -> Optional[int]:
        """Start the scheduler on a free port and every other role at once (ps-lite's nodes
        wait for the scheduler by themselves, so nobody waits for its import of MXNet before
        starting theirs); then wait until it listens. A scheduler that ended before it
        listened (its port taken meanwhile) means another try on another port."""
        self._start_heartbeat()
        for _ in range(5):
            port = free_port(self.bind)
            self.roles = self.builder.build(self.bind, port, coord_addr)
            scheduler = self.roles.scheduler
            scheduler.start()
            others = self.roles.started_after_the_scheduler
            for p in others:
                p.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not self._stopping:
                if scheduler.poll() is not None:
                    break
                if _listening(self.bind, port) or all(w.poll() is not None
                                                      for w in self.roles.workers):
                    return port      # (workers that ended: the supervision says how)
                time.sleep(0.05)
            if self._stopping:
                return None
            stop_all(self.roles.all, grace=1.0)
        self.output.say("error: the ps-lite scheduler did not start (see its output above)")
        return None

    @property
    def _stopping(self) -> bool:
        """A signal came, or the job started ahead was given up (:meth:`cancel`)."""
        return self.signal is not None or self._cancelled.is_set()

    def cancel(self) -> None:
        """Give up a job started ahead, from another thread: its start stops waiting (and
        :meth:`discard` then stops what it started)."""
        self._cancelled.set()

    def interrupted(self) -> int:
        """After SIGINT / SIGTERM: 128 + its number (after saying so)."""
        name = signal.Signals(self.signal).name
        self.output.say(f"{name}: stopping all {len(self.procs)} processes of the job")
        return 128 + self.signal

    def preflight(self, host) -> Optional[str]:
        """What is wrong with ``host`` for this job now (the transport's pre-flight), None if
        nothing."""
        return self.transport.check_host(host)

    def host_answers(self, name: str) -> bool:
        """Whether ``name`` still passes the pre-flight (a few seconds at most)."""
        host = next((h for h in self.hosts if h.name == name), None)
        return host is not None and self.preflight(host) is None

    def _start_heartbeat(self) -> None:
        """Beat from before the first remote guard starts: a guard counts its silence from
        its spec on, and the scheduler's import of MXNet, which the start waits for, can
        take longer than that silence on a loaded machine."""
        if self._keepalive and self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat, args=(self._keepalive[0],), name="heartbeat",
                daemon=True)
            self._heartbeat_thread.start()

    def _heartbeat(self, interval: float) -> None:
        """Until the teardown: an empty line to every remote guard every ``interval`` s
        (the roles of the start's current try: a new scheduler port means new roles)."""
        while not self._stopped.wait(interval):
            roles = self.roles
            for p in roles.started_after_the_scheduler if roles is not None else ():
                p.beat()

    def _teardown(self) -> None:
        self._stopped.set()
        procs = [p for p in self.procs if p.proc is not None]
        if procs:
            stop_all(procs, grace=3.0)
        if not self.transport.remote and self.roles is not None:
            for p in self.roles.relays:   # a relay whose guard was killed left its socket
                remove_sockets(p.sockets)
        self.transport.cleanup()
        if self.coordinator is not None:
            self.coordinator.stop()


# ---- restarts from checkpoints -----------------------------------------------------------

#: exit codes that a restart cannot help: bad input, Ctrl-C, SIGTERM
NO_RESTART = (0, EXIT_CONFIG, 130, 143)


def _reachable(job: Job) -> tuple:
    """(hosts that pass the pre-flight, one reason per host that does not)."""
    failed = job.transport.preflight(job.hosts)
    ok = [h for h in job.hosts if h.name not in failed]
    return ok, [f"{name} unreachable" for name in failed]


def _finished(job: Job) -> Optional[int]:
    """0 (after saying so) when the same command runs again after its job ended normally:
    the checkpoint that --checkpoint-dir would resume from is the job's final one, so there
    is nothing to do; else None. An explicit --resume of a final checkpoint runs (to train
    on, e.g. more epochs or on other workers; a script asking for no more ends at once)."""
    path = job.resume_from
    if not path or job.config.dry_run:
        return None
    manifest = _store.read_manifest(path)
    if not manifest.get("final"):
        return None
    if job.config.resume:
        job.output.say(f"{path} is the final checkpoint of a job that ended normally after "
                       f"iteration {manifest['iteration']}: the script goes on from there")
        return None
    job.output.say(f"nothing to do: {path} is the final checkpoint of a job that ended "
                   f"normally after iteration {manifest['iteration']}; to train on from it "
                   f"(e.g. more epochs), add --resume {path}; to train again from scratch, "
                   "give another --checkpoint-dir")
    return 0


def run_job(config: LaunchConfig) -> int:
    """Run the job of ``config`` (after its :meth:`~.config.LaunchConfig.preflight`); with
    ``--restarts N``, start it again from the latest checkpoint after a failure, up to N
    times, printing what happened and why."""
    requested = config.num_workers
    since = time.monotonic()
    job = Job(config)
    done = _finished(job)
    if done is not None:
        return done
    rc = job.run()
    for attempt in range(1, config.restarts + 1):
        if rc in NO_RESTART or config.dry_run:
            return rc
        latest = _store.latest(config.checkpoint_dir)
        if latest is None:
            job.output.say(f"no restart: no checkpoint was written to {config.checkpoint_dir} "
                           "before the failure")
            return rc
        hosts, dropped = _reachable(job)        # hosts may be gone: leave them out
        if not hosts:
            job.output.say("no restart: no host passes the pre-flight "
                           f"({'; '.join(dropped)})")
            return rc
        slots = sum(h.slots for h in hosts)
        n = min(requested or slots, slots)
        why = "; ".join(dropped) or job.reason or f"exit code {rc}"
        iteration = _store.read_manifest(latest)["iteration"] + 1
        job.output.say(f"restart {attempt}/{config.restarts} from iteration {iteration} on "
                       f"{n} worker(s) ({why})")
        launch_start = job.launch_start
        # the attempt's own copy: the newest checkpoint is in --checkpoint-dir, not --resume
        retry = dataclasses.replace(config, num_workers=n, resume=None)
        job = Job(retry, output=job.output, hosts=hosts)
        job.since, job.attempt, job.launch_start = since, attempt, launch_start
        rc = job.run()
    return rc
