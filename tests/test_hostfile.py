"""Hostfiles, placement and the SSH options of `mxlbbsp launch`: no sshd needed.

Parsing and placement are tested as functions; bad input through the real command line
(one line on stderr, exit 2), and ``--dry-run`` prints the placement and the ssh commands of
a 2-host job without starting anything.
"""
import re
import sys

import pytest

from conftest import run_mxlbbsp
from mxlbbsp.launcher.config import ConfigError
from mxlbbsp.launcher.hostfile import Host, local_ranks, parse_hostfile, parse_hosts, place


def write(tmp_path, text, name="hosts"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_every_host_form(tmp_path):
    path = write(tmp_path, "# cluster\n"
                           "\n"
                           "node1\n"
                           "   node2 slots=4   # four workers here\n"
                           "alice@node3:2222\n"
                           "bob@10.0.0.4 slots=2\n"
                           "[fe80::1]:22 slots=2\n"
                           "127.0.0.2:2022\n"
                           "node5 port=22 slots=3\n"
                           "node6 slots=2 port=2\n")
    assert parse_hostfile(path) == [
        Host("node1"),
        Host("node2", slots=4),
        Host("node3", user="alice", port=2222),
        Host("10.0.0.4", user="bob", slots=2),
        Host("fe80::1", port=22, slots=2),
        Host("127.0.0.2", port=2022),
        Host("node5", port=22, slots=3),
        Host("node6", port=2, slots=2),
    ]
    assert Host("node3", user="alice").target == "alice@node3"
    assert Host("10.0.0.4").address == "10.0.0.4"
    assert Host("node1").address is None


@pytest.mark.parametrize("line, needle", [
    ("node1 slots=0", "slots must be at least 1"),
    ("node1 slots=-1", "unexpected 'slots=-1'"),
    ("node1 slots=two", "unexpected 'slots=two'"),
    ("node1 slots 2", "unexpected 'slots'"),
    ("node1:0", "port 0 is outside 1..65535"),
    ("node1 port=0", "port 0 is outside 1..65535"),
    ("node1:2", "is 'node1:2' 2 slots (as in horovodrun -H) or SSH port 2? write "
                "'node1 slots=2' or 'node1 port=2'"),
    ("alice@node1:1023", "write 'alice@node1 slots=1023' or 'alice@node1 port=1023'"),
    ("node1:2222 port=22", "the port is given twice"),
    ("node1 port=22 port=23", "port= given 2 times"),
    ("node1 slots=1000000000000", "slots 1000000000000 is more than 65536"),
    ("node1:65536", "port 65536 is outside 1..65535"),
    ("node1:ssh", "'node1:ssh' is not a host"),
    ("@node1", "'@node1' is not a host"),
    ("node/1", "'node/1' is not a host"),
    ("-oProxyCommand", "'-oProxyCommand' is not a host"),
    ("-v@node1", "'-v@node1' is not a host"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, needle):
    path = write(tmp_path, f"# first line\nnode0\n{line}\n")
    with pytest.raises(ConfigError) as err:
        parse_hostfile(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert needle in str(err.value)


def test_a_port_that_cannot_be_slots_stays_a_port(tmp_path):
    """host:N is the SSH port where it cannot mean slots: N >= 1024, or slots= on the line."""
    path = write(tmp_path, "node1:1024\nnode2:22 slots=1\n")
    assert parse_hostfile(path) == [Host("node1", port=1024), Host("node2", port=22)]


@pytest.mark.parametrize("spec, hosts", [
    ("node1:4,node2:4", [Host("node1", slots=4), Host("node2", slots=4)]),
    ("node1,node2", [Host("node1"), Host("node2")]),
    ("alice@10.0.0.1:2, [fe80::1]:3", [Host("10.0.0.1", user="alice", slots=2),
                                      Host("fe80::1", slots=3)]),
    ("node1:1", [Host("node1")]),
])
def test_an_inline_list_is_horovodruns(spec, hosts):
    assert parse_hosts(spec) == hosts


def test_an_existing_file_wins_over_a_list(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a:2").write_text("b slots=3\n")
    assert parse_hosts("a:2") == [Host("b", slots=3)]


@pytest.mark.parametrize("spec, needle", [
    ("node1,,node2", "-H 'node1,,node2': an empty item is not host or host:slots"),
    ("node1:two,node2", "'node1:two' is not host or host:slots"),
    ("node1:0", "'node1:0': slots must be at least 1"),
    ("node1:1000000000000", "slots 1000000000000 is more than 65536"),
    ("-oProxyCommand=x,b", "'-oProxyCommand=x' is not host or host:slots"),
    ("node1", "-H/--hostfile 'node1': no such file (one host inline: -H node1:1)"),
])
def test_a_malformed_inline_list_is_one_line(spec, needle):
    r = run_mxlbbsp("launch", "-H", spec, "--dry-run", "--", "python", "x.py")
    _one_line_exit_2(r, needle)


def test_local_ranks_count_the_workers_on_each_host():
    a, b = Host("a", slots=2), Host("b", slots=3)
    assert local_ranks(place([a, b], 4, 1).workers) == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert local_ranks([a, b, a]) == [(0, 2), (0, 1), (1, 2)]


def test_a_file_without_hosts_is_an_error(tmp_path):
    path = write(tmp_path, "# nothing here\n\n   \n")
    with pytest.raises(ConfigError, match="lists no hosts"):
        parse_hostfile(path)


def test_placement_servers_round_robin_workers_fill_slots_in_order():
    a, b, c = Host("a", slots=2), Host("b", slots=1), Host("c", slots=3)
    p = place([a, b, c], num_workers=5, num_servers=4)
    assert p.servers == [a, b, c, a]
    assert p.workers == [a, a, b, c, c]
    assert place([a, b, c], num_workers=1, num_servers=1).workers == [a]
    with pytest.raises(ConfigError, match="only 6 slot"):
        place([a, b, c], num_workers=7, num_servers=1)


# ---- through the command line: one line, exit 2 --------------------------------------------

def _one_line_exit_2(r, needle):
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mxlbbsp launch: error: ")
    assert needle in lines[0]
    assert "Traceback" not in r.output


@pytest.mark.parametrize("text, extra, needle", [
    ("a\nb c\n", [], ":2: unexpected 'c'"),
    ("a slots=0\n", [], ":1: slots must be at least 1"),
    ("a:99999\n", [], ":1: port 99999 is outside 1..65535"),
    ("", [], "lists no hosts"),
    ("# only a comment\n", [], "lists no hosts"),
    ("a slots=2\nb\n", ["-n", "4"], "-n 4 workers, but the hosts of -H have only 3 slot(s)"),
    ("a\n", ["--ssh-port", "0"], "--ssh-port 0: must be in 1..65535"),
    ("a\n", ["--ssh-option", "StrictHostKeyChecking"], "expected KEY=VALUE"),
    ("a\n", ["--ssh-identity", "/no/such/key"], "--ssh-identity '/no/such/key': no such file"),
    ("a\n", ["--emulate-slowdown", "1,2"], "has 2 factor(s) but -n is 1"),
    ("a slots=65536\nb slots=1\n", [], "65537 slots in all, at most 65536 workers; give -n"),
    ("a:2\n", [], ":1: is 'a:2' 2 slots (as in horovodrun -H) or SSH port 2?"),
])
def test_bad_hostfile_or_option(tmp_path, text, extra, needle):
    path = write(tmp_path, text)
    r = run_mxlbbsp("launch", "-H", path, *extra, "--dry-run", "--", "python", "x.py")
    _one_line_exit_2(r, needle)
    if needle.startswith(":"):
        assert f"{path}{needle}" in r.stderr


def test_missing_hostfile(tmp_path):
    r = run_mxlbbsp("launch", "-H", tmp_path / "nope", "--", "python", "x.py")
    _one_line_exit_2(r, "no such file")


@pytest.mark.parametrize("workers, relay, relays", [(2, None, 0), (63, None, 0), (64, None, 1),
                                                    (2, "on", 1), (64, "off", 0)])
def test_relay_auto_starts_relays_from_64_workers(workers, relay, relays):
    """--relay auto (the default): below RELAY_FROM workers every worker talks to the
    coordinator itself (the hop costs latency there: benchmarks/README.md, "Where relays
    pay"); on and off force it either way."""
    from mxlbbsp.launcher.config import RELAY_FROM
    assert RELAY_FROM == 64
    r = run_mxlbbsp("launch", "-n", workers, *(["--relay", relay] if relay else []),
                    "--dry-run", "--", "true")
    assert r.rc == 0, r.output
    rows = [line.split(None, 1)[0] for line in r.stdout.splitlines()]
    assert rows.count("relay") == relays and rows.count("worker") == workers, r.stdout


@pytest.mark.parametrize("hosts, hubs_option, hubs", [(32, None, 4), (31, None, 0),
                                                      (2, "on", 1), (32, "off", 0)])
def test_hubs_auto_starts_hubs_from_32_relays(tmp_path, hosts, hubs_option, hubs):
    """--hubs auto (the default): from HUB_FROM relays a hub on this machine per 8 relays,
    whose address is those relays' coordinator; on and off force it either way."""
    from mxlbbsp.launcher.config import HUB_FROM
    assert HUB_FROM == 32
    path = write(tmp_path, "".join(f"10.0.0.{h + 1} slots=2\n" for h in range(hosts)))
    r = run_mxlbbsp("launch", "-H", path, "--relay", "on", "--bind", "127.0.0.1",
                    *(["--hubs", hubs_option] if hubs_option else []),
                    "--dry-run", "--", "true")
    assert r.rc == 0, r.output
    lines = r.stdout.splitlines()
    rows = [line.split(None, 1)[0] for line in lines]
    assert rows.count("hub") == hubs and rows.count("relay") == hosts, r.stdout
    envs = [lines[i + 1] for i, row in enumerate(rows) if row == "relay"]
    for i, env in enumerate(envs):      # relay i reaches its hub, i // 8, or the coordinator
        want = f"<hub {i // 8} port>" if hubs else "<free port>"
        assert f"MXLBBSP_COORDINATOR='127.0.0.1:{want}'" in env, env


def test_hubs_without_relays_is_a_one_line_error():
    r = run_mxlbbsp("launch", "-n", 2, "--relay", "off", "--hubs", "on", "--dry-run", "--",
                    "true")
    _one_line_exit_2(r, "--hubs on carries the relays' messages, and --relay off starts none")


def test_dry_run_prints_placement_and_commands_and_starts_nothing(tmp_path):
    path = write(tmp_path, "127.0.0.1 slots=1\nalice@127.0.0.2:2222 slots=2\n")
    started = tmp_path / "started"
    r = run_mxlbbsp("launch", "-H", path, "-s", "2", "--ssh-port", "2200", "--relay", "on",
                    "--ssh-option", "ConnectTimeout=3", "--env", "EXTRA=1", "--dry-run",
                    "--", "touch", started)
    assert r.rc == 0, r.output
    assert not started.exists()
    rows = [line.split(None, 3) for line in r.stdout.splitlines()
            if line.split(None, 1)[0] in ("scheduler", "server", "relay", "worker")]
    assert [row[:3] for row in rows] == [
        ["scheduler", "-", "local"],
        ["server", "0", "127.0.0.1"], ["server", "1", "127.0.0.2"],
        ["relay", "0", "127.0.0.2"],             # the host of two workers has one
        ["worker", "0", "127.0.0.1"], ["worker", "1", "127.0.0.2"],
        ["worker", "2", "127.0.0.2"]]
    assert rows[-1][3] == f"touch {started}"
    assert rows[3][3].endswith(" -m mxlbbsp.relay")
    via = [line.split("via: ", 1)[1] for line in r.stdout.splitlines() if "via: " in line]
    assert len(via) == 6                         # every role but the local scheduler
    assert via[0].startswith("ssh ") and via[0].endswith(
        "-p 2200 127.0.0.1 'exec " + sys.executable +
        " -m mxlbbsp.launcher.guard'")
    assert "-p 2222 alice@127.0.0.2 " in via[-1]  # host:port wins over --ssh-port
    assert "-o ConnectTimeout=3" in via[-1] and "ConnectTimeout=10" not in via[-1]
    assert "MXLBBSP_TOKEN='<secret>'" in r.stdout
    assert "EXTRA" in r.stdout.splitlines()[1]   # the forwarded variables


def test_dry_run_of_an_inline_list_gives_each_worker_its_local_rank():
    r = run_mxlbbsp("launch", "-H", "127.0.0.1:2,127.0.0.2", "--dry-run", "--",
                    "python", "x.py")
    assert r.rc == 0, r.output
    envs = [line for line in r.stdout.splitlines() if "DMLC_ROLE=worker" in line]
    got = [tuple(int(re.search(rf"MXLBBSP_LOCAL_{k}=(\d+)", e)[1]) for k in ("RANK", "SIZE"))
           for e in envs]
    assert got == [(0, 2), (1, 2), (0, 1)]


@pytest.mark.parametrize("option", [["--ssh-port", "22"], ["--ssh-identity", "/etc/hostname"],
                                    ["--ssh-option", "ConnectTimeout=3"],
                                    ["--remote-python", "/usr/bin/python3"]])
def test_ssh_options_without_hosts_are_refused(option):
    r = run_mxlbbsp("launch", "-n", "1", *option, "--dry-run", "--", "python", "x.py")
    _one_line_exit_2(r, f"{option[0]} without -H")
