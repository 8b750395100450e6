"""Supervision of a running job: every 0.1 s, end it on the first of

* a configuration problem found by the coordinator (e.g. global batch < workers): exit 2;
* a process exiting non-zero (or its transport failing: an SSH connection lost, a SLURM node
  that failed): that exit code, naming the role, rank and host (:mod:`.diagnosis`);
* SIGINT / SIGTERM: 130 / 143;
* the coordinator failing the job for every worker (e.g. workers that run different numbers
  of iterations): 1, with its one line;
* a script without mxlbbsp.DataLoader whose workers run different numbers of iterations:
  one ended normally, the others sit idle for a while after it (:mod:`.watch`): 1;
* no progress for the stall limit (:mod:`.watch`): 124;
* every worker exiting 0: the servers and the scheduler get FINISH_GRACE to finish, and 0.

Progress lines every ``--progress`` s (:mod:`.progress`). The job (:class:`~.job.Job`) tears
everything down once :func:`Supervisor.run` returns.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

from . import diagnosis
from .progress import progress_line, summary_lines
from .watch import EXIT_STALL, Watch

EXIT_CONFIG = 2
#: once every worker exited 0, how long the servers and the scheduler may take to end by
#: themselves before the teardown stops them: they end with the workers' finalisation when
#: the workers used the kvstore, and never when they did not (nobody will talk to them)
FINISH_GRACE = 0.5
#: the same when no worker said hello to the coordinator (a script without mxlbbsp: its
#: servers end within milliseconds if it used the kvstore, never if it did not)
FINISH_GRACE_UNSEEN = 0.1
#: how long a worker that lost its connection waits for its relay or hub to be seen ended
#: (the cause, to be named) before it is named itself; also how long a failure the
#: coordinator saw waits for a process to end, in a job with relays
UPSTREAM_GRACE = 4.0


class Supervisor:
    """Watches one started job (``job``: its :class:`~.job.Job`) until it ends."""

    def __init__(self, job):
        self.job = job
        self.config = job.config
        self.coordinator = job.coordinator
        self.roles = job.roles
        self.output = job.output
        self.started = time.monotonic()
        self.watch = Watch(job.config.stall_timeout, job.floors, self.started)
        #: an elastic job's watcher (launcher/elastic.py): resizes, and a failure's state
        self.elastic = getattr(job, "elastic", None)
        #: id of a worker that lost its connection -> time.monotonic() when first seen ended
        self._lost_since = {}

    def run(self) -> int:
        cfg, coord, roles = self.config, self.coordinator, self.roles
        started = self.started
        next_progress = started + cfg.progress if cfg.progress else float("inf")
        next_cpu = started + 1.0
        while True:
            if self.job.signal is not None:
                return self.job.interrupted()
            if coord.failure is not None and coord.failure_kind == "config":
                self.output.say(f"error: {coord.failure}")
                return EXIT_CONFIG
            if coord.failure is not None and coord.failure_fatal:
                # told to every worker, which now exit (2) quietly: the cause is this line
                self.output.say(f"error: {coord.failure}")
                return 1
            failed = self.first_failure()
            if failed is not None:
                return failed
            if all(w.poll() == 0 for w in roles.workers):
                return self.finish()
            wait = UPSTREAM_GRACE if roles.relays or roles.hubs else 2.0
            if coord.failure is not None and time.monotonic() > coord.failed_at + wait:
                # e.g. a worker's connection dropped but its process (ssh) has not ended yet
                self.output.say(f"error: {coord.failure}")
                self._recover()
                return 1
            now = time.monotonic()
            if self.elastic is not None:
                self._announce(now)
                code = self.elastic.check(now, coord.progress().iteration_s or 0.0)
                if code is not None:
                    return code
            if now >= next_cpu:
                if coord.registered == 0:
                    # only useful while no iteration can be seen
                    self.watch.sample_cpu(roles.workers, now)
                self.watch.note_stopped(roles.workers, now)
                next_cpu = now + 1.0
            if coord.registered == 0:
                uneven = self.watch.uneven(now, roles.workers)
                if uneven is not None:
                    self.output.say(f"error: {uneven}")
                    self.job.reason = "workers ran different numbers of iterations"
                    return 1
            stall = self.watch.stalled(now, coord, roles.workers)
            if stall is not None:
                self.output.say(f"error: {stall}")
                return EXIT_STALL
            if now >= next_progress:
                self.print_progress(now - started)
                next_progress = now + cfg.progress
            time.sleep(0.1)

    def first_failure(self) -> Optional[int]:
        """The exit code of the first role found ended non-zero (after saying why), None
        while there is none."""
        roles = self.roles
        # a hub or a relay first: its workers end because it did (they lose their connection)
        for p in roles.hubs + roles.relays + roles.workers + roles.servers + [roles.scheduler]:
            rc = p.poll()
            if rc == 0:
                p.release_error()
            if rc is None or rc == 0:
                continue
            rc = rc if rc > 0 else 128 - rc      # a transport killed by signal N: 128 + N
            if p.via.settle(p, rc):
                continue                          # its transport is being started again
            if self._upstream_may_say(p):
                continue
            last_early = p.flush_early()
            p.drain_output(1.0)     # its exit hook's last line, if it wrote one
            name = p.name
            guard_rc = p.proc.returncode if p.proc is not None else None
            ended = diagnosis.Ended(
                name=name, host=p.host, remote=p.via.remote, transport=p.via.name, rc=rc,
                connected=p.connected.is_set(), attempts=p.attempts,
                reported_exit=p.said.reported_exit, signalled=p.said.signalled,
                guard_signal=-guard_rc if guard_rc is not None and guard_rc < 0 else None,
                error_line=p.said.error_line, exit_reason=p.said.exit_reason,
                last_early=last_early, last_stderr=p.said.last_stderr)
            if diagnosis.needs_probe(ended):
                ended = dataclasses.replace(ended, host_answers=self.job.host_answers(p.host))
            what = diagnosis.say(ended)
            self.job.reason = f"{name} {what}"
            others = len([q for q in roles.all if q is not p and q.poll() is None])
            log_dir = self.config.log_dir
            self.output.say(f"error: {name} {what}; stopping the other {others} process(es) "
                            f"(its output is above{', and in ' + log_dir if log_dir else ''})")
            if rc not in (EXIT_CONFIG, 130, 143):
                self._recover(gone=[p.rank] if p.role == "worker" else [])
            return rc
        return None

    def _upstream_may_say(self, p) -> bool:
        """Whether a worker (a relay) that ended because it lost its connection waits a moment
        for its relay or a hub (a hub): killed, that one ends the processes behind it too,
        and over SSH their exits may come in before its own. The cause is named, not the
        first process seen (UPSTREAM_GRACE)."""
        if p.role not in ("worker", "relay"):
            return False
        p.drain_output(1.0)
        said = p.said
        text = " ".join(x for x in (said.exit_reason, said.error_line, said.last_stderr) if x)
        if "connection to the coordinator" not in text:
            return False
        upstream = [q for q in self.roles.hubs + self.roles.relays
                    if q.poll() is None and q is not p
                    and (q.role == "hub" or (p.role == "worker" and q.host == p.host))]
        if not upstream:
            return False
        first = self._lost_since.setdefault(id(p), time.monotonic())
        return time.monotonic() - first < UPSTREAM_GRACE

    def _recover(self, gone=()) -> None:
        """A failure in an elastic job (or one with --restarts): a survivor saves the state
        of its last finished iteration before everything stops."""
        if self.elastic is not None:
            ended = [w.rank for w in self.roles.workers if w.poll() not in (None, 0)]
            self.elastic.recover(list(gone) + ended)

    def _announce(self, now: float) -> None:
        """The resize or restart that started this generation, at its first iteration."""
        job = self.job
        note = getattr(job, "note", None)
        if note is None or self.coordinator.progress().iteration < job.first_iteration:
            return
        job.note = None
        paused = now - note.since
        lost = f"{note.lost} iteration(s) lost" + (
            "; the one in flight trained again" if note.verb == "restarted" else "")
        self.output.say(f"{note.verb} {note.before} -> {note.after} workers at iteration "
                        f"{note.iteration} in {paused:.1f} s ({note.why}), {lost}")
        totals = getattr(job, "elastic_totals", None)
        if totals is not None:
            totals["resizes" if note.verb == "resized" else "restarts"] += 1
            totals["paused_s"] += paused
            totals["lost"] += note.lost
        self.coordinator.recorder.event({
            "event": note.verb, "iteration": note.iteration, "time": time.time(),
            "workers_before": note.before, "workers": note.after, "paused_s": paused,
            "lost": note.lost, "why": note.why})

    def finish(self) -> int:
        """Every worker exited 0: the servers and the scheduler end as soon as the workers
        have finalised (within milliseconds), or never, when no worker used the kvstore
        (e.g. ``python -c "print('hi')"``): after FINISH_GRACE the teardown stops them; the
        summary; 0."""
        grace = FINISH_GRACE if self.coordinator.registered else FINISH_GRACE_UNSEEN
        deadline = time.monotonic() + grace
        # (a relay ends by itself once its workers have, or is stopped with the job: a
        # script without mxlbbsp's loader never connects to it)
        for p in self.roles.servers + [self.roles.scheduler]:
            p.wait(max(0.0, deadline - time.monotonic()))
        job = self.job
        elapsed = time.monotonic() - (job.since if job.since is not None else self.started)
        trained = self.coordinator.progress().iteration + 1 - job.launch_start
        for line in summary_lines(elapsed, job.attempt, self.coordinator.summary(),
                                  self.config.metrics, self.config.tensorboard,
                                  launch=(job.launch_start, trained),
                                  elastic=getattr(job, "elastic_totals", None)):
            self.output.say(line)
        return 0

    def print_progress(self, elapsed: float) -> None:
        workers = [w for w in self.roles.workers if w.poll() is None]
        use = self.watch.cpu_use
        self.output.say(progress_line(
            elapsed, self.coordinator.progress(), self.coordinator.registered,
            self.config.num_workers, len(workers), [use.get(w.rank) for w in workers],
            sorted(self.watch.stopped_since), time.monotonic(),
            ended=[w.rank for w in workers if w.said.ended_at is not None]))
