"""Stall detection: a job that makes no progress ends with 124, naming who it waits for.

Frozen workers and dead ps-lite peers hang rather than fail, so the supervision
(:mod:`.supervise`) asks :meth:`Watch.stalled` every 0.1 s. Progress is an iteration
finished (the coordinator's, for scripts on mxlbbsp.DataLoader) or, for a script without
one (no iterations known), CPU used by any worker: measured here for local workers, reported
every ``roles.CPU_EVERY`` s by the guards of remote ones. The limit (:func:`stall_limit`)
is ``--stall-timeout``, or automatic: the start-up floor until the first iteration, then
STALL_MEDIANS x the recent median iteration time, at least the running floor
(``_env.stall_floors``). A worker known to be stopped (SIGSTOP, a debugger) is a known cause:
the job then ends after max(STOPPED_FLOOR, STALL_MEDIANS x the median iteration time).

A script without mxlbbsp.DataLoader whose workers run different numbers of iterations is a
known cause too (:meth:`Watch.uneven`): once one worker's script ended normally (its exit
hook announces it, ``_boot/sitecustomize.py``), ENDED_IDLE s without CPU use by any worker
end the job (exit 1), naming the worker that ended and those that still wait for it.
"""
from __future__ import annotations

from typing import Dict, Optional

from .progress import ranks

EXIT_STALL = 124
#: the automatic stall limit is this many times the recent median iteration time (at least
#: the running floor of _env.stall_floors: 120 s, for e.g. an evaluation at the end of an
#: epoch; 300 s until the first iteration: MXNet's import, ps-lite's start over SSH, data
#: loading and graph building on a busy machine)
STALL_MEDIANS = 20
#: a job that waits for a worker known to be stopped (SIGSTOP) ends after this many seconds
#: without an iteration, or STALL_MEDIANS x the median iteration time if that is longer
STOPPED_FLOOR = 10.0
#: CPU seconds per second (all workers) under which a job without iterations counts as idle
IDLE_CPU = 0.02
#: a script without mxlbbsp.DataLoader: once a worker's script ended normally (its exit hook
#: said so) while others still run, this many seconds without CPU use by any worker end the
#: job (they wait in the kvstore for the ended one: different numbers of iterations)
ENDED_IDLE = 20.0


def stall_limit(setting: Optional[float], floors, iteration: int,
                iteration_s: Optional[float]) -> Optional[float]:
    """Seconds without progress that stop the job (None: never).

    ``setting``: --stall-timeout (None: automatic, 0: off). Automatic: the start-up floor
    until the first iteration, then STALL_MEDIANS x the recent median iteration time, at
    least the running floor."""
    if setting is not None:
        return setting or None
    startup, running = floors
    if iteration < 0:
        return startup
    return max(running, STALL_MEDIANS * (iteration_s or 0.0))


class Watch:
    """What the supervision has seen of the workers' progress, and the stall verdict.

    ``setting``: --stall-timeout; ``floors``: (start-up, running) floors in seconds;
    ``started``: monotonic time the job's processes started."""

    def __init__(self, setting: Optional[float], floors, started: float):
        self.setting = setting
        self.floors = floors
        self.started = started
        self.active_at = started        # a job without iterations: last CPU use seen
        self.stopped_since: Dict[int, float] = {}   # workers seen stopped, since when
        self.cpu_seen: Dict[int, tuple] = {}        # rank: (when, CPU seconds) last sample
        self.cpu_use: Dict[int, Optional[float]] = {}   # cores per worker, last sample

    def sample_cpu(self, workers, now: float) -> Dict[int, Optional[float]]:
        """Each worker's CPU use (cores) since its previous sample, measured here or
        reported by its remote guard; notes activity."""
        use: Dict[int, Optional[float]] = {}
        busy = 0.0
        for w in workers:
            sample = w.cpu_sample()
            before = self.cpu_seen.get(w.rank)
            if sample is None:
                use[w.rank] = None
                continue
            when, seconds = sample
            if before is not None and when <= before[0]:
                use[w.rank] = self.cpu_use.get(w.rank)    # no new report since
                continue
            self.cpu_seen[w.rank] = (when, seconds)
            if before is not None:
                use[w.rank] = max(0.0, (seconds - before[1]) / (when - before[0]))
                busy += use[w.rank]
            else:
                use[w.rank] = None
        if busy > IDLE_CPU:
            self.active_at = now
        self.cpu_use = use
        return use

    def note_stopped(self, workers, now: float) -> None:
        """When each worker was first seen stopped (SIGSTOP, a debugger); resumed ones are
        forgotten."""
        for w in workers:
            if w.poll() is None and w.stopped():
                self.stopped_since.setdefault(w.rank, now)
            else:
                self.stopped_since.pop(w.rank, None)

    def uneven(self, now: float, workers) -> Optional[str]:
        """The error line when a worker's script ended normally and the others, still
        running, used no CPU for ENDED_IDLE s since (a script without mxlbbsp.DataLoader:
        the coordinator sees no iterations; with one, it catches uneven iteration counts
        itself); else None. Off with --stall-timeout off."""
        if self.setting == 0 or not self.cpu_seen:
            return None
        ended = {w.rank: w.said.ended_at for w in workers if w.said.ended_at is not None}
        waiting = [w.rank for w in workers if w.said.ended_at is None and w.poll() is None]
        if not ended or not waiting:
            return None              # none ended yet, or all did: the finalize is theirs
        first = min(ended, key=ended.get)
        idle = now - max(ended[first], self.active_at)
        if idle <= ENDED_IDLE:
            return None
        ago = now - ended[first]
        more = sorted(r for r in ended if r != first)
        also = f" ({ranks(more)} too)" if more else ""
        return (f"worker {first} ended normally {ago:.0f} s ago (its script returned){also}, "
                f"while {ranks(waiting)} still {'runs' if len(waiting) == 1 else 'run'} and "
                f"no worker used any CPU for {idle:.0f} s: {'it waits' if len(waiting) == 1 else 'they wait'} "
                f"in the kvstore for a push/pull that worker {first} never makes; every worker "
                "must run the same number of iterations (e.g. the same number of batches per "
                "epoch: split the data evenly, or drop the last batch); stopping the job "
                "(--stall-timeout off turns this off)")

    def stalled(self, now: float, coordinator, workers) -> Optional[str]:
        """The error line when the job made no progress for the stall limit, else None."""
        setting, floors, coord = self.setting, self.floors, coordinator
        progress = coord.progress()
        limit = stall_limit(setting, floors, progress.iteration, progress.iteration_s)
        if limit is None:
            return None
        if self.stopped_since and setting is None and progress.iteration >= 0:
            # a stopped worker is a known cause: no need to wait out the floor meant for an
            # evaluation at the end of an epoch; the iterations' own pace sets the limit
            quick = max(STOPPED_FLOOR, STALL_MEDIANS * (progress.iteration_s or 0.0))
            since = min(self.stopped_since.values())
            if now - max(since, progress.last_change) > quick:
                stopped = sorted(self.stopped_since)
                return (f"{ranks(stopped)} {'is' if len(stopped) == 1 else 'are'} stopped "
                        f"(SIGSTOP or a debugger) and no iteration finished for {quick:g} s "
                        f"(max({STOPPED_FLOOR:g} s, {STALL_MEDIANS} x the median iteration "
                        f"time {progress.iteration_s or 0:.3g} s)); stopping the job (kill "
                        "-CONT resumes a stopped process; --stall-timeout SECONDS sets the "
                        "limit)")
        if coord.registered == 0:
            # no mxlbbsp.DataLoader (or not yet): no iterations to watch; a job whose
            # workers all sit idle that long hangs (e.g. in ps-lite's finalize barrier).
            # CPU use is measured here for local workers and reported by the guards of
            # remote ones; none yet (the first second, or the remote guards of an older
            # mxlbbsp that do not report): nothing to measure
            idle = now - self.active_at
            if idle <= limit or not self.cpu_seen:
                return None
            return (f"no worker used any CPU for {idle:.0f} s and none reported an iteration "
                    f"(limit {limit:g} s); the job seems to hang: a worker may wait in ps-lite "
                    f"for one that failed or hangs; stopping the job (--stall-timeout SECONDS "
                    "sets the limit, off turns it off)")
        last = max(progress.last_change, self.started)
        if now - last <= limit:
            return None
        if setting is not None:
            why = "--stall-timeout"
        elif progress.iteration < 0:
            why = "the limit until the first iteration"
        else:
            why = (f"{STALL_MEDIANS} x the median iteration time "
                   f"{progress.iteration_s or 0:.3g} s, at least {floors[1]:g} s")
        finished = "none" if progress.iteration < 0 else str(progress.iteration)
        return (f"no iteration finished for {limit:g} s ({why}; last finished: {finished}); "
                f"{who_hangs(coord.waiting(), workers)}; stopping the job (--stall-timeout "
                "SECONDS sets the limit, off turns it off)")


def who_hangs(waiting, workers) -> str:
    """Which workers the job waits for, as far as the coordinator knows (``waiting``: its
    ``waiting()``)."""
    stopped = [w.rank for w in workers if w.stopped()]
    note = f" ({ranks(stopped)} stopped, e.g. SIGSTOP)" if stopped else ""
    its = "its" if len(list(waiting.ranks)) == 1 else "their"
    if waiting.what == "hello":
        return (f"{ranks(waiting.ranks)} never registered with the coordinator ({its} "
                f"mxlbbsp.DataLoader never started){note}")
    t = waiting.iteration
    if waiting.what == "report":
        return f"{ranks(waiting.ranks)} never sent {its} report of iteration {t}{note}"
    return (f"every report of iteration {t} is in, but the push/pull of "
            f"{ranks(waiting.ranks)} never finished (a worker, a server or the network "
            f"hangs){note}")
