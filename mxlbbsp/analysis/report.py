"""The run report (``mxlbbsp report``): PNG plots and one ``index.html`` from metrics files.

For every metrics file (``mxlbbsp launch --metrics``) the report draws

* ``*-batch.png``    each worker's batch size per iteration (and its emulated slowdown, when
                     the run had one): how the global batch was split;
* ``*-time.png``     each worker's compute and wait time per iteration, and the per-worker
                     mean split into computing and waiting: who waits for whom;
* ``*-speed.png``    measured speed against the speed the predictor expected one iteration
                     earlier (measured only, when the run made no predictions);

and, for two or more files, ``compare.png``: throughput and speedup over the first file, and
the samples processed over wall time. When the scripts logged values (``mxlbbsp.log``),
``scalars.png`` draws each of them against wall time and against iterations, one line per
run (per iteration, the batch-weighted mean over the workers that logged it:
:func:`mxlbbsp.core.metrics.combine_scalars`, as ``--tensorboard`` writes it). Each run's section
lists the diagnoses of :func:`mxlbbsp.core.metrics.diagnose`, the launcher's end-of-job notes. Up to :data:`~mxlbbsp.analysis.runs.AGGREGATE_ABOVE` workers every worker is
a line in its own colour (the same colour for the same rank in every plot); above that the
plots show the median over workers and the min-max and quartile bands instead.

The numbers of the tables come from :func:`mxlbbsp.core.metrics.summarize` and leave out the
warm-up iterations; so do the timing plots (iteration 0 builds graphs and is 10-100x slower).

matplotlib is imported on first use (Agg canvas, no pyplot: nothing global is changed);
no framework import.
"""
from __future__ import annotations

import os
from typing import Sequence

from mxlbbsp.analysis.html import _html
from mxlbbsp.analysis.plotkit import _mpl
from mxlbbsp.analysis.plots import (
    _has_goodput,
    _has_plan,
    plot_batch,
    plot_compare,
    plot_goodput,
    plot_plan,
    plot_scalars,
    plot_speed,
    plot_time,
)
from mxlbbsp.analysis.runs import OutputError, ReportError, Run, _label_runs, _slug, load_run

__all__ = ["write_report"]


# ---- entry point -------------------------------------------------------------------------

def _check_dir(out_dir: str) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(f"output {out_dir!r} is a file, not a directory")


def _prepare_dir(out_dir: str) -> None:
    _check_dir(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output directory {out_dir!r}: {exc.strerror}") \
            from None
    if not os.access(out_dir, os.W_OK):
        raise OutputError(f"output directory {out_dir!r} is not writable")


def write_report(paths: Sequence[str], out_dir: str, warmup: int = 1) -> str:
    """Write the plots and ``index.html`` for the metrics files ``paths`` into ``out_dir``.

    Returns the path of ``index.html``. With several files, the first is the baseline of the
    comparison. ``warmup``: iterations left out of the tables and timing plots.
    Raises :class:`InputError` (naming the file and line) for a bad metrics file,
    :class:`OutputError` for an unusable ``out_dir``, :class:`ReportError` otherwise.
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ReportError("no metrics file given")
    if warmup < 0:
        raise ReportError(f"warm-up must be >= 0, got {warmup}")
    out_dir = os.fspath(out_dir)
    runs = [load_run(p, warmup) for p in paths]
    _label_runs(runs)
    _check_dir(out_dir)                   # bad input fails before the slow import
    _mpl()
    _prepare_dir(out_dir)
    try:
        return _write(runs, out_dir)
    except OSError as exc:
        raise OutputError(f"cannot write to {out_dir!r}: "
                          f"{exc.strerror or exc}") from None


def _write(runs: Sequence[Run], out_dir: str) -> str:
    images = []
    used = set()
    for i, run in enumerate(runs):
        prefix = _slug(run.label) if len(runs) > 1 else "run"
        if prefix in used:
            prefix = f"{prefix}-{i + 1}"
        used.add(prefix)
        imgs = {}
        plots = [("batch", plot_batch), ("time", plot_time), ("speed", plot_speed)]
        if _has_goodput(run):             # B(t) by goodput: its own plot, no deadline
            plots.insert(0, ("goodput", plot_goodput))
        elif _has_plan(run):
            plots.insert(0, ("plan", plot_plan))
        for kind, plot in plots:
            name = f"{prefix}-{kind}.png"
            plot(run, os.path.join(out_dir, name))
            imgs[kind] = name
        images.append(imgs)
    compare = None
    if len(runs) > 1:
        compare = "compare.png"
        plot_compare(runs, os.path.join(out_dir, compare))
    scalars = None
    if any(run.curves for run in runs):
        scalars = "scalars.png"
        plot_scalars(runs, os.path.join(out_dir, scalars))
    index = os.path.join(out_dir, "index.html")
    with open(index, "w", encoding="utf-8") as fh:
        fh.write(_html(runs, images, compare, scalars))
    return index
