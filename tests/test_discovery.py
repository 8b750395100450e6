"""Host discovery (launcher/discovery.py): a real script run as a subprocess, and what
each kind of bad answer does."""
import stat

import pytest

from mxlbbsp.launcher import discovery as D
from mxlbbsp.launcher.errors import ConfigError
from mxlbbsp.launcher.hostfile import Host


def script(tmp_path, body, name="discover.sh"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_script_prints_hosts_with_their_slots(tmp_path):
    d = D.Discovery([script(tmp_path, "echo n1:2; echo 'alice@n2:4  # a comment'; echo; "
                                      "echo '[fe80::1]'")])
    found = d.poll()
    assert found.problem is None
    assert found.hosts == [Host("n1", slots=2), Host("n2", "alice", slots=4),
                           Host("fe80::1", slots=1)]


def test_a_failing_script_keeps_the_last_hosts_and_says_why(tmp_path):
    listing = tmp_path / "hosts"
    listing.write_text("n1:2\n")
    d = D.Discovery([script(tmp_path, f"cat {listing}")])
    assert d.poll().hosts == [Host("n1", slots=2)]
    for text, why in [("n1:x\n", "line 1: 'n1:x' is not host or host:slots"),
                      ("\n", "printed no host")]:
        listing.write_text(text)
        found = d.poll()
        assert found.hosts == [Host("n1", slots=2)] and why in found.problem, found
    listing.unlink()
    found = d.poll()
    assert found.hosts == [Host("n1", slots=2)]
    assert "exited with code 1: cat: " in found.problem


def test_a_hanging_script_is_killed_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "SCRIPT_TIMEOUT_S", 0.5)
    marker = tmp_path / "child-alive"
    d = D.Discovery([script(tmp_path, f"(sleep 2; touch {marker}) & sleep 30")])
    found = d.poll()
    assert "did not finish within 0.5 s" in found.problem and found.hosts == []
    import time
    time.sleep(2.5)
    assert not marker.exists()             # its whole process group went


def test_repeated_failures_end_the_job(tmp_path):
    d = D.Discovery([script(tmp_path, "exit 3")])
    for _ in range(D.FAILURES_TO_END - 1):
        assert "exited with code 3" in d.poll().problem
    with pytest.raises(D.DiscoveryFailed, match="exited with code 3, 5 times in a row"):
        d.poll()


def test_one_good_answer_resets_the_count(tmp_path):
    flag = tmp_path / "ok"
    d = D.Discovery([script(tmp_path, f"test -e {flag} && echo n1")])
    for round_ in range(3):
        for _ in range(D.FAILURES_TO_END - 1):
            assert d.poll().problem is not None
        flag.touch()
        assert d.poll().problem is None
        flag.unlink()


def test_more_slots_than_max_workers_takes_the_first(tmp_path):
    d = D.Discovery([script(tmp_path, "echo n1:2; echo n2:2; echo n3:2")], max_workers=3)
    assert d.poll().hosts == [Host("n1", slots=2), Host("n2", slots=1)]


def test_a_host_listed_twice_is_one_host():
    assert D.parse_output("n1:2\nn1:3\nn2\n", "x") == [Host("n1", slots=3), Host("n2")]


def test_garbage_is_named_with_its_line():
    with pytest.raises(ConfigError, match=r"x line 2: 'rm -rf /' is not host or host:slots"):
        D.parse_output("n1\nrm -rf /\n", "x")


def test_the_change_in_words():
    a = [Host("n1", slots=2), Host("n2")]
    assert D.describe_change(a, a + [Host("n3")]) == "host n3 joined"
    assert D.describe_change(a, a[:1]) == "host n2 left"
    assert D.describe_change(a, [Host("n1", slots=4), Host("n2")]) == \
        "host n1 has 4 slot(s) (was 2)"


def test_a_later_generation_resumes_from_the_checkpoint_dir_not_from_resume(tmp_path):
    """An elastic job launched with --resume OLD continues from OLD once; every later
    generation from the state its predecessor saved in --checkpoint-dir, on its own copy of
    the configuration (the next one is built while the current one runs)."""
    from mxlbbsp.launcher.config import LaunchConfig
    from mxlbbsp.launcher.elastic import generation_config
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    config = LaunchConfig(command=["x"], host_discovery_script=str(script),
                          checkpoint_dir=str(tmp_path / "ck"),
                          resume=str(tmp_path / "old"))     # (its folder: preflight's)
    first, later = generation_config(config, True), generation_config(config, False)
    assert first.resume == config.resume == str(tmp_path / "old")
    assert later.resume is None and later.checkpoint_dir == str(tmp_path / "ck")
    later.num_workers = 3
    assert config.num_workers is None and first is not config
