"""How the launcher reaches the hosts of a job: one :class:`Transport` per job.

A transport answers, for the job (:mod:`.job`), every question whose answer depends on how the
roles are started:

* which hosts there are and how many worker slots (:meth:`Transport.hosts`);
* the argv that starts a guard (:mod:`.guard`) on a host (:meth:`Transport.guard_argv`): the
  launcher writes the role's spec to that argv's stdin, secrets included, and never puts it on
  a command line;
* what is checked on the hosts before anything starts, and again before a restart
  (:meth:`Transport.preflight`, :meth:`Transport.check_host`);
* which address of this machine faces the hosts (the scheduler's and the coordinator's) and
  which address a role announces to ps-lite (:meth:`Transport.bind_address`,
  :meth:`Transport.node_host`);
* what the environment of a role carries over from this one (:meth:`Transport.forwarded`);
* what to read, or start again, before a role's end is diagnosed (:meth:`Transport.settle`;
  the diagnosis itself, e.g. ssh's exit 255 for a lost connection or srun's word on a node
  failure, is one pure table in :mod:`.diagnosis`, whose rows are chosen by :attr:`name`);
* what is left to clean up once every guard was stopped (:meth:`Transport.cleanup`).

Three implementations: :class:`LocalTransport` (every role on this machine),
:class:`SshTransport` (a hostfile, OpenSSH: :mod:`.ssh`) and ``SlurmTransport`` (inside a
SLURM allocation, ``srun``: :mod:`.slurm`). ``job.choose_transport`` picks one from
``--launcher``, the hostfile and the environment. The scheduler always runs on this machine, through the local
transport.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from . import ssh
from .config import ConfigError, LaunchConfig
from .hostfile import LOCAL, Host
from .procs import GUARD, RoleProcess, local_transport

#: variables forwarded to the roles on other hosts (besides every --env)
FORWARD = ("PATH", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS")
FORWARD_PREFIXES = ("MXNET_", "DMLC_", "MXLBBSP_")
#: the names ``--launcher`` takes
NAMES = ("local", "ssh", "slurm")


def forwarded_environment() -> Dict[str, str]:
    """The variables of this process that the roles on other hosts get."""
    return {key: value for key, value in os.environ.items()
            if key in FORWARD or key.startswith(FORWARD_PREFIXES)}


class Transport:
    """The interface (and the local behaviour, where an implementation has nothing else to
    say). See the module's docstring."""

    #: the value of --launcher that chooses it
    name = "local"
    #: roles may run on other machines than this one: output labels carry the host, the
    #: environment is forwarded, the command is not checked here
    remote = False
    #: the guard reports its command's CPU seconds and stopped state (not measurable here)
    reports_cpu = False
    #: a regex of the transport's own stderr lines that are not shown (see RoleProcess.hide)
    hide = None
    #: (interval, silence): the launcher writes a line to each guard every interval s; a guard
    #: that hears nothing for silence s stops its role. None: no heartbeat
    keepalive: Optional[Tuple[float, float]] = None

    def __init__(self, config: LaunchConfig):
        self.config = config

    # ---- hosts ------------------------------------------------------------------------------

    def hosts(self) -> List[Host]:
        """The hosts of the job, with their worker slots."""
        return [dataclasses.replace(LOCAL, slots=self.config.num_workers)]

    def default_workers(self, hosts: Sequence[Host]) -> int:
        """The number of workers without -n: every slot."""
        return self.config.num_workers or sum(h.slots for h in hosts)

    def too_many_workers(self, workers: int, slots: int) -> str:
        """The one line for -n above the slots."""
        return (f"-n {workers} workers, but the hosts of -H have only {slots} slot(s); add "
                "hosts, raise their slots, or lower -n")

    # ---- addresses --------------------------------------------------------------------------

    def bind_address(self, hosts: Sequence[Host]) -> str:
        """The address of this machine that the hosts reach the scheduler and coordinator on."""
        return "127.0.0.1"

    def node_host(self, host: Host, bind: Optional[str]) -> Optional[str]:
        """DMLC_NODE_HOST of a role on ``host`` (None: ps-lite picks, e.g. by its interface)."""
        return bind if self.config.ps_interface else "127.0.0.1"

    def bind_notes(self, hosts: Sequence[Host], bind: str) -> List[str]:
        """Lines for --dry-run about the address chosen (e.g. a guess)."""
        return []

    # ---- the roles --------------------------------------------------------------------------

    def python(self, host: Host) -> str:
        return sys.executable

    def forwarded(self) -> Dict[str, str]:
        """The environment the roles get from this process (besides the job's own)."""
        return {}

    def guard_argv(self, host: Host, label: str) -> List[str]:
        """The argv that starts a guard on ``host`` for the role ``label`` (e.g. worker-3)."""
        return local_transport()

    def describe(self) -> List[str]:
        """--dry-run: how the environment travels."""
        return []

    def check_command(self) -> None:
        """Bad input that can be seen here before anything starts (ConfigError)."""
        if not self.remote:           # every process runs here: the command must exist here
            self.config.check_command_locally()

    # ---- checks and failures ----------------------------------------------------------------

    def preflight(self, hosts: Sequence[Host]) -> Dict[str, str]:
        """Every machine of ``hosts`` checked (:meth:`check_host`, in parallel): what is
        wrong with each one that cannot run a role now, by host name; {} when all can."""
        unique = self.distinct(hosts)
        if not unique:
            return {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(unique))) as pool:
            results = list(pool.map(self.check_host, unique))
        return {h.name: r for h, r in zip(unique, results) if r}

    def preflight_failed(self, failed: Dict[str, str], hosts: Sequence[Host]) -> str:
        return f"pre-flight failed: {'; '.join(failed.values())}"

    def check_host(self, host: Host) -> Optional[str]:
        """What is wrong with ``host`` for this job now, None if nothing."""
        return None

    def distinct(self, hosts: Sequence[Host]) -> List[Host]:
        """The different machines among ``hosts``."""
        return ssh.distinct(hosts)

    def settle(self, p: RoleProcess, rc: int) -> bool:
        """Before ``p``'s end is diagnosed (:mod:`.diagnosis`): read what its transport
        still has to say and, when the transport ended before its guard ran (so nothing of
        the role ran yet), start it again. True while it is being started again."""
        return False

    def cleanup(self) -> None:
        """After every guard was stopped: anything of the job left in the transport."""


class LocalTransport(Transport):
    """Every role on this machine."""

    def __init__(self, config: LaunchConfig):
        super().__init__(config)
        if config.num_workers is None:
            raise ConfigError("how many workers? give -n/--num-workers before the command (or "
                              "hosts with -H)")


class SshTransport(Transport):
    """The hosts of a hostfile, over OpenSSH (:mod:`.ssh`)."""

    name = "ssh"
    remote = True
    reports_cpu = True

    def __init__(self, config: LaunchConfig, hosts: Optional[List[Host]] = None):
        super().__init__(config)
        if config.hostfile is None and config.host_discovery_script is None and not hosts:
            raise ConfigError("--launcher ssh needs the hosts: give -H/--hostfile PATH")
        self._hosts = hosts
        self.options = ssh.SshOptions(config.ssh_port, config.ssh_identity, config.ssh_options)
        self.keepalive = ssh.keepalive(self.options)

    def hosts(self) -> List[Host]:
        return self._hosts or self.config.hosts

    def bind_address(self, hosts: Sequence[Host]) -> str:
        return ssh.bind_address(hosts, self.options)

    def node_host(self, host: Host, bind: Optional[str]) -> Optional[str]:
        # ps-lite takes the address of DMLC_INTERFACE on each host (DMLC_NODE_HOST would win)
        return None if self.config.ps_interface else host.address

    def bind_notes(self, hosts: Sequence[Host], bind: str) -> List[str]:
        if not bind.startswith("127.") or self.config.bind is not None:
            return []
        unknown = [h.name for h in hosts if not h.address
                   and not _resolves(ssh.ssh_hostname(h, self.options))]
        if not unknown:
            return []
        return [f"note: {', '.join(unknown)} did not resolve here, so the scheduler's address "
                "is a guess; give --bind ADDR (this machine's address that the hosts can reach)"]

    def python(self, host: Host) -> str:
        return self.config.remote_python or sys.executable

    def forwarded(self) -> Dict[str, str]:
        return forwarded_environment()

    def guard_argv(self, host: Host, label: str) -> List[str]:
        return ssh.command(host, self.options, [self.python(host), *GUARD])

    def describe(self) -> List[str]:
        forwarded = sorted(set(FORWARD) | {f"{p}*" for p in FORWARD_PREFIXES}
                           | set(self.config.env))
        return ["forwarded to every host through the SSH session's stdin (not on a command "
                f"line): {' '.join(forwarded)}"]

    def preflight_failed(self, failed: Dict[str, str], hosts: Sequence[Host]) -> str:
        return (f"SSH pre-flight failed on {len(failed)} of {len(ssh.distinct(hosts))} "
                f"host(s), nothing was started: {'; '.join(failed.values())}")

    def check_host(self, host: Host) -> Optional[str]:
        return ssh.check_host(host, self.options, self.python(host), self.config.cwd)

    #: how often a role is started over SSH when the connection fails before its guard runs
    CONNECT_ATTEMPTS = 5

    def settle(self, p: RoleProcess, rc: int) -> bool:
        if rc != 255:
            return False
        p.drain_output()                  # the guard's exit line, if it sent one
        if p.said.reported_exit == 255:        # the command's own 255 is not ssh's
            return False
        return p.reconnect(self.CONNECT_ATTEMPTS)


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False

