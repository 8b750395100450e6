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

One model on every worker. BatchNorm's running mean and variance (every parameter declared
not differentiable) are updated by each worker from its own local batch. After every step
they are combined: each worker pushes ``b_i(t) * stats_i`` (one flat array under one extra
kvstore key), pulls the sum and divides by B(t). When the workers agreed before the step
(they do: they start identical and are combined every step), the combined running mean is
exactly the one a single process computes on the whole batch (the EMA is linear in the batch
mean); the combined running variance misses the between-worker part of the batch variance,
``(1 - momentum) * sum_i b_i/B (mean_i - mean)^2``, see docs/ARCHITECTURE.md.

Checkpoints: :meth:`Trainer.save_checkpoint`, and periodically when the launcher sets
``--checkpoint-every`` (rank 0 writes, after the step); a job started with ``--resume`` loads
the parameters and the optimizer state when the trainer is built (:mod:`mxlbbsp.checkpoint`).

``step()`` is also where a worker's iteration is timed: it waits for MXNet's asynchronous
engine to finish the gradients before it reads the clock (and reports to the coordinator),
and again after the push/pull.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mxnet import gluon, nd

from . import _env
from . import courier as _courier
from . import session as _session


class Trainer(gluon.Trainer):
    """``gluon.Trainer`` for LB-BSP; ``step()`` needs no batch size inside a job.

    ``kvstore`` defaults to the job's sync mode's (dist_sync, or dist_async for asp, r2sp) when
    started by ``mxlbbsp launch``, and to no kvstore in a single process.
    """

    def __init__(self, params, optimizer, optimizer_params=None, kvstore=None,
                 compression_params=None, update_on_kvstore=None):
        if kvstore is None:
            try:
                kvstore = _env.kvstore_type(_env.sync()) if _env.role() == "worker" else "device"
            except _env.EnvError as exc:
                raise _env.refuse(exc) from None
        if update_on_kvstore is None and kvstore == "dist_sync":
            update_on_kvstore = False     # the optimizer runs on every worker: module docstring
        super().__init__(params, optimizer, optimizer_params, kvstore=kvstore,
                         compression_params=compression_params,
                         update_on_kvstore=update_on_kvstore)
        self._baked: Optional[float] = None   # the normaliser inside the servers' rescale_grad
        # the running statistics (BatchNorm's): not differentiable, not just frozen
        self._aux = [p for p in self._params if not getattr(p, "_differentiable", True)]
        self._aux_key = len(self._params)     # kvstore key of the combined statistics
        self._aux_ready = False
        self.sync_aux = True                  # combine BatchNorm statistics after each step
        self._ckpt_dir = _env.checkpoint_dir()
        self._ckpt_every = _env.checkpoint_every()
        resume = _env.resume()
        if resume is not None:
            from . import checkpoint
            checkpoint.load_trainer(self, resume)

    def _normalisers(self, batch_size):
        """(N(t), N0) for this step; see the module docstring."""
        sess = _session.current()
        if batch_size is not None:
            if batch_size <= 0:
                raise ValueError(f"batch_size must be positive, got {batch_size}")
            return float(batch_size), float(self._baked or batch_size)
        if sess is None or sess.iteration < 0:
            raise ValueError("Trainer.step() needs a batch_size unless the batches come from "
                             "an mxlbbsp.DataLoader")
        return sess.mode.normalisers(sess)

    def step(self, batch_size=None, ignore_stale_grad=False):
        """Push this worker's gradients, pull the new parameters: one LB-BSP iteration.

        ``batch_size``: leave it out inside a job (the iteration's global batch is used);
        give it when the data does not come from an :class:`mxlbbsp.DataLoader`.
        """
        sess = _session.current()
        norm, nominal = self._normalisers(batch_size)
        # A global batch chosen as the job runs (courier) brings its learning rate along
        # (--lr-scaling): folded into the gradient's scale, on the workers and in a replay
        # alike. With weight decay, the decay term keeps the base learning rate.
        norm /= sess.lr_factor() if sess is not None and batch_size is None else 1.0
        if sess is not None and batch_size is None and sess.sets_batch:
            _courier.warn_momentum(self._optimizer, sess.lr_factor())
        if sess is not None:
            nd.waitall()
            sess.gradients_ready()
            sess.before_push()
        if not self._kv_initialized:
            self._optimizer.rescale_grad = self._scale / nominal
            self._init_kvstore()
        if self._distributed and self._update_on_kvstore:
            if self._baked is None:
                self._baked = nominal
            if norm != self._baked:
                factor = self._baked / norm
                for param in self._params:
                    if param.grad_req != "null":
                        for grad in param.list_grad():
                            grad *= factor
        else:
            self._optimizer.rescale_grad = self._scale / norm
        if self._params_to_init:
            self._init_params()
            if self._distributed and not self._update_on_kvstore:
                # The initial pull of the parameters must be done before this worker pushes
                # gradients to the same keys: else the others' pushes and this one can
                # complete a round first, and the pull returns a gradient sum instead.
                nd.waitall()
        self._allreduce_grads()
        self._update(ignore_stale_grad)
        if sess is not None and self._distributed and not self._update_on_kvstore:
            self._combine_aux(sess.batch_local, sess.batch_global)
        if sess is not None:
            nd.waitall()
            sess.step_done()
            if self._ckpt_dir and self._ckpt_every and \
                    (sess.iteration + 1) % self._ckpt_every == 0 and sess.rank == 0:
                with sess.untimed():
                    self.save_checkpoint(self._ckpt_dir)

    def _allreduce_grads(self):
        """Gradient sums from the servers: ``push`` then ``pull``, never ``pushpull``.

        A ps-lite server without an updater answers a pushpull with its stored sum *before*
        its asynchronous copy of the new sum has finished (MXNet 1.9
        ``KVStoreDistServer::ApplyUpdates``), so some workers would apply the previous
        iteration's sum; a plain push is answered the same way but the server waits for the
        copy before it serves the next request, the pull.
        """
        if not (self._kvstore and self._distributed and not self._update_on_kvstore) or \
                any(p.grad_req != "null" and p.list_grad()[0].stype != "default"
                    for p in self._params):
            return super()._allreduce_grads()
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grads = param.list_grad()
                self._kvstore.push(i, grads, priority=-i)
                self._kvstore.pull(i, grads, priority=-i)

    # ---- one model on every worker ------------------------------------------------------

    def _combine_aux(self, local: int, total: int) -> None:
        """Running statistics := sum_i b_i * stats_i / B over the workers (module docstring)."""
        if not self.sync_aux or not self._aux or self._aux[0]._data is None:
            return
        arrays = [p.data() for p in self._aux]
        flat = nd.concat(*[a.reshape((-1,)) for a in arrays], dim=0)
        if not self._aux_ready:
            self._kvstore.init(self._aux_key, nd.zeros_like(flat))
            self._aux_ready = True
        flat *= float(local)
        self._kvstore.push(self._aux_key, flat)
        self._kvstore.pull(self._aux_key, out=flat)
        flat /= float(total)
        start = 0
        for a in arrays:
            size = int(np.prod(a.shape))
            a[:] = flat[start:start + size].reshape(a.shape)
            start += size

    # ---- checkpoints --------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> str:
        """Write a complete checkpoint of this job after the last step into ``directory``.

        Call it on rank 0 (every worker holds the same model and optimizer state); returns
        the checkpoint's folder. See :mod:`mxlbbsp.checkpoint` for what it holds.
        """
        from . import checkpoint
        return checkpoint.save_trainer(self, directory)
