"""The report's ``index.html``: one section per run (its tables, diagnoses and plots) and
the comparison, from the runs' summaries (:class:`mxlbbsp.core.metrics.Totals`).
"""
from __future__ import annotations

import datetime
import html
import math
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from mxlbbsp.analysis.plotkit import _time_unit
from mxlbbsp.analysis.runs import Run, _mode
from mxlbbsp.core import metrics

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
        "time": f"Left: compute time (forward + backward) and wait time (the slice + "
                f"push/pull, i.e. waiting for the others) per iteration, in {unit[1]}. "
                "Right: each worker's mean iteration split into computing and waiting; "
                "balanced training makes the bars equally long, with little waiting.",
        "speed": speed,
        "plan": "Courier: the global batch B(t) the coordinator chose (top), its prediction "
                "of when the remaining work ends at that batch, against the deadline "
                "(middle), and the learning-rate factor that followed B(t) (bottom).",
        "goodput": "Goodput: the global batch B(t) the coordinator chose (top), the gradient "
                   "noise scale it measured from the workers' local gradient norms (middle), "
                   "and the statistical efficiency at B(t) with the learning-rate factor "
                   "(bottom).",
    }
    for kind in ("goodput", "plan", "batch", "time", "speed"):
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
