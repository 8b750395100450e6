"""Every benchmark command that README.md or benchmarks/README.md quotes runs, at its smoke
size (``--smoke``: seconds, results in a temporary folder, never benchmarks/results).

The commands are read from the documents themselves (inline code and code blocks), so a
command a document starts quoting is covered without touching this test, and an option that
a script stops accepting fails it.
"""
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "benchmarks/README.md")
#: a quoted command: [sudo] [.venv/bin/]python benchmarks/<script>.py [args]; its arguments
#: run to the end of the inline code span or of the code block's line
COMMAND = re.compile(r"(?:sudo\s+)?(?:\S*/)?python3?\s+(benchmarks/[\w/]+\.py)([^`\n]*)")
SPAN = re.compile(r"```[^\n]*\n(.*?)```|`([^`]+)`", re.DOTALL)


def quoted_commands():
    """[(document, script, args)] of every benchmark command the documents quote, in order,
    each once."""
    seen, out = set(), []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for span in SPAN.finditer(text):
            block, inline = span.group(1), span.group(2)
            lines = block.splitlines() if block is not None else [" ".join(inline.split())]
            for line in lines:
                for m in COMMAND.finditer(line):
                    script, args = m.group(1), tuple(shlex.split(m.group(2).split("#")[0]))
                    if (script, args) not in seen:
                        seen.add((script, args))
                        out.append((doc, script, args))
    return out


COMMANDS = quoted_commands()


def test_the_documents_quote_every_benchmark_script():
    """The extraction itself: it finds the scripts the benchmark table lists."""
    scripts = {script for _, script, _ in COMMANDS}
    for name in ("static", "dynamic", "contention", "time_to_accuracy", "coordinator_scale",
                 "throughput", "r2sp", "checkpoint", "courier", "time_model", "predictors",
                 "signals_cost", "record_traces", "goodput"):
        assert f"benchmarks/{name}.py" in scripts, name
    for _, script, _ in COMMANDS:
        assert (ROOT / script).is_file(), f"a document quotes {script}, which does not exist"


@pytest.mark.cluster
@pytest.mark.bench
@pytest.mark.parametrize("doc, script, args", COMMANDS,
                         ids=[" ".join([s.split("/")[-1], *a]) for _, s, a in COMMANDS])
def test_quoted_benchmark_command_runs_at_smoke_size(tmp_path, doc, script, args):
    if script.endswith("r2sp.py") and os.geteuid() != 0:
        pytest.skip("r2sp.py needs root (network namespace and tc)")
    if "--cgroup" in args and not os.access("/sys/fs/cgroup/cpu", os.W_OK):
        pytest.skip("--cgroup needs root and cgroup v1's cpu controller")
    env = dict(os.environ, MXLBBSP_BENCH_RESULTS=str(tmp_path))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    argv = [sys.executable, script, *args, "--smoke"]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    took = time.monotonic() - started
    assert proc.returncode == 0, (
        f"{doc} quotes `python {script} {' '.join(args)}`; at --smoke it failed "
        f"({proc.returncode}, {took:.0f} s):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert written, f"{script} --smoke wrote no result into $MXLBBSP_BENCH_RESULTS"


def test_the_courier_benchmark_counts_changes_of_the_planned_batch_only():
    """benchmarks/courier.py's B changes per epoch leave out iteration 0 (the warm-up at B0)
    and each epoch's short last batch (the rest, not a choice)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import courier as bench
    N = 100
    # epoch 0: 64 (warm-up), 30, 6 (rest); epoch 1: 30, 30, 40 (a change), epoch 2: 40, 40, 20
    series = [64, 30, 6, 30, 30, 40, 40, 40, 20]
    assert bench.changes_per_epoch(series, N) == [0, 1, 0]
    assert bench.changes_per_epoch([64, 36, 30, 30, 30, 10], N) == [0, 0]
    assert bench.changes_per_epoch([50, 25, 25, 50, 50], N) == [0, 1]


def test_the_r2sp_benchmark_picks_each_modes_fastest_learning_rate_to_the_target():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import r2sp as bench

    def row(tt, acc):
        return {"time_to_target_s": tt, "final_accuracy": acc}
    assert bench.pick_lr({0.05: [row(30.0, 0.96)], 0.2: [row(20.0, 0.97)],
                          0.8: [row(None, 0.1)]}) == 0.2
    # none reaches the target: the best final accuracy
    assert bench.pick_lr({0.05: [row(None, 0.90)], 0.2: [row(None, 0.93)]}) == 0.2
