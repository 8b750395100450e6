"""``mxlbbsp predict`` and ``mxlbbsp trace`` as a user runs them (real processes).

The synthetic traces are generated here with fixed seeds:

* lead: each rank's host switches between idle and loaded (speed x 0.5) at random
  (p = 0.1 per iteration); the load shows in cpu_percent one iteration before it reaches
  the speed, as when a co-located tenant starts up. NARX can see the switch coming; last
  value and EMA cannot.
* no signal: the same kind of switches (p = 0.05) but cpu_percent is constant plus noise.
"""
import csv
import json
import sys
from pathlib import Path

import pytest

from conftest import run_mxlbbsp
from mxlbbsp.analysis import trace as _trace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import predictors as _bench_predictors  # noqa: E402

HEADER = ["iteration", "rank", "speed", "cpu_percent", "mem_percent"]


def switching(seed, **kw):
    """The rows of benchmarks/predictors.py's synthetic trace (the same generator serves
    the benchmark's table and these checks), as lists."""
    return [list(row) for row in _bench_predictors.switching(seed, **kw)]


def write(path, rows, header=HEADER):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def predict_json(path, predictors="narx,last,ema,ar"):
    r = run_mxlbbsp("predict", path, "--predictors", predictors, "--json")
    assert r.rc == 0, r.output
    return json.loads(r.stdout)


def test_narx_sees_load_switches_coming(tmp_path):
    result = predict_json(write(tmp_path / "lead.csv", switching(seed=1, lead=True)))
    best = min(result["last"]["mape"], result["ema"]["mape"])
    assert result["narx"]["mape"] <= 0.75 * best, result


def test_narx_no_worse_without_exogenous_signal(tmp_path):
    rows = switching(seed=2, p_switch=0.05, drop=0.4, lead=False)
    result = predict_json(write(tmp_path / "flat.csv", rows))
    best = min(result["last"]["mape"], result["ema"]["mape"])
    assert result["narx"]["mape"] <= 1.1 * best, result


def test_json_shape(tmp_path):
    path = write(tmp_path / "t.csv", switching(seed=3, T=40, ranks=3))
    r = run_mxlbbsp("predict", path, "--predictors", "ema,narx", "--json")
    assert r.rc == 0, r.output
    assert len(r.stdout.strip().splitlines()) == 1
    result = json.loads(r.stdout)
    assert list(result) == ["ema", "narx"]
    for entry in result.values():
        assert isinstance(entry["mape"], float) and entry["mape"] > 0
        assert isinstance(entry["rmse"], float) and entry["rmse"] > 0
        assert sorted(entry["per_rank"]) == ["0", "1", "2"]
        assert all(pr["count"] == 39 for pr in entry["per_rank"].values())


def test_table_names_every_predictor_and_rank(tmp_path):
    path = write(tmp_path / "t.csv", switching(seed=4, T=30))
    r = run_mxlbbsp("predict", path)
    assert r.rc == 0, r.output
    for name in ("narx", "last", "ema", "ar", "MAPE", "RMSE", "per rank"):
        assert name in r.stdout
    assert r.stderr == ""


def test_extra_exogenous_columns_are_inputs(tmp_path):
    rows = [row + [row[3] / 10] for row in switching(seed=5, T=60)]
    path = write(tmp_path / "t.csv", rows, HEADER + ["runq"])
    r = run_mxlbbsp("predict", path)
    assert r.rc == 0, r.output
    assert "cpu_percent, mem_percent, runq" in r.stdout


def good_rows(ranks=2, T=10):
    return [[t, r, 100.0 + t, 50.0, 40.0] for r in range(ranks) for t in range(T)]


def _bad(kind):
    rows, header = good_rows(), list(HEADER)
    if kind == "missing column":
        header = HEADER[:-1]
        rows = [row[:-1] for row in rows]
    elif kind == "non-numeric":
        rows[3][3] = "busy"
    elif kind == "nan speed":
        rows[2][2] = "nan"
    elif kind == "empty speed":
        rows[2][2] = ""
    elif kind == "negative speed":
        rows[4][2] = -3.0
    elif kind == "too few rows":
        rows = [row for row in rows if row[1] == 0 or row[0] < 3]
    return header, rows


@pytest.mark.parametrize("kind, needle", [
    ("missing column", "t.csv:1: missing column(s) mem_percent"),
    ("non-numeric", "t.csv:5: column cpu_percent: 'busy' is not a number"),
    ("nan speed", "t.csv:4: column speed: 'nan' is not a finite number"),
    ("empty speed", "t.csv:4: column speed is empty"),
    ("negative speed", "t.csv:6: column speed: -3 must be > 0"),
    ("too few rows", f"rank 1 has 3 row(s); every rank needs at least {_trace.MIN_ROWS}"),
])
def test_bad_trace_one_line_exit_2(tmp_path, kind, needle):
    header, rows = _bad(kind)
    path = write(tmp_path / "t.csv", rows, header)
    r = run_mxlbbsp("predict", path)
    assert r.rc == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mxlbbsp predict: error: ")
    assert needle in lines[0]
    assert "Traceback" not in r.output
    assert r.stdout == ""


def test_unknown_predictor_exit_2(tmp_path):
    path = write(tmp_path / "t.csv", good_rows())
    r = run_mxlbbsp("predict", path, "--predictors", "narx,arima")
    assert r.rc == 2
    assert "unknown predictor 'arima'" in r.stderr and "Traceback" not in r.output


def metrics_record(t, rank, speed, cpu):
    return {"iteration": t, "rank": rank, "host": "h", "batch_size": 32,
            "compute_s": 32 / speed, "wait_s": 0.01, "sync_s": 0.01, "iteration_s": 0.1,
            "speed": speed, "predicted_speed": None, "cpu_percent": cpu, "mem_percent": 12.5,
            "slowdown": 1.0, "sync": "bsp", "predictor": "ema", "fallbacks": 0, "time": 1e9 + t}


def test_trace_converts_a_metrics_log(tmp_path):
    metrics = tmp_path / "m.jsonl"
    with open(metrics, "w") as fh:
        for t in range(10):
            for rank in range(2):
                cpu = None if (t, rank) == (4, 1) else 50.0 + t
                fh.write(json.dumps(metrics_record(t, rank, 100.0 + 10 * rank + t, cpu)) + "\n")
    out = tmp_path / "t.csv"
    r = run_mxlbbsp("trace", metrics, "-o", out)
    assert r.rc == 0, r.output
    with open(out, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == HEADER
    assert len(rows) == 1 + 2 * 9                     # iteration 0 (warm-up) is left out
    assert [int(x) for x in rows[1][:2]] == [1, 0] and float(rows[1][2]) == 101.0
    assert ["4", "1", "114.0", "", "12.5"] in rows     # a missing CPU reading stays empty
    r = run_mxlbbsp("predict", out, "--json")
    assert r.rc == 0, r.output
    assert set(json.loads(r.stdout)) == {"narx", "last", "ema", "ar"}


def test_trace_bad_metrics_exit_2(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps(metrics_record(0, 0, 100.0, 50.0)) + "\nnot json\n")
    r = run_mxlbbsp("trace", metrics, "-o", tmp_path / "t.csv")
    assert r.rc == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxlbbsp trace: error: ")
    assert "m.jsonl:2" in lines[0] and "Traceback" not in r.output
