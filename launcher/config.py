"""LaunchConfig: everything `mxlbbsp launch` was asked to do, as one validated value.

Configuration flows one way: CLI options -> :class:`LaunchConfig` -> the
:class:`~mxlbbsp.launcher.job.Job` that runs it. Constructing it checks the values alone
(``__post_init__``, a few named checks, each raising :class:`ConfigError` with a one-line
message that says what to do); what needs the machine (the hostfile, the output folders and
their write probes, tensorboardX, --ssh-identity's file, --ps-interface's addresses, the
discovery script, the checkpoint to resume) is :meth:`LaunchConfig.preflight`'s, called once
by the CLI before anything starts. After it the value is not changed: a job sizes its own
copy (:meth:`LaunchConfig.for_workers`), and :meth:`LaunchConfig.coordinator_config` is its
one translation into the coordinator's configuration. The Python API builds the same
dataclass.

(Long, on purpose: one dataclass and its checks, each a few lines that name the option and
what to do; split, they would only be read together.)
"""
from __future__ import annotations

import copy
import dataclasses
import errno
import math
import os
import re
import socket
import tempfile
from typing import Dict, List, Optional, Tuple

from mxlbbsp import modes, predictors
from mxlbbsp.control.config import CONTROL_PERIOD, CoordinatorConfig
from mxlbbsp.control.speed import TIME_MODELS
from mxlbbsp.core import env as _env
from mxlbbsp.core import signals
from mxlbbsp.core import store as _store
from mxlbbsp.core.planner import launch_clock
from mxlbbsp.core.slowdown import Schedule, SlowdownError
from mxlbbsp.core.slowdown import parse as parse_slowdown

from .errors import ConfigError
from .guard import command_problem
from .hostfile import MAX_WORKERS, Host, parse_hosts

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: --emulate-compute's most (ms per sample): a minute, already hours per iteration
MAX_SAMPLE_MS = 60_000.0
#: --relay: a relay per host of two or more workers (on), every worker on its own (off), or
#: relays from RELAY_FROM workers up (auto)
RELAY_CHOICES = ("auto", "on", "off")
#: --relay auto starts relays for jobs of this many workers or more: below, the extra hop
#: costs latency (16 workers: +0.3 ms end to end), from 64 none, and the coordinator's CPU
#: per iteration halves (benchmarks/results/coordinator_scale_relays_vs_direct.md)
RELAY_FROM = 64
#: --hubs: the hosts' relays reach the coordinator through hubs (mxlbbsp.relay.hub, on this
#: machine, RELAYS_PER_HUB relays each) (on), directly (off), or through hubs from HUB_FROM
#: relays up (auto): at 1024 workers, 8 to a host, the coordinator's CPU per iteration is
#: less than half with hubs, at 256 (32 relays) 0.65x and its p99 latency 0.7-0.9x, the
#: relay-to-relay latency the same (the hop costs what the coordinator saves)
#: (benchmarks/results/coordinator_scale_baseline_a697d22.md)
HUB_CHOICES = ("auto", "on", "off")
HUB_FROM = 32
#: the hosts' relays per hub
RELAYS_PER_HUB = 8


def _cwd() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise ConfigError("the current folder no longer exists; cd to the folder to launch "
                          "from") from None


def parse_env(items) -> Dict[str, str]:
    """``--env KEY=VALUE`` items as a dict."""
    env = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE with KEY a variable name, "
                              "e.g. --env MXNET_ENGINE_TYPE=NaiveEngine")
        if key in _env.RESERVED:
            option = _env.RESERVED[key]
            instead = f"; use {option} instead" if option else ""
            raise ConfigError(
                f"--env {key}: reserved, mxlbbsp sets it for the job's processes itself{instead} "
                f"(reserved: {', '.join(sorted(_env.RESERVED))})")
        env[key] = value
    return env


def _finite(value, option: str, meaning: str) -> None:
    """nan and inf parse as floats but mean nothing for a duration or a count."""
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{option} {value}: must be a finite number ({meaning})")


def interface_addresses(name: str) -> List[str]:
    """The IPv4 addresses of network interface ``name`` on this host (ConfigError if none)."""
    import psutil

    interfaces = psutil.net_if_addrs()
    if name not in interfaces:
        raise ConfigError(f"--ps-interface {name!r}: no such network interface on this host; "
                          f"choose one of {', '.join(sorted(interfaces))} (it must exist on "
                          "every host of the job)")
    addresses = [a.address for a in interfaces[name] if a.family == socket.AF_INET]
    if not addresses:
        raise ConfigError(f"--ps-interface {name!r} has no IPv4 address on this host, and "
                          "ps-lite binds to an interface's IPv4 address; choose another")
    return addresses


def _probe_space(path: str, what: str) -> None:
    """A file system with no free block fails the first write: refuse it now."""
    try:
        st = os.statvfs(path)
    except OSError:
        return
    if st.f_blocks and st.f_bavail == 0:
        raise ConfigError(f"{what}: the file system of {path!r} is full; free some space or "
                          "choose another place")


def check_output_file(path: str, what: str) -> None:
    """``path`` can be created or appended to, and written (without touching its content)."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise ConfigError(f"{what} {path!r}: folder {parent!r} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path!r} is a folder; give a file name, e.g. "
                          f"{os.path.join(path, 'metrics.jsonl')}")
    existed = os.path.exists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise ConfigError(f"{what} {path!r}: cannot write there ({exc.strerror}); choose "
                          "another path") from None
    try:
        if not os.path.isfile(path):
            # a device (e.g. /dev/full): one probe byte shows whether it takes writes
            try:
                os.write(fd, b"\n")
            except OSError as exc:
                raise ConfigError(f"{what} {path!r}: cannot write there ({exc.strerror}); "
                                  "choose another path") from None
    finally:
        os.close(fd)
        if not existed:
            os.unlink(path)
    if not existed or os.path.isfile(path):
        _probe_space(parent, f"{what} {path!r}")


def check_output_dir(path: str, what: str, create: bool) -> None:
    """``path`` is (or can be made) a folder where files can be created."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what} {path!r} exists and is not a folder")
    if not os.path.isdir(path):
        if not create:        # --dry-run creates nothing: the nearest existing folder decides
            parent = os.path.abspath(path)
            while not os.path.isdir(parent):
                parent = os.path.dirname(parent)
            try:            # a folder made and removed: access() says yes to root in /proc
                os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".mxlbbsp-probe-"))
            except OSError as exc:
                raise ConfigError(f"{what} {path!r}: cannot create the folder in {parent!r} "
                                  f"({exc.strerror}); choose another") from None
            return
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{what} {path!r}: cannot create the folder ({exc.strerror}); "
                              "choose another") from None
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".mxlbbsp-probe-") as fh:
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        hint = "free some space or choose another" if exc.errno == errno.ENOSPC else \
            "choose another"
        raise ConfigError(f"{what} {path!r}: cannot write there ({exc.strerror}); "
                          f"{hint}") from None
    _probe_space(path, f"{what} {path!r}")


def parse_ssh_options(items) -> List[Tuple[str, str]]:
    """``--ssh-option KEY=VALUE`` items as (key, value) pairs for ``ssh -o``."""
    out = []
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key or not re.match(r"^[A-Za-z][A-Za-z0-9]*$", key):
            raise ConfigError(f"--ssh-option {item!r}: expected KEY=VALUE as in ssh_config, "
                              "e.g. --ssh-option StrictHostKeyChecking=no")
        out.append((key, value))
    return out


_COORDINATOR = CoordinatorConfig.__dataclass_fields__


@dataclasses.dataclass
class LaunchConfig:
    """One job. See ``mxlbbsp launch --help`` for the meaning of each field."""

    command: List[str]
    num_workers: Optional[int] = None         # None: one per slot (hostfile, allocation)
    num_servers: int = 1
    hostfile: Optional[str] = None
    # the coordinator's settings: their defaults are the coordinator's, written once there
    sync: str = _COORDINATOR["sync"].default
    predictor: str = _COORDINATOR["predictor"].default
    time_model: str = _COORDINATOR["time_model"].default
    exog: str = "auto"                        # the predictor's inputs (--exog)
    signals: str = "auto"                     # what the workers read besides (--signals)
    threshold: float = _COORDINATOR["threshold"].default
    control_period: float = CONTROL_PERIOD
    max_batch_size: Optional[int] = None
    min_batch_size: Optional[int] = None      # None: auto (coordinator.auto_min_batch)
    tensorboard: Optional[str] = None         # folder for TensorBoard event files
    emulate_slowdown: Optional[str] = None
    emulate_compute: Optional[float] = None   # ms of emulated compute per sample
    metrics: Optional[str] = None
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    log_dir: Optional[str] = None
    progress: float = 10.0
    stall_timeout: Optional[float] = None     # None: automatic; 0: off (see watch.stall_limit)
    start_timeout: float = 120.0
    bind: Optional[str] = None
    ps_interface: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity: Optional[str] = None
    ssh_options: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    remote_python: Optional[str] = None
    dry_run: bool = False
    #: the sync modes' own options given, by flag (``{"--deadline": "15m"}``): each mode
    #: declares them (``SyncMode.options``); not given means the mode's default
    mode_options: Dict[str, object] = dataclasses.field(default_factory=dict)
    # checkpoints (mxlbbsp.core.store): periodic, resume, restarts
    checkpoint_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None
    resume: Optional[str] = None
    restarts: int = 0
    launcher: Optional[str] = None            # local | ssh | slurm; None: detected
    # elastic membership (launcher/elastic.py): the hosts come from a discovery script (or
    # the SLURM allocation), polled every discovery_interval s; the job resizes between
    # min_workers and max_workers
    host_discovery_script: Optional[str] = None
    min_workers: Optional[int] = None
    max_workers: Optional[int] = None
    discovery_interval: float = 3.0
    #: a resize starts the next generation while the current one trains, and moves to it
    #: at a boundary once it is ready (launcher/elastic.py); off: after the boundary
    start_ahead: bool = True
    #: on: a relay (mxlbbsp.relay) on every host with two or more workers; off: none; auto:
    #: on from RELAY_FROM workers
    relay: str = "auto"
    #: on: the relays reach the coordinator through hubs (mxlbbsp.relay.hub); off: directly;
    #: auto: through hubs from HUB_FROM relays
    hubs: str = "auto"
    cwd: str = dataclasses.field(default_factory=_cwd)
    #: per-rank slowdown schedules, for the job's number of workers (:meth:`for_workers`)
    slowdown: List[Schedule] = dataclasses.field(default_factory=list, repr=False)
    #: the report fields the predictor sees, from ``exog`` by validation
    exog_columns: tuple = dataclasses.field(default=(), repr=False)
    #: the report columns every worker reads (--signals and --exog), by validation
    signal_columns: tuple = dataclasses.field(default=(), repr=False)
    #: the hosts of -H (a hostfile or an inline list), read by :meth:`preflight`; [] without -H
    hosts: List[Host] = dataclasses.field(default_factory=list, repr=False)

    def __post_init__(self):
        """Checks of the values alone, each raising ConfigError with the option and what to
        do. Nothing here touches the machine (files, folders, network interfaces, optional
        packages): that is :meth:`preflight`'s, once, before anything starts."""
        self.command = list(self.command or [])
        self.mode_options = {k: v for k, v in self.mode_options.items() if v is not None}
        self._check_processes()
        self._check_ssh()
        self._check_sync_mode()
        self._check_balancing()
        self._check_emulation()
        self._check_batch_bounds()
        self._check_timeouts()
        if self.bind is not None and not self.bind.strip():
            raise ConfigError("--bind needs an address this machine listens on")
        self._check_elastic()
        if self.num_workers is not None:
            self.check_workers(self.num_workers)
        self._check_checkpoints()

    def _check_processes(self) -> None:
        """The command, the numbers of workers and servers, the relays and hubs."""
        if self.relay not in RELAY_CHOICES:
            raise ConfigError(f"--relay {self.relay!r}: choose one of {', '.join(RELAY_CHOICES)}")
        if self.hubs not in HUB_CHOICES:
            raise ConfigError(f"--hubs {self.hubs!r}: choose one of {', '.join(HUB_CHOICES)}")
        if self.hubs == "on" and self.relay == "off":
            raise ConfigError("--hubs on carries the relays' messages, and --relay off starts "
                              "none: give --relay on (or auto), or leave --hubs out")
        if not self.command:
            raise ConfigError("missing the command to run: put it after --, e.g. "
                              "mxlbbsp launch -n 2 -- python train.py")
        # no -n: one worker per slot of the hostfile or the SLURM allocation; without either
        # the local transport asks for -n (see job.choose_transport)
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError(f"-n/--num-workers must be at least 1 (got {self.num_workers})")
        if self.num_workers is not None and self.num_workers > MAX_WORKERS:
            raise ConfigError(f"-n/--num-workers {self.num_workers}: at most {MAX_WORKERS} "
                              "workers")
        if self.num_servers < 1:
            raise ConfigError(f"-s/--num-servers must be at least 1 (got {self.num_servers})")
        if self.num_servers > MAX_WORKERS:
            raise ConfigError(f"-s/--num-servers {self.num_servers}: at most {MAX_WORKERS} "
                              "servers")

    def _check_sync_mode(self) -> None:
        """--sync and the modes' own options: known, the chosen mode's, and consistent."""
        if self.sync not in modes.available():
            raise ConfigError(f"--sync {self.sync!r}: choose one of {', '.join(modes.available())}")
        known = modes.all_options()
        unknown = [flag for flag in self.mode_options if flag not in known]
        if unknown:
            raise ConfigError(f"{unknown[0]}: not an option of any sync mode")
        mine = {opt.flag for opt in modes.get(self.sync).options}
        for name in modes.available():          # another mode's options: say whose
            given = [opt.flag for opt in modes.get(name).options
                     if opt.flag in self.mode_options and opt.flag not in mine]
            if name != self.sync and given:
                raise ConfigError(modes.get(name).misplaced(given, self.sync))
        problem = modes.get(self.sync).check_options(self.sync_options)
        if problem:
            raise ConfigError(problem)

    def _check_balancing(self) -> None:
        """The predictor, the time model, their inputs and the threshold."""
        if self.predictor not in predictors.available():
            raise ConfigError(f"--predictor {self.predictor!r}: choose one of "
                              f"{', '.join(predictors.available())}")
        if self.time_model not in TIME_MODELS:
            raise ConfigError(f"--time-model {self.time_model!r}: choose one of "
                              f"{', '.join(TIME_MODELS)}")
        try:
            self.exog_columns = signals.parse_exog(self.exog)
            self.signal_columns = signals.parse_signals(self.signals, self.exog_columns)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not 0 <= self.threshold < 1:
            raise ConfigError(f"--threshold {self.threshold}: must be in [0, 1), e.g. 0.03 "
                              "(keep the split unless the gain is 3% or more)")
        if not 0 <= self.control_period <= 60:
            raise ConfigError(f"--control-period {self.control_period}: must be between 0 and "
                              f"60 seconds, e.g. {CONTROL_PERIOD} (0: a decision every "
                              "iteration)")
        if self.predictor == "oracle" and not self.emulate_slowdown:
            raise ConfigError("--predictor oracle knows the emulated slowdowns, so it needs "
                              "--emulate-slowdown")

    def _check_emulation(self) -> None:
        """--emulate-compute (the slowdown's spec needs the number of workers: see
        :meth:`for_workers`)."""
        if self.emulate_compute is not None and not self.emulate_compute >= 0:
            raise ConfigError(f"--emulate-compute {self.emulate_compute}: must be >= 0 ms per "
                              "sample")
        _finite(self.emulate_compute, "--emulate-compute", "milliseconds per sample")
        if self.emulate_compute is not None and self.emulate_compute > MAX_SAMPLE_MS:
            raise ConfigError(f"--emulate-compute {self.emulate_compute:g}: at most "
                              f"{MAX_SAMPLE_MS:g} ms (a minute) of emulated compute per sample")

    def _check_batch_bounds(self) -> None:
        """--min-batch-size and --max-batch-size: at least 1, in order."""
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ConfigError(f"--max-batch-size must be at least 1 (got {self.max_batch_size})")
        if self.min_batch_size is not None and self.min_batch_size < 1:
            raise ConfigError(f"--min-batch-size must be at least 1 (got {self.min_batch_size})")
        if self.min_batch_size is not None and self.max_batch_size is not None \
                and self.min_batch_size > self.max_batch_size:
            raise ConfigError(f"--min-batch-size {self.min_batch_size} is above --max-batch-size "
                              f"{self.max_batch_size}; give a minimum <= the maximum")

    def _check_timeouts(self) -> None:
        """--progress, --stall-timeout and --start-timeout: finite, not negative."""
        _finite(self.progress, "--progress", "seconds between progress lines, 0 for none")
        _finite(self.stall_timeout, "--stall-timeout", "seconds")
        _finite(self.start_timeout, "--start-timeout", "seconds")
        if self.progress < 0:
            raise ConfigError("--progress must be >= 0 seconds (0 turns progress lines off)")
        if self.stall_timeout is not None and not 0 <= self.stall_timeout < float("inf"):
            raise ConfigError(f"--stall-timeout {self.stall_timeout}: must be >= 0 seconds "
                              "(0 or off turns stall detection off)")
        if self.start_timeout <= 0:
            raise ConfigError("--start-timeout must be a positive number of seconds")

    def _check_ssh(self) -> None:
        """The SSH options need hosts to go to, and --ssh-port a port (the hostfile and
        --ssh-identity's file are preflight's)."""
        if self.hostfile is None and self.host_discovery_script is None:
            given = [flag for flag, value in (
                ("--ssh-port", self.ssh_port), ("--ssh-identity", self.ssh_identity),
                ("--ssh-option", self.ssh_options), ("--remote-python", self.remote_python))
                if value]
            if given:
                raise ConfigError(f"{', '.join(given)} without -H: without hosts everything "
                                  "runs on this machine, no SSH; give the hosts with -H "
                                  "(a hostfile or host1:slots,host2:slots)")
        if self.ssh_port is not None and not 0 < self.ssh_port < 65536:
            raise ConfigError(f"--ssh-port {self.ssh_port}: must be in 1..65535")

    def preflight(self) -> None:
        """What only this machine can tell, checked once before anything starts (ConfigError,
        the same one line as every check): the hostfile is read into ``hosts``; --tensorboard
        needs tensorboardX; --ssh-identity and --host-discovery-script must be files (the
        script executable); --metrics, --log-dir, --tensorboard and --checkpoint-dir must
        take writes (the folders are made here, except with --dry-run, which creates
        nothing); --ps-interface must have an IPv4 address here (--bind one of them);
        --resume must hold a checkpoint; and with -n, --emulate-slowdown (a CSV trace is a
        file) must fit that many workers."""
        if self.hostfile is not None:
            self.hosts = parse_hosts(self.hostfile)
            slots = sum(h.slots for h in self.hosts)
            if self.num_workers is None and slots > MAX_WORKERS:
                raise ConfigError(f"-H {self.hostfile}: {slots} slots in all, at most "
                                  f"{MAX_WORKERS} workers; give -n N")
        create = not self.dry_run
        if self.tensorboard is not None:
            try:
                import tensorboardX  # noqa: F401
            except ImportError:
                raise ConfigError("--tensorboard needs tensorboardX: pip install "
                                  "tensorboardX (see requirements.txt)") from None
            check_output_dir(self.tensorboard, "--tensorboard", create=create)
        if self.ssh_identity is not None and not os.path.isfile(self.ssh_identity):
            raise ConfigError(f"--ssh-identity {self.ssh_identity!r}: no such file")
        if self.metrics:
            check_output_file(self.metrics, "--metrics")
        if self.log_dir:
            check_output_dir(self.log_dir, "--log-dir", create=create)
        if self.ps_interface is not None:
            addresses = interface_addresses(self.ps_interface)
            if self.bind is not None and self.bind not in addresses:
                raise ConfigError(f"--bind {self.bind} is not an address of --ps-interface "
                                  f"{self.ps_interface} ({', '.join(addresses)}); drop --bind "
                                  "(the interface's address is the default) or give one of those")
        script = self.host_discovery_script
        if script is not None:
            full = os.path.join(self.cwd, script)
            if not os.path.isfile(full):
                raise ConfigError(f"--host-discovery-script {script!r}: no such file")
            if not os.access(full, os.X_OK):
                raise ConfigError(f"--host-discovery-script {script!r} is not executable; "
                                  f"chmod +x {script}")
            self.host_discovery_script = os.path.abspath(full)
        if self.checkpoint_dir:
            check_output_dir(self.checkpoint_dir, "--checkpoint-dir", create=create)
        if self.resume is not None and _store.latest(self.resume) is None:
            what = "does not exist" if not os.path.isdir(self.resume) else (
                "is empty" if not os.listdir(self.resume) else
                "holds no complete mxlbbsp checkpoint (ckpt-NNNNNNNN/manifest.json)")
            raise ConfigError(f"--resume {self.resume}: the folder {what}; give a folder "
                              "written with --checkpoint-dir, or one of its ckpt-* folders")
        if self.num_workers is not None:
            self._slowdown(self.num_workers)

    @property
    def recovers(self) -> bool:
        """Whether a failure costs no finished iteration (an elastic job): every worker
        keeps its last finished iteration's state, which a survivor saves when another
        fails (mxlbbsp/worker/snapshot.py)."""
        return bool(self.checkpoint_dir) and self.elastic

    @property
    def elastic(self) -> bool:
        """Whether the job resizes as hosts come and go: a discovery script, or bounds on
        the workers inside a SLURM allocation (whose nodes are then the hosts)."""
        return self.host_discovery_script is not None or (
            self.min_workers is not None or self.max_workers is not None)

    def _check_elastic(self) -> None:
        """An elastic job's hosts, bounds and checkpoints (the script's file is preflight's)."""
        if not self.elastic:
            return
        script = self.host_discovery_script
        if script is None and self.launcher != "slurm" and not _env.in_slurm_allocation():
            raise ConfigError("--min-workers/--max-workers make a job elastic over the hosts "
                              "of --host-discovery-script (or of a SLURM allocation): give the "
                              "script, e.g. --host-discovery-script ./hosts.sh")
        if script is not None and self.hostfile is not None:
            raise ConfigError("-H and --host-discovery-script both give the hosts: give one "
                              "(the script's hosts change while the job runs)")
        if self.num_workers is not None:
            raise ConfigError("-n with an elastic job: the job takes every slot its hosts "
                              "have, between --min-workers and --max-workers; give those "
                              "instead")
        low, high = self.min_workers, self.max_workers
        for flag, value in (("--min-workers", low), ("--max-workers", high)):
            if value is not None and not 1 <= value <= MAX_WORKERS:
                raise ConfigError(f"{flag} {value}: must be in 1..{MAX_WORKERS}")
        if low is not None and high is not None and low > high:
            raise ConfigError(f"--min-workers {low} is above --max-workers {high}; give a "
                              "minimum <= the maximum")
        _finite(self.discovery_interval, "--discovery-interval", "seconds")
        if not self.discovery_interval > 0:
            raise ConfigError(f"--discovery-interval {self.discovery_interval:g}: must be a "
                              "positive number of seconds")
        if not self.checkpoint_dir:
            raise ConfigError("an elastic job resizes through checkpoints: give "
                              "--checkpoint-dir DIR (on a file system that this machine and "
                              "every host's rank 0 share)")

    @property
    def sync_options(self) -> dict:
        """The options of the sync mode (for its coordinator policy); None: its default."""
        return {opt.key: self.mode_options.get(opt.flag)
                for opt in modes.get(self.sync).options}

    def check_workers(self, num_workers: int) -> None:
        """The sync mode's options against the number of workers (known late with a
        hostfile)."""
        problem = modes.get(self.sync).check_workers(self.sync_options, num_workers)
        if problem:
            raise ConfigError(problem)

    def _check_checkpoints(self) -> None:
        """--checkpoint-dir, --checkpoint-every, --restarts and --resume: their needs."""
        if self.checkpoint_every is not None and not self.checkpoint_dir:
            raise ConfigError("--checkpoint-every needs --checkpoint-dir DIR (where to write)")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ConfigError(f"--checkpoint-every {self.checkpoint_every}: must be at least 1 "
                              "iteration")
        if self.restarts < 0:
            raise ConfigError(f"--restarts {self.restarts}: must be >= 0")
        if self.restarts and not self.checkpoint_dir:
            raise ConfigError("--restarts needs --checkpoint-dir DIR: a restart continues from "
                              "the latest checkpoint written there")
        if (self.checkpoint_dir or self.resume) and not modes.get(self.sync).checkpoints:
            able = ", ".join(m for m in modes.available() if modes.get(m).checkpoints)
            raise ConfigError(f"--sync {self.sync} cannot checkpoint yet (asp and r2sp update "
                              "on the servers, whose optimizer state cannot be saved; courier's "
                              f"plan is not saved); checkpoints need --sync {able}")
        # relative to the launch's folder (a string's work: the folders are preflight's)
        if self.checkpoint_dir:
            self.checkpoint_dir = os.path.abspath(os.path.join(self.cwd, self.checkpoint_dir))
            if self.checkpoint_every is None:
                self.checkpoint_every = 100
        if self.resume is not None:
            self.resume = os.path.abspath(os.path.join(self.cwd, self.resume))

    def resume_from(self) -> Optional[str]:
        """The checkpoint this launch starts from: the newest in --resume, else the newest in
        --checkpoint-dir (automatic resume), else None."""

        if self.resume:
            return _store.latest(self.resume)
        if self.checkpoint_dir:
            return _store.latest(self.checkpoint_dir)
        return None

    def coordinator_config(self, token: str, host: str, sock=None, manifest=None,
                           state=None) -> CoordinatorConfig:
        """The coordinator's configuration for this job (its one translation): ``host`` to
        listen on (or ``sock``, listening already), and when resuming the checkpoint's
        ``manifest`` and the coordinator ``state`` saved in it."""
        return CoordinatorConfig(
            num_workers=self.num_workers, token=token, sync=self.sync,
            predictor=self.predictor, time_model=self.time_model, threshold=self.threshold,
            control_period=self.control_period, exog=self.exog_columns, max_batch_size=self.max_batch_size,
            min_batch_size=self.min_batch_size, tensorboard=self.tensorboard,
            metrics=self.metrics, host=host, sock=sock, slowdown=self.slowdown,
            sync_options=self.sync_options,
            started=launch_clock(),      # the deadline counts from the launch
            checkpoint_dir=self.checkpoint_dir, checkpoint_every=self.checkpoint_every or 0,
            resume_manifest=manifest, resume_state=state)

    def for_workers(self, num_workers: int) -> "LaunchConfig":
        """This configuration for a job of ``num_workers`` (known once its hosts are): a copy,
        with the sync mode's options checked against that number and --emulate-slowdown
        resolved for it. The launch's own value never changes: each restart and each
        generation of an elastic job sizes its own copy. (A copy, not dataclasses.replace:
        replace would check the whole value again, and an elastic launch refuses a given
        number of workers, which this one is not.)"""
        slowdown = self._slowdown(num_workers)
        self.check_workers(num_workers)
        sized = copy.copy(self)
        sized.num_workers, sized.slowdown = num_workers, slowdown
        return sized

    def _slowdown(self, num_workers: int) -> List[Schedule]:
        """--emulate-slowdown for ``num_workers`` (a CSV trace is read)."""
        if not self.emulate_slowdown:
            return [Schedule() for _ in range(num_workers)]
        try:
            slowdown = parse_slowdown(self.emulate_slowdown, num_workers)
        except SlowdownError as exc:
            raise ConfigError(str(exc)) from None
        if self.predictor == "oracle" and any(s.timed for s in slowdown):
            raise ConfigError("--predictor oracle reads the slowdown ahead by iteration; give "
                              "a trace with an iteration column, not time_s")
        return slowdown

    def check_command_locally(self) -> None:
        """The command must exist here, be executable, and (``python SCRIPT``) have its
        script, when the workers run here: the guard's own check, before anything starts."""
        problem = command_problem(self.command, self.cwd,
                                  self.env.get("PATH", os.environ.get("PATH")))
        if problem:
            raise ConfigError(f"{problem} (in {self.cwd})")
