"""Issue 10, item 6: every bad input is one line `mxlbbsp <cmd>: error: ...`, exit 2, no
traceback, and nothing started (the commands are real: were an input accepted, a job would
run, and exit 0)."""
import json
import os
import subprocess
import uuid

import numpy as np
import pytest

from conftest import PY, processes_with
from conftest import run_mxlbbsp as _run


def run_mxlbbsp(*args, **kw):
    """A refused command ends at once; one that was accepted by mistake may hang (a server
    as a worker): fail in 60 s rather than wait for it."""
    kw.setdefault("timeout", 60)
    return _run(*args, **kw)
from mxlbbsp.core import env as _env
from mxlbbsp.analysis import trace as _trace
from mxlbbsp.launcher.config import ConfigError, parse_env

#: a worker command that would succeed at once, were the job started
QUICK = ["--", PY, "-c", "pass"]


def one_line_error(r, command="launch"):
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"mxlbbsp {command}: error: "), lines[0]
    assert "Traceback" not in r.output
    assert "started" not in r.stdout
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["--stall-timeout", "nan"], "--stall-timeout nan: must be a finite number"),
    (["--stall-timeout", "inf"], "--stall-timeout inf: must be a finite number"),
    (["--progress", "nan"], "--progress nan: must be a finite number"),
    (["--progress", "inf"], "--progress inf: must be a finite number"),
    (["--progress", "-1"], "--progress must be >= 0"),
    (["--emulate-compute", "inf"], "--emulate-compute inf: must be a finite number"),
    (["--env", "DMLC_ROLE=server"], "--env DMLC_ROLE: reserved"),
    (["--env", "MXLBBSP_TOKEN=0123"], "--env MXLBBSP_TOKEN: reserved"),
    (["--env", "DMLC_NUM_WORKER=5"], "use -n/--num-workers instead"),
    (["--env", "DMLC_INTERFACE=lo"], "use --ps-interface instead"),
    (["--metrics", "/proc/m.jsonl"], "--metrics '/proc/m.jsonl': cannot write there"),
    (["--metrics", "/dev/full"], "--metrics '/dev/full': cannot write there (No space left"),
    (["--log-dir", "/proc/mxlbbsp-logs"], "--log-dir '/proc/mxlbbsp-logs': cannot create"),
    (["--ps-interface", "no-such-if0"], "no such network interface on this host"),
    (["--ps-interface", "lo", "--bind", "10.9.8.7"], "is not an address of --ps-interface lo"),
])
def test_bad_launch_option(args, needle):
    line = one_line_error(run_mxlbbsp("launch", "-n", 1, "--progress", "0", *args, *QUICK)
                          if "--progress" not in args else
                          run_mxlbbsp("launch", "-n", 1, *args, *QUICK))
    assert needle in line


def test_reserved_names_are_every_variable_the_launcher_writes():
    written = set(_env.ps_env("worker", "h", 1, 1, 1, node_host="h", interface="lo"))
    written |= set(_env.worker_env(0, "lbbsp", ("h", 1), "t", "h", "3", 0.5, ("runq",), (0, 1),
                                   world_size=2))
    written |= set(_env.relay_env("\0relay", ("h", 1), "t", "h", 2))     # a host's relay
    from mxlbbsp import modes
    for name in modes.available():                   # the sync modes' own variables
        written |= set(modes.get(name).worker_env({}))
    assert written == set(_env.RESERVED)
    # a user's own variable, even with the prefix, stays allowed (tests pass this one)
    assert parse_env(["MXLBBSP_TEST_MARK=x", "DMLC_LOG_DEBUG=1"]) == {
        "MXLBBSP_TEST_MARK": "x", "DMLC_LOG_DEBUG": "1"}
    with pytest.raises(ConfigError, match="reserved"):
        parse_env(["MXLBBSP_RANK=1"])


def tiny_tmpfs(where, room: int):
    """Mount a 16 KB tmpfs at ``where`` and fill it up to ``room`` bytes free (root only)."""
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    fd = os.open(where / "fill", os.O_WRONLY | os.O_CREAT)
    try:
        while os.statvfs(where).f_bavail * os.statvfs(where).f_frsize > room:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.fixture
def full_fs(tmp_path):
    """A tiny tmpfs filled to the last block."""
    try:
        tiny_tmpfs(tmp_path / "full", 0)
        yield tmp_path / "full"
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "full")], capture_output=True)


@pytest.fixture
def full_fs_with_room(tmp_path):
    """A tiny tmpfs with one 4 KB block free: room for the first few metrics records."""
    try:
        tiny_tmpfs(tmp_path / "room", 4096)
        yield tmp_path / "room"
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "room")], capture_output=True)


def test_metrics_and_log_dir_on_a_full_file_system(full_fs):
    line = one_line_error(run_mxlbbsp("launch", "-n", 1, "--progress", "0",
                                      "--metrics", full_fs / "m.jsonl", *QUICK))
    assert "is full" in line
    assert not (full_fs / "m.jsonl").exists()
    line = one_line_error(run_mxlbbsp("launch", "-n", 1, "--progress", "0",
                                      "--log-dir", full_fs / "logs", *QUICK))
    assert "No space left on device" in line or "is full" in line


def test_metrics_check_leaves_an_existing_file_untouched(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("earlier run\n")
    r = run_mxlbbsp("launch", "-n", 1, "--metrics", path, "--dry-run", *QUICK)
    assert r.rc == 0, r.output
    assert path.read_text() == "earlier run\n"
    fresh = tmp_path / "new.jsonl"
    r = run_mxlbbsp("launch", "-n", 1, "--metrics", fresh, "--dry-run", *QUICK)
    assert r.rc == 0 and not fresh.exists()


def test_duplicate_slots_in_a_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two\n127.0.0.1 slots=1\n127.0.0.2 slots=2 slots=3\n")
    line = one_line_error(run_mxlbbsp("launch", "-H", hosts, *QUICK))
    assert f"{hosts}:3: slots= given 2 times" in line


def test_duplicate_rows_in_a_slowdown_csv(tmp_path):
    csv = tmp_path / "slow.csv"
    csv.write_text("iteration,rank,slowdown\n0,0,1\n0,1,2\n5,1,3\n5,1,4\n")
    line = one_line_error(run_mxlbbsp("launch", "-n", 2, "--emulate-slowdown", csv, *QUICK))
    assert f"{csv}:5: rank 1, iteration 5 already has a slowdown on line 4" in line
    csv.write_bytes(b"iteration,rank,slowdown\n0,0,\xff\n")
    line = one_line_error(run_mxlbbsp("launch", "-n", 2, "--emulate-slowdown", csv, *QUICK))
    assert "not a text (UTF-8) CSV file" in line


METRIC = {"iteration": 1, "rank": 0, "batch_size": 4, "compute_s": 1.0, "wait_s": 0.0,
          "speed": 4.0, "predicted_speed": None, "cpu_percent": 1.0, "mem_percent": 1.0,
          "sync": "lbbsp", "time": 0.0}


@pytest.mark.parametrize("spelling", ["m.jsonl", "./m.jsonl", "link.jsonl", "hard.jsonl",
                                      "../{dir}/m.jsonl"])
def test_trace_never_overwrites_its_input(tmp_path, spelling):
    metrics = tmp_path / "m.jsonl"
    text = json.dumps(METRIC) + "\n"
    metrics.write_text(text)
    os.symlink("m.jsonl", tmp_path / "link.jsonl")
    os.link(metrics, tmp_path / "hard.jsonl")
    r = run_mxlbbsp("trace", "m.jsonl", "-o", spelling.format(dir=tmp_path.name), cwd=tmp_path)
    assert "would overwrite the metrics file" in one_line_error(r, "trace")
    assert metrics.read_text() == text


def test_report_on_a_non_utf8_file(tmp_path):
    (tmp_path / "m.jsonl").write_bytes(json.dumps(METRIC).encode() + b"\n\xff\xfe\x00\n")
    r = run_mxlbbsp("report", "m.jsonl", "-o", "out", cwd=tmp_path)
    assert "m.jsonl:2: not UTF-8 text" in one_line_error(r, "report")


def test_report_on_a_deeply_nested_line(tmp_path):
    (tmp_path / "m.jsonl").write_text("[" * 500_000 + "\n")
    r = run_mxlbbsp("report", "m.jsonl", "-o", "out", cwd=tmp_path)
    assert "m.jsonl:1: not a JSON object" in one_line_error(r, "report")


def _trace_csv(path, speeds, iterations=None):
    iterations = iterations or list(range(len(speeds)))
    rows = "".join(f"{i},0,{s!r},50,50\n" for i, s in zip(iterations, speeds))
    path.write_text("iteration,rank,speed,cpu_percent,mem_percent\n" + rows)
    return path


def test_predict_with_an_iteration_of_10_to_the_30(tmp_path):
    its = list(range(_trace.MIN_ROWS)) + [10 ** 30]
    path = _trace_csv(tmp_path / "t.csv", [10.0] * len(its), its)
    r = run_mxlbbsp("predict", path)
    line = one_line_error(r, "predict")
    assert f"t.csv:{len(its) + 1}: column iteration: {10 ** 30} is out of range" in line


def test_predict_json_with_speeds_near_the_float_range(tmp_path):
    """Valid input (finite speeds), so a correct result: the same scores as the same trace
    in ordinary units, scaled."""
    rng = np.random.default_rng(0)
    base = [0.5 + float(x) for x in rng.random(_trace.MIN_ROWS + 5)]   # * 1e308 < max
    small = _trace_csv(tmp_path / "small.csv", base)
    huge = _trace_csv(tmp_path / "huge.csv", [x * 1e308 for x in base])
    got = {}
    for name, path in (("small", small), ("huge", huge)):
        r = run_mxlbbsp("predict", path, "--predictors", "last,ema", "--json")
        assert r.rc == 0, r.output
        assert "Traceback" not in r.output and r.stderr == ""
        got[name] = json.loads(r.stdout)
    for p in ("last", "ema"):
        assert got["huge"][p]["mape"] == pytest.approx(got["small"][p]["mape"], rel=1e-9)
        assert got["huge"][p]["rmse"] == pytest.approx(got["small"][p]["rmse"] * 1e308,
                                                       rel=1e-9)


def test_nothing_of_a_refused_job_runs():
    marker = uuid.uuid4().hex
    r = run_mxlbbsp("launch", "-n", 2, "--env", "DMLC_ROLE=server", *QUICK, marker=marker)
    assert r.rc == 2
    assert processes_with(marker) == []


def test_a_log_write_that_fails_mid_run_is_one_warning(capsys):
    """A log file that stops taking writes (disk full) must not kill the thread that drains
    the process's output (which would block the process on a full pipe)."""
    from mxlbbsp.launcher.procs import Output
    out = Output()
    with open("/dev/full", "w", buffering=1) as log:
        for k in range(3):
            out.line("worker 0", f"line {k}", False, log)
        captured = capsys.readouterr()
        assert captured.out.splitlines() == [f"[worker 0] line {k}" for k in range(3)]
        warnings = captured.err.strip().splitlines()
        assert len(warnings) == 1 and "cannot write /dev/full" in warnings[0]
        try:
            log.close()
        except OSError:
            pass


@pytest.mark.cluster
def test_metrics_file_system_fills_during_the_run(full_fs_with_room):
    """The file system of --metrics has room at launch and fills during the run: one line
    naming the metrics file, exit 2, no worker traceback, nothing left running."""
    from conftest import EXAMPLE
    metrics = full_fs_with_room / "m.jsonl"
    r = run_mxlbbsp("launch", "-n", 2, "--progress", "0", "--metrics", metrics, "--", PY,
                    EXAMPLE, "--model", "mlp", "--data", "digits", "--epochs", "1",
                    "--batch-size", "64", "--log-interval", "100", timeout=300)
    assert r.rc == 2, r.output
    assert "Traceback" not in r.output and "lost its connection" not in r.output
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.stderr
    assert f"cannot write the metrics file '{metrics}' (No space left on device)" in errors[0]


# ---- issue 22: inputs that gave a traceback, passed silently or said too little ------------

HUGE = 1_000_000_000_000


@pytest.mark.parametrize("args, needle", [
    (["-n", HUGE, "--dry-run"], f"-n/--num-workers {HUGE}: at most 65536 workers"),
    (["-n", 1, "-s", HUGE], f"-s/--num-servers {HUGE}: at most 65536 servers"),
    (["-n", 1, "--emulate-compute", "1e308"],
     "--emulate-compute 1e+308: at most 60000 ms (a minute) of emulated compute per sample"),
    (["-n", 1, "--checkpoint-dir", "/proc/nope/ckpt"],
     "--checkpoint-dir '/proc/nope/ckpt': cannot create the folder"),
    (["-n", 1, "--checkpoint-dir", "/proc/nope/ckpt", "--dry-run"],
     "--checkpoint-dir '/proc/nope/ckpt': cannot create the folder in '/proc'"),
    (["-n", 1, "--ssh-port", "2222"], "--ssh-port without -H"),
])
def test_out_of_range_launch_inputs(args, needle):
    r = run_mxlbbsp("launch", "--progress", "0", *args, *QUICK)
    assert needle in one_line_error(r)


def test_a_hostfile_with_10_to_the_12_slots(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 slots={HUGE}\n")
    line = one_line_error(run_mxlbbsp("launch", "-H", hosts, "--dry-run", *QUICK))
    assert f"{hosts}:1: slots {HUGE} is more than 65536" in line


def _metrics(path, **changes):
    """Three good records, the second one changed."""
    records = [dict(METRIC, iteration=i) for i in range(3)]
    records[1].update(changes)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("command, changes, needle", [
    (["report", "-o", "out"], {"batch_size": 10 ** 400},
     "m.jsonl:2: batch_size is an integer of 401 digits, expected a number >= 0"),
    (["report", "-o", "out"], {"sync_s": 10 ** 400}, "m.jsonl:2: sync_s is an integer of 401 "
                                                     "digits, out of range"),
    (["trace", "-o", "t.csv"], {"rank": "one"}, "m.jsonl:2: rank is 'one', expected an "
                                                "integer >= 0"),
    (["trace", "-o", "t.csv"], {"rank": "1"}, "m.jsonl:2: rank is '1', expected an integer"),
    (["plan", "--samples", "1000"], {"rank": "one"}, "m.jsonl:2: rank is 'one', expected"),
])
def test_bad_fields_of_a_metrics_file(tmp_path, command, changes, needle):
    _metrics(tmp_path / "m.jsonl", **changes)
    r = run_mxlbbsp(command[0], "m.jsonl", *command[1:], cwd=tmp_path)
    assert needle in one_line_error(r, command[0])


@pytest.mark.parametrize("args, needle", [
    (["--samples", HUGE * 10 ** 6], "--samples 1000000000000000000: must be in 1..1e+12"),
    (["--samples", 1000, "--epochs", "1e300"], "--epochs 1e+300: must be a positive number"),
    (["--samples", 1000, "--batch-range", f"64:{HUGE}"], f"the maximum {HUGE} is more than"),
    (["--samples", HUGE, "--epochs", 10 ** 6],
     "take 3.96e+08 years at best on its workers (speeds 40, 40"),
])
def test_plan_on_absurd_values(tmp_path, args, needle):
    """A plan of absurd inputs printed a table of inf (or of 10^300 hours)."""
    # a varied profile (4 and 16 samples, 40 samples/s): plan refuses one of a single size
    records = [dict(METRIC, iteration=i, rank=r, batch_size=4 + 12 * (i % 2),
                    compute_s=(4 + 12 * (i % 2)) / 40, speed=40.0, sync_s=0.0)
               for i in range(12) for r in range(2)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    r = run_mxlbbsp("plan", "m.jsonl", *args, cwd=tmp_path)
    assert needle in one_line_error(r, "plan")


def test_plan_on_times_near_the_float_range(tmp_path):
    records = [dict(METRIC, iteration=i, rank=r, batch_size=4 + 12 * (i % 2),
                    compute_s=1e300 * (1 + 3 * (i % 2)), speed=1e-299, sync_s=0.0)
               for i in range(12) for r in range(2)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    r = run_mxlbbsp("plan", "m.jsonl", "--samples", 1000, cwd=tmp_path)
    assert "check --samples, --epochs and the file's compute_s and speed" in \
        one_line_error(r, "plan")


@pytest.mark.parametrize("command, needle", [
    (["python", "no_such_script.py", "--lr", "0.1"],
     "python: can't open file 'no_such_script.py': no such file (in "),
    ([PY, "-u", "-W", "ignore", "no_such_script.py"], "can't open file 'no_such_script.py'"),
    (["./script.sh"], "permission denied: './script.sh' is not executable; make it "
                      "executable (chmod +x ./script.sh) or run it with sh"),
    (["./train.py"], "or run it with python, e.g. -- python ./train.py"),
    (["no-such-command-xyz"], "command not found: 'no-such-command-xyz' is not on PATH"),
    (["./no-such-command-xyz"], "command not found: './no-such-command-xyz'"),
    (["./sub"], "'./sub' is a folder, not a command"),
])
def test_a_command_that_cannot_run_is_one_line(tmp_path, command, needle):
    for name in ("script.sh", "train.py"):
        (tmp_path / name).write_text("#!/bin/sh\nexit 0\n")      # not executable
    (tmp_path / "sub").mkdir()
    marker = uuid.uuid4().hex
    r = run_mxlbbsp("launch", "-n", 2, "--progress", 0, "--", *command, cwd=tmp_path,
                    marker=marker)
    assert needle in one_line_error(r)
    assert processes_with(marker) == []


def test_python_options_before_the_script():
    from mxlbbsp.launcher.guard import python_script
    assert python_script(["python3.11", "-u", "-X", "dev", "-W", "ignore", "t.py", "a"]) == "t.py"
    assert python_script(["/usr/bin/python", "--", "t.py"]) == "t.py"
    for argv in (["python", "-m", "pkg"], ["python", "-mpkg"], ["python", "-c", "x"],
                 ["python", "-"], ["python"], ["sh", "t.py"], ["pythonista", "t.py"]):
        assert python_script(argv) is None, argv
