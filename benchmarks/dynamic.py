"""Dynamic heterogeneity: BSP and LB-BSP with each predictor (and the oracle) on slowdown
traces that change over time, side by side.

The script generates per-worker slowdown traces with a fixed seed and writes them as a CSV
(``iteration,rank,slowdown``, a step function per rank) passed to every job with
``--emulate-slowdown PATH``:

* worker 0: steps -- the factor jumps between 1, 1.5, 2.5 and 3.5 after random dwell times;
* worker 1: a slow drift -- 1 + 1.25 (1 - cos(2 pi t / P)), between 1 and 3.5;
* worker 2: a slow random drift (smoothed random walk of the log factor, within [1, 3])
  plus one step up and back down.

Setting (EMULATED compute, as in static.py): 3 workers, a small MLP on synthetic data, 2 ms
of emulated compute per sample (slept, no CPU), stretched by the trace's factor. Modes: BSP,
LB-BSP with the ``narx``, ``ema``, ``last`` and ``ar`` predictors, and with the ``oracle``
(which knows the next factor: the upper bound of prediction). Interleaved round by round
(ABBA); each predictor's fraction of the oracle's throughput is taken per round, then the
median.

    python benchmarks/dynamic.py --quick    # 2 rounds x 120 iterations (~5 min)
    python benchmarks/dynamic.py            # 3 rounds x 400 iterations (~25 min)
    python benchmarks/dynamic.py --baseline REV    # and every mode on the code of REV

``--decisions`` runs no job: a real Coordinator is fed the trace's iteration times directly
(no sockets, no clock; seeded noise and load readings for the ``--exog`` columns, so that
NARX's kernel units work), with each LB-BSP predictor and the oracle, and records every
split, applied to the iteration it was sent for (the reports of t split t+2 in lbbsp: the
forecasts are two steps ahead), and the throughput those splits reach on the trace's times
against the best split's and the oracle's; with ``--baseline REV`` the same simulation on
the code of commit REV (a temporary git worktree), side by side, which gives the same batch
sizes at every iteration unless the balancing changed. ``--workers N`` tiles the three traces
over N workers (each shifted in time and with a speed of its own): the coordinator's arrays
then have N rows, as at scale. ``--per-host K`` (this tree only): the workers sit K to a
host, and each host's forecasts come from its relay's predictor (``mxlbbsp.relay.forecast.
Forecaster``, as a relay runs it), with the reports, as in a job with relays; the baseline
still forecasts every worker in its coordinator.

    python benchmarks/dynamic.py --decisions --baseline REV --workers 3,1024
    python benchmarks/dynamic.py --decisions --baseline REV --workers 64,1024 --per-host 8
"""
import argparse
import contextlib
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import _common as C
import _suite as S
from mxlbbsp.core import metrics as _metrics

PREDICTORS = ["narx", "ema", "last", "ar", "oracle"]
MODES = {"BSP": ("bsp", None), **{f"LB-BSP {p}": ("lbbsp", p) for p in PREDICTORS}}


def make_trace(iterations: int, seed: int = 0):
    """Per-rank factors for every iteration: a list of 3 lists (see the module docstring)."""
    rng = np.random.default_rng(seed)
    T = iterations
    # worker 0: steps with random dwell times (T/12 to T/5 iterations, at least 10)
    levels = [1.0, 1.5, 2.5, 3.5]
    steps, level, t = [], 0, 0
    while t < T:
        dwell = max(10, int(rng.integers(T // 12, T // 5 + 1)))
        steps += [levels[level]] * dwell
        level = int(rng.choice([k for k in range(len(levels)) if k != level]))
        t += dwell
    steps = steps[:T]
    # worker 1: one slow cosine drift over the run (period T, so it goes up and comes back)
    period = max(T, 60)
    drift = [1 + 1.25 * (1 - math.cos(2 * math.pi * t / period)) for t in range(T)]
    # worker 2: a smoothed random walk of log(factor) within [0, log 3], and one step
    walk, x, v = [], 0.3, 0.0
    for t in range(T):
        v = 0.95 * v + rng.normal(0, 0.01)
        x = min(max(x + v, 0.0), math.log(3))
        if x in (0.0, math.log(3)):
            v = -v
        walk.append(math.exp(x))
    a, b = int(0.55 * T), int(0.7 * T)
    walk = [w * (2.0 if a <= t < b else 1.0) for t, w in enumerate(walk)]
    return [[round(f, 2) for f in series] for series in (steps, drift, walk)]


def write_trace(factors, path: Path) -> int:
    """The CSV trace: one row per rank whenever its factor changes. Returns the row count."""
    rows = 0
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["iteration", "rank", "slowdown"])
        for rank, series in enumerate(factors):
            last = None
            for t, f in enumerate(series):
                if f != last:
                    w.writerow([t, rank, f"{max(f, 1.0):g}"])
                    rows += 1
                    last = f
    return rows


def prediction_error(path: Path, skip: int = 5) -> float:
    """Mean absolute percentage error of predicted_speed against speed (one step ahead)."""
    errs = [abs(r["predicted_speed"] - r["speed"]) / r["speed"]
            for r in _metrics.load(str(path))
            if r["iteration"] >= skip and r.get("predicted_speed") and r["speed"] > 0]
    return 100 * float(np.mean(errs)) if errs else float("nan")


DECISION_PREDICTORS = ["narx", "ema", "last", "ar", "oracle"]
#: the simulated times: worker i takes (FIXED_S + PER_SAMPLE_S b / speed_i) x its factor
FIXED_S, PER_SAMPLE_S = 0.003, 0.002
#: iterations left out of the simulated throughput (the warm-up and the first forecasts)
SIMULATED_SKIP = 10


def _simulated_speeds(workers: int):
    ranks = np.arange(workers)
    return 1.0 + (ranks * 0.618) % 1.0                  # each worker its own


def _simulated_factors(workers: int, iterations: int, seed: int) -> np.ndarray:
    """(iterations + 1, workers): each worker's slowdown factor at each iteration of a
    simulation of ``iterations`` (the last split is for the one after them)."""
    factors = np.array(make_trace(iterations + workers, seed))        # (3, T)
    ranks = np.arange(workers)
    return np.stack([factors[ranks % 3, t + ranks // 3] for t in range(iterations + 1)])


def simulate(workers: int, iterations: int, seed: int, predictors, batch_per_worker: int = 32,
             per_host: int = 0):
    """Every split the coordinator chose, per predictor, on the trace's times (see the module
    docstring): {predictor: [[b_0 .. b_n-1] of iteration 1, 2, ...]}, each split applied to
    the iteration it was sent for (its reports of t split t+1, or t+2 in a tree that splits
    ahead), and under "<predictor> speeds" a digest of every forecast (the metrics'
    predicted_speed), bit for bit. ``per_host``: the workers' relays forecast them,
    ``per_host`` to a relay. The ``oracle`` is given the trace's factors."""
    import hashlib
    import mxlbbsp
    if (Path(mxlbbsp.__file__).parent / "control").is_dir():
        from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
    else:                    # a commit before the layer folders (issue 21)
        from mxlbbsp.coordinator import Coordinator, CoordinatorConfig
    from mxlbbsp.core.slowdown import Schedule
    trace = _simulated_factors(workers, iterations, seed)
    B = batch_per_worker * workers
    out = {}
    for name in predictors:
        rng = np.random.default_rng([seed, workers])
        options = {}
        if name == "oracle":
            options["slowdown"] = [Schedule(list(enumerate(trace[:, r].tolist())))
                                   for r in range(workers)]
        c = Coordinator(CoordinatorConfig(num_workers=workers, token="t", predictor=name,
                                          **options))
        sent = {}                               # no workers: each split for its iteration
        c.send_split = c._send_allocation = lambda t, split: sent.__setitem__(
            t, np.array(split))
        split = np.full(workers, batch_per_worker)
        c._sizes = c._in_force = split.copy()          # _sizes: a --baseline commit's name for it
        ranks = np.arange(workers)
        speed = _simulated_speeds(workers)
        splits = []
        digest = hashlib.sha256()
        relays = _relays(c, name, workers, per_host) if per_host > 1 else []
        for t in range(iterations):
            f = trace[t]
            noise = rng.lognormal(0, 0.05, workers)
            compute = (FIXED_S + PER_SAMPLE_S * split / speed) * f * noise
            load = np.column_stack([25 * (f - 1) + rng.normal(0, 2, workers),
                                    0.1 * (f - 1) + rng.normal(0, 0.01, workers),
                                    0.05 * f + rng.normal(0, 0.01, workers)])
            msgs = [{"type": "report", "iteration": t, "batch_size": int(split[r]),
                     "compute_s": float(compute[r]), "next_global_batch": B,
                     "after_next_global_batch": B,
                     "others_cpu": float(load[r, 0]), "run_delay": float(load[r, 1]),
                     "cpu_pressure": float(load[r, 2])} for r in range(workers)]
            for forecaster in relays:         # as each relay adds its columns
                for r in forecaster.ranks:
                    got = forecaster.report(r, msgs[r])
                if got is not None:
                    _, values, counts = got
                    for i, r in enumerate(forecaster.ranks):
                        msgs[r]["_forecast"], msgs[r]["_fallbacks"] = float(values[i]), \
                            int(counts[i])
            if hasattr(c, "collect"):        # this tree: as a relay's section reaches it
                from mxlbbsp.core.frames import Rows
                c.decide(*c.collect.reports(Rows.from_messages(ranks.tolist(), msgs, 0.0)))
                for forecaster in relays:     # their training step, after the split
                    forecaster.learn()
            else:                            # a commit before issue 26's relays
                c._on_iteration(t, dict(enumerate(msgs)))
            split = sent.pop(t + 1, split)
            splits.append([int(b) for b in split])
            for k in sorted(c.recorder.predicted):      # every forecast, once
                if k > t:
                    digest.update(np.asarray(c.recorder.predicted.pop(k),
                                             dtype=np.float64).tobytes())
        out[name] = splits
        out[f"{name} speeds"] = digest.hexdigest()
    return out


def simulated_throughput(splits, workers: int, seed: int) -> float:
    """The share of the best split's throughput that ``splits`` (iteration 1 on, as
    :func:`simulate` gives them) reach on the trace's times without their noise: the
    samples of iterations SIMULATED_SKIP.. over their makespans, against the same with the
    best integer split of each iteration (what knowing every time exactly would give)."""
    from mxlbbsp.core import split as _split
    from mxlbbsp.core.timemodel import TimeModel, makespan
    trace = _simulated_factors(workers, len(splits), seed)
    speed = _simulated_speeds(workers)
    spent = best = 0.0
    for t, split in enumerate(splits, start=1):
        if t < SIMULATED_SKIP:
            continue
        model = TimeModel(speed / (PER_SAMPLE_S * trace[t]), FIXED_S * trace[t])
        split = np.asarray(split)
        spent += makespan(model, split)
        best += makespan(model, _split.solve(model, int(split.sum())))
    return best / spent


def decisions(args) -> None:
    """--decisions: the simulation (see the module docstring), this tree and --baseline."""
    sizes = [int(x) for x in str(args.workers).split(",")]
    predictors = args.modes.split(",") if args.modes else DECISION_PREDICTORS
    iters = args.iterations or 200
    if args.smoke:                          # seconds: 3 workers, 10 iterations
        sizes, iters = [3], 10
    lines, payload = [], {}
    for n in sizes:
        C.progress(f"{n} workers: this tree")
        mine = simulate(n, iters, args.seed, predictors, per_host=args.per_host)
        theirs = None
        if args.baseline:
            C.progress(f"{n} workers: {args.baseline}")
            with C.worktree(args.baseline) as tree:
                res = subprocess.run([sys.executable, __file__, "--simulate-in", str(tree),
                                      "--workers", str(n), "--iterations", str(iters),
                                      "--seed", str(args.seed), "--modes", ",".join(predictors)],
                                     capture_output=True, text=True, check=True)
            theirs = json.loads(res.stdout)
        shares = {name: [simulated_throughput(run[name], n, args.seed)
                         for run in ([mine] + ([theirs] if theirs else []))]
                  for name in predictors}
        for name in predictors:
            splits = mine[name]
            moved = sum(a != b for a, b in zip(splits, splits[1:]))
            verdict = ""
            if theirs is not None:
                diff = [t for t, (a, b) in enumerate(zip(splits, theirs[name])) if a != b]
                verdict = (f"**identical to {args.baseline}'s**" if not diff and
                           len(splits) == len(theirs[name]) else
                           f"differs from {args.baseline}'s from iteration {diff[0] + 1}"
                           if diff else "a different number of iterations")
                verdict += ("; forecasts identical bit for bit"
                            if mine[f"{name} speeds"] == theirs.get(f"{name} speeds")
                            else "; forecasts differ")
            share = " | ".join(f"{100 * x:.1f}%" for x in shares[name])
            of_oracle = " | ".join(
                f"{100 * x / o:.1f}%" for x, o in zip(shares[name], shares["oracle"])) \
                if "oracle" in shares else " | ".join("-" for _ in shares[name])
            lines.append(f"| {n} | {name} | {iters} | {moved} | {share} | {of_oracle} | "
                         f"{verdict or '-'} |")
            payload[f"{n} {name}"] = {"changes": moved, "verdict": verdict,
                                      "share_of_best": shares[name],
                                      "final": splits[-1] if n <= 16 else None}
            C.progress(f"  {name}: split changed {moved} times; {share} of the best split's "
                       f"throughput; {verdict}")
    trees = "this tree" + (f" | {args.baseline}" if args.baseline else "")
    table = ("The coordinator's decisions on the dynamic trace (seed "
             f"{args.seed}), simulated: a real Coordinator fed the trace's iteration times and "
             "load readings, no job, each split applied to the iteration it was sent for; "
             "every split of every iteration compared with "
             f"{args.baseline or '(no baseline)'}, and every forecast (the predicted_speed of "
             "the metrics) bit for bit. Throughput: the samples over the makespans of the "
             f"splits from iteration {SIMULATED_SKIP} on, on the trace's times without "
             "their noise, as a share of the best split's (each iteration's times known "
             "exactly), and as a share of the oracle's (which knows each factor of the "
             "iteration it splits)."
             + (f" This tree's workers {args.per_host} to a host, each host's relay "
                "forecasting them (the baseline: its coordinator forecasting all)."
                if args.per_host > 1 else "") + "\n\n| workers | predictor | iterations | split "
             f"changes | share of the best split ({trees}) | share of the oracle ({trees}) | "
             "batch sizes |\n|---|---|---|---|---|---|---|\n" + "\n".join(lines))
    name = "dynamic_decisions" + (f"_per_host_{args.per_host}" if args.per_host > 1 else "")
    C.write(name, {"seed": args.seed, "iterations": iters, "per_host": args.per_host,
                   "baseline": args.baseline, "runs": payload}, table)


def _relays(c, name: str, workers: int, per_host: int) -> list:
    """The relays' predictors of ``per_host`` workers each, the coordinator's handed off to
    them, as the coordinator's CONFIG does in a job."""
    from mxlbbsp.relay.forecast import Forecaster
    if not c.speed.separable():                       # the oracle: the coordinator's own
        return []
    hosts = [list(range(i, min(i + per_host, workers))) for i in range(0, workers, per_host)]
    hosts = [h for h in hosts if len(h) > 1]          # a host of one talks to it directly
    remote = np.zeros(workers, dtype=bool)
    for h in hosts:
        remote[h] = True
    c.speed.hand_off(remote)
    return [Forecaster({"predictor": name, "exog": list(c.config.exog),
                        "from": c.config.warmup, "ranks": h}) for h in hosts]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds x 120 iterations")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--emulate-compute", type=float, default=2.0, metavar="MS")
    p.add_argument("--seed", type=int, default=1, help="seed of the generated traces")
    p.add_argument("--figures", action=argparse.BooleanOptionalAction, default=None,
                   help="write the report figures (default: in full mode, not with --quick)")
    p.add_argument("--modes", help="comma-separated subset of: " + ", ".join(MODES)
                   + " (with --decisions: of the predictors " + ", ".join(DECISION_PREDICTORS)
                   + ")")
    p.add_argument("--decisions", action="store_true",
                   help="no job: the coordinator's splits on the trace, simulated (see above)")
    p.add_argument("--workers", default="3", help="--decisions: comma-separated worker counts")
    p.add_argument("--per-host", type=int, default=0, metavar="K",
                   help="--decisions: this tree's workers K to a host, forecast by their relays")
    p.add_argument("--baseline", metavar="REV",
                   help="also run every mode on the code of this commit (a temporary git "
                        "worktree), interleaved: NAME@REV; with --decisions, simulate it "
                        "and compare")
    p.add_argument("--simulate-in", metavar="TREE", help=argparse.SUPPRESS)
    C.add_smoke(p)
    args = p.parse_args()
    if args.simulate_in:                     # a child: the code of another tree, JSON out
        for module in [m for m in sys.modules if m.split(".")[0] == "mxlbbsp"]:
            del sys.modules[module]          # _common imported this tree's
        sys.path.insert(0, args.simulate_in)
        import mxlbbsp
        if not mxlbbsp.__file__.startswith(args.simulate_in):
            sys.exit(f"imported {mxlbbsp.__file__}, not the tree {args.simulate_in}")
        print(json.dumps(simulate(int(args.workers), args.iterations, args.seed,
                                  args.modes.split(","))))
        return
    if args.decisions:
        C.smoke(args)
        decisions(args)
        return
    if C.smoke(args):        # one round, 8 iterations, BSP and one predictor
        args.quick, args.rounds, args.iterations, args.figures = True, 1, 8, False
        args.modes = args.modes or f"BSP,{list(MODES)[1]}"
    rounds = args.rounds or (2 if args.quick else 3)
    iters = args.iterations or (120 if args.quick else 400)
    want_figures = (not args.quick) if args.figures is None else args.figures
    modes = [m.strip() for m in args.modes.split(",")] if args.modes else list(MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    name = "dynamic" + ("_quick" if args.quick else "")
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()

    C.RESULTS.mkdir(parents=True, exist_ok=True)
    trace = C.RESULTS / f"{name}_trace.csv"
    factors = make_trace(iters, args.seed)
    write_trace(factors, trace)
    train = ["--model", "mlp", "--data", "synthetic", "--samples", "4096",
             "--batch-size", str(args.batch_size), "--epochs", "1000",
             "--iterations", str(iters), "--log-interval", "0"]
    arms = list(modes)
    trees = {m: None for m in modes}
    with contextlib.ExitStack() as stack:
        if args.baseline:           # every mode again on the code of REV: NAME@REV
            tree = C.importable(stack.enter_context(C.worktree(args.baseline)))
            for m in modes:
                arms.append(f"{m}@{args.baseline}")
                trees[arms[-1]] = tree
        results, paths, ideal, figures, bsp_predictor = _jobs(
            args, arms, trees, rounds, iters, train, trace, name, want_figures)

    head = ("| mode | samples/s | speedup over BSP | fraction of oracle | per round (fraction "
            "of oracle) | wait | prediction error (MAPE) |")
    rows = [head, "|---|---|---|---|---|---|---|"]
    for mode in arms:
        r = results[mode]
        rows.append(
            f"| {mode} | {r['samples_per_s']:.0f} | "
            + (f"{r['speedup_over_bsp']:.2f}x" if "speedup_over_bsp" in r else "-") + " | "
            + (f"**{100 * r['fraction_of_oracle']:.1f}%**" if "fraction_of_oracle" in r
               else "-") + " | "
            + (S.rounds_text([100 * x for x in r["fraction_per_round"]], ".1f")
               if "fraction_of_oracle" in r else "-")
            + f" | {100 * r['wait_share']:.0f}% | {r['prediction_mape']:.1f}% |")
    table = (
        f"Dynamic heterogeneity. 3 workers, MLP on synthetic data, global batch "
        f"{args.batch_size}, **emulated compute** of {args.emulate_compute} ms per sample "
        f"(slept, no CPU) stretched by a per-worker slowdown trace that changes over time "
        f"(generated with seed {args.seed}: [{trace.name}]({trace.name}); worker 0 steps "
        f"between 1, 1.5, 2.5 and 3.5, worker 1 drifts slowly between 1 and 3.5, worker 2 "
        f"drifts randomly within [1, 3] with one 2x step). {iters} iterations per run, first 5 "
        f"left out; {rounds} round(s), modes interleaved (ABBA)"
        + (f", each also on the code of {args.baseline} (NAME@{args.baseline}, its fraction "
           f"of oracle against oracle@{args.baseline}, its speedup against BSP@"
           f"{args.baseline})" if args.baseline else "")
        + ". Values are medians over rounds; ratios are per-round ratios.\n\n"
        + "\n".join(rows) +
        ("\n\nIdeal speedup over BSP on this trace (time-averaged sum(v)/(n min v) from the "
         f"BSP runs' measured speeds): {ideal:.2f}x." if ideal else "") +
        "\n\n'wait' = mean share of a worker's iteration spent waiting for the others. "
        "Prediction error: mean |predicted - measured| / measured of each worker's speed, "
        "the forecast its iteration was split by as the metrics record it (two iterations "
        "ahead where the reports of t split t+2, one where they split t+1; in BSP the "
        f"coordinator still runs its default predictor, {bsp_predictor}, but does not use it)."
        + (f"\n\nFigures (last round; BSP, NARX, oracle): [{figures}]({figures})"
           if figures else "")
        + f"\n\nLoad average at start: {load_at_start:.2f}.")
    C.write(name, {"rounds": rounds, "iterations": iters, "batch_size": args.batch_size,
                   "emulate_compute_ms": args.emulate_compute, "seed": args.seed,
                   "trace": trace.name, "ideal_speedup": ideal, "baseline": args.baseline,
                   "load_at_start": load_at_start, "figures": figures,
                   "results": results}, table)


def _jobs(args, arms, trees, rounds, iters, train, trace, name, want_figures):
    """Every arm's jobs, interleaved round by round; (results per arm, the metrics files,
    the ideal speedup, the figures, BSP's predictor)."""
    runs = {m: [] for m in arms}
    paths = {m: [] for m in arms}

    def same_tree(arm, mode):           # ``mode``'s arm on the code ``arm`` runs
        at = arm.partition("@")[2]
        return f"{mode}@{at}" if at else mode

    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for k, arm in enumerate(S.order(arms, r)):
                sync, predictor = MODES[arm.partition("@")[0]]
                extra = ["--predictor", predictor] if predictor else []
                path = Path(tmp) / f"{k}-{sync}-{predictor or 'equal'}-round{r + 1}.jsonl"
                C.progress(f"round {r + 1}/{rounds}: {arm} (load {S.load():.1f})")
                s = C.launch(3, train, path, sync=sync,
                             launch_args=["--emulate-slowdown", str(trace),
                                          "--emulate-compute", str(args.emulate_compute),
                                          *extra], tree=trees[arm])
                s["mape"] = prediction_error(path)
                runs[arm].append(s)
                paths[arm].append(path)
                C.progress(f"  {s['samples_per_s']:.1f} samples/s, wait "
                           f"{100 * s['wait_share']:.1f}%, prediction error {s['mape']:.1f}%")
        results = {}
        for arm in arms:
            tput = [s["samples_per_s"] for s in runs[arm]]
            row = {"samples_per_s": C.median(tput), "per_round": tput,
                   "wait_share": C.median([s["wait_share"] for s in runs[arm]]),
                   "prediction_mape": C.median([s["mape"] for s in runs[arm]]),
                   "runs": [S.summary_row(s) for s in runs[arm]]}
            ref = same_tree(arm, "LB-BSP oracle")
            if ref in runs:
                fr = [a / o for a, o in zip(tput, [s["samples_per_s"] for s in runs[ref]])]
                row["fraction_of_oracle"], row["fraction_per_round"] = C.median(fr), fr
            bsp = same_tree(arm, "BSP")
            if bsp in runs:
                sp = [a / b for a, b in zip(tput, [s["samples_per_s"] for s in runs[bsp]])]
                row["speedup_over_bsp"], row["speedup_per_round"] = C.median(sp), sp
            results[arm] = row
        ideal = (C.median([S.ideal_speedup_over_time(q) for q in paths["BSP"]])
                 if "BSP" in arms else None)
        bsp_predictor = S.predictor_of(paths["BSP"][-1]) if "BSP" in arms else "-"
        shown = [m for m in ("BSP", "LB-BSP narx", "LB-BSP oracle") if m in arms]
        figures = S.figures({(MODES[m][1] or "bsp"): paths[m][-1] for m in shown},
                            C.RESULTS / name) if shown and want_figures else None
    return results, paths, ideal, figures, bsp_predictor


if __name__ == "__main__":
    main()
