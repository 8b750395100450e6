"""The report's data: a run (one metrics file) as per-worker series, its summary and
its label; the report's errors. No matplotlib, no framework import.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp.core import metrics

#: Above this many workers the plots aggregate (median, quartiles, min-max) instead of
#: drawing one line per worker.
AGGREGATE_ABOVE = 8

SYNC_NAMES = _modes.labels()


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
    #: the job's events (an elastic job's resizes and restarts: metrics.events)
    events: list = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return SYNC_NAMES.get(self.sync, self.sync)

    def first_records(self):
        """(iterations, their first records): the job-wide fields of each iteration (B(t),
        a mode's plan), which every worker's record of it carries."""
        first = {}
        for r in self.records:
            first.setdefault(int(r["iteration"]), r)
        its = np.array(sorted(first))
        return its, [first[t] for t in its]

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
               summary=summary, skip=skip, curves=metrics.combine_scalars(records),
               events=metrics.events(path))


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
