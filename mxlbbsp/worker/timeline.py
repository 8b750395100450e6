"""Where a worker's iterations go: clock readings of each phase, for benchmarks/overhead.py.

Off unless ``MXLBBSP_TIMELINE`` names a folder (read once, when the session opens): then the
session holds a :class:`Timeline` (else None, and each reading is one ``if`` on the path),
the loader and the trainer mark the end of each phase of an iteration, and at the session's
close the worker writes ``timeline-RANK.json`` there: per iteration, the seconds of each
phase. A phase is the time from the previous mark to its own, so the phases of an iteration
add up to its wall time. The phases, in order (:data:`PHASES`):

    loop     the previous step's end to the next batch asked for (the script's own work)
    alloc    waiting for this worker's slice (lbbsp: the coordinator's split)
    compute  cutting the batch, forward and backward as Python issues them to the engine
    engine   waiting for the engine to finish the gradients (before the report)
    report   the report built and sent
    slot     the mode's wait before the push (r2sp's push slot)
    push     the pushes and pulls issued to the kvstore (in dist_sync the pushes before
             ``engine``, the pulls and BatchNorm's statistics after ``slot``)
    update   the optimizer's update issued
    bn       BatchNorm's running statistics: waiting for their sums over the workers, set
    pull     waiting for the engine: the sums pulled and the update done
    done     the done message built and sent

Where the engine times the report and done (dist_sync after the first step,
mxlbbsp/worker/engine.py), the Python thread does not wait for it: ``engine`` and ``pull``
are 0, ``report`` and ``done`` only hand a function to the engine, and ``push`` also holds
the wait for the engine to finish step t - 4 (trainer.ENGINE_AHEAD) and the sending of what
it timed meanwhile.

No framework import: the trainer waits for MXNet's engine between the marks.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional

from mxlbbsp.core import env as _env

PHASES = ("loop", "alloc", "compute", "engine", "report", "slot", "push", "update", "bn",
          "pull", "done")


class Timeline:
    """The phases of each iteration of one worker (see the module docstring)."""

    def __init__(self, folder: str, rank: int):
        self.folder = folder
        self.rank = rank
        self.rows: List[Dict[str, float]] = []
        self._row: Optional[Dict[str, float]] = None
        self._last = time.perf_counter()

    def begin(self, iteration: int) -> None:
        """Iteration ``iteration`` starts: the time since the last mark is its ``loop``."""
        now = time.perf_counter()
        self._row = {"iteration": iteration, "loop": now - self._last}
        self.rows.append(self._row)
        self._last = now

    def mark(self, phase: str) -> None:
        """``phase`` of the current iteration ends now (its time: since the last mark)."""
        now = time.perf_counter()
        if self._row is not None:
            self._row[phase] = self._row.get(phase, 0.0) + now - self._last
        self._last = now

    def write(self) -> str:
        """``timeline-RANK.json`` in the folder; returns its path."""
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"timeline-{self.rank}.json")
        with open(path, "w") as fh:
            json.dump({"rank": self.rank, "phases": list(PHASES), "iterations": self.rows},
                      fh)
        return path


def from_env(rank: int, env=None) -> Optional[Timeline]:
    """A :class:`Timeline` when ``MXLBBSP_TIMELINE`` is set, else None."""
    folder = _env.timeline(env)
    return Timeline(folder, rank) if folder else None
