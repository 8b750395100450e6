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
lists the diagnoses of :func:`mxlbbsp.core.metrics.diagnose`, the launcher's end-of-job notes. Up to :data:`AGGREGATE_ABOVE` workers every worker is
a line in its own colour (the same colour for the same rank in every plot); above that the
plots show the median over workers and the min-max and quartile bands instead.

The numbers of the tables come from :func:`mxlbbsp.core.metrics.summarize` and leave out the
warm-up iterations; so do the timing plots (iteration 0 builds graphs and is 10-100x slower).

matplotlib is imported on first use (Agg canvas, no pyplot: nothing global is changed);
no framework import.
"""
from __future__ import annotations

import dataclasses
import datetime
import html
import math
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp.core import metrics

__all__ = ["write_report", "ReportError", "InputError", "OutputError", "AGGREGATE_ABOVE"]

#: Above this many workers the plots aggregate (median, quartiles, min-max) instead of
#: drawing one line per worker.
AGGREGATE_ABOVE = 8

SYNC_NAMES = _modes.labels()

_DPI = 110
_COMPUTE_COLOR = "#4c72b0"
_WAIT_COLOR = "#dd8452"
_AGG_COLOR = "#3b5b92"
_STYLE = {
    "font.size": 9.5, "axes.titlesize": 10.5, "axes.titleweight": "bold",
    "axes.labelsize": 9.5, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.color": "#e3e3e3", "grid.linewidth": 0.7,
    "legend.fontsize": 8.5, "legend.frameon": False, "figure.titlesize": 12,
    "figure.titleweight": "bold",
}


class ReportError(ValueError):
    """The report cannot be written; the message is one line."""


class InputError(ReportError):
    """A metrics file is missing or malformed; the message names the file (and line)."""


class OutputError(ReportError):
    """The output directory cannot be used; the message names it."""


# ---- data --------------------------------------------------------------------------------

@dataclasses.dataclass
class Series:
    """One worker's records as arrays, in iteration order (NaN where a value is null)."""

    iteration: np.ndarray
    batch: np.ndarray
    compute: np.ndarray
    wait: np.ndarray
    speed: np.ndarray
    predicted: np.ndarray
    slowdown: np.ndarray


@dataclasses.dataclass
class Run:
    """One metrics file: its records, per-worker series and summary."""

    path: str
    records: List[dict]
    sync: str
    predictor: str
    series: Dict[int, Series]
    summary: dict
    skip: int
    label: str = ""
    #: (iteration, {name: value}, wall time) of the logged values (metrics.combine_scalars)
    curves: list = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return SYNC_NAMES.get(self.sync, self.sync)

    @property
    def ranks(self) -> List[int]:
        return sorted(self.series)

    @property
    def aggregate(self) -> bool:
        return len(self.series) > AGGREGATE_ABOVE

    @property
    def aligned(self) -> bool:
        """Whether iteration t means the same step on every worker (not so in ASP)."""
        mode = _mode(self.sync)
        return True if mode is None else mode.aligned

    @property
    def samples_per_s(self) -> float:
        """Throughput from the summary; NaN when no record has an iteration_s to measure it
        (the summary would say 0)."""
        if not math.isfinite(self.summary["mean_iteration_s"]):
            return math.nan
        return self.summary["samples_per_s"]

    @property
    def wait_missing(self) -> Dict[int, int]:
        """Per rank: how many records after warm-up have no wait_s."""
        out = {}
        for rank, s in self.series.items():
            k = int(np.isnan(s.wait[s.iteration >= self.skip]).sum())
            if k:
                out[rank] = k
        return out


_is_num = metrics.is_number


def _check(path: str, records: List[dict]) -> None:
    """One run per file (metrics.load has checked each record's fields)."""
    syncs = {rec["sync"] for rec in records}
    if len(syncs) > 1:
        raise ReportError(f"{path}: records of several runs (sync {', '.join(sorted(syncs))}); "
                          "give each run its own metrics file")


def _float(x) -> float:
    return float(x) if _is_num(x) else math.nan


def load_run(path: str, warmup: int = 1) -> Run:
    """Read and check one metrics file; :class:`InputError` names the file and line."""
    try:
        records = metrics.load(path)
    except metrics.MetricsError as exc:
        raise InputError(str(exc)) from None
    _check(path, records)
    series = {}
    for rank, rows in metrics.by_rank(records).items():
        series[rank] = Series(
            iteration=np.array([r["iteration"] for r in rows], dtype=int),
            batch=np.array([r["batch_size"] for r in rows], dtype=float),
            compute=np.array([r["compute_s"] for r in rows], dtype=float),
            wait=np.array([_float(r["wait_s"]) for r in rows]),
            speed=np.array([r["speed"] for r in rows], dtype=float),
            predicted=np.array([_float(r["predicted_speed"]) for r in rows]),
            slowdown=np.array([_float(r.get("slowdown", 1.0)) for r in rows]))
    last = max(int(s.iteration.max()) for s in series.values())
    # A run of a handful of iterations keeps them all rather than failing.
    skip = max(0, min(int(warmup), last))
    summary = metrics.summarize(records, skip=skip)
    first = records[0]
    return Run(path=path, records=records, sync=str(first["sync"]),
               predictor=str(first.get("predictor") or "?"), series=series,
               summary=summary, skip=skip, curves=metrics.combine_scalars(records))


def _label_runs(runs: Sequence[Run]) -> None:
    """Name each run by its sync mode; add the file stem (then a number) where ambiguous."""
    names = [r.name for r in runs]
    for run in runs:
        run.label = run.name
        if names.count(run.name) > 1:
            run.label = f"{run.name} ({_stem(run.path)})"
    labels = [r.label for r in runs]
    for i, run in enumerate(runs):
        if labels.count(run.label) > 1:
            run.label = f"{run.label} #{i + 1}"


def _mode(name: str) -> Optional["_modes.SyncMode"]:
    """The registered mode of a run (None for a name this version does not know)."""
    try:
        return _modes.get(name)
    except _modes.UnknownMode:
        return None


def _stem(path: str) -> str:
    base = os.path.basename(path)
    for ext in (".jsonl", ".json", ".ndjson", ".log"):
        if base.endswith(ext):
            return base[: -len(ext)]
    return base


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"


# ---- plots -------------------------------------------------------------------------------

def _mpl():
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("the report needs matplotlib: pip install 'mxlbbsp[report]'") from None
    return matplotlib, Figure, FigureCanvasAgg


def _figure(width: float, height: float):
    _, Figure, FigureCanvasAgg = _mpl()
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str) -> str:
    fig.savefig(path, dpi=_DPI, facecolor="white")
    return path


def _rank_color(rank: int):
    import matplotlib
    return matplotlib.colormaps["tab10"](rank % 10)


def _time_unit(values) -> tuple:
    """(scale, unit) for seconds: ms below one second."""
    v = np.asarray([x for x in np.ravel(values) if np.isfinite(x)])
    if v.size and np.nanmedian(v) < 1.0:
        return 1000.0, "ms"
    return 1.0, "s"


def _by_iteration(run: Run, field: str, start: int = 0):
    """(iterations, matrix [rank x iteration]) with NaN where a worker has no record."""
    its = sorted({int(t) for s in run.series.values() for t in s.iteration if t >= start})
    col = {t: j for j, t in enumerate(its)}
    m = np.full((len(run.series), len(its)), np.nan)
    for i, rank in enumerate(run.ranks):
        s = run.series[rank]
        for t, v in zip(s.iteration, getattr(s, field)):
            if t >= start:
                m[i, col[int(t)]] = v
    return np.array(its), m


def _percentiles(m: np.ndarray, q) -> np.ndarray:
    """Percentiles over workers (axis 0), NaN for an iteration nobody reported."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # all-NaN columns
        return np.nanpercentile(m, q, axis=0)


def _band(ax, run: Run, field: str, scale: float = 1.0, start: int = 0,
          color: str = _AGG_COLOR) -> None:
    """Median over workers with quartile and min-max bands."""
    its, m = _by_iteration(run, field, start)
    lo, q1, med, q3, hi = _percentiles(m * scale, [0, 25, 50, 75, 100])
    ax.fill_between(its, lo, hi, color=color, alpha=0.15, lw=0, step="mid")
    ax.fill_between(its, q1, q3, color=color, alpha=0.3, lw=0, step="mid")
    ax.plot(its, med, color=color, lw=1.6, drawstyle="steps-mid")


def _lines(ax, run: Run, field: str, scale: float = 1.0, start: int = 0,
           nested: bool = False, **kw) -> None:
    """One line per worker in its colour. ``nested``: lower ranks are drawn wider beneath
    higher ones, so that where lines coincide (equal batches) each shows as an edge."""
    n = len(run.ranks)
    for i, rank in enumerate(run.ranks):
        s = run.series[rank]
        keep = s.iteration >= start
        if nested and n > 1:
            kw["lw"] = 1.3 + 1.9 * (n - 1 - i) / (n - 1)
        ax.plot(s.iteration[keep], getattr(s, field)[keep] * scale, color=_rank_color(rank),
                **kw)


def _overlapping(run: Run, field: str) -> bool:
    """Whether two workers' lines coincide in at least a fifth of the iterations."""
    m = _by_iteration(run, field)[1]
    for i in range(len(m)):
        same = np.isfinite(m[i]) & (m[i + 1:] == m[i])
        if same.size and (same.sum(axis=1) >= 0.2 * np.isfinite(m[i]).sum()).any():
            return True
    return False


def _xlabel(run: Run, start: int = 0) -> str:
    text = "iteration" if run.aligned else "iteration (each worker's own count: not aligned)"
    if start == 1:
        text += "; warm-up iteration 0 left out"
    elif start > 1:
        text += f"; warm-up iterations 0-{start - 1} left out"
    return text


def _int_xaxis(ax) -> None:
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _fig_legend(fig, run: Run, extra=()) -> None:
    """One legend row at the bottom of the figure: a colour per worker (or the bands),
    then ``extra`` (handle, label) pairs; it never covers data."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    if run.aggregate:
        items = [(Line2D([], [], color=_AGG_COLOR, lw=1.6), "median over workers"),
                 (Patch(color=_AGG_COLOR, alpha=0.45, lw=0), "25-75 %"),
                 (Patch(color=_AGG_COLOR, alpha=0.15, lw=0), "min-max")]
    else:
        items = [(Line2D([], [], color=_rank_color(r), lw=2), f"worker {r}")
                 for r in run.ranks]
    items += list(extra)
    if len(items) > 1:
        fig.legend([h for h, _ in items], [t for _, t in items], loc="outside lower center",
                   ncol=min(len(items), 10), handlelength=1.8, columnspacing=1.6)


def _compact(v: float) -> str:
    return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1e3 else f"{v:g}"


def _log_ticks(ax, which: str = "y", dense_up_to: float = 150.0) -> None:
    """Plain numbers (50, 200, 1k, 5k) on a log axis: at 1, 2, 5 x 10^k when the axis spans
    at most ``dense_up_to`` (so narrow ranges get labels too), else at 10^k."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = axis.get_view_interval()
    subs = (1.0, 2.0, 5.0) if hi / max(lo, 1e-12) <= dense_up_to else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _compact(v)))
    axis.set_minor_locator(NullLocator())       # unlabelled and slow to lay out


def _robust_top(ax, values) -> Optional[float]:
    """Cap the y axis when a few spikes would squash the rest; returns the cap (or None)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 20:
        return None
    p98 = np.percentile(v, 98)
    if v.max() > 4 * p98 > 0:
        cap = 2 * p98
        ax.set_ylim(bottom=0, top=cap)
        return cap
    return None


def _title_of(run: Run) -> str:
    return f"{run.label}: {len(run.series)} workers, {os.path.basename(run.path)}"


def _marker(run: Run) -> dict:
    """Dots on short runs, where a line alone hides that there are few points."""
    n = max(len(s.iteration) for s in run.series.values())
    return {"marker": "o", "ms": 3.5} if n <= 30 else {}


def _label_ends(ax, run: Run, field: str, suffix: str = "", only_shared: bool = False) -> None:
    """Name the workers at the right end of their lines, one label for workers whose lines
    lie on top of each other (the same constant, or the same series), which otherwise hide
    all but the last one drawn. ``only_shared``: label such groups only."""
    groups: Dict[tuple, List[int]] = {}
    ends = {}
    for rank in run.ranks:
        s = run.series[rank]
        v = getattr(s, field)
        ok = np.isfinite(v)
        if not ok.any():
            continue
        vals = np.round(v[ok], 6)
        key = ("constant", vals[0]) if (vals == vals[0]).all() else tuple(vals)
        groups.setdefault(key, []).append(rank)
        ends[rank] = (int(s.iteration[ok][-1]), float(v[ok][-1]))
    for key, ranks in groups.items():
        if only_shared and len(ranks) < 2:
            continue
        t = max(ends[r][0] for r in ranks)
        value = ends[ranks[0]][1]
        who = (f"worker {ranks[0]}" if len(ranks) == 1
               else f"workers {', '.join(map(str, ranks))}")
        each = " each" if len(ranks) > 1 and key[0] == "constant" else ""
        text = f"{who}: {value:g}{suffix}{each}" if key[0] == "constant" else f"{who} (same)"
        ax.annotate(text, (t, value), xytext=(-2, 3), textcoords="offset points", ha="right",
                    va="bottom", fontsize=8,
                    color=_rank_color(ranks[0]) if len(ranks) == 1 else "#444444")


def plot_batch(run: Run, path: str) -> str:
    """Batch size per worker per iteration; the emulated slowdown below it, if any."""
    matplotlib, _, _ = _mpl()
    with matplotlib.rc_context(_STYLE):
        slow = any(np.nanmax(s.slowdown) != 1.0 for s in run.series.values()
                   if np.isfinite(s.slowdown).any())
        fig = _figure(11, 5.6 if slow else 4.2)
        if slow:
            ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.3])
        else:
            ax, ax2 = fig.subplots(1, 1), None
        if run.aggregate:
            _band(ax, run, "batch")
        else:
            _lines(ax, run, "batch", nested=_overlapping(run, "batch"), lw=1.6,
                   drawstyle="steps-mid", **_marker(run))
            _label_ends(ax, run, "batch", only_shared=True)
        ax.set_ylim(bottom=0)
        from matplotlib.ticker import MaxNLocator
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("batch size (samples)")
        ax.set_title("Batch size of each worker per iteration", loc="left")
        sums = np.nansum(_by_iteration(run, "batch")[1], axis=0)
        if run.aligned and sums.size:
            values, counts = np.unique(sums, return_counts=True)
            B, k = int(values[counts.argmax()]), int(counts.max())
            if k == sums.size:
                note = f"global batch B = {B} in every iteration"
            else:
                note = f"global batch B = {B} in {k} of {sums.size} iterations"
            ax.set_title(note, loc="right", fontsize=8.5, fontweight="normal", color="#555555")
        last = ax
        if ax2 is not None:
            if run.aggregate:
                _band(ax2, run, "slowdown", color="#8c564b")
            else:
                _lines(ax2, run, "slowdown", nested=_overlapping(run, "slowdown"), lw=1.4,
                       drawstyle="steps-mid")
                _label_ends(ax2, run, "slowdown", suffix="x")
            ax2.set_ylabel("slowdown (x)")
            ax2.set_title("Emulated slowdown: each worker's compute time is stretched by this "
                          "factor", loc="left", fontsize=9.5)
            ax2.set_ylim(0, max(np.nanmax(s.slowdown) for s in run.series.values()) * 1.25)
            last = ax2
        last.set_xlabel(_xlabel(run))
        _int_xaxis(last)
        fig.suptitle(_title_of(run))
        _fig_legend(fig, run)
        return _save(fig, path)


def _has_plan(run: Run) -> bool:
    """A run whose coordinator chose the global batch B(t) (a mode that ``sets_batch``)."""
    mode = _mode(run.sync)
    return mode is not None and mode.sets_batch


def plot_plan(run: Run, path: str) -> str:
    """Courier: the global batch B(t) it chose, the predicted finish against the deadline,
    and the learning-rate factor that followed B(t)."""
    matplotlib, _, _ = _mpl()
    first = {}
    for r in run.records:
        first.setdefault(int(r["iteration"]), r)
    its = np.array(sorted(first))
    rec = [first[t] for t in its]
    B = np.array([_float(r.get("global_batch")) for r in rec])
    finish = np.array([_float(r.get("predicted_finish_s")) for r in rec])
    elapsed = np.array([_float(r.get("elapsed_s")) for r in rec])
    lr = np.array([_float(r.get("lr_factor", 1.0)) for r in rec])
    # courier's deadline; a mode that chooses B(t) for another goal has none
    deadline = next((_float(r["deadline_s"]) for r in rec if _is_num(r.get("deadline_s"))),
                    math.nan)
    lo_hi = next((r.get("batch_range") for r in rec if r.get("batch_range")), None)
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 7.2)
        ax, ax2, ax3 = fig.subplots(3, 1, sharex=True, height_ratios=[2.2, 2.2, 1.2])
        ax.plot(its, B, drawstyle="steps-mid", lw=1.8, color="#1f77b4", label="B(t)")
        if lo_hi:
            for y in lo_hi:
                ax.axhline(y, color="#999999", lw=0.8, ls=":")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("global batch (samples)")
        ax.set_title("Global batch chosen by the coordinator", loc="left")
        if lo_hi:
            ax.set_title(f"--batch-range {lo_hi[0]}:{lo_hi[1]} (dotted)", loc="right",
                         fontsize=8.5, fontweight="normal", color="#555555")
        ok = np.isfinite(finish)
        ax2.plot(its[ok], finish[ok], lw=1.6, color="#d62728",
                 label="predicted finish (s from launch)")
        ok = np.isfinite(elapsed)
        ax2.plot(its[ok], elapsed[ok], lw=1.2, color="#555555", ls="--",
                 label="time elapsed (s from launch)")
        if math.isfinite(deadline):
            ax2.axhline(deadline, color="black", lw=1.2, label=f"deadline ({deadline:g} s)")
        done = np.array([_float(r.get("done_s")) for r in rec])
        ended = float(np.nanmax(done)) if np.isfinite(done).any() else math.nan
        if math.isfinite(ended) and math.isfinite(deadline):
            missed = ended > deadline
            ax2.plot([its[np.nanargmax(done)]], [ended], marker="X", ms=10, ls="none",
                     color="#d62728" if missed else "#2ca02c",
                     label=f"training ended ({ended:.1f} s: "
                           + (f"missed by {ended - deadline:.1f} s)" if missed
                              else f"met, {deadline - ended:.1f} s to spare)"))
        # the axis shows the deadline, where training ended and the predictions (a spike of
        # the prediction may be cut; the deadline and the end never are)
        cut = _robust_top(ax2, np.concatenate([finish[np.isfinite(finish)],
                                               [deadline] if math.isfinite(deadline) else []]))
        must = max(deadline if math.isfinite(deadline) else 0.0,
                   ended if math.isfinite(ended) else 0.0,
                   float(np.nanmax(elapsed)) if np.isfinite(elapsed).any() else 0.0)
        top = cut if cut else max([must] + list(finish[np.isfinite(finish)]))
        ax2.set_ylim(0, max(top, must) * 1.15)
        ax2.set_ylabel("seconds")
        ax2.set_title("Predicted finish of the remaining work against the deadline", loc="left")
        ax2.legend(loc="best", fontsize=8)
        ax3.plot(its, lr, drawstyle="steps-mid", lw=1.4, color="#2ca02c")
        ax3.set_ylim(bottom=0)
        ax3.set_ylabel("lr factor")
        ax3.set_title("Learning rate / base learning rate (--lr-scaling of B(t) / B0)",
                      loc="left", fontsize=9.5)
        ax3.set_xlabel(_xlabel(run))
        _int_xaxis(ax3)
        fig.suptitle(_title_of(run))
        return _save(fig, path)


def plot_time(run: Run, path: str) -> str:
    """Compute and wait time per iteration (two panels) and the per-worker mean split."""
    matplotlib, _, _ = _mpl()
    from matplotlib.patches import Patch
    start = run.skip
    all_c = np.concatenate([s.compute[s.iteration >= start] for s in run.series.values()])
    all_w = np.concatenate([s.wait[s.iteration >= start] for s in run.series.values()])
    scale, unit = _time_unit(np.concatenate([all_c, all_w]))
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 5.8)
        gs = fig.add_gridspec(2, 2, width_ratios=[3, 1.15])
        axc = fig.add_subplot(gs[0, 0])
        axw = fig.add_subplot(gs[1, 0], sharex=axc)
        axb = fig.add_subplot(gs[:, 1])
        for ax, field, what, values in ((axc, "compute", "Compute time", all_c),
                                        (axw, "wait", "Wait time", all_w)):
            if run.aggregate:
                _band(ax, run, field, scale, start)
            else:
                _lines(ax, run, field, scale, start, lw=1.1, **_marker(run))
            ax.set_ylabel(f"{what.lower()} ({unit})")
            ax.set_ylim(bottom=0)
            cap = _robust_top(ax, values * scale)
            note = f" (axis cut at {cap:.3g} {unit}: rare spikes above)" if cap else ""
            ax.set_title(f"{what} per iteration{note}", loc="left")
        axc.tick_params(labelbottom=False)
        if not np.isfinite(all_w).any():
            axw.text(0.5, 0.5, "no wait times recorded (wait_s is null)", ha="center",
                     va="center", transform=axw.transAxes, color="#777777")
            axw.set_yticks([])
        axw.set_xlabel(_xlabel(run, start))
        _int_xaxis(axw)

        # Per worker: mean compute + mean wait = where its iteration time goes.
        per = run.summary["per_rank"]
        ranks = [r for r in run.ranks if r in per]
        y = np.arange(len(ranks))
        comp = np.array([per[r]["mean_compute_s"] for r in ranks]) * scale
        wait = np.array([per[r]["mean_wait_s"] for r in ranks]) * scale
        few = len(ranks) <= 16
        colors = ([_COMPUTE_COLOR] * len(ranks) if run.aggregate
                  else [_rank_color(r) for r in ranks])
        hatch = "////" if few else None        # hatching thin bars only makes noise
        axb.barh(y, comp, 0.7 if few else 0.8, color=colors)
        axb.barh(y, wait, 0.7 if few else 0.8, left=comp, color=_WAIT_COLOR, alpha=0.45,
                 hatch=hatch, edgecolor="white", lw=0)
        step = 1 if len(ranks) <= 16 else int(math.ceil(len(ranks) / 16))
        axb.set_yticks(y[::step])
        axb.set_yticklabels([f"worker {ranks[i]}" for i in y[::step]])
        axb.set_ylim(len(ranks) - 0.5, -0.5)
        axb.grid(axis="y", visible=False)
        axb.set_xlabel(f"mean time per iteration ({unit})")
        axb.set_title("Mean iteration of each worker", loc="left")
        if few:
            for yi, c, w, r in zip(y, comp, wait, ranks):
                share = per[r]["wait_share"]
                if np.isfinite(share) and r not in run.wait_missing:
                    axb.text(c + w, yi, f" {share:.0%} wait", va="center", fontsize=8,
                             color="#444444")
        axb.set_xlim(0, max(1e-12, float(np.nanmax(comp + wait))) * 1.35)
        extra = [(Patch(color="#888888" if not run.aggregate else _COMPUTE_COLOR),
                  "compute" + ("" if run.aggregate else " (bar in the worker's colour)")),
                 (Patch(facecolor=_WAIT_COLOR, alpha=0.45, hatch=hatch, edgecolor="white",
                        lw=0), "wait")]
        fig.suptitle(_title_of(run))
        _fig_legend(fig, run, extra)
        return _save(fig, path)


def _mape(run: Run) -> Optional[float]:
    errs = []
    for s in run.series.values():
        keep = (s.iteration >= run.skip) & np.isfinite(s.predicted) & (s.speed > 0)
        errs.append(np.abs(s.predicted[keep] - s.speed[keep]) / s.speed[keep])
    e = np.concatenate(errs) if errs else np.array([])
    return float(e.mean()) if e.size else None


def plot_speed(run: Run, path: str) -> str:
    """Measured speed (solid) and predicted speed (dashed) per worker; a scatter of the two."""
    matplotlib, _, _ = _mpl()
    from matplotlib.lines import Line2D
    start = run.skip
    has_pred = any(np.isfinite(s.predicted[s.iteration >= start]).any()
                   for s in run.series.values())
    values = np.concatenate([s.speed[s.iteration >= start] for s in run.series.values()]
                            + [s.predicted[s.iteration >= start] for s in run.series.values()])
    pos = values[np.isfinite(values) & (values > 0)]
    logy = pos.size > 0 and pos.max() / pos.min() > 20
    dashed = (0, (3, 2))
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 4.8)
        if has_pred:
            ax, axs = fig.subplots(1, 2, width_ratios=[2.3, 1])
        else:
            ax, axs = fig.subplots(1, 1), None
        extra = []
        if run.aggregate:
            _band(ax, run, "speed", start=start)
            if has_pred:
                its, m = _by_iteration(run, "predicted", start)
                ax.plot(its, _percentiles(m, 50), color="#c44e52", lw=1.3, ls=dashed,
                        drawstyle="steps-mid")
                extra = [(Line2D([], [], color="#c44e52", lw=1.3, ls=dashed),
                          "median predicted")]
        else:
            _lines(ax, run, "speed", start=start, lw=1.3, **_marker(run))
            if has_pred:
                mk = _marker(run)
                if mk:
                    mk.update(mfc="white", mew=1.2)
                _lines(ax, run, "predicted", start=start, lw=1.2, ls=dashed, alpha=0.9, **mk)
                extra = [(Line2D([], [], color="#555555", lw=1.3), "measured"),
                         (Line2D([], [], color="#555555", lw=1.2, ls=dashed), "predicted")]
        if logy:
            ax.set_yscale("log")
            _log_ticks(ax, "y")
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel("speed (samples/s" + (", log scale)" if logy else ")"))
        ax.set_xlabel(_xlabel(run, start))
        _int_xaxis(ax)
        if has_pred:
            ax.set_title("Measured speed (solid) and the forecast made one iteration earlier "
                         "(dashed)", loc="left")
        else:
            ax.set_title("Measured speed per iteration (this run recorded no predictions)",
                         loc="left")
        if axs is not None:
            xs, ys, cs = [], [], []
            for rank in run.ranks:
                s = run.series[rank]
                keep = (s.iteration >= start) & np.isfinite(s.predicted)
                xs.append(s.speed[keep])
                ys.append(s.predicted[keep])
                cs.append(np.full(int(keep.sum()), rank))
            x, yv, c = np.concatenate(xs), np.concatenate(ys), np.concatenate(cs)
            if run.aggregate:
                sc = axs.scatter(x, yv, c=c, cmap="viridis", s=7, alpha=0.6, lw=0)
                fig.colorbar(sc, ax=axs, label="worker rank", fraction=0.07, pad=0.02)
            else:
                axs.scatter(x, yv, c=[_rank_color(int(r)) for r in c],
                            s=30 if _marker(run) else 12, alpha=0.6, lw=0)
            both = np.concatenate([x, yv])
            both = both[np.isfinite(both) & (both > 0)]
            lo, hi = (float(both.min()), float(both.max())) if both.size else (0.5, 1.0)
            if logy:
                lo, hi = lo / 1.4, hi * 1.4
                axs.set_xscale("log")
                axs.set_yscale("log")
            else:
                lo, hi = 0.0, hi * 1.08
            axs.plot([lo, hi], [lo, hi], color="#888888", lw=1, ls=":")
            axs.set_xlim(lo, hi)
            axs.set_ylim(lo, hi)
            if logy:
                _log_ticks(axs, "x", dense_up_to=60)
                _log_ticks(axs, "y", dense_up_to=60)
            axs.set_aspect("equal", adjustable="box")
            axs.set_xlabel("measured speed (samples/s)")
            axs.set_ylabel("predicted speed (samples/s)")
            mape = _mape(run)
            axs.set_title("Forecast vs outcome"
                          + (f"\nmean abs. error {mape:.1%}" if mape is not None else ""),
                          loc="left")
            axs.text(0.97, 0.03, "dotted: exact forecast", transform=axs.transAxes,
                     ha="right", va="bottom", fontsize=8, color="#666666")
        fig.suptitle(_title_of(run))
        _fig_legend(fig, run, extra)
        return _save(fig, path)


def _scalar_names(runs: Sequence[Run]) -> List[str]:
    names = {n for run in runs for _, values, _ in run.curves for n in values}
    first = [n for n in ("loss", "accuracy") if n in names]
    return first + sorted(names - set(first))


def plot_scalars(runs: Sequence[Run], path: str) -> str:
    """Each logged value against wall time (left) and iterations (right), one line per run."""
    matplotlib, _, _ = _mpl()
    colors = matplotlib.colormaps["Set2"].colors if len(runs) > 1 else ["#1f77b4"]
    names = _scalar_names(runs)
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 0.6 + 3.0 * len(names))
        axes = np.atleast_2d(fig.subplots(len(names), 2, squeeze=False))
        for row, name in zip(axes, names):
            axt, axi = row
            for i, run in enumerate(runs):
                pts = [(t, v[name], when) for t, v, when in run.curves if name in v]
                if not pts:
                    continue
                start = min(float(r["time"]) for r in run.records)
                its = np.array([p[0] for p in pts])
                val = np.array([p[1] for p in pts], dtype=float)
                when = np.array([p[2] for p in pts]) - start
                style = dict(color=colors[i % len(colors)], lw=1.8, label=run.label)
                if len(pts) < 30:
                    style.update(marker="o", ms=3.5)
                axt.plot(when, val, **style)
                # against iterations, runs of an exact method coincide: earlier runs are
                # drawn wider beneath later ones, so that each shows as an edge
                wide = 1.6 + 3.0 * (len(runs) - 1 - i) / max(len(runs) - 1, 1)
                axi.plot(its, val, **dict(style, lw=wide))
                bad = ~np.isfinite(val)
                if bad.any():          # NaN or infinite: a diverged run, marked at the bottom
                    axt.plot(when[bad], np.zeros(bad.sum()), "x", color=style["color"])
            for ax, what in ((axt, "wall time since the run's first report (s)"),
                             (axi, "iteration")):
                ax.set_ylabel(name)
                ax.set_xlabel(what)
                ax.set_xlim(left=0)
            _int_xaxis(axi)
            axt.set_title(f"{name} against wall time", loc="left")
            axi.set_title(f"{name} against iterations" + (
                " (an edge: runs that coincide)" if len(runs) > 1 else ""), loc="left")
            axt.legend(loc="best")
        fig.suptitle("Logged values (mxlbbsp.log): per iteration, the batch-weighted mean over "
                     "the workers that logged them")
        return _save(fig, path)


def plot_compare(runs: Sequence[Run], path: str) -> str:
    """Throughput with speedup over the first run; samples processed over wall time."""
    matplotlib, _, _ = _mpl()
    colors = matplotlib.colormaps["Set2"].colors
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 4.2)
        axb, axt = fig.subplots(1, 2, width_ratios=[1, 1.5])
        rates = [r.samples_per_s for r in runs]
        y = np.arange(len(runs))
        axb.barh(y, np.nan_to_num(rates), 0.6,
                 color=[colors[i % len(colors)] for i in range(len(runs))])
        axb.set_yticks(y)
        axb.set_yticklabels([r.label for r in runs])
        axb.invert_yaxis()
        axb.grid(axis="y", visible=False)
        base = rates[0]
        for yi, rate in zip(y, rates):
            if not math.isfinite(rate):
                axb.text(0, yi, " n/a (no iteration_s in the records)", va="center",
                         fontsize=8.5, color="#777777")
                continue
            txt = f" {rate:,.0f}"
            if yi == 0:
                txt += "  (baseline)"
            elif base > 0:
                txt += f"  ({rate / base:.2f}x)"
            axb.text(rate, yi, txt, va="center", fontsize=8.5)
        axb.set_xlim(0, max([r for r in rates if math.isfinite(r)] + [1.0]) * 1.45)
        axb.set_xlabel("throughput (samples/s, after warm-up)")
        axb.set_title(f"Throughput; speedup vs {runs[0].label}", loc="left")

        for i, run in enumerate(runs):
            t = np.array([r["time"] for r in run.records], dtype=float)
            b = np.array([r["batch_size"] for r in run.records], dtype=float)
            order = np.argsort(t, kind="stable")
            t, b = t[order] - t.min(), np.cumsum(b[order])
            axt.plot(t, b, color=colors[i % len(colors)], lw=2, label=run.label)
        axt.set_xlabel("wall time since the run's first report (s)")
        axt.set_ylabel("samples processed (all workers)")
        axt.set_xlim(left=0)
        axt.set_ylim(bottom=0)
        axt.set_title("Progress over time (steeper is faster)", loc="left")
        axt.legend(loc="upper left")
        fig.suptitle("Comparison of the runs")
        return _save(fig, path)


# ---- html --------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#222;
     max-width:1240px;margin:24px auto;padding:0 16px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:19px;margin-top:36px;
   border-bottom:2px solid #ddd;padding-bottom:4px} h3{font-size:15px;margin:20px 0 6px}
.meta{color:#555} code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;margin:6px 0 14px;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid #e4e4e4;text-align:right}
th{background:#f6f6f6;font-weight:600} td:first-child,th:first-child{text-align:left}
tr:nth-child(even) td{background:#fbfbfb}
figure{margin:14px 0 22px} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:13px;max-width:960px}
.note{color:#8a5a00;background:#fff7e0;padding:6px 10px;border-radius:4px;max-width:960px}
nav a{margin-right:14px}
.tables{display:flex;flex-wrap:wrap;gap:12px 40px;align-items:flex-start}
details summary{cursor:pointer;margin:6px 0}
"""


def _fmt(x, spec: str, suffix: str = "") -> str:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "n/a"
    return f"{x:{spec}}{suffix}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _iterations_text(run: Run) -> str:
    counts = [len(s.iteration) for s in run.series.values()]
    if min(counts) == max(counts):
        return f"{counts[0]} iterations"
    return f"{min(counts)}-{max(counts)} iterations per worker"


def overall_rows(run: Run, unit: tuple) -> List[List[str]]:
    s = run.summary
    scale, name = unit
    return [["samples/s", _fmt(run.samples_per_s, ".1f")],
            ["mean iteration time", _fmt(s["mean_iteration_s"] * scale, ".2f", f" {name}")],
            ["wait share", _fmt(s["wait_share"] * 100, ".1f", " %")],
            ["compute share", _fmt(s["compute_share"] * 100, ".1f", " %")],
            ["balancing's bound", _fmt(s["balance_gain"] * 100, ".1f", " %")]]


def rank_rows(run: Run, unit: tuple) -> List[List[str]]:
    scale, name = unit
    missing = run.wait_missing
    rows = []
    for rank, p in sorted(run.summary["per_rank"].items()):
        no_wait = missing.get(rank, 0) >= p["iterations"]
        mark = " *" if rank in missing and not no_wait else ""
        rows.append([
            f"worker {rank}", str(p["iterations"]), _fmt(p["mean_batch"], ".1f"),
            _fmt(p["mean_compute_s"] * scale, ".2f"),
            "n/a" if no_wait else _fmt(p["mean_wait_s"] * scale, ".2f") + mark,
            "n/a" if no_wait else _fmt(p["wait_share"] * 100, ".1f", " %") + mark,
            _fmt(p["mean_speed"], ".1f")])
    return rows


def _warmup_text(skip: int) -> str:
    if skip == 0:
        return "all iterations (too few to leave out a warm-up)"
    if skip == 1:
        return "leaving out warm-up iteration 0"
    return f"leaving out warm-up iterations 0-{skip - 1}"


def _has_predictions(run: Run) -> bool:
    return any(np.isfinite(s.predicted[s.iteration >= run.skip]).any()
               for s in run.series.values())


def _run_section(run: Run, images: Dict[str, str], anchor: str) -> str:
    s = run.summary
    unit = _time_unit([p["mean_iteration_s"] for p in s["per_rank"].values()]
                      + [p["mean_compute_s"] for p in s["per_rank"].values()])
    pred = html.escape(run.predictor)
    mode = _mode(run.sync)
    if mode is not None and not mode.uses_predictor:
        pred += " (recorded only: this mode does not split by it)"
    out = [f'<h2 id="{anchor}">{html.escape(run.label)}</h2>',
           f'<p class="meta">sync mode <b>{html.escape(run.name)}</b> '
           f'(<code>{html.escape(run.sync)}</code>) &middot; predictor <b>{pred}</b> &middot; '
           f'<b>{len(run.series)}</b> workers &middot; <b>{_iterations_text(run)}</b> '
           f'({len(run.records)} records) &middot; source <code>{html.escape(run.path)}</code>'
           f'</p>']
    notes = []
    if run.wait_missing:
        k = sum(run.wait_missing.values())
        notes.append(f"{k} record(s) have no wait time (wait_s null); the summary counts them "
                     "as 0 s of waiting (marked *; n/a where a worker has none at all).")
    if not math.isfinite(run.samples_per_s):
        notes.append("No record has iteration_s: throughput, iteration time and wait share "
                     "cannot be computed (n/a).")
    if not run.aligned:
        notes.append("ASP: workers do not wait for each other, so iteration t of one worker "
                     "is not iteration t of another; plots use each worker's own count.")
    if run.aggregate:
        notes.append(f"{len(run.series)} workers: the plots show the median over workers "
                     "with quartile and min-max bands instead of one line per worker.")
    out += [f'<p class="note">{html.escape(n)}</p>' for n in notes]

    diagnoses = metrics.diagnose(run.summary)
    if diagnoses:
        out.append("<h3>Diagnosis</h3><ul>" + "".join(
            f"<li>{html.escape(d)}</li>" for d in diagnoses) + "</ul>")
    out.append(f'<h3>Summary</h3><p class="meta">From <code>mxlbbsp.core.metrics.summarize</code>, '
               f"{_warmup_text(run.skip)}.</p>")
    head = ["worker", "iterations", "mean batch", f"mean compute ({unit[1]})",
            f"mean wait ({unit[1]})", "wait share", "mean speed (samples/s)"]
    per_worker = _table(head, rank_rows(run, unit))
    if len(run.series) > 16:
        per_worker = (f"<details><summary>per worker ({len(run.series)} workers)</summary>"
                      f"{per_worker}</details>")
    out.append(f'<div class="tables"><div>{_table(["whole run", ""], overall_rows(run, unit))}'
               f"</div><div>{per_worker}</div></div>")

    if _has_predictions(run):
        speed = ("Speed = batch size / compute time. Dashed: what the predictor expected one "
                 "iteration earlier; right: every (measured, predicted) pair, on the dotted "
                 "diagonal when the forecast is exact.")
    else:
        speed = "Speed = batch size / compute time. This run recorded no predicted speeds."
    captions = {
        "batch": "Samples each worker processed per iteration. LB-BSP gives faster workers "
                 "more of the global batch; BSP and ASP split it equally.",
        "time": f"Left: compute time (forward + backward) and wait time (allocation + "
                f"push/pull, i.e. waiting for the others) per iteration, in {unit[1]}. "
                "Right: each worker's mean iteration split into computing and waiting; "
                "balanced training makes the bars equally long, with little waiting.",
        "speed": speed,
        "plan": "Courier: the global batch B(t) the coordinator chose (top), its prediction "
                "of when the remaining work ends at that batch, against the deadline "
                "(middle), and the learning-rate factor that followed B(t) (bottom).",
    }
    for kind in ("plan", "batch", "time", "speed"):
        if kind in images:
            src = html.escape(images[kind])
            out.append(f'<figure><img src="{src}" alt="{kind} plot of {html.escape(run.label)}">'
                       f"<figcaption>{html.escape(captions[kind])}</figcaption></figure>")
    return "\n".join(out)


def compare_rows(runs: Sequence[Run], unit: tuple) -> List[List[str]]:
    base = runs[0].samples_per_s
    rows = []
    for run in runs:
        s = run.summary
        speedup = run.samples_per_s / base if base > 0 else math.nan
        rows.append([run.label, os.path.basename(run.path), str(s["workers"]),
                     _fmt(run.samples_per_s, ".1f"),
                     _fmt(s["mean_iteration_s"] * unit[0], ".2f"),
                     _fmt(s["wait_share"] * 100, ".1f", " %"), _fmt(speedup, ".2f", "x")])
    return rows


def _html(runs: Sequence[Run], images: List[Dict[str, str]], compare: Optional[str],
          scalars: Optional[str] = None) -> str:
    anchors = [f"run-{i + 1}" for i in range(len(runs))]
    title = "mxlbbsp report: " + " vs ".join(r.label for r in runs)
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f'<p class="meta">Generated {datetime.datetime.now():%Y-%m-%d %H:%M} by '
             f"<code>mxlbbsp report</code> from "
             + ", ".join(f"<code>{html.escape(os.path.basename(r.path))}</code>" for r in runs)
             + ".</p>"]
    if len(runs) > 1:
        parts.append("<nav>" + "".join(f'<a href="#{a}">{html.escape(r.label)}</a>'
                                       for a, r in zip(anchors, runs)) + "</nav>")
        parts.append("<h2>Comparison</h2>")
        unit = _time_unit([r.summary["mean_iteration_s"] for r in runs])
        parts.append(_table(["run", "file", "workers", "samples/s",
                             f"mean iteration time ({unit[1]})", "wait share",
                             f"speedup vs {runs[0].label}"], compare_rows(runs, unit)))
        if compare:
            parts.append(f'<figure><img src="{html.escape(compare)}" alt="comparison plot">'
                         "<figcaption>Left: throughput after warm-up, with the speedup over "
                         "the first file. Right: samples processed by all workers over wall "
                         "time; the slope is the throughput.</figcaption></figure>")
    if scalars:
        parts.append("<h2>Training curves</h2>")
        parts.append(f'<figure><img src="{html.escape(scalars)}" alt="logged values">'
                     "<figcaption>What the scripts gave <code>mxlbbsp.log</code>, against wall "
                     "time since each run's first report (left) and against iterations "
                     "(right), one line per run (on the right each run is drawn narrower than the one "
                     "before, so that runs that coincide, as BSP and LB-BSP do, show as an "
                     "edge); per iteration the mean over the workers that "
                     "logged the value, weighted by their batch sizes. A cross at the bottom: "
                     "NaN or infinite (diverged).</figcaption></figure>")
    for run, imgs, anchor in zip(runs, images, anchors):
        parts.append(_run_section(run, imgs, anchor))
    parts.append("</body></html>\n")
    return "\n".join(parts)


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
        if _has_plan(run):
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
