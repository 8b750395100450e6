"""What the launcher says while a job runs and when it ends: the progress lines (every
``--progress`` s) and the end-of-job summary. Pure text from measured figures: the
supervision (:mod:`.supervise`) gathers them and prints the lines.
"""
from __future__ import annotations

from typing import Iterable, List, Mapping, Optional, Sequence

from mxlbbsp.core import metrics as _metrics


def ranks(numbers: Iterable[int]) -> str:
    """"worker 1", "workers 0, 2"."""
    numbers = list(numbers)
    return ("worker " if len(numbers) == 1 else "workers ") + ", ".join(map(str, numbers))


def stopped_note(stopped: Sequence[int]) -> str:
    """" (worker 1 stopped, e.g. SIGSTOP)", or "" when none is."""
    return f" ({ranks(stopped)} stopped, e.g. SIGSTOP)" if stopped else ""


def progress_line(elapsed: float, progress, registered: int, num_workers: int,
                  running: int, cpu: Sequence[Optional[float]], stopped: Sequence[int],
                  now: float, ended: Sequence[int] = ()) -> str:
    """One progress line. ``progress``: the coordinator's Progress; ``registered``: workers
    registered with it; ``running``: workers whose process runs, ``cpu`` the CPU use (cores,
    None: unknown) of each of them; ``stopped``: the ranks of the workers known stopped."""
    p = progress
    if p.iteration < 0 and registered == 0:
        # e.g. a plain MXNet kvstore script: say what is known
        shown = ", ".join("?" if c is None else f"{100 * c:.0f}%" for c in cpu)
        if len(cpu) > 16:
            known = [c for c in cpu if c is not None]
            shown = f"{100 * sum(known) / max(len(known), 1):.0f}% on average"
        cpu_text = f", CPU {shown}" if cpu and any(c is not None for c in cpu) else ""
        done = (f" ({ranks(ended)} ended {'its' if len(ended) == 1 else 'their'} script and "
                f"{'waits' if len(ended) == 1 else 'wait'} for the others)" if ended else "")
        return (f"{elapsed:.0f} s: {running} of {num_workers} workers running{cpu_text}"
                f"{stopped_note(stopped)}{done}; no iteration reported (no mxlbbsp.DataLoader, "
                "or not started yet)")
    if p.iteration < 0:
        return (f"{elapsed:.0f} s: waiting for the first iteration ({registered}/{num_workers} "
                f"workers registered){stopped_note(stopped)}")
    split = ",".join(map(str, p.split)) if len(p.split) <= 16 else f"{len(p.split)} workers"
    quiet = now - p.last_change
    if stopped or quiet > max(3 * (p.iteration_s or 0.0), 2.0):
        # nothing advances (or, with a worker stopped, soon will not): no stale samples/s;
        # a stopped worker is named at once
        return (f"{elapsed:.0f} s: iteration {p.iteration}, no iteration finished for "
                f"{quiet:.0f} s{stopped_note(stopped)}, batch sizes {split}")
    return (f"{elapsed:.0f} s: iteration {p.iteration}, {p.samples_per_s:.1f} samples/s, "
            f"batch sizes {split}")


def summary_lines(elapsed: float, restarts: int, summary: Optional[Mapping],
                  metrics: Optional[str], tensorboard: Optional[str],
                  launch: Optional[tuple] = None,
                  elastic: Optional[Mapping] = None) -> List[str]:
    """The end-of-job lines: "done in ..." and a "note: ..." per diagnosis
    (``metrics.diagnose``). ``summary``: the coordinator's (None: no iterations seen), which
    covers the whole job, its launches before a ``--resume`` included; ``launch``: (the
    first iteration of this launch, the iterations it trained), said when it resumed;
    ``elastic``: an elastic job's resizes and restarts, seconds paused, iterations lost."""
    again = f" (the whole job, {restarts} restart(s))" if restarts else ""
    if not summary:
        return [f"done in {elapsed:.1f} s{again}"]
    share = summary["compute_share"]
    this = ""
    if launch is not None and launch[0] > 0:
        this = (f" of the whole job ({max(launch[1], 0)} in this launch, which resumed at "
                f"iteration {launch[0]})")
    line = (f"done in {elapsed:.1f} s{again}: {summary['iterations']} iterations after the "
            f"warm-up{this}, {summary['samples_per_s']:.1f} samples/s, workers waited "
            f"{100 * summary['wait_share']:.1f}% of the time"
            + (f", compute {100 * share:.0f}% of the iteration" if share == share else "")
            + (f"; {elastic['resizes']} resize(s), {elastic['restarts']} restart(s), "
               f"{elastic['paused_s']:.1f} s paused, {elastic['lost']} iteration(s) lost"
               if elastic else "")
            + (f"; metrics in {metrics}" if metrics else "")
            + (f"; TensorBoard files in {tensorboard}" if tensorboard else ""))
    return [line] + [f"note: {note}" for note in _metrics.diagnose(summary)]
