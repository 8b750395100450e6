"""Run one job: place the roles, start them, supervise them, tear everything down.

Order of start: coordinator (a thread of this process), the ps-lite scheduler (on a free
port, restarted on another if the port was taken meanwhile), the servers, the workers. Then
the supervision loop, every 0.1 s, ends the job on the first of:

* a configuration problem found by the coordinator (e.g. global batch < workers): exit 2;
* a process exiting non-zero (or its transport failing: an SSH connection lost, a SLURM node
  that failed): that exit code, naming the role, rank and host;
* SIGINT / SIGTERM: 130 / 143;
* the coordinator failing the job for every worker (e.g. workers that run different numbers
  of iterations): 1, with its one line;
* no iteration finished for the stall limit (a frozen worker, a dead ps-lite peer: they hang
  rather than fail): 124. On by default (:func:`stall_limit`); for a script without
  mxlbbsp.DataLoader (no iterations known), no CPU use by any worker for that long (measured
  here for local workers; remote workers' guards report it every CPU_EVERY s);
* every worker exiting 0: the servers and the scheduler get a few seconds to finish, and 0.

Whatever ended the job, every process of it on every host is stopped before ``run`` returns.

:func:`run_job` wraps it for checkpoints: with ``--restarts N`` a failed job (not bad input,
not an interrupt) is started again from the latest checkpoint, up to N times; the hosts that
fail the transport's pre-flight are left out (the workers' number shrinks to the slots left).

How the roles reach their hosts (this machine, SSH, srun) is the job's transport
(:mod:`.transport`): the job asks it, and never branches on which one it is.
"""
from __future__ import annotations

import importlib.util
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Optional

from mxlbbsp import modes
from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
from mxlbbsp.core import env as _env
from mxlbbsp.core import metrics as _metrics
from mxlbbsp.core import store as _store
from mxlbbsp.core.env import NO_MXNET
from mxlbbsp.core.planner import launch_clock

from . import transport as _transport
from .config import ConfigError, LaunchConfig, interface_addresses
from .guard import SHARE_CORES
from .hostfile import Host, Placement, local_ranks, place
from .procs import Output, RoleProcess, local_transport, stop_all
from .slurm import SlurmTransport, in_allocation

EXIT_CONFIG = 2
EXIT_STALL = 124
#: the automatic stall limit is this many times the recent median iteration time (at least
#: the running floor of _env.stall_floors: 120 s, for e.g. an evaluation at the end of an
#: epoch; 300 s until the first iteration: MXNet's import, ps-lite's start over SSH, data
#: loading and graph building on a busy machine)
STALL_MEDIANS = 20
#: a job that waits for a worker known to be stopped (SIGSTOP) ends after this many seconds
#: without an iteration, or STALL_MEDIANS x the median iteration time if that is longer
STOPPED_FLOOR = 10.0
#: CPU seconds per second (all workers) under which a job without iterations counts as idle
IDLE_CPU = 0.02
#: a remote worker's guard reports its CPU seconds this often (see guard.CPU)
CPU_EVERY = 1.0


def stall_limit(setting: Optional[float], floors, iteration: int,
                iteration_s: Optional[float]) -> Optional[float]:
    """Seconds without progress that stop the job (None: never).

    ``setting``: --stall-timeout (None: automatic, 0: off). Automatic: the start-up floor
    until the first iteration, then STALL_MEDIANS x the recent median iteration time, at
    least the running floor."""
    if setting is not None:
        return setting or None
    startup, running = floors
    if iteration < 0:
        return startup
    return max(running, STALL_MEDIANS * (iteration_s or 0.0))


def _killed_by(signum: int, rc: int) -> str:
    """"SIGSEGV (exit code 139)", SIGKILL with its usual senders; "signal N" for a number
    without a name."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:
        return (f"{name} (exit code {rc}: kill -9, or the kernel's out-of-memory killer, "
                "see dmesg)")
    return f"{name} (exit code {rc})"


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return ("worker " if len(ranks) == 1 else "workers ") + ", ".join(map(str, ranks))


class JobFailed(RuntimeError):
    """The job could not start (not bad input): exit code 1, one line."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
        if config.hostfile is not None:
            name = "ssh"
        elif in_allocation():
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
    def __init__(self, config: LaunchConfig, output: Optional[Output] = None,
                 hosts: Optional[List[Host]] = None):
        self.config = config
        self.output = output or Output(None if config.dry_run else config.log_dir)
        self.reason: Optional[str] = None        # why the job failed, in a few words
        self.since: Optional[float] = None       # monotonic start of the first attempt
        self.attempt = 0                          # restarts before this attempt
        self.resume_from = config.resume_from()
        self.transport = choose_transport(config, hosts)
        self.hosts = self.transport.hosts()
        n = self.transport.default_workers(self.hosts)
        slots = sum(h.slots for h in self.hosts)
        if n > slots:
            raise ConfigError(self.transport.too_many_workers(n, slots))
        config.num_workers = n
        config.resolve_slowdown(n)
        config.check_workers(n)
        self.placement: Placement = place(self.hosts, n, config.num_servers)
        self.token = secrets.token_hex(16)
        self.bind = config.bind         # None: the transport's (see _resolve_bind)
        if config.ps_interface and not config.bind:
            self.bind = interface_addresses(config.ps_interface)[0]
        self.procs: List[RoleProcess] = []
        self.scheduler: Optional[RoleProcess] = None
        self.servers: List[RoleProcess] = []
        self.workers: List[RoleProcess] = []
        self.coordinator: Optional[Coordinator] = None
        self._signal: Optional[int] = None
        self._keepalive = self.transport.keepalive
        self._local = _transport.Transport(config)     # the scheduler's: this machine
        self._stopped = threading.Event()
        try:
            self._floors = _env.stall_floors()
        except _env.EnvError as exc:
            raise ConfigError(str(exc)) from None

    # ---- the environment of each role --------------------------------------------------

    def _base_env(self, host: Host, procs_on_host: Optional[int]) -> Dict[str, str]:
        """``procs_on_host``: the job's workers on ``host``; None for the scheduler and the
        servers, which run on one thread."""
        env: Dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        env.update(self.transport.forwarded())
        if procs_on_host is None:
            env["OMP_NUM_THREADS"] = "1"
        elif "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self.config.env:
            # like torchrun: don't let n processes each take every core. The guard divides
            # the cores of the host it runs on (a remote host's, not this one's).
            env[SHARE_CORES] = str(max(procs_on_host, 1))
        return env

    def _role(self, role: str, rank: Optional[int], host: Host, argv: List[str],
              env: Dict[str, str], transport: Optional[List[str]] = None,
              boot: bool = False, cpu: bool = False) -> RoleProcess:
        env = dict(env)
        env.update(self.config.env)       # --env has the last word
        silence = None
        if transport is None and self._keepalive:     # e.g. over SSH: see ssh.keepalive
            silence = self._keepalive[1]
        label = role if rank is None else f"{role}-{rank}"
        local = transport is not None
        proc = RoleProcess(role, rank, host.name, argv, env, self.config.cwd,
                           transport or self.transport.guard_argv(host, label), self.output,
                           show_host=self.transport.remote, silence=silence, boot=boot,
                           cpu_every=CPU_EVERY if cpu and self.transport.reports_cpu else None)
        proc.via = self._local if local else self.transport
        proc.hide = proc.via.hide
        self.procs.append(proc)
        return proc

    def _ps_env(self, role: str, host: Host, port: int,
                per_host: Optional[int]) -> Dict[str, str]:
        env = self._base_env(host, per_host)
        node_host = self.transport.node_host(Host(self.bind) if role == "scheduler" else host,
                                             self.bind)
        env.update(_env.ps_env(role, self.bind, port, self.config.num_servers,
                               self.config.num_workers, node_host,
                               self.config.ps_interface))
        return env

    def _build(self, scheduler_port: int, coordinator_addr) -> None:
        """Create (not start) every role's process."""
        cfg = self.config
        self.procs = []
        per_host: Dict[str, int] = {}
        for h in self.placement.workers:
            per_host[h.name] = per_host.get(h.name, 0) + 1
        here = Host(self.bind)
        env = self._ps_env("scheduler", here, scheduler_port, None)
        self.scheduler = self._role("scheduler", None, here,
                                    [sys.executable, "-m", "mxlbbsp.server"], env,
                                    transport=local_transport())
        self.servers = []
        for r, host in enumerate(self.placement.servers):
            env = self._ps_env("server", host, scheduler_port, None)
            argv = [self.transport.python(host), "-m", "mxlbbsp.server"]
            self.servers.append(self._role("server", r, host, argv, env))
        self.workers = []
        local = local_ranks(self.placement.workers)
        for r, host in enumerate(self.placement.workers):
            env = self._ps_env("worker", host, scheduler_port, per_host[host.name])
            env.update(_env.worker_env(r, cfg.sync, coordinator_addr, self.token, host.name,
                                       cfg.slowdown[r].encode() if cfg.emulate_slowdown else None,
                                       (cfg.emulate_compute or 0.0) / 1000.0,
                                       cfg.signal_columns, local[r]))
            env.update(modes.get(cfg.sync).worker_env(cfg.sync_options))
            env.update(_env.checkpoint_env(cfg.checkpoint_dir, cfg.checkpoint_every or 0,
                                           self.resume_from))
            self.workers.append(self._role("worker", r, host, list(cfg.command), env,
                                           boot=True, cpu=True))

    # ---- dry run --------------------------------------------------------------------------

    def describe(self) -> str:
        """The placement and the commands, as --dry-run prints them (token hidden)."""
        self._resolve_bind()
        self._build(0, (self.bind, 0))
        lines = [f"job: {self.config.num_workers} worker(s), {self.config.num_servers} "
                 f"server(s), sync={self.config.sync}, scheduler and coordinator on "
                 f"{self.bind}; every process runs in {self.config.cwd}"]
        lines += self.transport.bind_notes(self.hosts, self.bind)
        lines += self.transport.describe()
        lines.append(f"{'ROLE':<10} {'RANK':<5} {'HOST':<20} COMMAND")
        chosen = {_env.TOKEN: "<secret>", _env.PS_ROOT_PORT: "<free port>",
                  _env.COORDINATOR: f"{self.bind}:<free port>"}
        for p in [self.scheduler] + self.servers + self.workers:
            shown = {k: chosen.get(k, v) for k, v in sorted(p.env.items())
                     if k.startswith(("DMLC_", "MXLBBSP_")) or k == "OMP_NUM_THREADS"}
            env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
            where = "local" if p is self.scheduler else p.host
            rank = "-" if p.rank is None else str(p.rank)
            lines.append(f"{p.role:<10} {rank:<5} {where:<20} {shlex.join(p.argv)}")
            lines.append(f"{'':<10} {'':<5} {'':<20}   env: {env_text}")
            if p.via.remote:
                lines.append(f"{'':<10} {'':<5} {'':<20}   via: {shlex.join(p.transport)}")
        self.procs = []
        return "\n".join(lines)

    # ---- run ------------------------------------------------------------------------------

    def _resolve_bind(self) -> None:
        if self.bind is None:
            self.bind = self.transport.bind_address(self.hosts)

    def _on_signal(self, signum, frame) -> None:
        if self._signal is not None:       # a second Ctrl-C: stop waiting politely
            for p in self.procs:
                p.kill()
        self._signal = signum

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
            failed = self.transport.preflight(self.hosts)
            if failed:
                raise JobFailed(self.transport.preflight_failed(failed, self.hosts))
            if self._signal is not None:
                return self._interrupted()
            self._resolve_bind()
            return self._run()
        finally:
            self._teardown()
            for s, h in old.items():
                signal.signal(s, h)

    def _run(self) -> int:
        cfg = self.config
        manifest = state = None
        if self.resume_from:
            manifest = _store.read_manifest(self.resume_from)
            state = _store.coordinator_state(self.resume_from)
            kept = _store.truncate_metrics(cfg.metrics, manifest["iteration"])
            self.output.say(f"resuming from iteration {manifest['iteration'] + 1} "
                            f"({self.resume_from}; written by {manifest.get('num_workers')} "
                            f"worker(s), now {cfg.num_workers})"
                            + (f"; {kept} metrics records kept" if cfg.metrics else ""))
        self.coordinator = Coordinator(CoordinatorConfig(
            num_workers=cfg.num_workers, token=self.token, sync=cfg.sync,
            predictor=cfg.predictor, time_model=cfg.time_model, threshold=cfg.threshold,
            exog=cfg.exog_columns,
            max_batch=cfg.max_batch_size, min_batch=cfg.min_batch_size,
            tensorboard_dir=cfg.tensorboard, metrics_path=cfg.metrics, host=self.bind,
            slowdown=cfg.slowdown, sync_options=cfg.sync_options,
            started=launch_clock(),      # the deadline counts from the launch
            checkpoint_dir=cfg.checkpoint_dir,
            checkpoint_every=cfg.checkpoint_every or 0, resume_manifest=manifest,
            resume_state=state))
        try:
            coord_addr = self.coordinator.start()
        except OSError as exc:
            raise ConfigError(f"--bind {self.bind}: cannot listen there ({exc.strerror})") from None
        port = self._start_scheduler(coord_addr)
        if port is None:
            return self._interrupted() if self._signal else 1
        for p in self.servers + self.workers:
            p.start()
        if self._keepalive:
            threading.Thread(target=self._heartbeat, args=(self._keepalive[0],),
                             name="heartbeat", daemon=True).start()
        self.output.say(f"started {len(self.workers)} worker(s) and {len(self.servers)} "
                        f"server(s); sync={cfg.sync}, predictor={cfg.predictor}; scheduler "
                        f"{self.bind}:{port}, coordinator {coord_addr[0]}:{coord_addr[1]}")
        return self._supervise()

    def _start_scheduler(self, coord_addr) -> Optional[int]:
        """Start the scheduler on a free port; a port taken meanwhile means another try."""
        for _ in range(5):
            port = free_port(self.bind)
            self._build(port, coord_addr)
            self.scheduler.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self._signal is None:
                if self.scheduler.poll() is not None:
                    break
                if _listening(self.bind, port):
                    return port
                time.sleep(0.05)
            if self._signal is not None:
                return None
            self.scheduler.stop()
            self.scheduler.wait(5)
            self.scheduler.finish_output()
        self.output.say("error: the ps-lite scheduler did not start (see its output above)")
        return None

    def _interrupted(self) -> int:
        name = signal.Signals(self._signal).name
        self.output.say(f"{name}: stopping all {len(self.procs)} processes of the job")
        return 128 + self._signal

    def _supervise(self) -> int:
        cfg, coord = self.config, self.coordinator
        started = time.monotonic()
        next_progress = started + cfg.progress if cfg.progress else float("inf")
        floors = self._floors
        self._active_at = started          # a job without iterations: last CPU use seen
        self._stopped_since: Dict[int, float] = {}   # local workers seen stopped, since when
        self._cpu_seen: Dict[int, tuple] = {}
        self._cpu_use: Dict[int, Optional[float]] = {}   # cores per worker, last sample
        next_cpu = started + 1.0
        while True:
            if self._signal is not None:
                return self._interrupted()
            if coord.failure is not None and coord.failure_kind == "config":
                self.output.say(f"error: {coord.failure}")
                return EXIT_CONFIG
            if coord.failure is not None and coord.failure_fatal:
                # told to every worker, which now exit (2) quietly: the cause is this line
                self.output.say(f"error: {coord.failure}")
                return 1
            failed = self._first_failure()
            if failed is not None:
                return failed
            if all(w.poll() == 0 for w in self.workers):
                return self._finish(started)
            if coord.failure is not None and time.monotonic() > coord.failed_at + 2.0:
                # e.g. a worker's connection dropped but its process (ssh) has not ended yet
                self.output.say(f"error: {coord.failure}")
                return 1
            now = time.monotonic()
            if now >= next_cpu:
                if coord.registered == 0:
                    self._sample_cpu(now)     # only useful while no iteration can be seen
                self._note_stopped(now)
                next_cpu = now + 1.0
            if self._stalled(now, started, floors):
                return EXIT_STALL
            if now >= next_progress:
                self._print_progress(now - started)
                next_progress = now + cfg.progress
            time.sleep(0.1)

    def _sample_cpu(self, now: float) -> Dict[int, Optional[float]]:
        """Each worker's CPU use (cores) since its previous sample, measured here or
        reported by its remote guard; notes activity."""
        use: Dict[int, Optional[float]] = {}
        busy = 0.0
        for w in self.workers:
            sample = w.cpu_sample()
            before = self._cpu_seen.get(w.rank)
            if sample is None:
                use[w.rank] = None
                continue
            when, seconds = sample
            if before is not None and when <= before[0]:
                use[w.rank] = self._cpu_use.get(w.rank)    # no new report since
                continue
            self._cpu_seen[w.rank] = (when, seconds)
            if before is not None:
                use[w.rank] = max(0.0, (seconds - before[1]) / (when - before[0]))
                busy += use[w.rank]
            else:
                use[w.rank] = None
        if busy > IDLE_CPU:
            self._active_at = now
        self._cpu_use = use
        return use

    def _note_stopped(self, now: float) -> None:
        """When each local worker was first seen stopped (SIGSTOP, a debugger); resumed
        ones are forgotten."""
        for w in self.workers:
            if w.poll() is None and w.stopped():
                self._stopped_since.setdefault(w.rank, now)
            else:
                self._stopped_since.pop(w.rank, None)

    def _stalled(self, now: float, started: float, floors) -> bool:
        """True (after saying why) when the job made no progress for the stall limit."""
        cfg, coord = self.config, self.coordinator
        progress = coord.progress()
        limit = stall_limit(cfg.stall_timeout, floors, progress.iteration, progress.iteration_s)
        if limit is None:
            return False
        if self._stopped_since and cfg.stall_timeout is None and progress.iteration >= 0:
            # a stopped worker is a known cause: no need to wait out the floor meant for an
            # evaluation at the end of an epoch; the iterations' own pace sets the limit
            quick = max(STOPPED_FLOOR, STALL_MEDIANS * (progress.iteration_s or 0.0))
            since = min(self._stopped_since.values())
            if now - max(since, progress.last_change) > quick:
                ranks = sorted(self._stopped_since)
                self.output.say(
                    f"error: {_ranks(ranks)} {'is' if len(ranks) == 1 else 'are'} stopped "
                    f"(SIGSTOP or a debugger) and no iteration finished for {quick:g} s "
                    f"(max({STOPPED_FLOOR:g} s, {STALL_MEDIANS} x the median iteration time "
                    f"{progress.iteration_s or 0:.3g} s)); stopping the job (kill -CONT "
                    "resumes a stopped process; --stall-timeout SECONDS sets the limit)")
                return True
        if coord.registered == 0:
            # no mxlbbsp.DataLoader (or not yet): no iterations to watch; a job whose
            # workers all sit idle that long hangs (e.g. in ps-lite's finalize barrier).
            # CPU use is measured here for local workers and reported by the guards of
            # remote ones; none yet (the first second, or the remote guards of an older
            # mxlbbsp that do not report): nothing to measure
            idle = now - self._active_at
            if idle <= limit or not self._cpu_seen:
                return False
            self.output.say(
                f"error: no worker used any CPU for {idle:.0f} s and none reported an "
                f"iteration (limit {limit:g} s); the job seems to hang: a worker may wait in "
                f"ps-lite for one that failed or hangs; stopping the job "
                f"(--stall-timeout SECONDS sets the limit, off turns it off)")
            return True
        last = max(progress.last_change, started)
        if now - last <= limit:
            return False
        if cfg.stall_timeout is not None:
            why = "--stall-timeout"
        elif progress.iteration < 0:
            why = "the limit until the first iteration"
        else:
            why = (f"{STALL_MEDIANS} x the median iteration time "
                   f"{progress.iteration_s or 0:.3g} s, at least {floors[1]:g} s")
        finished = "none" if progress.iteration < 0 else str(progress.iteration)
        self.output.say(f"error: no iteration finished for {limit:g} s ({why}; last "
                        f"finished: {finished}); {self._who_hangs()}; stopping the job "
                        "(--stall-timeout SECONDS sets the limit, off turns it off)")
        return True

    def _who_hangs(self) -> str:
        """Which workers the job waits for, as far as the coordinator knows."""
        waiting = self.coordinator.waiting()
        stopped = [w.rank for w in self.workers if w.stopped()]
        note = f" ({_ranks(stopped)} stopped, e.g. SIGSTOP)" if stopped else ""
        its = "its" if len(list(waiting.ranks)) == 1 else "their"
        if waiting.what == "hello":
            return (f"{_ranks(waiting.ranks)} never registered with the coordinator ({its} "
                    f"mxlbbsp.DataLoader never started){note}")
        t = waiting.iteration
        if waiting.what == "report":
            return f"{_ranks(waiting.ranks)} never sent {its} report of iteration {t}{note}"
        return (f"every report of iteration {t} is in, but the push/pull of "
                f"{_ranks(waiting.ranks)} never finished (a worker, a server or the network "
                f"hangs){note}")

    def preflight(self, host) -> Optional[str]:
        """What is wrong with ``host`` for this job now (the transport's pre-flight), None if
        nothing."""
        return self.transport.check_host(host)

    def _host_answers(self, name: str) -> bool:
        """Whether ``name`` still passes the pre-flight (a few seconds at most)."""
        host = next((h for h in self.hosts if h.name == name), None)
        return host is not None and self.preflight(host) is None

    def _first_failure(self) -> Optional[int]:
        for p in self.workers + self.servers + [self.scheduler]:
            rc = p.poll()
            if rc == 0:
                p.release_error()
            if rc is None or rc == 0:
                continue
            rc = rc if rc > 0 else 128 - rc      # a transport killed by signal N: 128 + N
            what = p.via.explain(p, rc, self._host_answers)
            if what == _transport.RETRY:
                continue
            p.flush_early()
            where = f" on {p.host}" if p.via.remote else ""
            if what is None:
                p.drain_output(1.0)     # its exit hook's last line, if it wrote one
                what = f"exited with code {rc}{where}"
                killed = p.via.killed_by(p)
                if p.error_line:        # its own one-line refusal: the cause, said once
                    what = f"exited with code {rc}{where}: {p.error_line}"
                elif p.exit_reason:
                    what = f"exited with code {rc}{where}: {p.exit_reason}"
                elif p.signalled is not None:
                    what = f"was killed by {_killed_by(p.signalled, rc)}{where}"
                elif killed:
                    what = (f"exited with code {rc}{where}: its guard was killed ({killed}), "
                            "and the role with it")
            name = p.role if p.rank is None else f"{p.role} {p.rank}"
            self.reason = f"{name} {what}"
            others = len([q for q in self.procs if q is not p and q.poll() is None])
            self.output.say(f"error: {name} {what}; stopping the other {others} process(es) "
                            f"(its output is above{', and in ' + self.config.log_dir if self.config.log_dir else ''})")
            return rc
        return None

    def _finish(self, started: float) -> int:
        # The servers and the scheduler end once the workers have finalised; 10 s in all.
        deadline = time.monotonic() + 10.0
        for p in self.servers + [self.scheduler]:
            p.wait(max(0.0, deadline - time.monotonic()))
        elapsed = time.monotonic() - (self.since if self.since is not None else started)
        restarts = f" (the whole job, {self.attempt} restart(s))" if self.attempt else ""
        summary = self.coordinator.summary()
        if summary:
            share = summary["compute_share"]
            self.output.say(
                f"done in {elapsed:.1f} s{restarts}: {summary['iterations']} iterations after "
                f"the warm-up, "
                f"{summary['samples_per_s']:.1f} samples/s, workers waited "
                f"{100 * summary['wait_share']:.1f}% of the time"
                + (f", compute {100 * share:.0f}% of the iteration"
                   if share == share else "")
                + (f"; metrics in {self.config.metrics}" if self.config.metrics else "")
                + (f"; TensorBoard files in {self.config.tensorboard}"
                   if self.config.tensorboard else ""))
            for line in _metrics.diagnose(summary):
                self.output.say(f"note: {line}")
        else:
            self.output.say(f"done in {elapsed:.1f} s{restarts}")
        return 0

    def _print_progress(self, elapsed: float) -> None:
        p = self.coordinator.progress()
        if p.iteration < 0 and self.coordinator.registered == 0:
            # e.g. a plain MXNet kvstore script: say what is known
            running = sum(w.poll() is None for w in self.workers)
            use = self._cpu_use
            cpu = [use.get(w.rank) for w in self.workers if w.poll() is None]
            shown = ", ".join("?" if c is None else f"{100 * c:.0f}%" for c in cpu)
            if len(cpu) > 16:
                known = [c for c in cpu if c is not None]
                shown = f"{100 * sum(known) / max(len(known), 1):.0f}% on average"
            cpu_text = f", CPU {shown}" if cpu and any(c is not None for c in cpu) else ""
            self.output.say(f"{elapsed:.0f} s: {running} of {self.config.num_workers} workers "
                            f"running{cpu_text}; no iteration reported (no mxlbbsp.DataLoader, "
                            "or not started yet)")
            return
        if p.iteration < 0:
            self.output.say(f"{elapsed:.0f} s: waiting for the first iteration "
                            f"({self.coordinator.registered}/{self.config.num_workers} workers "
                            "registered)")
            return
        sizes = ",".join(map(str, p.sizes)) if len(p.sizes) <= 16 else f"{len(p.sizes)} workers"
        quiet = time.monotonic() - p.last_change
        if quiet > max(3 * (p.iteration_s or 0.0), 2.0):
            # nothing advances: no stale samples/s; a stopped worker is named at once
            stopped = sorted(getattr(self, "_stopped_since", {}))
            why = f" ({_ranks(stopped)} stopped, e.g. SIGSTOP)" if stopped else ""
            self.output.say(f"{elapsed:.0f} s: iteration {p.iteration}, no iteration finished "
                            f"for {quiet:.0f} s{why}, batch sizes {sizes}")
            return
        self.output.say(f"{elapsed:.0f} s: iteration {p.iteration}, {p.samples_per_s:.1f} "
                        f"samples/s, batch sizes {sizes}")

    def _heartbeat(self, interval: float) -> None:
        """Until the teardown: an empty line to every remote guard every ``interval`` s."""
        while not self._stopped.wait(interval):
            for p in self.servers + self.workers:
                p.beat()

    def _teardown(self) -> None:
        self._stopped.set()
        procs = [p for p in self.procs if p.proc is not None]
        if procs:
            stop_all(procs, grace=3.0)
        self.transport.cleanup()
        if self.coordinator is not None:
            self.coordinator.stop()


# ---- restarts from checkpoints -----------------------------------------------------------

#: exit codes that a restart cannot help: bad input, Ctrl-C, SIGTERM
NO_RESTART = (0, EXIT_CONFIG, 130, 143)


def _reachable(job: Job) -> tuple:
    """(hosts that pass the pre-flight, one reason per host that does not)."""
    results = {}
    for h in job.transport.distinct(job.hosts):
        results[h.name] = job.preflight(h)
    ok = [h for h in job.hosts if not results.get(h.name)]
    return ok, [f"{name} unreachable" for name, r in results.items() if r]


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
                   f"normally after iteration {manifest['iteration']}; to train again from "
                   "scratch, give another --checkpoint-dir")
    return 0


def run_job(config: LaunchConfig) -> int:
    """Run the job; with ``--restarts N``, start it again from the latest checkpoint after a
    failure, up to N times, printing what happened and why."""
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
        hosts, dropped = None, []
        config.num_workers = requested
        config.resume = None               # the newest checkpoint is in --checkpoint-dir
        hosts, dropped = _reachable(job)        # hosts may be gone: leave them out
        if not hosts:
            job.output.say("no restart: no host passes the pre-flight "
                           f"({'; '.join(dropped)})")
            return rc
        slots = sum(h.slots for h in hosts)
        config.num_workers = min(requested or slots, slots)
        n = config.num_workers
        why = "; ".join(dropped) or job.reason or f"exit code {rc}"
        iteration = _store.read_manifest(latest)["iteration"] + 1
        job.output.say(f"restart {attempt}/{config.restarts} from iteration {iteration} on "
                       f"{n} worker(s) ({why})")
        job = Job(config, output=job.output, hosts=hosts)
        job.since, job.attempt = since, attempt
        rc = job.run()
    return rc
