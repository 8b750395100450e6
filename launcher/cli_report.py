"""``mxlbbsp report``: PNG plots and an index.html from metrics files (mxlbbsp.analysis.report)."""
from __future__ import annotations

import click

from mxlbbsp.analysis.report import write_report
from mxlbbsp.analysis.runs import InputError, OutputError, ReportError
from mxlbbsp.core import metrics

from .config import ConfigError

REPORT_HELP = """Plot one or more metrics files and write DIR/index.html that shows them.

\b
For each METRICS file (written by 'mxlbbsp launch --metrics'): each worker's
batch size, compute and wait time per iteration, measured vs predicted speed,
and a summary table (throughput, iteration time, share of time spent waiting).
With several files, the first is the baseline of a comparison (throughput,
speedup, progress over time), e.g. a BSP run and an LB-BSP run.
Prints the path of index.html.

\b
Examples:
  mxlbbsp report m.jsonl -o report/
  mxlbbsp report bsp.jsonl lbbsp.jsonl asp.jsonl -o compare/
"""


@click.command(help=REPORT_HELP, context_settings={"help_option_names": ["-h", "--help"],
                                                    "max_content_width": 100})
@click.argument("metrics_files", nargs=-1, required=True, metavar="METRICS.jsonl [MORE...]")
@click.option("-o", "--output", required=True, metavar="DIR",
              help="Directory for index.html and the PNGs (created if missing).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              metavar="N", help="Leave the first N iterations out of tables and timing plots.")
def report(metrics_files, output, warmup):
    try:
        index = write_report(list(metrics_files), output, warmup=warmup)
    except InputError as exc:
        raise ConfigError(f"{exc}; {metrics.HINT}") from None
    except OutputError as exc:
        raise ConfigError(f"{exc}; choose another directory with -o") from None
    except ReportError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(index)
    return 0
