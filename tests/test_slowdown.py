"""--emulate-slowdown specs: per-worker lists and CSV traces."""
import pytest

from mxlbbsp.core.slowdown import Schedule
from mxlbbsp.core.slowdown import SlowdownError
from mxlbbsp.core.slowdown import parse


def test_list_gives_each_worker_a_constant_factor():
    s = parse("1,1,3", 3)
    assert [x.factor(0) for x in s] == [1.0, 1.0, 3.0]
    assert [x.factor(10_000) for x in s] == [1.0, 1.0, 3.0]
    assert [x.encode() for x in s] == ["1", "1", "3"]


def test_csv_trace_is_a_step_function_per_rank(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("iteration,rank,slowdown\n0,0,1\n10,1,2.5\n20,1,1\n5,0,4\n")
    s0, s1 = parse(str(path), 2)
    assert [s0.factor(t) for t in (0, 4, 5, 99)] == [1.0, 1.0, 4.0, 4.0]
    assert [s1.factor(t) for t in (0, 9, 10, 19, 20)] == [1.0, 1.0, 2.5, 2.5, 1.0]
    assert Schedule.decode(s1.encode()).factor(15) == 2.5
    assert Schedule.decode(s0.encode()).factor(7) == 4.0


@pytest.mark.parametrize("text, needle", [
    ("iteration,rank\n0,0\n", "missing slowdown"),
    ("iteration,rank,slowdown\n0,0,x\n", "t.csv:2"),
    ("iteration,rank,slowdown\n0,5,2\n", "rank 5 is outside 0..1"),
    ("iteration,rank,slowdown\n0,0,0.5\n", ">= 1"),
    ("iteration,rank,slowdown\n-1,0,2\n", "negative"),
])
def test_bad_csv_names_the_problem(tmp_path, text, needle):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(SlowdownError, match=needle):
        parse(str(path), 2)


def test_wrong_length_and_bad_values():
    with pytest.raises(SlowdownError, match="has 2 factor"):
        parse("1,3", 3)
    with pytest.raises(SlowdownError, match="factor 2"):
        parse("1,abc", 2)
    with pytest.raises(SlowdownError, match="no such file"):
        parse("/no/such/trace.csv", 2)
    with pytest.raises(SlowdownError, match="MXLBBSP_SLOWDOWN"):
        Schedule.decode("0:1,x:3")


def test_timed_trace_counts_seconds_from_the_start(tmp_path):
    import time

    from mxlbbsp.core.slowdown import Schedule
    from mxlbbsp.core.slowdown import parse
    path = tmp_path / "tenant.csv"
    path.write_text("time_s,rank,slowdown\n0,0,1\n0.5,1,3\n30,1,1\n")
    s0, s1 = parse(str(path), 2)
    assert s1.timed and s1.encode() == "@0.5:3,@30:1"
    worker = Schedule.decode(s1.encode())       # what the worker gets in MXLBBSP_SLOWDOWN
    worker.start()
    assert worker.factor(1000) == 1.0           # the iteration does not matter, the time does
    time.sleep(0.6)
    assert worker.factor(0) == 3.0


def test_timed_and_iteration_points_do_not_mix():
    import pytest

    from mxlbbsp.core.slowdown import Schedule
    from mxlbbsp.core.slowdown import SlowdownError
    with pytest.raises(SlowdownError):
        Schedule.decode("@1:3,5:1")
