"""The goodput mode's planner (mxlbbsp/modes/goodput.py): which B, and how steadily."""
import math

import numpy as np
import pytest

from mxlbbsp import balancer as _bal
from mxlbbsp.core import noise
from mxlbbsp.modes import goodput


def _model(speeds, fixed=0.01):
    return _bal.TimeModel(np.array(speeds, float), np.full(len(speeds), fixed))


def test_the_chosen_batch_grows_with_the_noise_scale():
    fn = goodput.iteration_model("hetero", _model([3000, 3000, 1000]), 0.02)
    chosen = []
    for phi in (10.0, 100.0, 1000.0, 10000.0):
        p = goodput.GoodputPlanner(16, 1024, 64)
        chosen.append(p.update(fn, phi, force=True))
        assert p.row().goodput == max(r.goodput for r in p.last_rows)
    assert chosen == sorted(chosen) and chosen[0] < chosen[-1]


def test_hetero_model_is_the_lbbsp_makespan_and_homo_the_equal_split():
    m = _model([3000, 1000], fixed=0.0)
    het = goodput.iteration_model("hetero", m, 0.01)
    hom = goodput.iteration_model("homo", m, 0.01)
    # B = 400: balanced 300/100 -> 0.1 s; equal 200/200 -> the slow one's 0.2 s
    assert het(400) == pytest.approx(0.11, rel=1e-6)
    assert hom(400) == pytest.approx(0.21, rel=1e-6)
    assert math.isinf(hom(1))                  # a worker without a sample


def test_planner_waits_for_every_plans_and_keeps_still_under_noise():
    fn = goodput.iteration_model("hetero", _model([2000, 2000]), 0.02)
    p = goodput.GoodputPlanner(16, 1024, 64, every=5)
    phi_big = 5000.0
    assert p.update(fn, 64.0) == 64               # near the best already: stays
    seen = [p.update(fn, phi_big, epoch=0) for _ in range(4)]
    assert seen == [64] * 4                       # not before `every` plans agree
    moved = p.update(fn, phi_big, epoch=0)
    assert moved > 64 and p.changes == 1
    # a noise scale that alternates between two plans never accumulates agreement
    q = goodput.GoodputPlanner(16, 1024, 64, every=3)
    for k in range(30):
        q.update(fn, phi_big if k % 2 else 64.0, epoch=0)
    assert q.changes == 0


def test_planner_makes_at_most_max_changes_per_epoch():
    fn = goodput.iteration_model("hetero", _model([2000, 2000]), 0.02)
    p = goodput.GoodputPlanner(16, 1024, 64, every=1, max_changes=2)
    for k in range(40):                           # a noise scale that keeps swinging
        p.update(fn, 10.0 if (k // 2) % 2 else 10000.0, epoch=0)
    assert p.changes == 2
    p.update(fn, 10.0, epoch=1)
    p.update(fn, 10000.0, epoch=1)
    assert p.changes_in_epoch <= 2 and p.changes > 2


def test_homogeneous_model_underrates_large_batches_on_a_heterogeneous_cluster():
    """1:3 workers: the equal-split model sees the slow worker's time and chooses a
    batch at most as large as the heterogeneity-aware one; on equal workers they agree."""
    phi = 500.0
    for speeds, same in (([3000, 1000], False), ([2000, 2000], True)):
        m = _model(speeds, fixed=0.02)
        het = goodput.GoodputPlanner(16, 1024, 64)
        hom = goodput.GoodputPlanner(16, 1024, 64)
        b_het = het.update(goodput.iteration_model("hetero", m, 0.02), phi, force=True)
        b_hom = hom.update(goodput.iteration_model("homo", m, 0.02), phi, force=True)
        if same:
            assert b_het == b_hom
        else:
            assert b_hom < b_het
        if not same:
            # the hetero choice has the larger true (LB-BSP) goodput
            real = goodput.iteration_model("hetero", m, 0.02)
            rows = {r.batch: r for r in noise.goodput_rows([b_het, b_hom], real, phi, 64)}
            assert rows[b_het].goodput >= rows[b_hom].goodput


@pytest.mark.parametrize("options,words", [
    ({"batch_range": "64:32"}, "inverted"),
    ({"batch_range": "0:32"}, "inverted"),
    ({"batch_range": "abc"}, "MIN:MAX"),
    ({"lr_scaling": "cubic"}, "--lr-scaling"),
    ({"goodput_model": "flat"}, "--goodput-model"),
])
def test_bad_options_are_one_line(options, words):
    problem = goodput.Goodput.check_options(options)
    assert problem and words in problem and "\n" not in problem


def test_range_below_the_number_of_workers():
    mode = goodput.Goodput()
    problem = mode.check_workers({"batch_range": "2:64"}, 4)
    assert "below the number of workers" in problem
    assert mode.check_workers({"batch_range": "4:64"}, 4) is None
