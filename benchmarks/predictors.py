"""Evaluate the speed predictors on every trace in benchmarks/traces/ and measure their cost.

    python benchmarks/predictors.py              # accuracy on all traces + cost per call
    python benchmarks/predictors.py --variants   # also NARX's hyperparameter variants

Writes benchmarks/results/predictors.json and benchmarks/results/predictors.md.

Accuracy: every trace is replayed one step ahead per rank (mxlbbsp.trace.evaluate, the same
code as ``mxlbbsp predict``). The recorded traces carry an extra column, ``runq`` (see
record_traces.py); NARX is scored with it ("narx") and without it ("narx (cpu, mem)": what
the coordinator feeds it at run time). Two seeded synthetic traces are scored as well: load
switches that show in cpu_percent one iteration early ("synthetic lead"), and switches with no
exogenous signal ("synthetic no signal").

Cost: one observe() + predict() for n workers at once, as the coordinator calls it, median and
99th percentile over 300 calls (200 for n = 1024) after 100 warm-up calls, in wall-clock and
process CPU time, with one BLAS thread. The machine is shared: its load average is recorded
next to the numbers, and CPU time is the fairer figure when it is busy.
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
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mxlbbsp import predictors as _pred  # noqa: E402
from mxlbbsp import trace as _trace  # noqa: E402

PREDICTORS = ["narx", "last", "ema", "ar"]
TRACES = os.path.join(ROOT, "benchmarks", "traces")
RESULTS = os.path.join(ROOT, "benchmarks", "results")

#: NARX variants of the --variants table: (label, options); the first is the default
VARIANTS = [
    ("default", {}),
    ("loss=mse", {"loss": "mse"}),
    ("gate=none", {"gate": "none"}),
    ("gate=hard", {"gate": "hard"}),
    ("loss=mse, gate=none", {"loss": "mse", "gate": "none"}),
    ("lr=0.01", {"lr": 0.01}),
    ("lr=0.01, steps=2", {"lr": 0.01, "steps": 2}),
    ("batch=16, steps=2", {"batch": 16, "steps": 2}),
    ("window=64", {"window": 64}),
    ("window=256", {"window": 256}),
    ("hidden=4", {"hidden": 4}),
    ("hidden=16", {"hidden": 16}),
    ("d_y=2", {"d_y": 2}),
    ("d_y=5", {"d_y": 5}),
    ("d_x=2", {"d_x": 2}),
    ("decay=1e-2", {"decay": 1e-2}),
    ("warmup=5", {"warmup": 5}),
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


def family(seed, levels=3, rate=0.1, lead=1, noise=0.03, curve="convex", T=600, ranks=2):
    """(rows, oracle MAPE %). Load switches at random (probability ``rate`` per iteration)
    among ``levels`` levels in [0, 1]; speed = base g(load) exp(N(0, noise)); the reading
    (cpu) shows the load ``lead`` iterations before the speed (None: a flat reading), plus
    N(0, 3) noise; a second column is irrelevant. The oracle knows base, g and the loads
    the readings reveal (load of t+1 when lead >= 1, else of t)."""
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


def from_rows(name, rows) -> _trace.Trace:
    ranks = {}
    for r in sorted({row[1] for row in rows}):
        mine = [row for row in rows if row[1] == r]
        ranks[r] = _trace.RankSeries(np.array([row[0] for row in mine]),
                                     np.array([row[2] for row in mine], dtype=float),
                                     np.array([row[3:] for row in mine], dtype=float))
    return _trace.Trace(name, ["cpu_percent", "mem_percent"], ranks)


def without_extra_columns(trace: _trace.Trace) -> _trace.Trace:
    ranks = {r: _trace.RankSeries(s.iteration, s.speed, s.exog[:, :2])
             for r, s in trace.ranks.items()}
    return _trace.Trace(trace.path, trace.exog_columns[:2], ranks)


def accuracy(traces) -> dict:
    out = {}
    for name, trace in traces.items():
        res = _trace.evaluate(trace, PREDICTORS)
        if len(trace.exog_columns) > 2:
            res["narx (cpu, mem)"] = _trace.evaluate(without_extra_columns(trace), ["narx"])["narx"]
        out[name] = res
    return out


def variants(traces) -> dict:
    """MAPE of each NARX variant / best of last and EMA, per trace group (mean over traces)."""
    base = {}
    for name, trace in traces.items():
        r = _trace.evaluate(trace, ["last", "ema"])
        base[name] = min(r["last"]["mape"], r["ema"]["mape"])
    out = {}
    for label, options in VARIANTS:
        ratios = {}
        for name, trace in traces.items():
            r = _trace.evaluate(trace, ["narx"], {"narx": options})["narx"]
            ratios[name] = r["mape"] / base[name]
        out[label] = {"options": options, "ratios": ratios}
        print(f"  {label:<22}" + " ".join(f"{v:.3f}" for v in ratios.values()), flush=True)
    return out


def cost(names, sizes=(1, 16, 256, 1024)) -> dict:
    out = {}
    for name in names:
        out[name] = {}
        for n in sizes:
            calls = 300 if n < 1024 else 200
            rng = np.random.default_rng(0)
            p = _pred.create(name, n, 2)
            data = [(100 + rng.normal(0, 5, n), rng.normal(50, 5, (n, 2)))
                    for _ in range(100 + calls)]
            wall, cpu = [], []
            for k, (speed, exog) in enumerate(data):
                w0, c0 = time.perf_counter(), time.process_time()
                p.observe(speed, exog)
                p.predict()
                if k >= 100:
                    cpu.append(time.process_time() - c0)
                    wall.append(time.perf_counter() - w0)
            w, c = np.array(wall) * 1e3, np.array(cpu) * 1e3
            out[name][n] = {"wall_ms_median": float(np.median(w)),
                            "wall_ms_p99": float(np.percentile(w, 99)),
                            "cpu_ms_median": float(np.median(c)),
                            "cpu_ms_p99": float(np.percentile(c, 99)),
                            "cpu_us_per_worker": float(np.median(c) / n * 1e3)}
    return out


def markdown(doc) -> str:
    lines = [f"<!-- generated by {doc['command']} -->", "",
             "# Speed predictors: one-step-ahead accuracy and cost", "",
             "MAPE % (RMSE in samples/s) of each predictor, replaying each trace one step ahead "
             "per rank (`mxlbbsp predict`); **bold**: the best. `narx (cpu, mem)`: NARX without "
             "the recorded traces' extra `runq` column, i.e. with what the coordinator gives it "
             "at run time.", ""]
    names = PREDICTORS + ["narx (cpu, mem)"]
    lines.append("| trace | rows | " + " | ".join(names) + " |")
    lines.append("|---|---|" + "---|" * len(names))
    for tname, res in doc["accuracy"].items():
        best = min(r["mape"] for r in res.values())
        cells = []
        for n in names:
            if n not in res:
                cells.append("")
                continue
            text = f"{res[n]['mape']:.2f} ({res[n]['rmse']:.3g})"
            cells.append(f"**{text}**" if res[n]["mape"] == best else text)
        lines.append(f"| {tname} | {doc['rows'][tname]} | " + " | ".join(cells) + " |")
    lines += ["", "NARX fallbacks (non-finite or absurd forecasts) over all traces: "
              f"{sum(r['narx']['fallbacks'] for r in doc['accuracy'].values())}.", ""]
    if doc.get("variants"):
        tr = list(next(iter(doc["variants"].values()))["ratios"])
        lines += ["## NARX variants", "",
                  "MAPE of the variant / MAPE of the best of last and EMA on the same trace "
                  "(< 1: NARX is better). Synthetic groups are means over seeds "
                  f"{doc['variant_seeds']}.", "",
                  "| variant | " + " | ".join(tr) + " |", "|---|" + "---|" * len(tr)]
        for label, v in doc["variants"].items():
            lines.append(f"| {label} | " + " | ".join(f"{x:.3f}" for x in v["ratios"].values())
                         + " |")
        lines.append("")
    lines += ["## Cost per call", "",
              "One `observe()` + `predict()` for n workers at once (what the coordinator does "
              "each iteration), one BLAS thread; median and p99 over "
              "300 calls (200 at n = 1024). Load average during the run: "
              f"{doc['loadavg_before']} (before), {doc['loadavg_after']} (after) on "
              f"{os.cpu_count()} cores.", "",
              "| predictor | n | CPU ms median | CPU ms p99 | wall ms median | wall ms p99 | "
              "CPU us / worker |", "|---|---|---|---|---|---|---|"]
    for name, per_n in doc["cost"].items():
        for n, c in per_n.items():
            lines.append(f"| {name} | {n} | {c['cpu_ms_median']:.3f} | {c['cpu_ms_p99']:.3f} | "
                         f"{c['wall_ms_median']:.3f} | {c['wall_ms_p99']:.3f} | "
                         f"{c['cpu_us_per_worker']:.1f} |")
    lines += ["", "## Traces", ""]
    for info in doc["recorded"]:
        lines.append(f"- `{info['name']}`: {info['rows']} rows, {info['model']} (global batch "
                     f"{info['batch']}), `--sync {info['sync']}`, 2 workers; tenant: "
                     f"{info['tenant_procs']} busy-loop process, {info['schedule']} "
                     f"{info['on_s']:g} s on / {info['off_s']:g} s off; recorded "
                     f"{info['recorded']} with `{info['command']}`")
    lines += ["- `synthetic lead`, `synthetic no signal`: generated by this script (seeds 1 "
              "and 2, 600 iterations x 2 ranks), as in tests/test_predict_cli.py.", "",
              f"Command: `{doc['command']}` (from the repository root, in .venv)  ",
              f"Machine: {doc['machine']}  ", f"Date: {doc['date']}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", action="store_true",
                   help="also score NARX's hyperparameter variants (a few minutes)")
    p.add_argument("--no-cost", action="store_true", help="skip the cost measurement")
    args = p.parse_args(argv)
    command = "python benchmarks/predictors.py" + (" --variants" if args.variants else "") \
        + (" --no-cost" if args.no_cost else "")
    print(f"reproduce with: {command}", flush=True)
    traces, recorded = {}, []
    for path in sorted(glob.glob(os.path.join(TRACES, "*.csv"))):
        name = os.path.splitext(os.path.basename(path))[0]
        traces[name] = _trace.load(path)
        sidecar = os.path.splitext(path)[0] + ".json"
        if os.path.exists(sidecar):
            with open(sidecar) as fh:
                recorded.append(json.load(fh))
    traces["synthetic lead"] = from_rows("synthetic lead", switching(seed=1, lead=True))
    traces["synthetic no signal"] = from_rows(
        "synthetic no signal", switching(seed=2, p_switch=0.05, drop=0.4, lead=False))
    doc = {"command": command, "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python "
                      f"{platform.python_version()}, numpy {np.__version__}, "
                      f"{platform.platform()}",
           "recorded": recorded, "rows": {n: t.rows for n, t in traces.items()},
           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    print("accuracy ...", flush=True)
    doc["accuracy"] = accuracy(traces)
    if args.variants:
        seeds = [10, 11, 12, 13, 14]
        doc["variant_seeds"] = seeds
        groups = {}
        for name, trace in traces.items():
            if not name.startswith("synthetic"):
                groups[name] = [trace]
        groups["synthetic lead"] = [from_rows("", switching(seed=s)) for s in seeds]
        groups["synthetic no signal"] = [
            from_rows("", switching(seed=s, p_switch=0.05, drop=0.4, lead=False)) for s in seeds]
        groups["synthetic AR(1)"] = [from_rows("", ar1(seed=s)) for s in seeds]
        flat = {f"{g}#{k}": t for g, ts in groups.items() for k, t in enumerate(ts)}
        print("NARX variants (ratio to the best of last and EMA) ...", flush=True)
        per_trace = variants(flat)
        doc["variants"] = {label: {"options": v["options"], "ratios": {
            g: float(np.mean([v["ratios"][f"{g}#{k}"] for k in range(len(ts))]))
            for g, ts in groups.items()}} for label, v in per_trace.items()}
    if not args.no_cost:
        print("cost ...", flush=True)
        doc["cost"] = cost(PREDICTORS)
    else:
        doc["cost"] = {}
    doc["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    os.makedirs(RESULTS, exist_ok=True)
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
