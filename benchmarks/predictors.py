"""Evaluate the speed predictors on generator families and recorded traces; measure their cost.

    python benchmarks/predictors.py            # families + recorded traces + cost per call
    python benchmarks/predictors.py --tune     # NARX variants on the tuning seeds only
    python benchmarks/predictors.py --baseline REV   # + NARX's cost on REV's code, side by side

Writes benchmarks/results/predictors.json and benchmarks/results/predictors.md (--tune:
predictors_tune.json / .md).

Generator families (``family``): each worker's load switches at random moments among a few
levels; the speed is a nonlinear function of the load (the curve) times log-normal noise;
a reading (cpu) shows the load ``lead`` iterations before the speed, plus noise; a second
column is irrelevant. One parameter at a time is varied around a base family (3 levels,
switch rate 0.1, lead 1, noise 3 %, convex curve 1 / (1 + 2 load)); "no signal" families
have a flat reading. Per family: one-step MAPE of NARX / the best of last, EMA and AR on the
same trace, and the oracle's floor: a predictor that knows each worker's base speed, the curve
and the loads the readings reveal (noise-free). Reported figures use REPORT_SEEDS; every
hyperparameter was chosen with --tune on TUNE_SEEDS, which are different seeds.

Recorded traces (benchmarks/traces/, record_traces.py): every trace is replayed one step
ahead per rank (mxlbbsp.analysis.trace.evaluate, the code of ``mxlbbsp predict``), NARX with the
default inputs (``--exog auto``), with cpu_percent and mem_percent only, and with all columns.

Cost: one observe() + predict() + learn() for n workers at once, as the coordinator calls it
(3 exogenous columns: the default inputs), median and 99th percentile over 300 calls (200 for
n = 1024) after 100 warm-up calls, in wall-clock and process CPU time, with one BLAS thread.
The machine is shared: its load average is recorded next to the numbers, and CPU time is the
fairer figure when it is busy.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")          # before numpy: one BLAS thread
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mxlbbsp import predictors as _pred  # noqa: E402
from mxlbbsp.core import signals as _signals  # noqa: E402
from mxlbbsp.analysis import trace as _trace  # noqa: E402

PREDICTORS = ["narx", "narx-adam", "last", "ema", "ar"]
BASELINES = ["last", "ema", "ar"]
REPORT_SEEDS = (1, 2, 3)
TUNE_SEEDS = (100, 101)
TRACES = os.path.join(ROOT, "benchmarks", "traces")
RESULTS = os.path.join(ROOT, "benchmarks", "results")

#: NARX variants of the --tune table: (label, options); the first is the default
VARIANTS = [
    ("default", {}),
    ("no kernel units (RLS over readings only)", {"bandwidth": 0.0}),
    ("no linear readings", {"linear_x": False}),
    ("kernel width 0.8", {"bandwidth": 0.8}),
    ("kernel width 1.6", {"bandwidth": 1.6}),
    ("Gaussian kernel", {"kernel": "gauss"}),
    ("no prior line", {"prior": 0.0}),
    ("memory 512", {"memory": 512}),
    ("gate on errors, not regrets", {"gate_regret": False}),
    ("gate power 8", {"gate_power": 8.0}),
    ("gate window 30", {"gate_window": 30}),
    ("d_x 1", {"d_x": 1}),
]


def switching(seed, T=600, ranks=2, p_switch=0.1, drop=0.5, noise=0.03, lead=True):
    """Synthetic trace rows: idle/loaded switches; cpu shows the load one iteration early
    (``lead``) or is constant plus noise. The generator of tests/test_predict_cli.py."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(ranks):
        base = 150.0 + 100.0 * r
        load = np.zeros(T + 1)
        for t in range(1, T + 1):
            load[t] = 1 - load[t - 1] if rng.random() < p_switch else load[t - 1]
        speed = base * (1 - drop * load[:T]) * np.exp(rng.normal(0, noise, T))
        cpu = 40 + 50 * load[1:] + rng.normal(0, 3, T) if lead else 60 + rng.normal(0, 3, T)
        mem = 50 + rng.normal(0, 1, T)
        rows += [(t, r, speed[t], cpu[t], mem[t]) for t in range(T)]
    return rows


CURVES = {
    "linear": lambda l: 1.0 - 0.6 * l,
    "convex": lambda l: 1.0 / (1.0 + 2.0 * l),
    "step": lambda l: np.where(l < 0.4, 1.0, 0.45),
    "sigmoid": lambda l: 1.0 - 0.6 / (1.0 + np.exp(-12.0 * (l - 0.5))),
}
BASE_FAMILY = dict(levels=3, rate=0.1, lead=1, noise=0.03, curve="convex")
FAMILIES = {
    "base (3 levels, rate 0.1, lead 1, noise 3%, convex)": {},
    "2 levels": dict(levels=2), "5 levels": dict(levels=5),
    "rate 0.03": dict(rate=0.03), "rate 0.25": dict(rate=0.25),
    "lead 2": dict(lead=2), "lead 0": dict(lead=0),
    "noise 1%": dict(noise=0.01), "noise 6%": dict(noise=0.06),
    "curve linear": dict(curve="linear"), "curve step": dict(curve="step"),
    "curve sigmoid": dict(curve="sigmoid"),
    "no signal": dict(lead=None), "no signal, rate 0.03": dict(lead=None, rate=0.03),
}


def family(seed, levels=3, rate=0.1, lead=1, noise=0.03, curve="convex", T=600, ranks=2,
           first=None):
    """(rows, oracle MAPE %). Load switches at random (probability ``rate`` per iteration)
    among ``levels`` levels in [0, 1]; speed = base g(load) exp(N(0, noise)); the reading
    (cpu) shows the load ``lead`` iterations before the speed (None: a flat reading), plus
    N(0, 3) noise; a second column is irrelevant. The oracle knows base, g and the loads
    the readings reveal (load of t+1 when lead >= 1, else of t).

    ``first``: a list that gets, per rank, the oracle's errors of steps 1..T-1, which of
    those steps meet a load level for the first time (no speed at that level seen before:
    what no learner without the curve can know), and the errors of the curve-free floor: the
    oracle's, except on the steps that move to a second level while only one has been seen,
    where the last speed is the best a learner without the curve can say (no slope is known
    yet; the reading tells that the load moved, not by how much the speed will)."""
    rng = np.random.default_rng(seed)
    g = CURVES[curve]
    rows, errs = [], []
    for r in range(ranks):
        base = rng.uniform(100, 300)
        grid = np.linspace(0, 1, levels)
        load = np.empty(T + 3)
        load[0] = rng.choice(grid)
        for t in range(1, T + 3):
            load[t] = rng.choice(grid[grid != load[t - 1]]) if rng.random() < rate else load[t - 1]
        speed = base * g(load[:T]) * np.exp(rng.normal(0, noise, T))
        if lead is None:
            cpu = 60 + rng.normal(0, 3, T)
        else:
            cpu = 20 + 70 * load[lead:lead + T] + rng.normal(0, 3, T)
        other = 50 + rng.normal(0, 1, T)
        rows += [(t, r, speed[t], cpu[t], other[t]) for t in range(T)]
        known = load[1:T] if lead is not None and lead >= 1 else load[:T - 1]
        oracle = base * g(known)
        errs.append(np.abs(speed[1:] - oracle) / speed[1:])
        if first is not None:
            seen = np.array([np.isin(known[t], load[:t + 1]) for t in range(T - 1)])
            blind = np.array([known[t] != load[t] and np.all(load[:t + 1] == load[0])
                              for t in range(T - 1)])
            last = np.abs(speed[1:] - speed[:-1]) / speed[1:]
            first.append((errs[-1], ~seen, np.where(blind, last, errs[-1])))
    return rows, float(100 * np.mean(np.concatenate(errs)))


def ar1(seed, T=600, ranks=2, phi=0.8, noise=0.05):
    """Synthetic trace rows: speed = base (1 + x), x an AR(1) process; no exogenous signal."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(ranks):
        x = 0.0
        for t in range(T):
            x = phi * x + rng.normal(0, noise)
            rows.append((t, r, (150.0 + 100.0 * r) * (1 + x), 60 + rng.normal(0, 3),
                         50 + rng.normal(0, 1)))
    return rows


def from_rows(name, rows, columns=("cpu_percent", "mem_percent")) -> _trace.Trace:
    ranks = {}
    for r in sorted({row[1] for row in rows}):
        mine = [row for row in rows if row[1] == r]
        ranks[r] = _trace.RankSeries(np.array([row[0] for row in mine]),
                                     np.array([row[2] for row in mine], dtype=float),
                                     np.array([row[3:] for row in mine], dtype=float))
    return _trace.Trace(name, list(columns), ranks)


def best_baseline(result) -> float:
    return min(result[b]["mape"] for b in BASELINES)


def _knn(train_x, train_y, test_x, k=10) -> np.ndarray:
    """Median of the k nearest training targets (features scaled by the training sd)."""
    sd = train_x.std(axis=0) + 1e-12
    d = (((test_x[:, None, :] - train_x[None, :, :]) / sd) ** 2).sum(axis=2)
    return np.median(train_y[np.argsort(d, axis=1)[:, :k]], axis=1)


def hindsight(trace) -> dict:
    """What the recorded signals could tell at most, roughly: the next log speed from the
    last log speed and a set of signal columns by k-nearest neighbours, each half of a
    rank's series predicted from the other half (so the future is used: a generous ceiling,
    not an online predictor); the best of the sets (chosen on the same data: more generous
    still). Returns its MAPE %, its ratio to the best baseline, and the columns."""
    cols = list(trace.exog_columns)
    sets = [[]] + [[c] for c in cols]
    for group in (list(_signals.DEFAULT), list(_signals.TAIL_NAMES),
                  ["cpu_pressure"] + list(_signals.TAIL_NAMES)):
        if all(c in cols for c in group):
            sets.append(group)
    best = None
    for chosen in sets:
        errs = []
        for series in trace.ranks.values():
            x = np.column_stack([np.log(series.speed[:-1])] + [
                np.nan_to_num(series.exog[:-1, cols.index(c)]) for c in chosen])
            y = np.log(series.speed[1:])
            half = len(y) // 2
            fit = np.empty(len(y))
            for a, b in ((slice(0, half), slice(half, None)), (slice(half, None), slice(0, half))):
                fit[b] = _knn(x[a], y[a], x[b])
            errs.append(np.abs(np.exp(fit - y) - 1))
        mape = 100 * float(np.mean(np.concatenate(errs)))
        if best is None or mape < best["mape"]:
            best = {"mape": mape, "columns": chosen}
    return best


def accuracy(traces) -> dict:
    """Recorded traces: every predictor with the default inputs, NARX with others too."""
    out = {}
    for name, trace in traces.items():
        auto = _trace.select(trace, _signals.parse_exog("auto", trace.exog_columns))
        res = _trace.evaluate(auto, PREDICTORS)
        res["narx (cpu, mem)"] = _trace.evaluate(
            _trace.select(trace, ["cpu_percent", "mem_percent"]), ["narx"])["narx"]
        res["narx (all)"] = _trace.evaluate(trace, ["narx"])["narx"]
        tail = [c for c in _signals.TAIL_NAMES if c in trace.exog_columns]
        if tail:
            res["narx (tail)"] = _trace.evaluate(_trace.select(trace, tail), ["narx"])["narx"]
        res["narx (none)"] = _trace.evaluate(_trace.select(trace, []), ["narx"])["narx"]
        out[name] = {"exog": list(auto.exog_columns), "result": res,
                     "hindsight": hindsight(trace)}
    return out


def families(seeds, names=("narx", "narx-adam"), options=None, quiet=False) -> dict:
    """Per family: mean over seeds of MAPE(name) / best baseline, oracle / best, name /
    oracle; the raw MAPEs too."""
    out = {}
    for fname, over in FAMILIES.items():
        kw = dict(BASE_FAMILY, **over)
        per = {n: [] for n in names}
        seen = {n: [] for n in names}     # MAPE on the steps at a load level seen before
        orc, orc_seen, best, blind = [], [], [], []
        for seed in seeds:
            first = []
            rows, oracle = family(seed, **kw, first=first)
            trace = from_rows(fname, rows, ("cpu", "other"))
            res = _trace.evaluate(trace, BASELINES, options)
            b = best_baseline(res)
            best.append(b)
            orc.append(oracle)
            new = np.concatenate([f for _, f, _ in first])
            orc_seen.append(100 * np.mean(np.concatenate([e for e, _, _ in first])[~new]))
            blind.append(100 * np.mean(np.concatenate([fl for _, _, fl in first])) / oracle)
            y = np.concatenate([series.speed[1:] for series in trace.ranks.values()])
            for n in names:
                opts = (options or {}).get(n, {})
                f = np.concatenate([_trace.forecasts(n, series, **opts)[0][1:]
                                    for series in trace.ranks.values()])
                per[n].append(_trace.score(y, f)["mape"])
                seen[n].append(_trace.score(y[~new], f[~new])["mape"])
        entry = {"lead": kw["lead"], "best_mape": float(np.mean(best)),
                 "oracle_mape": float(np.mean(orc)),
                 "oracle_ratio": float(np.mean(np.array(orc) / best)),
                 "curve_free_floor": float(np.mean(blind))}
        for n in names:
            entry[n] = {"mape": float(np.mean(per[n])),
                        "ratio": float(np.mean(np.array(per[n]) / best)),
                        "to_oracle": float(np.mean(np.array(per[n]) / orc)),
                        "to_oracle_seen": float(np.mean(np.array(seen[n]) / orc_seen))}
        out[fname] = entry
        if not quiet:
            print(f"  {fname:<52} narx/best {entry['narx']['ratio']:.2f}  oracle/best "
                  f"{entry['oracle_ratio']:.2f}  narx/oracle {entry['narx']['to_oracle']:.2f}",
                  flush=True)
    return out


def cost(names, sizes=(1, 16, 256, 1024), num_exog=3, calls=None) -> dict:
    out = {}
    fixed_calls = calls
    for name in names:
        out[name] = {}
        for n in sizes:
            calls = fixed_calls or (300 if n < 1024 else 200)
            rng = np.random.default_rng(0)
            p = _pred.create(name, n, num_exog)
            data = [(100 + rng.normal(0, 5, n), rng.normal(50, 5, (n, num_exog)))
                    for _ in range(100 + calls)]
            wall, cpu = [], []
            for k, (speed, exog) in enumerate(data):
                w0, c0 = time.perf_counter(), time.process_time()
                p.observe(speed, exog)
                p.predict()
                p.learn()
                if k >= 100:
                    cpu.append(time.process_time() - c0)
                    wall.append(time.perf_counter() - w0)
            w, c = np.array(wall) * 1e3, np.array(cpu) * 1e3
            out[name][n] = {"wall_ms_median": float(np.median(w)),
                            "wall_ms_p99": float(np.percentile(w, 99)),
                            "cpu_ms_median": float(np.median(c)),
                            "cpu_ms_p99": float(np.percentile(c, 99)),
                            "cpu_us_per_worker": float(np.median(c) / n * 1e3)}
            print(f"  {name} n={n}: {out[name][n]['cpu_ms_median']:.3f} ms CPU", flush=True)
    return out


#: NARX's CPU per call on the code of a tree (argv[1]), sizes argv[2]: run in its own process
_COST_IN_TREE = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import mxlbbsp
from mxlbbsp import predictors
assert os.path.dirname(os.path.dirname(os.path.abspath(mxlbbsp.__file__))) == sys.argv[1]
out = {}
for n in json.loads(sys.argv[2]):
    rng = np.random.default_rng(0)
    p = predictors.create("narx", n, 3)
    data = [(100 + rng.normal(0, 5, n), rng.normal(50, 5, (n, 3))) for _ in range(400)]
    forecast, learn = [], []
    for k, (speed, exog) in enumerate(data):
        c0 = time.process_time()
        p.observe(speed, exog)
        p.predict()
        c1 = time.process_time()
        p.learn()
        if k >= 100:
            forecast.append(c1 - c0)
            learn.append(time.process_time() - c1)
    out[n] = [1e3 * float(np.median(forecast)), 1e3 * float(np.median(learn))]
print(json.dumps(out))
"""


def cost_against(rev, sizes=(2, 16, 256, 1024), rounds=4) -> dict:
    """NARX's CPU per call on this tree and on the code of ``rev`` (a temporary git worktree),
    side by side: each in a process of its own, in ABBA order over ``rounds``; observe +
    predict (on the coordinator's critical path) and learn (after the split is sent), median
    over 300 calls per size after 100 warm-up calls, one BLAS thread."""
    runs = {"this tree": [], rev: []}
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    import _common
    with _common.worktree(rev) as tree:
        for r in range(rounds):
            order = [("this tree", ROOT), (rev, str(tree))]
            for label, where in order if r % 2 == 0 else order[::-1]:
                res = subprocess.run([sys.executable, "-c", _COST_IN_TREE, where,
                                      json.dumps(list(sizes))], cwd=tree.parent, env=env,
                                     capture_output=True, text=True, check=True)
                runs[label].append(json.loads(res.stdout))
            print(f"  round {r + 1}/{rounds}", flush=True)
    return {"rev": rev, "sizes": list(sizes), "runs": runs}


def _against_table(against) -> list:
    rev, runs = against["rev"], against["runs"]
    lines = [f"## NARX's cost against {rev}, side by side", "",
             f"CPU ms per call, median over {len(runs[rev])} rounds in ABBA order (each "
             "round: a process per tree, the median of 300 calls); ratio: "
             f"{rev} / this tree, per round.", "",
             f"| n | observe + predict: {rev} | this tree | ratio per round | "
             f"learn: {rev} | this tree |", "|---|---|---|---|---|---|"]
    for n in against["sizes"]:
        old = [r[str(n)] for r in runs[rev]]
        new = [r[str(n)] for r in runs["this tree"]]
        ratios = ", ".join(f"{a[0] / b[0]:.2f}" for a, b in zip(old, new))
        lines.append(f"| {n} | {np.median([o[0] for o in old]):.3f} | "
                     f"{np.median([w[0] for w in new]):.3f} | {ratios} | "
                     f"{np.median([o[1] for o in old]):.3f} | "
                     f"{np.median([w[1] for w in new]):.3f} |")
    return lines + [""]


def _family_table(fam) -> list:
    lines = ["| family | lead | NARX / best | narx-adam / best | oracle / best | NARX / oracle "
             "| curve-free floor / oracle | NARX / oracle, levels seen before | best MAPE % "
             "| target |", "|---|---|---|---|---|---|---|---|---|---|"]
    for fname, e in fam.items():
        n = e["narx"]
        if e["lead"] is None:
            target = "<= 1.05x best: " + ("met" if n["ratio"] <= 1.05 else "**not met**")
        elif e["lead"] >= 1:
            ok = n["ratio"] <= 0.7 and n["to_oracle"] <= 1.3
            target = "<= 0.7x best, <= 1.3x oracle: " + ("met" if ok else (
                "0.7x met, 1.3x oracle **not met**" if n["ratio"] <= 0.7 else "**not met**"))
        else:
            target = "(none: the reading does not lead)"
        adam = e.get("narx-adam", {}).get("ratio")
        seen = f"{n['to_oracle_seen']:.2f}" if e["lead"] else "-"   # no level is foreseen
        floor = f"{e['curve_free_floor']:.2f}" if e["lead"] else "-"
        lines.append(f"| {fname} | {e['lead']} | {n['ratio']:.2f} | "
                     f"{'' if adam is None else f'{adam:.2f}'} | {e['oracle_ratio']:.2f} | "
                     f"{n['to_oracle']:.2f} | {floor} | {seen} | {e['best_mape']:.2f} | {target} |")
    return lines


def markdown(doc) -> str:
    lines = [f"<!-- generated by {doc['command']} -->", "",
             "# Speed predictors: one-step-ahead accuracy and cost", "",
             "## Generator families", "",
             f"Mean over seeds {list(doc['seeds'])} (2 ranks x 600 iterations each) of the "
             "ratio of one-step MAPEs on the same trace; best = the best of last value, EMA "
             "and AR on that trace; oracle = knows base speed, curve and loads (the noise "
             "floor). 'Curve-free floor': what a learner that knows everything but the curve "
             "could reach at best: the oracle's error on every step, except each rank's first "
             "switch of load (to a second level while only one has been seen), where it can "
             "only repeat the last speed (no slope is known yet); it counts the "
             "steps to a third level as free, so it is generous. 'Levels seen before': the "
             "same ratio over the steps whose load level "
             "the trace had already shown at least once, leaving out the first step at each "
             "new level (about a dozen of 1,200 steps per trace), whose speed no learner "
             "without the curve can know. Hyperparameters were tuned on other seeds "
             f"({list(TUNE_SEEDS)}, `--tune`).", ""]
    lines += _family_table(doc["families"])
    lines += ["", "## Recorded traces", "",
              "MAPE % (RMSE in samples/s), one step ahead per rank (`mxlbbsp predict`); "
              "**bold**: the best. NARX with the default inputs (`--exog auto`), with "
              "cpu_percent and mem_percent only, with every column, with the three tail "
              "columns only (the last quarter of the compute phase, mxlbbsp/core/signals.py), and "
              "with none.", ""]
    names = PREDICTORS + ["narx (cpu, mem)", "narx (all)", "narx (tail)", "narx (none)"]
    lines.append("| trace | rows | NARX / best | " + " | ".join(names) + " |")
    lines.append("|---|---|---|" + "---|" * len(names))
    for tname, entry in doc["accuracy"].items():
        res = entry["result"]
        best = min(r["mape"] for r in res.values())
        cells = []
        for n in names:
            if n not in res:                 # a trace recorded before the tail columns
                cells.append("-")
                continue
            text = f"{res[n]['mape']:.2f} ({res[n]['rmse']:.3g})"
            cells.append(f"**{text}**" if res[n]["mape"] == best else text)
        ratio = res["narx"]["mape"] / best_baseline(res)
        lines.append(f"| {tname} | {doc['rows'][tname]} | {ratio:.2f} | " + " | ".join(cells)
                     + " |")
    lines += ["", "NARX fallbacks (non-finite or absurd forecasts) over the recorded traces: "
              f"{sum(e['result']['narx']['fallbacks'] for e in doc['accuracy'].values())}.", ""]
    if all("hindsight" in e for e in doc["accuracy"].values()):
        lines += ["What the signals could tell at most, roughly (`hindsight`): the next speed "
                  "from the last speed and a set of signal columns by 10 nearest neighbours, "
                  "each half of a rank's series predicted from the other half, the best set "
                  "chosen on the same data. It uses the future, so it is a generous ceiling "
                  "for an online predictor, not one.", "",
                  "| trace | NARX / best | hindsight / best | hindsight MAPE % | its columns "
                  "(besides the last speed) |", "|---|---|---|---|---|"]
        for tname, entry in doc["accuracy"].items():
            res, h = entry["result"], entry["hindsight"]
            b = best_baseline(res)
            lines.append(f"| {tname} | {res['narx']['mape'] / b:.2f} | {h['mape'] / b:.2f} | "
                         f"{h['mape']:.2f} | {', '.join(h['columns']) or '(none)'} |")
        lines.append("")
    if doc["cost"]:
        lines += ["## Cost per call", "",
                  "One `observe()` + `predict()` + `learn()` for n workers at once (what the "
                  "coordinator does each iteration; 3 exogenous columns), one BLAS thread; "
                  "median and p99 over 300 calls (200 at n = 1024). Load average during the "
                  f"run: {doc['loadavg_before']} (before), {doc['loadavg_after']} (after) on "
                  f"{os.cpu_count()} cores.", "",
                  "| predictor | n | CPU ms median | CPU ms p99 | wall ms median | wall ms p99 | "
                  "CPU us / worker |", "|---|---|---|---|---|---|---|"]
        for name, per_n in doc["cost"].items():
            for n, c in per_n.items():
                lines.append(f"| {name} | {n} | {c['cpu_ms_median']:.3f} | "
                             f"{c['cpu_ms_p99']:.3f} | {c['wall_ms_median']:.3f} | "
                             f"{c['wall_ms_p99']:.3f} | {c['cpu_us_per_worker']:.1f} |")
    if doc.get("against"):
        lines += [""] + _against_table(doc["against"])
    lines += ["", "## Traces", ""]
    for info in doc["recorded"]:
        tenants = "; ".join(f"{t['kind']} (duty {t.get('duty', 1.0):g}"
                            + (f", core {t['core']}" if "core" in t else "")
                            + f"), {t['schedule']} {t['on_s']:g} s on / {t['off_s']:g} s off"
                            for t in info.get("tenants", []))
        pinned = ", each pinned to its own core" if info.get("pin") else ""
        lines.append(f"- `{info['name']}`: {info['rows']} rows, {info['model']} (global batch "
                     f"{info['batch']}), `--sync {info['sync']}`, 2 workers{pinned}; tenants: "
                     f"{tenants}; recorded {info['recorded']} (load average after, the job "
                     f"and its tenants included: {info.get('loadavg_after')}) with "
                     f"`{info['command']}`")
    lines += ["", f"Command: `{doc['command']}` (from the repository root, in .venv)  ",
              f"Machine: {doc['machine']}  ", f"Date: {doc['date']}", ""]
    return "\n".join(lines)


def tune_markdown(doc) -> str:
    lines = [f"<!-- generated by {doc['command']} -->", "", "# NARX variants (tuning seeds)", "",
             f"NARX / best baseline per family, mean over the tuning seeds {list(TUNE_SEEDS)} "
             "(not the reported ones).", ""]
    fams = list(next(iter(doc["variants"].values())))
    lines += ["| variant | " + " | ".join(fams) + " |", "|---|" + "---|" * len(fams)]
    for label, per in doc["variants"].items():
        lines.append(f"| {label} | " + " | ".join(f"{per[f]:.2f}" for f in fams) + " |")
    return "\n".join(lines) + "\n"


def _machine() -> str:
    return (f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
            f"numpy {np.__version__}, {platform.platform()}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tune", action="store_true",
                   help="score NARX's variants on the tuning seeds (and nothing else)")
    p.add_argument("--no-cost", action="store_true", help="skip the cost measurement")
    p.add_argument("--baseline", metavar="REV",
                   help="also NARX's cost on the code of this commit, side by side (~2 min)")
    p.add_argument("--smoke", action="store_true",
                   help="smallest size (seconds): checks that the script runs; the results "
                        "go to $MXLBBSP_BENCH_RESULTS or a temporary folder")
    args = p.parse_args(argv)
    global RESULTS
    seeds, cost_args, against_args = REPORT_SEEDS, {}, {}
    if args.smoke:           # one seed, 150 iterations per family, small sizes, few calls
        import tempfile
        RESULTS = os.environ.get("MXLBBSP_BENCH_RESULTS") or tempfile.mkdtemp(
            prefix="bench-smoke-")
        seeds = REPORT_SEEDS[:1]
        BASE_FAMILY["T"] = 150
        cost_args = {"sizes": (1, 16), "calls": 20}
        against_args = {"sizes": (2, 16), "rounds": 1}
    command = "python benchmarks/predictors.py" + (" --tune" if args.tune else "") \
        + (" --no-cost" if args.no_cost else "") \
        + (f" --baseline {args.baseline}" if args.baseline else "")
    print(f"reproduce with: {command}", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    date = datetime.datetime.now().isoformat(timespec="seconds")
    if args.tune:
        doc = {"command": command, "date": date, "machine": _machine(), "variants": {}}
        for label, options in VARIANTS:
            fam = families(TUNE_SEEDS, ("narx",), {"narx": options}, quiet=True)
            doc["variants"][label] = {f: e["narx"]["ratio"] for f, e in fam.items()}
            print(f"  {label:<44}" + " ".join(f"{e['narx']['ratio']:.2f}"
                                              for e in fam.values()), flush=True)
        with open(os.path.join(RESULTS, "predictors_tune.json"), "w") as fh:
            json.dump(doc, fh, indent=1)
        with open(os.path.join(RESULTS, "predictors_tune.md"), "w") as fh:
            fh.write(tune_markdown(doc))
        return 0
    traces, recorded = {}, []
    for path in sorted(glob.glob(os.path.join(TRACES, "*.csv"))):
        name = os.path.splitext(os.path.basename(path))[0]
        traces[name] = _trace.load(path)
        sidecar = os.path.splitext(path)[0] + ".json"
        if os.path.exists(sidecar):
            with open(sidecar) as fh:
                recorded.append(json.load(fh))
    doc = {"command": command, "date": date, "machine": _machine(), "recorded": recorded,
           "rows": {n: t.rows for n, t in traces.items()}, "seeds": list(seeds),
           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    print("generator families ...", flush=True)
    doc["families"] = families(seeds)
    print("recorded traces ...", flush=True)
    doc["accuracy"] = accuracy(traces)
    doc["cost"] = {} if args.no_cost else cost(PREDICTORS, **cost_args)
    if args.baseline:
        print(f"NARX's cost against {args.baseline} ...", flush=True)
        doc["against"] = cost_against(args.baseline, **against_args)
    doc["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    with open(os.path.join(RESULTS, "predictors.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    text = markdown(doc)
    with open(os.path.join(RESULTS, "predictors.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
