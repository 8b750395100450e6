"""Speed traces: read and check a trace CSV, replay predictors on it, convert a metrics log.

A trace is a CSV file with a header row::

    iteration,rank,speed,cpu_percent,mem_percent[,more exogenous columns...]

one row per worker (rank) per iteration; ``speed`` in samples/s. Every further column is one
more numeric exogenous input. An empty or ``nan`` exogenous value means "not measured"
(psutil gave nothing) and is allowed; the predictors carry the last value forward.

Checks (a :class:`TraceError` names the file, line and column): the five columns above are
present and named once; iteration and rank are integers, rank >= 0; every other value is a
number; speed is a finite number > 0 (0 would make MAPE undefined); no (rank, iteration)
appears twice; every rank has at least ``MIN_ROWS = 3 + max(NARX d_y, NARX d_x, AR p)`` rows
(6): the longest delay line filled, and a few forecasts to score. That is a floor, not
enough for a fair comparison: NARX forecasts the last value for its first 3 observations
(its warm-up) and needs tens of iterations to learn a load-speed relation.

Replay (:func:`evaluate`): each rank separately, with a fresh predictor (``num_workers=1``)
per rank, in iteration order. After row k is observed the predictor forecasts row k+1, so it
only ever sees the past. Rows without a forecast (the first) are skipped. Over the N scored
rows, with y the observed and y^ the forecast speed::

    MAPE = 100 / N * sum |y - y^| / y          RMSE = sqrt(1 / N * sum (y - y^)^2)

per rank, and overall over the scored rows of all ranks together.

No MXNet import.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from mxlbbsp import predictors as _pred
from mxlbbsp.core import metrics as _metrics
from mxlbbsp.core import signals as _signals

COLUMNS = ("iteration", "rank", "speed", "cpu_percent", "mem_percent")
MIN_ROWS = 3 + max(_pred.narx.D_Y, _pred.narx.D_X, _pred.ar.P_ORDER)


class TraceError(ValueError):
    """A malformed trace or metrics file; the message names the file and row or column."""


@dataclasses.dataclass
class RankSeries:
    """One rank's rows in iteration order."""

    iteration: np.ndarray   # (m,) int
    speed: np.ndarray       # (m,) float, > 0
    exog: np.ndarray        # (m, E) float, NaN where not measured


@dataclasses.dataclass
class Trace:
    """A checked trace: exogenous column names (cpu_percent, mem_percent, more) and ranks."""

    path: str
    exog_columns: List[str]
    ranks: Dict[int, RankSeries]

    @property
    def rows(self) -> int:
        return sum(len(r.speed) for r in self.ranks.values())


def load(path: str) -> Trace:
    """Read and check a trace CSV (see the module docstring for the checks)."""
    try:
        fh = open(path, newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}; give a trace CSV (iteration,rank,"
                         f"speed,cpu_percent,mem_percent), e.g. from 'mxlbbsp trace METRICS.jsonl "
                         f"-o TRACE.csv'") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file; expected a header row "
                                 f"{','.join(COLUMNS)}")
            header = [h.strip() for h in header]
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}; the header "
                                 f"must include {','.join(COLUMNS)}")
            dup = sorted({h for h in header if header.count(h) > 1})
            if dup:
                raise TraceError(f"{path}:1: column {dup[0]!r} appears more than once")
            if any(not h for h in header):
                raise TraceError(f"{path}:1: column {header.index('') + 1} has no name")
            index = {h: k for k, h in enumerate(header)}
            exog_cols = ["cpu_percent", "mem_percent"] + [h for h in header if h not in COLUMNS]
            rows: Dict[int, list] = {}
            lines: Dict[tuple, int] = {}
            for fields in reader:
                line = reader.line_num
                if not fields or all(not f.strip() for f in fields):
                    continue
                if len(fields) != len(header):
                    raise TraceError(f"{path}:{line}: {len(fields)} value(s) but the header has "
                                     f"{len(header)} column(s); check that row's commas")
                it = _integer(fields[index["iteration"]], path, line, "iteration")
                rank = _integer(fields[index["rank"]], path, line, "rank")
                if rank < 0:
                    raise TraceError(f"{path}:{line}: column rank: {rank} is negative; ranks "
                                     "count from 0")
                speed = _number(fields[index["speed"]], path, line, "speed", required=True)
                if not math.isfinite(speed):
                    raise TraceError(f"{path}:{line}: column speed: {fields[index['speed']]!r} "
                                     "is not a finite number; drop the row or measure it")
                if speed <= 0:
                    raise TraceError(f"{path}:{line}: column speed: {speed:g} must be > 0 "
                                     "(samples/s); drop the row or measure it")
                exog = [_number(fields[index[c]], path, line, c) for c in exog_cols]
                if (rank, it) in lines:
                    raise TraceError(f"{path}:{line}: rank {rank}, iteration {it} already "
                                     f"appeared on line {lines[rank, it]}; keep one of them")
                lines[rank, it] = line
                rows.setdefault(rank, []).append((it, speed, exog))
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: not valid CSV: {exc}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not a text (UTF-8) CSV file") from None
    if not rows:
        raise TraceError(f"{path}: no data rows after the header")
    ranks = {}
    for rank in sorted(rows):
        got = sorted(rows[rank], key=lambda r: r[0])
        if len(got) < MIN_ROWS:
            raise TraceError(f"{path}: rank {rank} has {len(got)} row(s); every rank needs at "
                             f"least {MIN_ROWS} to be scored (drop the rank or record longer)")
        ranks[rank] = RankSeries(np.array([r[0] for r in got], dtype=np.int64),
                                 np.array([r[1] for r in got], dtype=float),
                                 np.array([r[2] for r in got], dtype=float).reshape(len(got), -1))
    return Trace(path, exog_cols, ranks)


#: iterations and ranks are stored as int64
_INT_MAX = np.iinfo(np.int64).max


def _integer(text: str, path: str, line: int, column: str) -> int:
    try:
        value = int(text)                   # exact, however many digits
    except ValueError:
        try:
            number = float(text)            # "3.0", "1e3"
        except ValueError:
            raise TraceError(f"{path}:{line}: column {column}: {text!r} is not a number; fix "
                             "or delete that row") from None
        if not number.is_integer():
            raise TraceError(f"{path}:{line}: column {column}: {text!r} is not an integer; fix "
                             "or delete that row")
        value = int(number)
    if abs(value) > _INT_MAX:
        raise TraceError(f"{path}:{line}: column {column}: {text.strip()} is out of range "
                         f"(at most {_INT_MAX}); fix or delete that row")
    return value


def _number(text: str, path: str, line: int, column: str, required: bool = False) -> float:
    text = text.strip()
    if not text:
        if required:
            raise TraceError(f"{path}:{line}: column {column} is empty; every row needs one "
                             "(drop the row or measure it)")
        return float("nan")
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column}: {text!r} is not a number; fix or "
                         "delete that row (an empty value means 'not measured')") from None


def select(trace: Trace, columns: Sequence[str]) -> Trace:
    """The same trace with only the named exogenous columns, in that order (at least one:
    with none, one all-NaN column, which the predictors treat as "not measured")."""
    index = [trace.exog_columns.index(c) for c in columns]
    ranks = {}
    for rank, s in trace.ranks.items():
        exog = s.exog[:, index] if index else np.full((len(s.speed), 1), np.nan)
        ranks[rank] = RankSeries(s.iteration, s.speed, exog)
    return Trace(trace.path, list(columns), ranks)


def forecasts(name: str, series: RankSeries, **options) -> tuple:
    """Replay one rank: (forecast of each row, NaN for the first; fallbacks counted)."""
    m, E = series.exog.shape
    predictor = _pred.create(name, 1, E, **options)
    out = np.full(m, np.nan)
    for k in range(m - 1):
        predictor.observe(series.speed[k:k + 1], series.exog[k:k + 1])
        out[k + 1] = predictor.predict()[0]
    return out, int(predictor.fallbacks.sum())


def score(y: np.ndarray, f: np.ndarray) -> dict:
    """MAPE (%) and RMSE of forecasts ``f`` of ``y`` where ``f`` is finite (the one place
    both are computed: ``mxlbbsp predict`` and the report's speed plot)."""
    keep = np.isfinite(f)
    y, f = y[keep], f[keep]
    if not len(y):
        return {"mape": None, "rmse": None, "count": 0}
    # In units of the largest value, so that speeds near the float range (1e308) neither
    # overflow y - f nor its square; the result is the same for ordinary speeds.
    scale = float(max(np.max(np.abs(y)), np.max(np.abs(f))))
    ys, fs = y / scale, f / scale
    with np.errstate(over="ignore"):
        rmse = scale * float(np.sqrt(np.mean((ys - fs) ** 2)))
    return {"mape": float(100.0 * np.mean(np.abs(ys - fs) / ys)),
            "rmse": rmse, "count": int(len(y))}


def evaluate(trace: Trace, names: Sequence[str], options: Optional[dict] = None) -> dict:
    """MAPE (%) and RMSE of each named predictor, overall and per rank.

    Returns ``{name: {"mape", "rmse", "count", "fallbacks", "per_rank": {rank: {"mape",
    "rmse", "count"}}}}``; ``options`` maps a name to keyword arguments of its predictor.
    """
    options = options or {}
    result = {}
    for name in names:
        ys, fs, per_rank, fallbacks = [], [], {}, 0
        for rank, series in trace.ranks.items():
            f, fb = forecasts(name, series, **options.get(name, {}))
            fallbacks += fb
            per_rank[rank] = score(series.speed, f)
            ys.append(series.speed)
            fs.append(f)
        entry = score(np.concatenate(ys), np.concatenate(fs))
        entry["fallbacks"] = fallbacks
        entry["per_rank"] = per_rank
        result[name] = entry
    return result


def from_metrics(metrics_path: str, trace_path: str, skip: int = 1) -> int:
    """Write the trace of a metrics log (``--metrics``); returns the number of rows.

    The first ``skip`` iterations are left out: iteration 0 builds graphs and allocates
    memory, so its speed says nothing about the next one (the coordinator does not learn
    from it either). A missing CPU or memory reading becomes an empty value.
    """
    if _same_file(metrics_path, trace_path):
        raise TraceError(f"the trace {trace_path!r} would overwrite the metrics file "
                         f"{metrics_path!r} (the same file); give another -o, e.g. run.csv")
    try:
        records = _metrics.load(metrics_path)
    except _metrics.MetricsError as exc:
        raise TraceError(f"{exc}; {_metrics.HINT}") from None
    rows = []
    for rec in records:
        if int(rec["iteration"]) < skip:
            continue
        speed = rec.get("speed")
        if not isinstance(speed, (int, float)) or not speed > 0:
            continue
        rows.append((int(rec["iteration"]), int(rec["rank"]), float(speed),
                     _cell(rec.get("cpu_percent")), _cell(rec.get("mem_percent")), rec))
    if not rows:
        raise TraceError(f"{metrics_path}: no records with a speed after iteration {skip - 1}")
    rows.sort(key=lambda r: (r[0], r[1]))
    extra = [c for c in _signals.NAMES if any(c in r[5] for r in rows)]
    try:
        with open(trace_path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS + tuple(extra))
            for it, rank, speed, cpu, mem, rec in rows:
                writer.writerow([it, rank, repr(speed), cpu, mem]
                                + [_cell(rec.get(c)) for c in extra])
    except OSError as exc:
        raise TraceError(f"cannot write {trace_path}: {exc.strerror}") from None
    return len(rows)


def _same_file(a: str, b: str) -> bool:
    """Whether the paths name one file (symlinks, hard links, other spellings)."""
    try:
        return os.path.samefile(a, b)
    except OSError:         # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def _cell(x) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return repr(float(x))
    return ""
