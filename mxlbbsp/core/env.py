"""The environment contract between `mxlbbsp launch` and the processes of a job.

Every ``DMLC_*`` and ``MXLBBSP_*`` variable that mxlbbsp reads is read here, through one
accessor each, with its default; the launcher writes them from the same names
(:func:`worker_env`, :func:`ps_env`). Nothing in this module imports MXNet.

ps-lite (MXNet's parameter server) reads the ``DMLC_*`` variables itself:

=====================  ===========================================================
DMLC_ROLE              scheduler | server | worker; absent: a plain single process
DMLC_PS_ROOT_URI       address of the ps-lite scheduler
DMLC_PS_ROOT_PORT      its port
DMLC_NUM_SERVER        number of parameter servers
DMLC_NUM_WORKER        number of workers
DMLC_NODE_HOST         the address this node announces to its peers (optional)
DMLC_INTERFACE         the network interface whose address ps-lite binds to and announces
                       when DMLC_NODE_HOST is absent (``mxlbbsp launch --ps-interface``)
=====================  ===========================================================

mxlbbsp's own:

=====================  ===========================================================
MXLBBSP_COORDINATOR    host:port of the coordinator, or for a worker behind its host's relay
                       the relay's unix:PATH (absent: no coordination)
MXLBBSP_RELAY          a relay's own (``python -m mxlbbsp.relay``): the unix:PATH it listens
                       on for its host's workers (it reaches the coordinator at
                       MXLBBSP_COORDINATOR and serves MXLBBSP_LOCAL_SIZE workers)
MXLBBSP_TOKEN          per-job secret; the coordinator refuses connections without it
MXLBBSP_SYNC           a registered sync mode (mxlbbsp.modes): lbbsp (default) | bsp | asp | r2sp
                       | courier, or one registered by a module of MXLBBSP_MODE_MODULES
MXLBBSP_MODE_MODULES   importable modules (comma-separated) that register more sync modes;
                       set by the user, forwarded to every role like every MXLBBSP_ variable
MXLBBSP_RANK           this worker's rank, 0..n-1, as the launcher numbers them
MXLBBSP_HOST           the host name the launcher placed this process on (metrics)
MXLBBSP_LOCAL_RANK     this worker's index among the job's workers on its host, 0..k-1
                       (e.g. its GPU: mx.gpu(mxlbbsp.local_rank())); absent: 0
MXLBBSP_LOCAL_SIZE     k, the number of the job's workers on this worker's host; absent: 1
MXLBBSP_SLOWDOWN       slowdown emulation for this worker: "3", or "0:1,100:3,..."
                       (iteration:factor change points); absent: no emulation
MXLBBSP_SAMPLE_COST    compute emulation: seconds of extra compute per sample, slept in the
                       compute phase (before any slowdown factor); absent: none
MXLBBSP_SIGNALS        the report columns this worker reads (mxlbbsp.core.signals.COLUMNS), comma-
                       separated; empty: none; absent: signals.AUTO (launcher --signals)
MXLBBSP_EXIT_HOOK      0 turns off the workers' exit hook (launcher/_boot/sitecustomize.py,
                       which reads it itself: it imports nothing of mxlbbsp)
MXLBBSP_EXIT_HOOK_PID  written by the exit hook itself (not the launcher): the pid of the
                       worker's own process, so that only it announces a normal end
MXLBBSP_HOLD           host:port of the launcher's hold, for a worker started ahead of its
                       job (an elastic job's next generation, launched while the current one
                       trains): at its first need of the checkpoint it resumes from it waits
                       there, and is told the checkpoint (mxlbbsp.worker.hold); absent: none
MXLBBSP_STALL_FLOORS   read by the launcher, for tests: "STARTUP,RUNNING" seconds, the floors
                       of the automatic stall limit (default 300,120)
MXLBBSP_LR_SCALING     how the learning rate follows a changing global batch (courier,
                       goodput): linear | sqrt | none | adascale (default linear; adascale:
                       the coordinator's factor, goodput only)
MXLBBSP_BATCH_SCHEDULE a metrics file whose global batch sizes (and recorded learning-rate
                       factors) a single process replays (mxlbbsp.DataLoader's
                       batch_schedule); absent: none
MXLBBSP_TIMELINE       set by the user (``--env``; benchmarks/overhead.py): a folder where each
                       worker writes the clock readings of its iterations' phases at its end
                       (``timeline-RANK.json``, mxlbbsp.worker.timeline); absent: none taken
MXLBBSP_ENGINE_CLOCK   set by the user (``--env``): 1 lets MXNet's engine time a worker's
                       report and done (mxlbbsp.worker.engine) where the job allows it;
                       absent: the worker waits for the engine (the default: see
                       mxlbbsp.worker.trainer)
=====================  ===========================================================
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Mapping, Optional, Tuple

from mxlbbsp.core import lr as _lr
from mxlbbsp.core import protocol as _protocol

#: mxlbbsp's version (``mxlbbsp.__version__``, ``mxlbbsp --version``)
VERSION = "0.1.0"

#: what to do when MXNet is missing: mxlbbsp depends on no MXNet build (the CPU wheel and the
#: CUDA builds are different distributions of the one ``mxnet`` module)
NO_MXNET = ("mxlbbsp needs MXNet in this Python, and none is installed: pip install "
            "mxnet==1.9.1 for the CPU build (mxlbbsp's extra cpu), or one of MXNet's CUDA "
            "builds for GPUs (e.g. pip install mxnet-cu112)")

ROLE = "DMLC_ROLE"
PS_ROOT_URI = "DMLC_PS_ROOT_URI"
PS_ROOT_PORT = "DMLC_PS_ROOT_PORT"
NUM_SERVER = "DMLC_NUM_SERVER"
NUM_WORKER = "DMLC_NUM_WORKER"
NODE_HOST = "DMLC_NODE_HOST"
INTERFACE = "DMLC_INTERFACE"

COORDINATOR = "MXLBBSP_COORDINATOR"
RELAY = "MXLBBSP_RELAY"
HUB_RELAYS = "MXLBBSP_HUB_RELAYS"
TOKEN = "MXLBBSP_TOKEN"
SYNC = "MXLBBSP_SYNC"
#: modules (comma-separated) that register more sync modes (mxlbbsp.modes)
MODE_MODULES = "MXLBBSP_MODE_MODULES"
RANK = "MXLBBSP_RANK"
HOST = "MXLBBSP_HOST"
LOCAL_RANK = "MXLBBSP_LOCAL_RANK"
LOCAL_SIZE = "MXLBBSP_LOCAL_SIZE"
#: torchrun's and horovodrun's names for a worker's place in the job, set beside mxlbbsp's
#: own, so that a script written for those launchers finds its rank
TORCH_RANK, TORCH_WORLD_SIZE = "RANK", "WORLD_SIZE"
TORCH_LOCAL_RANK, TORCH_LOCAL_WORLD_SIZE = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
SLOWDOWN = "MXLBBSP_SLOWDOWN"
SAMPLE_COST = "MXLBBSP_SAMPLE_COST"
SIGNALS = "MXLBBSP_SIGNALS"
EXIT_HOOK = "MXLBBSP_EXIT_HOOK"
#: the exit hook's own (launcher/_boot/sitecustomize.py reads it by name: stdlib only)
EXIT_HOOK_PID = "MXLBBSP_EXIT_HOOK_PID"
#: set by the guard of a role in an elastic job: SIGTERM is a preemption notice (the guard's
#: own name for it, launcher/guard.py, which imports nothing of mxlbbsp)
PREEMPTIBLE = "MXLBBSP_PREEMPTIBLE"
STALL_FLOORS = "MXLBBSP_STALL_FLOORS"
#: the automatic stall limit's floors: before the first iteration, and after it
DEFAULT_STALL_FLOORS = (300.0, 120.0)
CHECKPOINT_DIR = "MXLBBSP_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "MXLBBSP_CHECKPOINT_EVERY"
RESUME = "MXLBBSP_RESUME"
HOLD = "MXLBBSP_HOLD"
#: "1": every worker keeps a copy of its last finished iteration's state, so that a
#: survivor can save it when another worker fails (an elastic job, or --restarts)
SNAPSHOTS = "MXLBBSP_SNAPSHOTS"

LR_SCALING = "MXLBBSP_LR_SCALING"
BATCH_SCHEDULE = "MXLBBSP_BATCH_SCHEDULE"
TIMELINE = "MXLBBSP_TIMELINE"
ENGINE_CLOCK = "MXLBBSP_ENGINE_CLOCK"

#: every variable the launcher writes for the job itself (ps_env, worker_env): `--env` may
#: not override them. Each maps to the launcher option that sets it (None: none, it is the
#: job's own).
RESERVED = {
    ROLE: None, PS_ROOT_URI: "--bind", PS_ROOT_PORT: None, NUM_SERVER: "-s/--num-servers",
    NUM_WORKER: "-n/--num-workers", NODE_HOST: "--bind", INTERFACE: "--ps-interface",
    COORDINATOR: "--bind", RELAY: "--relay", TOKEN: None, SYNC: "--sync", RANK: None,
    HOST: None,
    LOCAL_RANK: None, LOCAL_SIZE: None,
    TORCH_RANK: None, TORCH_WORLD_SIZE: "-n/--num-workers", TORCH_LOCAL_RANK: None,
    TORCH_LOCAL_WORLD_SIZE: None,
    SLOWDOWN: "--emulate-slowdown", SAMPLE_COST: "--emulate-compute",
    LR_SCALING: "--lr-scaling", SIGNALS: "--signals",
}


class EnvError(RuntimeError):
    """A variable of the contract is missing or malformed."""


def refuse(exc) -> SystemExit:
    """Bad input in a worker's environment, or a script that uses mxlbbsp wrongly inside a
    job (an exception or its text): one line on stderr, and SystemExit(2) to raise (no
    traceback; the launcher says the line once, in its own)."""
    sys.stderr.write(f"mxlbbsp: error: {exc}\n")
    sys.stderr.flush()
    return SystemExit(2)


def get(env: Optional[Mapping[str, str]], name: str) -> Optional[str]:
    value = (os.environ if env is None else env).get(name)
    return value if value not in (None, "") else None


def role(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """DMLC_ROLE, or None when this is a plain single process."""
    return get(env, ROLE)


def _int(env, name: str, default: Optional[int] = None) -> int:
    raw = get(env, name)
    if raw is None:
        if default is None:
            raise EnvError(f"{name} is not set; start the job with `mxlbbsp launch`")
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None


def num_workers(env: Optional[Mapping[str, str]] = None) -> int:
    """DMLC_NUM_WORKER (default 1)."""
    return _int(env, NUM_WORKER, 1)


def rank(env: Optional[Mapping[str, str]] = None) -> int:
    """MXLBBSP_RANK (default 0)."""
    return _int(env, RANK, 0)


def local_rank(env: Optional[Mapping[str, str]] = None) -> int:
    """MXLBBSP_LOCAL_RANK (default 0)."""
    return _int(env, LOCAL_RANK, 0)


def local_size(env: Optional[Mapping[str, str]] = None) -> int:
    """MXLBBSP_LOCAL_SIZE (default 1)."""
    return _int(env, LOCAL_SIZE, 1)


def _address(env, name: str) -> Optional[_protocol.Address]:
    raw = get(env, name)
    if raw is None:
        return None
    try:
        return _protocol.parse_address(raw)
    except ValueError as exc:
        raise EnvError(f"{name}={exc}") from None


def coordinator(env: Optional[Mapping[str, str]] = None) -> Optional[_protocol.Address]:
    """MXLBBSP_COORDINATOR as (host, port), or a Unix socket's path (a relay's), or None
    outside a launched job."""
    return _address(env, COORDINATOR)


def relay(env: Optional[Mapping[str, str]] = None) -> Optional[_protocol.Address]:
    """MXLBBSP_RELAY: the address a relay listens on (None: not a relay)."""
    return _address(env, RELAY)


def hub_relays(env: Optional[Mapping[str, str]] = None) -> int:
    """How many hosts' relays a hub serves (``python -m mxlbbsp.relay.hub``)."""
    return _int(env, HUB_RELAYS, 0)


def in_slurm_allocation(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process runs inside a SLURM allocation (salloc, sbatch): SLURM's
    SLURM_JOB_ID and SLURM_JOB_NODELIST."""
    return bool(get(env, "SLURM_JOB_ID") and get(env, "SLURM_JOB_NODELIST"))


def preemptible(env: Optional[Mapping[str, str]] = None) -> bool:
    """MXLBBSP_PREEMPTIBLE: this role's SIGTERM is a preemption notice (an elastic job)."""
    return get(env, PREEMPTIBLE) == "1"


def token(env: Optional[Mapping[str, str]] = None) -> str:
    """MXLBBSP_TOKEN (default empty)."""
    return get(env, TOKEN) or ""


def host(env: Optional[Mapping[str, str]] = None) -> str:
    """MXLBBSP_HOST, defaulting to this machine's host name."""
    return get(env, HOST) or socket.gethostname()


def slowdown(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_SLOWDOWN, unparsed (see :mod:`mxlbbsp.core.slowdown`)."""
    return get(env, SLOWDOWN)


def sample_cost(env: Optional[Mapping[str, str]] = None) -> float:
    """MXLBBSP_SAMPLE_COST in seconds per sample (default 0)."""
    raw = get(env, SAMPLE_COST)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise EnvError(f"{SAMPLE_COST}={raw!r}: expected finite seconds per sample >= 0")
    return value


def stall_floors(env: Optional[Mapping[str, str]] = None) -> Tuple[float, float]:
    """MXLBBSP_STALL_FLOORS as (start-up floor, running floor) in seconds."""
    raw = get(env, STALL_FLOORS)
    if raw is None:
        return DEFAULT_STALL_FLOORS
    try:
        startup, running = (float(x) for x in raw.split(","))
    except ValueError:
        startup = running = -1.0
    if not (0 < startup < float("inf") and 0 < running < float("inf")):
        raise EnvError(f"{STALL_FLOORS}={raw!r}: expected STARTUP,RUNNING seconds > 0")
    return startup, running


def lr_scaling(env: Optional[Mapping[str, str]] = None) -> str:
    """MXLBBSP_LR_SCALING (default linear): see :data:`mxlbbsp.core.lr.RULES`."""
    rule = get(env, LR_SCALING) or "linear"
    if rule not in _lr.RULES:
        raise EnvError(f"{LR_SCALING}={rule!r}: expected one of {', '.join(_lr.RULES)}")
    return rule


def batch_schedule(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_BATCH_SCHEDULE: a metrics file to replay the global batches of, or None."""
    return get(env, BATCH_SCHEDULE)


def timeline(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_TIMELINE: the folder for the workers' per-iteration clock readings, or None
    (none are taken)."""
    return get(env, TIMELINE)


def checkpoint_dir(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_CHECKPOINT_DIR, or None: no periodic checkpoints."""
    return get(env, CHECKPOINT_DIR)


def checkpoint_every(env: Optional[Mapping[str, str]] = None) -> int:
    """MXLBBSP_CHECKPOINT_EVERY (default 0: never)."""
    return _int(env, CHECKPOINT_EVERY, 0)


def resume(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_RESUME: the checkpoint folder this job continues from, or None."""
    return get(env, RESUME)


def hold(env: Optional[Mapping[str, str]] = None) -> Optional[_protocol.Address]:
    """MXLBBSP_HOLD: where a worker started ahead of its job waits (None: it does not)."""
    return _address(env, HOLD)


def engine_clock(env: Optional[Mapping[str, str]] = None) -> bool:
    """MXLBBSP_ENGINE_CLOCK: the engine times the report and done (worker/engine.py);
    on unless set to 0."""
    return get(env, ENGINE_CLOCK) != "0"


def snapshots(env: Optional[Mapping[str, str]] = None) -> bool:
    """MXLBBSP_SNAPSHOTS: keep the last finished iteration's state (worker/snapshot.py)."""
    return get(env, SNAPSHOTS) == "1"


def checkpoint_env(directory: Optional[str], every: int, resume_from: Optional[str],
                   snapshots_: bool = False) -> dict:
    """The MXLBBSP_* checkpoint variables for one worker (empty when not used)."""
    env = {}
    if directory:
        env[CHECKPOINT_DIR] = directory
        env[CHECKPOINT_EVERY] = str(int(every))
        if snapshots_:
            env[SNAPSHOTS] = "1"
    if resume_from:
        env[RESUME] = resume_from
    return env


def ps_env(role_name: str, root_uri: str, root_port: int, n_servers: int, n_workers: int,
           node_host: Optional[str] = None, interface: Optional[str] = None) -> dict:
    """The DMLC_* variables for one ps-lite process."""
    env = {
        ROLE: role_name,
        PS_ROOT_URI: root_uri,
        PS_ROOT_PORT: str(root_port),
        NUM_SERVER: str(n_servers),
        NUM_WORKER: str(n_workers),
    }
    if node_host:
        env[NODE_HOST] = node_host
    if interface:
        env[INTERFACE] = interface
    return env


def signals(env: Optional[Mapping[str, str]] = None) -> Optional[tuple]:
    """MXLBBSP_SIGNALS: the report columns to read (None: absent, the default set)."""
    raw = (os.environ if env is None else env).get(SIGNALS)
    if raw is None:
        return None                    # (empty: none at all, unlike the other variables)
    return tuple(c.strip() for c in raw.split(",") if c.strip())


def relay_env(listen: _protocol.Address, coordinator_addr: _protocol.Address, token_: str,
              host_label: str, workers: int) -> dict:
    """The MXLBBSP_* variables of a host's relay, which serves ``workers`` workers."""
    return {RELAY: _protocol.format_address(listen),
            COORDINATOR: _protocol.format_address(coordinator_addr), TOKEN: token_,
            HOST: host_label, LOCAL_SIZE: str(int(workers))}


def hub_env(listen: _protocol.Address, coordinator_addr: _protocol.Address, token_: str,
            label: str, relays: int, workers: int) -> dict:
    """The MXLBBSP_* variables of a hub of ``relays`` relays, ``workers`` workers in all."""
    env = relay_env(listen, coordinator_addr, token_, label, workers)
    env[HUB_RELAYS] = str(int(relays))
    return env


def worker_env(rank_: int, sync_mode: str, coordinator_addr: _protocol.Address, token_: str,
               host_label: str, slowdown_spec: Optional[str] = None,
               sample_cost_s: float = 0.0, signal_columns: Optional[tuple] = None,
               local: Tuple[int, int] = (0, 1), world_size: Optional[int] = None) -> dict:
    """The MXLBBSP_* variables for one worker, and torchrun's RANK, WORLD_SIZE, LOCAL_RANK
    and LOCAL_WORLD_SIZE; ``local``: (local rank, local size); ``coordinator_addr``: the
    coordinator's, or its host's relay's; ``world_size``: the job's workers."""
    env = {
        COORDINATOR: _protocol.format_address(coordinator_addr),
        TOKEN: token_,
        SYNC: sync_mode,
        RANK: str(rank_),
        HOST: host_label,
        LOCAL_RANK: str(local[0]),
        LOCAL_SIZE: str(local[1]),
        TORCH_RANK: str(rank_),
        TORCH_LOCAL_RANK: str(local[0]),
        TORCH_LOCAL_WORLD_SIZE: str(local[1]),
    }
    if world_size is not None:
        env[TORCH_WORLD_SIZE] = str(world_size)
    if slowdown_spec:
        env[SLOWDOWN] = slowdown_spec
    if sample_cost_s:
        env[SAMPLE_COST] = repr(float(sample_cost_s))
    if signal_columns is not None:
        env[SIGNALS] = ",".join(signal_columns)
    return env
