"""Helpers shared by the issue-5 benchmark scripts (static, dynamic, contention,
time_to_accuracy, coordinator_scale): interleaving order, load checks, figures.

Kept apart from ``_common.py`` (which ``throughput.py`` uses) so that module stays as it is.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Dict, List, Sequence

import _common as C
from mxlbbsp.analysis import report as _report

#: above this 1-minute load average (other jobs on the shared machine) a full run waits
MAX_LOAD = 2.5


def order(modes: Sequence[str], round_index: int) -> List[str]:
    """ABBA interleaving: round 0 runs the modes in order, round 1 reversed, and so on."""
    modes = list(modes)
    return modes if round_index % 2 == 0 else modes[::-1]


def load() -> float:
    return os.getloadavg()[0]


def wait_for_quiet(max_load: float = MAX_LOAD, patience_s: float = 600.0) -> float:
    """Wait (up to ``patience_s``) until the 1-minute load average is below ``max_load``.

    Returns the load average when it starts; proceeds anyway after ``patience_s`` (and says so)
    — the per-round ratios are still measured side by side, only noisier.
    """
    if C.SMOKE:
        return load()
    waited = 0.0
    while load() > max_load and waited < patience_s:
        if waited == 0:
            C.progress(f"load average {load():.2f} > {max_load}: waiting for other jobs")
        time.sleep(15)
        waited += 15
    if load() > max_load:
        C.progress(f"load average still {load():.2f} after {patience_s:.0f} s: running anyway")
    return load()


def ideal_speedup(summary: dict) -> float:
    """Perfect balancing over BSP: the sum of the workers' measured compute speeds over
    n x the slowest one's (BSP waits for the slowest; a perfect split makes everybody finish
    together at B / sum(v))."""
    speeds = [r["mean_speed"] for r in summary["per_rank"].values()]
    return sum(speeds) / (len(speeds) * min(speeds))


def ideal_speedup_over_time(bsp_metrics: Path, skip: int = 5) -> float:
    """Perfect balancing over BSP when the speeds change: from a BSP run's records, per
    iteration t the BSP time is (B/n) / min_i v_i(t) and a perfect split's is B / sum_i v_i(t);
    the ratio of their sums over the run (a time average, not a mean of ratios)."""
    from mxlbbsp.core import metrics as _metrics
    speeds: Dict[int, List[float]] = {}
    for r in _metrics.load(str(bsp_metrics)):
        if r["iteration"] >= skip:
            speeds.setdefault(r["iteration"], []).append(float(r["speed"]))
    bsp = sum(1 / (len(v) * min(v)) for v in speeds.values())
    perfect = sum(1 / sum(v) for v in speeds.values())
    return bsp / perfect


def predictor_of(metrics_path: Path) -> str:
    """The predictor a run used, from its first metrics record."""
    with open(metrics_path) as fh:
        return str(json.loads(fh.readline()).get("predictor", "?"))


def rounds_text(xs: Sequence[float], spec: str = ".2f") -> str:
    return ", ".join(format(x, spec) for x in xs)


def figures(runs: Dict[str, Path], out_dir: Path, keep_metrics: bool = False) -> str:
    """``mxlbbsp.analysis.report.write_report`` of ``runs`` (label -> metrics file; the first is the
    baseline) into a fresh ``out_dir`` (old files removed), PNGs shrunk. The metrics files are
    copied there as ``<label>.jsonl`` (the report names runs after the file) and removed again
    unless ``keep_metrics``. Returns the index path relative to the results folder."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    kept = []
    for label, p in runs.items():
        dest = out_dir / f"{label}.jsonl"
        shutil.copyfile(p, dest)
        kept.append(dest)
    index = _report.write_report([str(p) for p in kept], str(out_dir))
    for png in out_dir.glob("*.png"):
        shrink_png(png)
    if not keep_metrics:
        for p in kept:
            p.unlink()
    return os.path.relpath(index, C.RESULTS)


def shrink_png(path: Path, colors: int = 64) -> None:
    """Re-save a plot with an adaptive 64-colour palette: ~3x smaller, looks the same."""
    from PIL import Image
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=colors)
    small.save(path, optimize=True)


def summary_row(s: dict) -> Dict[str, float]:
    """The numbers of one run that go into a result JSON."""
    return {"samples_per_s": s["samples_per_s"], "wait_share": s["wait_share"],
            "mean_iteration_s": s["mean_iteration_s"], "wall_s": s.get("wall_s"),
            "per_rank_speed": [r["mean_speed"] for r in s["per_rank"].values()],
            "per_rank_batch": [r["mean_batch"] for r in s["per_rank"].values()],
            "per_rank_wait_share": [r["wait_share"] for r in s["per_rank"].values()]}
