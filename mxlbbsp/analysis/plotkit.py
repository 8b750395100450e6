"""The report's drawing kit: matplotlib on first use (Agg canvas, no pyplot), the style,
the colours, per-worker lines or aggregate bands, axes and legends shared by every plot.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from mxlbbsp.analysis.runs import ReportError, Run

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


def _mark_events(axes, run: Run) -> None:
    """A dashed line at each of the job's events on every axis of iterations (an elastic
    job's resizes and restarts: ``2 -> 3``), labelled on the first."""
    events = getattr(run, "events", None) or []
    for i, ax in enumerate(axes):
        for ev in events:
            ax.axvline(ev["iteration"] - 0.5, color="#444444", lw=1.0, ls="--", alpha=0.7,
                       zorder=0)
            if i == 0:
                ax.annotate(f"{ev.get('workers_before', '?')} -> {ev.get('workers', '?')}",
                            xy=(ev["iteration"] - 0.5, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(3, -10), textcoords="offset points", fontsize=8,
                            color="#444444")


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
