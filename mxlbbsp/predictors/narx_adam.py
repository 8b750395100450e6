"""narx-adam: the first NARX, kept for comparison: a small network trained by
one Adam step per iteration. The default ``narx`` (narx.py) learns the exogenous relation far
faster; benchmarks/predictors.py compares the two.


Worker i's speed at t+1 is forecast from tapped delay lines of its own past speeds y and of
its host's load x (cpu_percent, mem_percent and any further exogenous columns, E in all)::

    z_t   = [ y~_t .. y~_{t-dy+1} ,  x~_t .. x~_{t-dx+1} ]          (D = dy + dx*E inputs)
    h_t   = tanh(W1 z_t + b1)                                       (H hidden units)
    r_t   = w2 . h_t + v . z_t + b2                                 (linear output)
    net_{t+1} = y_t + s_y * r_t
    y^_{t+1}  = w net_{t+1} + (1 - w) y_t,   w = e_last^2 / (e_net^2 + e_last^2)

``y~ = (y - m_y) / s_y`` and ``x~ = (x - m_x) / s_x`` use per-worker running means and
standard deviations (cumulative for the first ``norm_window`` observations, exponentially
weighted after); a load reading enters clipped to m_x +- 4 s_x. The network forecasts the
normalised *change* r_t, so an untrained network (w2 ~ 0, v = 0) forecasts the last value;
``v . z`` is a direct linear (ARX) path beside the tanh layer. The last line weighs the
network against the last value by their running mean absolute percentage errors e over the
last ~``gate_window`` iterations (a Bates-Granger forecast combination, computed from the past
only): while the network is no better than last value, it gets little say.

Training is online and series-parallel (teacher forcing: the inputs are observed speeds, never
the network's own forecasts). Every observation adds the pair (z_{t-1}, y_t) to a per-worker
replay window of the last ``window`` pairs; then ``steps`` Adam steps follow, each on a
minibatch of ``batch`` pairs (the newest and ``batch - 1`` drawn from the window), minimising
``mean sqrt(err^2 + huber^2) + decay |theta|^2``, i.e. ~ the mean *absolute* error of r: MAPE
is what the balancer pays for, and squared error chases the jumps that nobody can predict.
Raw values are kept in the window and normalised at each step with the current statistics
(folded into the first layer: ``zn W1 = z (W1 / s) - (m / s) W1``), so old pairs never go
stale. The forecast of t+1 comes out of the same forward pass, from the parameters before the
step.

Everything is vectorised over workers: the parameters of all n networks are one (n, P) array,
a step is a few batched matmuls of shape (n, batch, D+1) x (n, D+1, H), the minibatch slots
are the same for all workers, and worker i's numbers never depend on worker j's
(``NARXAdam(n)`` computes what n separate ``NARXAdam(1)`` compute).

Fallbacks (the forecast is the last observed speed instead):
  * warm-up: the first ``warmup`` observations (not counted as a fallback);
  * a non-finite forecast, one <= 0, or one outside ``[lo - M, hi + M]``,
    ``M = max(hi - lo, hi / 2)``, ``lo, hi`` the extreme speeds of the worker's replay window:
    counted in ``fallbacks[i]``. A network whose parameters became non-finite starts afresh.
Missing exogenous values (NaN, e.g. psutil gave None) carry the worker's last finite value
forward; before the first one they sit at the running mean (0 once normalised). A NaN or
non-positive speed repeats the last speed, and its pair is not trained on.

Hyperparameters, chosen by measurement (``python benchmarks/predictors.py --variants``, table in
benchmarks/results/predictors.md): one-step MAPE of NARX / MAPE of the best of last-value and
EMA on the same trace (< 1: NARX better). "lead": load switches that show in cpu_percent one
iteration early; "no signal": switches with a flat cpu_percent; "AR(1)": a smooth random
speed (means over 5 seeds, 600 iterations x 2 ranks each); "real": the three traces recorded on
the shared 2-core machine with benchmarks/record_traces.py (cnn / resnet20 bsp / resnet20
lbbsp)::

    variant                               lead  no signal  AR(1)  real
    chosen (below)                        0.48  1.01       0.97   1.02 / 0.99 / 1.01
    squared error, no weighing (plain)    0.46  1.26       0.99   1.05 / 1.21 / 1.12
    abs. error, no weighing               0.44  1.10       1.00   1.04 / 1.08 / 1.09
    hard switch net / last value          0.43  1.00       1.00   1.05 / 1.01 / 1.06
    squared error, soft weighing          0.51  1.03       0.97   1.02 / 1.01 / 1.02
    2 steps per iteration (lr 0.01)       0.44  1.00       0.97   1.04 / 0.99 / 1.01
    H 4 or 16, window 64 or 256, d_y 2 or 5, d_x 2, lr 0.01, decay 1e-2, warm-up 5:
                                          within +-0.09 of the chosen one, none better on all

The loss and the weighing decide; the sizes barely matter. Chosen: d_y = 3, d_x = 1, H = 8,
window 128, batch 32, one Adam step per iteration with lr 0.02, decay 1e-3, warm-up 20: a
second step buys ~0.04 on "lead" for ~70 % more time. On the real traces nobody beats EMA by
more than a few percent: their speed noise is +-15 % per iteration and the host's
cpu_percent stays at 100 % while the 2 cores are oversubscribed (see record_traces.py).

Cost of one observe() + predict() for n workers (median CPU time; numpy 1.23, OpenBLAS with
one thread; the 2-core machine was shared, load average 2-4, and the figures moved by up to
40 % between runs): n = 1: 0.15-0.23 ms; 16: 0.21-0.31 ms; 256: 0.9-1.6 ms (4-6 us per
worker); 1024: 4.0-6.8 ms. Most of it is per-worker overhead of numpy's batched matmul on
tiny matrices and a fixed ~0.15 ms of numpy calls.
"""
from __future__ import annotations

import numpy as np

from ._api import Predictor, register
from .narx import running_moments

#: default hyperparameters (see the module docstring for how they were chosen)
D_Y = 3          # speed delay line
D_X = 1          # exogenous delay line (per exogenous column)
HIDDEN = 8       # tanh units
WINDOW = 128     # replay window (pairs per worker)
BATCH = 32       # pairs per training step, drawn from the window
STEPS = 1        # training steps per observation
LR = 0.02        # Adam step size
DECAY = 1e-3     # L2 penalty on the parameters
HUBER = 0.02     # pseudo-Huber width (normalised units): the loss is ~|error| beyond it
WARMUP = 20      # observations before the network's forecasts are used
GATE_WINDOW = 50  # horizon of the running errors that weigh network against last value
NORM_WINDOW = 200  # horizon of the running normalisation statistics
CLIP = 4.0       # a load reading enters clipped to its running mean +- CLIP deviations
ADAM = (0.9, 0.999, 1e-8)


@register("narx-adam")
class NARXAdam(Predictor):
    """Online NARX network per worker (see the module docstring for the model).

    Long for a class: the first NARX, kept as it was measured (the network, its Adam state
    and its replay window share per-worker arrays); the default is ``narx``.
    """

    separable = True

    def __init__(self, num_workers: int, num_exog: int = 2, *, d_y: int = D_Y, d_x: int = D_X,
                 hidden: int = HIDDEN, window: int = WINDOW, batch: int = BATCH,
                 steps: int = STEPS, lr: float = LR, decay: float = DECAY,
                 huber: float = HUBER, warmup: int = WARMUP, gate: str = "soft",
                 gate_window: int = GATE_WINDOW, norm_window: int = NORM_WINDOW,
                 loss: str = "l1", seed: int = 0):
        super().__init__(num_workers, num_exog)
        if d_y < 1 or d_x < 0 or hidden < 1 or window < 1 or batch < 1 or steps < 0 \
                or warmup < 0 or gate_window < 1 or norm_window < 1:
            raise ValueError("narx: d_y, hidden, window, batch, gate_window, norm_window >= 1; "
                             "d_x, steps, warmup >= 0")
        if not lr > 0 or decay < 0 or not huber > 0:
            raise ValueError("narx: lr > 0, decay >= 0, huber > 0")
        if gate not in ("none", "hard", "soft") or loss not in ("l1", "mse"):
            raise ValueError("narx: gate is none, hard or soft; loss is l1 or mse")
        self.d_y, self.d_x, self.hidden = int(d_y), int(d_x), int(hidden)
        self.window, self.batch, self.steps = int(window), int(batch), int(steps)
        self.lr, self.decay, self.huber = float(lr), float(decay), float(huber)
        self.warmup, self.gate, self.gate_window = int(warmup), gate, int(gate_window)
        self.norm_window, self.loss = int(norm_window), loss
        n, E, H, B = self.num_workers, self.num_exog, self.hidden, self.batch
        D = self._D = self.d_y + self.d_x * E
        # One row of theta per worker: W1 (D*H) | b1 (H) | w2 (H) | b2 (1) | v (D)
        sizes = (D * H, H, H, 1, D)
        ends = np.cumsum(sizes)
        self._slices = [slice(e - k, e) for k, e in zip(sizes, ends)]
        rng = np.random.default_rng(seed)
        init = np.zeros(ends[-1])
        init[self._slices[0]] = rng.normal(0.0, 1.0 / np.sqrt(D), D * H)
        init[self._slices[2]] = rng.normal(0.0, 0.1 / np.sqrt(H), H)
        self._init = init                          # every worker starts from the same network
        self._theta = np.tile(init, (n, 1))
        self._m1 = np.zeros_like(self._theta)      # Adam moments and per-worker step count
        self._m2 = np.zeros_like(self._theta)
        self._adam_steps = np.zeros((n, 1))
        self._rng = np.random.default_rng(seed + 1)   # minibatch draws, shared by all workers
        # running mean / variance of speed (column 0) and exogenous inputs (1..E)
        self._mean = np.zeros((n, 1 + E))
        self._var = np.zeros((n, 1 + E))
        self._seen = np.zeros((n, 1 + E))
        self._centre = np.zeros((n, D))            # per input, from the statistics
        self._inv = np.ones((n, D))                # 1 / scale per input
        # delay lines in raw units, most recent first: z_t = [y lags | x lags (lag-major)]
        self._z = np.full((n, D), np.nan)
        self._last_x = np.full((n, E), np.nan)
        # replay window, slot-major so that a minibatch is a few contiguous blocks: raw
        # inputs z_{t-1} with a trailing 1, raw speed y_t, usable
        self._Z = np.ones((self.window, n, D + 1))
        self._Y = np.zeros((self.window, n))
        self._ok = np.zeros((self.window, n), dtype=bool)
        self._pairs = 0                            # pairs ever stored (slot = pairs % window)
        self._count = 0                            # observations so far
        self._pending = 0                          # training steps owed (see learn())
        # running mean absolute relative error of the network and of the last value
        self._err = np.zeros((n, 2))
        self._net = np.full(n, np.nan)             # the network's last forecast
        self._forecast = np.full(n, np.nan)
        # work buffers of a training step (large temporaries are slow to allocate)
        self._buf_z = np.empty((B + 1, n, D + 1))     # the minibatch, then z_t
        self._buf_h = np.empty((n, B + 1, H))
        self._buf_d = np.empty((n, B, H))
        self._buf_t = np.empty((n, B, H))
        self._buf_p = np.empty_like(self._theta)
        self._grad = np.empty_like(self._theta)

    # ---- the interface -------------------------------------------------------------------

    def observe(self, speed, exog) -> None:
        speed, exog = self._check(speed, exog)
        if exog.shape[1] != self.num_exog:
            raise ValueError(f"narx-adam: expected {self.num_exog} exogenous column(s), got "
                             f"{exog.shape[1]}")
        # Overflow and 0/0 on absurd inputs end in non-finite numbers, which the guards
        # catch (fallback to the last value, network re-initialised): no warnings.
        with np.errstate(all="ignore"):
            self._observe(speed, exog)

    def predict(self) -> np.ndarray:
        return self._forecast.copy()

    def learn(self) -> None:
        """The training step(s) of the last observation; the forecast came from the
        parameters before them, so running them now or at the next observe is the same."""
        steps, self._pending = self._pending, 0
        with np.errstate(all="ignore"):
            for _ in range(steps):
                self._step()

    # ---- internals -----------------------------------------------------------------------

    def _observe(self, speed, exog) -> None:
        self.learn()                               # the previous observation's training
        E, D, d_y = self.num_exog, self._D, self.d_y
        last = self._z[:, 0]
        good = np.isfinite(speed) & (speed > 0)
        y = np.where(good, speed, last)            # a bad speed repeats the last one
        self._score(speed, good, last)
        exog = np.where(np.isfinite(exog), exog, self._last_x)
        self._last_x = exog
        if self._count:                            # the pair (z_{t-1}, y_t)
            k = self._pairs % self.window
            self._Z[k, :, :D] = self._filled(self._z)
            self._Y[k] = y
            self._ok[k] = good & np.isfinite(last)
            self._pairs += 1
        self._update_stats(np.concatenate([y[:, None], exog], axis=1))
        z = np.empty_like(self._z)                 # shift the delay lines by one
        z[:, 0] = y
        z[:, 1:d_y] = self._z[:, :d_y - 1]
        if self.d_x:
            # an outlier of the load enters clipped to CLIP running deviations of its mean
            mean, sd = self._mean[:, 1:], 1.0 / self._inv[:, d_y:d_y + E]
            z[:, d_y:d_y + E] = np.clip(exog, mean - CLIP * sd, mean + CLIP * sd)
            z[:, d_y + E:] = self._z[:, d_y:D - E]
        self._z = z
        self._count += 1
        r = self._step(train=False)                # the forecast: parameters before training
        self._pending = self.steps
        self._forecast = self._predict(y, r)

    def _score(self, speed, good, last) -> None:
        """Running errors of the network's and the last value's forecasts of this speed."""
        if self.gate == "none":
            return
        scored = good & np.isfinite(self._net) & np.isfinite(last)
        if not scored.any():
            return
        rate = np.where(scored, 1.0 / min(self._count, self.gate_window), 0.0)
        err = np.abs(np.stack([self._net, last], axis=1) / speed[:, None] - 1.0)
        err = np.where(np.isfinite(err), np.minimum(err, 10.0), 10.0)   # at most 1000 %
        self._err += rate[:, None] * (np.where(scored[:, None], err, 0.0) - self._err)

    def _update_stats(self, values: np.ndarray) -> None:
        """Running mean and variance, then every input's centre and 1 / scale."""
        self._var = running_moments(self._seen, self._mean, self._var, values, self.norm_window)
        mean, sd = self._mean, np.sqrt(self._var)
        sd_y = np.maximum(sd[:, :1], 1e-3 * np.abs(mean[:, :1]) + 1e-12)
        sd_x = np.maximum(sd[:, 1:], 1e-2 * np.abs(mean[:, 1:]) + 1e-6)
        self._centre = np.concatenate([np.repeat(mean[:, :1], self.d_y, axis=1),
                                       np.tile(mean[:, 1:], (1, self.d_x))], axis=1)
        self._inv = 1.0 / np.concatenate([np.repeat(sd_y, self.d_y, axis=1),
                                          np.tile(sd_x, (1, self.d_x))], axis=1)

    def _filled(self, z):
        """z with a missing input at its centre (0 once normalised)."""
        return np.where(np.isnan(z), self._centre, z)

    def _params(self):
        """Contiguous W1 (n, D, H), b1 (n, H), w2 (n, H), b2 (n, 1), v (n, D)."""
        W1, b1, w2, b2, v = (np.ascontiguousarray(self._theta[:, s]) for s in self._slices)
        return W1.reshape(self.num_workers, self._D, self.hidden), b1, w2, b2, v

    def _folded(self, params):
        """The network on raw inputs with a trailing 1: hidden = tanh(z1 @ A), out += z1 @ a.

        With zn = (z - c) * inv:  zn @ W1 + b1 = z @ (inv W1) + (b1 - (c inv) @ W1), and the
        same for the linear path, so the (n, batch, D) inputs are never normalised one by one.
        """
        W1, b1, w2, b2, v = params
        n, D, H = W1.shape
        ci = self._centre * self._inv
        A = np.empty((n, D + 1, H))
        np.multiply(self._inv[:, :, None], W1, out=A[:, :D])
        A[:, D] = b1 - np.matmul(ci[:, None, :], W1)[:, 0, :]
        a = np.empty((n, D + 1, 1))
        a[:, :D, 0] = self._inv * v
        a[:, D, 0] = b2[:, 0] - np.einsum("nd,nd->n", ci, v)
        return A, a

    def _step(self, train: bool = True) -> np.ndarray:
        """Forward a minibatch of the replay window and the newest inputs z_t, then (if
        ``train``) one Adam step on the minibatch, every worker at once.

        Returns the network's output r for z_t, from the parameters before the step: the
        forecast comes out of the training forward pass for free.
        """
        n, D, B = self.num_workers, self._D, self.batch
        filled = min(self._pairs, self.window)
        train = train and filled > 0
        Zq = self._buf_z                                                       # (B+1, n, D+1)
        Zq[B, :, :D] = self._filled(self._z)
        Zq[B, :, D] = 1.0
        if train:
            # the newest pair, and B - 1 drawn from the window (the same slots for all workers)
            idx = self._rng.integers(0, filled, size=B)
            idx[0] = (self._pairs - 1) % self.window
            np.take(self._Z, idx, axis=0, out=Zq[:B])
            ok = np.take(self._ok, idx, axis=0).T                              # (n, B)
            count = ok.sum(axis=1)
            active = count > 0
            train = active.any()
        rows = slice(0, B + 1) if train else slice(B, B + 1)
        Z = Zq[rows].transpose(1, 0, 2)                                        # (n, rows, D+1)
        params = self._params()
        w2 = params[2]
        A, a = self._folded(params)
        hid = np.matmul(Z, A, out=self._buf_h[:, rows])                        # (n, rows, H)
        np.tanh(hid, out=hid)
        out = np.matmul(hid, w2[:, :, None])
        out += np.matmul(Z, a)
        r = out[:, -1, 0].copy()
        if not train:
            return r
        Z, hid = Z[:, :B], hid[:, :B]
        target = np.take(self._Y, idx, axis=0).T - Z[:, :, 0]
        target *= self._inv[:, :1]
        err = out[:, :B, 0] - target
        err[~ok] = 0.0
        if self.loss == "l1":            # d/de of sqrt(e^2 + h^2), i.e. ~|e|
            err /= np.sqrt(err * err + self.huber * self.huber)
        else:
            err *= 2.0
        err /= np.maximum(count, 1)[:, None]
        # backward, in the normalised parameters: dL/dW1 = zn' dpre = inv (z' dpre - c S)
        dpre = np.matmul(err[:, :, None], w2[:, None, :], out=self._buf_d)    # (n, B, H)
        tmp = np.multiply(hid, hid, out=self._buf_t)
        np.subtract(1.0, tmp, out=tmp)
        dpre *= tmp
        G = np.matmul(Z.transpose(0, 2, 1), dpre)                              # (n, D+1, H)
        S = G[:, D]
        gW1 = G[:, :D]
        gW1 -= self._centre[:, :, None] * S[:, None, :]
        gW1 *= self._inv[:, :, None]
        g = np.matmul(Z.transpose(0, 2, 1), err[:, :, None])[:, :, 0]          # (n, D+1)
        gv = (g[:, :D] - self._centre * g[:, D:]) * self._inv
        grad = np.concatenate([gW1.reshape(n, -1), S, np.matmul(err[:, None, :], hid)[:, 0, :],
                               g[:, D:], gv], axis=1, out=self._grad)
        # Adam with L2 decay; a worker without a usable pair in the minibatch stands still
        tmp = np.multiply(self._theta, 2.0 * self.decay, out=self._buf_p)
        grad += tmp
        beta1, beta2, eps = ADAM
        self._adam_steps += active[:, None]
        t = self._adam_steps
        self._m1 *= beta1
        self._m1 += np.multiply(grad, 1.0 - beta1, out=tmp)
        self._m2 *= beta2
        np.multiply(grad, grad, out=tmp)
        tmp *= 1.0 - beta2
        self._m2 += tmp
        rate = self.lr * np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t) * active[:, None]
        np.sqrt(self._m2, out=tmp)
        tmp += eps
        np.divide(self._m1, tmp, out=tmp)
        tmp *= rate
        self._theta -= tmp
        broken = ~np.isfinite(self._theta).all(axis=1)
        if broken.any():                 # start that worker's network afresh
            self._theta[broken] = self._init
            self._m1[broken] = 0.0
            self._m2[broken] = 0.0
            self._adam_steps[broken] = 0
        return r

    def _predict(self, last, r) -> np.ndarray:
        """The forecast from the network's output r, guarded and weighed against ``last``."""
        if self._count <= self.warmup:
            self._net = last.copy()
            return last.copy()
        forecast = last + r / self._inv[:, 0]
        # sane: within [lo - M, hi + M], M = max(hi - lo, hi / 2), over the replay window
        filled = min(self._pairs, self.window)
        ok, Y = self._ok[:filled], self._Y[:filled]
        lo = np.fmin(Y.min(axis=0, where=ok, initial=np.inf), last)
        hi = np.fmax(Y.max(axis=0, where=ok, initial=-np.inf), last)
        margin = np.maximum(hi - lo, 0.5 * hi)
        sane = np.isfinite(forecast) & (forecast > 0) & (forecast >= lo - margin) \
            & (forecast <= hi + margin)
        self.fallbacks += ~sane & np.isfinite(last)
        forecast = np.where(sane, forecast, last)
        self._net = forecast
        if self.gate == "hard":
            forecast = np.where(self._err[:, 0] <= self._err[:, 1], forecast, last)
        elif self.gate == "soft":
            e2 = self._err * self._err + 1e-12
            w = e2[:, 1] / (e2[:, 0] + e2[:, 1])
            forecast = w * forecast + (1.0 - w) * last
        return np.where(np.isfinite(forecast), forecast, last)
