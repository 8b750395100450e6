"""mxlbbsp.worker.engine: a Python function that MXNet's engine calls in order with the
arrays it reads or writes (the worker's clock without draining the engine)."""
import json
import re
import threading
import time

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
from mxnet import nd  # noqa: E402

from mxlbbsp.worker import engine  # noqa: E402


def test_available():
    assert engine.available()


def test_an_operator_that_reads_what_it_writes_waits_for_it():
    """The function holds back the operators issued after it that read its arrays: the sum
    below is computed only once the function (slow, on the engine's thread) has run."""
    x = nd.ones((4,))
    ran = threading.Event()

    def slow():
        time.sleep(0.3)
        ran.set()

    engine.call_after(slow, writes=[x])
    y = x + 1
    y.wait_to_read()
    assert ran.is_set()
    np.testing.assert_allclose(y.asnumpy(), 2.0)


def test_it_runs_once_the_operators_that_write_what_it_reads_are_done():
    """Called after the operator that writes its array, on another thread, exactly once;
    the main thread goes on meanwhile (its next operator is issued before the call)."""
    a = nd.random.uniform(shape=(600, 600))
    a.wait_to_read()
    b = nd.zeros((600, 600))
    calls = []

    def mark():
        calls.append(threading.current_thread() is threading.main_thread())

    for _ in range(20):                       # a long chain, all writing b
        nd.dot(a, a, out=b)
    engine.call_after(mark, reads=[b])
    issued_before = list(calls)
    b.wait_to_read()
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert issued_before == []                # not called while the chain was running
    assert calls == [False]


def test_a_function_that_fails_is_logged_not_raised(caplog):
    x = nd.ones((2,))

    def fails():
        raise RuntimeError("boom")

    engine.call_after(fails, reads=[x])
    nd.waitall()
    deadline = time.monotonic() + 10
    while "boom" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "boom" in caplog.text


@pytest.mark.cluster
def test_a_job_timed_by_the_engine_waits_less_than_its_iterations(tmp_path):
    """In a job whose worker does not drain the engine (MXLBBSP_ENGINE_CLOCK=1, no emulated
    cost), the wait for the split overlaps the engine's end of the step before: only the
    part of it after that step ended counts as waiting, so no iteration waits longer than
    it took and the summary's share of waiting stays below 100 % (it said 108 %)."""
    from conftest import PY, ROOT, run_mxlbbsp
    metrics = tmp_path / "m.jsonl"
    r = run_mxlbbsp("launch", "-n", 2, "--progress", "0", "--metrics", metrics,
                    "--env", "MXLBBSP_ENGINE_CLOCK=1", "--", PY,
                    ROOT / "benchmarks" / "_overhead_train.py", "--impl", "mxlbbsp",
                    "--model", "mlp64", "--iterations", 150, "--warmup", 5, timeout=240)
    assert r.rc == 0, r.output
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [x for x in rows if x.get("iteration_s") is not None and "wait_s" in x]
    assert len(rows) >= 2 * 150
    over = [(x["iteration"], x["rank"], x["wait_s"], x["iteration_s"]) for x in rows
            if x["wait_s"] > x["iteration_s"] + 1e-6]
    assert not over, over[:10]
    waited = float(re.search(r"workers waited ([0-9.]+)% of the time", r.stderr).group(1))
    assert waited <= 100.0, r.stderr


def test_a_main_thread_ahead_of_the_engine_counts_its_own_time_as_compute():
    """The main thread issued iteration t (2 ms of Python from its slice) while the engine
    still waited for the pull of t-1 (its end at 9 ms): the engine then ran t's forward and
    backward in 0.4 ms, and the worker's compute is the main thread's 2 ms, not those 0.4
    (which made NARX see one of two equal workers 2x faster, and split 44:20)."""
    from mxlbbsp.worker.session import engine_compute
    ms = 1e-3
    assert engine_compute(0.0, 2 * ms, 9 * ms, 9.4 * ms) == pytest.approx(2 * ms)
    # the engine behind the slice: its own part from the slice, the longer one
    assert engine_compute(5 * ms, 6 * ms, 1 * ms, 9 * ms) == pytest.approx(4 * ms)
    # the engine's part from the end of the step before, after the slice
    assert engine_compute(0.0, 1 * ms, 3 * ms, 6 * ms) == pytest.approx(3 * ms)
    # the first iteration (no step before), and time in untimed() left out
    assert engine_compute(0.0, 1 * ms, None, 5 * ms, untimed=1 * ms) == pytest.approx(4 * ms)
    assert engine_compute(0.0, 0.0, None, 0.0) > 0
