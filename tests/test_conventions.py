"""The launcher's conventions that users bring from torchrun and horovodrun (issue 22), with
real jobs: the launcher's options end at the command's first word, ``--`` or not; each worker
knows its local rank; ``launch -v`` logs every allocation."""
import json
import re
import signal

import pytest

from conftest import EXAMPLE, PY, ROOT, run_mxlbbsp

pytestmark = pytest.mark.cluster

PROBE = ROOT / "tests" / "scripts" / "argv_probe.py"


def probes(out, n):
    return [json.loads((out.parent / f"{out.name}.{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize("dashes", [[], ["--"]], ids=["without --", "with --"])
def test_options_after_the_command_are_the_commands(tmp_path, dashes):
    """`mxlbbsp launch -n 2 python x.py --lr 0.1 --epochs 3 ...`: every option after the
    command's first word goes to the command, even those the launcher has (--epochs,
    --metrics, --checkpoint-dir, -n), with or without --."""
    out = tmp_path / "argv"
    args = ["--lr", "0.1", "--epochs", "3", "--metrics", "m.jsonl", "--checkpoint-dir", "ckx",
            "-n", "5", "--", "x"]
    count = "-np" if dashes else "-n"           # horovodrun's spelling too
    r = run_mxlbbsp("launch", count, 2, "--progress", 0, *dashes, PY, PROBE, out, *args,
                    cwd=tmp_path)
    assert r.rc == 0, r.output
    got = probes(out, 2)
    assert [p["argv"] for p in got] == [args, args]
    assert [p["num_workers"] for p in got] == [2, 2]
    assert not (tmp_path / "ckx").exists() and not (tmp_path / "m.jsonl").exists()
    assert not (tmp_path / f"{out.name}.2.json").exists()
    # and each worker's place on this machine (one host: all of the job's workers)
    assert [(p["local_rank"], p["local_size"]) for p in got] == [(0, 2), (1, 2)]
    # as torchrun sets them: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
    assert [p["torchrun"] for p in got] == [["0", "2", "0", "2"], ["1", "2", "1", "2"]]


def test_a_single_process_is_local_rank_0_of_1(tmp_path):
    import subprocess
    out = tmp_path / "argv"
    subprocess.run([PY, PROBE, out, "a"], check=True, timeout=60)
    (p,) = probes(out, 1)
    assert (p["rank"], p["local_rank"], p["local_size"], p["num_workers"]) == (0, 0, 1, 1)


ALLOCATION = re.compile(r"^\[mxlbbsp\] iteration (\d+): split (\d+),(\d+) of 64; predicted "
                        r"speeds (\d+),(\d+) samples/s; (.+)$", re.M)


@pytest.mark.parametrize("where", [["launch", "-v"], ["-v", "launch"]])
def test_verbose_logs_every_allocation(where):
    r = run_mxlbbsp(*where, "-n", 2, "--progress", 0, "--emulate-slowdown", "1,3", "--",
                    PY, EXAMPLE, "--model", "mlp", "--data", "digits", "--iterations", 8,
                    "--batch-size", 64, "--log-interval", 100, timeout=300)
    assert r.rc == 0, r.output
    found = ALLOCATION.findall(r.stderr)
    # the reports of t split t+2: iteration 1's split goes out before any report, 2's is
    # the warm-up's (from the reports of 0), 3..9 are planned from measured speeds
    assert [int(f[0]) for f in found] == list(range(3, 3 + len(found))), r.stderr
    assert len(found) >= 6, r.stderr
    for f in found:
        assert int(f[1]) + int(f[2]) == 64 and int(f[1]) > 0 and int(f[2]) > 0
        assert f[5].startswith(("new split", "kept the split", "the same split",
                                "equal split")), f
    assert "[mxlbbsp] iteration 1: split 32,32 (before any report)" in r.stderr
    assert "[mxlbbsp] iteration 2: split 32,32 (warm-up" in r.stderr
    assert "Using selector" not in r.output and "DEBUG" not in r.output


@pytest.mark.parametrize("sig, name", [("SIGKILL", "SIGKILL (exit code 137: kill -9, or the "
                                        "kernel's out-of-memory killer, see dmesg)"),
                                       ("SIGSEGV", "SIGSEGV (exit code 139)")])
def test_a_worker_killed_by_a_signal_is_named(tmp_path, sig, name):
    script = tmp_path / "die.py"
    script.write_text("import os, signal, time\n"
                      "import mxlbbsp\n"
                      "if mxlbbsp.rank() == 1:\n"
                      f"    time.sleep(1); os.kill(os.getpid(), signal.{sig})\n"
                      "time.sleep(120)\n")
    r = run_mxlbbsp("launch", "-n", 2, "--progress", 0, "--", PY, script, timeout=120)
    assert r.rc == 128 + getattr(signal, sig), r.output
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.stderr
    assert f"error: worker 1 was killed by {name}; stopping" in errors[0]


def test_the_schedulers_port_is_one_the_kernel_never_hands_a_ps_lite_node():
    """ps-lite's servers and workers take their ports by a bind to port 0 while the
    scheduler still imports MXNet: one handed the scheduler's chosen port got the others'
    registrations and aborted (van.cc "Check failed: is_scheduler_", seen in CI). The
    launcher's ports lie below the kernel's ephemeral range, and are free."""
    import socket
    from launcher import roles
    low = roles._ephemeral_low()
    for _ in range(20):
        port = roles.free_port("127.0.0.1")
        assert low - roles.FIXED_PORTS <= port < low, (port, low)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] >= low      # where the nodes' ports come from


def test_a_script_that_never_uses_mxlbbsp_or_the_kvstore_ends_at_once_and_cleanly():
    """`launch -n 2 -- python -c "print('hi')"`: no worker says hello, so the servers, which
    would wait for workers for ever, are stopped right after the workers end (not after the
    grace a job that used the kvstore gives them), with exit 0 and nothing left running."""
    from launcher import supervise
    assert supervise.FINISH_GRACE_UNSEEN < supervise.FINISH_GRACE
    r = run_mxlbbsp("launch", "-n", 2, "--progress", 0, "--", PY, "-c", "print('hi')",
                    timeout=120)
    assert r.rc == 0, r.output
    assert "[worker 0] hi" in r.stdout and "[worker 1] hi" in r.stdout, r.output
    assert "error" not in r.output and "warning" not in r.output, r.output
    assert "[mxlbbsp] done in" in r.stderr, r.output
