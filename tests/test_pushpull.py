"""One pushpull per key returns the workers' sum of the same iteration, every time.

mxlbbsp's trainer pushes each gradient and pulls the sum back into it with one pushpull (a
server without an updater, dist_sync). An early version pushed and pulled separately, on
the suspicion that such a server answers a pushpull before its copy of the new sum is done
and so hands some workers the previous iteration's sum. This is the test that would show
it: real scheduler, servers and workers, keys from 3 floats to past MXNet's big-array bound
(split over the servers), the engine running up to 40 iterations ahead of the checks, and
random pauses that change who pushes first; every element of every sum is checked
(tests/scripts/kv_pushpull.py).
"""
import pytest

from conftest import PY, ROOT

SCRIPT = ROOT / "tests" / "scripts" / "kv_pushpull.py"


@pytest.mark.cluster
@pytest.mark.parametrize("workers,servers,iterations", [(2, 1, 400), (3, 2, 200)])
def test_every_pushpull_returns_the_sum_of_its_own_iteration(mxlbbsp, workers, servers,
                                                            iterations):
    res = mxlbbsp("launch", "-n", workers, "-s", servers, "--", PY, SCRIPT, iterations,
                  timeout=600)
    assert res.rc == 0, res.output[-3000:]
    assert res.output.count(f"pushpull ok {iterations}") == workers, res.output[-3000:]
