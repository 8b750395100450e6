"""Issue 10, items 6-8 on the coordinator: hostile peers on its port (real sockets against a
started Coordinator), a metrics file that stops taking writes, and the end-of-job figures."""
import logging
import socket
import time

import pytest

from mxlbbsp.control import connection as connection_module
from mxlbbsp.core import metrics
from mxlbbsp.core import protocol as P
from mxlbbsp.worker.session import JobAborted
from test_coordinator import (TOKEN, coordinator, finished_records,  # noqa: F401
                              run_iteration, sessions)


def closed_by_peer(sock, timeout=10.0) -> bool:
    """True once the coordinator has closed the connection (reads EOF or a reset)."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def no_tracebacks(caplog):
    for rec in caplog.records:
        assert rec.exc_info is None, rec.getMessage()
        assert "Traceback" not in rec.getMessage() and "RecursionError" not in rec.getMessage()
        assert "Exception in callback" not in rec.getMessage()


def test_a_deeply_nested_hello_is_refused_without_a_traceback(coordinator, caplog):
    c = coordinator(1)
    with socket.create_connection(c.address, timeout=5) as s:
        s.sendall(b"[" * 500_000 + b"\n")
        assert closed_by_peer(s)
    with socket.create_connection(c.address, timeout=5) as s:     # deep, but short
        s.sendall(b"[" * 3000 + b"\n")
        assert closed_by_peer(s)
    assert c.failure is None and c.registered == 0 and c.refused == 2
    no_tracebacks(caplog)
    ss, errors = sessions(c, 1)            # the service still works
    assert not errors and c.registered == 1


def test_the_hello_is_capped_before_it_is_parsed(coordinator, caplog):
    c = coordinator(1)
    # a valid hello with the right token, padded past the cap: refused all the same
    hello = P.hello(0, TOKEN, 1, "h", 64, 640, None)
    hello["pad"] = "x" * P.MAX_HELLO
    with socket.create_connection(c.address, timeout=5) as s:
        s.sendall(P.encode(hello))
        assert closed_by_peer(s)
    # no newline at all: the connection is closed once the cap is passed, not at 1 MB
    with socket.create_connection(c.address, timeout=5) as s:
        s.sendall(b"x" * (P.MAX_HELLO + 10))
        assert closed_by_peer(s)
    assert c.registered == 0 and c.refused == 2
    no_tracebacks(caplog)


def test_a_registered_worker_sending_deep_json_fails_the_job_in_one_line(coordinator, caplog):
    c = coordinator(1)
    ss, errors = sessions(c, 1)
    assert not errors
    ss[0]._sock.sendall(b"[" * 500_000 + b"\n")
    deadline = time.monotonic() + 10
    while c.failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.failure is not None and "protocol error" in c.failure
    assert "\n" not in c.failure
    no_tracebacks(caplog)


def test_refusal_warnings_are_rate_limited(coordinator, caplog, monkeypatch):
    monkeypatch.setattr(connection_module, "REFUSAL_SUMMARY_S", 0.5)
    c = coordinator(1)
    caplog.set_level(logging.WARNING, logger="mxlbbsp.control.coordinator")
    bad = P.encode(P.hello(0, "wrong", 1, "h", 64, 640, None))
    started = time.monotonic()
    for _ in range(200):
        with socket.create_connection(c.address, timeout=5) as s:
            s.sendall(bad)
            assert closed_by_peer(s)
    summaries = 2 + int((time.monotonic() - started) / 0.5)     # one per interval at most
    deadline = time.monotonic() + 10
    while not any("more connection" in r.getMessage() for r in caplog.records) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    shown = connection_module.REFUSALS_SHOWN
    assert len(lines) <= shown + summaries, lines            # not 200
    assert all("refused a connection from" in line for line in lines[:shown])
    time.sleep(1.5)                                 # the last summary (0.5 s timer)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    counted = sum(int(line.split()[1]) for line in lines[shown:])
    assert counted == 200 - shown                   # every refusal is still counted
    assert c.refused == 200 and c.registered == 0


def test_a_metrics_write_that_fails_later_fails_the_job_in_one_line(coordinator):
    """/dev/full opens, then every write fails with ENOSPC, as a file system that fills up
    during the run: the job stops with one line naming the file, not "lost connection"."""
    c = coordinator(2, metrics="/dev/full")
    ss, errors = sessions(c, 2)
    assert not errors
    with pytest.raises(JobAborted):
        # the first records are written once the workers are past their iteration; the
        # writer thread and the abort may come a few iterations later on a loaded machine
        for _ in range(30):
            run_iteration(ss, [0.1, 0.1])
    assert c.failure_kind == "config"
    assert c.failure.startswith("cannot write the metrics file '/dev/full' (No space left")
    assert "--metrics" in c.failure and "\n" not in c.failure
    c.stop()                                        # flushing at teardown raises nothing


def test_end_of_job_figures_are_the_reports(coordinator, tmp_path):
    """coordinator.summary() (the launcher's last line) and metrics.summarize on the file it
    wrote (mxlbbsp report) give the same figures, the warm-up left out by both."""
    c = coordinator(2)
    ss, errors = sessions(c, 2)
    assert not errors
    for k in range(6):
        run_iteration(ss, [0.05 * (k + 1), 0.02])
    for s in ss:
        s.close()
    report = metrics.summarize(finished_records(c))
    live = c.summary()
    assert live["iterations"] == report["iterations"] == 5      # 6 iterations, 1 warm-up
    for key in ("samples_per_s", "wait_share", "mean_iteration_s", "samples"):
        assert live[key] == pytest.approx(report[key], rel=1e-12), key
