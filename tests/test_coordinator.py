"""The coordinator with real worker sessions over loopback TCP (threads play the workers)."""
import socket
import threading
import time

import numpy as np
import pytest

from mxlbbsp.core import metrics
from mxlbbsp.core import protocol as P
from mxlbbsp.control.coordinator import Coordinator
from mxlbbsp.control.coordinator import CoordinatorConfig
from mxlbbsp.worker.session import JobAborted
from mxlbbsp.worker.session import Session

from conftest import in_threads

TOKEN = "t0ken"


@pytest.fixture
def coordinator(request, tmp_path):
    made = []

    def make(n, **kw):
        kw.setdefault("metrics", str(tmp_path / "m.jsonl"))
        c = Coordinator(CoordinatorConfig(num_workers=n, token=TOKEN, **kw))
        c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def env_for(c, rank, n, sync="lbbsp", token=TOKEN, slowdown=None):
    env = {"MXLBBSP_COORDINATOR": f"{c.address[0]}:{c.address[1]}", "MXLBBSP_TOKEN": token,
           "MXLBBSP_RANK": str(rank), "DMLC_NUM_WORKER": str(n), "MXLBBSP_SYNC": sync,
           "MXLBBSP_HOST": f"h{rank}"}
    if slowdown:
        env["MXLBBSP_SLOWDOWN"] = slowdown
    return env


def sessions(c, n, B=64, N=640, sync="lbbsp", **kw):
    """Open n sessions concurrently (registration waits for all of them)."""
    return in_threads(lambda r: Session(B, N, kw.get("min_global_batch", B), kw.get("max_batch"),
                                        env=env_for(c, r, n, sync)), n)


def finished_records(c):
    """Wait for the job to finish, stop the coordinator, and read its metrics file (through
    mxlbbsp.core.metrics.load, which also checks every record's required fields)."""
    assert c.finished.wait(5)
    c.stop()
    return metrics.load(c.config.metrics)


def run_iteration(sessions_, compute, B=64):
    """Every worker does one iteration: compute_s given per rank (a stand-in clock)."""
    sizes = []
    for s, seconds in zip(sessions_, compute):
        t, offset, local = s.next_iteration(B)
        sizes.append(local)
        s._t_end -= seconds          # pretend the compute took `seconds`
        s.gradients_ready()
    for s in sessions_:
        s.step_done()
    return sizes


def test_lbbsp_moves_samples_to_the_faster_worker(coordinator):
    c = coordinator(2, predictor="last")
    (s0, s1), errors = sessions(c, 2)
    assert not errors
    # Stand-in compute times of seconds: the real time the threads take on a loaded
    # machine (tens of ms) must not change the ratio.
    assert run_iteration([s0, s1], [1.0, 1.0]) == [32, 32]     # warm-up: equal
    assert run_iteration([s0, s1], [1.0, 3.0]) == [32, 32]     # still the first split
    # split from the warm-up's reports (lbbsp splits t+2 from the reports of t)
    assert run_iteration([s0, s1], [1.0, 1.0]) == [32, 32]
    # worker 1 was 3x slower per sample at iteration 1: 3:1
    assert run_iteration([s0, s1], [1.0, 1.0]) == [48, 16]
    for s in (s0, s1):
        s.close()
    assert c.finished.wait(5)
    assert c.failure is None


def test_lbbsp_workers_have_each_split_an_iteration_before_they_need_it(coordinator):
    """The reports of t split t+2: every worker holds its slice of t+1 before any worker
    has reported t (the split of iteration 1 comes with the registration), so none waits
    for the coordinator unless it is a whole iteration late."""
    c = coordinator(2, predictor="last")
    ss, errors = sessions(c, 2)
    assert not errors
    for t in range(6):
        for s in ss:
            assert _wait(lambda s=s: s.slice(t + 1, 64, block=False) is not None), t
        run_iteration(ss, [1.0, 3.0])
    sizes = run_iteration(ss, [1.0, 3.0])
    assert sizes[0] > sizes[1]                                  # and it balanced
    for s in ss:
        s.close()
    assert c.finished.wait(5) and c.failure is None


def _epoch_iteration(ss, plan, t, per_sample):
    """Iteration t of every worker, whose loaders cut the epoch's global batches ``plan``
    (B(t+1) and B(t+2) announced as a DataLoader does); compute per_sample[rank] seconds a
    sample. The (offset, size) of each worker."""
    pieces = []
    for s, cost in zip(ss, per_sample):
        s.announce(plan[(t + 1) % len(plan)], plan[(t + 2) % len(plan)])
        got, offset, local = s.next_iteration(plan[t % len(plan)])
        assert got == t
        pieces.append((offset, local))
        s._t_end -= cost * local
        s.gradients_ready()
    for s in ss:
        s.step_done()
    return pieces


def test_a_short_last_batch_is_split_for_its_own_size(coordinator):
    """The epoch's short last batch (20 of B = 64) is split two iterations ahead for its
    own size (rank 0's loader announces B(t+2)), within every worker's least batch
    (--min-batch-size 8): a split of 64 (3:1 here) scaled down by each worker gives the slow
    one 5; and the slices tile every global batch, the next epoch's too."""
    c = coordinator(2, predictor="last", min_batch_size=8)
    plan = [64, 64, 64, 64, 20]
    ss, errors = sessions(c, 2, B=64, N=4 * 64 + 20, min_global_batch=20)
    assert not errors
    for t in range(3 * len(plan)):
        pieces = _epoch_iteration(ss, plan, t, [0.01, 0.03])
        B = plan[t % len(plan)]
        assert pieces[0] == (0, B - pieces[1][1]) and pieces[1][0] == pieces[0][1], (t, pieces)
        assert min(b for _, b in pieces) >= min(8, B // 2), (t, pieces)
        if t >= 4 and B == 64:
            assert pieces[0][1] > pieces[1][1], (t, pieces)       # balanced, 3:1
    for s in ss:
        s.close()
    assert c.finished.wait(5) and c.failure is None


def test_offsets_tile_the_global_batch(coordinator):
    c = coordinator(3, predictor="last")
    ss, errors = sessions(c, 3, B=30, N=300)
    assert not errors
    run_iteration(ss, [0.1, 0.1, 0.1], B=30)
    run_iteration(ss, [0.1, 0.2, 0.4], B=30)
    slices = [s.next_iteration(30) for s in ss]
    assert [t for t, _, _ in slices] == [2, 2, 2]
    spans = sorted((off, off + b) for _, off, b in slices)
    assert spans[0][0] == 0 and spans[-1][1] == 30
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_bsp_never_waits_and_still_writes_metrics(coordinator, tmp_path):
    c = coordinator(2, sync="bsp", predictor="ema")
    ss, _ = sessions(c, 2, sync="bsp")
    for _ in range(3):
        assert run_iteration(ss, [0.1, 0.3]) == [32, 32]
    for s in ss:
        s.close()
    rows = finished_records(c)
    assert len(rows) == 6
    assert {r["sync"] for r in rows} == {"bsp"}
    assert [r["rank"] for r in rows] == [0, 1] * 3
    last = rows[-1]
    for field in ("iteration", "rank", "host", "batch_size", "compute_s", "wait_s", "speed",
                  "predicted_speed", "cpu_percent", "mem_percent", "sync", "time"):
        assert field in last
    assert last["host"] == "h1"
    assert last["predicted_speed"] > 0


@pytest.mark.parametrize("B, N, min_B, needle", [
    (2, 100, 2, "smaller than the number of workers"),
    (64, 10, 10, "fewer than one global batch"),
    (64, 642, 2, "last_batch='discard'"),
])
def test_bad_job_configuration_stops_every_worker(coordinator, B, N, min_B, needle):
    c = coordinator(3)
    ss, errors = sessions(c, 3, B=B, N=N, min_global_batch=min_B)
    assert len(errors) == 3 and all(isinstance(e, JobAborted) for e in errors)
    assert errors[0].code == 2
    assert needle in c.failure and c.failure_kind == "config"


def test_workers_must_agree_on_the_global_batch(coordinator):
    c = coordinator(2)
    out, errors = [], []

    def open_one(r, B):
        try:
            out.append(Session(B, 640, B, None, env=env_for(c, r, 2)))
        except JobAborted as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(r, B)) for r, B in ((0, 64), (1, 32))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(errors) == 2
    assert "disagree on the global batch size" in c.failure


def test_a_connection_without_the_token_is_refused(coordinator):
    c = coordinator(1)
    with socket.create_connection(c.address, timeout=5) as s:
        s.sendall(P.encode(P.hello(0, "wrong", 1, "h", 64, 640, None)))
        assert s.recv(100) == b""          # closed without a word
    assert c.registered == 0
    with socket.create_connection(c.address, timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert s.recv(100) == b""
    assert c.registered == 0 and c.failure is None


@pytest.mark.parametrize("rank, said", [(7, b"rank 7 is outside 0..1"),
                                         (0, b"rank 0 connected twice")])
def test_a_hello_of_a_bad_rank_is_answered_and_closed(coordinator, rank, said):
    """A worker connected directly (as behind a relay, tests/test_relay.py): the error
    line, then its connection closed."""
    c = coordinator(2)
    with socket.create_connection(c.address, timeout=5) as first:
        first.sendall(P.encode(P.hello(0, TOKEN, 1, "h", 64, 640, None)))
        deadline = time.monotonic() + 5
        while c.registered < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with socket.create_connection(c.address, timeout=5) as s:
            s.sendall(P.encode(P.hello(rank, TOKEN, 1, "h", 64, 640, None)))
            reader = s.makefile("rb")
            assert said in reader.readline()
            assert reader.read() == b""            # closed
    assert c.registered == 1


def test_losing_a_worker_is_a_failure(coordinator):
    c = coordinator(2)
    ss, _ = sessions(c, 2)
    ss[1]._sock.shutdown(socket.SHUT_RDWR)  # dies without saying bye
    for _ in range(50):
        if c.failure:
            break
        threading.Event().wait(0.05)
    assert "worker 1 lost its connection" in c.failure


def test_metrics_file_is_not_touched_when_registration_fails(coordinator, tmp_path):
    path = tmp_path / "keep.jsonl"
    path.write_text("precious\n")
    c = coordinator(2, metrics=str(path))
    sessions(c, 2, B=1, N=100, min_global_batch=1)
    c.stop()
    assert path.read_text() == "precious\n"


def test_slowdown_stretches_the_reported_compute(coordinator, tmp_path):
    c = coordinator(1, predictor="last")
    s = Session(8, 80, 8, None, env=env_for(c, 0, 1, slowdown="0:1,1:3"))
    for _ in range(4):
        s.next_iteration(8)
        s._t_end -= 0.01
        s.gradients_ready()
        s.step_done()
    s.close()
    rows = finished_records(c)
    assert [r["slowdown"] for r in rows] == [1.0, 3.0, 3.0, 3.0]
    assert rows[1]["compute_s"] == pytest.approx(3 * rows[0]["compute_s"], rel=0.5)
    # the iteration split from the first report learnt from (the warm-up's is not) carries
    # the speed the predictor expected for it
    assert np.isfinite(rows[-1]["predicted_speed"])


def test_records_get_their_prediction_whatever_order_the_reports_arrive_in(coordinator,
                                                                              tmp_path):
    """Rank 1 runs two iterations ahead of rank 0 (as in ASP): every record of iteration 2
    still carries the prediction made once iteration 1 was complete."""
    c = coordinator(2, sync="bsp", predictor="last")
    ss, _ = sessions(c, 2, sync="bsp")
    for rank in (1, 0):
        s = ss[rank]
        for _ in range(3):
            s.next_iteration(64)
            s._t_end -= 0.1 * (rank + 1)
            s.gradients_ready()
            s.step_done()
    for s in ss:
        s.close()
    rows = finished_records(c)
    assert [(r["iteration"], r["rank"]) for r in rows] == [(t, r) for t in range(3) for r in (0, 1)]
    last = [r for r in rows if r["iteration"] == 2]
    assert all(r["predicted_speed"] is not None for r in last), last
    assert last[0]["predicted_speed"] == pytest.approx(2 * last[1]["predicted_speed"], rel=0.3)


def test_untimed_work_is_not_compute(coordinator, tmp_path):
    c = coordinator(1, predictor="last")
    s = Session(8, 80, 8, None, env=env_for(c, 0, 1))
    for t in range(3):
        s.next_iteration(8)
        if t == 1:
            with s.untimed():
                threading.Event().wait(0.3)     # e.g. an evaluation between steps
        s.gradients_ready()
        s.step_done()
    s.close()
    rows = finished_records(c)
    assert rows[1]["compute_s"] < 0.1
    assert rows[1]["iteration_s"] >= 0.3        # the wall time still shows it


def test_alloc_messages_are_one_slice_per_worker():
    assert P.slice_line(3, 10, 5, 64) == P.encode(P.slice_message(3, 10, 5, 64))


def test_a_global_batch_other_than_the_allocated_one_still_tiles(coordinator):
    """A loop broken before the short last batch asks for B again while the coordinator
    split the short one: each worker scales its own slice, and the slices still tile."""
    c = coordinator(3, predictor="last")
    ss, errors = sessions(c, 3, B=30, N=300)
    assert not errors
    run_iteration(ss, [0.1, 0.1, 0.1], B=30)
    run_iteration(ss, [0.1, 0.2, 0.4], B=30)      # slice(2): 30 split 30 unevenly
    slices = sorted((off, off + b) for _, off, b in (s.next_iteration(20) for s in ss))
    assert slices[0][0] == 0 and slices[-1][1] == 20
    assert all(a[1] == b[0] and b[1] > b[0] for a, b in zip(slices, slices[1:]))


def _wait(predicate, seconds=5.0):
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return True
        threading.Event().wait(0.05)
    return predicate()


@pytest.mark.parametrize("bye_first", [True, False])
def test_a_worker_ending_early_fails_the_job_whatever_the_order(coordinator, bye_first):
    c = coordinator(2, predictor="last", sync="bsp")
    (s0, s1), _ = sessions(c, 2, sync="bsp")
    for _ in range(3):
        run_iteration([s0, s1], [0.1, 0.1])
    t, _, _ = s0.next_iteration(64)                  # worker 0 goes on to iteration 3 ...
    if bye_first:
        s1.close()                                   # ... worker 1 ends after 2
        assert c.failure is None or "ended after" in c.failure
        s0._t_end -= 0.1
        s0.gradients_ready()
    else:
        s0._t_end -= 0.1
        s0.gradients_ready()
        assert _wait(lambda: c.collect.last_report[0] == 3)
        s1.close()
    assert _wait(lambda: c.failure is not None)
    assert c.failure_fatal
    assert c.failure.startswith("worker 1 ended after iteration 2 while worker 0 went on to "
                                "iteration 3: every worker must run the same number of "
                                "iterations; use the DataLoader's epochs")


def test_workers_ending_together_are_no_failure(coordinator):
    c = coordinator(2, predictor="last")
    ss, _ = sessions(c, 2)
    for _ in range(3):
        run_iteration(ss, [0.1, 0.1])
    for s in ss:
        s.close()
    assert c.finished.wait(5)
    assert c.failure is None and c._bye_at == {0: 2, 1: 2}


def test_waiting_names_the_missing_reports_then_the_missing_dones(coordinator):
    c = coordinator(3, predictor="last", sync="bsp")
    assert c.waiting().what == "hello" and c.waiting().ranks == [0, 1, 2]
    ss, _ = sessions(c, 3, B=30, N=300, sync="bsp")
    run_iteration(ss, [0.1, 0.1, 0.1], B=30)
    assert _wait(lambda: c.progress().iteration == 0)
    for s in (ss[0], ss[2]):                         # worker 1 never reports iteration 1
        s.next_iteration(30)
        s.gradients_ready()
    assert _wait(lambda: c.waiting().ranks == [1])
    w = c.waiting()
    assert (w.iteration, w.what) == (1, "report")
    ss[1].next_iteration(30)
    ss[1].gradients_ready()
    ss[1].step_done()                                # only worker 1's push/pull finished
    assert _wait(lambda: c.waiting().ranks == [0, 2])
    assert c.waiting().what == "done"


def test_a_checkpoint_state_of_another_build_is_learnt_afresh_not_a_crash(caplog):
    """A coordinator's checkpoint state whose arrays have other shapes (another build of the
    time model) must not stop a resume: balancing learns afresh, with a warning."""
    import json
    a = Coordinator(CoordinatorConfig(num_workers=2, token="t"))
    state = json.loads(json.dumps(a.state_dict()))
    state["regime"]["times"] = {"array": [[1.0, 2.0, 3.0]], "dtype": "<f8"}   # 3, not 10
    state["fit"]["intercept"] = {"array": [0.5, 0.5, 0.5], "dtype": "<f8"}
    b = Coordinator(CoordinatorConfig(num_workers=2, token="t", resume_state=state,
                                      resume_manifest={"iteration": 19}))
    assert "learns afresh" in caplog.text
    assert b._regime.times.shape == a._regime.times.shape
    assert b._fit.intercept.shape == (2,)
    # the same state, unchanged, loads
    c = Coordinator(CoordinatorConfig(num_workers=2, token="t",
                                      resume_state=json.loads(json.dumps(a.state_dict())),
                                      resume_manifest={"iteration": 19}))
    assert c._regime.times.shape == a._regime.times.shape


def test_a_checkpoint_state_gives_back_its_two_splits_under_either_keys():
    """The two splits a checkpoint saved ("split", "next_split") are the resumed job's first;
    a state that saved them as "sizes" and "next_sizes" gives the same."""
    import json
    a = Coordinator(CoordinatorConfig(num_workers=2, token="t"))
    saved = json.loads(json.dumps(a.state_dict()))
    assert "split" in saved and "next_split" in saved and "sizes" not in saved
    for keys in (("split", "next_split"), ("sizes", "next_sizes")):
        state = {k: v for k, v in saved.items() if k not in ("split", "next_split")}
        state[keys[0]], state[keys[1]] = [40, 24], [36, 28]
        b = Coordinator(CoordinatorConfig(num_workers=2, token="t", resume_state=state,
                                          resume_manifest={"iteration": 19}))
        assert b._resumed_split.tolist() == [40, 24], keys
        assert b._resumed_next.tolist() == [36, 28], keys
