"""The metrics log: one JSON record per worker per iteration (``mxlbbsp launch --metrics``).

Fields (at least): iteration, rank, host, batch_size, compute_s, wait_s, sync_s,
iteration_s, speed, predicted_speed, cpu_percent, mem_percent, slowdown, sync, barrier
(whether the sync mode waits for every worker at each push/pull), predictor, fallbacks, time. ``speed`` is batch_size / compute_s (samples/s); ``predicted_speed`` is what
the predictor expected that speed to be, one iteration ahead (null for the first).
Optional: ``scalars`` ({name: number or null}, what the script gave :func:`mxlbbsp.log` in
that iteration), ``momentum`` (the optimizer's, on the first record of a worker that has one),
``planned_from`` (the last iteration whose reports the split of this one was decided from:
t-1-ahead with a decision per iteration, earlier under a lease of several iterations),
courier's ``deadline_s`` and ``done_s`` (seconds from the launch when the iteration ended).

The end-of-job summary and ``mxlbbsp report`` both come from :class:`Totals`, and so do the
diagnoses both print (:func:`diagnose`).

No framework import.
"""
from __future__ import annotations

import json
import math
from typing import Dict, Iterable, List, Optional

REQUIRED = ("iteration", "rank", "batch_size", "compute_s", "wait_s", "speed",
            "predicted_speed", "cpu_percent", "mem_percent", "sync", "time")


#: what a user who gave a bad metrics file should give instead (for the commands that read one)
HINT = "give a metrics file written by 'mxlbbsp launch --metrics'"
#: integers from here on (in any field) are out of range: no float holds them exactly, and
#: a 400-digit one does not convert to a float at all
BIG = 2 ** 63


def is_number(x) -> bool:
    """A finite JSON number (not a bool, not an integer beyond the float range)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return abs(x) < BIG if isinstance(x, int) else math.isfinite(x)


def _is_index(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < BIG


#: every reader's checks of a record (report, trace, plan, the batch schedule): one place
CHECKS = (
    ("iteration", _is_index, "an integer >= 0"),
    ("rank", _is_index, "an integer >= 0"),
    ("batch_size", lambda x: is_number(x) and x >= 0, "a number >= 0"),
    ("compute_s", lambda x: is_number(x) and x >= 0, "a number >= 0"),
    ("speed", lambda x: is_number(x) and x >= 0, "a number >= 0"),
    ("time", is_number, "a number"),
    ("wait_s", lambda x: x is None or (is_number(x) and x >= 0), "a number >= 0 or null"),
    ("predicted_speed", lambda x: x is None or is_number(x), "a number or null"),
    ("sync", lambda x: isinstance(x, str) and x != "", "a sync mode such as \"lbbsp\""),
)


def _shown(value) -> str:
    """A field's value for an error line: long ones cut (a 400-digit integer)."""
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > 24:
        return f"an integer of {len(text.lstrip('-'))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(rec: dict, where: str) -> None:
    """MetricsError naming ``where`` (path:line) for a field no reader can use."""
    for field, ok, what in CHECKS:
        if not ok(rec[field]):
            raise MetricsError(f"{where}: {field} is {_shown(rec[field])}, expected {what}")
    for field, value in rec.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= BIG:
            raise MetricsError(f"{where}: {field} is {_shown(value)}, out of range")
    scalars = rec.get("scalars")
    if scalars is not None and not (isinstance(scalars, dict) and all(
            v is None or is_number(v) for v in scalars.values())):
        raise MetricsError(f"{where}: scalars is {str(scalars)[:80]}, expected an object of "
                           "numbers or nulls")


class MetricsError(ValueError):
    """A malformed metrics file; the message names the line."""


def events(path: str) -> List[dict]:
    """The job's events in a metrics file (an elastic job's resizes and restarts: ``event``,
    ``iteration``, ``time``, ``workers_before``, ``workers``, ``paused_s``, ``lost``,
    ``why``), in order; unreadable lines are :func:`load`'s to report."""
    found = []
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    rec = json.loads(raw)
                except (ValueError, RecursionError, UnicodeDecodeError):
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("event"), str) \
                        and isinstance(rec.get("iteration"), int):
                    found.append(rec)
    except OSError:
        return []
    return found


def load(path: str) -> List[dict]:
    """The records of a metrics file, checked for the required fields and their types
    (:data:`CHECKS`); a MetricsError names the file and line."""
    records = []
    try:
        fh = open(path, "rb")       # decoded line by line, so that an error names its line
    except OSError as exc:
        raise MetricsError(f"cannot read {path!r}: {exc.strerror}") from None
    with fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise MetricsError(f"{path}:{number}: not UTF-8 text (a metrics file is JSON "
                                   "Lines)") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                raise MetricsError(f"{path}:{number}: not a JSON object") from None
            if not isinstance(rec, dict):
                raise MetricsError(f"{path}:{number}: not a JSON object")
            if "event" in rec:
                continue                 # a job's event (an elastic resize): events()
            missing = [f for f in REQUIRED if f not in rec]
            if missing:
                raise MetricsError(f"{path}:{number}: missing field(s) {', '.join(missing)}")
            check_record(rec, f"{path}:{number}")
            records.append(rec)
    if not records:
        raise MetricsError(f"{path}: no records")
    return records


def by_rank(records: Iterable[dict]) -> Dict[int, List[dict]]:
    out: Dict[int, List[dict]] = {}
    for r in records:
        out.setdefault(int(r["rank"]), []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["iteration"])
    return out


def _num(x) -> Optional[float]:
    return float(x) if is_number(x) else None


class Totals:
    """The run's figures, accumulated record by record: the one place they are computed.

    Both the launcher's end-of-job line (the coordinator adds each record as it writes it)
    and ``mxlbbsp report`` (:func:`summarize`, from the file) use this class, so the two
    always agree. Records of iterations below ``skip`` (warm-up: graph building) are left out.

    samples_per_s: the sum over workers of samples / (its summed iteration time), which for
    the synchronous modes is B / mean iteration time, and stays right for ASP where workers
    run different numbers of iterations per second. wait_share: the fraction of a worker's
    time spent waiting for others (the slice + push/pull), averaged over workers.
    """

    # per rank: rows, samples, compute_s, speed, wait_s, iteration_s, rows with iteration_s,
    # rows with a starved batch (STARVED samples or fewer)
    _FIELDS = 8

    def __init__(self, skip: int = 1):
        self.skip = skip
        self._ranks: Dict[int, List[float]] = {}
        # the job's: sync mode, the largest momentum and lr factor seen, courier's deadline
        # and when its last iteration ended (seconds from the launch)
        self._job: Dict[str, object] = {"sync": None, "barrier": None, "momentum": None,
                                        "lr_factor": None, "deadline_s": None, "done_s": None}

    def state(self) -> dict:
        """Everything added so far, JSON-serialisable (a checkpoint carries it, so that the
        summary of a restarted job covers the whole job)."""
        return {"skip": self.skip, "ranks": {str(r): v for r, v in self._ranks.items()},
                "job": dict(self._job)}

    def load(self, state: dict) -> None:
        """Continue from :meth:`state` (records added since are added to it)."""
        for rank, sums in (state.get("ranks") or {}).items():
            sums = [float(x) for x in sums][:self._FIELDS]
            self._ranks[int(rank)] = sums + [0.0] * (self._FIELDS - len(sums))
        self._job.update({k: v for k, v in (state.get("job") or {}).items() if k in self._job})

    def _note_job(self, rec: dict) -> None:
        job = self._job
        if job["sync"] is None and isinstance(rec.get("sync"), str):
            job["sync"] = rec["sync"]
        if job["barrier"] is None and isinstance(rec.get("barrier"), bool):
            job["barrier"] = rec["barrier"]
        for key in ("momentum", "lr_factor", "done_s"):
            value = _num(rec.get(key))
            if value is not None and (job[key] is None or value > job[key]):
                job[key] = value
        deadline = _num(rec.get("deadline_s"))
        if deadline is not None:
            job["deadline_s"] = deadline

    def add(self, rec: dict) -> None:
        self._note_job(rec)
        if rec["iteration"] < self.skip:
            return
        sums = self._ranks.setdefault(int(rec["rank"]), [0.0] * self._FIELDS)
        it = _num(rec.get("iteration_s"))
        sums[7] += int(rec["batch_size"]) <= STARVED
        sums[0] += 1
        sums[1] += int(rec["batch_size"])
        sums[2] += float(rec["compute_s"])
        sums[3] += float(rec["speed"])
        sums[4] += _num(rec.get("wait_s")) or 0.0
        if it is not None:
            sums[5] += it
            sums[6] += 1

    def per_rank(self) -> Dict[int, dict]:
        out = {}
        for rank, (rows, samples, compute, speed, wait, total, timed, starved) in sorted(
                self._ranks.items()):
            out[rank] = {
                "iterations": int(rows),
                "samples": int(samples),
                "mean_batch": samples / rows,
                "mean_compute_s": compute / rows,
                "mean_wait_s": wait / rows,
                "mean_iteration_s": total / timed if timed else float("nan"),
                "mean_speed": speed / rows,
                "wait_share": wait / total if total > 0 else float("nan"),
                "samples_per_s": samples / total if total > 0 else 0.0,
                "starved": int(starved),
            }
        return out

    def summary(self) -> Optional[dict]:
        """workers, iterations, samples, samples_per_s, mean_iteration_s, wait_share,
        compute_share, balance_gain (:func:`balance_gain`), per_rank, and the job's sync,
        momentum, lr_factor (the largest), deadline_s and done_s (courier); None when no
        record is past the warm-up."""
        per_rank = self.per_rank()
        if not per_rank:
            return None
        iteration_s = [p["mean_iteration_s"] for p in per_rank.values()]
        mean_iteration = sum(iteration_s) / len(iteration_s)
        share = compute_share(per_rank, mean_iteration)
        return {
            **self._job,
            "compute_share": share,
            "balance_gain": balance_gain(per_rank, mean_iteration),
            "workers": len(per_rank),
            "iterations": max(p["iterations"] for p in per_rank.values()),
            "samples": sum(p["samples"] for p in per_rank.values()),
            "samples_per_s": sum(p["samples_per_s"] for p in per_rank.values()),
            "mean_iteration_s": mean_iteration,
            "wait_share": sum(p["wait_share"] for p in per_rank.values()) / len(per_rank),
            "per_rank": per_rank,
        }


def balance_gain(per_rank: Dict[int, dict], mean_iteration_s: float) -> float:
    """At most how much faster any split of the global batch could make this run's iteration
    (0.25: 25 % more samples/s); NaN when unknown. From the measured figures only.

    The part of the mean iteration time T that is not the slowest worker's mean compute time
    (push/pull, the slice) stays whatever the split; the compute part becomes B / sum(s_i)
    with the batch split in proportion to the workers' measured speeds s_i = b_i / c_i (B =
    sum b_i). Compute time is taken as proportional to the batch, which is when balancing
    gains most: a fixed cost per iteration only lowers the gain. (Never more than compute
    taking no time at all would gain, T / rest - 1.)
    """
    rows = [p for p in per_rank.values() if p["mean_compute_s"] > 0 and p["mean_batch"] > 0]
    if len(rows) != len(per_rank) or not rows or not mean_iteration_s > 0 \
            or not math.isfinite(mean_iteration_s):
        return float("nan")
    speeds = [p["mean_batch"] / p["mean_compute_s"] for p in rows]
    total = sum(p["mean_batch"] for p in rows)
    slowest = max(p["mean_compute_s"] for p in rows)
    rest = max(mean_iteration_s - slowest, 0.0)
    balanced = rest + total / sum(speeds)
    return max(mean_iteration_s / balanced - 1.0, 0.0)


def compute_share(per_rank: Dict[int, dict], mean_iteration_s: float) -> float:
    """The slowest worker's mean compute time over the mean iteration time: the share of the
    iteration that any balancing works on (the rest is push/pull and the wait for the slice)."""
    if not mean_iteration_s > 0 or not math.isfinite(mean_iteration_s):
        return float("nan")
    return min(max(p["mean_compute_s"] for p in per_rank.values()) / mean_iteration_s, 1.0)


#: a local batch of this many samples or fewer is a starved worker's
STARVED = 2
#: a diagnosis when compute is less than this share of the iteration
COMPUTE_SMALL = 0.5
#: ... or when a worker was starved in more than this share of the iterations
STARVED_SHARE = 0.5
#: momentum at or above this with asp or r2sp (stale gradients) gets a warning
MOMENTUM_WARN = 0.5
#: a learning-rate factor above this (courier's --lr-scaling) with momentum gets a warning
LR_FACTOR_WARN = 2.0


def diagnose(summary: Optional[dict]) -> List[str]:
    """What the figures of :meth:`Totals.summary` say about the run, one sentence each:
    a small compute share (and the most balancing can gain), a starved worker, courier's
    deadline met or missed, momentum with the asynchronous modes. The launcher prints them
    under its last line, ``mxlbbsp report`` shows them in the run's section."""
    if not summary:
        return []
    out = []
    sync = summary.get("sync")
    share, gain = summary.get("compute_share"), summary.get("balance_gain")
    if isinstance(share, float) and math.isfinite(share) and share < COMPUTE_SMALL:
        text = (f"compute is only {share:.0%} of the iteration (the slowest worker's; the "
                "rest is the push/pull and waiting for the slice)")
        if summary.get("barrier") is not False and isinstance(gain, float) \
                and math.isfinite(gain):
            per = summary["per_rank"].values()
            speeds = [p["mean_batch"] / p["mean_compute_s"] for p in per
                      if p["mean_compute_s"] > 0]
            spread = max(speeds) / min(speeds) if speeds and min(speeds) > 0 else 1.0
            text += (f": balancing cannot gain more than {_pct(gain)} here (the workers' "
                     f"measured speeds differ by {spread:.2f}x); a larger model or a larger "
                     "batch per worker gains more")
        out.append(text)
    starved = [(r, p) for r, p in summary["per_rank"].items()
               if p["iterations"] and p["starved"] > STARVED_SHARE * p["iterations"]]
    if starved:
        names = ", ".join(f"worker {r} ({p['starved']} of {p['iterations']} iterations, mean "
                          f"batch {p['mean_batch']:.1f})" for r, p in starved)
        out.append(f"starved: {names} got {STARVED} samples or fewer per iteration: such "
                   "updates are noisy and BatchNorm statistics of 1-2 samples are useless; "
                   "--min-batch-size N keeps at least N samples on every worker (or leave "
                   "the slow worker out)")
    deadline, done = summary.get("deadline_s"), summary.get("done_s")
    if deadline is not None and done is not None:
        if done <= deadline:
            out.append(f"deadline met: training ended at {done:.1f} s, {deadline - done:.1f} s "
                       f"before the --deadline of {deadline:g} s")
        else:
            out.append(f"deadline missed by {done - deadline:.1f} s "
                       f"({(done - deadline) / deadline:.0%}): training ended at {done:.1f} s, "
                       f"the --deadline was {deadline:g} s; a longer deadline, fewer --epochs "
                       "or a larger --batch-range maximum")
    momentum = summary.get("momentum")
    if momentum is not None and momentum >= MOMENTUM_WARN and summary.get("barrier") is False:
        out.append(f"momentum {momentum:g} with --sync {sync}: stale gradients with momentum "
                   "often diverge (seen: accuracy 0.77 -> 0.08 at 0.9); use momentum 0 or "
                   "--sync lbbsp")
    lr = summary.get("lr_factor")
    if momentum is not None and momentum >= MOMENTUM_WARN and lr is not None \
            and lr > LR_FACTOR_WARN:
        out.append(f"the learning rate was scaled up to {lr:.2g}x (--lr-scaling) with momentum "
                   f"{momentum:g}: such a step often diverges; use --lr-scaling sqrt or a "
                   "smaller --batch-range maximum")
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %" if x < 0.1 else f"{100 * x:.0f} %"


def combine_scalars(records) -> List[tuple]:
    """(iteration, {name: value}, wall time) per iteration of the records that logged values:
    each name's mean over the workers that logged it in that iteration, weighted by their
    batch sizes (a loss averaged over each worker's batch becomes the global batch's);
    null values (NaN, infinities) stay NaN. The same function feeds the report's plots and
    the TensorBoard files (the coordinator's)."""
    out: Dict[int, dict] = {}
    for rec in records:
        scalars = rec.get("scalars")
        if not isinstance(scalars, dict) or not scalars:
            continue
        t = int(rec["iteration"])
        entry = out.setdefault(t, [{}, float(rec["time"])])
        entry[1] = max(entry[1], float(rec["time"]))
        weight = max(float(rec.get("batch_size") or 0), 1e-12)
        for name, value in scalars.items():
            sums = entry[0].setdefault(name, [0.0, 0.0, False])
            if value is None or not math.isfinite(float(value)):
                sums[2] = True
            else:
                sums[0] += weight * float(value)
                sums[1] += weight
    result = []
    for t in sorted(out):
        values, when = out[t]
        result.append((t, {name: (float("nan") if bad or not w else total / w)
                           for name, (total, w, bad) in values.items()}, when))
    return result



def summarize(records: Iterable[dict], skip: int = 1) -> dict:
    """Throughput and waiting of a run, leaving out the first ``skip`` iterations (warm-up);
    the figures of :class:`Totals`."""
    totals = Totals(skip)
    for rec in records:
        totals.add(rec)
    result = totals.summary()
    if result is None:
        raise MetricsError("no records after the warm-up iterations")
    return result
