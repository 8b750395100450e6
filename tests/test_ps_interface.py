"""Issue 10, item 9: `--ps-interface IFACE` decides where ps-lite listens. A real job (a plain
MXNet kvstore script): every socket its processes listen on is on IFACE's address."""
import os
import socket
import subprocess
import uuid

import psutil

from conftest import PY, ROOT, mxlbbsp_argv, processes_with, wait_no_leftovers

SCRIPT = ROOT / "tests" / "scripts" / "kv_listen.py"


def an_interface():
    """A non-loopback interface with an IPv4 address (discriminates from the default,
    127.0.0.1), else lo."""
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        v4 = [a.address for a in addrs if a.family == socket.AF_INET]
        if v4 and name != "lo" and not v4[0].startswith("127."):
            return name, v4[0]
    return "lo", "127.0.0.1"


def listening(proc):
    conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") \
        else proc.connections(kind="tcp")
    return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}


def listening_addresses(args, marker):
    """Run `mxlbbsp launch ARGS -- kv_listen.py` until its worker has pulled; then
    {(pid, command): addresses listened on} of the job's processes; then stop it."""
    argv = mxlbbsp_argv("launch", "--env", f"MXLBBSP_TEST_MARK={marker}", *args, "--progress",
                        "0", "--", PY, SCRIPT, "30")
    env = dict(os.environ, MXLBBSP_TEST_MARK=marker)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "pulled" in line:
                break
        assert any("pulled" in line for line in lines), "".join(lines)
        found = {}
        for p in processes_with(marker):
            try:
                addrs = listening(p)
            except psutil.Error:
                continue
            if addrs:
                found[(p.pid, " ".join(p.cmdline()[:4]))] = addrs
        return found
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_ps_lite_listens_on_the_chosen_interface():
    iface, address = an_interface()
    marker = uuid.uuid4().hex
    found = listening_addresses(["-n", 1, "-s", 1, "--ps-interface", iface], marker)
    # the launcher (coordinator), the scheduler, the server and the worker
    assert len(found) >= 4, found
    assert all(addrs == {address} for addrs in found.values()), (iface, found)
    assert wait_no_leftovers(marker) == []
