"""What elastic membership costs: per iteration, and per resize.

* ``cost``: what keeping the last finished iteration's state costs every iteration (the
  copies that let a survivor save it when another worker fails, mxlbbsp/worker/snapshot.py),
  side by side with it off: in one process, blocks of steps with and without the copies
  interleaved (what separate jobs spread by on a shared machine is out), and in real jobs,
  ResNet-20 at 1:3 (2 workers, one emulated 3x slower), rounds interleaved, the ratio of
  samples/s (the bar: at most 2 % off);
* ``pause``: how long a resize stops training, at n workers on loopback (n hosts
  127.0.0.1..n of a private sshd, one slot each, and one more that joins and leaves through
  the discovery script): from the old job's state saved to the new job's first iteration,
  for a grow n -> n+1 and a shrink back, as the launcher's ``resized`` lines say; with the
  next workers started ahead (while the job trains on) and after the boundary, one job
  each.

    python benchmarks/elastic.py                  # cost 3 rounds x 60 iterations, pause at 2, 4, 8
    python benchmarks/elastic.py --quick          # cost 1 round x 30, pause at 2
"""
import argparse
import json
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import _suite

LEDGER = C.ROOT / "tests" / "scripts" / "ledger_train.py"
RESIZED = re.compile(r"resized (\d+) -> (\d+) workers at iteration (\d+) in ([\d.]+) s")
PROGRESS = re.compile(r"\[mxlbbsp\] [\d.]+ s: iteration (\d+),")


def cost(rounds: int, iterations: int, batch: int) -> dict:
    train = ["--model", "resnet20", "--data", "synthetic", "--samples", "8192",
             "--batch-size", str(batch), "--epochs", "100", "--iterations", str(iterations),
             "--log-interval", "0"]
    arms = {"off": [], "on": ["--env", "MXLBBSP_SNAPSHOTS=1"]}
    runs = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                C.progress(f"cost round {r + 1}/{rounds}: snapshots {arm}")
                ckpt = Path(tmp) / f"ck-{arm}-{r}"
                s = C.launch(2, train, Path(tmp) / f"{arm}-{r}.jsonl",
                             launch_args=["--emulate-slowdown", "1,3", "--checkpoint-dir", ckpt,
                                          "--checkpoint-every", str(10 ** 6), *arms[arm]])
                runs[arm].append(s["samples_per_s"])
                C.progress(f"  {s['samples_per_s']:.1f} samples/s")
    ratios = [on / off for on, off in zip(runs["on"], runs["off"])]
    return {"off": runs["off"], "on": runs["on"], "ratios": ratios,
            "ratio": C.median(ratios), "iterations": iterations, "batch": batch}


def keep_cost(steps: int, batch: int) -> dict:
    """The copies' cost per step in one process (benchmarks/_keep_cost.py): ResNet-20,
    ``steps`` steps per arm, alternating; the fastest tenth and quarter of each arm's steps
    (other load only adds time), and their ratio."""
    argv = [C.PY, str(Path(__file__).with_name("_keep_cost.py")),
            json.dumps({"model": "resnet20", "batch": batch, "steps": steps})]
    out = subprocess.run(argv, cwd=C.ROOT, env=C.env(), capture_output=True, text=True,
                         timeout=3600)
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit("the in-process cost measure failed")
    times = json.loads(out.stdout.strip().splitlines()[-1])
    q = {arm: {f"p{p}": _quantile(times[arm], p / 100) for p in (10, 25, 50)}
         for arm in times}
    return {"on": q["on"], "off": q["off"], "steps": steps, "batch": batch,
            "ratio": {p: q["off"][p] / q["on"][p] for p in q["on"]}}


def _quantile(xs, p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def _discovery(folder: Path) -> tuple:
    listing = folder / "hosts.txt"
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return listing, script


def pause(n: int, folder: Path, sshd_options, ahead: bool) -> dict:
    """One job on n hosts; host n+1 joins at iteration 20 and leaves 20 iterations after.
    ``ahead``: --start-ahead (the next workers start while the job trains) or not. Each
    resize's pause (the launcher's ``resized`` line) and its lead: from the discovery
    script's change to the resize (the time the job trained on the old hosts meanwhile)."""
    hosts = [f"127.0.0.{i}" for i in range(1, n + 2)]
    listing, script = _discovery(folder)
    listing.write_text("".join(f"{h}:1\n" for h in hosts[:n]))
    job = folder / "job"
    job.mkdir()
    argv = [C.PY, "-m", "mxlbbsp.launcher", "launch", "--host-discovery-script", str(script),
            "--discovery-interval", "0.5", *map(str, sshd_options), "--checkpoint-dir",
            str(folder / "ck"), "--progress", "1", "--emulate-compute", "0.5",
            "--start-ahead" if ahead else "--no-start-ahead", "--",
            C.PY, str(LEDGER), str(job), "--samples", "300000", "--epochs", "1",
            "--batch-size", str(16 * (n + 1))]
    proc = subprocess.Popen(argv, cwd=C.ROOT, env=C.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, found, seen = [], [], []          # seen: (time, iteration) of progress lines
    stage, target, changed = 0, 20, 0.0
    try:
        for line in proc.stdout:
            lines.append(line)
            m = PROGRESS.search(line)
            if m:
                seen.append((time.monotonic(), int(m.group(1))))
            if m and int(m.group(1)) >= target and stage in (0, 2):
                listing.write_text("".join(f"{h}:1\n" for h in hosts[:n + (stage == 0)]))
                changed = time.monotonic()
                stage += 1
            m = RESIZED.search(line)
            if m:
                boundary = time.monotonic() - float(m.group(4))
                before = _rate(seen, changed - 5.0, changed)
                during = _rate(seen, changed, boundary)
                lead = boundary - changed
                slowed = lead * max(0.0, 1.0 - during / before) if before and during else 0.0
                found.append({"from": int(m.group(1)), "to": int(m.group(2)),
                              "pause_s": float(m.group(4)), "lead_s": lead,
                              "lost_s": float(m.group(4)) + slowed})
                stage, target = stage + 1, int(m.group(3)) + 20
                if len(found) == 2:
                    break
    finally:
        proc.kill()
        proc.wait()
    if len(found) < 2:
        sys.stderr.write("".join(lines[-40:]))
        raise SystemExit(f"pause at {n} workers: {len(found)} resize(s) seen, not 2")
    return {"workers": n, "ahead": ahead, "grow_s": found[0]["pause_s"],
            "shrink_s": found[1]["pause_s"], "grow_lead_s": found[0]["lead_s"],
            "shrink_lead_s": found[1]["lead_s"], "grow_lost_s": found[0]["lost_s"],
            "shrink_lost_s": found[1]["lost_s"]}


def _rate(seen, start: float, end: float) -> float:
    """Iterations per second between the progress lines read in [start, end] (0: fewer
    than two)."""
    inside = [(t, i) for t, i in seen if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return 0.0
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def measure_pauses(sizes) -> list:
    """The pauses of a grow and a shrink at each size, started ahead and after the
    boundary (:func:`pause`), over the tests' private sshd on 127.0.0.1-k; [] without one."""
    sys.path.insert(0, str(C.ROOT / "tests"))
    from sshd import Sshd, ensure_installed      # the tests' private sshd
    why = ensure_installed()
    if why:
        C.progress(f"no resize pauses: no sshd ({why})")
        return []
    pauses = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Sshd(Path(tmp) / "sshd", addresses=[f"127.0.0.{i}" for i in
                                                    range(1, max(sizes) + 2)])
        (Path(tmp) / "sshd").mkdir()
        server.start()
        try:
            for n in sizes:
                for ahead in (True, False) if n % 2 else (False, True):
                    arm = "start ahead" if ahead else "after the boundary"
                    C.progress(f"pause: {n} -> {n + 1} -> {n} workers, {arm}")
                    folder = Path(tmp) / f"pause-{n}-{int(ahead)}"
                    folder.mkdir()
                    pauses.append(pause(n, folder, server.launch_options(), ahead))
                    r = pauses[-1]
                    C.progress(f"  grow {r['grow_s']:.1f} s (after {r['grow_lead_s']:.1f} s), "
                               f"shrink {r['shrink_s']:.1f} s (after {r['shrink_lead_s']:.1f} s)")
                    time.sleep(1)
        finally:
            server.stop()
    return pauses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--sizes", default=None, help="workers before a resize, e.g. 2,4,8")
    p.add_argument("--pause-only", action="store_true",
                   help="measure the pauses only (not the per-iteration cost)")
    p.add_argument("--cost-only", action="store_true",
                   help="measure the per-iteration cost only (not the pauses)")
    C.add_smoke(p)
    args = p.parse_args()
    batch = 128
    if C.smoke(args):
        args.quick, args.rounds, args.iterations, batch = True, 1, 7, 16
        args.sizes = "2"                     # each resize is a job's start: one size
    rounds = args.rounds or (1 if args.quick else 3)
    iterations = args.iterations or (30 if args.quick else 60)
    sizes = [int(x) for x in (args.sizes or ("2" if args.quick else "2,4,8")).split(",")]
    load = _suite.load()
    c = k = None
    if not args.pause_only:
        C.progress("cost in one process: steps with and without the copies, alternating")
        k = keep_cost(4 if C.SMOKE else 80, 64)
        C.progress(f"  on / off (fastest tenth) {k['ratio']['p10']:.3f}")
        c = cost(rounds, iterations, batch)
    pauses = [] if args.cost_only else measure_pauses(sizes)
    table = ""
    if c is not None:
        rows = ["| per iteration: snapshots off | on | on / off | per round |",
                "|---|---|---|---|",
                f"| {C.median(c['off']):.1f} samples/s | {C.median(c['on']):.1f} samples/s | "
                f"**{c['ratio']:.3f}x** | {', '.join(f'{x:.3f}' for x in c['ratios'])} |"]
        table = (f"In one process (`benchmarks/_keep_cost.py`): ResNet-20, a batch of "
                 f"{k['batch']}, {k['steps']} steps per arm alternating (ABBA), each timed "
                 "to the engine drained; other load only adds time, so the arms' fastest "
                 "steps compare the copies' cost:\n\n"
                 "| steps | without the copies | with them | step rate with / without |\n"
                 "|---|---|---|---|\n" + "\n".join(
                     f"| fastest {name} | {k['off'][p] * 1000:.1f} ms | "
                     f"{k['on'][p] * 1000:.1f} ms | **{k['ratio'][p]:.3f}x** |"
                     for p, name in (("p10", "tenth"), ("p25", "quarter"),
                                     ("p50", "half (median)")))
                 + "\n\n"
                 f"ResNet-20 (cifar_resnet20_v1), synthetic data, global batch {batch}, 2 "
                 f"workers at 1:3 + 1 server, {iterations} iterations per run (first 5 left "
                 f"out), {rounds} round(s) interleaved; snapshots on: every worker copies its "
                 "state at the end of each step (what an elastic job does).\n\n"
                 + "\n".join(rows))
    if pauses:
        rows = []
        for n in sizes:
            on, off = (next(r for r in pauses if r["workers"] == n and r["ahead"] is a)
                       for a in (True, False))
            rows.append(f"| {n} | **{on['grow_s']:.1f} s** (after {on['grow_lead_s']:.1f} s; "
                        f"lost {on['grow_lost_s']:.1f} s) | **{on['shrink_s']:.1f} s** (after "
                        f"{on['shrink_lead_s']:.1f} s; lost {on['shrink_lost_s']:.1f} s) | "
                        f"{off['grow_s']:.1f} s | {off['shrink_s']:.1f} s |")
        table += (("\n\n" if table else "") + "| workers n | grow n -> n+1, started ahead | "
                  "shrink n+1 -> n, started ahead | grow, started after the boundary | "
                  "shrink, after the boundary |\n|---|---|---|---|---|\n" + "\n".join(rows)
                  + "\n\nPause: from the old job's state saved at the boundary to the new "
                  "job's first iteration (the launcher's `resized` line). Started ahead "
                  "(`--start-ahead`, the default): the next workers start while the job trains "
                  "on its old hosts; after: from the discovery script's change to that "
                  "boundary; lost: the pause plus the iterations the job did not train "
                  "meanwhile, in seconds (the lead times one less the ratio of its iteration "
                  "rate then to its rate in the 5 s before the change: the new processes share "
                  "the cores). `--no-start-ahead` starts them after the boundary: its pause "
                  "is all it loses. Over a private sshd on 127.0.0.1-k (every process on these "
                  "2 cores), the tiny ledger MLP, the two arms one after the other at each "
                  f"size; load average {load:.1f} at the start.")
    C.write("elastic" + ("_quick" if args.quick and not C.SMOKE else "")
            + ("_pauses" if args.pause_only else "") + ("_cost" if args.cost_only else ""),
            {"cost": c, "keep_cost": k, "pauses": pauses, "load_at_start": load}, table)


if __name__ == "__main__":
    main()
