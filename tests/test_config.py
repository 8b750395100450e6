"""LaunchConfig as a value: constructing one checks the values alone and touches nothing of
the machine; its preflight() does the machine's checks with the same one-line refusals; a
job sizes its own copy and leaves the launch's value as it was."""
import os
import sys

import pytest

from mxlbbsp.launcher.config import ConfigError, LaunchConfig
from mxlbbsp.launcher.elastic import generation_config
from mxlbbsp.launcher.job import Job

#: audit events (PEP 578) that mean the file system was written or read, or a package
#: imported: none may come from constructing a LaunchConfig
_MACHINE = ("open", "os.mkdir", "os.rmdir", "os.remove", "os.listdir", "os.scandir",
            "tempfile.mkstemp", "tempfile.mkdtemp", "import", "socket.")
_events = None      # a list while recording; audit hooks cannot be removed, so they wait


def _hook(event, args):
    if _events is not None and event.startswith(_MACHINE):
        _events.append((event, args[:1]))


sys.addaudithook(_hook)


def _constructed(**fields) -> tuple:
    """A LaunchConfig of ``fields`` and the audit events its construction raised."""
    global _events
    _events = []
    try:
        config = LaunchConfig(command=["python", "train.py"], **fields)
    finally:
        seen, _events = _events, None
    return config, seen


def _everything_under(path) -> list:
    return sorted(os.path.relpath(os.path.join(d, n), path)
                  for d, dirs, files in os.walk(path) for n in dirs + files)


def test_construction_touches_nothing_and_preflight_refuses_a_missing_ssh_identity(tmp_path):
    key = tmp_path / "no-such-key"
    config, seen = _constructed(hostfile="127.0.0.1:2", ssh_identity=str(key))
    assert seen == [] and config.hosts == []        # the hostfile is not read either
    with pytest.raises(ConfigError) as refused:
        config.preflight()
    assert str(refused.value) == f"--ssh-identity {str(key)!r}: no such file"
    assert [h.name for h in config.hosts] == ["127.0.0.1"]


def test_construction_creates_and_probes_no_folder_and_preflight_refuses_an_unwritable_log_dir(
        tmp_path):
    (tmp_path / "a-file").write_text("")
    logs = tmp_path / "a-file" / "logs"          # under a file: no folder can be made there
    config, seen = _constructed(num_workers=2, log_dir=str(logs),
                                tensorboard=str(tmp_path / "tb"),
                                metrics=str(tmp_path / "m.jsonl"),
                                checkpoint_dir=str(tmp_path / "ck"))
    assert seen == [] and _everything_under(tmp_path) == ["a-file"]
    with pytest.raises(ConfigError) as refused:
        config.preflight()
    assert str(refused.value) == (f"--log-dir {str(logs)!r}: cannot create the folder "
                                  "(Not a directory); choose another")


def test_preflight_makes_the_folders_once_and_dry_run_makes_none(tmp_path):
    fields = dict(num_workers=2, log_dir=str(tmp_path / "logs"),
                  checkpoint_dir=str(tmp_path / "ck"), metrics=str(tmp_path / "m.jsonl"))
    LaunchConfig(command=["x"], dry_run=True, **fields).preflight()
    assert _everything_under(tmp_path) == []
    config = LaunchConfig(command=["x"], **fields)
    assert _everything_under(tmp_path) == []
    config.preflight()
    assert _everything_under(tmp_path) == ["ck", "logs"]    # --metrics: probed, not kept


def test_a_job_sizes_its_own_copy_and_the_launch_value_stays_as_given(tmp_path):
    config = LaunchConfig(command=["x"], hostfile="127.0.0.1:3", emulate_slowdown="1,2,3")
    config.preflight()
    before = repr(config), list(config.slowdown)
    job = Job(config)
    assert job.config is not config and job.config.num_workers == 3
    assert [s.factor(0) for s in job.config.slowdown] == [1, 2, 3]
    assert (repr(config), list(config.slowdown)) == before and config.num_workers is None


def test_copies_are_checked_as_values_again(tmp_path):
    """A generation's copy (dataclasses.replace) runs the same checks, and only those: it
    is cheap and touches nothing, so a copy made while a job runs costs nothing."""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1\n")
    script.chmod(0o755)
    config = LaunchConfig(command=["x"], host_discovery_script="hosts.sh", cwd=str(tmp_path),
                          checkpoint_dir="ck", resume="old")
    assert config.host_discovery_script == "hosts.sh"      # resolved by preflight
    global _events
    _events = []
    try:
        later = generation_config(config, first=False)
    finally:
        seen, _events = _events, None
    assert seen == []
    assert later.resume is None and config.resume == str(tmp_path / "old")
    assert later.checkpoint_dir == config.checkpoint_dir == str(tmp_path / "ck")
