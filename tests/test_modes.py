"""The sync-mode seam (registry, refusals everywhere) and r2sp's coordinator policy with real
worker sessions over loopback TCP (threads play the workers; no MXNet)."""
import subprocess
import threading
import time

import numpy as np
import pytest

from mxlbbsp import modes
from mxlbbsp.core import env as _env
from mxlbbsp.launcher.cli import main
from mxlbbsp.launcher.config import ConfigError, LaunchConfig
from mxlbbsp.modes import r2sp as r2sp_mode

from conftest import PY, ROOT
from test_coordinator import coordinator, sessions  # noqa: F401  (fixture)


def test_registry_names_labels_and_kvstores():
    assert modes.available() == ["lbbsp", "bsp", "asp", "r2sp", "courier", "goodput"]
    assert modes.DEFAULT == "lbbsp"
    assert modes.labels() == {"lbbsp": "LB-BSP", "bsp": "BSP", "asp": "ASP", "r2sp": "R2SP",
                              "courier": "Courier", "goodput": "goodput"}
    assert [modes.get(m).kvstore for m in modes.available()] == \
        ["dist_sync", "dist_sync", "dist_async", "dist_async", "dist_sync", "dist_sync"]
    assert [modes.get(m).follows_splits for m in modes.available()] == \
        [True, False, False, True, True, True]
    assert [modes.get(m).sets_batch for m in modes.available()] == \
        [False, False, False, False, True, True]
    assert [modes.get(m).grad_norms for m in modes.available()] == \
        [False, False, False, False, False, True]
    with pytest.raises(modes.UnknownMode, match="unknown sync mode 'bogus'; choose one of"):
        modes.get("bogus")


def test_a_new_mode_is_one_registration(monkeypatch):
    monkeypatch.setattr(modes._api, "_REGISTRY", dict(modes._api._REGISTRY))

    @modes.register
    class Toy(modes.SyncMode):
        name, label, help = "toy", "Toy", "a test mode"

    assert modes.from_env({"MXLBBSP_SYNC": "toy"}).name == "toy"
    assert LaunchConfig(command=["x"], num_workers=1, sync="toy").sync == "toy"
    assert modes.labels()["toy"] == "Toy"


def test_unregistered_mode_is_refused_by_env_and_launch_config():
    with pytest.raises(_env.EnvError, match="MXLBBSP_SYNC='bogus': not a sync mode"):
        modes.from_env({"MXLBBSP_SYNC": "bogus"})
    with pytest.raises(ConfigError, match=r"^--sync 'bogus': choose one of lbbsp, bsp, asp, "
                       r"r2sp, courier, goodput$"):
        LaunchConfig(command=["x"], num_workers=1, sync="bogus")


@pytest.mark.parametrize("args, says", [
    (["--sync", "bogus"], "Invalid value for '--sync'"),
    (["--sync", "r2sp", "--r2sp-gap-ratio", "0"], "--r2sp-gap-ratio 0.0: must be in (0, 1]"),
    (["--sync", "r2sp", "--r2sp-gap-ratio", "1.5"], "--r2sp-gap-ratio 1.5: must be in (0, 1]"),
    (["--sync", "bsp", "--r2sp-gap-ratio", "0.5"], "an option of --sync r2sp, not of --sync bsp"),
    (["--r2sp-tuning", "paper"], "not of --sync lbbsp"),
])
def test_cli_refuses_bad_sync_input_with_one_line(capsys, args, says):
    assert main(["launch", "-n", "2", *args, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mxlbbsp launch: error: ") and says in err


def test_worker_with_unregistered_mode_exits_2_with_one_line():
    code = "from mxlbbsp.worker.session import Session; Session(8, 100, 8)"
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={"MXLBBSP_SYNC": "bogus", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2
    assert p.stderr.startswith("mxlbbsp: error: MXLBBSP_SYNC='bogus': not a sync mode")
    assert p.stderr.count("\n") == 1


def test_proportional_split_sums_and_keeps_one_each():
    assert list(r2sp_mode.proportional_split([1, 1, 1], 10)) == [4, 3, 3]
    split = r2sp_mode.proportional_split([100.0, 1e-9, 3.0], 50)
    assert split.sum() == 50 and split.min() >= 1 and split[0] > split[2] > split[1] - 1


def r2sp_workers(c, n, iterations, cost, B=60, push_s=0.002):
    """n threads run the r2sp worker loop with emulated compute (cost[i] s per sample);
    returns each worker's batch sizes per iteration."""
    ss, errors = sessions(c, n, B=B, N=100 * B, sync="r2sp")
    assert not errors
    sizes = [[] for _ in range(n)]

    def loop(r, s):
        for _ in range(iterations):
            _, _, b = s.next_iteration(B)
            sizes[r].append(b)
            time.sleep(b * cost[r])
            s.gradients_ready()
            s.before_push()
            time.sleep(push_s)
            s.step_done()
        s.close()

    threads = [threading.Thread(target=loop, args=(r, s)) for r, s in enumerate(ss)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert c.finished.wait(5) and c.failure is None
    return sizes


def test_r2sp_grants_round_robin_slots_spaced_by_the_gap(coordinator, caplog):
    c = coordinator(3, sync="r2sp", predictor="last",
                    sync_options={"gap_ratio": 0.8, "tuning": "none"})
    with caplog.at_level("DEBUG", logger="mxlbbsp.modes.r2sp"):
        sizes = r2sp_workers(c, 3, 8, [0.0005] * 3)
    assert all(s == [20] * 8 for s in sizes)
    # the policy's debug line of each grant carries (when, rank, iteration, gap)
    log = [r.grant for r in caplog.records if hasattr(r, "grant")]
    assert [(rank, t) for _, rank, t, _ in log] == [(r, t) for t in range(8) for r in range(3)]
    T = c._policy.iteration_time
    assert 0.01 < T < 1.0            # 60/3 * 0.5 ms + 2 ms push, plus the machine's noise
    spacing = [(b[0] - a[0], b[3]) for a, b in zip(log, log[1:])]
    assert all(dt >= gap * 0.999 for dt, gap in spacing)
    assert sum(gap > 0 for _, gap in spacing) >= 15   # the gap is in force once T is known


@pytest.mark.parametrize("tuning", ["paper", "balancer"])
def test_r2sp_batch_tuning_gives_the_slow_worker_fewer_samples(coordinator, tuning):
    c = coordinator(3, sync="r2sp", predictor="last", sync_options={"tuning": tuning})
    sizes = r2sp_workers(c, 3, 20, [0.002, 0.002, 0.006])
    assert all(sum(s[t] for s in sizes) == 60 for t in range(20))
    late = [np.mean(s[-5:]) for s in sizes]          # 1:1:3 -> ideally 26:26:8
    assert late[2] < 0.8 * min(late[0], late[1]), sizes


def test_r2sp_without_tuning_keeps_the_equal_split(coordinator):
    c = coordinator(3, sync="r2sp", predictor="last", sync_options={"tuning": "none"})
    sizes = r2sp_workers(c, 3, 6, [0.0005, 0.0005, 0.0015])
    assert all(s == [20] * 6 for s in sizes)


def test_r2sp_options_are_checked_by_the_coordinator_config():
    from mxlbbsp.control.coordinator import CoordinatorConfig
    with pytest.raises(ValueError, match="--r2sp-tuning 'magic'"):
        CoordinatorConfig(num_workers=2, token="t", sync="r2sp",
                          sync_options={"tuning": "magic"})
