"""``mxlbbsp predict`` and ``mxlbbsp trace``: evaluate speed predictors on a recorded trace.

Both raise :class:`~mxlbbsp.launcher.config.ConfigError` for bad input, which ``main()`` turns
into one line on stderr and exit code 2.
"""
from __future__ import annotations

import json
from typing import List

import click

from mxlbbsp import predictors as _pred
from mxlbbsp.analysis import trace as _trace
from mxlbbsp.core import signals as _signals

from .config import ConfigError

DEFAULT_PREDICTORS = "narx,last,ema,ar"

PREDICT_HELP = f"""Replay TRACE.csv one step ahead and score speed predictors.

\b
TRACE.csv has a header row with at least
  iteration,rank,speed,cpu_percent,mem_percent
(more numeric columns are more exogenous inputs); `mxlbbsp trace` makes one
from a --metrics log. Each rank is replayed separately with a fresh
predictor that only sees the past; every rank needs at least
{_trace.MIN_ROWS} rows. Prints MAPE (%) and RMSE (samples/s) per predictor,
overall and per rank.

\b
Examples:
  mxlbbsp predict run.csv
  mxlbbsp predict run.csv --predictors narx,ema --json
"""

TRACE_HELP = """Turn a metrics log (mxlbbsp launch --metrics) into a trace CSV.

\b
Writes iteration,rank,speed,cpu_percent,mem_percent and the contention
signals the workers reported (others_cpu, ctx_invol, run_delay,
cpu_pressure, steal, runq, and others_cpu_tail, run_delay_tail,
cpu_pressure_tail over the last quarter of the compute phase), one row
per worker per iteration, leaving out
the first --skip iterations (iteration 0 builds graphs: its speed predicts
nothing). A missing CPU or memory reading
becomes an empty value.

\b
Example:
  mxlbbsp launch -n 2 --metrics m.jsonl -- python train.py
  mxlbbsp trace m.jsonl -o run.csv && mxlbbsp predict run.csv
"""


def _names(spec: str) -> List[str]:
    names: List[str] = []
    for part in spec.split(","):
        name = part.strip()
        if not name:
            raise ConfigError(f"--predictors {spec!r}: empty name; give a comma-separated list, "
                              f"e.g. --predictors {DEFAULT_PREDICTORS}")
        if name not in _pred.available():
            raise ConfigError(f"--predictors: unknown predictor {name!r}; choose from "
                              f"{', '.join(_pred.available())}")
        if name not in names:
            names.append(name)
    return names


@click.command("predict", help=PREDICT_HELP,
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace_path", metavar="TRACE.csv")
@click.option("--predictors", "spec", default=DEFAULT_PREDICTORS, show_default=True,
              metavar="A,B,...", help="Predictors to compare, comma-separated.")
@click.option("--exog", default="auto", show_default=True, metavar="COLS",
              help="Exogenous columns the predictors see: auto (others_cpu,run_delay,"
                   "cpu_pressure where the trace has them, else every column), all, none, "
                   "or a comma-separated list of the trace's columns.")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object on stdout: {"narx": {"mape": ..., "rmse": ..., '
                   '"per_rank": {...}}, ...}.')
def predict(trace_path, spec, exog, as_json):
    names = _names(spec)
    try:
        trace = _trace.load(trace_path)
    except _trace.TraceError as exc:
        raise ConfigError(str(exc)) from None
    try:
        columns = _signals.parse_exog(exog, trace.exog_columns)
    except ValueError as exc:
        raise ConfigError(f"{exc} (the columns of {trace_path})") from None
    trace = _trace.select(trace, columns)
    result = _trace.evaluate(trace, names)
    if as_json:
        out = {name: {"mape": r["mape"], "rmse": r["rmse"],
                      "per_rank": {str(rank): pr for rank, pr in r["per_rank"].items()}}
               for name, r in result.items()}
        try:
            text = json.dumps(out, allow_nan=False)
        except ValueError:
            raise ConfigError(f"{trace_path}: a score exceeds the range of a float (speeds near "
                              "1e308?), which JSON cannot hold; rescale the speed column") \
                from None
        click.echo(text)
        return 0
    click.echo(_table(trace, names, result))
    return 0


def _table(trace, names, result) -> str:
    ranks = sorted(trace.ranks)
    lines = [f"{trace.path}: {len(ranks)} rank(s), {trace.rows} rows; exogenous inputs: "
             f"{', '.join(trace.exog_columns) or 'none'}",
             "one-step-ahead forecasts; the first row of each rank has none", "",
             f"{'predictor':<12}{'MAPE %':>9}{'RMSE':>12}{'forecasts':>11}{'fallbacks':>11}"]
    best = min(result[n]["mape"] for n in names)
    for n in names:
        r = result[n]
        mark = "  <- best" if r["mape"] == best and len(names) > 1 else ""
        lines.append(f"{n:<12}{r['mape']:>9.2f}{r['rmse']:>12.4g}{r['count']:>11}"
                     f"{r['fallbacks']:>11}{mark}")
    lines += ["", "per rank, MAPE % (RMSE):",
              f"{'rank':<6}" + "".join(f"{n:>20}" for n in names)]
    for rank in ranks:
        cells = "".join(f"{pr['mape']:.2f} ({pr['rmse']:.4g})".rjust(20)
                        for pr in (result[n]["per_rank"][rank] for n in names))
        lines.append(f"{rank:<6}{cells}")
    return "\n".join(lines)


@click.command("trace", help=TRACE_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("metrics_path", metavar="METRICS.jsonl")
@click.option("-o", "--output", required=True, metavar="TRACE.csv", help="The trace to write.")
@click.option("--skip", type=int, default=1, show_default=True, metavar="N",
              help="Leave out iterations below N (warm-up).")
def trace(metrics_path, output, skip):
    if skip < 0:
        raise ConfigError(f"--skip {skip}: must be >= 0")
    try:
        rows = _trace.from_metrics(metrics_path, output, skip=skip)
    except _trace.TraceError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(f"wrote {rows} rows to {output}")
    return 0
