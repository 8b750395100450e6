"""A private SLURM cluster for the SLURM tests: one controller and two nodes on this machine.

:func:`ensure_installed` installs Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and
``munge`` when they are missing (CI runs as root on a clean Debian machine). :class:`Slurm`
writes its own ``slurm.conf`` in a folder of its own (clients find it through ``SLURM_CONF``,
:meth:`Slurm.env`: /etc/slurm is never written), generates a munge key there, and runs
``munged`` on a socket of its own, ``slurmctld`` and two ``slurmd -N n1`` / ``-N n2``, each
node on its own port at 127.0.0.1. ``SlurmdParameters=config_overrides`` lets each node
declare :data:`CPUS` CPUs whatever this machine has, so that ``srun -N 2 -n 4 --overcommit``
places tasks on both nodes. :meth:`Slurm.stop` ends every daemon it started.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import apt_fixture  # tests/apt_fixture.py

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun",
            "/usr/bin/salloc", "/usr/bin/scontrol", "/usr/bin/squeue", "/usr/bin/scancel")
NODES = ("n1", "n2")
#: CPUs (task slots) each node declares
CPUS = 4


def ensure_installed() -> Optional[str]:
    """None when SLURM and munge are there (installed now if needed), else why they cannot be."""
    missing = [p for p in PROGRAMS if not os.path.exists(p)]
    if not missing:
        return None
    failed = apt_fixture.install(PACKAGES, ", ".join(missing))
    if failed:
        return failed
    missing = [p for p in PROGRAMS if not os.path.exists(p)]
    return f"{' '.join(PACKAGES)} installed but {', '.join(missing)} missing" if missing else None


def _free_ports(count: int) -> List[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Slurm:
    """munged, slurmctld and two slurmd's, configured in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.conf = self.folder / "slurm.conf"
        self.socket = self.folder / "munge" / "munge.socket"
        self.procs: Dict[str, subprocess.Popen] = {}

    def env(self) -> Dict[str, str]:
        """This process's environment with the clients (srun, squeue...) pointed here, and
        nothing of an allocation this process may be in."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout: float = 30, check: bool = True) -> str:
        """A SLURM client command; its stdout."""
        res = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    # ---- setup ----------------------------------------------------------------------------

    def _write(self) -> None:
        f = self.folder
        for sub in ("munge", "state", "spool-n1", "spool-n2", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(f / "munge", 0o700)
        key = f / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctl, p1, p2 = _free_ports(3)
        host = socket.gethostname().split(".")[0]
        nodes = "".join(
            f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} Port={p} CPUs={CPUS} "
            "State=UNKNOWN\n" for n, p in zip(NODES, (p1, p2)))
        self.conf.write_text(
            "ClusterName=mxlbbsptest\n"
            f"SlurmctldHost={host}(127.0.0.1)\n"
            f"SlurmctldPort={ctl}\n"
            "AuthType=auth/munge\n"
            "CryptoType=crypto/munge\n"
            f"AuthInfo=socket={self.socket}\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={f / 'state'}\n"
            f"SlurmdSpoolDir={f}/spool-%n\n"
            f"SlurmctldPidFile={f / 'slurmctld.pid'}\n"
            f"SlurmdPidFile={f}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}\n"
            f"SlurmdLogFile={f}/log/slurmd-%n.log\n"
            "SlurmdParameters=config_overrides\n"
            "ProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\n"
            "MpiDefault=none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "SchedulerType=sched/backfill\n"
            "JobCompType=jobcomp/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "ReturnToService=2\n"
            "KillWait=3\nMinJobAge=5\nInactiveLimit=0\nSlurmdTimeout=30\n"
            + nodes +
            f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=YES\n")

    def _spawn(self, name: str, argv: List[str]) -> None:
        log = open(self.folder / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(argv, env=self.env(), stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def start(self, timeout: float = 60.0) -> None:
        self._write()
        m = self.folder / "munge"
        self._spawn("munged", ["/usr/sbin/munged", "-F", "-f", f"--socket={self.socket}",
                               f"--key-file={m / 'munge.key'}", f"--log-file={m / 'munged.log'}",
                               f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'seed'}"])
        self._wait(lambda: self.socket.exists(), 10, "munged did not create its socket")
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        for n in NODES:
            self._spawn(f"slurmd-{n}", ["/usr/sbin/slurmd", "-D", "-N", n, "-f", str(self.conf)])
        self._wait(self._idle, timeout, "the nodes did not come up")

    def _idle(self) -> bool:
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=5, check=False)
        except subprocess.TimeoutExpired:
            return False
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n) in ("idle", "mix", "alloc") for n in NODES)

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: {self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} within {timeout:g} s: {self.logs()}")

    def logs(self) -> str:
        """The daemons' last log lines (for a failure message)."""
        out = []
        for path in sorted((self.folder / "log").glob("*")):
            lines = path.read_text(errors="replace").strip().splitlines()[-5:]
            out.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # ---- the cluster's state --------------------------------------------------------------

    def steps(self, job_id: Optional[str] = None) -> List[str]:
        """The job steps SLURM knows of (``squeue -s``): 'JOBID.STEPID NAME' each."""
        argv = ["squeue", "-s", "-h", "-o", "%i %j"] + (["-j", job_id] if job_id else [])
        return [line.strip() for line in self.run(*argv, check=False).splitlines()
                if line.strip()]

    def jobs(self) -> List[str]:
        return [line.strip() for line in self.run("squeue", "-h", "-o", "%i %T").splitlines()
                if line.strip()]

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(5)
        self.procs = {}
