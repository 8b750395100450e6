"""The command line answers --help and rejects bad input with one line and exit 2."""
import pytest

from conftest import run_mxlbbsp


def test_help_lists_launch():
    r = run_mxlbbsp("--help")
    assert r.rc == 0
    assert "launch" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["launch", "-n", "0", "--", "python", "x.py"], "-n/--num-workers must be at least 1"),
    (["launch", "-n", "2"], "missing the command to run"),
    (["launch", "-n", "2", "--emulate-slowdown", "1,2,3", "--", "python", "x.py"],
     "has 3 factor(s) but -n is 2"),
    (["launch", "-n", "2", "--emulate-slowdown", "1,0.5", "--", "python", "x.py"],
     "must be a number >= 1"),
    (["launch", "-n", "2", "--nonsense", "--", "python", "x.py"], "No such option"),
    (["launch", "-n", "2", "--env", "NOEQUALS", "--", "python", "x.py"], "expected KEY=VALUE"),
    (["launch", "-n", "2", "--", "no-such-program-xyz"], "command not found"),
    (["launch", "-n", "2", "--metrics", "/no/such/dir/m.jsonl", "--", "python", "x.py"],
     "does not exist"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = run_mxlbbsp(*args)
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert lines[0].startswith("mxlbbsp launch: error: ")
    assert "Traceback" not in r.output


def test_launch_from_a_deleted_folder_is_one_line(tmp_path):
    import subprocess
    from conftest import PY
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$0" -m '
                           "mxlbbsp.launcher launch -n 1 -- true", PY],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mxlbbsp launch: error: the current folder no longer "
                                   "exists; cd to the folder to launch from")
