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
=====================  ===========================================================

mxlbbsp's own:

=====================  ===========================================================
MXLBBSP_COORDINATOR    host:port of the coordinator (absent: no coordination)
MXLBBSP_TOKEN          per-job secret; the coordinator refuses connections without it
MXLBBSP_SYNC           lbbsp | bsp | asp | r2sp  (default lbbsp)
MXLBBSP_RANK           this worker's rank, 0..n-1, as the launcher numbers them
MXLBBSP_HOST           the host name the launcher placed this process on (metrics)
MXLBBSP_SLOWDOWN       slowdown emulation for this worker: "3", or "0:1,100:3,..."
                       (iteration:factor change points); absent: no emulation
MXLBBSP_SAMPLE_COST    compute emulation: seconds of extra compute per sample, slept in the
                       compute phase (before any slowdown factor); absent: none
=====================  ===========================================================
"""
from __future__ import annotations

import os
import socket
from typing import Mapping, Optional, Tuple

ROLE = "DMLC_ROLE"
PS_ROOT_URI = "DMLC_PS_ROOT_URI"
PS_ROOT_PORT = "DMLC_PS_ROOT_PORT"
NUM_SERVER = "DMLC_NUM_SERVER"
NUM_WORKER = "DMLC_NUM_WORKER"
NODE_HOST = "DMLC_NODE_HOST"

COORDINATOR = "MXLBBSP_COORDINATOR"
TOKEN = "MXLBBSP_TOKEN"
SYNC = "MXLBBSP_SYNC"
RANK = "MXLBBSP_RANK"
HOST = "MXLBBSP_HOST"
SLOWDOWN = "MXLBBSP_SLOWDOWN"
SAMPLE_COST = "MXLBBSP_SAMPLE_COST"
CHECKPOINT_DIR = "MXLBBSP_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "MXLBBSP_CHECKPOINT_EVERY"
RESUME = "MXLBBSP_RESUME"

SYNC_MODES = ("lbbsp", "bsp", "asp", "r2sp")
#: sync modes whose MXNet kvstore is dist_async rather than dist_sync
ASYNC_MODES = ("asp",)


class EnvError(RuntimeError):
    """A variable of the contract is missing or malformed."""


def _get(env: Optional[Mapping[str, str]], name: str) -> Optional[str]:
    value = (os.environ if env is None else env).get(name)
    return value if value not in (None, "") else None


def role(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """DMLC_ROLE, or None when this is a plain single process."""
    return _get(env, ROLE)


def _int(env, name: str, default: Optional[int] = None) -> int:
    raw = _get(env, name)
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


def sync(env: Optional[Mapping[str, str]] = None) -> str:
    """MXLBBSP_SYNC (default lbbsp)."""
    mode = _get(env, SYNC) or "lbbsp"
    if mode not in SYNC_MODES:
        raise EnvError(f"{SYNC}={mode!r}: expected one of {', '.join(SYNC_MODES)}")
    return mode


def kvstore_type(mode: str) -> str:
    """The MXNet kvstore a sync mode runs on."""
    return "dist_async" if mode in ASYNC_MODES else "dist_sync"


def coordinator(env: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, int]]:
    """MXLBBSP_COORDINATOR as (host, port), or None outside a launched job."""
    raw = _get(env, COORDINATOR)
    if raw is None:
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise EnvError(f"{COORDINATOR}={raw!r}: expected host:port")
    return host.strip("[]"), int(port)


def token(env: Optional[Mapping[str, str]] = None) -> str:
    """MXLBBSP_TOKEN (default empty)."""
    return _get(env, TOKEN) or ""


def host(env: Optional[Mapping[str, str]] = None) -> str:
    """MXLBBSP_HOST, defaulting to this machine's host name."""
    return _get(env, HOST) or socket.gethostname()


def slowdown(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_SLOWDOWN, unparsed (see :mod:`mxlbbsp.slowdown`)."""
    return _get(env, SLOWDOWN)


def sample_cost(env: Optional[Mapping[str, str]] = None) -> float:
    """MXLBBSP_SAMPLE_COST in seconds per sample (default 0)."""
    raw = _get(env, SAMPLE_COST)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise EnvError(f"{SAMPLE_COST}={raw!r}: expected seconds per sample >= 0")
    return value


def checkpoint_dir(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_CHECKPOINT_DIR, or None: no periodic checkpoints."""
    return _get(env, CHECKPOINT_DIR)


def checkpoint_every(env: Optional[Mapping[str, str]] = None) -> int:
    """MXLBBSP_CHECKPOINT_EVERY (default 0: never)."""
    return _int(env, CHECKPOINT_EVERY, 0)


def resume(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """MXLBBSP_RESUME: the checkpoint folder this job continues from, or None."""
    return _get(env, RESUME)


def checkpoint_env(directory: Optional[str], every: int, resume_from: Optional[str]) -> dict:
    """The MXLBBSP_* checkpoint variables for one worker (empty when not used)."""
    env = {}
    if directory:
        env[CHECKPOINT_DIR] = directory
        env[CHECKPOINT_EVERY] = str(int(every))
    if resume_from:
        env[RESUME] = resume_from
    return env


def ps_env(role_name: str, root_uri: str, root_port: int, n_servers: int, n_workers: int,
           node_host: Optional[str] = None) -> dict:
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
    return env


def worker_env(rank_: int, sync_mode: str, coordinator_addr: Tuple[str, int], token_: str,
               host_label: str, slowdown_spec: Optional[str] = None,
               sample_cost_s: float = 0.0) -> dict:
    """The MXLBBSP_* variables for one worker."""
    host_, port = coordinator_addr
    env = {
        COORDINATOR: f"{host_}:{port}",
        TOKEN: token_,
        SYNC: sync_mode,
        RANK: str(rank_),
        HOST: host_label,
    }
    if slowdown_spec:
        env[SLOWDOWN] = slowdown_spec
    if sample_cost_s:
        env[SAMPLE_COST] = repr(float(sample_cost_s))
    return env
