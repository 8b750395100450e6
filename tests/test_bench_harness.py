"""Smoke test of benchmarks/coordinator_scale.py's harness: the real coordinator and 4
simulated workers (a client process speaking mxlbbsp.core.protocol over loopback) run a few
iterations. Checks that every measured quantity is there; never asserts a timing.
"""
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import coordinator_scale  # noqa: E402


def test_four_simulated_workers_get_their_allocations():
    out = coordinator_scale.measure(4, iterations=6, arrival="burst", skip=1, processes=1)
    assert out["workers"] == 4 and out["client_processes"] == 1
    assert len(out["latency_per_iteration_ms"]) == 5
    for key in ("latency_ms", "first_alloc_ms", "server_alloc_ms"):
        assert all(math.isfinite(v) for v in out[key].values()), key
    # the coordinator learnt the speeds: the last allocation is not the equal split
    assert sum(out["final_sizes"]) == out["global_batch"]
    assert len(set(out["final_sizes"])) > 1


def test_spread_arrivals_two_client_processes():
    out = coordinator_scale.measure(4, iterations=4, arrival="spread", compute_ms=5.0,
                                    skip=1, processes=2)
    assert out["client_processes"] == 2
    assert len(out["latency_per_iteration_ms"]) == 3
