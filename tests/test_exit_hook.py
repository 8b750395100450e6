"""The workers' exit hook (launcher/_boot/sitecustomize.py) on its own: plain Python
processes with the folder first on PYTHONPATH, as the guard starts workers. No MXNet: the
hang itself (ps-lite's finalize barrier) is tested end to end in test_failures.py."""
import os
import subprocess
import sys
import textwrap

import pytest

from mxlbbsp.core import env as _env
from mxlbbsp.launcher import guard, said

BOOT = guard.BOOT_DIR
#: proves that the interpreter's teardown ran (an atexit handler) or did not
ATEXIT = "import atexit; atexit.register(lambda: print('teardown ran', flush=True))\n"


def run(code, env=None, pythonpath=(BOOT,)):
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full["PYTHONPATH"] = os.pathsep.join(pythonpath)
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", ATEXIT + textwrap.dedent(code)],
                          capture_output=True, text=True, env=full, timeout=60)


def marker(r):
    return [line for line in r.stderr.splitlines() if line.startswith(said.EXIT_MARKER)]


def test_the_names_agree():
    text = open(os.path.join(BOOT, "sitecustomize.py")).read()
    assert f'MARKER = "{said.EXIT_MARKER}"' in text
    assert said.ENDED_MARKER == said.EXIT_MARKER + " ended" and \
        'ENDED = MARKER + " ended"' in text
    assert f'ENABLE = "{_env.EXIT_HOOK}"' in text


@pytest.mark.parametrize("code, rc, reason", [
    ("raise RuntimeError('boom')", 1, "RuntimeError: boom"),
    ("import sys; sys.exit(3)", 3, "SystemExit: 3"),
    ("raise SystemExit(3)", 3, "SystemExit: 3"),
    ("def f():\n    raise SystemExit(4)\nf()", 4, "SystemExit: 4"),
    ("import sys; sys.exit('bad input')", 1, "SystemExit: bad input"),
    ("raise ValueError('two\\nlines')", 1, "ValueError: two lines"),
    ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
])
def test_a_failure_ends_the_process_at_once_with_its_code(code, rc, reason):
    r = run(code)
    assert r.returncode == rc, r.stderr
    assert "teardown ran" not in r.stdout           # no teardown: no finalize barrier
    assert marker(r) == [f"{said.EXIT_MARKER} {rc} {reason}"]
    if "Error" in reason:
        assert "Traceback (most recent call last)" in r.stderr     # printed as usual
    if "bad input" in reason:
        assert "bad input" in r.stderr.splitlines()[0]


@pytest.mark.parametrize("code", [
    "print('fine')",
    "import sys; sys.exit(0)",
    "import sys; sys.exit()",
    "raise SystemExit",
    "try:\n    raise SystemExit(5)\nexcept SystemExit as e:\n    assert e.code == 5\n",
    "import sys\ntry:\n    sys.exit(6)\nexcept SystemExit:\n    pass\n",
    "try:\n    raise KeyError(1)\nexcept KeyError:\n    pass\n",
    # another thread's exit or exception does not end the process
    "import sys, threading\nt = threading.Thread(target=sys.exit, args=(3,))\nt.start(); t.join()",
])
def test_what_succeeds_still_tears_down_as_before(code):
    r = run(code)
    assert r.returncode == 0, r.stderr
    assert "teardown ran" in r.stdout
    # the one line it adds: the script ended normally (before the finalize barrier)
    assert r.stderr == said.ENDED_MARKER + "\n"


def test_the_normal_end_is_announced_by_the_workers_own_process_only():
    # a Python child of the worker (e.g. a spawned data-loading process) ends too: no line
    r = run("import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'print(1)'], check=True)\n")
    assert r.returncode == 0 and marker(r) == [said.ENDED_MARKER], r.stderr


def test_no_normal_end_is_announced_with_the_hook_off():
    r = run("print('fine')", env={_env.EXIT_HOOK: "0"})
    assert r.returncode == 0 and marker(r) == [], r.stderr


def test_an_exception_in_a_thread_is_printed_and_the_process_goes_on():
    r = run("import threading\nt = threading.Thread(target=lambda: 1 / 0)\nt.start(); t.join()")
    assert r.returncode == 0 and "ZeroDivisionError" in r.stderr
    assert marker(r) == [said.ENDED_MARKER]                  # it ended normally
    assert "teardown ran" in r.stdout


#: proves that the interpreter tore the main module down (what frees MXNet's KVStore and
#: runs ps-lite's finalize barrier), which runs after every atexit handler
FINALIZED = ("import os\nclass _D:\n    def __del__(self, write=os.write):\n"
             "        write(1, b'finalized\\n')\n_d = _D()\n")


def test_the_teardown_probe_shows_a_teardown():
    assert "finalized" in run(FINALIZED + "raise SystemExit(0)").stdout
    assert "finalized" in run(FINALIZED, env={_env.EXIT_HOOK: "0"}).stdout


def test_a_script_with_its_own_excepthook_still_ends_without_teardown():
    r = run(FINALIZED + "import sys\nsys.excepthook = lambda *a: print('mine', file=sys.stderr)\n"
            "raise RuntimeError('x')")
    assert r.returncode == 1 and "mine" in r.stderr          # the script's hook printed
    assert "teardown ran" in r.stdout                         # and its atexit handlers ran
    assert "finalized" not in r.stdout                        # but no module teardown
    assert marker(r) == [f"{said.EXIT_MARKER} 1 RuntimeError: x"]


def test_own_excepthook_under_python_m(tmp_path):
    (tmp_path / "job.py").write_text(FINALIZED + "import sys\n"
                                     "sys.excepthook = lambda *a: None\nraise KeyError('k')\n")
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([BOOT, str(tmp_path)]))
    r = subprocess.run([sys.executable, "-m", "job"], capture_output=True, text=True,
                       env=full, timeout=60)
    assert r.returncode == 1 and "finalized" not in r.stdout
    assert marker(r) == [f"{said.EXIT_MARKER} 1 KeyError: 'k'"]


def test_a_traceback_shown_by_the_code_module_is_not_taken_for_a_failure():
    # code.InteractiveInterpreter sets sys.last_value when it shows an error it caught
    r = run(FINALIZED + "import code, sys\nsys.excepthook = lambda *a: print('mine', *a[:2])\n"
            "code.InteractiveInterpreter().runsource('1/0')\nprint('fine')")
    assert r.returncode == 0 and "mine" in r.stdout and not marker(r)
    assert "fine" in r.stdout and "finalized" in r.stdout


def test_a_sitecustomize_that_was_there_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.CHAINED = 1\n")
    r = run("import builtins, sys\nprint(builtins.CHAINED)\nsys.exit(3)",
            pythonpath=(BOOT, str(tmp_path)))
    assert r.returncode == 3 and r.stdout.startswith("1\n"), r.stderr


def test_exit_hook_0_turns_it_off():
    r = run("raise SystemExit(3)", env={_env.EXIT_HOOK: "0"})
    assert r.returncode == 3 and "teardown ran" in r.stdout and not marker(r)
