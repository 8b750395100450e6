"""Why a role ended with a non-zero code, in a few words: one pure table.

The supervision (:mod:`.supervise`) gathers what is known about the ended role into an
:class:`Ended` (its exit code, what its guard and its exit hook said, the last line its
transport wrote, whether its host still answers the pre-flight), and :func:`say` reads the
first row of :data:`TABLE` whose condition holds. No I/O here: the side effects come before
(draining the output, starting an SSH connection again: ``Transport.settle``), and the one
slow fact, the pre-flight probe, is asked for only when a row needs it (:func:`needs_probe`).

Rows for one transport (``"ssh"``, ``"slurm"``, ``"local"``) come first: they tell the
transport failing (ssh's exit 255 for a lost connection, srun's word on a node failure) from
the role failing; the rows for any transport then name the role's own end.
"""
from __future__ import annotations

import dataclasses
import re
import signal
from typing import Callable, Iterable, NamedTuple, Optional

from .ssh import says_connection_lost

#: srun's and slurmstepd's words for a node that is gone, and for a step SLURM ended
NODE_LOST = re.compile(r"[Nn]ode failure|NODE_FAIL|Socket timed out|Connection refused|"
                       r"[Cc]ommunication connection failure|Unable to contact")
CANCELLED = re.compile(r"CANCELLED|DUE TO TIME LIMIT|DUE TO PREEMPTION")


@dataclasses.dataclass(frozen=True)
class Ended:
    """What is known about a role whose transport ended with a non-zero code."""
    name: str                        # "worker 1", "scheduler"
    host: str
    remote: bool                     # its transport may reach another machine
    transport: str                   # its transport's name: "local", "ssh", "slurm"
    rc: int                          # the transport's exit code (128 + N for a signal N)
    connected: bool = True           # its guard said that it started
    attempts: int = 1                # transports started for it
    reported_exit: Optional[int] = None   # the command's exit code, as its guard said
    signalled: Optional[int] = None  # the signal that ended the command, as its guard said
    guard_signal: Optional[int] = None    # the signal that killed the (local) guard itself
    error_line: Optional[str] = None      # the command's own "mxlbbsp: error: ..." line
    exit_reason: Optional[str] = None     # the exit hook's word (e.g. "RuntimeError: boom")
    last_early: Optional[str] = None      # the transport's last line before its guard ran
    last_stderr: Optional[str] = None     # the last line on stderr (ssh's, srun's word)
    host_answers: Optional[bool] = None   # its host passes the pre-flight (asked if needed)

    @property
    def where(self) -> str:
        return f" on {self.host}" if self.remote else ""

    @property
    def slurm_said(self) -> str:
        """The last stderr line when it is SLURM's own (not the role's)."""
        said = self.last_stderr or ""
        return said if said.startswith(("srun:", "slurmstepd")) else ""


class Row(NamedTuple):
    transport: Optional[str]                 # None: any transport
    when: Callable[[Ended], bool]
    says: Callable[[Ended], str]


def signal_name(signum: int, rc: int) -> str:
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


def _tail(line: Optional[str]) -> str:
    return f": {line}" if line else ""


def _ssh_own(e: Ended) -> bool:
    """ssh's own 255 (the command's 255 comes with its guard's exit line)."""
    return e.rc == 255 and e.reported_exit != 255


def _srun_own(e: Ended) -> bool:
    """srun's own end: the guard never reported the command's exit code."""
    return e.reported_exit is None


TABLE = (
    # ---- ssh: exit 255 is ssh's own unless the guard reported the command's 255
    Row("ssh", lambda e: _ssh_own(e) and not e.connected,
        lambda e: f"could not connect to {e.host} ({e.attempts} attempt(s), ssh exit 255"
                  f"{_tail(e.last_early)})"),
    # ssh says nothing when the remote command itself ends by a signal (nor, at LogLevel
    # ERROR, when its keep-alives time out: hence the probe)
    Row("ssh", lambda e: _ssh_own(e) and not says_connection_lost(e.last_stderr)
        and bool(e.host_answers),
        lambda e: f"exited on {e.host}: its guard was killed, and the role with it (ssh exit "
                  "255 with the connection intact)"),
    Row("ssh", _ssh_own,
        lambda e: f"lost its SSH connection on {e.host} (ssh exit 255)"),
    # ---- slurm: srun's own end when the guard reported no exit code
    Row("slurm", lambda e: _srun_own(e) and not e.connected,
        lambda e: f"could not start a job step on {e.host} ({e.attempts} attempt(s), srun "
                  f"exit {e.rc}{_tail(e.last_early)})"),
    Row("slurm", lambda e: _srun_own(e) and (bool(NODE_LOST.search(e.slurm_said))
                                             or e.host_answers is False),
        lambda e: f"lost its node {e.host} (srun exit {e.rc}{_tail(e.slurm_said)})"),
    Row("slurm", lambda e: _srun_own(e) and bool(CANCELLED.search(e.slurm_said)),
        lambda e: f"was cancelled by SLURM on {e.host} ({e.slurm_said})"),
    Row("slurm", _srun_own,
        lambda e: f"exited on {e.host}: its guard was killed, and the role with it (srun "
                  f"exit {e.rc}{_tail(e.slurm_said)})"),
    # ---- any transport: the role's own end
    Row(None, lambda e: bool(e.error_line),      # its own one-line refusal, said once
        lambda e: f"exited with code {e.rc}{e.where}: {e.error_line}"),
    Row(None, lambda e: bool(e.exit_reason),
        lambda e: f"exited with code {e.rc}{e.where}: {e.exit_reason}"),
    Row(None, lambda e: e.signalled is not None,
        lambda e: f"was killed by {signal_name(e.signalled, e.rc)}{e.where}"),
    Row("local", lambda e: e.guard_signal is not None and e.reported_exit is None,
        lambda e: f"exited with code {e.rc}{e.where}: its guard was killed "
                  f"({signal.Signals(e.guard_signal).name}), and the role with it"),
    Row(None, lambda e: True,
        lambda e: f"exited with code {e.rc}{e.where}"),
)


def _rows(e: Ended, table: Iterable[Row]):
    return (row for row in table if row.transport in (None, e.transport))


def needs_probe(e: Ended, table=TABLE) -> bool:
    """Whether the answer depends on ``host_answers`` (a pre-flight probe, seconds): the
    first row that holds with the host answering differs from the one without."""
    with_host = dataclasses.replace(e, host_answers=True)
    without = dataclasses.replace(e, host_answers=False)
    first = lambda x: next(row for row in _rows(x, table) if row.when(x))  # noqa: E731
    return first(with_host) is not first(without)


def say(e: Ended, table=TABLE) -> str:
    """What happened to the role, after its name (e.g. "exited with code 3 on node2")."""
    for row in _rows(e, table):
        if row.when(e):
            return row.says(e)
    raise AssertionError("the table's last row holds for every role")
