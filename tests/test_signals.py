"""Contention signals (mxlbbsp/core/signals.py): the arithmetic on synthetic /proc readings, the
live readings on this machine, and how they travel (report, metrics, trace, --exog)."""
import json
import math
import os
import threading
import time

import numpy as np
import pytest

from conftest import EXAMPLE, PY, run_mxlbbsp
from mxlbbsp.core import protocol as P
from mxlbbsp.core.frames import Rows
from mxlbbsp.core import signals
from mxlbbsp.analysis import trace as _trace
from mxlbbsp.control.coordinator import Coordinator
from mxlbbsp.control.coordinator import CoordinatorConfig
from mxlbbsp.control.recorder import record


class FakeHost:
    """Stands in for /proc and the clocks: every value is set by the test."""

    def __init__(self, monkeypatch, cpus=2):
        self.wall = 100.0
        self.busy, self.total, self.steal, self.running = 10.0, 40.0, 0.0, 3.0
        self.own = 1.0
        self.psi = 5.0           # seconds
        self.delay = 0.2
        self.ctx = 7.0
        monkeypatch.setattr(signals.time, "monotonic", lambda: self.wall)
        monkeypatch.setattr(signals, "_host_stat",
                            lambda: (self.busy, self.total, self.steal, self.running))
        monkeypatch.setattr(signals, "_pressure", lambda: self.psi)
        monkeypatch.setattr(signals, "_threads", lambda tids=None: self.delay)
        monkeypatch.setattr(signals.os, "cpu_count", lambda: cpus)
        s = signals.Signals(tail=False)     # the test takes the tail's snapshot (sample)
        monkeypatch.setattr(s, "_own_cpu", lambda: self.own)
        monkeypatch.setattr(s, "_ctx", lambda: self.ctx)
        self.signals = s

    def advance(self, **deltas):
        """Move the clocks and counters on: wall=0.5, busy=0.8, ... (seconds, counts)."""
        for name, delta in deltas.items():
            setattr(self, name, getattr(self, name) + delta)


def test_signals_over_a_window(monkeypatch):
    h = FakeHost(monkeypatch)
    s = h.signals
    assert all(math.isnan(v) for v in s.read().values())       # no window begun
    s.begin()
    # 0.5 s: the host was busy 0.8 CPU-s, 0.3 of them ours; 0.2 s of pressure stall
    h.advance(wall=0.5, busy=0.8, total=1.0, steal=0.1, own=0.3, psi=0.2, delay=0.1, ctx=50)
    h.running = 4.0
    out = s.read()
    assert list(out) == list(signals.NAMES)
    assert out["others_cpu"] == pytest.approx(100 * 0.5 / (0.5 * 2))     # 50 % of 2 cores
    assert out["cpu_pressure"] == pytest.approx(0.4)
    assert out["run_delay"] == pytest.approx(0.2)
    assert out["ctx_invol"] == pytest.approx(100.0)
    assert out["steal"] == pytest.approx(10.0)
    assert out["runq"] == 4.0
    # the next window starts where this one ended; own time above the host's is clamped
    h.advance(wall=1.0, own=5.0)
    assert s.read()["others_cpu"] == 0.0


def test_the_tail_is_the_windows_last_part(monkeypatch):
    h = FakeHost(monkeypatch)
    s = h.signals
    s.begin()
    # 0.6 s without contention, then a tenant arrives for the last 0.2 s
    h.advance(wall=0.6, busy=0.6, total=1.2, own=0.6)
    s.sample()
    h.advance(wall=0.2, busy=0.4, total=0.4, own=0.2, psi=0.2, delay=0.1)
    out = s.read()
    assert s.tail_s == pytest.approx(0.2)
    assert out["others_cpu"] == pytest.approx(100 * 0.2 / (0.8 * 2))
    assert out["others_cpu_tail"] == pytest.approx(100 * 0.2 / (0.2 * 2))   # 50 %
    assert out["cpu_pressure"] == pytest.approx(0.25)
    assert out["cpu_pressure_tail"] == pytest.approx(1.0)
    assert out["run_delay_tail"] == pytest.approx(0.5)
    # no snapshot in the next window (it ended before its tail was due): the whole window
    s.begin()
    h.advance(wall=0.5, busy=0.5, own=0.25, psi=0.1)
    out = s.read()
    assert s.tail_s == 0
    for name in signals.TAIL_NAMES:
        assert out[name] == pytest.approx(out[name[:-len("_tail")]])
    assert out["cpu_pressure_tail"] == pytest.approx(0.2)


def test_the_sampler_thread_takes_the_tail_at_the_end_of_a_window():
    s = signals.Signals()
    # the first window gives the length the tail is timed by; the second is three times as
    # long, so that the snapshot, due at 3/4 of the first one's length (signals.TAIL), is
    # taken inside it even by a sampler thread a few hundred ms late on a loaded machine
    for seconds in (0.2, 0.6):
        s.begin()
        time.sleep(seconds)
        out = s.read()
    assert 0 < s.tail_s < 0.6
    for name in signals.TAIL_NAMES:
        assert math.isfinite(out[name]) or not math.isfinite(out[name[:-len("_tail")]])
    assert out["run_delay_tail"] >= 0 and 0 <= out["others_cpu_tail"] <= 100


def test_missing_pressure_file_is_nan_not_an_error(monkeypatch):
    monkeypatch.setattr(signals, "read_proc", lambda path: None)
    s = signals.Signals()
    s.begin()
    out = s.read()
    for name in ("cpu_pressure", "run_delay", "steal", "runq", "others_cpu"):
        assert math.isnan(out[name])
    assert signals._pressure() != signals._pressure()      # NaN


def test_live_signals_are_finite_where_linux_has_them():
    s = signals.Signals()
    s.begin()
    x = 0
    for i in range(300000):
        x += i
    out = s.read()
    assert 0 <= out["others_cpu"] <= 100
    assert out["runq"] >= 1                      # this thread was running
    assert out["ctx_invol"] >= 0 and out["run_delay"] >= 0 and out["steal"] >= 0
    if signals._pressure() == signals._pressure():
        assert 0 <= out["cpu_pressure"] <= 1.5


def test_report_carries_signals_as_optional_fields():
    msg = P.report(3, 16, 0.1, 50.0, 20.0, 1.0, 64,
                   {"others_cpu": 12.5, "cpu_pressure": float("nan")})
    assert msg["others_cpu"] == 12.5 and msg["cpu_pressure"] is None
    assert "runq" not in P.report(3, 16, 0.1, 50.0, 20.0, 1.0, 64)
    json.loads(P.encode(msg))                    # NaN never reaches the wire


@pytest.mark.parametrize("spec, columns", [
    ("auto", signals.DEFAULT),
    ("all", signals.COLUMNS),
    ("none", ()),
    ("runq, others_cpu", ("runq", "others_cpu")),
])
def test_parse_exog(spec, columns):
    assert signals.parse_exog(spec) == columns


def test_parse_exog_auto_on_an_old_trace_uses_its_columns():
    assert signals.parse_exog("auto", ["cpu_percent", "mem_percent"]) == \
        ("cpu_percent", "mem_percent")


@pytest.mark.parametrize("spec, needle", [("load", "unknown column 'load'"),
                                          ("runq,runq", "appears twice")])
def test_parse_exog_errors(spec, needle):
    with pytest.raises(ValueError, match=needle):
        signals.parse_exog(spec)


def test_coordinator_feeds_the_chosen_columns_and_records_every_signal(tmp_path):
    c = Coordinator(CoordinatorConfig(num_workers=2, token="t" * 32, predictor="last",
                                      exog=("runq", "cpu_percent"),
                                      metrics=str(tmp_path / "m.jsonl")))
    assert c._predictor.num_exog == 2
    seen = []
    c._predictor.observe = lambda speed, exog: seen.append(np.array(exog))
    c._hellos = {0: {"host": "a"}, 1: {"host": "b"}}
    c._in_force = np.array([8, 8])
    reports = {r: dict(P.report(1, 8, 0.1, 50.0 + r, 20.0, 1.0, 16,
                                {"runq": 2.0 + r, "others_cpu": 30.0}), time=0.0)
               for r in range(2)}
    for r in range(2):          # as they reach the coordinator (Collector), then decide
        decided = c.collect.reports(Rows.from_messages([r], [dict(reports[r])], 0.0))
    c.decide(*decided)
    np.testing.assert_array_equal(seen[0], [[2.0, 50.0], [3.0, 51.0]])
    rec = record(1, 0, reports[0], None, None, "a", None, 0, {}, "lbbsp", "last")
    assert rec["runq"] == 2.0 and rec["others_cpu"] == 30.0
    assert "cpu_pressure" not in rec


def test_trace_gets_signal_columns_and_predict_selects_them(tmp_path):
    metrics = tmp_path / "m.jsonl"
    rng = np.random.default_rng(0)
    with open(metrics, "w") as fh:
        for t in range(12):
            for r in range(2):
                fh.write(json.dumps({
                    "iteration": t, "rank": r, "batch_size": 8, "compute_s": 0.1,
                    "wait_s": 0.0, "speed": 80.0 + rng.normal(), "predicted_speed": None,
                    "cpu_percent": 50.0, "mem_percent": 20.0, "sync": "bsp", "time": t,
                    "others_cpu": 10.0 * r, "runq": 2.0, "cpu_pressure": None}) + "\n")
    out = tmp_path / "t.csv"
    assert _trace.from_metrics(str(metrics), str(out)) == 22
    trace = _trace.load(str(out))
    assert trace.exog_columns == ["cpu_percent", "mem_percent", "others_cpu", "cpu_pressure",
                                  "runq"]
    assert np.isnan(trace.ranks[0].exog[:, 3]).all()        # null -> empty -> NaN
    r = run_mxlbbsp("predict", out, "--predictors", "last,narx")
    assert r.rc == 0, r.output
    assert "exogenous inputs: others_cpu, cpu_pressure" in r.stdout       # auto
    r = run_mxlbbsp("predict", out, "--exog", "runq,mem_percent", "--predictors", "narx")
    assert r.rc == 0 and "exogenous inputs: runq, mem_percent" in r.stdout, r.output
    r = run_mxlbbsp("predict", out, "--exog", "steal")
    assert r.rc == 2
    assert r.stderr.strip().count("\n") == 0 and "unknown column 'steal'" in r.stderr
    assert "Traceback" not in r.output


def test_launch_rejects_an_unknown_exog_column(tmp_path):
    r = run_mxlbbsp("launch", "-n", 2, "--exog", "cpu,runq", "--", "python", "-c", "pass")
    assert r.rc == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--exog: unknown column 'cpu'" in lines[0], r.stderr


@pytest.mark.parametrize("spec, exog, columns", [
    ("auto", (), signals.AUTO),
    ("all", (), signals.COLUMNS),
    ("none", (), ()),
    ("none", signals.DEFAULT, signals.DEFAULT),
    ("runq, cpu_pressure_tail", ("mem_percent",), ("mem_percent", "runq",
                                                   "cpu_pressure_tail")),
])
def test_parse_signals_adds_the_exog_inputs_in_column_order(spec, exog, columns):
    assert signals.parse_signals(spec, exog) == columns
    assert not set(signals.TAIL_NAMES) & set(signals.AUTO)


def test_parse_signals_errors():
    with pytest.raises(ValueError, match="--signals: unknown column 'load'"):
        signals.parse_signals("runq,load")


def _samplers():
    return sum(t.name == "mxlbbsp-signals" for t in threading.enumerate())


def test_a_worker_reads_only_the_columns_it_is_asked_for(monkeypatch):
    def not_read():
        raise AssertionError("a source no column needs was read")
    before = _samplers()
    s = signals.Signals(columns=("runq", "cpu_pressure"))
    assert _samplers() == before                 # no tail column: no sampler thread
    monkeypatch.setattr(signals, "_threads", lambda tids=None: not_read())
    monkeypatch.setattr(s, "_ctx", not_read)
    monkeypatch.setattr(s, "_own_cpu", not_read)
    s.begin()
    out = s.read()
    assert set(out) == {"runq", "cpu_pressure"}
    assert out["runq"] >= 1


def test_the_sampler_thread_runs_only_for_a_tail_column():
    before = _samplers()
    signals.Signals(columns=("others_cpu",))
    assert _samplers() == before
    signals.Signals(columns=("run_delay_tail",))
    assert _samplers() == before + 1


def test_launch_rejects_an_unknown_signals_column():
    r = run_mxlbbsp("launch", "-n", 2, "--signals", "runq,tail", "--", "python", "-c", "pass")
    assert r.rc == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--signals: unknown column 'tail'" in lines[0], r.stderr


@pytest.mark.cluster
def test_workers_report_what_signals_and_exog_ask_for(tmp_path):
    metrics = tmp_path / "m.jsonl"
    r = run_mxlbbsp("launch", "-n", 2, "--signals", "runq,others_cpu_tail", "--exog",
                    "cpu_pressure", "--metrics", metrics, "--progress", "0", "--", PY,
                    EXAMPLE, "--model", "mlp", "--data", "digits", "--iterations", "8",
                    "--log-interval", "0")
    assert r.rc == 0, r.output
    rows = [json.loads(line) for line in open(metrics)]
    assert rows
    for row in rows:
        sent = {name for name in signals.NAMES if name in row}
        assert sent == {"runq", "others_cpu_tail", "cpu_pressure"}, row
        assert row["cpu_percent"] is None and row["mem_percent"] is None
    assert all(row["runq"] >= 1 for row in rows)
    assert any(row["others_cpu_tail"] is not None for row in rows)


def test_the_proc_files_kept_open_read_what_opening_them_reads():
    """The files read at every snapshot stay open and are read again from their start: each
    read is the file's text now (not the text of its first read), a forked process reads its
    own /proc/self, and the context switches are psutil's."""
    import os
    import psutil
    first = signals.read_proc("/proc/self/stat")
    busy = time.perf_counter() + 0.05
    while time.perf_counter() < busy:       # this process's CPU time moves
        pass
    again = signals.read_proc("/proc/self/stat")
    with open("/proc/self/stat", "rb") as fh:
        fresh = fh.read()
    assert again != first and again.split()[:13] == fresh.split()[:13]
    assert signals.read_proc("/proc/no-such-file") is None
    s = signals.Signals(tail=False, columns=("ctx_invol",))
    assert s._ctx() == pytest.approx(psutil.Process().num_ctx_switches().involuntary, abs=50)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                            # the child: its own pid in its own /proc/self
        os.write(w, signals.read_proc("/proc/self/stat").split()[0])
        os._exit(0)
    os.waitpid(pid, 0)
    assert int(os.read(r, 64)) == pid


def test_the_file_of_a_thread_that_ended_is_closed_when_the_threads_are_listed_again():
    s = signals.Signals(tail=False, columns=("run_delay",))
    ended = threading.Thread(target=lambda: time.sleep(0.2))
    ended.start()
    s.begin()                                   # lists the threads, reads each one's file
    path = f"/proc/self/task/{ended.native_id}/schedstat"
    assert path in signals._proc_files._fds
    ended.join()
    # join() returns when the thread's Python part is done; the kernel may list its task a
    # moment longer (on a busy machine): wait until it does not, which proves it ended
    deadline = time.monotonic() + 30
    while str(ended.native_id) in os.listdir("/proc/self/task"):
        assert time.monotonic() < deadline, "the thread's task never went"
        time.sleep(0.01)
    s._snapshots = signals.CHILDREN_EVERY       # the next snapshot lists the threads again
    s.read()
    assert path not in signals._proc_files._fds
    assert f"/proc/self/task/{threading.get_native_id()}/schedstat" in signals._proc_files._fds
