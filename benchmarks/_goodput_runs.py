"""The parts of ``benchmarks/goodput.py`` that run and describe its jobs: one job to a target
accuracy (the launcher interrupted at the first evaluation that reaches it), the worker's
cost of the noise scale's norm, the result tables and the trajectory figure."""
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import _common as C
from mxlbbsp.core import metrics as _metrics

EVAL = re.compile(r"eval: iteration=(\d+) accuracy=([\d.]+) train_s=([\d.]+)")


#: a job that fails before its first evaluation is started again this many times: on the
#: shared machine a port can be taken between the launcher's choice and ps-lite's bind
#: (seen: "bind failed" from the scheduler), which says nothing about the arm
RETRIES = 2


def run_to_target(workers, train, base: Path, sync, launch, target, timeout=1800,
                  script=None) -> dict:
    """One job of ``script`` (default ``examples/train_gluon.py``) until rank 0's first
    evaluation at or above ``target`` (then the launcher gets SIGINT: the rest of the run
    would tell nothing) or its last iteration. Its output goes to ``base``.log, its metrics
    to ``base``.jsonl."""
    for attempt in range(RETRIES + 1):
        try:
            return _run_once(workers, train, base, sync, launch, target, timeout,
                             script or str(C.EXAMPLE))
        except _StartFailed as exc:
            if attempt == RETRIES:
                raise SystemExit(str(exc)) from None
            C.progress(f"  the job failed before its first evaluation; again ({exc.line})")


class _StartFailed(Exception):
    def __init__(self, text: str, line: str):
        super().__init__(text)
        self.line = line


def _run_once(workers, train, base: Path, sync, launch, target, timeout, script) -> dict:
    metrics, log = base.with_suffix(".jsonl"), base.with_suffix(".log")
    argv = [C.PY, "-m", "mxlbbsp.launcher", "launch", "-n", str(workers), "--sync", sync,
            "--metrics", str(metrics), "--progress", "0", *launch, "--",
            C.PY, script, *train]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=C.ROOT, env=C.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    points, hit, lines = [], None, []
    try:
        for line in proc.stdout:
            lines.append(line)
            m = EVAL.search(line)
            if m:
                points.append((int(m[1]), float(m[2]), float(m[3])))
                if hit is None and points[-1][1] >= target:
                    hit = points[-1]
                    proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    finally:
        timer.cancel()
    log.write_text("".join(lines))
    if rc != 0 and not (hit is not None and rc == 130):
        text = f"benchmark job failed ({rc}): {' '.join(argv)}\n" + "".join(lines[-30:])
        if points:
            raise SystemExit(text)
        raise _StartFailed(text, next((x.strip() for x in reversed(lines)
                                       if "error" in x.lower()), f"exit {rc}"))
    recs = _records(metrics)
    totals, seen, rank0 = {}, {}, []
    for r in recs:
        totals[r["iteration"]] = totals.get(r["iteration"], 0) + int(r["batch_size"])
        seen[r["iteration"]] = seen.get(r["iteration"], 0) + 1
        if r.get("rank") == 0:
            rank0.append(r)
    # the interruption may cut the last iteration's records: its B is not known
    totals = {t: b for t, b in totals.items() if seen[t] == workers}
    try:
        samples_per_s = _metrics.summarize(recs, skip=5)["samples_per_s"]
    except (ValueError, KeyError, ZeroDivisionError):
        samples_per_s = float("nan")
    # each worker's wait for its slice in an iteration: its wait less its push/pull (no slot
    # wait outside r2sp); iterations 0-1 left out (graphs built, the first split)
    waits = [r["wait_s"] - r["sync_s"] for r in recs if r["iteration"] >= 2
             and isinstance(r.get("wait_s"), (int, float))
             and isinstance(r.get("sync_s"), (int, float))]
    run = {"seconds_to_target": hit[2] if hit else None,
           "alloc_wait_ms": 1e3 * C.median(waits) if waits else float("nan"),
           "alloc_wait_mean_ms": 1e3 * sum(waits) / len(waits) if waits else float("nan"),
           "iterations_to_target": hit[0] if hit else None,
           "final_accuracy": points[-1][1] if points else None,
           "curve": points, "samples_per_s": samples_per_s,
           "batches": [totals[t] for t in sorted(totals)],
           "wall_s": time.monotonic() - started}
    if sync == "goodput":
        run["noise"] = [(r["iteration"], r.get("noise_scale"), r.get("noise_scale_point"),
                         r.get("lr_factor"), r.get("fixed_share"), r.get("noise_scale_range"))
                        for r in sorted(rank0, key=lambda r: r["iteration"])]
    return run


def _records(path: Path) -> list:
    """The metrics records; a last line cut by the interruption is left out."""
    try:
        return _metrics.load(str(path))
    except _metrics.MetricsError:
        lines = path.read_text().splitlines()
        good = []
        for line in lines:
            try:
                good.append(json.loads(line))
            except ValueError:
                break
        return [r for r in good if isinstance(r, dict) and "iteration" in r]


def norm_cost(reps: int = 30):
    """The worker's extra work in goodput mode, side by side in one process: the squared
    norm of the gradient (Trainer.grad_sqr) against one forward + backward pass, for the
    digits MLP (B=64) and a BatchNorm ResNet-20 on 32x32 images (B=32)."""
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon, nd

    import mxlbbsp
    from mxlbbsp.models import get_model

    out = {}
    for model, shape, B in (("mlp", (1, 8, 8), 64), ("resnet20", (3, 32, 32), 32)):
        mx.random.seed(0)
        net = get_model(model, classes=10)
        net.initialize(mx.init.Xavier())
        net.hybridize()
        trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        x = nd.random.normal(shape=(B,) + shape)
        y = nd.array(np.random.default_rng(0).integers(0, 10, B))
        step, norm = [], []
        for k in range(reps + 3):
            t0 = time.perf_counter()
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            nd.waitall()
            t1 = time.perf_counter()
            trainer.grad_sqr()
            t2 = time.perf_counter()
            if k >= 3:                      # graph building, allocation
                step.append(t1 - t0)
                norm.append(t2 - t1)
        # both are timed in every repetition: the ratio per repetition
        ratios = [n / s for n, s in zip(norm, step)]
        out[model] = {"batch": B, "step_ms": 1e3 * C.median(step),
                      "norm_ms": 1e3 * C.median(norm), "ratio": C.median(ratios)}
        C.progress(f"grad_sqr cost, {model} B={B}: {out[model]['norm_ms']:.3f} ms against "
                   f"{out[model]['step_ms']:.2f} ms forward+backward "
                   f"({100 * out[model]['ratio']:.1f} %)")
    return out


def _fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def tables(work, args, B0, load_at_start, results, cost) -> str:
    """The result's markdown: per cluster the seconds and iterations to the target of every
    arm and seed, the workers' allocation wait, the ratios per seed, and the goodput runs'
    noise scale and B(t)."""
    lines = [f"{work['label']}, target test accuracy {work['target']}, {args.seeds} seed(s), "
             f"emulated compute {work['compute']} ms/sample, B0 = {B0}, lr "
             f"{work.get('lr', 0.05):g} at B0 (sqrt(B/B0) for the fixed B's), goodput in "
             f"{work['batch_range']}, at most {work['iterations']} iterations, evaluation "
             f"every {work['eval_interval']}; load average {load_at_start:.1f} at the start"]
    for cluster, res in results.items():
        runs, sm = res["runs"], res["summary"]
        lo, hi = res["load"]
        lines += ["", f"**{cluster}** (load average {lo:.1f}-{hi:.1f} at the arms' starts)", "",
                  "| arm | reached | seconds to target, per seed | median | iterations to "
                  "target, per seed | median B(t), per seed | samples/s | allocation wait, "
                  "ms per iteration (median; mean) |", "|---|---|---|---|---|---|---|---|"]
        for arm, rs in runs.items():
            secs = [r["seconds_to_target"] for r in rs]
            got = [s for s in secs if s is not None]
            spans = ", ".join(f"{C.median(r['batches']):.0f}" for r in rs)
            its = ", ".join(_fmt(r["iterations_to_target"], "{}") for r in rs)
            wait = C.median([r["alloc_wait_ms"] for r in rs])
            wait_mean = C.median([r["alloc_wait_mean_ms"] for r in rs])
            lines.append(
                f"| {arm} | {len(got)}/{len(rs)} | "
                f"{', '.join(_fmt(s, '{:.1f}') for s in secs)} | "
                f"{_fmt(C.median(got) if got else None, '{:.1f}')} | {its} | {spans} | "
                f"{C.median([r['samples_per_s'] for r in rs]):.0f} | "
                f"{wait:.2f}; {wait_mean:.2f} |")
        lines += ["", "| goodput / | per seed | median |", "|---|---|---|"]
        for key, what in (("vs_best_fixed", "the best fixed B of each seed"),
                          ("vs_fixed_B", f"the best fixed B over the seeds (B={sm['fixed_B']})"),
                          ("vs_bsp", f"BSP B={B0}"), ("vs_homo", "goodput homo"),
                          ("vs_sqrt", "goodput sqrt")):
            if not any(x is not None for x in sm[key + "_per_seed"]):
                continue                      # an arm not run (--arms core)
            lines.append(f"| {what} | "
                         f"{', '.join(_fmt(x) for x in sm[key + '_per_seed'])} | "
                         f"{_fmt(sm[key])} |")
        lines.append(f"| (best fixed B per seed) | "
                     f"{', '.join(str(b) for b in sm['best_fixed_per_seed'])} | |")
        noise, moves = [], []
        for r in runs["goodput"]:
            phis = [n[1] for n in r.get("noise", []) if n[1] is not None]
            if phis:
                noise.append(f"{phis[0]:.0f} -> {C.median(phis):.0f} -> {phis[-1]:.0f}")
            moves.append(_moves(r["batches"]))
        lines += ["", "goodput's noise scale (the cautious phi, first -> median -> last), per "
                  "seed: " + "; ".join(noise or ["-"]),
                  "", "goodput's B(t), per seed (iteration: B at each change): "
                  + "; ".join(moves)]
    lines += ["", "Worker cost of the noise scale's norm (Trainer.grad_sqr, one process, median "
              "of the repetitions): " + "; ".join(
                  f"{m} B={c['batch']}: {c['norm_ms']:.3f} ms = {100 * c['ratio']:.1f} % of "
                  f"forward+backward ({c['step_ms']:.2f} ms)" for m, c in cost.items())]
    return "\n".join(lines)


def _moves(batches) -> str:
    """B(t) as its changes: '0: 64, 12: 91, ...' (an epoch's short last batch left out)."""
    out, last = [], None
    for t, b in enumerate(batches):
        nxt = batches[t + 1] if t + 1 < len(batches) else b
        if b != last and not (last is not None and nxt == last):
            out.append(f"{t}: {b}")
            last = b
    return ", ".join(out)


def trajectory_png(results, path: Path, label: str) -> None:
    """The goodput runs' cautious noise scale (log axis, with its error bar) and B(t) by
    iteration, one line per seed, a column per cluster."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 6), squeeze=False)
    for col, (cluster, res) in enumerate(results.items()):
        for seed, r in enumerate(res["runs"]["goodput"]):
            pts = [(n[0], n[1]) for n in r.get("noise", []) if n[1] is not None]
            if pts:
                line, = axes[0][col].plot(*zip(*pts), label=f"seed {seed}")
                bars = [(n[0], n[5][0], n[5][1]) for n in r.get("noise", [])
                        if len(n) > 5 and n[5] and n[5][0] is not None
                        and n[5][1] is not None]
                if bars:
                    x, low, high = zip(*bars)
                    axes[0][col].fill_between(x, low, high, color=line.get_color(),
                                              alpha=0.15, linewidth=0)
            axes[1][col].plot(range(len(r["batches"])), r["batches"], label=f"seed {seed}")
        axes[0][col].set_yscale("log")
        axes[1][col].set_yscale("log")
        axes[0][col].set_title(f"{cluster}: noise scale (samples; band: its error bar)",
                               fontsize=9)
        axes[1][col].set_title(f"{cluster}: global batch B(t)", fontsize=9)
        axes[1][col].set_xlabel("iteration")
        axes[0][col].legend(fontsize=7)
    fig.suptitle(f"goodput: {label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def coordinator_cost(workers=(2, 16), iterations=300, rounds=3) -> dict:
    """The coordinator's side of the allocation wait, goodput against LB-BSP at a fixed B,
    side by side (the modes interleaved per round): a real coordinator (NARX, in this
    process) and ``workers`` worker sessions over loopback TCP in one thread, with emulated
    compute times (a fixed cost and a per-sample cost, 1:3 for the last worker) and
    gradient norms (a noise scale of 200). Per mode and size: ``Coordinator.split_latency``
    (the last report in to the split handed to the sockets), and the policy's
    ``after_split`` (goodput's planning, after the split is out), in ms."""
    import math
    import time as _time

    import numpy as np

    from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
    from mxlbbsp.worker.session import Session

    token, B0, N, dim = "cost", 64, 10 ** 6, 200
    out = {}

    def one(mode, n, seed):
        config = CoordinatorConfig(num_workers=n, token=token, sync=mode,
                                   sync_options={"batch_range": "16:1024"}
                                   if mode == "goodput" else {})
        coord = Coordinator(config)
        coord.start()
        spent = []
        policy = coord._policy
        if mode == "goodput":
            inner = policy.after_split

            def timed(t):
                started = _time.perf_counter()
                inner(t)
                spent.append(_time.perf_counter() - started)
            policy.after_split = timed
        env = {"MXLBBSP_COORDINATOR": f"{coord.address[0]}:{coord.address[1]}",
               "MXLBBSP_TOKEN": token, "DMLC_NUM_WORKER": str(n), "MXLBBSP_SYNC": mode}
        sessions = [None] * n

        def start(r):
            sessions[r] = Session(B0, N, B0, None, env=dict(env, MXLBBSP_RANK=str(r),
                                                            MXLBBSP_HOST=f"h{r}"))
        threads = [threading.Thread(target=start, args=(r,)) for r in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        rng = np.random.default_rng(seed)
        sd = rng.uniform(0.5, 1.5, dim)
        G = rng.standard_normal(dim)
        G *= math.sqrt(float(sd @ sd) / 200.0) / np.linalg.norm(G)
        speed = np.full(n, 3000.0)
        speed[-1] = 1000.0
        for _ in range(iterations):
            split = [s.next_iteration(None if mode == "goodput" else B0)[2]
                     for s in sessions]
            sums = [b * G + math.sqrt(b) * sd * rng.standard_normal(dim) for b in split]
            for s, part, b, v in zip(sessions, sums, split, speed):
                s._t_end -= 0.005 + b / v
                s.gradients_ready(float(part @ part))
            total = np.sum(sums, axis=0)
            sessions[0].step_done(float(total @ total))
            for s in sessions[1:]:
                s.step_done()
        for s in sessions:
            s.close()
        coord.finished.wait(10)
        coord.stop()
        latency = np.array(list(coord.split_latency)[5:]) * 1e3
        return latency, np.array(spent[5:]) * 1e3

    for n in workers:
        got = {"goodput": ([], []), "lbbsp": ([], [])}
        for k in range(rounds):
            for mode in (("goodput", "lbbsp") if k % 2 == 0 else ("lbbsp", "goodput")):
                latency, spent = one(mode, n, k)
                got[mode][0].append(latency)
                got[mode][1].append(spent)
        out[n] = {}
        for mode, (lat, spent) in got.items():
            lat = np.concatenate(lat)
            spent = np.concatenate(spent) if any(len(x) for x in spent) else np.array([])
            out[n][mode] = {
                "alloc_latency_median_ms": float(np.median(lat)),
                "alloc_latency_p99_ms": float(np.percentile(lat, 99)),
                "after_split_median_ms": float(np.median(spent)) if len(spent) else None,
                "after_split_p99_ms": float(np.percentile(spent, 99)) if len(spent) else None}
        C.progress(f"coordinator, {n} workers: alloc latency median goodput "
                   f"{out[n]['goodput']['alloc_latency_median_ms']:.3f} ms, lbbsp "
                   f"{out[n]['lbbsp']['alloc_latency_median_ms']:.3f} ms; goodput's "
                   f"planning after the split {out[n]['goodput']['after_split_median_ms']:.3f}"
                   " ms")
    return out
