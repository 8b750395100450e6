"""Shared by the benchmark scripts: run a job with `mxlbbsp launch`, summarise its metrics,
and write results (JSON + a markdown table carrying the command that produced it).

Every figure is a *ratio measured side by side in one run*: this machine is shared and noisy,
so modes are interleaved round by round (ABBA order) and the ratio is taken per round.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_gluon.py"
RESULTS = ROOT / "benchmarks" / "results"
PY = sys.executable

#: set by :func:`smoke`: the script runs at its smallest size (seconds), to prove that it
#: still runs (tests/test_bench_commands.py); its results go to a temporary folder
SMOKE = False
#: where ``--smoke`` results go instead of benchmarks/results (the test sets it)
SMOKE_RESULTS = "MXLBBSP_BENCH_RESULTS"

sys.path.insert(0, str(ROOT))
from mxlbbsp.core import metrics as _metrics  # noqa: E402


@contextlib.contextmanager
def worktree(rev: str):
    """The code of commit ``rev`` in a temporary git worktree, removed afterwards: for the
    benchmarks' ``--baseline REV`` (the same measurement on older code, side by side)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=ROOT,
                       check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)


def importable(tree: Path) -> Path:
    """Make ``tree``'s own launcher and models the ones its mxlbbsp imports (as links in
    its mxlbbsp/). An editable install maps ``mxlbbsp.launcher`` and ``mxlbbsp.models`` to
    the checkout it was made from: a process with PYTHONPATH=tree would take that
    checkout's launcher with the tree's package."""
    import importlib.util
    for name in ("launcher", "models"):
        spec = importlib.util.find_spec(f"mxlbbsp.{name}")
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        link = tree / "mxlbbsp" / name
        if origin is not None and tree.resolve() not in origin.parents and not link.exists():
            link.symlink_to(tree / name, target_is_directory=True)
    return tree


def add_smoke(parser) -> None:
    """``--smoke``: the smallest size of a benchmark, seconds, to check that it runs."""
    parser.add_argument("--smoke", action="store_true",
                        help="smallest size (seconds): checks that the script runs; the "
                             "results go to $MXLBBSP_BENCH_RESULTS or a temporary folder, "
                             "never into benchmarks/results")


def smoke(args) -> bool:
    """True when ``args.smoke``: results are then written out of the way (see SMOKE)."""
    global SMOKE, RESULTS
    if getattr(args, "smoke", False):
        SMOKE = True
        RESULTS = Path(os.environ.get(SMOKE_RESULTS) or tempfile.mkdtemp(prefix="bench-smoke-"))
    return SMOKE


def env() -> Dict[str, str]:
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    return e


def launch(workers: int, train_args: Sequence[str], metrics: Path, sync: str = "lbbsp",
           launch_args: Sequence[str] = (), command: Optional[Sequence[str]] = None,
           timeout: float = 1800, log: Optional[Path] = None,
           tree: Optional[Path] = None) -> dict:
    """Run one job to its end; returns its metrics summary (warm-up left out).

    ``log``: also write the job's output (every process's lines, prefixed) to this file.
    ``tree``: run the mxlbbsp and the example of this checkout (a ``--baseline``'s
    worktree, made :func:`importable`), not this one's.
    """
    example, cwd, variables = EXAMPLE, ROOT, env()
    if tree is not None:
        example, cwd = tree / "examples" / "train_gluon.py", tree
        variables["PYTHONPATH"] = str(tree)
    argv = [PY, "-m", "mxlbbsp.launcher", "launch", "-n", str(workers), "--sync", sync,
            "--metrics", str(metrics), "--progress", "0", *launch_args, "--",
            *(command or [PY, str(example), *train_args])]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=variables, capture_output=True, text=True,
                          timeout=timeout)
    if log is not None:
        Path(log).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"benchmark job failed ({proc.returncode}): {shlex.join(argv)}")
    summary = _metrics.summarize(_metrics.load(str(metrics)), skip=5)
    summary["wall_s"] = time.monotonic() - started
    return summary


def median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine() -> str:
    return (f"{platform.node()}: {os.cpu_count()} cores, {platform.machine()}, "
            f"Python {platform.python_version()}, {platform.platform(terse=True)}")


def write(name: str, payload: dict, table: str) -> Path:
    """benchmarks/results/<name>.json and .md (the .md says how it was made); prints the
    table and where it went."""
    if SMOKE:
        name += "_smoke"
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    payload = {"command": command, "machine": machine(),
               "date": datetime.datetime.now().isoformat(timespec="seconds"), **payload}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    md = (f"<!-- generated by {command} -->\n\n{table}\n\n"
          f"Command: `{command}` (from the repository root, in .venv)  \n"
          f"Machine: {payload['machine']}  \nDate: {payload['date']}\n")
    path = RESULTS / f"{name}.md"
    path.write_text(md)
    print(table)
    print(f"\nwritten: {path}")
    return path


def progress(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()
