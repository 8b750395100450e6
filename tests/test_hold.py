"""The hold (launcher/hold.py, mxlbbsp/worker/hold.py): workers of an elastic job's next
generation, started ahead, wait at their first need of the checkpoint until they are told
it; real processes and sockets on loopback."""
import json
import os
import socket
import subprocess
import time

import pytest

from conftest import PY, ROOT
from launcher.hold import Hold
from mxlbbsp.core import env as E

#: a worker's first need of the checkpoint, as mxlbbsp.Trainer and DataLoader have it
PROBE = ("from mxlbbsp.worker import hold; import os; "
         "print(json.dumps([hold.resume(), hold.resume(), os.environ.get('MXLBBSP_HOLD')]))")


def worker(hold, rank, token=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", MXLBBSP_RANK=str(rank),
               MXLBBSP_TOKEN=token or hold.token,
               MXLBBSP_HOLD=f"{hold.address[0]}:{hold.address[1]}")
    env.pop(E.RESUME, None)
    return subprocess.Popen([PY, "-c", "import json; " + PROBE], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def until(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.05)


def test_held_workers_are_told_the_checkpoint_once_all_wait():
    hold = Hold("127.0.0.1", "t0ken", 2)
    procs = [worker(hold, r) for r in range(2)]
    try:
        until(lambda: hold.held == 2)
        assert all(p.poll() is None for p in procs)          # waiting, not ended
        assert hold.release("/ck/ckpt-00000041") == 2
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        # asked twice, waited once; the hold's variable is not passed on to its children
        assert json.loads(out) == ["/ck/ckpt-00000041", "/ck/ckpt-00000041", None], err


def test_a_release_without_a_checkpoint_starts_from_scratch():
    hold = Hold("127.0.0.1", "t0ken", 1)
    p = worker(hold, 0)
    try:
        until(lambda: hold.held == 1)
        hold.release(None)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert json.loads(out) == [None, None, None], err


def test_a_generation_given_up_ends_its_workers_quietly():
    hold = Hold("127.0.0.1", "t0ken", 2)
    p = worker(hold, 1)
    try:
        until(lambda: hold.held == 1)
        hold.close()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert (p.returncode, out, err) == (0, "", "")


@pytest.mark.parametrize("token, rank", [("wrong", 0), (None, 5), (None, -1)])
def test_a_stranger_is_not_held(token, rank):
    """Without the job's token, or with a rank outside the job: closed at once, and the
    process ends as one given up (nothing of it was used)."""
    hold = Hold("127.0.0.1", "t0ken", 2)
    p = worker(hold, rank, token)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        hold.close()
    assert (p.returncode, out) == (0, ""), err
    assert hold.held == 0


def test_a_rank_held_twice_keeps_the_first():
    hold = Hold("127.0.0.1", "t0ken", 2)
    first = socket.create_connection(hold.address)
    first.sendall(b'{"type": "hold", "token": "t0ken", "rank": 0}\n')
    until(lambda: hold.held == 1)
    second = socket.create_connection(hold.address)
    second.sendall(b'{"type": "hold", "token": "t0ken", "rank": 0}\n')
    assert second.recv(100) == b""                    # closed
    assert hold.held == 1
    hold.release("/ck/x")
    assert first.makefile("rb").readline() == b'{"type":"release","resume":"/ck/x"}\n'
