"""Inside a SLURM allocation: the hosts and slots come from the allocation, the roles start
with ``srun``, so that SLURM places them, accounts for them and ends them with the job.

Detection: ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` in the environment (an ``sbatch``
script, a shell or command under ``salloc``). The node list is expanded by SLURM itself
(``scontrol show hostnames``), the task slots per node come from ``SLURM_TASKS_PER_NODE``
(``2(x3),1``: SLURM's own compression of a per-node count).

Each server and worker is one job step of one task on its node::

    srun --overlap --nodes=1 --ntasks=1 --nodelist=NODE --job-name=mxlbbsp-ID-worker-3 \\
         --kill-on-bad-exit=1 --quiet PYTHON -m mxlbbsp.launcher.guard

``--overlap`` lets the job's steps share the allocation's CPUs (the servers and the
coordinator take little). srun forwards its stdin to the task: the spec (with the job's
token) reaches the guard there, never a command line, and closing it stops the role, as over
SSH. The steps' names carry an id of this launch, so that the teardown cancels (``scancel``)
whatever step of this job is still known to SLURM, e.g. after an srun was killed.

The scheduler and the coordinator run in the launcher's process's machine (the batch
script's node under ``sbatch``), like with a hostfile.
"""
from __future__ import annotations

import ipaddress
import os
import re
import secrets
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence

from mxlbbsp.core import env as _env

from . import ssh
from .config import ConfigError, LaunchConfig
from .hostfile import Host
from .procs import GUARD, RoleProcess
from .transport import FORWARD, FORWARD_PREFIXES, Transport, forwarded_environment

#: how long a SLURM client command (scontrol, squeue, scancel) may take
CLIENT_TIMEOUT = 30
#: how long the pre-flight step on one node may take (srun, Python, the guard's check)
PREFLIGHT_TIMEOUT = 60
#: how often a role's step is started again when srun ends before the guard ran
START_ATTEMPTS = 3
#: node states (``sinfo %t``, without the flags after them) that run no step
GONE_STATES = ("down", "drain", "drng", "fail", "failg", "maint", "unk", "npc", "boot")


def gone(state: str) -> bool:
    """Whether a node in ``sinfo``'s state ``state`` runs no step (drained, down, not
    responding: ``*``)."""
    return state.rstrip("*~#!%$@^-+").lower() in GONE_STATES or state.endswith("*")


class SlurmError(RuntimeError):
    """A SLURM client command failed (not bad input)."""


def _client(argv: List[str], timeout: float = CLIENT_TIMEOUT) -> str:
    """A SLURM client command's stdout; SlurmError with its last line when it fails."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not on PATH (SLURM's client commands are needed "
                         "inside an allocation)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout:g} s") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise SlurmError(f"`{' '.join(argv)}` failed: {last}")
    return res.stdout


def expand_nodelist(nodelist: str) -> List[str]:
    """The node names of a SLURM node list (``node[01-04,07],gpu[1-2]``), as SLURM itself
    expands it (``scontrol show hostnames``)."""
    return [line.strip() for line in _client(["scontrol", "show", "hostnames", nodelist])
            .splitlines() if line.strip()]


_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_counts(text: str) -> List[int]:
    """SLURM's per-node counts (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``):
    ``2(x3),1`` is 2, 2, 2, 1. ValueError when ``text`` is not of that form."""
    counts: List[int] = []
    for part in text.split(","):
        m = _COUNT.match(part.strip())
        if not m:
            raise ValueError(f"{text!r} is not a list of counts like 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def allocation_hosts(environ: Optional[Mapping[str, str]] = None) -> List[Host]:
    """The allocation's nodes, each with its task slots (1 each when SLURM gives no tasks)."""
    environ = os.environ if environ is None else environ
    names = expand_nodelist(environ["SLURM_JOB_NODELIST"])
    tasks = environ.get("SLURM_TASKS_PER_NODE")
    counts = [1] * len(names)
    if tasks:
        try:
            counts = parse_counts(tasks)
        except ValueError as exc:
            raise ConfigError(f"SLURM_TASKS_PER_NODE: {exc}") from None
        if len(counts) != len(names):
            raise ConfigError(f"SLURM_TASKS_PER_NODE={tasks} gives {len(counts)} node(s), "
                              f"SLURM_JOB_NODELIST={environ['SLURM_JOB_NODELIST']} "
                              f"{len(names)}; is this the environment of one allocation?")
    return [Host(name, slots=max(1, count)) for name, count in zip(names, counts)]


def node_addresses(names: Sequence[str]) -> Dict[str, str]:
    """NodeAddr of each node (``scontrol show node``); a node SLURM does not know: its name."""
    out = {}
    try:
        text = _client(["scontrol", "show", "node", "-o", ",".join(names)])
    except SlurmError:
        return {n: n for n in names}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName"):
            out[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return {n: out.get(n, n) for n in names}


def node_states(names: Sequence[str]) -> Dict[str, str]:
    """Each node's state as ``sinfo`` says it (``idle``, ``alloc``, ``down*``...)."""
    out = _client(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %t"])
    states = {}
    for line in out.splitlines():
        name, _, state = line.strip().partition(" ")
        if name:
            states[name] = state.strip()
    return states


def _literal(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return False


class SlurmTransport(Transport):
    """Roles as job steps of the allocation this process runs in."""

    name = "slurm"
    remote = True
    reports_cpu = True
    #: srun forwards the launcher's heartbeat lines: a guard whose launcher and srun are both
    #: gone (the step outlives a killed srun) stops its role after 30 s of silence
    keepalive = (5.0, 30.0)
    #: srun's word on the task's exit code: the launcher's failure line names it better, and
    #: the roles it stops would each add one (exit code 143)
    hide = re.compile(r"^srun: error: \S+: task \d+: (Exited with exit code \d+|Killed)$")

    def __init__(self, config: LaunchConfig, hosts: Optional[List[Host]] = None,
                 environ: Optional[Mapping[str, str]] = None):
        super().__init__(config)
        self.environ = os.environ if environ is None else environ
        if not _env.in_slurm_allocation(self.environ):
            raise ConfigError("--launcher slurm: this is not inside a SLURM allocation (no "
                              "SLURM_JOB_ID / SLURM_JOB_NODELIST); run mxlbbsp in an sbatch "
                              "script or under salloc, or choose --launcher local or ssh")
        self.job_id = self.environ["SLURM_JOB_ID"]
        #: the steps of this launch are named <prefix>-<role>[-<rank>]
        self.prefix = f"mxlbbsp-{secrets.token_hex(4)}"
        self._hosts = hosts
        self._addresses: Optional[Dict[str, str]] = None

    # ---- hosts ------------------------------------------------------------------------------

    def hosts(self) -> List[Host]:
        if self._hosts:
            return self._hosts
        try:
            allocated = allocation_hosts(self.environ)
        except SlurmError as exc:
            raise ConfigError(f"cannot read the SLURM allocation {self.job_id}: {exc}") from None
        if self.config.hostfile is None:
            return allocated
        # -H inside an allocation with --launcher slurm: the hostfile picks nodes and slots
        hosts = self.config.hosts
        names = {h.name for h in allocated}
        outside = [h.name for h in hosts if h.name not in names]
        if outside:
            raise ConfigError(f"-H {self.config.hostfile}: {', '.join(outside)} not in the "
                              f"SLURM allocation {self.job_id} ({', '.join(sorted(names))}); "
                              "list allocated nodes only, or use --launcher ssh")
        return hosts

    def too_many_workers(self, workers: int, slots: int) -> str:
        where = (f"the hostfile {self.config.hostfile}" if self.config.hostfile else
                 f"the SLURM allocation {self.job_id}")
        return (f"-n {workers} workers, but {where} has only {slots} task slot(s); ask "
                "SLURM for more tasks (sbatch/salloc -n or --ntasks-per-node), or lower -n "
                "(no -n: one worker per slot)")

    def _address(self, host: Host) -> str:
        if self._addresses is None:
            names = [h.name for h in (self._hosts or self.hosts())]
            self._addresses = node_addresses(names)
        return self._addresses.get(host.name, host.name)

    # ---- addresses --------------------------------------------------------------------------

    def bind_address(self, hosts: Sequence[Host]) -> str:
        return ssh.bind_address([Host(self._address(h)) for h in hosts])

    def node_host(self, host: Host, bind: Optional[str]) -> Optional[str]:
        if self.config.ps_interface:
            return None       # ps-lite takes the address of DMLC_INTERFACE on each node
        address = host.name if _literal(host.name) else self._address(host)
        return address if _literal(address) else None

    # ---- the roles --------------------------------------------------------------------------

    def python(self, host: Host) -> str:
        return self.config.remote_python or sys.executable

    def forwarded(self) -> Dict[str, str]:
        return forwarded_environment()

    def step_argv(self, host: Host, name: str, argv: Sequence[str]) -> List[str]:
        """srun's argv for one task on ``host`` in a step called ``name``."""
        return ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                f"--nodelist={host.name}",
                f"--job-name={self.prefix}-{name}", "--kill-on-bad-exit=1", "--quiet",
                f"--jobid={self.job_id}", *argv]

    def guard_argv(self, host: Host, label: str) -> List[str]:
        return self.step_argv(host, label, [self.python(host), *GUARD])

    def describe(self) -> List[str]:
        forwarded = sorted(set(FORWARD) | {f"{p}*" for p in FORWARD_PREFIXES}
                           | set(self.config.env))
        return [f"SLURM allocation {self.job_id}: each server and worker is a job step "
                f"(srun); forwarded to every step through srun's stdin (not on a command "
                f"line): {' '.join(forwarded)}"]

    # ---- checks and failures ----------------------------------------------------------------

    def check_host(self, host: Host) -> Optional[str]:
        try:
            state = node_states([host.name]).get(host.name, "")
        except SlurmError as exc:
            return f"{host.name}: {exc}"
        if gone(state):
            return f"{host.name}: node state {state!r} (sinfo)"
        probe = self.step_argv(host, "check", [self.python(host), *GUARD, "--check",
                                                self.config.cwd])
        try:
            res = subprocess.run(probe, capture_output=True, text=True,
                                 stdin=subprocess.DEVNULL, timeout=PREFLIGHT_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"{host.name}: no answer from a step there within {PREFLIGHT_TIMEOUT} s"
        if res.returncode == 0:
            return None
        last = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return f"{host.name}: {last}"

    def preflight_failed(self, failed: Dict[str, str], hosts: Sequence[Host]) -> str:
        return (f"SLURM pre-flight (a step on each node) failed on {len(failed)} of "
                f"{len(self.distinct(hosts))} node(s) of allocation {self.job_id}, nothing "
                f"was started: {'; '.join(failed.values())}")

    def settle(self, p: RoleProcess, rc: int) -> bool:
        p.drain_output()                     # the guard's exit line, if it sent one
        # srun ended before the guard ran (e.g. the step could not be created)
        return p.said.reported_exit is None and p.reconnect(START_ATTEMPTS)

    def steps(self) -> List[str]:
        """The ids of this launch's steps that SLURM still knows (``squeue -s``)."""
        out = _client(["squeue", "-s", "-h", "-j", self.job_id, "-o", "%i %j"])
        ids = []
        for line in out.splitlines():
            step, _, name = line.strip().partition(" ")
            if name.startswith(self.prefix + "-"):
                ids.append(step)
        return ids

    def cleanup(self, timeout: float = 15.0) -> None:
        """Cancel every step of this launch that is left (an srun that was killed leaves its
        step running) and wait until SLURM lists none."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = self.steps()
                if not left or time.monotonic() > deadline:
                    return
                subprocess.run(["scancel", "--quiet", *left], capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=CLIENT_TIMEOUT)
                time.sleep(0.5)
        except (SlurmError, OSError, subprocess.SubprocessError):
            return                           # SLURM ends the steps with the allocation

