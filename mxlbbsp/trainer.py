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

``step()`` is also where a worker's iteration is timed: it waits for MXNet's asynchronous
engine to finish the gradients before it reads the clock (and reports to the coordinator),
and again after the push/pull.
"""
from __future__ import annotations

from typing import Optional

from mxnet import gluon, nd

from . import _env
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
        super().__init__(params, optimizer, optimizer_params, kvstore=kvstore,
                         compression_params=compression_params,
                         update_on_kvstore=update_on_kvstore)
        self._baked: Optional[float] = None   # the normaliser inside the servers' rescale_grad

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
        self._allreduce_grads()
        self._update(ignore_stale_grad)
        if sess is not None:
            nd.waitall()
            sess.step_done()
