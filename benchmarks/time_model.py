"""The default time model (``--time-model auto``) in simulation: how close to the best split
does the coordinator's balancing get, with equal and unequal workers, when the fixed cost
per iteration dominates (tiny models) and when it does not?

A real ``Coordinator`` (default predictor and time model) is fed simulated iteration times
through its report handler, with no sockets and no clock, so that many noisy runs take
seconds and always give the same answer. Two workers, global batch 64; worker i takes
``slow_i * (fixed + per_sample * b_i)`` seconds, times noise: lognormal (sigma ``--noise``)
and, in 5 % of iterations (2 % with ``--noise`` <= 0.1), an iteration stretched 3x by
another tenant. The figure is the makespan of the chosen split over the best possible one,
averaged over iterations 30-119 and over ``--seeds`` seeds; ``runs > 1.5:1``: equal workers
whose split was beyond 1.5:1 for most of iterations 60-119. A second scenario: a tenant
slows worker 0 2x for iterations 35-54 and leaves; does the split come back to equal, and
how many iterations after it left are beyond 1.5:1 (also on a 98 % fixed cost)? A
third: tenants alternate between the workers, 2x on worker 0 for 35 iterations, then on
worker 1, and so on for 300 iterations (benchmarks/contention.py's "alternating" schedule);
makespan over the best split of the moment over iterations 30-299, and the share of those
iterations at the equal split.

``--baseline REV`` runs the same simulation on the code of another commit (a temporary git
worktree), side by side in the same table.

    python benchmarks/time_model.py --baseline c31b2c6
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CASES = [(0.004, 0.00003, slow) for slow in (1.0, 1.5, 3.0)] + \
        [(0.001, 0.0003, slow) for slow in (1.0, 1.5, 3.0)]
B = 64
#: the tenant scenario also on a 98 % fixed cost (a model even tinier than the MLP's 81 %)
TENANT_CASES = [(0.004, 0.000003)] + [(fixed, per_sample) for fixed, per_sample, _ in CASES[::3]]


def factors(t, slow, tenant=False, period=0):
    """The workers' slowdowns at iteration t."""
    if period:                                  # tenants alternating between the workers
        return np.array([2.0, 1.0]) if (t // period) % 2 == 0 else np.array([1.0, 2.0])
    return np.array([2.0 if tenant and 35 <= t < 55 else 1.0, slow])


def run(seed, fixed_s, per_sample_s, slow, noise, iterations=120, tenant=False, period=0):
    """Worker 0's batch size in iterations 1, 2, ... (each split applied to the iteration
    it was sent for)."""
    import mxlbbsp
    if (Path(mxlbbsp.__file__).parent / "control").is_dir():
        from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
    else:                    # --baseline of a commit before the layer folders (issue 21)
        from mxlbbsp.coordinator import Coordinator, CoordinatorConfig
    rng = np.random.default_rng(seed)
    spike = 0.05 if noise > 0.1 else 0.02
    c = Coordinator(CoordinatorConfig(num_workers=2, token="t"))
    sent = {}                    # no workers to send to: each split kept for its iteration
    c.send_split = c._send_allocation = lambda t, split: sent.__setitem__(t, np.array(split))
    split = np.array([B // 2, B - B // 2])
    c._sizes = c._in_force = split.copy()          # _sizes: a --baseline commit's name for it
    out = []
    for t in range(iterations):
        factor = factors(t, slow, tenant, period)
        stretch = rng.lognormal(0, noise, 2) * np.where(rng.random(2) < spike, 3, 1)
        compute = (fixed_s + per_sample_s * split) * factor * stretch
        reports = {r: {"type": "report", "iteration": t, "batch_size": int(split[r]),
                       "compute_s": float(compute[r]), "next_global_batch": B,
                       "after_next_global_batch": B}
                   for r in range(2)}
        if hasattr(c, "collect"):      # this tree: the reports as they reach the coordinator
            from mxlbbsp.core.frames import Rows
            for r in range(2):
                decided = c.collect.reports(Rows.from_messages([r], [reports[r]], 0.0))
            c.decide(*decided)
        else:                          # --baseline of a commit before issue 26's relays
            c._on_iteration(t, reports)
        # the split of the next iteration, when one was sent for it (a tree whose reports of
        # t split t+2 sent it an iteration before, or before any report)
        split = sent.pop(t + 1, split)
        out.append(int(split[0]))
    return out


def median_ratio(b0):
    ratios = sorted(max(b, B - b) / min(b, B - b) for b in b0)
    return ratios[len(ratios) // 2]


def simulate(seeds, noise):
    splits = []              # every run's batch sizes, for the identity check of --baseline
    rows = []
    for fixed_s, per_sample_s, slow in CASES:
        def makespan(b0):
            return max(fixed_s + per_sample_s * b0, slow * (fixed_s + per_sample_s * (B - b0)))
        best = min(makespan(b) for b in range(1, B))
        values, held = [], 0
        for seed in range(seeds):
            b0 = run(seed, fixed_s, per_sample_s, slow, noise)
            splits.append(b0)
            values.append(float(np.mean([makespan(b) for b in b0[30:]]) / best))
            held += slow == 1.0 and median_ratio(b0[60:]) > 1.5
        rows.append({"fixed_share": fixed_s / (fixed_s + per_sample_s * B / 2), "slow": slow,
                     "mean": float(np.mean(values)), "worst": float(np.max(values)),
                     "equal_split": makespan(B // 2) / best,
                     "held": int(held) if slow == 1.0 else None})
    tenant = []
    for fixed_s, per_sample_s in TENANT_CASES:
        b0s = [run(seed, fixed_s, per_sample_s, 1.0, noise, 140, True) for seed in range(seeds)]
        splits += b0s
        # b0[t] is the split of iteration t + 1: b0[54:] are iterations 55-139
        beyond = [sum(max(b, B - b) > 1.5 * min(b, B - b) for b in b0[54:]) for b0 in b0s]
        tenant.append({"fixed_share": fixed_s / (fixed_s + per_sample_s * B / 2),
                       "runs_held": sum(median_ratio(b0[80:]) > 1.5 for b0 in b0s),
                       "beyond": float(np.mean(beyond))})
    alternating = []
    for fixed_s, per_sample_s, _ in CASES[::3]:
        ratio, equal = [], []
        for seed in range(seeds):
            b0 = run(seed, fixed_s, per_sample_s, 1.0, noise, 300, period=35)
            splits.append(b0)
            for t in range(30, 300):
                f = factors(t + 1, 1.0, period=35)   # b0[t] is the split of iteration t + 1

                def makespan(b):
                    return max(f[0] * (fixed_s + per_sample_s * b),
                               f[1] * (fixed_s + per_sample_s * (B - b)))
                ratio.append(makespan(b0[t]) / min(makespan(b) for b in range(1, B)))
                equal.append(b0[t] == B // 2)
        alternating.append({"fixed_share": fixed_s / (fixed_s + per_sample_s * B / 2),
                            "mean": float(np.mean(ratio)), "equal": float(np.mean(equal))})
    return {"cases": rows, "tenant": tenant, "alternating": alternating, "splits": splits}


def identical(mine, theirs, name) -> str:
    """Whether two simulations chose the same batch size at every iteration of every run:
    one line that says so, or where they first differ."""
    a, b = mine["splits"], theirs.get("splits")
    if b is None:
        return f"{name}: no batch sizes to compare (its simulate() does not return them)"
    iterations = sum(len(x) for x in a)
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            t = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v) if len(x) == len(y) \
                else min(len(x), len(y))
            return (f"batch sizes differ from {name}'s: run {k} (of {len(a)}), iteration {t + 1}"
                    f" ({x[t] if t < len(x) else '-'} against {y[t] if t < len(y) else '-'})")
    if len(a) != len(b):
        return f"{name} simulated {len(b)} runs, this tree {len(a)}"
    return (f"**batch sizes identical to {name}'s** in all {len(a)} runs ({iterations} "
            "iterations)")


def baseline(rev, seeds, noise):
    """The same simulation on the code of ``rev``, in a temporary worktree."""
    import _common
    with _common.worktree(rev) as tree:
        res = subprocess.run([sys.executable, __file__, "--simulate-in", str(tree),
                              "--seeds", str(seeds), "--noise", str(noise)],
                             capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def table(results, names, noise, seeds):
    lines = [f"### noise {noise:.0%} (lognormal sigma {noise}), {seeds} seeds", "",
             "makespan / best (mean over iterations 30-119 and seeds; worst seed)", "",
             "| fixed cost | worker 1 | equal split | " +
             " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for i, row in enumerate(results[0]["cases"]):
        cells = []
        for r in results:
            c = r["cases"][i]
            held = f", runs > 1.5:1: {c['held']}/{seeds}" if c["held"] is not None else ""
            cells.append(f"{c['mean']:.3f} (worst {c['worst']:.3f}{held})")
        lines.append(f"| {row['fixed_share']:.0%} | {row['slow']:g}x slower | "
                     f"{row['equal_split']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "A tenant slows worker 0 2x for iterations 35-54, then leaves: runs whose "
              "split stayed beyond 1.5:1 over iterations 80-139; iterations beyond 1.5:1 "
              "from 55 to 139 (mean over seeds)", "",
              "| fixed cost | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, row in enumerate(results[0]["tenant"]):
        lines.append(f"| {row['fixed_share']:.0%} | " + " | ".join(
            f"{r['tenant'][i]['runs_held']}/{seeds}; {r['tenant'][i]['beyond']:.1f} iterations"
            for r in results) + " |")
    lines += ["", "Tenants alternating between the workers every 35 iterations (2x): makespan / "
              "best over iterations 30-299 and seeds; share of those iterations at the equal "
              "split", "",
              "| fixed cost | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, row in enumerate(results[0]["alternating"]):
        lines.append(f"| {row['fixed_share']:.0%} | " + " | ".join(
            f"{r['alternating'][i]['mean']:.3f} ({r['alternating'][i]['equal']:.0%} at the "
            f"equal split)" for r in results) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--noise", default="0.3,0.1",
                   help="comma-separated noise levels (lognormal sigma)")
    p.add_argument("--baseline", metavar="REV", help="also simulate the code of this commit")
    p.add_argument("--simulate-in", metavar="TREE", help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true",
                   help="smallest size (seconds): one seed, one noise level; the results go "
                        "to $MXLBBSP_BENCH_RESULTS or a temporary folder")
    args = p.parse_args()
    if args.smoke and not args.simulate_in:
        args.seeds, args.noise = 1, args.noise.split(",")[0]
    if args.simulate_in:                     # a child: the code of another tree, JSON out
        sys.path.insert(0, args.simulate_in)
        import mxlbbsp
        if not mxlbbsp.__file__.startswith(args.simulate_in):
            sys.exit(f"imported {mxlbbsp.__file__}, not the tree {args.simulate_in}")
        print(json.dumps(simulate(args.seeds, float(args.noise))))
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _common
    from _common import progress, write
    _common.smoke(args)
    sections, payload = [], {}
    for noise in (float(x) for x in args.noise.split(",")):
        progress(f"noise {noise}: this tree")
        results, names = [simulate(args.seeds, noise)], ["now"]
        same = None
        if args.baseline:
            progress(f"noise {noise}: {args.baseline}")
            results.append(baseline(args.baseline, args.seeds, noise))
            names.append(args.baseline)
            same = identical(results[0], results[1], args.baseline)
            progress(same)
        for r in results:
            r.pop("splits", None)
        payload[str(noise)] = dict(zip(names, results))
        if same is not None:
            payload[str(noise)]["identical"] = same
        sections.append(table(results, names, noise, args.seeds)
                        + (f"\n\n{same}" if same else ""))
    head = ("# The auto time model in simulation\n\nA real Coordinator fed simulated "
            "iteration times (see the docstring of benchmarks/time_model.py); deterministic: "
            "the same seeds give the same figures on any machine.")
    write("time_model", payload, head + "\n\n" + "\n\n".join(sections))


if __name__ == "__main__":
    main()
