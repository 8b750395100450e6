"""The report's plots, one function per PNG: batch sizes, Courier's plan, compute and
wait time, measured and predicted speed, the script's logged values, and the comparison
of several runs (see :mod:`mxlbbsp.analysis.report` for what each shows).

Long, on purpose: plot functions that share only the kit (plotkit.py); each is read on
its own, and splitting the file would only separate them by an arbitrary line.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np

from mxlbbsp.analysis.plotkit import (
    _COMPUTE_COLOR,
    _STYLE,
    _WAIT_COLOR,
    _band,
    _by_iteration,
    _fig_legend,
    _figure,
    _int_xaxis,
    _label_ends,
    _lines,
    _log_ticks,
    _mark_events,
    _marker,
    _mpl,
    _overlapping,
    _percentiles,
    _rank_color,
    _robust_top,
    _save,
    _time_unit,
    _title_of,
    _xlabel,
)
from mxlbbsp.analysis.runs import Run, _float, _mode
from mxlbbsp.analysis.trace import score
from mxlbbsp.core import metrics


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
        _mark_events([ax] + ([ax2] if ax2 is not None else []), run)
        fig.suptitle(_title_of(run))
        _fig_legend(fig, run)
        return _save(fig, path)


def _has_goodput(run: Run) -> bool:
    """A run whose coordinator chose the global batch by goodput (``--sync goodput``)."""
    return any(r.get("goodput_model") is not None for r in run.records)


def _batch_panel(ax, its, B, lo_hi) -> None:
    """The global batch B(t) a mode chose, with its --batch-range dotted."""
    ax.plot(its, B, drawstyle="steps-mid", lw=1.8, color="#1f77b4", label="B(t)")
    for y in lo_hi or ():
        ax.axhline(y, color="#999999", lw=0.8, ls=":")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("global batch (samples)")


def plot_goodput(run: Run, path: str) -> str:
    """Goodput: the global batch B(t) it chose, the gradient noise scale it measured, and
    the statistical efficiency and learning-rate factor at B(t)."""
    matplotlib, _, _ = _mpl()
    its, rec = run.first_records()
    B = np.array([_float(r.get("global_batch")) for r in rec])
    phi = np.array([_float(r.get("noise_scale")) for r in rec])
    eff = np.array([_float(r.get("efficiency")) for r in rec])
    lr = np.array([_float(r.get("lr_factor", 1.0)) for r in rec])
    lo_hi = next((r.get("batch_range") for r in rec if r.get("batch_range")), None)
    kind = next((r.get("goodput_model") for r in rec if r.get("goodput_model")), "hetero")
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 7.2)
        ax, ax2, ax3 = fig.subplots(3, 1, sharex=True, height_ratios=[2.2, 2.2, 1.2])
        _batch_panel(ax, its, B, lo_hi)
        ax.set_title(f"Global batch chosen for the most goodput ({kind} throughput model)",
                     loc="left")
        # a log axis: the noise scale may grow 10-100x over a job, and one wild early value
        # must not flatten the rest to a line at 0 (only positive values can be drawn)
        ok = np.isfinite(phi) & (phi > 0)
        ax2.plot(its[ok], phi[ok], lw=1.6, color="#9467bd",
                 label="noise scale tr(\u03a3)/|G|\u00b2 (samples; the one B goes by)")
        low, high = (np.array([_float((r.get("noise_scale_range") or [None, None])[k])
                               for r in rec]) for k in (0, 1))
        band = np.isfinite(low) & (low > 0)
        if band.any():
            top = np.where(np.isfinite(high), high, np.nanmax(np.r_[phi[ok], low[band]]) * 10)
            ax2.fill_between(its[band], low[band], top[band], color="#9467bd", alpha=0.15,
                             lw=0, label="its error bar (one standard error of S and V)")
        ok_b = np.isfinite(B) & (B > 0)
        ax2.plot(its[ok_b], B[ok_b], lw=1.0, color="#1f77b4", ls="--", label="B(t)")
        if ok.any() or ok_b.any():
            ax2.set_yscale("log")
            shown = np.r_[phi[ok], B[ok_b]]
            ax2.set_ylim(shown.min() / 2, shown.max() * 2)
        ax2.set_ylabel("samples (log)")
        ax2.set_title("Gradient noise scale measured from the workers' local gradients",
                      loc="left")
        ax2.legend(loc="best", fontsize=8)
        ok = np.isfinite(eff)
        ax3.plot(its[ok], eff[ok], drawstyle="steps-mid", lw=1.4, color="#d62728",
                 label="statistical efficiency at B(t)")
        ax3.plot(its, lr, drawstyle="steps-mid", lw=1.4, color="#2ca02c",
                 label="lr factor (--lr-scaling)")
        ax3.set_ylim(bottom=0)
        ax3.legend(loc="best", fontsize=8)
        ax3.set_title("Efficiency (phi + B0) / (phi + B) and the learning-rate factor",
                      loc="left", fontsize=9.5)
        ax3.set_xlabel(_xlabel(run))
        _int_xaxis(ax3)
        _mark_events(fig.axes, run)
        fig.suptitle(_title_of(run))
        return _save(fig, path)


def _has_plan(run: Run) -> bool:
    """A run whose coordinator chose the global batch B(t) (a mode that ``sets_batch``)."""
    mode = _mode(run.sync)
    return mode is not None and mode.sets_batch


def plot_plan(run: Run, path: str) -> str:
    """Courier: the global batch B(t) it chose, the predicted finish against the deadline,
    and the learning-rate factor that followed B(t)."""
    matplotlib, _, _ = _mpl()
    its, rec = run.first_records()
    B = np.array([_float(r.get("global_batch")) for r in rec])
    finish = np.array([_float(r.get("predicted_finish_s")) for r in rec])
    elapsed = np.array([_float(r.get("elapsed_s")) for r in rec])
    lr = np.array([_float(r.get("lr_factor", 1.0)) for r in rec])
    # courier's deadline; a mode that chooses B(t) for another goal has none
    deadline = next((_float(r["deadline_s"]) for r in rec if metrics.is_number(r.get("deadline_s"))),
                    math.nan)
    lo_hi = next((r.get("batch_range") for r in rec if r.get("batch_range")), None)
    with matplotlib.rc_context(_STYLE):
        fig = _figure(11, 7.2)
        ax, ax2, ax3 = fig.subplots(3, 1, sharex=True, height_ratios=[2.2, 2.2, 1.2])
        _batch_panel(ax, its, B, lo_hi)
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
        _mark_events(fig.axes, run)
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
        _mark_events([axc, axw], run)

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
    """The mean absolute percentage error of the predicted speeds after the warm-up, as a
    fraction (``mxlbbsp predict``'s figure)."""
    keep = [(s.iteration >= run.skip) & (s.speed > 0) for s in run.series.values()]
    y = np.concatenate([s.speed[k] for s, k in zip(run.series.values(), keep)] or [[]])
    f = np.concatenate([s.predicted[k] for s, k in zip(run.series.values(), keep)] or [[]])
    mape = score(y, f)["mape"]
    return None if mape is None else mape / 100.0


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
        _mark_events([ax], run)
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
