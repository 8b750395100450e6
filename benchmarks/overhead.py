"""mxlbbsp against the plain MXNet script it replaces, on equal workers: what it costs.

The same training loop (benchmarks/_overhead_train.py) written twice: as a plain MXNet
dist_sync script (``gluon.Trainer(kvstore="dist_sync")``, a fixed per-worker batch B/n)
started by a plain DMLC launcher (the few lines of :func:`plain_job`: the ``DMLC_*``
variables set by hand for a scheduler, a server and the workers, each a process of its own;
MXNet's dmlc_tracker crashes on Python 3.9+), and with mxlbbsp (``mxlbbsp.DataLoader``,
``mxlbbsp.Trainer``) under ``mxlbbsp launch`` in each sync mode. 2 equal workers, 1 server,
global batch 64, on this machine; the arms of a model interleaved round by round (ABBA), the
ratio to plain taken per round, its median reported. ``--plain-local`` adds the plain script
with ``update_on_kvstore=False`` (``plain-local``): the default runs the optimizer on the
servers, mxlbbsp runs it on every worker, and this arm tells the two costs apart.

Models from about 1 ms to about 200 ms per iteration: three-layer MLPs of width 64 (8x8
inputs), 256 (3x16x16) and 1024 (3x32x32), a small CNN (two 3x3 conv blocks, 16 and 32
channels, 3x32x32) and gluoncv's cifar_resnet20_v1 (BatchNorm: its running statistics are
combined every step).

For each mxlbbsp run it also records where a worker's time goes: each worker writes the
phases of its iterations (``MXLBBSP_TIMELINE``, mxlbbsp/worker/timeline.py: the script's own
loop, waiting for the allocation, compute as issued, waiting for the engine, the report, the
push, the update, the BatchNorm combine, waiting for the pulled sums, the done), and the mean
of each phase over the timed iterations of both workers is printed (the means add up to the
iteration). And the CPU time each role of the job used over the timed iterations (workers,
server, scheduler, and the launcher's process: the coordinator and the supervision), per
iteration, with the workers' main threads and their engine threads apart (``workers:
main``, ``workers: engine``, summed over the workers): on 2 cores every millisecond of it is
taken from someone.

Then a job's fixed cost, start to exit, plain launcher against ``mxlbbsp launch -n 2``: a
script that only creates the dist_sync kvstore, and one that never does (``print('hi')``).

``--equal-shares N``: N jobs (per code, interleaved with ``--baseline``) of the small CNN
under ``mxlbbsp launch -n 3 --emulate-slowdown 1,1,3`` (lbbsp), each worker's mean local
batch from iteration 10 read from the job's metrics: whether the two equal workers get
equal shares beside a clearly slower one (issue 34 asks for them within 10 %).

    python benchmarks/overhead.py                          # everything (~25 min)
    python benchmarks/overhead.py --models mlp256,resnet20 --rounds 3
    python benchmarks/overhead.py --arm "lbbsp-nosignals=--sync lbbsp --signals none"
    python benchmarks/overhead.py --models mlp64,mlp256 --rounds 3 --plain-local --no-fixed-cost
    python benchmarks/overhead.py --tag before             # results/overhead_before.*
    python benchmarks/overhead.py --baseline 5917e88       # and the code of 5917e88, NAME@REV
    python benchmarks/overhead.py --equal-shares-only 10 --baseline 5917e88
    python benchmarks/overhead.py --models mlp256 --arms bsp --plain-local --sections

Writes benchmarks/results/overhead[_TAG].json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

import _common as C
import _suite

TRAIN = C.ROOT / "benchmarks" / "_overhead_train.py"
MODELS = ["mlp64", "mlp256", "mlp1024", "cnn", "resnet20"]
#: timed iterations per model (after 10 of warm-up): each run takes a few seconds
ITERATIONS = {"mlp64": 400, "mlp256": 300, "mlp1024": 60, "cnn": 120, "resnet20": 40}
#: the arms: name -> `mxlbbsp launch` options (None: the plain script and launcher)
ARMS = {"plain": None, "lbbsp": ["--sync", "lbbsp"], "bsp": ["--sync", "bsp"]}
#: the arms of the plain launcher, each its own --impl of _overhead_train.py (``plain-local``:
#: the plain script with every worker running the optimizer, as mxlbbsp's do)
PLAIN_ARMS = ("plain", "plain-local")
PHASES = ("loop", "alloc", "compute", "engine", "report", "slot", "push", "update", "bn",
          "pull", "done")
WORKERS = 2
BATCH = 64
#: --equal-shares: 3 workers, the third 3x slower (emulated), the small CNN (the fixed cost
#: dominates its iteration); each worker's mean local batch from iteration SHARES_SKIP
SHARES_SLOWDOWN = "1,1,3"
SHARES_ITERATIONS = 150
SHARES_SKIP = 10
#: the two equal workers' mean local batches count as equal within this
SHARES_WITHIN = 0.10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """One job's processes, its output read line by line, and the CPU time of its processes
    between two lines of rank 0 (``overhead-start`` and ``overhead-result``)."""

    def __init__(self, procs: List[subprocess.Popen], workers: List[subprocess.Popen]):
        self.procs, self.workers = procs, workers
        self.lines: List[str] = []
        self.cpu: Dict[str, list] = {"start": [], "end": []}    # cpu_by_role's readings
        self._threads = [threading.Thread(target=self._read, args=(p,), daemon=True)
                         for p in procs if p.stdout is not None]
        for t in self._threads:
            t.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append(line)
            if "overhead-start" in line and not self.cpu["start"]:
                self.cpu["start"].append(cpu_by_role(self.procs))
            elif "overhead-result" in line and not self.cpu["end"]:
                self.cpu["end"].append(cpu_by_role(self.procs))

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.workers:
            p.wait(max(deadline - time.monotonic(), 1))
        for t in self._threads:
            t.join(5)

    def results(self) -> List[dict]:
        return [json.loads(line.split("overhead-result ", 1)[1]) for line in self.lines
                if "overhead-result " in line]

    def cpu_per_role(self) -> Dict[str, float]:
        """CPU seconds per role between rank 0's start and result lines; and of the
        workers' threads, summed over the workers: each one's main thread (``workers:
        main``: the script's Python) and its busiest other thread over the same time
        (``workers: engine``: MXNet's engine worker, with MXNET_CPU_WORKER_NTHREADS=1 the
        one that runs the operators)."""
        if not (self.cpu["start"] and self.cpu["end"]):
            return {}
        (roles_a, threads_a), (roles_b, threads_b) = self.cpu["start"][0], self.cpu["end"][0]
        out = {role: roles_b[role] - roles_a.get(role, 0.0) for role in roles_b}
        used: Dict[int, Dict[int, float]] = {}       # pid -> thread id -> seconds
        for (pid, tid), seconds in threads_b.items():
            used.setdefault(pid, {})[tid] = seconds - threads_a.get((pid, tid), 0.0)
        if used:
            out["workers: main"] = sum(ts.get(pid, 0.0) for pid, ts in used.items())
            out["workers: engine"] = sum(max([v for tid, v in ts.items() if tid != pid],
                                             default=0.0) for pid, ts in used.items())
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def _role(proc) -> str:
    """What a process of a job is, from its command line and environment."""
    try:
        cmd = " ".join(proc.cmdline())
        if "mxlbbsp.launcher.guard" in cmd:
            return "guards"
        if "mxlbbsp.launcher launch" in cmd:
            return "launcher"
        if "_overhead_train.py" in cmd or "print(" in cmd:
            return "workers"
        role = proc.environ().get("DMLC_ROLE", "")
        return {"server": "server", "scheduler": "scheduler"}.get(role, "other")
    except Exception:  # noqa: BLE001 - the process may be gone
        return "other"


def cpu_by_role(procs) -> Tuple[Dict[str, float], Dict[Tuple[int, int], float]]:
    """CPU seconds (user + system, all threads) used so far by every process of the job, by
    role; and by (pid, thread id), each thread of the workers'."""
    import psutil
    out: Dict[str, float] = {}
    threads: Dict[Tuple[int, int], float] = {}
    seen = set()
    for p in procs:
        try:
            root = psutil.Process(p.pid)
            tree = [root] + root.children(recursive=True)
        except psutil.Error:
            continue
        for q in tree:
            if q.pid in seen:
                continue
            seen.add(q.pid)
            try:
                t = q.cpu_times()
            except psutil.Error:
                continue
            role = _role(q)
            out[role] = out.get(role, 0.0) + t.user + t.system
            if role == "workers":
                try:
                    for th in q.threads():
                        threads[(q.pid, th.id)] = th.user_time + th.system_time
                except psutil.Error:
                    pass
    return out, threads


def plain_job(argv: List[str], env: Dict[str, str], workers: int = WORKERS,
              capture: bool = True) -> Job:
    """The plain DMLC launcher: a scheduler, a server and the workers, the ``DMLC_*``
    variables set by hand, all started at once (ps-lite's nodes wait for the scheduler)."""
    base = dict(env, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(_free_port()),
                DMLC_NUM_SERVER="1", DMLC_NUM_WORKER=str(workers),
                DMLC_NODE_HOST="127.0.0.1", PYTHONUNBUFFERED="1")
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    kw = dict(cwd=C.ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    ps = [subprocess.Popen([C.PY, "-c", "import mxnet"], env=dict(base, DMLC_ROLE=role), **kw)
          for role in ("scheduler", "server")]
    ws = [subprocess.Popen(argv, env=dict(base, DMLC_ROLE="worker"), **kw)
          for _ in range(workers)]
    return Job(ps + ws, ws)


def end_plain(job: Job) -> None:
    """Once the workers have ended: the scheduler and the server end with them when the
    workers used the kvstore; else nobody will ever talk to them, so stop them."""
    for p in job.procs:
        if p not in job.workers and p.poll() is None:
            p.terminate()
    for p in job.procs:
        p.wait(10)


def mxlbbsp_job(argv: List[str], env: Dict[str, str], options: List[str],
                workers: int = WORKERS, capture: bool = True, tree: Path = C.ROOT) -> Job:
    """``mxlbbsp launch`` of ``argv``; ``tree``: whose mxlbbsp (a --baseline's worktree)."""
    launch = [C.PY, "-m", "mxlbbsp.launcher", "launch", "-n", str(workers), "--progress", "0",
              *options, "--", *argv]
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    if tree != C.ROOT:
        env = dict(env, PYTHONPATH=str(tree))
    proc = subprocess.Popen(launch, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                            text=True)
    return Job([proc], [proc])


def _train_script(tree: Path) -> Path:
    """``tree``'s training loop (a --baseline's worktree), or this one's for a baseline from
    before this benchmark (no timeline, no --sections)."""
    train = tree / "benchmarks" / "_overhead_train.py"
    return train if train.exists() else TRAIN


def run(arm: str, options: Optional[List[str]], model: str, iterations: int,
        tree: Path = C.ROOT, sections: bool = False) -> dict:
    """One job of ``model`` in ``arm``: samples/s (the mean of the workers' own figures),
    CPU per role and iteration, and (mxlbbsp) the timeline's phases. ``tree``: the code of
    the mxlbbsp arms (a --baseline's worktree)."""
    env = C.env()
    train = _train_script(tree)
    argv = [C.PY, str(train), "--impl", arm if options is None else "mxlbbsp",
            "--model", model, "--batch-size", str(BATCH), "--iterations", str(iterations)]
    if sections and "--sections" in train.read_text():
        argv.append("--sections")
    with tempfile.TemporaryDirectory() as tmp:
        if options is None:
            job = plain_job(argv, env)
        else:
            env["MXLBBSP_TIMELINE"] = tmp
            job = mxlbbsp_job(argv, env, options, tree=tree)
        try:
            job.wait(1800)
        finally:
            job.kill()
        results = job.results()
        if options is None:
            end_plain(job)
        if len(results) != WORKERS or any(p.returncode not in (0, None) for p in job.workers):
            sys.stderr.write("".join(job.lines[-40:]))
            raise SystemExit(f"benchmark job failed: {arm} {model}")
        out = {"samples_per_s": float(np.mean([r["samples_per_s"] for r in results])),
               "cpu_ms_per_iteration": {k: 1000 * v / iterations
                                        for k, v in job.cpu_per_role().items()}}
        if options is not None:
            out["timeline"] = timeline(Path(tmp), skip=10)
        parts = [r["sections_us"] for r in results if r.get("sections_us")]
        if parts:
            out["sections_us"] = {k: float(np.mean([p.get(k, 0.0) for p in parts]))
                                  for k in parts[0]}
    return out


def timeline(folder: Path, skip: int) -> dict:
    """The mean and median of each phase (ms) over the timed iterations of every worker."""
    rows = []
    for path in sorted(folder.glob("timeline-*.json")):
        data = json.loads(path.read_text())
        rows += [r for r in data["iterations"] if r["iteration"] >= skip]
    if not rows:
        return {}
    mean = {p: 1000 * float(np.mean([r.get(p, 0.0) for r in rows])) for p in PHASES}
    median = {p: 1000 * float(np.median([r.get(p, 0.0) for r in rows])) for p in PHASES}
    total = [1000 * sum(r.get(p, 0.0) for p in PHASES) for r in rows]
    return {"mean_ms": mean, "median_ms": median, "iteration_ms_mean": float(np.mean(total)),
            "iteration_ms_median": float(np.median(total)), "iterations": len(rows)}


def fixed_cost(rounds: int, trees: Dict[str, Path]) -> dict:
    """Start-to-exit seconds of a kvstore-only script and of print('hi'), 2 workers, plain
    launcher against ``mxlbbsp launch`` (``trees``: arm -> whose mxlbbsp), interleaved."""
    env = C.env()
    scripts = {"kvstore only": [C.PY, str(TRAIN), "--impl", "plain", "--kvstore-only"],
               "no kvstore": [C.PY, "-c", "print('hi')"]}
    arms = ["plain", *trees]
    out = {s: {a: [] for a in arms} for s in scripts}
    for r in range(rounds):
        for script, argv in scripts.items():
            for arm in _suite.order(arms, r):
                C.progress(f"fixed cost round {r + 1}/{rounds}: {script}, {arm}")
                started = time.monotonic()
                if arm == "plain":
                    job = plain_job(argv, env, capture=False)
                    job.wait(300)
                    end_plain(job)
                    ok = all(p.returncode == 0 for p in job.workers)
                else:
                    job = mxlbbsp_job(argv, env, [], capture=False, tree=trees[arm])
                    job.wait(300)
                    ok = job.procs[0].returncode == 0
                took = time.monotonic() - started
                if not ok:
                    raise SystemExit(f"fixed cost: {script} under {arm} failed")
                out[script][arm].append(took)
    return out


def equal_shares(rounds: int, trees: Dict[str, Path], iterations: int) -> dict:
    """Per code (``trees``: arm -> whose mxlbbsp), per job: the mean local batch of each of
    3 workers at 1:1:3 from iteration SHARES_SKIP on, and the equal pair's difference
    relative to their mean."""
    from mxlbbsp.core import metrics as _metrics
    env = C.env()
    out: Dict[str, list] = {arm: [] for arm in trees}
    for r in range(rounds):
        for arm in _suite.order(list(trees), r):
            C.progress(f"equal shares round {r + 1}/{rounds}: {arm} (load "
                       f"{os.getloadavg()[0]:.1f})")
            argv = [C.PY, str(_train_script(trees[arm])), "--impl", "mxlbbsp", "--model", "cnn",
                    "--batch-size", str(BATCH), "--iterations", str(iterations)]
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "metrics.jsonl"
                job = mxlbbsp_job(argv, env, ["--sync", "lbbsp", "--emulate-slowdown",
                                              SHARES_SLOWDOWN, "--metrics", str(path)],
                                  workers=3, tree=trees[arm])
                try:
                    job.wait(900)
                finally:
                    job.kill()
                if job.procs[0].returncode != 0:
                    sys.stderr.write("".join(job.lines[-40:]))
                    raise SystemExit(f"equal shares: the 1:1:3 job under {arm} failed")
                per_rank = _metrics.summarize(_metrics.load(str(path)),
                                              skip=SHARES_SKIP)["per_rank"]
            means = [per_rank[k]["mean_batch"] for k in sorted(per_rank)]
            diff = abs(means[0] - means[1]) / (0.5 * (means[0] + means[1]))
            out[arm].append({"mean_batches": means, "pair_difference": diff})
            C.progress(f"  mean batches {', '.join(f'{m:.1f}' for m in means)}: the pair "
                       f"{100 * diff:.1f} % apart")
    return out


def parse_arms(extra: List[str], names: Optional[str],
               plain_local: bool = False) -> Dict[str, Optional[List[str]]]:
    arms = dict(ARMS)
    if names:
        arms = {"plain": None, **{n: ["--sync", n] for n in names.split(",")
                                  if n not in PLAIN_ARMS}}
    if plain_local:
        arms = {"plain": None, "plain-local": None,
                **{a: o for a, o in arms.items() if a != "plain"}}
    for spec in extra:
        name, _, opts = spec.partition("=")
        if not name or not opts:
            raise SystemExit(f"--arm {spec!r}: expected NAME=LAUNCH OPTIONS")
        arms[name] = shlex.split(opts)
    return arms


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--arms", help="sync modes to run besides plain (default lbbsp,bsp)")
    p.add_argument("--plain-local", action="store_true",
                   help="one more plain arm: gluon.Trainer(update_on_kvstore=False), every "
                        "worker running the optimizer as mxlbbsp's do (the default plain "
                        "script runs it on the servers)")
    p.add_argument("--arm", action="append", default=[],
                   help="one more arm, NAME=`mxlbbsp launch` options (repeatable)")
    p.add_argument("--iterations", type=float, default=1.0,
                   help="scale the timed iterations of every model")
    p.add_argument("--fixed-cost-rounds", type=int, default=5)
    p.add_argument("--no-fixed-cost", action="store_true")
    p.add_argument("--fixed-cost-only", action="store_true")
    p.add_argument("--sections", action="store_true",
                   help="each worker's main-thread CPU per iteration in each part of the "
                        "loop and in the step's and the session's methods")
    p.add_argument("--equal-shares", type=int, default=0, metavar="N",
                   help="N jobs per code of the small CNN at 1:1:3 (3 workers, lbbsp): the "
                        "equal pair's mean local batches")
    p.add_argument("--equal-shares-only", type=int, metavar="N",
                   help="only those N jobs (no throughput, no fixed cost)")
    p.add_argument("--tag", help="results/overhead_TAG.json and .md")
    p.add_argument("--baseline", metavar="REV",
                   help="also run every mxlbbsp arm on the code of commit REV (a temporary "
                        "git worktree), interleaved with the others: NAME@REV")
    C.add_smoke(p)
    args = p.parse_args(argv)
    if args.baseline:
        with C.worktree(args.baseline) as tree:
            C.importable(C.ROOT)
            return measure(args, C.importable(tree))
    C.importable(C.ROOT)
    return measure(args, None)


def measure(args, baseline: Optional[Path]) -> int:
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"--models: unknown model {m!r}; choose from {', '.join(MODELS)}")
    arms = parse_arms(args.arm, args.arms, args.plain_local)
    trees = {a: C.ROOT for a in arms}
    if baseline is not None:
        for a, opts in list(arms.items()):
            if opts is not None:
                arms[f"{a}@{args.baseline}"] = opts
                trees[f"{a}@{args.baseline}"] = baseline
    rounds, fc_rounds = args.rounds, args.fixed_cost_rounds
    shares_rounds = args.equal_shares
    shares_iterations = max(int(SHARES_ITERATIONS * args.iterations), SHARES_SKIP + 5)
    if args.equal_shares_only is not None:
        models, shares_rounds = [], args.equal_shares_only
        args.fixed_cost_only, args.no_fixed_cost = False, True
    iterations = {m: max(int(ITERATIONS[m] * args.iterations), 5) for m in models}
    if C.smoke(args):        # one round of the smallest model, 20 iterations; one fixed cost
        models, rounds, fc_rounds = (["mlp64"] if models else []), 1, 1
        iterations = {"mlp64": 20}
        shares_rounds, shares_iterations = min(shares_rounds, 1), SHARES_SKIP + 10
    load_before = [round(x, 2) for x in os.getloadavg()]
    results: Dict[str, dict] = {}
    if not args.fixed_cost_only:
        for model in models:
            runs = {a: [] for a in arms}
            for r in range(rounds):
                for arm in _suite.order(list(arms), r):
                    C.progress(f"{model} round {r + 1}/{rounds}: {arm} (load "
                               f"{os.getloadavg()[0]:.1f})")
                    runs[arm].append(run(arm, arms[arm], model, iterations[model],
                                         trees[arm], sections=args.sections))
                    C.progress(f"  {runs[arm][-1]['samples_per_s']:.0f} samples/s")
            results[model] = summarise(runs, iterations[model])
    fixed = None
    if not args.no_fixed_cost:
        mxl = {"mxlbbsp": C.ROOT}
        if baseline is not None:
            mxl[f"mxlbbsp@{args.baseline}"] = baseline
        fixed = fixed_cost(fc_rounds, mxl)
    shares = None
    if shares_rounds > 0:
        mxl = {"lbbsp": C.ROOT}
        if baseline is not None:
            mxl[f"lbbsp@{args.baseline}"] = baseline
        shares = equal_shares(shares_rounds, mxl, shares_iterations)
    doc = {"workers": WORKERS, "global_batch": BATCH, "rounds": rounds, "arms": arms,
           "iterations": iterations, "results": results, "fixed_cost_s": fixed,
           "equal_shares": shares, "equal_shares_iterations": shares_iterations,
           "load_before": load_before,
           "load_after": [round(x, 2) for x in os.getloadavg()]}
    name = "overhead" + (f"_{args.tag}" if args.tag else "")
    C.write(name, doc, table(doc))
    return 0


def summarise(runs: Dict[str, List[dict]], iterations: int) -> dict:
    plain = [r["samples_per_s"] for r in runs["plain"]]
    out = {}
    for arm, rs in runs.items():
        speeds = [r["samples_per_s"] for r in rs]
        ratios = [s / b for s, b in zip(speeds, plain)]
        cpu: Dict[str, List[float]] = {}
        for r in rs:
            for role, ms in r["cpu_ms_per_iteration"].items():
                cpu.setdefault(role, []).append(ms)
        entry = {"samples_per_s": speeds, "ratio": ratios,
                 "ratio_median": float(np.median(ratios)),
                 "iteration_ms": float(np.median([1000 * BATCH / s for s in speeds])),
                 "cpu_ms_per_iteration": {k: float(np.median(v)) for k, v in cpu.items()}}
        tls = [r["timeline"] for r in rs if r.get("timeline")]
        if tls:
            entry["timeline_mean_ms"] = {p: float(np.median([t["mean_ms"][p] for t in tls]))
                                         for p in PHASES}
            entry["timeline_median_ms"] = {p: float(np.median([t["median_ms"][p]
                                                               for t in tls]))
                                           for p in PHASES}
        parts = [r["sections_us"] for r in rs if r.get("sections_us")]
        if parts:
            entry["sections_us"] = {k: float(np.median([p.get(k, 0.0) for p in parts]))
                                    for k in parts[0]}
        out[arm] = entry
    return out


def table(doc: dict) -> str:
    arms = list(doc["arms"])
    setup = (f"{doc['workers']} equal workers, 1 server, global batch {doc['global_batch']}, "
             f"{doc['rounds']} round(s), arms interleaved (ABBA); ") if doc["results"] \
        else "Arms interleaved (ABBA); "
    lines = [f"{setup}load average {doc['load_before']} before, {doc['load_after']} after, "
             f"on {os.cpu_count()} cores.", ""]
    if doc["results"]:
        lines += ["## Throughput against the plain MXNet script", "",
                  "| model | plain: ms per iteration | " +
                  " | ".join(f"{a} / plain (per round)" for a in arms if a != "plain") + " |",
                  "|---|---|" + "---|" * (len(arms) - 1)]
        for model, res in doc["results"].items():
            cells = []
            for a in arms:
                if a == "plain":
                    continue
                r = res[a]
                cells.append(f"**{r['ratio_median']:.3f}x** "
                             f"({_suite.rounds_text(r['ratio'], '.2f')})")
            lines.append(f"| {model} | {res['plain']['iteration_ms']:.2f} | "
                         + " | ".join(cells) + " |")
        lines += ["", "## Where a worker's iteration goes (mean ms per phase, both workers; "
                      "median over rounds)", "",
                  "| model | arm | iteration | " + " | ".join(PHASES) + " |",
                  "|---|---|---|" + "---|" * len(PHASES)]
        for model, res in doc["results"].items():
            for a in arms:
                tl = res[a].get("timeline_mean_ms")
                if not tl:
                    continue
                lines.append(f"| {model} | {a} | {res[a]['iteration_ms']:.2f} | "
                             + " | ".join(f"{tl[p]:.3f}" for p in PHASES) + " |")
        roles = sorted({k for res in doc["results"].values() for r in res.values()
                        for k in r["cpu_ms_per_iteration"]})
        lines += ["", "## CPU per iteration by role (ms; median over rounds)", "",
                  "| model | arm | " + " | ".join(roles) + " |",
                  "|---|---|" + "---|" * len(roles)]
        for model, res in doc["results"].items():
            for a in arms:
                cpu = res[a]["cpu_ms_per_iteration"]
                lines.append(f"| {model} | {a} | "
                             + " | ".join(f"{cpu.get(k, 0.0):.2f}" for k in roles) + " |")
    with_sections = [(model, a) for model, res in doc["results"].items() for a in arms
                     if res[a].get("sections_us")]
    if with_sections:
        names = []
        for model, a in with_sections:
            names += [k for k in doc["results"][model][a]["sections_us"] if k not in names]
        loop = ["loader", "forward and loss", "backward", "step"]
        names.sort(key=lambda k: (loop.index(k) if k in loop else len(loop),
                                  k.startswith("session"), k))
        lines += ["", "## The main thread's CPU per iteration by section (us, the mean of "
                      "the workers; median over rounds)", "",
                  "| section | " + " | ".join(f"{m} {a}" for m, a in with_sections) + " |",
                  "|---|" + "---|" * len(with_sections)]
        for name in names:
            cells = [doc["results"][m][a]["sections_us"].get(name) for m, a in with_sections]
            lines.append(f"| {name} | " + " | ".join("" if c is None else f"{c:.0f}"
                                                     for c in cells) + " |")
    if doc.get("equal_shares"):
        lines += ["", f"## Equal workers beside a slower one: 3 workers at {SHARES_SLOWDOWN} "
                      f"(emulated), the small CNN, {doc['equal_shares_iterations']} "
                      f"iterations, lbbsp; mean local batch per worker from iteration "
                      f"{SHARES_SKIP}", "",
                  f"| code | jobs with the equal pair within {100 * SHARES_WITHIN:.0f} % | "
                  "the pair's difference per job (%) | mean batches (median over jobs) |",
                  "|---|---|---|---|"]
        for arm, jobs in doc["equal_shares"].items():
            diffs = [j["pair_difference"] for j in jobs]
            within = sum(d <= SHARES_WITHIN for d in diffs)
            med = np.median([j["mean_batches"] for j in jobs], axis=0)
            lines.append(f"| {arm} | **{within} of {len(jobs)}** | "
                         f"{_suite.rounds_text([100 * d for d in diffs], '.1f')} | "
                         f"{', '.join(f'{m:.1f}' for m in med)} |")
    if doc["fixed_cost_s"]:
        names = list(next(iter(doc["fixed_cost_s"].values())))
        lines += ["", "## A job's fixed cost: start to exit, 2 workers (s; median (rounds), "
                      "and its difference to the plain launcher's)", "",
                  "| script | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for script, arms_ in doc["fixed_cost_s"].items():
            plain = np.median(arms_["plain"])
            cells = [f"{np.median(arms_[a]):.2f} ({_suite.rounds_text(arms_[a])})"
                     + ("" if a == "plain" else f", **{np.median(arms_[a]) - plain:+.2f}**")
                     for a in names]
            lines.append(f"| {script} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
