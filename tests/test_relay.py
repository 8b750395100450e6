"""A host's relay (mxlbbsp.relay) between real worker sessions and a real coordinator, in
this process (the relay on a thread of its own, over a Unix socket in the abstract
namespace), and its frames (mxlbbsp.core.frames)."""
import asyncio
import json
import secrets
import socket
import threading
import time

import numpy as np
import pytest

from mxlbbsp.control.coordinator import Coordinator, CoordinatorConfig
from mxlbbsp.core import frames as F
from mxlbbsp.core import metrics
from mxlbbsp.core import protocol as P
from mxlbbsp.relay.hub import Hub
from mxlbbsp.relay.relay import Relay
from mxlbbsp.worker.session import Session
from conftest import in_threads
from test_coordinator import TOKEN, run_iteration

# ---- frames -------------------------------------------------------------------------------


def _report(t, rank, **extra):
    msg = P.report(t, 10 + rank, 0.01 * (rank + 1), 50.0, 20.0, 1.0, 64,
                   {"runq": 2.0, "steal": float("nan")})
    msg.update(extra)
    return msg


def test_a_section_reads_back_as_the_messages_sent():
    items = [(3, _report(5, 3), 0.001), (1, _report(5, 1), 0.002)]
    frames = F.encode_rows(items)
    assert len(frames) == 1
    (kind, body), = F.split_frames(bytearray(b"".join(frames)))[0]
    rows = F.decode_rows(body, 100.0)
    assert kind == F.ROWS and rows.what == "report" and rows.iteration == 5
    assert rows.ranks.tolist() == [3, 1]
    assert rows.received.tolist() == pytest.approx([99.999, 99.998])
    back = rows.dicts()
    for (_, sent, _), got in zip(items, back):
        assert got.pop("time") == pytest.approx(100.0, abs=0.01)
        assert list(got) == list(sent) and got == sent       # field for field, in order
    assert rows.floats("runq").tolist() == [2.0, 2.0]
    assert np.isnan(rows.floats("steal")).all() and np.isnan(rows.floats("absent")).all()
    assert rows.kind("batch_size") == "i" and rows.kind("steal") == "n"


def test_fields_of_other_kinds_go_in_sections_of_their_own_and_anything_json_travels():
    items = [(0, _report(2, 0, momentum=0.9, batchnorm=True), 0.0),
             (1, _report(2, 1, note={"a": [1, "x"]}, big=2 ** 70), 0.0),
             (2, _report(2, 2), 0.0),
             (4, {"type": "report", "iteration": 2, "\0bad": 1}, 0.0)]
    frames = F.encode_rows(items)
    parsed = F.split_frames(bytearray(b"".join(frames)))[0]
    kinds = [k for k, _ in parsed]
    assert kinds.count(F.ROWS) == 3 and kinds.count(F.FORWARD) == 1
    got = {}
    for kind, body in parsed:
        if kind == F.ROWS:
            rows = F.decode_rows(body, 0.0)
            for rank, msg in zip(rows.ranks.tolist(), rows.dicts()):
                msg.pop("time")
                got[rank] = msg
        else:
            rank, line = F.split_rank(body)
            got[rank] = P.decode(line)
    for rank, msg, _ in items:
        assert got[rank] == msg
        assert type(got[rank].get("batchnorm", False)) is bool


def test_a_malformed_section_is_a_frame_error():
    body = F.split_frames(bytearray(F.encode_rows([(0, _report(1, 0), 0.0)])[0]))[0][0][1]
    with pytest.raises(F.FrameError):
        F.decode_rows(body[:-8], 0.0)
    with pytest.raises(F.FrameError):
        F.split_frames(bytearray(F.HEADER.pack(F.ROWS, F.MAX_FRAME + 1)))


def test_a_hubs_merged_sections_read_back_as_its_relays_sections():
    """frames.merge_rows: one section per kind of section (type, iteration, columns), the
    rows in the order of the parts, each one's wait grown by its part's; JSON columns too."""
    def body(items):
        return [b for _, b in F.split_frames(bytearray(b"".join(F.encode_rows(items))))[0]]
    a = body([(0, _report(3, 0, note={"x": 0}), 0.001), (1, _report(3, 1, note=[1]), 0.002)])
    b = body([(2, _report(3, 2, note="two"), 0.0), (5, _report(3, 5), 0.0)])  # 5: no note
    c = body([(4, P.done(3, 0.1, 0.2, 0.3), 0.0)])
    merged = F.merge_rows([(a[0], 0.5), (b[0], 0.25), (c[0], 0.0), (b[1], 0.125)])
    parsed = F.split_frames(bytearray(b"".join(merged)))[0]
    assert [k for k, _ in parsed] == [F.ROWS] * 3
    sections = [F.decode_rows(x, 10.0) for _, x in parsed]
    assert [(r.what, r.ranks.tolist()) for r in sections] == \
        [("report", [0, 1, 2]), ("done", [4]), ("report", [5])]
    assert (10.0 - sections[0].received).tolist() == pytest.approx([0.501, 0.502, 0.25])
    assert (10.0 - sections[2].received).tolist() == pytest.approx([0.125])
    notes = {0: {"x": 0}, 1: [1], 2: "two"}
    for rows in sections:
        for rank, msg in zip(rows.ranks.tolist(), rows.dicts()):
            msg.pop("time", None)
            want = P.done(3, 0.1, 0.2, 0.3) if rank == 4 else _report(3, rank)
            if rank in notes:
                want["note"] = notes[rank]
            assert msg == want
    with pytest.raises(F.FrameError):
        F.merge_rows([(a[0][:-8], 0.0), (b[0], 0.0)])


def test_slices_frames_carry_each_workers_slice_line():
    frame = F.slices_frame(7, 100, np.array([4, 9]), np.array([10, 60]), np.array([5, 40]))
    (kind, body), = F.split_frames(bytearray(frame))[0]
    assert kind == F.SLICES
    assert F.slice_lines(body) == [(4, P.slice_line(7, 10, 5, 100)),
                                   (9, P.slice_line(7, 60, 40, 100))]


# ---- relays between sessions and a coordinator --------------------------------------------


class RelayThread:
    """A Relay on a thread of its own, serving ``workers`` workers of ``host``."""

    def __init__(self, c, host, workers, token=TOKEN, upstream=None):
        self.name = f"mxlbbsp-test-{secrets.token_hex(6)}"
        self.relay = self._make(upstream or tuple(c.address), token, host, workers)
        self.rc = None
        self.loop = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while self.relay.uplink.server is None and self.rc is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def _make(self, upstream, token, host, workers):
        return Relay("\0" + self.name, upstream, token, host, workers)

    def _run(self):
        async def main():
            self.loop = asyncio.get_running_loop()
            return await self.relay.run()
        self.rc = asyncio.run(main())

    @property
    def address(self):
        return f"unix:@{self.name}"

    def stop(self):
        if self.loop is not None and self.rc is None:
            try:
                self.loop.call_soon_threadsafe(self.relay.uplink.end, 0)
            except RuntimeError:        # it ended meanwhile (its loop is closed)
                pass
        self.thread.join(10)


class HubThread(RelayThread):
    """A Hub on a thread of its own (``relay``: the hub), for ``relays`` relays and
    ``workers`` workers; its relays' upstream is ``upstream``."""

    def __init__(self, c, name, relays, workers):
        self.relays = relays
        super().__init__(c, name, workers)

    def _make(self, upstream, token, host, workers):
        return Hub("\0" + self.name, upstream, token, host, self.relays, workers)

    @property
    def upstream(self):
        return "\0" + self.name


@pytest.fixture
def job(tmp_path):
    """job(n, hosts) -> (coordinator, sessions, relays): ``hosts``, workers per host (a host
    of one worker connects directly, as the launcher's --relay on does)."""
    made = []

    def make(n, hosts, sync="lbbsp", hub=False, **kw):
        kw.setdefault("metrics", str(tmp_path / f"m{len(made)}.jsonl"))
        c = Coordinator(CoordinatorConfig(num_workers=n, token=TOKEN, sync=sync, **kw))
        c.start()
        made.append(c)
        relays, addresses = [], []
        up = None
        if hub:                 # the relays reach the coordinator through a hub: relays[0]
            grouped = [k for k in hosts if k > 1]
            relays.append(HubThread(c, "hub-0", len(grouped), sum(grouped)))
            made.append(relays[0])
            up = relays[0].upstream
        for h, k in enumerate(hosts):
            if k > 1:
                relay = RelayThread(c, f"host{h}", k, upstream=up)
                relays.append(relay)
                made.append(relay)
                addresses += [relay.address] * k
            else:
                addresses.append(f"{c.address[0]}:{c.address[1]}")
        out, errors = in_threads(lambda r: Session(64, 640, 64, None, env={
            "MXLBBSP_COORDINATOR": addresses[r], "MXLBBSP_TOKEN": TOKEN,
            "MXLBBSP_RANK": str(r), "DMLC_NUM_WORKER": str(n), "MXLBBSP_SYNC": sync,
            "MXLBBSP_HOST": f"h{r}"}), n)
        assert not errors, errors
        return c, out, relays

    yield make
    for thing in reversed(made):
        thing.stop()


def test_workers_behind_relays_are_balanced_and_recorded_like_direct_ones(job):
    c, ss, relays = job(5, [2, 1, 2])
    assert c.registered == 5 and len(c.links.relays) == 2
    for _ in range(6):
        sizes = run_iteration(ss, [0.05, 0.05, 0.05, 0.05, 0.15])
        assert sum(sizes) == 64
    assert sizes[4] < min(sizes[:4])                     # the slow one, behind a relay
    for s in ss:
        s.close()
    assert c.finished.wait(5) and c.failure is None
    c.stop()
    rows = metrics.load(c.config.metrics)
    assert [(r["iteration"], r["rank"]) for r in rows] == [(t, r) for t in range(6)
                                                         for r in range(5)]
    assert all(r["wait_s"] is not None and r["runq"] is not None for r in rows)
    for relay in relays:
        relay.thread.join(5)
        assert relay.rc == 0                         # every worker ended: the relay too
        # a host's reports and dones of an iteration leave in one frame (mostly)
        assert relay.relay.sections_up < relay.relay.messages_up


def _raw_worker(address, rank, n, B=64):
    sock = P.connect(P.parse_address(address), timeout=10)
    sock.sendall(P.encode(dict(P.hello(rank, TOKEN, 1, "h", B, 10 * B, None),
                               min_global_batch=B)))
    return sock, sock.makefile("rb")


def _decisions(c, addresses, iterations=12, start=0, late=(), pause=0.0, log=False):
    """Feed the same reports (compute from the batch, per rank) through ``addresses``; the
    split of every iteration, and the records' fields the balancing decides. ``late``: ranks
    that report 80 ms after the others every 7th iteration (their relay's section leaves
    without them: its forecasts then travel in a frame of their own); ``pause``: seconds
    between the dones of an iteration and the next reports (the workers' compute). As a
    worker's push/pull ends only once every worker has pushed, each worker sends its done of
    t once the coordinator has answered the reports of t (its split of t+1+ahead), and
    takes the split of t+1 from the ones it received."""
    n = len(addresses)
    socks = [None] * n
    threads = [threading.Thread(target=lambda r=r: socks.__setitem__(
        r, _raw_worker(addresses[r], r, n))) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    files = [f for _, f in socks]
    ahead = c._policy.ahead
    sizes = json.loads(files[0].readline())["split"]
    for f in files[1:]:
        f.readline()
    got = [{} for _ in range(n)]        # per worker: iteration -> its slice's size

    def answer(t):                      # every worker's split of the iteration t's reports split
        for r, f in enumerate(files):
            while t + 1 + ahead not in got[r]:
                msg = json.loads(f.readline())
                got[r][msg["iteration"]] = msg["size"]
    answer(start - 1)                   # the splits sent before any report
    splits = [sizes]
    for t in range(start, start + iterations):
        time.sleep(pause if t > start else 0.0)
        order = sorted(range(n), key=lambda r: t % 7 == 0 and r in late)
        for r in order:
            if t % 7 == 0 and r in late and r == order[-len(late)]:
                time.sleep(0.08)
            sock = socks[r][0]
            compute = 0.001 * (1 + r) + sizes[r] * 0.0002 * (1 + (r % 3)) * (1 + (t // 15) % 2)
            sock.sendall(P.encode(P.report(t, sizes[r], compute, 50.0 + 10 * (t % 5), 20.0, 1.0,
                                           64, {"runq": float(r)})))
        answer(t)
        sizes = [got[r].pop(t + 1) for r in range(n)]
        splits.append(sizes)
        for r, (sock, _) in enumerate(socks):
            sock.sendall(P.encode(P.done(t, 0.001, 0.002, 0.01)))
            if log:                     # the script's mxlbbsp.log after its step
                sock.sendall(P.encode(P.log(t, {"loss": 1.0 / (1 + t + r)})))
    for sock, _ in socks:
        sock.sendall(P.encode(P.bye(start + iterations - 1)))
        sock.close()
    assert c.finished.wait(10) and c.failure is None
    c.stop()
    keep = ("iteration", "rank", "batch_size", "compute_s", "predicted_speed", "wait_s",
            "runq", "fallbacks") + (("scalars",) if log else ())
    return splits, [{k: r[k] for k in keep} for r in metrics.load(c.config.metrics)]


def _through(hosts, config, hub=False, **feed):
    """_decisions with the workers on ``hosts`` (workers per host; one: directly); ``hub``:
    the relays reach the coordinator through one hub."""
    c = Coordinator(config)
    c.start()
    relays, addresses = [], []
    up = None
    if hub:
        grouped = [k for k in hosts if k > 1]
        relays.append(HubThread(c, "hub-0", len(grouped), sum(grouped)))
        up = relays[0].upstream
    for h, k in enumerate(hosts):
        if k > 1:
            relays.append(RelayThread(c, f"host{h}", k, upstream=up))
            addresses += [relays[-1].address] * k
        else:
            addresses.append(f"{c.address[0]}:{c.address[1]}")
    try:
        return _decisions(c, addresses, **feed), c, [r.relay for r in relays]
    finally:
        c.stop()
        for relay in relays:
            relay.stop()


def test_the_same_reports_give_the_same_splits_and_records_through_relays(tmp_path):
    results = []
    for hosts in ([1] * 6, [3, 3], [4, 1, 1]):
        config = CoordinatorConfig(num_workers=6, token=TOKEN,
                                   metrics=str(tmp_path / f"{len(results)}.jsonl"))
        results.append(_through(hosts, config)[0])
    assert results[0][0][-1] != results[0][0][0]         # it did rebalance
    assert results[1] == results[0] and results[2] == results[0]


def test_relays_forecast_their_workers_as_the_coordinator_would_through_checkpoints(tmp_path):
    """NARX runs in the relays (its forecasts with the reports, or in a frame of their own
    when a worker was late); the splits, the records and the checkpoints' predictor states
    are those of one predictor over all workers, and so are a resumed job's."""
    runs, states = {}, {}
    for hosts in ([1] * 6, [3, 3], [4, 1, 1], "hub", "hub2"):
        key = str(hosts)
        folder = tmp_path / f"ckpt{len(runs)}"
        config = CoordinatorConfig(num_workers=6, token=TOKEN, checkpoint_dir=str(folder),
                                   checkpoint_every=10,
                                   metrics=str(tmp_path / f"{len(runs)}.jsonl"))
        hub = hosts in ("hub", "hub2")      # 3 + 3, or 2 + 3 and one direct, through a hub
        hosts = {"hub": [3, 3], "hub2": [2, 3, 1]}[hosts] if hub else hosts
        runs[key], c, relays = _through(hosts, config, hub=hub, iterations=40, late=(2, 5))
        states[key] = {f.name: json.loads(f.read_text()) for f in sorted(folder.iterdir())}
        hubs = [r for r in relays if isinstance(r, Hub)]
        relays = [r for r in relays if isinstance(r, Relay)]
        if len(hosts) > 1 and hosts != [1] * 6:
            behind = sum(k for k in hosts if k > 1)
            assert c.speed.remote.sum() == behind and len(c.speed.local) == 6 - behind
            assert all(r.forecaster is not None for r in relays)
            assert sum(r.forecasts_ahead for r in relays) > 0     # the late workers' path
        if hub:     # the coordinator saw one relay: the hub, which merged its relays' sections
            assert len(c.links.relays) == 1 and len(relays) == 2
            assert 0 < hubs[0].sections_up < hubs[0].sections_in
    direct = str([1] * 6)
    assert runs[direct][0][-1] != runs[direct][0][0]     # it did rebalance
    assert list(states[direct]) == [f"coordinator-{t:08d}.json" for t in (9, 19, 29, 39)]
    assert states[direct]["coordinator-00000039.json"]["predictor"] is not None
    for key in runs:
        for a, b in zip(runs[key][1], runs[direct][1]):
            assert a == b, (key, sorted(a.items()), sorted(b.items()))
        assert runs[key] == runs[direct], key
        assert states[key] == states[direct], key
    # resumed from iteration 29's checkpoint, over another placement than the one saved it
    saved = states[str([3, 3])]["coordinator-00000029.json"]
    resumed = {}
    for hosts, state in (([1] * 6, saved), ([2, 4], saved), ([3, 3], saved),
                         ("hub", states["hub"]["coordinator-00000029.json"]),
                         ("afresh", dict(saved, predictor_name=None))):
        config = CoordinatorConfig(
            num_workers=6, token=TOKEN,
            resume_manifest={"iteration": 29, "global_batch_size": 64}, resume_state=state,
            metrics=str(tmp_path / f"resumed{len(resumed)}.jsonl"))
        placed = {"afresh": [1] * 6, "hub": [2, 4]}.get(hosts, hosts) \
            if isinstance(hosts, str) else hosts
        resumed[str(hosts)] = _through(placed, config, hub=hosts == "hub",
                                       iterations=10, start=30)[0]
    assert resumed[str([2, 4])] == resumed[direct] and resumed[str([3, 3])] == resumed[direct]
    assert resumed["hub"] == resumed[direct]     # a hub's relays get their parts of the state
    # the predictor's state did count (in its forecasts: the first split it decides is 33's,
    # from the reports of 31, and this trace's splits then come out the same)
    assert resumed["afresh"][1] != resumed[direct][1]
    # from the splits the checkpoint saved (iteration 30 is the restart's warm-up): the two
    # the job had decided when it stopped, 30's and 31's
    assert resumed[direct][0][0] == states[direct]["coordinator-00000029.json"]["split"]
    assert resumed[direct][0][:2] == runs[direct][0][30:32]


def test_a_hosts_dones_leave_with_its_next_reports_but_not_at_a_checkpoint(tmp_path,
                                                                           monkeypatch):
    """One write per host per iteration in lbbsp: the section of dones of t waits for the
    reports of t + 1; at an iteration the coordinator checkpoints, the dones (and the
    relay's predictor state) leave at once."""
    writes = []
    send = Relay._send

    def counted(self, frames):
        writes.append([(f[0], f[8] if f[0] == F.ROWS else None) for f in frames])
        return send(self, frames)
    monkeypatch.setattr(Relay, "_send", counted)
    config = CoordinatorConfig(num_workers=8, token=TOKEN, checkpoint_dir=str(tmp_path / "c"),
                               checkpoint_every=5, metrics=str(tmp_path / "m.jsonl"))
    _through([4, 4], config, iterations=20, pause=0.1)
    sections = [w for w in writes if any(kind == F.ROWS for kind, _ in w)]
    done, report = 1, 0                     # a ROWS head's first byte: what
    pairs = [w for w in sections if w == [(F.ROWS, done), (F.ROWS, report)]]
    alone = [w for w in sections if w[:2] == [(F.STATE, None), (F.ROWS, done)]
             and (F.ROWS, report) not in w]
    # 2 relays: iterations 0..18's dones with the next reports, but for the checkpoints'
    # 4, 9 and 14, and the last, 19 (with the byes, or before them): at once, with the
    # relay's predictor state ahead of them. (A relay read late by a loaded machine may
    # send a host's reports in two sections, or find dones and reports at once: a few
    # writes of either kind may take another shape.)
    assert 2 * (19 - 3) - 8 <= len(pairs) <= 2 * (19 - 3), writes
    assert 2 * 3 - 1 <= len(alone) <= 2 * 4, writes


def test_a_checkpoint_holds_the_relays_predictor_state_when_a_done_follows_its_report(
        tmp_path):
    """A worker that has its next split need not wait between its report and its done:
    both may reach the relay in one read. The relay's predictor learns from the reports
    before the dones of an iteration the coordinator checkpoints leave, so that its state
    leads them and the checkpoint holds the predictor's state."""
    config = CoordinatorConfig(num_workers=2, token=TOKEN, checkpoint_dir=str(tmp_path / "c"),
                               checkpoint_every=2, metrics=str(tmp_path / "m.jsonl"))
    c = Coordinator(config)
    c.start()
    relay = RelayThread(c, "host0", 2)
    try:
        socks = [None, None]
        threads = [threading.Thread(target=lambda r=r: socks.__setitem__(
            r, _raw_worker(relay.address, r, 2))) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        sizes = [{0: json.loads(f.readline())["split"][r]} for r, (_, f) in
                 enumerate(socks)]
        for t in range(4):
            for r, (sock, f) in enumerate(socks):
                while t not in sizes[r]:
                    msg = json.loads(f.readline())
                    sizes[r][msg["iteration"]] = msg["size"]
                compute = 0.001 * sizes[r][t] * (1 + r)
                sock.sendall(P.encode(P.report(t, sizes[r][t], compute, 50.0, 20.0, 1.0, 64))
                             + P.encode(P.done(t, 0.001, 0.002, 0.01)))
        for sock, _ in socks:
            sock.sendall(P.encode(P.bye(3)))
            sock.close()
        assert c.finished.wait(10) and c.failure is None, c.failure
    finally:
        c.stop()
        relay.stop()
    assert c.speed.remote.all()                       # the relay forecast both workers
    for t in (1, 3):
        state = json.loads((tmp_path / "c" / f"coordinator-{t:08d}.json").read_text())
        assert state["predictor"] is not None, t


def test_a_hub_sends_its_relays_sections_of_an_iteration_in_one_write(tmp_path):
    """Through a hub, the coordinator reads one write per iteration for its relays (their
    dones of t and reports of t + 1 merged into one section each), and the same splits."""
    config = CoordinatorConfig(num_workers=8, token=TOKEN, metrics=str(tmp_path / "m.jsonl"))
    (splits, _), c, relays = _through([3, 3, 2], config, hub=True, iterations=20, pause=0.05)
    hub = relays[0]
    assert isinstance(hub, Hub) and len(c.links.relays) == 1
    # 20 iterations: a write per iteration (the first with the hellos, the last with the
    # byes, and a relay read late by a loaded machine: a few more), not one per relay (60)
    assert 20 <= hub.writes_up <= 40, hub.writes_up
    # 3 relays' sections merged (a few left apart when a relay was read late: not 3x)
    assert hub.sections_up <= hub.sections_in / 2, (hub.sections_in, hub.sections_up)
    direct = CoordinatorConfig(num_workers=8, token=TOKEN, metrics=str(tmp_path / "d.jsonl"))
    assert splits == _through([1] * 8, direct, iterations=20, pause=0.05)[0][0]


def test_a_hub_merges_its_relays_sections_when_the_workers_log_every_iteration(tmp_path):
    """A worker's log line between its done and its next report is forwarded in its order,
    and the hub still merges the relays' sections (ordering is per worker, not per relay);
    the splits and the records, scalars included, as direct workers'."""
    config = CoordinatorConfig(num_workers=8, token=TOKEN, metrics=str(tmp_path / "m.jsonl"))
    got, c, relays = _through([3, 3, 2], config, hub=True, iterations=20, pause=0.05, log=True)
    hub = relays[0]
    # merged: about a third as many sections up as in (3 relays); a relay read late by a
    # loaded machine leaves some apart (a fresh-clone run under load: 63 of 124, just over a
    # half); sections ordered per relay would not merge at all (as many up as in)
    assert hub.sections_up <= hub.sections_in * 2 / 3, (hub.sections_in, hub.sections_up)
    assert all(r["scalars"] for r in got[1][:-8])     # the last iteration's may come late
    direct = CoordinatorConfig(num_workers=8, token=TOKEN, metrics=str(tmp_path / "d.jsonl"))
    assert got == _through([1] * 8, direct, iterations=20, pause=0.05, log=True)[0]


def test_a_relay_behind_a_hub_that_goes_away_fails_the_job_naming_its_workers(job):
    c, ss, relays = job(4, [2, 2], hub=True)
    run_iteration(ss, [0.05] * 4)
    relays[2].loop.call_soon_threadsafe(relays[2].relay.uplink.transport.abort)     # host1's relay
    deadline = time.monotonic() + 5
    while c.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.failure in (f"worker {r} lost its connection to the coordinator before it "
                         "finished" for r in (2, 3)), c.failure


def test_a_malformed_report_through_a_relay_fails_the_job_naming_the_worker(job):
    c, ss, _ = job(2, [2])
    run_iteration(ss, [0.05, 0.05])
    ss[1].send({"type": "report", "iteration": 1, "batch_size": 0, "compute_s": 0.1})
    deadline = time.monotonic() + 5
    while c.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.failure == "worker 1: protocol error: report of iteration 1 has batch_size=0, " \
                        "compute_s=0.1"


def test_a_worker_that_drops_its_connection_to_the_relay_is_named(job):
    c, ss, _ = job(3, [3])
    run_iteration(ss, [0.05, 0.05, 0.05])
    ss[2]._sock.shutdown(socket.SHUT_RDWR)   # no bye
    deadline = time.monotonic() + 5
    while c.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.failure == "worker 2 lost its connection to the coordinator before it finished"


def test_a_relay_that_goes_away_is_named_with_its_host(job):
    c, ss, relays = job(2, [2])
    run_iteration(ss, [0.05, 0.05])
    relays[0].loop.call_soon_threadsafe(relays[0].relay.uplink.transport.abort)
    deadline = time.monotonic() + 5
    while c.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.failure == "the relay of host host0 lost its connection to the coordinator " \
                        "before its workers finished"
    relays[0].thread.join(5)
    assert relays[0].rc == 1


def test_the_relay_refuses_a_connection_without_the_token(job):
    c, ss, relays = job(2, [2])
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + relays[0].name)
        s.sendall(P.encode(P.hello(0, "wrong", 1, "h", 64, 640, None)))
        s.settimeout(5)
        assert s.recv(100) == b""
    assert relays[0].relay.refused == 1 and c.failure is None
    run_iteration(ss, [0.05, 0.05])          # the job goes on


def test_a_rank_behind_two_relays_is_refused(job):
    c, ss, relays = job(2, [2])
    other = RelayThread(c, "intruder", 1)
    try:
        with P.connect(P.parse_address(other.address), timeout=5) as s:
            s.sendall(P.encode(dict(P.hello(1, TOKEN, 1, "h", 64, 640, None),
                                    min_global_batch=64)))
            line = s.makefile("rb").readline()
        assert b"rank 1 connected twice" in line
    finally:
        other.stop()
    run_iteration(ss, [0.05, 0.05])


@pytest.mark.parametrize("env, needle", [
    ({}, "MXLBBSP_RELAY and MXLBBSP_COORDINATOR must be set"),
    ({"MXLBBSP_RELAY": "unix:@x", "MXLBBSP_COORDINATOR": "nowhere"}, "expected host:port"),
    ({"MXLBBSP_RELAY": "unix:@x", "MXLBBSP_COORDINATOR": "127.0.0.1:1",
      "MXLBBSP_LOCAL_SIZE": "0"}, "a relay serves at least one worker"),
])
def test_a_relay_started_by_hand_with_bad_variables_says_so_in_one_line(env, needle):
    import os
    import subprocess
    import sys
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MXLBBSP_")}
    r = subprocess.run([sys.executable, "-m", "mxlbbsp.relay"], env={**clean, **env},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mxlbbsp: error: ") and needle in lines[0]


# ---- the shared connection layer behind a relay and a hub ---------------------------------


def _frames_from(sock, count, timeout=10.0):
    """The first ``count`` frames read from ``sock``, (kind, body)."""
    sock.settimeout(timeout)
    buffer, out = bytearray(), []
    while len(out) < count:
        data = sock.recv(65536)
        assert data, f"closed after {len(out)} frame(s)"
        buffer += data
        got, used = F.split_frames(buffer)
        del buffer[:used]
        out += got
    return out


def _stand_in_coordinator():
    """A listening socket the relay or hub under test takes for the coordinator, and an
    object with its ``address`` (what RelayThread reads of a coordinator)."""
    import types
    up = socket.create_server(("127.0.0.1", 0))
    return up, types.SimpleNamespace(address=up.getsockname())


def _hello_line(rank):
    return P.encode(dict(P.hello(rank, TOKEN, 1, "h", 64, 640, None), min_global_batch=64))


def test_a_hub_cuts_a_split_into_its_relays_ranks_that_the_split_holds():
    """The SLICES frame the hub gets holds the ranks the coordinator registered; a relay
    gets a frame of its ranks among them (one it routes but the split leaves out: none), a
    relay with none of them no frame; TO_ALL then reaches all three."""
    up, stand_in = _stand_in_coordinator()
    hub = HubThread(stand_in, "hub-cut", 3, 5)
    try:
        coordinator, _ = up.accept()
        hello = json.loads(coordinator.makefile("rb").readline())
        assert hello["type"] == P.RELAY and hello["workers"] == 5
        relays = []
        for host, ranks in (("a", [0, 1]), ("b", [2, 9]), ("c", [8])):
            s = socket.socket(socket.AF_UNIX)
            s.connect(hub.upstream)
            s.sendall(P.encode(P.relay_hello(TOKEN, host, len(ranks), 1)) + b"".join(
                F.rank_frame(F.FORWARD, r, _hello_line(r)[:-1]) for r in ranks))
            relays.append(s)
        assert [k for k, _ in _frames_from(coordinator, 5)] == [F.FORWARD] * 5
        coordinator.sendall(F.slices_frame(5, 100, np.array([0, 1, 2]), np.array([0, 10, 30]),
                                           np.array([10, 20, 70]))
                            + F.frame(F.TO_ALL, P.encode({"type": "x"})))
        a, b = (_frames_from(s, 2) for s in relays[:2])
        assert [k for k, _ in a] == [k for k, _ in b] == [F.SLICES, F.TO_ALL]
        assert [x.tolist() for x in F.read_slices(a[0][1])[2]] == [[0, 1], [0, 10], [10, 20]]
        assert [x.tolist() for x in F.read_slices(b[0][1])[2]] == [[2], [30], [70]]
        assert F.read_slices(a[0][1])[:2] == (5, 100)
        assert [k for k, _ in _frames_from(relays[2], 1)] == [F.TO_ALL]
        for s in relays + [coordinator]:
            s.close()
    finally:
        hub.stop()
        up.close()


def test_a_relay_writes_slice_lines_to_its_workers_that_the_split_holds():
    up, stand_in = _stand_in_coordinator()
    relay = RelayThread(stand_in, "host0", 2)
    try:
        coordinator, _ = up.accept()
        assert json.loads(coordinator.makefile("rb").readline())["type"] == P.RELAY
        workers = [P.connect(P.parse_address(relay.address), timeout=10) for _ in range(2)]
        for r, s in enumerate(workers):
            s.sendall(_hello_line(r))
        assert [k for k, _ in _frames_from(coordinator, 2)] == [F.FORWARD] * 2
        coordinator.sendall(F.slices_frame(3, 10, np.array([1]), np.array([7]), np.array([3]))
                            + F.frame(F.TO_ALL, P.encode({"type": "x"})))
        lines = [s.makefile("rb").readline() for s in workers]
        assert lines == [P.encode({"type": "x"}), P.slice_line(3, 7, 3, 10)]
        for s in workers + [coordinator]:
            s.close()
    finally:
        relay.stop()
        up.close()


def test_a_relays_refusals_are_counted_and_their_warnings_rate_limited(job, caplog,
                                                                        monkeypatch):
    """As the coordinator's: the first few warned about one by one, then a count line per
    interval."""
    from mxlbbsp.relay import uplink
    monkeypatch.setattr(uplink, "REFUSAL_SUMMARY_S", 0.3)
    c, ss, relays = job(2, [2])
    bad = P.encode(P.hello(0, "wrong", 1, "h", 64, 640, None))
    for _ in range(8):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect("\0" + relays[0].name)
            s.sendall(bad)
            s.settimeout(5)
            assert s.recv(100) == b""
    deadline = time.monotonic() + 10
    while not any("refused 3 more" in r.getMessage() for r in caplog.records) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 6, lines
    assert all(line.startswith("the relay of host host0 refused a connection: bad hello")
               for line in lines[:5])
    assert lines[5].startswith("the relay of host host0 refused 3 more connection(s)")
    assert relays[0].relay.refused == 8 and c.failure is None
    run_iteration(ss, [0.05, 0.05])          # the job goes on
