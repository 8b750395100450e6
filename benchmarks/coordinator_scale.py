"""Coordinator scale: the real coordinator with 16 to 1024 simulated workers over loopback.

(About 740 lines: the simulated workers, one measurement, its side-by-side runs and their
tables are one experiment; the emulated hosts' relays are in _hosts.py.)

The coordinator is ``mxlbbsp.control.coordinator.Coordinator`` exactly as ``mxlbbsp launch`` runs it
(its own thread and asyncio loop in this process; ``lbbsp``, the default predictor and time
model, a metrics file). The workers are light clients that speak ``mxlbbsp.core.protocol``:
asyncio protocols (no MXNet), a few hundred per client process, in separate processes.
Each one says ``hello`` with the job's token, then per iteration t

    report(t)  ->  wait for slice(t+2)  ->  done(t)  ->  (simulated compute)  ->  report(t+1)

(the coordinator's answer to the reports of t is the split of t+2: lbbsp decides a split an
iteration ahead, and iteration t+1's came with the reports of t-1, or right after the
``welcome``; a worker's slice of t+1 is the one it received then)

Every worker has a speed of its own (heterogeneous, drifting slowly, with noise), reports
``compute_s = b_i / v_i`` for the batch it was given, so the balancer really rebalances.
Three arrival patterns of the reports:

* ``spread``: each worker sleeps its simulated compute time (about ``--compute-ms``, with the
  spread that imperfect balancing leaves) before it reports -- as in a real job;
* ``burst``: after the iteration's compute (the slowest worker's time), every worker reports
  at the same instant -- perfect balancing, the worst case of a real job: the coordinator must
  read all n reports before it can answer;
* ``flood``: no compute at all: each worker sends done(t) and report(t+1) back to back, so the
  coordinator's handling of the dones and the metrics records of t also falls inside the
  latency window. A stress test of its throughput; a real iteration is never this short.

Emulated hosts (``--per-host K``, default 8; 0: none): the workers sit K to a host behind
their host's relay (``mxlbbsp.relay``, as ``mxlbbsp launch`` runs a job with K workers per
host), so the coordinator has n/K connections, each a host's reports and dones of an
iteration in one frame. The relays are the real ones, all in one process on the client cores
(benchmarks/_hosts.py): on a cluster each runs on its own host, in parallel.

Measured per iteration: the **allocation latency**, from the moment the last report of
iteration t is sent (client clock) until every worker has received the answer, slice(t+2)
(the last client's receive time; CLOCK_MONOTONIC is the same clock in every process on
Linux); with relays also the **relay-to-relay latency**, from the last relay's report section
of t sent to the last relay's SLICES frame of t+2 received (the coordinator's share: on this machine
the end-to-end figure also holds the n/K relays taking turns on one core); the coordinator
thread's CPU time per iteration (its thread CPU clock, slope over the measured iterations),
its metrics writer thread's, and the relays' process's (per relay: divided by n/K); and
``Coordinator.split_latency`` (server side: from the last report's arrival to the allocation
written to every socket). Median and p99 over the measured iterations (the first ``--skip``
are left out).

    python benchmarks/coordinator_scale.py --quick             # 16..1024 workers (~3 min)
    python benchmarks/coordinator_scale.py                     # 200 iterations (~5 min)
    python benchmarks/coordinator_scale.py --profile 256       # + where the time goes (~1 min)
    python benchmarks/coordinator_scale.py --baseline REV --sizes 16,256 --arrivals spread
                                       # this tree against commit REV's code, side by side
                                       # (REV's own script: workers direct if it has no relays)
    python benchmarks/coordinator_scale.py --predictors narx,ema --sizes 256  # likewise
    python benchmarks/coordinator_scale.py --relays-vs-direct --sizes 16,64   # likewise

Placement (``--placement``): ``pinned`` (default) runs the coordinator's thread alone on the
first core and the simulated workers on the others, as on a cluster, where the workers are
other machines; ``shared`` lets all of them compete for all cores. 256 workers are also
measured with the other placement (``--shared-sizes``), for comparison.
    python benchmarks/coordinator_scale.py --client-smoke      # 4 workers, a few iterations
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing as mp
import os
import pstats
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _hosts  # noqa: E402
from mxlbbsp import modes as _modes  # noqa: E402
from mxlbbsp.core import protocol as P  # noqa: E402
from mxlbbsp.control.coordinator import Coordinator
from mxlbbsp.control.coordinator import CoordinatorConfig  # noqa: E402
from launcher.config import HUB_FROM, RELAYS_PER_HUB  # noqa: E402

SIZES = [16, 64, 256, 1024]
#: the reports of t are answered with the split of t+1+AHEAD (lbbsp's)
AHEAD = _modes.get("lbbsp").policy.ahead
#: simulated workers per emulated host (behind its relay); 0: every worker connected directly
PER_HOST = 8


# ---- the simulated workers (client processes) ---------------------------------------------

class _Worker(asyncio.Protocol):
    """One simulated worker's connection: records when each line arrives."""

    def __init__(self, rank: int, group: "_Group"):
        self.rank = rank
        self.group = group
        self.transport = None
        self.buf = b""
        self.lines: List[Tuple[bytes, float]] = []   # lines not yet read, when each came
        self.line: Optional[bytes] = None     # the line read last (:meth:`next`)
        self.received = 0.0                   # when it arrived (perf_counter)
        self.sent = 0.0                       # when the latest report was written
        self.slices: Dict[int, int] = {}      # iteration -> the size of its slice

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes):
        now = time.perf_counter()
        self.buf += data
        while True:
            cut = self.buf.find(b"\n")
            if cut < 0:
                return
            line, self.buf = self.buf[:cut + 1], self.buf[cut + 1:]
            self.lines.append((line, now))
            self.group.arrived()

    def next(self) -> dict:
        """The next line that came (its time in :attr:`received`)."""
        self.line, self.received = self.lines.pop(0)
        return json.loads(self.line)

    def connection_lost(self, exc):
        self.group.lost(self.rank)

    def send(self, msg: dict) -> None:
        self.transport.write(P.encode(msg))

    def report(self, t: int, batch: int, compute_s: float, B: int) -> None:
        self.send(P.report(t, batch, compute_s, 50.0, 30.0, 1.0, B))
        self.sent = time.perf_counter()


class _Group:
    """The workers of one client process; ``wait()`` returns when each has one new line."""

    def __init__(self):
        self.pending = 0
        self.event = asyncio.Event()
        self.failed: Optional[str] = None

    def expect(self, count: int) -> None:
        self.pending = count
        self.event.clear()

    def arrived(self) -> None:
        self.pending -= 1
        if self.pending <= 0:
            self.event.set()

    def lost(self, rank: int) -> None:
        if self.failed is None:
            self.failed = f"worker {rank} lost its connection"
        self.event.set()

    async def wait(self, timeout: float = 60.0) -> None:
        await asyncio.wait_for(self.event.wait(), timeout)
        if self.failed and self.pending > 0:
            raise RuntimeError(self.failed)


def _speeds(rank: int, n: int, iterations: int, seed: int, B: int, compute_ms: float):
    """Worker ``rank``'s true speed (samples/s) per iteration: a fixed speed class (1x to 3x),
    a slow sinusoidal drift of +-20% with a phase of its own, and 3% noise. Scaled so that a
    perfect split of B takes about ``compute_ms``."""
    rng = np.random.default_rng([seed, rank])
    base = 1.0 + 2.0 * ((rank * 0.6180339887) % 1.0)      # spread evenly over [1, 3)
    mean_base = 2.0
    scale = B / (compute_ms / 1000.0) / (n * mean_base)
    t = np.arange(iterations + 1)
    drift = 1.0 + 0.2 * np.sin(2 * np.pi * t / 80.0 + rng.uniform(0, 2 * np.pi))
    noise = rng.normal(1.0, 0.03, size=t.shape).clip(0.8, 1.2)
    return base * scale * drift * noise


async def _client(addr, token: str, ranks: List[int], n: int, B: int, iterations: int,
                  compute_ms: float, arrival: str, seed: int) -> dict:
    """``addr``: the coordinator's (host, port), or per rank its address (its relay's)."""
    loop = asyncio.get_running_loop()
    group = _Group()
    workers = []
    for rank in ranks:
        where = addr[rank] if isinstance(addr, dict) else tuple(addr)
        if isinstance(where, str):
            _, w = await loop.create_unix_connection(lambda r=rank: _Worker(r, group),
                                                     P.parse_address(where))
        else:
            _, w = await loop.create_connection(lambda r=rank: _Worker(r, group), *where)
        workers.append(w)
    speeds = {w.rank: _speeds(w.rank, n, iterations, seed, B, compute_ms) for w in workers}
    group.expect(len(workers) * (1 + AHEAD))       # the welcome, and the splits after it
    for w in workers:
        hello = P.hello(w.rank, token, os.getpid(), "127.0.0.1", B, 100 * B, None)
        hello["min_global_batch"] = B
        w.send(hello)
    await group.wait(120)
    for w in workers:
        welcome = w.next()
        if welcome["type"] != P.WELCOME:
            raise RuntimeError(f"coordinator answered {welcome}")
        for _ in range(AHEAD):
            msg = w.next()
            w.slices[msg["iteration"]] = msg["size"]
    sizes = dict(enumerate(welcome["split"]))      # rank -> its batch size
    last_sent, first_recv, last_recv = [], [], []
    for t in range(iterations):
        group.expect(len(workers))
        compute = {w.rank: sizes[w.rank] / speeds[w.rank][t] for w in workers}
        if arrival == "spread":
            start = loop.time()
            for w in workers:
                loop.call_at(start + compute[w.rank], w.report, t, sizes[w.rank],
                             compute[w.rank], B)
        elif arrival == "burst":
            await asyncio.sleep(max(compute.values()))
            for w in workers:
                w.report(t, sizes[w.rank], compute[w.rank], B)
        else:                                   # flood
            for w in workers:
                w.report(t, sizes[w.rank], compute[w.rank], B)
        await group.wait()
        for w in workers:            # one message per worker: its own slice
            msg = w.next()
            if msg["type"] != P.SLICE or msg["iteration"] != t + 1 + AHEAD \
                    or msg["total"] != B or msg["size"] < 1:
                raise RuntimeError(f"iteration {t}: expected slice({t + 1 + AHEAD}) of {B} "
                                   f"samples, got {w.line[:200]!r}")
            w.slices[msg["iteration"]] = msg["size"]
            sizes[w.rank] = w.slices.pop(t + 1)
        last_sent.append(max(w.sent for w in workers))
        first_recv.append(min(w.received for w in workers))
        last_recv.append(max(w.received for w in workers))
        for w in workers:
            w.send(P.done(t, 0.001, 0.001, compute[w.rank] + 0.002))
    for w in workers:
        w.send(P.bye())
        w.transport.close()
    return {"last_sent": last_sent, "first_recv": first_recv, "last_recv": last_recv,
            "final_sizes": [sizes[r] for r in ranks]}


def _client_process(addr, token, ranks, n, B, iterations, compute_ms, arrival, seed, conn,
                    nice=0, cpus=None):
    try:
        if nice:
            os.nice(nice)
        if cpus:
            os.sched_setaffinity(0, cpus)
        conn.send(("ok", asyncio.run(_client(addr, token, ranks, n, B, iterations,
                                             compute_ms, arrival, seed))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


# ---- one measurement ------------------------------------------------------------------------

def _thread_clock(name: str):
    """The CPU clock of this process's thread ``name`` (None while there is none)."""
    for th in threading.enumerate():
        if th.name == name and th.ident is not None:
            return time.pthread_getcpuclockid(th.ident)
    return None


def _coordinator_thread() -> threading.Thread:
    for th in threading.enumerate():
        if th.name == "mxlbbsp-coordinator":
            return th
    raise RuntimeError("the coordinator thread is not running")


def _start_hosted(ctx, target, what: str, args: tuple, cpus):
    """A process of the emulated relays or hubs (``_hosts``), once they listen: (process,
    its pipe)."""
    pipe, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, daemon=True, args=(*args, child, cpus))
    proc.start()
    child.close()
    if not pipe.poll(120) or pipe.recv()[0] != "ready":
        raise RuntimeError(f"the {what} did not start")
    return proc, pipe


def _hosted_result(started, what: str) -> dict:
    """The stats of a process of ``_start_hosted`` once it ended."""
    proc, pipe = started
    if not pipe.poll(60):
        raise RuntimeError(f"the {what} ended without a result")
    status, stats = pipe.recv()
    if status != "ok":
        raise RuntimeError(f"the {what} failed: {stats}")
    proc.join(10)
    return stats


def measure(n: int, iterations: int, arrival: str = "spread", compute_ms: float = 100.0,
            processes: Optional[int] = None, skip: int = 5, seed: int = 0,
            profile: bool = False, metrics: bool = True, instrument: bool = False,
            predictor: Optional[str] = None, nice: int = 0,
            placement: str = "pinned", per_host: int = PER_HOST,
            per_hub: Optional[int] = None) -> dict:
    """Run the coordinator with ``n`` simulated workers; returns the latency/CPU summary.

    ``placement``: ``pinned`` runs the coordinator thread on the first core and the simulated
    workers on the others (as on a real cluster, where the workers are other machines);
    ``shared`` lets Linux schedule all of them on all cores. ``per_host``: workers per
    emulated host, behind its relay (0 or 1: every worker connected directly); ``per_hub``:
    relays per hub (0 or 1: none; None: as ``mxlbbsp launch --hubs auto``, RELAYS_PER_HUB
    from HUB_FROM relays)."""
    if placement not in ("pinned", "shared"):
        raise ValueError(f"placement must be pinned or shared, not {placement!r}")
    B = 64 * n
    cores = sorted(os.sched_getaffinity(0))
    coord_cpus = client_cpus = None
    if placement == "pinned" and len(cores) >= 2:
        coord_cpus, client_cpus = {cores[0]}, set(cores[1:])
    # pinned: one client process per client core (more would only time-slice on the same
    # core and add context switches to the measured latency); shared: n/128, 1..4
    processes = processes or (len(client_cpus) if client_cpus else max(1, min(4, n // 128)))
    saved_affinity = os.sched_getaffinity(0)
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp:
        options = {"predictor": predictor} if predictor else {}
        config = CoordinatorConfig(num_workers=n, token=token, sync="lbbsp",
                                   metrics=os.path.join(tmp, "m.jsonl") if metrics
                                   else None, **options)
        coord = Coordinator(config)
        spent = _instrument(coord) if instrument else None
        if coord_cpus:                   # the coordinator's thread inherits this thread's
            os.sched_setaffinity(0, coord_cpus)
        try:
            addr = coord.start()
        finally:
            os.sched_setaffinity(0, saved_affinity)
        profiler = None
        try:
            cpu_clock = time.pthread_getcpuclockid(_coordinator_thread().ident)
            if profile:
                import cProfile
                profiler = cProfile.Profile()
                asyncio.run_coroutine_threadsafe(_call(profiler.enable), coord._loop).result()
            ctx = mp.get_context("spawn")
            where, relays = addr, None
            hubs = None
            if per_host > 1:                 # the emulated hosts' relays, then the workers
                hosts, addresses = _hosts.plan(n, per_host)
                where = dict(enumerate(addresses))
                upstream = addr
                if per_hub is None:
                    per_hub = RELAYS_PER_HUB if len(hosts) >= HUB_FROM else 0
                if per_hub > 1:              # their hubs first, in a process of their own
                    hub_list, upstream = _hosts.hub_plan(hosts, per_hub)
                    hubs = _start_hosted(ctx, _hosts.hub_process, "hubs",
                                         (addr, token, hub_list), client_cpus)
                relays = _start_hosted(ctx, _hosts.relay_process, "relays",
                                       (upstream, token, hosts), client_cpus)
            chunks = np.array_split(np.arange(n), processes)
            procs, pipes = [], []
            for chunk in chunks:
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_client_process, daemon=True, args=(
                    where, token, [int(r) for r in chunk], n, B, iterations, compute_ms,
                    arrival, seed, child, nice, client_cpus))
                proc.start()
                child.close()
                procs.append(proc)
                pipes.append(parent)
            # CPU of the coordinator thread (and of its metrics writer, once it runs)
            # against its progress, sampled every 5 ms
            samples = []
            deadline = time.monotonic() + 600
            writer_clock = None
            while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
                if writer_clock is None:
                    writer_clock = _thread_clock("mxlbbsp-recorder")
                samples.append((coord.progress().iteration, time.clock_gettime(cpu_clock),
                                0.0 if writer_clock is None
                                else time.clock_gettime(writer_clock)))
                if all(pipe.poll() for pipe in pipes):
                    break
                time.sleep(0.005)
            results = []
            for proc, pipe in zip(procs, pipes):
                try:
                    if not pipe.poll(60):
                        raise EOFError
                    status, payload = pipe.recv()
                except EOFError:
                    proc.join(5)
                    raise RuntimeError(f"a client process ended without a result (exit code "
                                       f"{proc.exitcode})") from None
                if status != "ok":
                    raise RuntimeError(f"client process failed: {payload}")
                results.append(payload)
                proc.join(10)
            relay_stats = _hosted_result(relays, "relays") if relays is not None else None
            hub_stats = _hosted_result(hubs, "hubs") if hubs is not None else None
            if profiler is not None:
                asyncio.run_coroutine_threadsafe(_call(profiler.disable), coord._loop).result()
            if coord.failure:
                raise RuntimeError(f"coordinator failed: {coord.failure}")
            server = np.array(list(coord.split_latency)[max(skip - 1, 0):]) * 1000
        finally:
            coord.stop()
    last_sent = np.max([r["last_sent"] for r in results], axis=0)
    last_recv = np.max([r["last_recv"] for r in results], axis=0)
    first_recv = np.min([r["first_recv"] for r in results], axis=0)
    latency = ((last_recv - last_sent) * 1000)[skip:]
    first = ((first_recv - last_sent) * 1000)[skip:]
    it = np.array([s[0] for s in samples], dtype=float)
    cpu = np.array([s[1] for s in samples])
    writer = np.array([s[2] for s in samples])
    use = it >= skip
    cpu_per_it = writer_per_it = float("nan")
    if use.sum() >= 2 and it[use][-1] > it[use][0]:
        cpu_per_it = 1000 * (cpu[use][-1] - cpu[use][0]) / (it[use][-1] - it[use][0])
        writer_per_it = 1000 * (writer[use][-1] - writer[use][0]) / (it[use][-1] - it[use][0])
    out = {
        "workers": n, "arrival": arrival, "iterations": iterations, "skip": skip,
        "client_processes": processes, "global_batch": B, "compute_ms": compute_ms,
        "latency_ms": _stats(latency), "first_alloc_ms": _stats(first),
        "server_alloc_ms": _stats(server), "cpu_ms_per_iteration": cpu_per_it,
        # the metrics writer's thread (this tree's coordinator writes records off its own)
        "writer_cpu_ms_per_iteration": writer_per_it,
        "latency_per_iteration_ms": [round(float(x), 3) for x in latency],
        "final_sizes": [b for r in results for b in r["final_sizes"]],
        "predictor": config.predictor, "placement": placement,
        "coordinator_cpus": sorted(coord_cpus) if coord_cpus else None,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
    }
    out["per_host"] = per_host if per_host > 1 else None
    out["per_hub"] = per_hub if per_host > 1 and per_hub and per_hub > 1 else None
    if hub_stats is not None:
        out["hubs"] = len(hub_list)
        out["hubs_cpu_ms_per_iteration"] = _hosts.hub_cpu(hub_stats, skip)
        out["hub_cpu_ms_per_iteration"] = out["hubs_cpu_ms_per_iteration"] / len(hub_list)
        out["hub_writes_per_iteration"] = hub_stats["writes_up"] / max(iterations, 1)
        out["hub_path_ms"] = _stats(_hosts.hub_path(hub_stats, iterations, skip))
    if relay_stats is not None:
        hosted = _hosts.summary(relay_stats, iterations, skip, len(hosts), AHEAD)
        out["relay_latency_ms"] = _stats(hosted.pop("relay_latency_ms"))
        out["relay_path_ms"] = _stats(hosted.pop("relay_path_ms"))
        out.update(hosted)
    if spent is not None:
        out["breakdown_ms"] = _breakdown(spent, iterations, skip)
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        out["profile"] = text.getvalue()
    return out


async def _call(fn):
    fn()


#: what --profile's breakdown times inside the coordinator, per iteration (phase -> owner
#: attribute, method): the critical path from the last report to the broadcast is
#: decide = speed model (the fit, the regime, the predictor) + split + send split
PHASES = {"frames (all)": ("inbox", "on_frames"), "lines (all)": ("inbox", "on_line"),
          "decide": (None, "decide"), "speed model": ("speed", "model"),
          "predictor observe+predict": ("_predictor", "observe"),
          "predictor predict": ("_predictor", "predict"),
          "split": ("balancer", "split"), "send split": (None, "send_split"),
          "flush_records": (None, "_flush_records"),
          "predictor learn": ("_predictor", "learn")}


def _instrument(coord) -> Dict[str, List[float]]:
    """Wrap the coordinator's phases with timers (diagnostics only: it patches the instance,
    never the library). Returns phase -> list of seconds per call: the calling thread's CPU
    time (time.thread_time), which the other processes of a shared machine do not stretch."""
    spent: Dict[str, List[float]] = {k: [] for k in PHASES}
    for phase, (owner, method) in PHASES.items():
        target = coord if owner is None else getattr(coord, owner)
        inner = getattr(target, method)

        def timed(*a, _inner=inner, _log=spent[phase], **kw):
            t0 = time.thread_time()
            try:
                return _inner(*a, **kw)
            finally:
                _log.append(time.thread_time() - t0)
        setattr(target, method, timed)
    return spent


def _breakdown(spent: Dict[str, List[float]], iterations: int, skip: int) -> dict:
    """Milliseconds per iteration of each phase: the median of a phase called once per
    iteration, the mean (all calls over all iterations) of one called per frame or line."""
    out = {}
    for phase, xs in spent.items():
        xs = np.asarray(xs) * 1000
        if phase.endswith("(all)"):
            out[phase] = float(xs.sum() / iterations) if xs.size else 0.0
        else:
            xs = xs[skip:]
            out[phase] = float(np.median(xs)) if xs.size else float("nan")
    # observe+predict were timed separately; report their sum under one name
    out["predictor observe+predict"] += out.pop("predictor predict")
    return out


def _stats(xs) -> Dict[str, float]:
    xs = np.asarray(xs, dtype=float)
    if xs.size == 0:
        return {"median": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"median": float(np.median(xs)), "p99": float(np.percentile(xs, 99)),
            "max": float(xs.max()), "mean": float(xs.mean())}


# ---- the benchmark ----------------------------------------------------------------------------

def main():
    import _common as C
    import _suite as S
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="60 iterations per size")
    p.add_argument("--iterations", type=int)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--arrivals", default="spread,burst,flood")
    p.add_argument("--compute-ms", type=float, default=100.0,
                   help="simulated compute per iteration (spread arrivals)")
    p.add_argument("--processes", type=int,
                   help="client processes (default: one per client core when pinned, n/128 "
                        "(1..4) when shared)")
    p.add_argument("--placement", choices=["pinned", "shared"], default="pinned",
                   help="pinned (default): the coordinator on the first core, the simulated "
                        "workers on the others, as on a cluster where the workers are other "
                        "machines; shared: all processes on all cores")
    p.add_argument("--shared-sizes", default="256",
                   help="also measure these sizes with the other placement, for comparison "
                        "('' for none)")
    p.add_argument("--profile", type=int, metavar="N", action="append", default=[],
                   help="also profile the coordinator thread (cProfile) with N workers, burst")
    p.add_argument("--predictors", metavar="A,B",
                   help="instead: these predictors side by side (ABBA over --rounds) at "
                        "--sizes with --arrivals, pinned; writes coordinator_scale_predictors")
    p.add_argument("--baseline", metavar="REV",
                   help="instead: this tree and the code of commit REV side by side (ABBA "
                        "over --rounds) at --sizes with --arrivals, pinned; writes "
                        "coordinator_scale_baseline_REV")
    p.add_argument("--relays-vs-direct", action="store_true",
                   help="instead: the workers behind relays (--per-host) and connected "
                        "directly, side by side (ABBA over --rounds) at --sizes with "
                        "--arrivals, pinned; writes coordinator_scale_relays_vs_direct "
                        "(where --relay auto starts relays)")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds of --predictors or --baseline (4)")
    p.add_argument("--per-host", type=int, default=PER_HOST, metavar="K",
                   help=f"simulated workers per emulated host, behind its relay ({PER_HOST}; "
                        "0: every worker connected directly)")
    p.add_argument("--per-hub", type=int, default=None, metavar="G",
                   help="relays per hub (0: none; default: as `mxlbbsp launch --hubs auto`, "
                        "8 from 32 relays): the hubs run in a process of their own on the "
                        "client cores, as on the launcher's machine's other cores")
    p.add_argument("--client-smoke", action="store_true",
                   help="4 workers, 5 iterations, print the result (no file written)")
    C.add_smoke(p)
    args = p.parse_args()
    if C.smoke(args):        # 4 and 8 simulated workers, 6 iterations, one round
        args.quick, args.iterations, args.compute_ms, args.rounds = True, 6, 5.0, 1
        args.sizes, args.shared_sizes = "4,8", "4" if args.shared_sizes else ""
        args.profile = [min(n, 8) for n in args.profile]
    if args.client_smoke:
        print(json.dumps(measure(4, 5, arrival="burst", skip=1), indent=2))
        return
    iters = args.iterations or (60 if args.quick else 200)
    sizes = [int(x) for x in args.sizes.split(",")]
    arrivals = [a.strip() for a in args.arrivals.split(",")]
    if args.predictors:
        variants = {name: (lambda n, a, name=name: measure(
            n, iters, arrival=a, compute_ms=args.compute_ms, predictor=name,
            per_host=args.per_host, per_hub=args.per_hub))
            for name in args.predictors.split(",")}
        side_by_side(variants, sizes, arrivals, iters, args.rounds,
                     "coordinator_scale_predictors", "predictor", wait=not args.quick)
        return
    if args.relays_vs_direct:
        variants = {label: (lambda n, a, k=k: measure(n, iters, arrival=a,
                                                      compute_ms=args.compute_ms, per_host=k))
                    for label, k in ((f"relays ({args.per_host} per host)", args.per_host),
                                     ("direct", 0))}
        side_by_side(variants, sizes, arrivals, iters, args.rounds,
                     "coordinator_scale_relays_vs_direct", "workers", wait=not args.quick)
        return
    if args.baseline:
        import _common as C
        with C.worktree(args.baseline) as tree:
            variants = {
                "this tree": lambda n, a: measure(n, iters, arrival=a,
                                                  compute_ms=args.compute_ms,
                                                  per_host=args.per_host, per_hub=args.per_hub),
                args.baseline: lambda n, a: in_tree(tree, n, a, iters, args.compute_ms,
                                                     args.per_host)}
            side_by_side(variants, sizes, arrivals, iters, args.rounds,
                         f"coordinator_scale_baseline_{args.baseline}"
                         + (f"_per_host_{args.per_host}" if args.per_host != PER_HOST else ""),
                         "code",
                         wait=not args.quick)
        return
    name = "coordinator_scale" + ("_quick" if args.quick else "")
    load_at_start = S.wait_for_quiet() if not args.quick else S.load()
    other = "shared" if args.placement == "pinned" else "pinned"
    runs = [(args.placement, n) for n in sizes]
    runs += [(other, int(x)) for x in args.shared_sizes.split(",") if x.strip()]
    results = []
    for arrival in arrivals:
        for placement, n in runs:
            C.progress(f"{n} workers, {arrival}, {placement} (load {S.load():.1f})")
            r = measure(n, iters, arrival=arrival, compute_ms=args.compute_ms,
                        processes=args.processes, placement=placement,
                        per_host=args.per_host, per_hub=args.per_hub)
            C.progress(f"  latency median {r['latency_ms']['median']:.2f} ms, p99 "
                       f"{r['latency_ms']['p99']:.2f} ms; server "
                       f"{r['server_alloc_ms']['median']:.2f} ms; CPU "
                       f"{r['cpu_ms_per_iteration']:.2f} ms/iteration")
            results.append(r)
    profiles, breakdowns = {}, {}
    for n in args.profile:
        for arrival in arrivals:
            C.progress(f"timing the coordinator's phases with {n} workers ({arrival})")
            r = measure(n, min(iters, 100), arrival=arrival, compute_ms=args.compute_ms,
                        processes=args.processes, instrument=True,
                        placement=args.placement, per_host=args.per_host, per_hub=args.per_hub)
            breakdowns[f"{n} {arrival}"] = r["breakdown_ms"]
        C.progress(f"profiling the coordinator with {n} workers (burst, cProfile)")
        r = measure(n, min(iters, 60), arrival="burst", compute_ms=args.compute_ms,
                    processes=args.processes, profile=True, placement=args.placement,
                    per_host=args.per_host, per_hub=args.per_hub)
        profiles[str(n)] = r.pop("profile")
        path = C.RESULTS / f"{name}_profile_{n}.txt"
        path.write_text(profiles[str(n)])
        C.progress(f"  written {path}")
    rows = ["| workers | arrival | placement | allocation latency median | p99 | max | first worker "
            "served (median) | relay to relay median / p99 | server-side split_latency median / "
            "p99 | coordinator CPU per iteration | its metrics writer | relays (per relay) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lat, srv = r["latency_ms"], r["server_alloc_ms"]
        rows.append(f"| {r['workers']} | {r['arrival']} | {r['placement']} | "
                    f"{lat['median']:.2f} ms | "
                    f"**{lat['p99']:.2f} ms** | {lat['max']:.2f} ms | "
                    f"{r['first_alloc_ms']['median']:.2f} ms | {_relay_latency([r])} | "
                    f"{srv['median']:.2f} / {srv['p99']:.2f} ms | "
                    f"{r['cpu_ms_per_iteration']:.2f} ms | {_writer_cpu([r])} | "
                    f"{_relay_cpu([r])} |")
    table = (
        f"The real coordinator (lbbsp, default predictor and time model, metrics file on) "
        f"with simulated workers over loopback TCP; {iters} iterations per size, first 5 left "
        f"out; global batch 64 x n; the simulated workers in one client process per core they "
        f"run on (pinned), or n/128 (1..4) processes (shared); "
        + (f"{args.per_host} per emulated host, behind its relay (all relays in one process on "
           f"the client cores). " if args.per_host > 1 else "every one connected directly. ") +
        f"'spread': each worker reports after its own simulated compute (~{args.compute_ms:g} "
        f"ms per iteration, balanced by the coordinator, with drift and 3% noise); 'burst': "
        f"after the slowest worker's compute, all report at the same instant (perfect "
        f"balancing: the worst case of a real job); 'flood': no compute, done(t) and "
        f"report(t+1) back to back (a throughput stress test: the dones and metrics of t fall "
        f"inside the latency window).\n\n" + "\n".join(rows) +
        "\n\nAllocation latency: from the moment the last report of an iteration is sent "
        "until every worker has received its allocation for the next one. 'first worker "
        "served': until the first worker has it. Relay to relay: from the last relay's "
        "section of reports sent to the last relay's split received (the coordinator's share; "
        "the end-to-end figure also holds the relays of every emulated host taking turns on "
        "one core, which a cluster's hosts do in parallel). Server-side: "
        "Coordinator.split_latency, from the last report's arrival to the allocation handed "
        "to every socket. CPU: the coordinator thread's CPU time per iteration (reports, "
        "dones, prediction, balancing, broadcast, the records' parts), its metrics writer "
        "thread's (records built, totalled, written: the same process), and the relays' "
        "process's, in all and per relay (what one host pays)."
        + (_breakdown_table(breakdowns) if breakdowns else "")
        + (f"\n\ncProfile of the coordinator thread (burst, sorted by own time): "
           f"{', '.join(f'[{n} workers]({name}_profile_{n}.txt)' for n in profiles)}"
           if profiles else "")
        + f"\n\nPlacement: 'pinned' runs the coordinator's thread alone on core "
        f"{sorted(os.sched_getaffinity(0))[0]} and the simulated workers on the other "
        f"core(s), as on a real cluster where the workers are other machines; 'shared' lets "
        f"them all compete for this machine's {os.cpu_count()} cores (the workers' reading "
        f"then preempts the coordinator while it sends). The breakdown and profiles use "
        f"'{args.placement}'. Load average at start: {load_at_start:.2f}.")
    C.write(name, {"iterations": iters, "load_at_start": load_at_start,
                   "predictor": results[0]["predictor"] if results else None,
                   "results": results, "breakdown_ms": breakdowns}, table)


def side_by_side(variants: dict, sizes, arrivals, iters, rounds, name, what,
                 wait: bool = True) -> None:
    """The same runs for each variant (label -> run(n, arrival) -> measure()'s result), in
    ABBA order over ``rounds``, so that the machine's drift falls on all of them alike."""
    import _common as C
    import _suite as S
    load_at_start = S.wait_for_quiet() if wait else S.load()
    labels = list(variants)
    runs = {}
    for arrival in arrivals:
        for n in sizes:
            for r in range(rounds):
                for label in (labels if r % 2 == 0 else labels[::-1]):
                    C.progress(f"{n} workers, {arrival}, {label}, round {r + 1}/{rounds} "
                               f"(load {S.load():.1f})")
                    res = variants[label](n, arrival)
                    res.pop("latency_per_iteration_ms", None)
                    runs.setdefault(f"{n} {arrival}", {}).setdefault(label, []).append(res)
                    C.progress(f"  p99 {res['latency_ms']['p99']:.2f} ms")
    rows = [f"| workers, arrival | {what} | allocation latency p99 per round | median of "
            "the rounds' p99 | median of the rounds' medians | relay to relay: median of the "
            "rounds' p99 | server-side median / p99 | the last relay's own path median / p99 "
            "(and the last hub's) | "
            "coordinator CPU per iteration | its metrics "
            "writer's CPU per iteration | relays' CPU per iteration (per relay) | final split "
            "as the other's |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, per in runs.items():
        splits = {label: [tuple(x["final_sizes"]) for x in rs] for label, rs in per.items()}
        for label, rs in per.items():
            p99 = [x["latency_ms"]["p99"] for x in rs]
            others = [v for k, v in splits.items() if k != label]
            same = "yes" if others and all(set(v) == set(splits[label]) and len(set(v)) == 1
                                           for v in others) else "no"
            rows.append(f"| {key} | {label} | {', '.join(f'{v:.2f}' for v in p99)} ms | "
                        f"**{np.median(p99):.2f} ms** | "
                        f"{np.median([x['latency_ms']['median'] for x in rs]):.2f} ms | "
                        f"{_relay_latency(rs)} | "
                        f"{np.median([x['server_alloc_ms']['median'] for x in rs]):.2f} / "
                        f"**{np.median([x['server_alloc_ms']['p99'] for x in rs]):.2f} ms** | "
                        f"{_relay_path(rs)}{_hub_path(rs)} | "
                        f"{np.median([x['cpu_ms_per_iteration'] for x in rs]):.2f} ms | "
                        f"{_writer_cpu(rs)} | {_relay_cpu(rs)} | {same} |")
    table = (f"The runs of `coordinator_scale.py` (pinned, {iters} iterations, first 5 left "
             f"out) for each {what} in turn, in ABBA order over {rounds} rounds, so that the "
             f"machine's drift falls on all of them alike. Load average at start: "
             f"{load_at_start:.2f}. 'final split as the other's': every round of both ended "
             "with the same per-worker batch sizes (the simulated workers' times depend only "
             "on their batch sizes, so equal decisions give equal splits).\n\n"
             + "\n".join(rows))
    C.write(name, {"iterations": iters, "rounds": rounds, "load_at_start": load_at_start,
                   "runs": runs}, table)


def _relay_latency(rs) -> str:
    """Relay to relay latency: median / median of the p99 ('-': no relays)."""
    xs = [x["relay_latency_ms"] for x in rs if x.get("relay_latency_ms")]
    if not xs:
        return "-"
    return (f"{np.median([x['median'] for x in xs]):.2f} / "
            f"**{np.median([x['p99'] for x in xs]):.2f} ms**")


def _hub_path(rs) -> str:
    """The last hub's own path (its last relay's section of reports read to its merged
    section written): median / p99 of the runs' medians and p99s; '' without hubs."""
    xs = [x["hub_path_ms"] for x in rs if x.get("hub_path_ms")]
    if not xs:
        return ""
    return (f"; the last hub's {np.median([x['median'] for x in xs]):.2f} / "
            f"{np.median([x['p99'] for x in xs]):.2f} ms")


def _relay_path(rs) -> str:
    """The last relay's own path (its host's last report read to its section written):
    median / median of the p99 ('-': no relays, or code that does not time it)."""
    xs = [x["relay_path_ms"] for x in rs if x.get("relay_path_ms")]
    if not xs:
        return "-"
    return (f"{np.median([x['median'] for x in xs]):.2f} / "
            f"{np.median([x['p99'] for x in xs]):.2f} ms")


def _relay_cpu(rs) -> str:
    """The relays' CPU per iteration, all of them (per relay), and the hubs' (per hub);
    '-': no relays."""
    xs = [(x["relays_cpu_ms_per_iteration"], x["relay_cpu_ms_per_iteration"]) for x in rs
          if x.get("relays_cpu_ms_per_iteration") is not None]
    if not xs:
        return "-"
    text = f"{np.median([a for a, _ in xs]):.2f} ms ({np.median([b for _, b in xs]):.3f} ms)"
    hubs = [(x["hubs_cpu_ms_per_iteration"], x["hub_cpu_ms_per_iteration"], x["hubs"])
            for x in rs if x.get("hubs")]
    if hubs:
        text += (f"; {hubs[0][2]} hubs {np.median([a for a, _, _ in hubs]):.2f} ms "
                 f"({np.median([b for _, b, _ in hubs]):.3f} ms)")
    return text


def _writer_cpu(rs) -> str:
    """The median metrics-writer thread CPU per iteration ('-': a coordinator without one,
    whose records are written on its own thread, counted in its CPU)."""
    xs = [x.get("writer_cpu_ms_per_iteration", float("nan")) for x in rs]
    xs = [x for x in xs if np.isfinite(x)]
    return f"{np.median(xs):.2f} ms" if xs else "-"


def in_tree(tree, n: int, arrival: str, iters: int, compute_ms: float,
            per_host: int = PER_HOST) -> dict:
    """One pinned run of ``tree``'s own coordinator_scale.py (its code: another commit's),
    read back from the results it writes in that tree; ``per_host`` passed on when its
    script has --per-host (older ones connect every worker directly)."""
    script = tree / "benchmarks" / "coordinator_scale.py"
    hosts = ["--per-host", str(per_host)] if "--per-host" in script.read_text() else []
    subprocess.run([sys.executable, str(script),
                    "--quick", "--iterations", str(iters), "--sizes", str(n), "--arrivals",
                    arrival, "--shared-sizes", "", "--compute-ms", str(compute_ms), *hosts],
                   cwd=tree, check=True, capture_output=True)
    out = json.loads((tree / "benchmarks" / "results" / "coordinator_scale_quick.json")
                     .read_text())
    return out["results"][0]


def _breakdown_table(breakdowns: dict) -> str:
    phases = list(next(iter(breakdowns.values())))
    rows = ["| workers, arrival | " + " | ".join(phases) + " |",
            "|---" * (len(phases) + 1) + "|"]
    for key, b in breakdowns.items():
        rows.append(f"| {key} | " + " | ".join(f"{b[p]:.2f}" for p in phases) + " |")
    return ("\n\nWhere the coordinator's time goes (median ms of its thread's CPU per "
            "iteration, timers around its methods in a separate run; 'frames (all)' and 'lines "
            "(all)' are every frame (relays) and line (workers connected directly) handled, "
            "per iteration, 'decide' among them; 'decide' runs from the last report to the "
            "end of the predictor's training step ('predictor learn'), which comes after the "
            "split is sent; it holds the 'speed model' (the fit, the regime and the "
            "predictor's observe and predict), 'split' and 'send split'; the "
            "critical path is the part of it up to the end of 'send split'):\n\n"
            + "\n".join(rows))


if __name__ == "__main__":
    main()
