"""mxlbbsp.worker.engine: a Python function that MXNet's engine calls in order with the
arrays it reads or writes (the worker's clock without draining the engine)."""
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
