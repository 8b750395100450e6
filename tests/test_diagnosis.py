"""The failure diagnosis table (launcher/diagnosis.py): every row, from facts alone, in
milliseconds. The real failures behind these facts are in test_failures.py, test_ssh.py,
test_slurm.py and test_conventions.py."""
import dataclasses

import pytest

from mxlbbsp.launcher.diagnosis import TABLE, Ended, needs_probe, say

WORKER = Ended(name="worker 1", host="node2", remote=True, transport="ssh", rc=3,
               reported_exit=3)


@pytest.mark.parametrize("changes, expected", [
    ({}, "exited with code 3 on node2"),
    ({"error_line": "--epochs: not a number"}, "exited with code 3 on node2: --epochs: not a number"),
    ({"exit_reason": "RuntimeError: boom"}, "exited with code 3 on node2: RuntimeError: boom"),
    ({"rc": 139, "reported_exit": 139, "signalled": 11},
     "was killed by SIGSEGV (exit code 139) on node2"),
    ({"rc": 137, "reported_exit": 137, "signalled": 9},
     "was killed by SIGKILL (exit code 137: kill -9, or the kernel's out-of-memory killer, "
     "see dmesg) on node2"),
    # ssh's own 255
    ({"rc": 255, "reported_exit": None, "connected": False, "attempts": 5,
      "last_early": "ssh: connect to host node2 port 22: Connection refused"},
     "could not connect to node2 (5 attempt(s), ssh exit 255: ssh: connect to host node2 port "
     "22: Connection refused)"),
    ({"rc": 255, "reported_exit": None, "host_answers": True},
     "exited on node2: its guard was killed, and the role with it (ssh exit 255 with the "
     "connection intact)"),
    ({"rc": 255, "reported_exit": None, "host_answers": False},
     "lost its SSH connection on node2 (ssh exit 255)"),
    ({"rc": 255, "reported_exit": None, "host_answers": True,
      "last_stderr": "Timeout, server node2 not responding."},
     "lost its SSH connection on node2 (ssh exit 255)"),
    ({"rc": 255, "reported_exit": 255}, "exited with code 255 on node2"),   # the command's
    # srun
    ({"transport": "slurm", "rc": 1, "reported_exit": None, "connected": False,
      "attempts": 3, "last_early": "srun: error: Unable to create step"},
     "could not start a job step on node2 (3 attempt(s), srun exit 1: srun: error: Unable to "
     "create step)"),
    ({"transport": "slurm", "rc": 1, "reported_exit": None,
      "last_stderr": "srun: error: Node failure on node2"},
     "lost its node node2 (srun exit 1: srun: error: Node failure on node2)"),
    ({"transport": "slurm", "rc": 1, "reported_exit": None, "host_answers": False},
     "lost its node node2 (srun exit 1)"),
    ({"transport": "slurm", "rc": 1, "reported_exit": None, "host_answers": True,
      "last_stderr": "slurmstepd: error: *** STEP 12.3 CANCELLED AT 2026 ***"},
     "was cancelled by SLURM on node2 (slurmstepd: error: *** STEP 12.3 CANCELLED AT 2026 ***)"),
    ({"transport": "slurm", "rc": 1, "reported_exit": None, "host_answers": True,
      "last_stderr": "the role's own line"},
     "exited on node2: its guard was killed, and the role with it (srun exit 1)"),
    # a local guard killed
    ({"transport": "local", "remote": False, "rc": 137, "reported_exit": None,
      "guard_signal": 9},
     "exited with code 137: its guard was killed (SIGKILL), and the role with it"),
])
def test_each_row_of_the_table(changes, expected):
    assert say(dataclasses.replace(WORKER, **changes)) == expected


def test_the_probe_is_asked_only_where_a_row_depends_on_it():
    assert not needs_probe(WORKER)                                       # the role's own end
    assert needs_probe(dataclasses.replace(WORKER, rc=255, reported_exit=None))
    assert not needs_probe(dataclasses.replace(WORKER, rc=255, reported_exit=None,
                                               connected=False))
    assert not needs_probe(dataclasses.replace(
        WORKER, rc=255, reported_exit=None, last_stderr="Connection to node2 closed by "
        "remote host."))
    assert needs_probe(dataclasses.replace(WORKER, transport="slurm", rc=1, reported_exit=None))


def test_every_row_names_a_known_transport_and_the_last_holds_for_everything():
    assert {row.transport for row in TABLE} <= {None, "local", "ssh", "slurm"}
    assert TABLE[-1].transport is None and TABLE[-1].when(WORKER)
