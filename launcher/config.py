"""LaunchConfig: everything `mxlbbsp launch` was asked to do, validated in one place.

Configuration flows one way: CLI options -> :class:`LaunchConfig` (``__post_init__`` checks
it and raises :class:`ConfigError` with a one-line message that says what to do) -> the
:class:`~mxlbbsp.launcher.job.Job` that runs it. The Python API builds the same dataclass.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
from typing import Dict, List, Optional, Tuple

from mxlbbsp import _env, predictors
from mxlbbsp.coordinator import TIME_MODELS
from mxlbbsp.slowdown import Schedule, SlowdownError, parse as parse_slowdown

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """Bad input to the launcher: reported as one line, exit code 2."""


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
        env[key] = value
    return env


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


@dataclasses.dataclass
class LaunchConfig:
    """One job. See ``mxlbbsp launch --help`` for the meaning of each field."""

    command: List[str]
    num_workers: Optional[int] = None         # None: one per hostfile slot
    num_servers: int = 1
    hostfile: Optional[str] = None
    sync: str = "lbbsp"
    predictor: str = "narx"
    time_model: str = "linear"
    threshold: float = 0.03
    max_batch_size: Optional[int] = None
    emulate_slowdown: Optional[str] = None
    emulate_compute: Optional[float] = None   # ms of emulated compute per sample
    metrics: Optional[str] = None
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    log_dir: Optional[str] = None
    progress: float = 10.0
    stall_timeout: Optional[float] = None
    start_timeout: float = 120.0
    bind: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity: Optional[str] = None
    ssh_options: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    remote_python: Optional[str] = None
    dry_run: bool = False
    # checkpoints (mxlbbsp.checkpoint): periodic, resume, restarts
    checkpoint_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None
    resume: Optional[str] = None
    restarts: int = 0
    cwd: str = dataclasses.field(default_factory=_cwd)
    #: per-rank slowdown schedules, filled in by validation
    slowdown: List[Schedule] = dataclasses.field(default_factory=list, repr=False)

    def __post_init__(self):
        self.command = list(self.command or [])
        if not self.command:
            raise ConfigError("missing the command to run: put it after --, e.g. "
                              "mxlbbsp launch -n 2 -- python train.py")
        if self.hostfile is None and self.num_workers is None:
            raise ConfigError("how many workers? give -n/--num-workers (or a hostfile with -H)")
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError(f"-n/--num-workers must be at least 1 (got {self.num_workers})")
        if self.num_servers < 1:
            raise ConfigError(f"-s/--num-servers must be at least 1 (got {self.num_servers})")
        if self.sync not in _env.SYNC_MODES:
            raise ConfigError(f"--sync {self.sync!r}: choose one of {', '.join(_env.SYNC_MODES)}")
        if self.predictor not in predictors.available():
            raise ConfigError(f"--predictor {self.predictor!r}: choose one of "
                              f"{', '.join(predictors.available())}")
        if self.time_model not in TIME_MODELS:
            raise ConfigError(f"--time-model {self.time_model!r}: choose one of "
                              f"{', '.join(TIME_MODELS)}")
        if not 0 <= self.threshold < 1:
            raise ConfigError(f"--threshold {self.threshold}: must be in [0, 1), e.g. 0.03 "
                              "(keep the split unless the gain is 3% or more)")
        if self.predictor == "oracle" and not self.emulate_slowdown:
            raise ConfigError("--predictor oracle knows the emulated slowdowns, so it needs "
                              "--emulate-slowdown")
        if self.emulate_compute is not None and not self.emulate_compute >= 0:
            raise ConfigError(f"--emulate-compute {self.emulate_compute}: must be >= 0 ms per "
                              "sample")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ConfigError(f"--max-batch-size must be at least 1 (got {self.max_batch_size})")
        if self.progress < 0:
            raise ConfigError("--progress must be >= 0 seconds (0 turns progress lines off)")
        if self.stall_timeout is not None and self.stall_timeout <= 0:
            raise ConfigError("--stall-timeout must be a positive number of seconds")
        if self.start_timeout <= 0:
            raise ConfigError("--start-timeout must be a positive number of seconds")
        if self.ssh_port is not None and not 0 < self.ssh_port < 65536:
            raise ConfigError(f"--ssh-port {self.ssh_port}: must be in 1..65535")
        if self.ssh_identity is not None and not os.path.isfile(self.ssh_identity):
            raise ConfigError(f"--ssh-identity {self.ssh_identity!r}: no such file")
        if self.hostfile is not None and not os.path.isfile(self.hostfile):
            raise ConfigError(f"-H/--hostfile {self.hostfile!r}: no such file")
        for path, what in ((self.metrics, "--metrics"),):
            if path:
                parent = os.path.dirname(os.path.abspath(path)) or "."
                if not os.path.isdir(parent):
                    raise ConfigError(f"{what} {path!r}: folder {parent!r} does not exist")
                if os.path.isdir(path):
                    raise ConfigError(f"{what} {path!r} is a folder; give a file name, e.g. "
                                      f"{os.path.join(path, 'metrics.jsonl')}")
        if self.log_dir and os.path.exists(self.log_dir) and not os.path.isdir(self.log_dir):
            raise ConfigError(f"--log-dir {self.log_dir!r} exists and is not a folder")
        if self.bind is not None and not self.bind.strip():
            raise ConfigError("--bind needs an address this machine listens on")
        self._check_checkpoints()
        if self.num_workers is not None:
            self.resolve_slowdown(self.num_workers)

    def _check_checkpoints(self) -> None:
        from mxlbbsp import checkpoint
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
        if (self.checkpoint_dir or self.resume) and self.sync in _env.ASYNC_MODES:
            raise ConfigError(f"--sync {self.sync} updates on the servers, whose optimizer "
                              "state cannot be saved; checkpoints need --sync lbbsp or bsp")
        if self.checkpoint_dir:
            self.checkpoint_dir = os.path.abspath(os.path.join(self.cwd, self.checkpoint_dir))
            if os.path.exists(self.checkpoint_dir) and not os.path.isdir(self.checkpoint_dir):
                raise ConfigError(f"--checkpoint-dir {self.checkpoint_dir!r} exists and is not "
                                  "a folder")
            if self.checkpoint_every is None:
                self.checkpoint_every = 100
        if self.resume is not None:
            self.resume = os.path.abspath(os.path.join(self.cwd, self.resume))
            if checkpoint.latest(self.resume) is None:
                what = "does not exist" if not os.path.isdir(self.resume) else (
                    "is empty" if not os.listdir(self.resume) else
                    "holds no complete mxlbbsp checkpoint (ckpt-NNNNNNNN/manifest.json)")
                raise ConfigError(f"--resume {self.resume}: the folder {what}; give a folder "
                                  "written with --checkpoint-dir, or one of its ckpt-* folders")

    def resume_from(self) -> Optional[str]:
        """The checkpoint this launch starts from: the newest in --resume, else the newest in
        --checkpoint-dir (automatic resume), else None."""
        from mxlbbsp import checkpoint
        if self.resume:
            return checkpoint.latest(self.resume)
        if self.checkpoint_dir:
            return checkpoint.latest(self.checkpoint_dir)
        return None

    def resolve_slowdown(self, num_workers: int) -> None:
        """Parse --emulate-slowdown for ``num_workers`` (known late with a hostfile)."""
        if not self.emulate_slowdown:
            self.slowdown = [Schedule() for _ in range(num_workers)]
            return
        try:
            self.slowdown = parse_slowdown(self.emulate_slowdown, num_workers)
        except SlowdownError as exc:
            raise ConfigError(str(exc)) from None

    def check_command_locally(self) -> None:
        """The command must exist here when the workers run here."""
        prog = self.command[0]
        if os.sep in prog:
            path = prog if os.path.isabs(prog) else os.path.join(self.cwd, prog)
            if not os.path.isfile(path):
                raise ConfigError(f"command not found: {prog!r} (relative to {self.cwd})")
        elif shutil.which(prog) is None:
            raise ConfigError(f"command not found: {prog!r} is not on PATH")
