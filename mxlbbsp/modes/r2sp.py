"""``r2sp``: round-robin synchronisation (Chen, Wang, Li, INFOCOM 2019) on dist_async servers.

When every worker pushes at the same instant, the parameter servers' link is the bottleneck.
R2SP staggers the pushes: each push is applied on its own as it arrives (MXNet's dist_async,
as in ``asp``), but a worker may push only when the coordinator grants it a slot. Slots go
round-robin to ranks 0..n-1, spaced by a gap r*T/n, where T is the workers' iteration time
without the wait for the slot (an EMA over their ``done`` messages) and r is
``--r2sp-gap-ratio`` (0.8 by default, the paper's best). Staleness is at most n-1 updates.

Worker loop (iteration t): wait for its slice of t (it came with the grant of t-1); compute;
report; send ``request(t)`` and block until ``grant(t)``; push and pull. The grant carries
the worker's slice of t+1: the split of every round is decided once, when the round's first
slot is granted, so the slices of one round still tile the global batch B(t) exactly as in
the synchronous modes (every sample once per epoch).

Gradient scaling. The servers' optimizer has a fixed ``rescale_grad = 1/N0`` (Gluon pickles
it once), and each push is one update. A worker pushes the *sum* of its b_i per-sample
gradients, and N0 = B/n, the initial batch of every worker. So an update is
lr * (b_i / b_i0) * mean gradient: the paper's scaling of each update by its batch relative to
the initial batch, with no per-step multiply (the normaliser is constant, N(t) = N0). A round
of n updates then moves the parameters by lr * (sum of the round's gradients) / (B/n), the
same as ``asp``'s n updates when the split is equal.

Batch tuning for heterogeneous workers (``--r2sp-tuning``):

``paper``     b_i <- b_i + blocked_i * v_i (blocked_i: worker i's wait for its slot, v_i =
              b_i / compute_i its speed), scaled to keep sum = B(t+1): a worker that waits for
              others gets the samples it could have processed meanwhile. Damped: blocked_i
              and v_i are EMAs (weight 0.5) and the step is halved, because with the raw
              rule millisecond jitter in the waits made batches swing from 1 to 80 of 96;
``balancer``  the LB-BSP balancer's min-makespan split on the predictor's forecasts (decided
              when all reports of t are in, applied at the next round);
``none``      the equal split.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Dict, Optional, Tuple

import numpy as np

from mxlbbsp.core import protocol as P
from mxlbbsp.core import split as _split

from ._api import CoordinatorPolicy, Option, SyncMode, register

TUNINGS = ("paper", "balancer", "none")
log = logging.getLogger(__name__)
DEFAULTS = {"gap_ratio": 0.8, "tuning": "paper"}
EMA_ALPHA = 0.2
#: the paper's rule, damped: blocking times and speeds are smoothed (EMA with this weight of
#: the newest), and a round moves each batch by this share of the rule's step
TUNE_SMOOTHING = 0.5
TUNE_GAIN = 0.5


def proportional_split(weights, total: int) -> np.ndarray:
    """An integer split of ``total`` proportional to ``weights`` (> 0), each part >= 1
    (largest remainders, ties to the lower rank)."""
    w = np.asarray(weights, dtype=float)
    n = len(w)
    if total < n:
        raise _split.SplitError(f"cannot split {total} samples among {n} workers")
    share = (total - n) * w / w.sum()
    base = np.floor(share).astype(np.int64)
    rest = int(total - n - base.sum())
    order = np.argsort(-(share - base), kind="stable")
    base[order[:rest]] += 1
    return base + 1


class R2SPPolicy(CoordinatorPolicy):
    """Grants push slots in round-robin order, spaced by the learned gap."""

    sends = True
    #: a push slot per worker per iteration: decided every iteration
    windowed = False

    def __init__(self, coordinator, options=None):
        super().__init__(coordinator, options)
        opts = self.resolved(DEFAULTS, R2SP.check_options)
        self.gap_ratio = float(opts["gap_ratio"])
        self.tuning = opts["tuning"]
        n = self.num_workers
        self._requests: Dict[int, Tuple[int, float, Optional[int]]] = {}  # rank -> (t, at, B')
        self._next = 0                   # the rank whose slot comes next
        self._round = 0
        self._last_grant = -float("inf")
        self._timer: Optional[asyncio.TimerHandle] = None
        self._gone: set = set()          # ranks that said bye
        self._splits: Dict[int, np.ndarray] = {}   # round -> split in force
        self._planned: Optional[np.ndarray] = None  # the balancer's latest split
        self._blocked = np.full(n, np.nan)   # each worker's wait for its slot (s, smoothed)
        self._grant_at: Dict[Tuple[int, int], float] = {}
        self._speed = np.full(n, np.nan)
        self.iteration_time: Optional[float] = None   # T, EMA of unblocked iteration time
        #: the latest grants: (monotonic time, rank, iteration, gap in force) (tests, debug)

    @property
    def gap(self) -> float:
        """The spacing of consecutive slots, r*T/n (0 until T is known)."""
        if self.iteration_time is None:
            return 0.0
        return self.gap_ratio * self.iteration_time / self.num_workers

    def first_split(self, global_batch):
        split = super().first_split(global_batch)
        self._splits[0] = split
        return split

    def plan(self, t, model, next_B, in_force):
        if self.tuning == "balancer":
            self._planned = self.coordinator.balancer.split(model, next_B, in_force)
        split = self._splits.get(t + 1)
        return split if split is not None else (
            in_force if in_force is not None and int(in_force.sum()) == next_B
            else _split.equal_split(next_B, self.num_workers))

    def on_report(self, rank, msg):
        if int(msg["iteration"]) >= self.coordinator.config.warmup:
            v, old = msg["batch_size"] / msg["compute_s"], self._speed[rank]
            self._speed[rank] = v if not np.isfinite(old) else old + TUNE_SMOOTHING * (v - old)

    def on_message(self, rank, msg):
        if msg["type"] != P.REQUEST:
            return False
        t = int(msg["iteration"])
        nb = msg.get("next_global_batch")
        if nb is not None and (not isinstance(nb, int) or nb < 1):
            raise P.ProtocolError(f"request of iteration {t} has next_global_batch={nb!r}")
        self._requests[rank] = (t, time.monotonic(), nb)
        self._try_grant()
        return True

    def on_done(self, rank, msg):
        t = int(msg["iteration"])
        granted = self._grant_at.pop((rank, t), None)
        it = msg.get("iteration_s")
        if t < self.coordinator.config.warmup or granted is None or it is None:
            return
        unblocked = max(float(it) - granted, 1e-6)
        T = self.iteration_time
        self.iteration_time = unblocked if T is None else T + EMA_ALPHA * (unblocked - T)

    def on_bye(self, rank):
        self._gone.add(rank)
        self._requests.pop(rank, None)
        self._try_grant()

    # ---- slots ------------------------------------------------------------------------

    def _advance(self) -> None:
        self._next += 1
        if self._next == self.num_workers:
            self._next = 0
            self._round += 1

    def _try_grant(self) -> None:
        if self._timer is not None:
            return
        for _ in range(self.num_workers):
            if len(self._gone) == self.num_workers or self.coordinator.failure is not None:
                return
            if self._next in self._gone:
                self._advance()
                continue
            rank = self._next
            req = self._requests.get(rank)
            if req is None:
                return
            now = time.monotonic()
            due = self._last_grant + self.gap
            if now < due:
                self._timer = asyncio.get_running_loop().call_later(due - now, self._on_timer)
                return
            del self._requests[rank]
            self._grant(rank, *req, now)
            self._last_grant = now
            self._advance()

    def _on_timer(self) -> None:
        self._timer = None
        self._try_grant()

    def _grant(self, rank: int, t: int, asked: float, next_B: Optional[int], now: float) -> None:
        if t >= self.coordinator.config.warmup:
            b = self._blocked[rank]
            self._blocked[rank] = (now - asked) if not np.isfinite(b) else \
                b + TUNE_SMOOTHING * (now - asked - b)
        self._grant_at[(rank, t)] = now - asked
        split = self._splits.get(t + 1)
        if split is None and next_B is not None:
            split = self._decide(t, next_B)
            self._splits[t + 1] = split
            for old in [k for k in self._splits if k < t]:
                del self._splits[old]
        if split is not None and next_B is not None and int(split.sum()) != next_B:
            # a worker that counts batches differently
            split = self.coordinator.balancer.scale(split, next_B, bounds=False)
        part = None if split is None or next_B is None else _split.slice_of(split, rank)
        log.debug("r2sp: grant rank %d iteration %d (blocked %.4f s, gap %.4f s), next slice %s",
                  rank, t, now - asked, self.gap, part,
                  extra={"grant": (now, rank, t, self.gap)})   # (when, rank, iteration, gap)
        self.coordinator.send(rank, P.grant(t, part))

    def _decide(self, t: int, next_B: int) -> np.ndarray:
        """The split of round t+1, decided when round t's first slot is granted."""
        n = self.num_workers
        scale = self.coordinator.balancer.scale       # bounds=False: as the workers rescale
        in_force = self._splits.get(t)
        if in_force is None:
            in_force = _split.equal_split(next_B, n)
        if t < self.coordinator.config.warmup or self.tuning == "none":
            return scale(in_force, next_B, bounds=False)
        if self.tuning == "balancer":
            return scale(self._planned if self._planned is not None else in_force, next_B,
                         bounds=False)
        if not (np.all(np.isfinite(self._speed)) and np.all(np.isfinite(self._blocked))):
            return scale(in_force, next_B, bounds=False)
        target = in_force + TUNE_GAIN * self._blocked * self._speed
        split = proportional_split(target, next_B)
        cap = self.coordinator.balancer.max_batch
        if cap is not None and np.any(split > cap):
            split = scale(in_force, next_B, bounds=False)
        return split


@register
class R2SP(SyncMode):
    name = "r2sp"
    label = "R2SP"
    help = ("round-robin push slots spaced r*T/n on dist_async servers; batch sizes tuned "
            "(--r2sp-tuning)")
    kvstore = "dist_async"
    barrier = False
    policy = R2SPPolicy
    options = (
        Option("gap_ratio", "--r2sp-gap-ratio", type=float, metavar="R",
               help="push slots are spaced R x the iteration time / n, R in (0, 1] "
                    "(default 0.8)."),
        Option("tuning", "--r2sp-tuning", type=TUNINGS,
               help="per-worker batch tuning: paper (b += blocked time x speed), balancer "
                    "(LB-BSP's split), none (equal) (default paper)."),
    )

    @staticmethod
    def check_options(options: dict) -> Optional[str]:
        r = options.get("gap_ratio", DEFAULTS["gap_ratio"])
        if r is not None and not (isinstance(r, (int, float)) and 0 < r <= 1):
            return (f"--r2sp-gap-ratio {r}: must be in (0, 1], e.g. 0.8 (slots spaced 0.8 "
                    "of the iteration time / n)")
        tuning = options.get("tuning", DEFAULTS["tuning"])
        if tuning is not None and tuning not in TUNINGS:
            return f"--r2sp-tuning {tuning!r}: choose one of {', '.join(TUNINGS)}"
        return None

    def normalisers(self, sess) -> Tuple[float, float]:
        nominal = sess.global_batch_size / sess.num_workers
        return nominal, nominal

    def attach(self, sess) -> "PushSlots":
        return PushSlots(sess)

    def before_push(self, sess) -> None:
        if sess.coordinated:
            sess.mode_half.wait()


class PushSlots:
    """R2SP's worker half: ask the coordinator for a push slot, wait until it is granted.

    The grant also brings this worker's slice of the next iteration."""

    def __init__(self, sess):
        self.sess = sess
        self.granted = -1            # the last iteration granted a push slot
        sess.on(P.GRANT, self._on_grant)

    def _on_grant(self, msg: dict) -> None:       # the session's receiving thread
        t = int(msg["iteration"])
        if msg.get("size") is not None:
            self.sess.set_slice(t + 1, _split.Slice(int(msg["offset"]), int(msg["size"]),
                                                    int(msg["total"])))

        def grant():
            self.granted = max(self.granted, t)
        self.sess.update(grant)

    def wait(self) -> None:
        t = self.sess.iteration
        self.sess.send(P.request(t, self.sess.next_global_batch()))
        self.sess.wait_until(lambda: self.granted >= t)
