"""Many emulated hosts on this machine: a real job of 64 workers on 8 hosts, each host's
workers behind its relay and the relays behind a hub (issue 26), end to end, and its metrics
in `mxlbbsp report`.

The hosts are 127.0.0.1 .. 127.0.0.H, reached over SSH through a private sshd of their own
(tests/sshd.py: its own keys and port, loopback only; installed from Debian's packages when
missing), with a hostfile of K slots each: the launcher starts every role as on a cluster
(a guard per role at the end of an SSH session), a relay on each host (``--relay on``),
and each host's workers reach their relay through its Unix socket; the relays reach the
coordinator through a hub on this machine (``--hubs on``, the default here; ``--hubs off``:
directly). The model is tiny (an
MLP on sklearn's digits, global batch 4 per worker) so that 64 MXNet processes fit on 2
cores; what it shows is that the path works at this size, not speed.

Checked: the job ends with exit 0; the launcher started H relays (and the hubs), which
forecast their workers' speeds (the coordinator's ``-v`` line); the metrics file holds one
record per worker per iteration, with each worker's host; ``mxlbbsp report`` reads it and
writes its report. Recorded: the wall time, the time to the first iteration, the
iterations' pace, and the coordinator's summary.

    python benchmarks/many_hosts.py                  # 8 hosts x 8 workers, 20 iterations
    python benchmarks/many_hosts.py --smoke          # 2 hosts x 2 workers, 5 iterations
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _common as C
import _suite as S

sys.path.insert(0, str(C.ROOT / "tests"))
from sshd import Sshd, ensure_installed  # noqa: E402
from launcher.config import RELAYS_PER_HUB  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=8, help="emulated hosts, 127.0.0.1 .. (8)")
    p.add_argument("--per-host", type=int, default=8, help="workers per host (8)")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--hubs", choices=["on", "off"], default="on",
                   help="the relays reach the coordinator through hubs (on: the default) or "
                        "directly")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for the whole job")
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):
        args.hosts, args.per_host, args.iterations = 2, 2, 5
    if not 1 <= args.hosts <= 250 or args.per_host < 1 or args.iterations < 2:
        p.error("--hosts 1..250, --per-host >= 1, --iterations >= 2")
    problem = ensure_installed()
    if problem:
        sys.exit(f"many_hosts.py: error: no sshd: {problem}")
    n = args.hosts * args.per_host
    addresses = [f"127.0.0.{h + 1}" for h in range(args.hosts)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sshd = Sshd(tmp / "sshd", addresses, max_startups=str(4 * n + 50))
        sshd.start()
        try:
            hostfile = tmp / "hosts"
            hostfile.write_text("".join(f"{a} slots={args.per_host}\n" for a in addresses))
            metrics = tmp / "m.jsonl"
            marker = uuid.uuid4().hex
            argv = [C.PY, "-m", "mxlbbsp.launcher", "launch", "-H", str(hostfile),
                    *sshd.launch_options(), "--env", f"MXLBBSP_TEST_MARK={marker}",
                    "--metrics", str(metrics), "--progress", "10", "--relay", "on", "--hubs", args.hubs, "-v",
                    "--",
                    C.PY, str(C.EXAMPLE), "--model", "mlp", "--data", "digits",
                    "--batch-size", str(4 * n), "--epochs", "1000",
                    "--iterations", str(args.iterations), "--log-interval", "0"]
            C.progress(f"{n} workers on {args.hosts} hosts over SSH (load {S.load():.1f})")
            started = time.monotonic()
            job = subprocess.run(argv, cwd=C.ROOT, env=C.env(), capture_output=True, text=True,
                                 timeout=args.timeout, stdin=subprocess.DEVNULL)
            wall = time.monotonic() - started
            output = job.stdout + job.stderr
            if job.returncode != 0:
                sys.stderr.write(output[-4000:])
                sys.exit(f"many_hosts.py: the job failed ({job.returncode})")
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            report = subprocess.run([C.PY, "-m", "mxlbbsp.launcher", "report", str(metrics),
                                     "-o", str(tmp / "report")], cwd=C.ROOT, env=C.env(),
                                    capture_output=True, text=True, timeout=600)
        finally:
            sshd.stop()
        checks = check(args, n, output, rows, report, tmp / "report")
    summary = re.search(r"\[mxlbbsp\] (done in .*)", job.stderr)
    first = min((r["time"] for r in rows), default=None)
    pace = _pace(rows)
    table = (f"A real job on this machine: {n} workers on {args.hosts} emulated hosts "
             f"(127.0.0.1 .. 127.0.0.{args.hosts}, {args.per_host} slots each) over SSH through "
             f"a private sshd, a relay on each host (--relay on), "
             f"{'the relays behind hubs (--hubs on)' if args.hubs == 'on' else 'no hub'}, "
             f"1 server; an MLP on "
             f"digits, global batch {4 * n}, {args.iterations} iterations.\n\n"
             "| check | result |\n|---|---|\n"
             + "\n".join(f"| {name} | {'yes' if ok else 'NO'}: {detail} |"
                         for name, ok, detail in checks)
             + f"\n\nWall time {wall:.0f} s (launch to the end, SSH sessions, {n} MXNet "
             f"imports on 2 cores); the iterations' pace once running: "
             f"{pace:.2f} s per iteration (median time between iterations' first records). "
             f"The launcher's last line: `{summary[1] if summary else '-'}`. Load average "
             f"at the end: {S.load():.1f}.")
    C.write("many_hosts", {"hosts": args.hosts, "per_host": args.per_host, "workers": n,
                           "iterations": args.iterations, "wall_s": wall,
                           "seconds_per_iteration": pace, "first_record": first,
                           "checks": [{"check": c, "ok": ok, "detail": d}
                                      for c, ok, d in checks]}, table)
    if not all(ok for _, ok, _ in checks):
        sys.exit("many_hosts.py: a check failed (see the table)")


def check(args, n: int, output: str, rows, report, folder: Path):
    """(check, passed, detail) for each thing the run must show."""
    per_iteration = {}
    for r in rows:
        per_iteration.setdefault(r["iteration"], set()).add(r["rank"])
    whole = [t for t, ranks in per_iteration.items() if ranks == set(range(n))]
    hosts = {r["host"] for r in rows}
    relays = re.search(r"started (\d+) worker\(s\), (\d+) relay\(s\)( through (\d+) hub)?",
                       output)
    hubs = -(-args.hosts // RELAYS_PER_HUB) if args.hubs == "on" else 0
    forecast = re.search(r"the relays \((\d+) connection\(s\)\) forecast their (\d+) workers",
                         output)
    return [
        ("the launcher started a relay per host" + (f" and {hubs} hub(s)" if hubs else ""),
         bool(relays) and relays.group(1, 2) == (str(n), str(args.hosts))
         and relays.group(4) == (str(hubs) if hubs else None),
         relays[0] if relays else "no relay started"),
        ("the relays forecast their workers (-v's line)",
         bool(forecast) and forecast.groups() == (str(hubs or args.hosts), str(n)),
         forecast[0] if forecast else "no such line"),
        ("one record per worker per iteration", len(whole) == len(per_iteration) >= 2
         and len(rows) == n * len(per_iteration),
         f"{len(rows)} records, {len(per_iteration)} iterations of {n} workers"),
        ("every host in the records", len(hosts) == args.hosts, ", ".join(sorted(hosts))),
        ("mxlbbsp report reads them", report.returncode == 0
         and (folder / "index.html").exists(),
         "index.html written" if report.returncode == 0 else report.stderr[-300:]),
    ]


def _pace(rows) -> float:
    starts = {}
    for r in rows:
        starts[r["iteration"]] = min(starts.get(r["iteration"], r["time"]), r["time"])
    times = [starts[t] for t in sorted(starts)][1:]
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2] if gaps else float("nan")


if __name__ == "__main__":
    main()
