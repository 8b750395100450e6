"""Courier: which policy meets a deadline, over deadlines across the feasible range and seeds.

4 workers, one steadily 3x slower (``--emulate-slowdown 1,1,3,1``: steady speeds), train an
MLP on scikit-learn's digits for --epochs epochs; every sample also costs --emulate-compute ms
of EMULATED compute (slept), so a larger global batch pays off by amortising the per-iteration
cost (push/pull and Python), as in the Courier paper. The learning rate is linear in B
(lr 0.05 at B = 64, momentum 0.9) in every run.

1. Profile: two short LB-BSP runs, at B = 64 and B = 256 (a profile at one B cannot tell the
   fixed cost per iteration from the per-sample cost: ``mxlbbsp plan`` refuses it); their
   records pooled give ``mxlbbsp plan``'s time models and each B's predicted job time
   (startup, measured from the launch to the first report, plus the plan's finish time).
2. Deadlines: --deadlines values spread evenly across the feasible range, from 1.05 x the
   fastest predicted job time (B = 1024) to the slowest (B = 64); chosen without looking at
   any policy.
3. Policies, for each deadline and seed:

   * **static**: Courier's one-off choice from the profile, the smallest B of Courier's grid
     (64, 128, 256, 512, 1024) predicted to meet the deadline (else the fastest), fixed;
   * **best fixed B**: in hindsight, the smallest B of the grid whose fixed run of that seed
     met the deadline (what an oracle choosing once would pick);
   * **courier**: ``--sync courier --deadline D --batch-range 64:1024`` re-planning B(t).

   Every fixed B runs once per seed (its time does not depend on the deadline), the courier
   runs once per deadline and seed; runs of a seed interleaved (ABBA between seeds).
4. A job's time: from the launch to the end of its last iteration (the deadline counts from
   the launch). Accuracy: rank 0 saves the trained parameters; this script computes the test
   accuracy (360 images) and the held-out cross-entropy of each, averaged over the seeds.
   B changes per epoch of the courier runs: changes of the planned B between iterations,
   leaving out each epoch's short last batch (the rest of the epoch).

    python benchmarks/courier.py --quick     # 10 epochs, 5 deadlines x 3 seeds
    python benchmarks/courier.py             # 20 epochs, 5 deadlines x 3 seeds
"""
import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import _common as C
import _suite as S

from mxlbbsp.core import metrics as _metrics
from mxlbbsp.analysis import profile as _profile
from mxlbbsp.core import planner as _planner

WORKERS = 4
SLOWDOWN = "1,1,3,1"
BASE_B, BASE_LR = 64, 0.05
GRID = (64, 128, 256, 512, 1024)
RANGE = "64:1024"


def train_args(batch, epochs, seed, params=None):
    lr = BASE_LR * batch / BASE_B
    out = ["--model", "mlp", "--data", "digits", "--epochs", str(epochs), "--batch-size",
           str(batch), "--lr", f"{lr:.6g}", "--momentum", "0.9", "--seed", str(seed),
           "--log-interval", "0"]
    return out + (["--save-params", str(params)] if params else [])


def run(tmp: Path, name: str, batch: int, epochs: int, seed: int, compute_ms: float,
        deadline_s: float = None) -> dict:
    """One job; returns its time (launch to the end of its last iteration), its B(t)
    changes and where its parameters are."""
    metrics, log, params = tmp / f"{name}.jsonl", tmp / f"{name}.log", tmp / f"{name}.params"
    launch = ["--emulate-compute", str(compute_ms), "--emulate-slowdown", SLOWDOWN]
    sync = "lbbsp"
    if deadline_s is not None:
        sync = "courier"
        launch += ["--deadline", f"{deadline_s:.3f}s", "--batch-range", RANGE, "--epochs",
                   str(epochs), "--lr-scaling", "linear"]
    launched = time.time()
    C.launch(WORKERS, train_args(batch, epochs, seed, params), metrics, sync=sync,
             launch_args=launch, log=log)
    recs = _metrics.load(str(metrics))
    Bs = {}
    for r in recs:
        Bs[r["iteration"]] = Bs.get(r["iteration"], 0) + int(r["batch_size"])
    end = max(r["time"] + (r.get("sync_s") or 0.0) for r in recs)
    return {"job_s": end - launched, "params": str(params), "iterations": len(Bs),
            "mean_batch": float(np.mean(list(Bs.values()))),
            "changes_per_epoch": changes_per_epoch([Bs[t] for t in sorted(Bs)], N_TRAIN)}


def changes_per_epoch(series, N):
    """Changes of the planned global batch per epoch: iteration 0 (the warm-up at B0) and each
    epoch's short last batch (the rest of the epoch, not a choice) are left out."""
    planned, done = [], 0
    for t, B in enumerate(series):
        epoch = done // N
        done += B
        last = done % N == 0 and t > 0 and B < series[t - 1]
        if t > 0 and not last:
            planned.append((epoch, B))
    per = {}
    for (_, b0), (e1, b1) in zip(planned, planned[1:]):
        per[e1] = per.get(e1, 0) + (b1 != b0)
    return [per.get(e, 0) for e in range(max(per, default=-1) + 1)]


#: digits' training split (datasets.load keeps 20 % of the 1797 images for the test)
N_TRAIN = 1797 - 360


def held_out(params_paths, seed_of):
    """(test accuracy, mean test cross-entropy) of each saved model, on the test split."""
    import mxnet as mx
    from mxnet import gluon
    from mxlbbsp.worker import datasets
    from mxlbbsp.models import get_model
    out, tests = {}, {}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for path in params_paths:
        seed = seed_of[path]
        if seed not in tests:
            tests[seed] = datasets.load("digits", seed=seed)[1]
        net = get_model("mlp", classes=datasets.num_classes("digits"))
        net.load_parameters(path, ctx=mx.cpu())
        acc, loss, n = 0, 0.0, 0
        for data, label in gluon.data.DataLoader(tests[seed], batch_size=512):
            out_ = net(data)
            acc += int((out_.argmax(axis=1) == label.astype("float32")).sum().asscalar())
            loss += float(loss_fn(out_, label).sum().asscalar())
            n += data.shape[0]
        out[path] = (acc / n, loss / n)
    return out


def profile(tmp: Path, args) -> tuple:
    """Two short runs at B = 64 and 256 pooled: (time models, sync_s, startup_s)."""
    recs, startups = [], []
    for B in (64, 256):
        C.progress(f"profile: 25 iterations at B={B}")
        path = tmp / f"profile{B}.jsonl"
        t0 = time.time()
        subprocess.run([C.PY, "-m", "mxlbbsp.launcher", "launch", "-n", str(WORKERS),
                        "--metrics", str(path), "--progress", "0", "--emulate-compute",
                        str(args.emulate_compute), "--emulate-slowdown", SLOWDOWN, "--",
                        C.PY, str(C.EXAMPLE), *train_args(B, 1000, 0), "--iterations",
                        str(args.profile_iterations)],
                       cwd=C.ROOT, env=C.env(), check=True, capture_output=True, text=True)
        part = _metrics.load(str(path))
        startups.append(min(r["time"] for r in part) - t0)     # launch to the first report
        recs += part
    ranks, model, sync_s = _profile.fit_time_models(recs)
    return model, sync_s, float(np.median(startups))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10 epochs")
    C.add_smoke(p)
    p.add_argument("--epochs", type=int, help="default 20 (10 with --quick)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--deadlines", type=int, default=5,
                   help="how many deadlines, evenly across the feasible range")
    p.add_argument("--emulate-compute", type=float, default=2.0, metavar="MS")
    p.add_argument("--profile-iterations", type=int, default=25)
    args = p.parse_args()
    grid = GRID
    if C.smoke(args):        # 2 epochs, 1 seed, 2 deadlines, fixed B 64 and 256; profiles
        # of 16 iterations: at 8 the slowed worker's local batches could scatter over sizes
        # that no fit can tell a fixed cost from (a CI run of stop 50)
        args.quick, args.epochs, args.seeds, args.deadlines = True, 2, 1, 2
        args.profile_iterations, grid = 16, (64, 256)
    epochs = args.epochs or (10 if args.quick else 20)
    name = "courier_quick" if args.quick and not C.SMOKE else "courier"
    load_at_start = S.wait_for_quiet(patience_s=60 if args.quick else 600)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        model, sync_s, startup = profile(tmp, args)
        work = _planner.Work(0, N_TRAIN, epochs)
        predicted = {r.batch: startup + r.finish_s
                     for r in _planner.plan(model, sync_s, work, grid)}
        fastest, slowest = min(predicted.values()), max(predicted.values())
        lo_d = 1.05 * fastest
        k = args.deadlines
        deadlines = [lo_d + (slowest - lo_d) * (i + 0.5) / k for i in range(k)]
        static = {}
        for d in deadlines:
            meeting = [B for B in grid if predicted[B] <= d]
            static[d] = min(meeting) if meeting else min(predicted, key=predicted.get)
        C.progress(f"startup {startup:.1f} s; predicted job times "
                   + ", ".join(f"B={B}: {t:.1f} s" for B, t in predicted.items())
                   + "; deadlines " + ", ".join(f"{d:.1f}" for d in deadlines))
        fixed, replan, seed_of = {}, {}, {}
        for seed in range(args.seeds):
            jobs = [("fixed", B) for B in grid] + [("courier", d) for d in deadlines]
            for kind, x in S.order(jobs, seed):
                label = f"{kind}-{x:.0f}-s{seed}" if kind == "courier" else f"B{x}-s{seed}"
                C.progress(f"seed {seed + 1}/{args.seeds}: {label} (load {S.load():.1f})")
                if kind == "fixed":
                    res = run(tmp, label, x, epochs, seed, args.emulate_compute)
                    fixed[(x, seed)] = res
                else:
                    res = run(tmp, label, BASE_B, epochs, seed, args.emulate_compute, x)
                    replan[(x, seed)] = res
                seed_of[res["params"]] = seed
                C.progress(f"  {res['job_s']:.1f} s, mean B {res['mean_batch']:.0f}")
        scores = held_out(list(seed_of), seed_of)
        for res in list(fixed.values()) + list(replan.values()):
            res["accuracy"], res["loss"] = scores[res.pop("params")]

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return float(np.mean(xs)) if xs else None

    seeds = range(args.seeds)
    table, summary = [], {"static": 0, "best fixed B": 0, "courier": 0}
    per_deadline = []
    for d in deadlines:
        row = {"deadline_s": d, "static_batch": static[d]}
        met = {"static": [], "best fixed B": [], "courier": []}
        acc = {"best fixed B": [], "courier": []}
        loss = {"best fixed B": [], "courier": []}
        best_B = []
        for s in seeds:
            met["static"].append(fixed[(static[d], s)]["job_s"] <= d)
            ok = [B for B in grid if fixed[(B, s)]["job_s"] <= d]
            met["best fixed B"].append(bool(ok))
            best_B.append(min(ok) if ok else None)
            c = replan[(d, s)]
            met["courier"].append(c["job_s"] <= d)
            if ok:
                acc["best fixed B"].append(fixed[(min(ok), s)]["accuracy"])
                loss["best fixed B"].append(fixed[(min(ok), s)]["loss"])
                acc["courier"].append(c["accuracy"])
                loss["courier"].append(c["loss"])
        for policy in met:
            summary[policy] += sum(met[policy])
        changes = [x for s in seeds for x in replan[(d, s)]["changes_per_epoch"]]
        row.update({"met": {p_: sum(v) for p_, v in met.items()}, "best_fixed_batch": best_B,
                    "accuracy": {p_: mean(v) for p_, v in acc.items()},
                    "loss": {p_: mean(v) for p_, v in loss.items()},
                    "courier_job_s": [replan[(d, s)]["job_s"] for s in seeds],
                    "courier_mean_batch": [replan[(d, s)]["mean_batch"] for s in seeds],
                    "changes_per_epoch_mean": mean(changes), "changes_per_epoch_max":
                    max(changes, default=0)})
        per_deadline.append(row)
        a, lo_ = row["accuracy"], row["loss"]
        diff = (None if a["courier"] is None or a["best fixed B"] is None
                else 100 * (a["courier"] - a["best fixed B"]))
        table.append(
            f"| {d:.1f} s | {static[d]} | {row['met']['static']}/{args.seeds} | "
            f"{row['met']['best fixed B']}/{args.seeds} ({', '.join(str(b) for b in best_B)}) | "
            f"{row['met']['courier']}/{args.seeds} | "
            f"{', '.join(f'{x:.1f}' for x in row['courier_job_s'])} | "
            f"{fmt(a['best fixed B'], '.4f')} / {fmt(a['courier'], '.4f')} "
            f"({fmt(diff, '+.2f')}) | {fmt(lo_['best fixed B'], '.3f')} / "
            f"{fmt(lo_['courier'], '.3f')} | {fmt(row['changes_per_epoch_mean'], '.2f')} "
            f"(max {row['changes_per_epoch_max']}) |")
    total = args.seeds * len(deadlines)
    fixed_rows = [f"| {B} | {predicted[B]:.1f} s | "
                  + ", ".join(f"{fixed[(B, s)]['job_s']:.1f}" for s in seeds) + " | "
                  f"{mean([fixed[(B, s)]['accuracy'] for s in seeds]):.4f} | "
                  f"{mean([fixed[(B, s)]['loss'] for s in seeds]):.3f} |" for B in grid]
    text = "\n".join([
        f"## Courier: {WORKERS} workers at {SLOWDOWN.replace(',', ':')} (steady), MLP on "
        f"digits, {epochs} epochs, {args.emulate_compute:g} ms/sample emulated compute",
        "",
        f"Profile: {args.profile_iterations} iterations at B=64 and at B=256, pooled; "
        f"startup {startup:.1f} s. {len(deadlines)} deadlines evenly across the predicted "
        f"feasible range ({lo_d:.1f}-{slowest:.1f} s from the launch), {args.seeds} seeds "
        f"each. Load average at the start: {load_at_start:.1f}.",
        "",
        f"**Deadline met, all {total} runs per policy: static choice "
        f"{summary['static']}/{total}, best fixed B (hindsight) "
        f"{summary['best fixed B']}/{total}, courier {summary['courier']}/{total}.**",
        "",
        "| deadline | static B | static met | best fixed B met (its B per seed) | "
        "courier met | courier job times (s) | accuracy: best fixed B / courier "
        "(points) | held-out loss: best fixed B / courier | courier B changes per epoch |",
        "|---|---|---|---|---|---|---|---|---|",
        *table,
        "",
        "Accuracy and loss: means over the seeds where some fixed B met the deadline; test "
        "split of 360 images (one image is 0.28 points), held-out loss = mean cross-entropy "
        "on it.",
        "",
        "Fixed batch sizes (their time does not depend on the deadline):",
        "",
        "| B | predicted job time | job time per seed (s) | mean accuracy | mean held-out "
        "loss |", "|---|---|---|---|---|",
        *fixed_rows])
    C.write(name, {"epochs": epochs, "seeds": args.seeds, "deadlines": deadlines,
                   "startup_s": startup, "predicted": {str(B): t for B, t in
                                                       predicted.items()},
                   "profile": {"speed": model.speed.tolist(),
                               "fixed_s": model.intercept.tolist(), "sync_s": sync_s},
                   "summary": summary, "per_deadline": per_deadline,
                   "fixed": {f"{B}/{s}": r for (B, s), r in fixed.items()},
                   "courier": {f"{d:.1f}/{s}": r for (d, s), r in replan.items()}}, text)


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
