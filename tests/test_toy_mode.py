"""A new sync mode is one module: this file is that module, and its tests.

``toy`` is defined here and nowhere else. It gives worker 0 a fixed share of every global
batch (``--toy-share F``) and the other workers equal parts of the rest. Named in
``MXLBBSP_MODE_MODULES``, it is registered in the launcher (which then has its option and
its help) and in every worker (the launcher forwards the variable). Nothing in the package
mentions it.
"""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from mxlbbsp import modes
from mxlbbsp.core import split as _split

from conftest import PY, ROOT, run_mxlbbsp


class ToyPolicy(modes.CoordinatorPolicy):
    """Worker 0 gets ``share`` of B(t+1), the others equal parts of the rest."""

    sends = True

    def _split(self, B: int) -> np.ndarray:
        n = self.num_workers
        share = self.options.get("share")
        first = int(round((0.5 if share is None else share) * B))
        first = min(max(first, 1), B - (n - 1))
        return np.concatenate([[first], _split.equal_split(B - first, n - 1)])

    def warmup(self, t, next_B, current):
        if next_B is None:
            return current
        split = self._split(next_B)
        self.coordinator.send_split(t + 1, split)
        return split

    def plan(self, t, model, next_B, current):
        split = self._split(next_B)
        self.coordinator.send_split(t + 1, split)
        return split


class Toy(modes.SyncMode):
    name, label = "toy", "Toy"
    help = "worker 0 gets --toy-share of every global batch (a test mode)"
    policy = ToyPolicy
    options = (modes.Option("share", "--toy-share", type=float, metavar="F",
                            help="worker 0's share of the global batch, in (0, 1)."),)

    @staticmethod
    def check_options(options):
        share = options.get("share")
        if share is not None and not 0 < share < 1:
            return f"--toy-share {share}: must be in (0, 1), e.g. 0.75"
        return None


# Registered where MXLBBSP_MODE_MODULES names this module (the launcher, the workers); not in
# pytest's own process, whose registry the other tests check as the package has it.
if __name__ in os.environ.get("MXLBBSP_MODE_MODULES", "").split(","):
    modes.register(Toy)

TESTS = str(Path(__file__).resolve().parent)
TOY_ENV = {"MXLBBSP_MODE_MODULES": "test_toy_mode",
           "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}


def test_the_toy_mode_gets_its_option_and_its_help():
    r = run_mxlbbsp("launch", "--help", env=TOY_ENV)
    assert r.rc == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "--toy-share F toy: worker 0's share of the global batch, in (0, 1)." in text
    assert "toy: worker 0 gets --toy-share of every global batch (a test mode)" in text
    assert re.search(r"--sync \[lbbsp\|bsp\|asp\|[a-z0-9|]*\|toy\]", text), text


@pytest.mark.parametrize("args, says", [
    (["--toy-share", "0.5"], "--toy-share: an option of --sync toy, not of --sync lbbsp"),
    (["--sync", "toy", "--toy-share", "1.5"], "--toy-share 1.5: must be in (0, 1)"),
])
def test_the_toy_mode_refuses_bad_input_in_one_line(args, says):
    r = run_mxlbbsp("launch", "-n", "2", *args, "--", "true", env=TOY_ENV)
    assert r.rc == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_a_mode_module_that_does_not_import_is_one_line():
    r = run_mxlbbsp("launch", "--help", env={"MXLBBSP_MODE_MODULES": "no_such_module_here"})
    assert r.rc == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("mxlbbsp: error: MXLBBSP_MODE_MODULES: cannot import "
                               "'no_such_module_here'"), r.stderr


@pytest.mark.cluster
def test_the_toy_mode_runs_end_to_end(tmp_path):
    m = tmp_path / "m.jsonl"
    r = run_mxlbbsp("launch", "-n", "3", "--sync", "toy", "--toy-share", "0.75",
                    "--metrics", m, "--", PY, ROOT / "tests/scripts/log_train.py",
                    "--batch-size", "64", "--iterations", "8", env=TOY_ENV)
    assert r.rc == 0, r.stderr
    records = [json.loads(line) for line in m.read_text().splitlines()]
    assert {rec["sync"] for rec in records} == {"toy"}
    by_it = {}
    for rec in records:
        by_it.setdefault(rec["iteration"], {})[rec["rank"]] = rec["batch_size"]
    assert sorted(by_it) == list(range(8))
    assert by_it[0] == {0: 22, 1: 21, 2: 21}                  # iteration 0: the equal split
    for t in range(1, 8):                                      # then the toy's: 48 = 0.75 x 64
        assert by_it[t] == {0: 48, 1: 8, 2: 8}, (t, by_it[t])
