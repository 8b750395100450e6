"""The recorder (mxlbbsp.control.recorder): records written off the coordinator's thread are
the records the coordinator wrote itself, in (iteration, rank) order, and the summary's
totals match the file's."""
from __future__ import annotations

import json
import threading

import numpy as np

from mxlbbsp.control import recorder as R
from mxlbbsp.core import metrics
from mxlbbsp.core.frames import Rows


def _report(t, rank, batch):
    return {"type": "report", "iteration": t, "batch_size": batch,
            "compute_s": 0.01 * (rank + 1) * batch / 32, "cpu_percent": 10.0 + rank,
            "mem_percent": 20.0, "slowdown": 1.0, "next_global_batch": 64,
            "time": 1000.0 + t + rank / 10, "others_cpu": 0.5}


def _rows(rank, msg):
    """One worker's message as the coordinator hands it on (its report with its time)."""
    when = msg.pop("time", 0.0)
    return Rows.from_messages([rank], [msg], when)


def _done(t, **fields):
    return {"type": "done", "iteration": t, **fields}


def _feed(rec, n, iterations, move_on=True):
    hosts = [f"h{r}" for r in range(n)]
    last = np.full(n, -1)
    for t in range(iterations):
        if t:                                   # none for the first iteration
            rec.predicted[t] = np.array([100.0 + r for r in range(n)])
        for r in reversed(range(n)):           # arrival order is not rank order
            rec.add(_rows(r, _report(t, r, 32 - r)))
            last[r] = t
        for r in range(n):
            rec.add(_rows(r, _done(t, wait_s=0.001 * r, sync_s=0.002, iteration_s=0.1)))
        if t == 2:
            rec.add_scalars(2, 1, {"loss": 0.5})
        # a record is handed over once its worker has moved on (reported a later iteration)
        rec.flush(t - 1 if move_on else t, last, np.zeros(n, bool), hosts, np.arange(n),
                  lambda t: {})
    rec.flush(iterations - 1, last, np.ones(n, bool), hosts, np.arange(n), lambda t: {},
              final=True)


def test_the_file_holds_every_record_in_order_and_the_totals_match_it(tmp_path):
    path = tmp_path / "m.jsonl"
    failures = []
    rec = R.Recorder(3, str(path), None, skip=1, append=False,
                     fail=lambda m, kind: failures.append(m), sync="lbbsp", predictor="narx")
    _feed(rec, 3, 6)
    rec.close()
    assert failures == []
    rows = metrics.load(str(path))
    assert [(r["iteration"], r["rank"]) for r in rows] == [(t, r) for t in range(6)
                                                         for r in range(3)]
    assert rows[0]["predicted_speed"] is None and rows[4]["predicted_speed"] == 101.0
    assert rows[2 * 3 + 1]["scalars"] == {"loss": 0.5} and "scalars" not in rows[0]
    assert rows[5]["host"] == "h2" and rows[5]["fallbacks"] == 2
    assert rows[0]["others_cpu"] == 0.5 and rows[0]["sync"] == "lbbsp"
    # the line is what json.dumps of record() gives: the format the readers know
    first = path.read_text().splitlines()[0]
    assert first == json.dumps(R.record(0, 0, _report(0, 0, 32), _done(
        0, wait_s=0.0, sync_s=0.002, iteration_s=0.1), None, "h0", None, 0, {},
        "lbbsp", "narx"), allow_nan=False)
    assert rec.summary() == metrics.summarize(rows, skip=1)


def test_a_write_error_stops_the_job_with_one_line(tmp_path):
    failures = []
    rec = R.Recorder(2, str(tmp_path / "missing" / "m.jsonl"), None, skip=1, append=False,
                     fail=lambda m, kind: failures.append((m, kind)))
    called = []
    rec.call_soon = lambda fn: (called.append(threading.current_thread().name), fn())
    _feed(rec, 2, 3)
    rec.close()
    assert len(failures) == 1 and failures[0][1] == "config"
    assert "cannot write the metrics file" in failures[0][0] and "--metrics" in failures[0][0]
    assert called == ["mxlbbsp-recorder"]       # handed to the coordinator's loop
    assert rec.summary()["iterations"] == 2     # the totals still count every record


def test_pending_totals_cover_the_finished_iterations_not_yet_written(tmp_path):
    rec = R.Recorder(2, str(tmp_path / "m.jsonl"), None, skip=0, append=False,
                     fail=lambda m, kind: None)
    hosts = ["h", "h"]
    for t in range(3):
        for r in range(2):
            rec.add(_rows(r, _report(t, r, 32)))
            rec.add(_rows(r, _done(t, iteration_s=0.1)))
    # nobody has moved on: nothing is handed over, everything finished is pending
    none = np.zeros(2, bool)
    rec.flush(2, np.array([2, 2]), none, hosts, [0, 0], lambda t: {})
    count, totals = rec.pending_totals(1, hosts, [0, 0], lambda t: {})
    assert count == 4 and totals.summary()["iterations"] == 2
    rec.flush(2, np.array([3, 3]), none, hosts, [0, 0], lambda t: {})
    count, totals = rec.pending_totals(2, hosts, [0, 0], lambda t: {})
    assert count == 6 and rec.written == 6 and totals.summary()["iterations"] == 3
    rec.close()
