"""A gluon.Trainer whose ``step()`` makes LB-BSP exactly large-batch SGD.

Each worker's loss is a per-sample vector, so ``backward()`` leaves the *sum* of its b_i(t)
per-sample gradients. The parameter servers add the workers' pushes (dist_sync), and the
optimizer multiplies by ``rescale_grad``; the update must use sum / B(t), the global batch of
the iteration. Gluon's trainer cannot do that by itself when the batch changes: with a
distributed kvstore it pickles the optimizer, ``rescale_grad`` included, to the servers once
and raises if the batch size changes later.

So the normaliser baked into the servers' optimizer is fixed at the nominal value N0
(``global_batch_size`` of the loader: the same on every worker, so whichever worker's copy of
the optimizer the servers keep is right), and when an iteration's normaliser N(t) differs
(the short last batch of an epoch) every gradient is multiplied by N0 / N(t) before the push.
Without a distributed kvstore (a single process), ``rescale_grad`` is simply set every step.

The normaliser is the sync mode's (:mod:`mxlbbsp.modes`): the global batch B(t) in the
synchronous modes, the worker's own batch b_i(t) in ``asp`` (each push is applied on its own
there, as in MXNet's dist_async), the initial batch B/n in ``r2sp``. Between the gradients and
the push, the mode may make the worker wait (``r2sp``: for its push slot).

Where the optimizer runs. In the synchronous modes (dist_sync) the trainer defaults to
``update_on_kvstore=False``: the servers only add the workers' gradients, and every worker
applies the same optimizer update to the same sum, so every worker holds the same parameters
*and the same optimizer state* (momentum, update count, learning-rate schedule), which a
checkpoint can save locally (MXNet's ``save_optimizer_states`` refuses distributed jobs that
update on the servers). The bytes moved are the same (push gradients, pull a sum instead of
pull weights); the normaliser is simply set on the local optimizer every step, so the
``N0 / N(t)`` gradient scaling is needed only in ``asp`` (dist_async updates on the servers).

One model on every worker, and one process's. BatchNorm's running mean and variance (every
parameter declared not differentiable) are updated by each worker from its own local batch.
They are kept out of Gluon's initial broadcast (which would hand every worker one worker's
already-updated statistics) and combined after every step into exactly the whole global
batch's, variance included (:mod:`mxlbbsp.worker.batchnorm`; docs/ARCHITECTURE.md, Exactness).

``step(n)``: inside a job ``step(len(data))`` and a constant ``step(global_batch_size)`` mean
what they mean in one process; any other ``n`` stops the job with one line (:meth:`step`).
``allreduce_grads()`` + ``update(n)`` are the two halves of ``step(n)``.

Checkpoints: :meth:`Trainer.save_checkpoint`, and periodically when the launcher sets
``--checkpoint-every`` (rank 0 writes, after the step); a job started with ``--resume`` loads
the parameters and the optimizer state when the trainer is built (:mod:`mxlbbsp.worker.checkpoint`).

``step()`` is also where a worker's iteration is timed: it waits for MXNet's asynchronous
engine to finish the gradients before it reads the clock (and reports to the coordinator),
and again after the push/pull.
"""
from __future__ import annotations

import atexit
import logging
import sys
import threading
import weakref
from typing import Optional

from mxnet import gluon, nd

from mxlbbsp import modes as _modes
from mxlbbsp.core import env as _env
from mxlbbsp.core import lr as _lr
from mxlbbsp.core import protocol as P
from mxlbbsp.core import store as _store
from mxlbbsp.worker import checkpoint as _ckpt
from mxlbbsp.worker import engine as _engine
from mxlbbsp.worker import hold as _hold
from mxlbbsp.worker import loss_head as _loss
from mxlbbsp.worker import session as _session
from mxlbbsp.worker import snapshot as _snapshot
from mxlbbsp.worker.batchnorm import RunningStats

log = logging.getLogger(__name__)
#: momentum at or above this with --sync asp or r2sp gets a warning (metrics.MOMENTUM_WARN)
MOMENTUM_WARN = 0.5
#: where the engine times the report and done (:mod:`.engine`), step t waits for the end of
#: step t - ENGINE_AHEAD: the Python thread may run that far ahead of the engine, and no
#: further (memory: the arrays of the iterations in flight). 4 rather than 2: on a 3 ms MLP
#: 1.00-1.09x the plain script's speed against 0.97-0.98x, in 3 interleaved runs
#: (benchmarks/README.md, "Against a plain MXNet script"); ResNet-20 the same within noise
ENGINE_AHEAD = 4


class Trainer(gluon.Trainer):
    """``gluon.Trainer`` for LB-BSP; ``step()`` needs no batch size inside a job.

    ``kvstore`` defaults to the job's sync mode's (dist_sync, or dist_async for asp, r2sp) when
    started by ``mxlbbsp launch``, and to no kvstore in a single process.

    Long, on purpose: Gluon's own entry points (``step``, ``allreduce_grads``, ``update``,
    ``_allreduce_grads``) are overridden here, where Gluon's trainer calls them, and each
    reads the same normaliser state; the parts that stand alone are elsewhere (the running
    statistics in :mod:`.batchnorm`, checkpoints in :mod:`.checkpoint`).
    """

    def __init__(self, params, optimizer, optimizer_params=None, kvstore=None,
                 compression_params=None, update_on_kvstore=None):
        if kvstore is None:
            try:
                kvstore = _modes.from_env().kvstore if _env.role() == "worker" else "device"
            except _env.EnvError as exc:
                raise _env.refuse(exc) from None
        if update_on_kvstore is None and kvstore == "dist_sync":
            update_on_kvstore = False     # the optimizer runs on every worker: module docstring
        super().__init__(params, optimizer, optimizer_params, kvstore=kvstore,
                         compression_params=compression_params,
                         update_on_kvstore=update_on_kvstore)
        self._baked: Optional[float] = None   # the normaliser inside the servers' rescale_grad
        # the running statistics (BatchNorm's): not differentiable, not just frozen
        self._stats = RunningStats(
            [p for p in self._params if not getattr(p, "_differentiable", True)],
            key=len(self._params))
        self.sync_aux = True                  # combine BatchNorm statistics after each step
        self._reduced = False                 # allreduce_grads() done, update() to come
        self._noted = False                   # the step(len(data)) note was given
        self._ckpt_dir = _env.checkpoint_dir()
        self._ckpt_every = _env.checkpoint_every()
        self._final_hook = False              # the final checkpoint's atexit hook
        # what backward() was called on: a loss averaged over the batch is scaled back to
        # the per-sample sum before the push (mxlbbsp.worker.loss_head)
        self._head = _loss.watch(_local_batch)
        self._mean_loss = False               # this step's loss is a mean: scale by b_i
        self._mean_noted = False
        # an elastic job's hand-over (mxlbbsp.worker.snapshot): the last finished iteration
        # kept for a survivor to save, and a boundary the coordinator asked for
        self._keeper = None
        self._boundary = False
        self._handover = False                # listening for the coordinator's request
        self._by_engine = False               # this step's report and done sent by the engine
        self._engine_order = None             # an array every such function writes (below)
        self._engine_job = None               # (session, whether the engine may time it)
        self._dense_grads = None              # (parameters, all their gradients dense)
        resume = _hold.resume()
        if resume is not None:

            _ckpt.load_trainer(self, resume)
        self._warn_momentum()

    def _momentum(self) -> Optional[float]:
        m = getattr(self._optimizer, "momentum", None)
        return float(m) if isinstance(m, (int, float)) else None

    def _warn_momentum(self) -> None:
        """Once, on rank 0 of a launched job: momentum with the asynchronous modes."""
        if _env.role() != "worker" or _env.rank() != 0:
            return
        try:
            mode = _modes.from_env()
        except _env.EnvError:
            return
        m = self._momentum()
        if not mode.barrier and m is not None and m >= MOMENTUM_WARN:
            log.warning("mxlbbsp: warning: momentum %g with --sync %s: stale gradients with "
                        "momentum often diverge; use momentum 0 or --sync lbbsp", m, mode.name)

    def _final_checkpoint(self) -> None:
        """atexit, rank 0 with --checkpoint-dir: the job's last state, marked final, when the
        script ends normally (a launched worker that fails ends without atexit)."""
        sess = _session.current()
        if sess is None or sess.iteration < 0 or getattr(sys, "last_value", None) is not None:
            return

        try:
            _ckpt.save_trainer(self, self._ckpt_dir, final=True)
        except (OSError, _store.CheckpointError) as exc:
            log.warning("mxlbbsp: warning: could not write the final checkpoint: %s", exc)

    def _normalisers(self, batch_size):
        """(N(t), N0) for this step (see :meth:`step`): the mode's normalisers, divided by
        the learning-rate factor of a global batch chosen as the job runs (courier's
        --lr-scaling, folded into the gradient's scale on the workers and in a replay alike;
        with weight decay, the decay term keeps the base learning rate)."""
        norm, nominal, ours = self._read_batch_size(batch_size)
        sess = _session.current()
        if ours and sess is not None:
            norm /= sess.lr_factor()
            if sess.sets_batch:
                _lr.warn_momentum(self._optimizer, sess.lr_factor())
        return norm, nominal

    def _read_loss(self, batch_size):
        """This step's ``batch_size`` as it reads with the kind of its loss: a loss averaged
        over the batch is scaled back to the per-sample sum (:mod:`.loss_head`), and then
        ``step()`` and Gluon's ``step(1)`` are the mean over the global batch; any other
        number would divide by the batch twice. Sets :attr:`_mean_loss`."""
        kind = self._head.take()
        sess = _session.current()
        in_job = sess is not None and sess.coordinated
        self._mean_loss = False
        if kind == _loss.MIXED and in_job:
            raise _session.misuse(
                f"the loss of iteration {sess.iteration} is one number that holds a mean over "
                "the batch inside a larger expression (e.g. loss.mean() + a penalty): no "
                "scale makes the workers' gradients add up to one process's; keep the loss "
                "per sample (loss_fn(output, label), no mean; a penalty as the optimizer's wd) "
                "and write trainer.step()")
        if kind != _loss.MEAN or sess is None or sess.iteration < 0:
            return batch_size
        if batch_size not in (None, 1):
            if in_job:
                raise _session.misuse(
                    f"trainer.step({batch_size}) at iteration {sess.iteration} after a loss "
                    "averaged over the batch (loss.mean()) divides by the batch twice; write "
                    "trainer.step() (or Gluon's step(1) for a mean loss), or keep the loss "
                    "per sample")
            return batch_size              # one process: plain Gluon's meaning
        self._mean_loss = True
        if in_job and not self._mean_noted and sess.rank == 0:
            self._mean_noted = True
            log.warning("mxlbbsp: note: the loss is a mean over the batch: each worker's "
                        "gradients are scaled by its own batch size, so that the update is "
                        "the mean over the global batch, as in one process with loss.mean() "
                        "and step(1) (a per-sample loss with trainer.step() needs no scaling)")
        return None

    def _read_batch_size(self, batch_size):
        """(N(t), N0, whether the session's normalisers apply)."""
        sess = _session.current()
        in_job = sess is not None and sess.coordinated
        if sess is None or sess.iteration < 0:
            if _env.coordinator() is not None and _env.role() == "worker":
                raise _session.misuse(
                    "mxlbbsp.Trainer.step() in a job whose batches do not come from an "
                    "mxlbbsp.DataLoader: the loader splits each global batch among the workers; "
                    "use mxlbbsp.Trainer with mxlbbsp.DataLoader (or gluon.Trainer for a plain "
                    "MXNet script)")
            if batch_size is None:
                raise ValueError("Trainer.step() needs a batch_size unless the batches come "
                                 "from an mxlbbsp.DataLoader")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if sess is None or sess.iteration < 0:
            return float(batch_size), float(self._baked or batch_size), False
        if batch_size is None:
            return (*sess.mode.normalisers(sess), True)
        norm, nominal = sess.mode.normalisers(sess)
        n = batch_size
        if n == sess.batch_local or n == sess.batch_global:
            # the Gluon idiom step(len(data)), or the global batch of the iteration: what a
            # single process passes here is B(t), so this is step()
            if in_job and n != sess.batch_global and not self._noted:
                self._noted = True
                log.warning("mxlbbsp: note: trainer.step(%s) inside a job: %s is this worker's "
                            "share of the global batch; the update is normalised by the global "
                            "batch of each iteration, as in one process (write trainer.step())",
                            n, n)
            return norm, nominal, True
        if n == sess.global_batch_size and norm == sess.batch_global:
            # a constant global batch size (gluoncv's step(batch_size)): one process divides
            # the epoch's short last batch by it too
            return float(n), nominal, False
        if in_job:
            raise _session.misuse(
                f"trainer.step({n}) at iteration {sess.iteration}: {n} is neither this worker's "
                f"batch ({sess.batch_local}) nor the global batch ({sess.batch_global}), so the "
                "workers' gradients cannot be combined as one process would; write "
                "trainer.step() and make the loss a per-sample vector (no mean over the batch)")
        return float(n), float(self._baked or n), False

    def step(self, batch_size=None, ignore_stale_grad=False):
        """Push this worker's gradients, pull their sum, update: one LB-BSP iteration.

        ``batch_size``: leave it out inside a job (the iteration's global batch is used).
        Gluon's ``step(len(data))`` and a constant ``step(global_batch_size)`` mean the same
        inside a job as in one process, so they are taken as ``step()`` (with a one-time note
        for the first); any other number inside a job stops it with one line, since the
        workers' gradients could not be combined as one process would. In a single process
        without an :class:`mxlbbsp.DataLoader`, ``batch_size`` is Gluon's.
        """
        norm, nominal = self._normalisers(self._read_loss(batch_size))
        self._reduce(norm, nominal)
        self._apply(norm, ignore_stale_grad)

    def allreduce_grads(self):
        """Gluon's first half of :meth:`step` (e.g. to clip the summed gradients), then
        :meth:`update`. Not with an optimizer on the servers (``asp``, ``r2sp``)."""
        if self._kvstore and self._update_on_kvstore:
            raise ValueError("allreduce_grads() is not supported when parameters are updated "
                             "on the kvstore (--sync asp/r2sp); use step()")
        sess = _session.current()
        norm = nominal = 1.0         # only asp's pre-scaling needs them, refused above
        if sess is not None and sess.iteration >= 0:
            norm, nominal = sess.mode.normalisers(sess)
        self._read_loss(None)        # update(n) checks its n against the loss's kind
        self._reduce(norm, nominal)
        self._reduced = True

    def update(self, batch_size=None, ignore_stale_grad=False):
        """Gluon's second half of :meth:`step`, after :meth:`allreduce_grads`; ``batch_size``
        as in :meth:`step`."""
        if self._kvstore and self._update_on_kvstore:
            raise ValueError("update() is not supported when parameters are updated on the "
                             "kvstore (--sync asp/r2sp); use step()")
        if self._reduced and self._mean_loss and batch_size not in (None, 1):
            sess = _session.current()
            if sess is not None and sess.coordinated:
                raise _session.misuse(
                    f"trainer.update({batch_size}) after a loss averaged over the batch "
                    "(loss.mean()) divides by the batch twice; write trainer.update() (or "
                    "update(1)), or keep the loss per sample")
        if self._reduced and self._mean_loss:
            batch_size = None
        elif not self._reduced:
            batch_size = self._read_loss(batch_size)
        norm, _ = self._normalisers(batch_size)
        sess = _session.current()
        if not self._reduced:
            if sess is not None and sess.coordinated:
                raise _session.misuse(
                    "trainer.update() without trainer.allreduce_grads() first: the workers' "
                    "gradients were never summed; call allreduce_grads() before update(), or "
                    "write trainer.step()")
            self._reduce(norm, norm)
        self._apply(norm, ignore_stale_grad)

    def _reduce(self, norm, nominal):
        """The first step's set-up, the gradients ready (timed, reported), the mode's wait,
        the push/pull.

        Where the servers only add and every worker updates (dist_sync), the gradients are
        pushed as soon as backward is issued, so that the engine sends each one as backward
        produces it (as Gluon's own step does) while this thread waits for the last one to
        time the compute phase and report; then the pulls, and BatchNorm's statistics are
        pushed to be combined while the sums come back."""
        sess = _session.current()
        clock = sess.clock if sess is not None else None
        if clock is not None:
            clock.mark("compute")
        self._first_step(nominal)
        if sess is not None and self._mean_loss and sess.batch_local > 1:
            for param in self._params:     # back to the per-sample sum: .loss_head
                if param.grad_req != "null":
                    for grad in param.list_grad():
                        grad *= sess.batch_local
        early = sess is not None and self._sums_on_servers() and \
            type(sess.mode).before_push is _modes.SyncMode.before_push
        self._by_engine = early and self._engine_clock(sess)
        if self._by_engine:
            # a bounded lead over the engine (bsp has no split to wait for); this step's
            # forward and backward are issued already, so the engine does not run dry
            sess.wait_finished(sess.iteration - ENGINE_AHEAD)
        if early:
            # what reads this worker's own gradients goes into the engine ahead of the
            # pushpull, which writes their sum into the same arrays
            ready = self._before_pushpull(sess)
            self._pushpull_grads()
            if clock is not None:
                clock.mark("push")
            self._report(sess, clock, ready)
        elif sess is not None:
            self._report(sess, clock, None)
        if early:
            if self.sync_aux:
                self._stats.start(self._kvstore, sess.batch_local, sess.batch_global)
            if clock is not None:
                clock.mark("push")
            return
        if self._distributed and self._update_on_kvstore:
            if self._baked is None:
                self._baked = nominal
            if norm != self._baked:
                factor = self._baked / norm
                for param in self._params:
                    if param.grad_req != "null":
                        for grad in param.list_grad():
                            grad *= factor
        self._allreduce_grads()
        if clock is not None:
            clock.mark("push")

    def _first_step(self, nominal) -> None:
        """The kvstore and the parameters, on the first step (and a parameter added since)."""
        if not self._kv_initialized:
            self._optimizer.rescale_grad = self._scale / nominal
            self._init_kvstore()
        if self._params_to_init:
            # Not the running statistics: Gluon would broadcast one worker's, which its first
            # forward pass has already updated from its own batch, over everybody's. They
            # start equal on every worker (initialiser or checkpoint) and are combined below.
            self._params_to_init = [p for p in self._params_to_init
                                    if p not in self._stats.members]
            self._init_params()
            if self._distributed and not self._update_on_kvstore:
                # The initial pull of the parameters must be done before this worker pushes
                # gradients to the same keys: else the others' pushes and this one can
                # complete a round first, and the pull returns a gradient sum instead.
                nd.waitall()

    def _before_pushpull(self, sess) -> Optional[tuple]:
        """Where the pushpull is issued as soon as backward is (dist_sync, summing servers):
        what must read the local gradients before their sum overwrites them, issued first.
        The engine-timed report (None), or (an event the engine sets once backward is done,
        the array of |local gradients|^2 in a mode that reports it)."""
        if self._by_engine:
            if not sess.model_info:
                sess.describe_model(self._model_info())
            _engine.call_after(sess.report_when_ready(), reads=self._grads(),
                               writes=self._order())
            return None
        norms = self._grad_sqr_array() if sess.coordinated and sess.mode.grad_norms else None
        done = threading.Event()
        if _engine.available():
            _engine.call_after(done.set, reads=self._grads())
        else:
            for grad in self._grads():
                grad.wait_to_read()
            done.set()
        return done, norms

    def _report(self, sess, clock, ready: Optional[tuple]) -> None:
        """The gradients ready, told to the coordinator, and the mode's wait before the push:
        the engine-timed report went into MXNet's engine already (:meth:`_before_pushpull`);
        else after waiting here for the backward (``ready``: the pushpull issued already),
        or for the engine."""
        if self._by_engine:
            if clock is not None:
                clock.mark("report")
            return
        if ready is not None:
            done, norms = ready
            done.wait()                     # backward done (not the pushpull)
        else:
            nd.waitall()
            norms = self._grad_sqr_array() if sess.coordinated and sess.mode.grad_norms \
                else None
        if clock is not None:
            clock.mark("engine")
        if not sess.model_info:
            sess.describe_model(self._model_info())
        sess.gradients_ready(None if norms is None else _total(norms))
        if clock is not None:
            clock.mark("report")
        sess.before_push()
        if clock is not None:
            clock.mark("slot")

    def _model_info(self) -> dict:
        """What the first report tells the coordinator of the model and the optimizer."""
        info = {"batchnorm": bool(self._stats.params)}
        if self._momentum() is not None:
            info["momentum"] = self._momentum()
        return info

    def _engine_clock(self, sess) -> bool:
        """Whether this step's report and done are sent by MXNet's engine when the arrays
        are ready (:mod:`.engine`), the Python thread going on without waiting: by default
        (MXLBBSP_ENGINE_CLOCK=0 turns it off), in a job, after its first step (which waits
        for the initial pull), unless the worker sleeps an emulated cost in the compute
        phase, the mode needs the gradients' norms (read from the arrays, on the Python
        thread), or the job keeps snapshots for a hand-over (which must follow the done of
        the iteration it holds). The compute it reports is
        :func:`~mxlbbsp.worker.session.engine_compute`'s; its readings vary more than the
        waiting path's (the longer of the engine's and the main thread's time), which the
        mean over a control period's iterations evens out on the small models where that
        matters (Coordinator._lease)."""
        if self._engine_job is None or self._engine_job[0] is not sess:
            # what holds for the whole job, read once (the environment, the session's mode)
            self._engine_job = (sess, _env.engine_clock() and sess.coordinated and
                                not sess.emulated and not sess.mode.grad_norms and
                                not _env.snapshots() and _engine.available())
        return self._engine_job[1] and sess.iteration > sess.first_iteration

    def _order(self) -> list:
        """A one-element array that each report and done function writes: the engine calls
        them in the order they were issued (a done of t-1 before the report of t, whose
        compute time starts at it), whatever else it runs between them."""
        if self._engine_order is None:
            self._engine_order = nd.zeros((1,))
        return [self._engine_order]

    def _sums_on_servers(self) -> bool:
        """The servers only add dense gradients, and every worker updates (dist_sync)."""
        if not (self._kvstore and self._distributed and not self._update_on_kvstore):
            return False
        # the gradients' storage types are set when the parameters are: read once per set
        if self._dense_grads is None or self._dense_grads[0] != len(self._params):
            self._dense_grads = (len(self._params), not any(
                p.grad_req != "null" and p.list_grad()[0].stype != "default"
                for p in self._params))
        return self._dense_grads[1]

    def _grads(self):
        """The gradient arrays, in the order of the trainer's parameters."""
        return [g for p in self._params if p.grad_req != "null" for g in p.list_grad()]

    def _pushpull_grads(self) -> None:
        """Each gradient pushed and the workers' sum pulled back into it, one pushpull per
        key (priority: the first layers' first, as Gluon)."""
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                self._kvstore.pushpull(i, param.list_grad(), priority=-i)

    def _apply(self, norm, ignore_stale_grad):
        """The optimizer's update, the running statistics combined, the step's end."""
        sess = _session.current()
        if not (self._distributed and self._update_on_kvstore):
            self._optimizer.rescale_grad = self._scale / norm
        self._reduced = False
        global_grad_sqr = None          # of the pulled sum of every worker's gradients
        if sess is not None and sess.coordinated and sess.rank == 0 and self._distributed \
                and not self._update_on_kvstore and sess.mode.grad_norms:
            global_grad_sqr = self.grad_sqr()
        self._update(ignore_stale_grad)
        clock = sess.clock if sess is not None else None
        if clock is not None:
            clock.mark("update")
        if self._stats.started:
            self._stats.finish()
        elif sess is not None and self._distributed and not self._update_on_kvstore \
                and self.sync_aux:
            self._stats.combine(self._kvstore, sess.batch_local, sess.batch_global)
        if clock is not None:
            clock.mark("bn")
        if sess is not None and self._by_engine:
            # once the update has written the parameters
            _engine.call_after(sess.done_when_finished(),
                               reads=[a for p in self._params if p._data is not None
                                      for a in p.list_data()], writes=self._order())
            if clock is not None:
                clock.mark("done")
        elif sess is not None:
            # waiting for the other workers' gradients: nothing of this worker's may be held
            # back meanwhile (the coordinator may need it to send a slice another waits for)
            sess.send_pending(force=True)
            nd.waitall()
            if clock is not None:
                clock.mark("pull")
            sess.step_done(global_grad_sqr)
            if clock is not None:
                clock.mark("done")
        if sess is not None:
            if self._ckpt_dir and not self._final_hook and sess.rank == 0:
                # after the session's own atexit (registered at its opening), so it runs first
                atexit.register(self._final_checkpoint)
                self._final_hook = True
            if self._ckpt_dir and self._ckpt_every and \
                    (sess.iteration + 1) % self._ckpt_every == 0 and sess.rank == 0:
                with sess.untimed():
                    sess.flush()          # after this iteration's report and done
                    self.save_checkpoint(self._ckpt_dir)
            if self._ckpt_dir and sess.coordinated:
                self._hand_over(sess)

    def _hand_over(self, sess) -> None:
        """After a step, in a job that checkpoints: keep this iteration's state (with
        MXLBBSP_SNAPSHOTS), and save it and halt when the coordinator asked for a boundary."""
        if not self._handover:
            # weakly: the session lives to the interpreter's teardown, and a trainer (its
            # kvstore) freed only then aborts in ps-lite's finalize
            handler = weakref.WeakMethod(self._on_checkpoint_request)
            sess.on(P.CHECKPOINT, lambda msg: (handler() or _ignore)(msg))
            self._handover = True
        if _env.snapshots():
            if self._keeper is None:
                self._keeper = _snapshot.Keeper()
            self._keeper.keep(self, sess.iteration)
        if self._boundary:
            self._boundary = False
            with sess.untimed():
                sess.flush()              # SAVED follows this iteration's report and done
                try:
                    path = self.save_checkpoint(self._ckpt_dir)
                except (OSError, _store.CheckpointError) as exc:
                    sess.send({"type": P.SAVED, "error": f"rank {sess.rank}: {exc}"})
                    raise
                sess.send({"type": P.SAVED, "iteration": sess.iteration, "path": path})
                sess.halt()

    def _on_checkpoint_request(self, msg: dict) -> None:
        """The coordinator's request (on the session's thread): a boundary is saved by the
        main thread at the end of its step; a snapshot, the kept state, at once."""
        if msg.get("mode") == "boundary":
            self._boundary = True
            return
        sess = _session.current()
        try:
            if self._keeper is None:
                raise _store.CheckpointError("no iteration kept (MXLBBSP_SNAPSHOTS is off)")
            t, path = self._keeper.write(self, self._ckpt_dir, sess)
        except (OSError, _store.CheckpointError) as exc:
            sess.send({"type": P.SAVED, "error": f"rank {sess.rank}: {exc}"})
            return
        sess.send({"type": P.SAVED, "iteration": t, "path": path})

    def grad_sqr(self) -> float:
        """|gradient|^2 over every trained parameter (float64 sum of float32 squares; one
        wait for the engine): of the per-sample sum before the push, of the workers' summed
        gradient after the pull (goodput's noise scale, mxlbbsp.core.noise)."""
        sums = self._grad_sqr_array()
        return 0.0 if sums is None else _total(sums)

    def _grad_sqr_array(self):
        """|gradient|^2 of every trained parameter, as an array being computed (None:
        none): one operator for every array (MXNet's LARS/LAMB kernel)."""
        grads = [p.list_grad()[0] for p in self._params if p.grad_req != "null"]
        if not grads:
            return None
        return nd.multi_sum_sq(*grads, num_arrays=len(grads))

    def _allreduce_grads(self):
        """Gradient sums from the servers: one pushpull per key where they only add.

        (An early version pushed and pulled separately, on the suspicion that a server
        without an updater answers a pushpull before its copy of the new sum is done; the
        stale sums it had seen came from the first step's race with the initial pull of the
        parameters, fixed in :meth:`_first_step`. tests/test_pushpull.py checks every sum a
        pushpull returns, to keys up to past MXNet's big-array bound.)
        """
        if not self._sums_on_servers():
            return super()._allreduce_grads()
        self._pushpull_grads()

    # ---- checkpoints --------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> str:
        """Write a complete checkpoint of this job after the last step into ``directory``.

        Call it on rank 0 (every worker holds the same model and optimizer state); returns
        the checkpoint's folder. See :mod:`mxlbbsp.core.store` for what it holds.
        """

        return _ckpt.save_trainer(self, directory)


def _total(sums) -> float:
    """The float64 sum of :meth:`Trainer._grad_sqr_array`'s float32 squares."""
    return float(sums.asnumpy().sum(dtype="float64"))


def _ignore(msg: dict) -> None:
    """A request that came after the trainer was freed."""


def _local_batch() -> int:
    """This worker's batch in the current iteration (0 before the first)."""
    sess = _session.current()
    return sess.batch_local if sess is not None else 0
