"""The default time model (auto) on a tiny model: real processes, two identical workers.

A tiny MLP's iteration is mostly fixed cost (a few ms whatever the batch), so the linear
model reads the worker given fewer samples as slower per sample and, with nothing to stop
it, walks the split to 63:1 (seen with ``--time-model linear``). ``auto`` must notice the
fixed cost and keep the split near equal.
"""
import json

import pytest

from conftest import EXAMPLE, PY, run_mxlbbsp

pytestmark = pytest.mark.cluster


def splits(path):
    rows = [json.loads(line) for line in open(path)]
    by_iter = {}
    for r in rows:
        by_iter.setdefault(r["iteration"], {})[r["rank"]] = r["batch_size"]
    return [by_iter[t] for t in sorted(by_iter)]


def test_auto_keeps_two_equal_workers_near_an_equal_split(tmp_path):
    metrics = tmp_path / "m.jsonl"
    r = run_mxlbbsp("launch", "-n", 2, "--metrics", metrics, "--progress", "0", "--", PY,
                    EXAMPLE, "--model", "mlp", "--data", "digits", "--batch-size", "64",
                    "--epochs", "100", "--iterations", "120", "--log-interval", "0")
    assert r.rc == 0, r.output
    ratios = [max(s.values()) / min(s.values()) for s in splits(metrics)]
    assert len(ratios) == 120
    # The fixed cost is identified once the split has moved a little (the first tens of
    # iterations); from then on the split stays within 1.5:1.
    late = sorted(ratios[60:])
    assert late[len(late) // 2] <= 1.5, ratios            # median
    assert sum(x <= 1.5 for x in late) >= 0.8 * len(late), ratios
    assert ratios[-1] <= 1.5, ratios
