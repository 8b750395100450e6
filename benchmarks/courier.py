"""Courier: meet a deadline when a tenant arrives mid-run — re-planning B(t) against Courier's
one-off choice from a profile.

4 workers train an MLP on scikit-learn's digits for --epochs epochs; every sample also costs
--emulate-compute ms of EMULATED compute (slept), so a larger global batch pays off only by
amortising the per-iteration cost (push/pull and Python), as in the Courier paper. The
learning rate follows the batch linearly (lr 0.05 at B = 64) in every run.

1. Profile: 25 iterations of LB-BSP at B = 64 on the quiet cluster; `mxlbbsp plan`'s model
   (mxlbbsp.courier.fit_time_models) predicts every candidate B's time. The deadline is set
   to the startup plus --slack x the predicted time at --target-batch, so that on the quiet
   cluster a small batch would meet it.
2. Courier's static choice: the smallest candidate B predicted (from the profile) to meet the
   deadline, fixed for the whole run (what Courier does, once, before the job starts).
3. Rounds (each with its own seed and tenant): a tenant arrives at a random moment and slows
   two of the four workers 3x for a random while (a time-based slowdown trace: it hits every
   run at the same moment, whatever its batch size). Side by side in the same round: the
   static choice, and `--sync courier` re-planning B(t) with the same deadline.
4. Accuracy: every fixed B of Courier's grid (64, 128, 256, 512) under round 0's tenant; the
   final test accuracy of those that meet the deadline, next to the re-planning run's.

    python benchmarks/courier.py --quick     # 3 rounds (~6 min on an idle machine)
    python benchmarks/courier.py             # 10 rounds (~13 min)
"""
import argparse
import json
import math
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import _common as C
import _suite as S
from mxlbbsp import courier as _courier
from mxlbbsp import metrics as _metrics

WORKERS = 4
BASE_B, BASE_LR = 64, 0.05
GRID = (64, 128, 256, 512)
ACC = re.compile(r"epoch (\d+): test accuracy ([\d.]+)")
DONE = re.compile(r"done in ([\d.]+) s")


def train_args(batch, epochs, seed):
    lr = BASE_LR * batch / BASE_B
    return ["--model", "mlp", "--data", "digits", "--epochs", str(epochs), "--batch-size",
            str(batch), "--lr", f"{lr:.6g}", "--momentum", "0.9", "--seed", str(seed),
            "--log-interval", "0", "--eval"]


def run(tmp: Path, name: str, batch: int, epochs: int, seed: int, compute_ms: float,
        tenant: Path = None, courier: dict = None) -> dict:
    """One job; returns wall time (launch to end, as the deadline counts), final accuracy,
    and its metrics path."""
    metrics = tmp / f"{name}.jsonl"
    log = tmp / f"{name}.log"
    launch = ["--emulate-compute", str(compute_ms)]
    if tenant is not None:
        launch += ["--emulate-slowdown", str(tenant)]
    sync = "lbbsp"
    if courier:
        sync = "courier"
        launch += ["--deadline", f"{courier['deadline_s']:.3f}s", "--batch-range",
                   courier["range"], "--epochs", str(epochs), "--lr-scaling", "linear"]
    started, launched = time.monotonic(), time.time()
    C.launch(WORKERS, train_args(batch, epochs, seed), metrics, sync=sync, launch_args=launch,
             log=log)
    wall = time.monotonic() - started
    text = log.read_text()
    acc = [float(m[2]) for m in ACC.finditer(text)]
    recs = _metrics.load(str(metrics))
    Bs = {}
    for r in recs:
        Bs[r["iteration"]] = Bs.get(r["iteration"], 0) + int(r["batch_size"])
    # the job's time: from the launch to the end of its last iteration (the teardown of the
    # processes after it is left out: no batch size changes it)
    end = max(r["time"] + (r.get("sync_s") or 0.0) for r in recs)
    return {"job_s": end - launched, "wall_s": wall,
            "accuracy": acc[-1] if acc else math.nan, "metrics": str(metrics),
            "iterations": len(Bs), "batches": sorted(set(Bs.values())),
            "mean_batch": float(np.mean(list(Bs.values())))}


def tenant_trace(path: Path, rng, horizon_s: float) -> dict:
    """Two of the four workers 3x slower from a random moment, for a random while (seconds
    from the job's registration)."""
    start = rng.uniform(0.2, 0.4) * horizon_s
    length = rng.uniform(0.3, 0.5) * horizon_s
    slow = sorted(rng.choice(WORKERS, size=2, replace=False).tolist())
    rows = ["time_s,rank,slowdown"] + [f"0,{r},1" for r in range(WORKERS)]
    for r in slow:
        rows += [f"{start:.2f},{r},3", f"{start + length:.2f},{r},1"]
    path.write_text("\n".join(rows) + "\n")
    return {"start_s": round(start, 2), "length_s": round(length, 2), "ranks": slow}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--rounds", type=int)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--emulate-compute", type=float, default=2.0, metavar="MS")
    p.add_argument("--target-batch", type=int, default=96,
                   help="the deadline is what this batch is predicted to need (x --slack)")
    p.add_argument("--slack", type=float, default=1.25)
    p.add_argument("--batch-range", default="64:1024")
    args = p.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    name = "courier_quick" if args.quick else "courier"
    S.wait_for_quiet(patience_s=60 if args.quick else 600)
    lo, hi = _courier.parse_batch_range(args.batch_range, WORKERS)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        # 1. profile
        C.progress("profile: 25 iterations at B=64 on the quiet cluster")
        prof = tmp / "profile.jsonl"
        t0 = time.time()
        subprocess.run([C.PY, "-m", "mxlbbsp.launcher", "launch", "-n", str(WORKERS),
                        "--metrics", str(prof), "--progress", "0", "--emulate-compute",
                        str(args.emulate_compute), "--", C.PY, str(C.EXAMPLE),
                        *train_args(BASE_B, 1, 0), "--iterations", "25"],
                       cwd=C.ROOT, env=C.env(), check=True, capture_output=True, text=True)
        recs = _metrics.load(str(prof))
        startup = min(r["time"] for r in recs) - t0        # launch to the first report
        ranks, model, sync_s = _courier.fit_time_models(recs)
        N = 1797 - 360   # digits' training split (datasets.load keeps 20% for the test)
        work = _courier.Work(0, N, args.epochs)
        rows = _courier.plan(model, sync_s, work, _courier.candidates(lo, hi))
        target = min(rows, key=lambda r: abs(r.batch - args.target_batch))
        deadline = startup + args.slack * target.finish_s
        rows = _courier.plan(model, sync_s, work, _courier.candidates(lo, hi),
                             deadline - startup)
        static_B, _ = _courier.choose(rows)
        C.progress(f"startup {startup:.1f} s, deadline {deadline:.1f} s from launch; Courier's "
                   f"static choice from the profile: B={static_B}")
        # 3. rounds
        results = []
        rng = np.random.default_rng(2026)
        horizon = deadline - startup
        for k in range(rounds):
            tenant = tmp / f"tenant{k}.csv"
            trace = tenant_trace(tenant, rng, horizon)
            res = {"tenant": trace}
            for mode in S.order(["static", "courier"], k):
                C.progress(f"round {k + 1}/{rounds}: {mode} (tenant {trace})")
                if mode == "static":
                    res[mode] = run(tmp, f"static{k}", static_B, args.epochs, k,
                                    args.emulate_compute, tenant)
                else:
                    res[mode] = run(tmp, f"courier{k}", BASE_B, args.epochs, k,
                                    args.emulate_compute, tenant,
                                    {"deadline_s": deadline, "range": args.batch_range})
                res[mode]["meets"] = res[mode]["job_s"] <= deadline
            results.append(res)
        figure = S.figures({"courier": Path(results[0]["courier"]["metrics"])},
                           C.RESULTS / name)
        # 4. accuracy of every fixed B of the grid under round 0's tenant
        sweep = {}
        for B in GRID:
            if lo <= B <= hi:
                C.progress(f"accuracy sweep: fixed B={B} under round 1's tenant")
                sweep[B] = run(tmp, f"fixed{B}", B, args.epochs, 0, args.emulate_compute,
                               tmp / "tenant0.csv")
                sweep[B]["meets"] = sweep[B]["job_s"] <= deadline
    for res in results:
        for mode in ("static", "courier"):
            res[mode].pop("metrics", None)
    for s in sweep.values():
        s.pop("metrics", None)
    met = {m: sum(r[m]["meets"] for r in results) for m in ("static", "courier")}
    meeting = {B: s for B, s in sweep.items() if s["meets"]}
    best_fixed = max((s["accuracy"] for s in meeting.values()), default=math.nan)
    acc0 = results[0]["courier"]["accuracy"]
    lines = [f"## Courier: {WORKERS} workers, MLP on digits, {args.epochs} epochs, "
             f"{args.emulate_compute:g} ms/sample emulated compute",
             "",
             f"Deadline {deadline:.1f} s from launch (startup {startup:.1f} s + {args.slack} x "
             f"the profile's prediction at B={target.batch}); Courier's static choice from the "
             f"profile: **B = {static_B}**. A tenant slows 2 of 4 workers 3x for a random while.",
             "",
             "A job's time: from the launch to the end of its last iteration (the processes' "
             "teardown after it is left out).",
             "",
             f"Deadline met: re-planning (`--sync courier`) **{met['courier']}/{rounds}**, "
             f"static choice **{met['static']}/{rounds}**.",
             "",
             "| round | tenant (start, length, ranks) | static: time | met | acc | "
             "courier: time | met | acc | B(t) range | mean B |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k, r in enumerate(results):
        s, c, t = r["static"], r["courier"], r["tenant"]
        lines.append(f"| {k + 1} | {t['start_s']:.1f} s, {t['length_s']:.1f} s, {t['ranks']} | "
                     f"{s['job_s']:.1f} s | {'yes' if s['meets'] else 'no'} | "
                     f"{s['accuracy']:.4f} | {c['job_s']:.1f} s | "
                     f"{'yes' if c['meets'] else 'no'} | {c['accuracy']:.4f} | "
                     f"{min(c['batches'])}-{max(c['batches'])} | {c['mean_batch']:.0f} |")
    lines += ["", "Fixed batch sizes under round 1's tenant (lr linear in B):", "",
              "| B | time | meets the deadline | final test accuracy |", "|---|---|---|---|"]
    for B, s in sweep.items():
        lines.append(f"| {B} | {s['job_s']:.1f} s | {'yes' if s['meets'] else 'no'} | "
                     f"{s['accuracy']:.4f} |")
    lines += ["", f"Re-planning in round 1: accuracy {acc0:.4f}; the best fixed B that meets "
              f"the deadline: {best_fixed:.4f} (difference "
              f"{100 * (acc0 - best_fixed):+.2f} points)." if math.isfinite(best_fixed) else
              "", f"Figures of round 1's re-planning run: [{figure}]({figure})"]
    C.write(name, {"deadline_s": deadline, "startup_s": startup, "static_batch": static_B,
                   "profile": {"speed": model.speed.tolist(),
                               "fixed_s": model.intercept.tolist(), "sync_s": sync_s},
                   "rounds": results, "sweep": {str(B): s for B, s in sweep.items()},
                   "met": met}, "\n".join(lines))


if __name__ == "__main__":
    main()
