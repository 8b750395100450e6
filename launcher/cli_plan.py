"""``mxlbbsp plan``: Courier's table from a profiling run — which global batch meets a deadline?"""
from __future__ import annotations

import json
import math

import click

from mxlbbsp.analysis import profile as _profile
from mxlbbsp.core import metrics
from mxlbbsp.core import noise as _noise
from mxlbbsp.core import planner as _planner
from mxlbbsp.modes import goodput as _goodput_mode

from .config import ConfigError

#: beyond these the table means nothing (a typo, or a file whose times are not a real run's)
MAX_SAMPLES = 10 ** 12
MAX_EPOCHS = 10 ** 6
MAX_BATCH = 10 ** 9
#: a plan whose fastest choice takes longer than this (about 300 years) is refused
MAX_FINISH_S = 1e10

#: the profile fit's rules, as the help states them
_POOLED, _COUNTS, _APART = (f"{_profile.BIN_RATIO - 1:.0%}", _profile.MIN_RECORDS,
                            f"{_profile.MIN_RATIO:g}x")

PLAN_HELP = f"""Predict, for each global batch size, the iteration time and the time to
finish E epochs on the cluster of a short profiling run.

\b
METRICS.jsonl is the --metrics log of that run (any sync mode, a few dozen
iterations); give several (e.g. two short runs at B and 4B, of any lengths)
to pool them. Each worker's compute time is fitted as a + b/v (its fixed
cost a and its speed v) through its median compute time at each of its local
batch sizes (sizes within {_POOLED} pooled; a size counts from {_COUNTS} records,
an epoch's short last batch never), which needs two sizes {_APART} apart: from
a profile at one fixed B plan stops and asks for a second. It stops too when
the medians do not grow with the batch size (timing noise swamps the cost of
a sample). The push/pull time is the median measured; the iteration time of
a global batch b is then the LB-BSP makespan of b over those models plus the
push/pull time, and an epoch of N samples is floor(N/B) iterations of B and
one of the rest, N mod B.
With --deadline it marks the batches that meet it and picks the smallest one
(the best accuracy, as in Courier), or the fastest when none does.

\b
Examples:
  mxlbbsp launch -n 4 --metrics p64.jsonl -- python train.py --batch-size 64 --iterations 30
  mxlbbsp launch -n 4 --metrics p256.jsonl -- python train.py --batch-size 256 --iterations 30
  mxlbbsp plan p64.jsonl p256.jsonl --samples 50000 --epochs 10 --deadline 15m
"""


@click.command("plan", help=PLAN_HELP, context_settings={"help_option_names": ["-h", "--help"],
                                                        "max_content_width": 100})
@click.argument("metrics_paths", metavar="METRICS.jsonl...", nargs=-1, required=True)
@click.option("--samples", "-N", type=int, metavar="N",
              help="Samples in one epoch (the training set's size); not with --goodput.")
@click.option("--epochs", "-E", type=float, default=1.0, show_default=True, metavar="E",
              help="Epochs still to train.")
@click.option("--batch-range", default="64:1024", show_default=True, metavar="MIN:MAX",
              help="Global batch sizes to consider.")
@click.option("--deadline", metavar="DURATION",
              help="Time budget for the E epochs, with a unit: 90s, 15m, 1h30m.")
@click.option("--skip", type=int, default=1, show_default=True, metavar="N",
              help="Leave out each file's iterations below N (warm-up).")
@click.option("--goodput", is_flag=True,
              help="Answer for --sync goodput instead: the batch it would start with (the "
                   "most goodput, throughput x statistical efficiency) and why.")
@click.option("--noise-scale", type=float, metavar="PHI",
              help="--goodput: the gradient noise scale tr(Sigma)/|G|^2 in samples (default: "
                   "the last one recorded in METRICS, a goodput run's).")
@click.option("--base-batch", type=int, metavar="B0",
              help="--goodput: the batch the learning rate was tuned for (default: the "
                   "profile's first global batch).")
@click.option("--goodput-model", type=click.Choice(["hetero", "homo"]), default="hetero",
              show_default=True, help="--goodput: LB-BSP's throughput or an equal split's.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def plan(metrics_paths, samples, epochs, batch_range, deadline, skip, goodput, noise_scale,
         base_batch, goodput_model, as_json):

    if samples is None:
        if not goodput:
            raise ConfigError("plan needs --samples N, the training set's size (or --goodput)")
        samples = 1
    if not 1 <= samples <= MAX_SAMPLES:
        raise ConfigError(f"--samples {samples}: must be in 1..{MAX_SAMPLES:.0e} (the "
                          "training set's size)")
    if not (math.isfinite(epochs) and 0 < epochs <= MAX_EPOCHS):
        raise ConfigError(f"--epochs {epochs}: must be a positive number up to {MAX_EPOCHS:g}")
    if skip < 0:
        raise ConfigError(f"--skip {skip}: must be >= 0")
    try:
        deadline_s = None if deadline is None else _planner.parse_duration(deadline)
        records = [rec for path in metrics_paths for rec in metrics.load(path)]
    except metrics.MetricsError as exc:
        raise ConfigError(f"{exc}; {metrics.HINT}") from None
    except _planner.PlanError as exc:
        raise ConfigError(str(exc)) from None
    try:
        ranks, model, sync_s = _profile.fit_time_models(records, skip=skip)
    except _planner.PlanError as exc:
        raise ConfigError(f"{', '.join(metrics_paths)}: {exc}") from None
    try:
        lo, hi = _planner.parse_batch_range(batch_range, len(ranks))
    except _planner.PlanError as exc:
        raise ConfigError(str(exc)) from None
    if hi > MAX_BATCH:
        raise ConfigError(f"--batch-range {batch_range}: the maximum {hi} is more than "
                          f"{MAX_BATCH:.0e} samples per iteration")
    if goodput:
        if deadline is not None:
            raise ConfigError("--goodput and --deadline: goodput chooses the batch for the "
                              "most progress per second, not for a deadline; drop one")
        return _goodput(metrics_paths, records, ranks, model, sync_s, lo, hi, noise_scale,
                        base_batch, goodput_model, as_json)
    work = _planner.Work(0, samples, epochs)
    rows = _planner.plan(model, sync_s, work, _planner.candidates(lo, hi), deadline_s)
    finish = [r.finish_s for r in rows]
    if not all(math.isfinite(x) for x in finish) or min(finish) > MAX_FINISH_S:
        fastest = min(finish)
        said = "no finite time" if not math.isfinite(fastest) else \
            f"{fastest / (365.25 * 86400):.3g} years at best"
        raise ConfigError(f"{', '.join(metrics_paths)}: {epochs:g} epoch(s) of {samples} "
                          f"samples take "
                          f"{said} on its workers (speeds {_speeds(model.speed)} samples/s); "
                          "check --samples, --epochs and the file's compute_s and speed")
    pick, meets = _planner.choose(rows)
    if as_json:
        click.echo(json.dumps({
            "workers": len(ranks), "speed": [float(v) for v in model.speed],
            "fixed_s": [float(a) for a in model.intercept], "sync_s": sync_s,
            "deadline_s": deadline_s, "choice": pick, "meets_deadline": meets,
            "rows": [{"batch": r.batch, "iteration_s": _finite(r.iteration_s),
                      "finish_s": _finite(r.finish_s), "meets": r.meets} for r in rows]}))
        return 0
    lines = [f"{', '.join(metrics_paths)}: {len(ranks)} worker(s); speeds (samples/s) "
             + ", ".join(f"{v:.0f}" for v in model.speed)
             + "; fixed cost per iteration (ms) "
             + ", ".join(f"{1e3 * a:.1f}" for a in model.intercept)
             + f"; push/pull {1e3 * sync_s:.1f} ms",
             f"{epochs:g} epoch(s) of {samples} samples"
             + (f", deadline {_planner.format_duration(deadline_s)}" if deadline_s else ""), "",
             f"{'batch':>7}{'iteration':>12}{'samples/s':>12}{'time':>12}"
             + ("  meets" if deadline_s else "")]
    for r in rows:
        rate = r.batch / r.iteration_s if r.iteration_s > 0 else math.inf
        mark = "  <- choice" if r.batch == pick else ""
        lines.append(f"{r.batch:>7}{1e3 * r.iteration_s:>10.1f}ms{rate:>12.0f}"
                     f"{_planner.format_duration(r.finish_s):>12}"
                     + (f"  {'yes' if r.meets else 'no':>5}" if deadline_s else "") + mark)
    if deadline_s is not None:
        lines.append("")
        if meets:
            lines.append(f"choice: B = {pick}, the smallest global batch that meets the "
                         "deadline")
        else:
            lines.append(f"no batch in {lo}:{hi} meets the deadline; the fastest is B = {pick} "
                         "(raise the maximum of --batch-range, add workers, or extend the "
                         "deadline)")
    click.echo("\n".join(lines))
    return 0


def _goodput(paths, records, ranks, model, sync_s, lo, hi, phi, base_batch, kind,
             as_json) -> int:
    """``plan --goodput``: the goodput of each candidate batch and the one to start with."""
    where = ", ".join(paths)
    if phi is None:
        seen = [r["noise_scale"] for r in records
                if isinstance(r.get("noise_scale"), (int, float))
                and math.isfinite(r["noise_scale"])]
        if not seen:
            raise ConfigError(f"{where}: no noise_scale recorded (not a --sync goodput run); "
                              "give the gradient noise scale with --noise-scale PHI")
        phi, phi_from = float(seen[-1]), "recorded"
    else:
        phi_from = "given"
    if not (math.isfinite(phi) and phi >= 0):
        raise ConfigError(f"--noise-scale {phi}: must be a number >= 0 (samples)")
    if base_batch is None:
        first = [r.get("global_batch") for r in records if r.get("global_batch")]
        base_batch = int(first[0]) if first else lo
    if base_batch < 1:
        raise ConfigError(f"--base-batch {base_batch}: must be >= 1")
    planner = _goodput_mode.GoodputPlanner(lo, hi, base_batch)
    fn = _goodput_mode.iteration_model(kind, model, sync_s)
    pick = planner.update(fn, phi, force=True)
    rows = planner.last_rows
    best_rate = max(rows, key=lambda r: (r.throughput, -r.batch))
    chosen = planner.row(pick)
    at_base = next((r for r in rows if r.batch == base_batch), None)
    if at_base is None:
        at_base = _noise.goodput_rows([base_batch], fn, phi, base_batch)[0]
    if as_json:
        click.echo(json.dumps({
            "workers": len(ranks), "speed": [float(v) for v in model.speed],
            "fixed_s": [float(a) for a in model.intercept], "sync_s": sync_s,
            "noise_scale": phi, "base_batch": base_batch, "goodput_model": kind,
            "choice": pick,
            "rows": [{"batch": r.batch, "iteration_s": _finite(r.iteration_s),
                      "throughput": r.throughput, "efficiency": r.efficiency,
                      "goodput": r.goodput} for r in rows]}))
        return 0
    lines = [f"{where}: {len(ranks)} worker(s); speeds (samples/s) "
             + ", ".join(f"{v:.0f}" for v in model.speed)
             + f"; push/pull {1e3 * sync_s:.1f} ms",
             f"noise scale {phi:.4g} samples ({phi_from}), base batch B0 = {base_batch}, "
             f"throughput model {kind}", "",
             f"{'batch':>7}{'iteration':>12}{'samples/s':>12}{'efficiency':>12}"
             f"{'goodput':>12}"]
    for r in rows:
        mark = "  <- choice" if r.batch == pick else ""
        lines.append(f"{r.batch:>7}{1e3 * r.iteration_s:>10.1f}ms{r.throughput:>12.0f}"
                     f"{r.efficiency:>12.3f}{r.goodput:>12.0f}{mark}")
    lines += ["", f"choice: B = {pick}: {chosen.throughput:.0f} samples/s x efficiency "
              f"{chosen.efficiency:.2f} = goodput {chosen.goodput:.0f}, "
              f"{chosen.goodput / at_base.goodput:.2f}x that of B0 = {base_batch}"]
    if best_rate.batch != pick:
        lines.append(f"  the fastest, B = {best_rate.batch} ({best_rate.throughput:.0f} "
                     f"samples/s), would learn only {best_rate.efficiency:.2f} as much per "
                     f"sample: goodput {best_rate.goodput:.0f}")
    click.echo("\n".join(lines))
    return 0


def _speeds(speeds) -> str:
    return ", ".join(f"{v:.3g}" for v in list(speeds)[:8]) + (", ..." if len(speeds) > 8 else "")


def _finite(x: float):
    return x if math.isfinite(x) else None
