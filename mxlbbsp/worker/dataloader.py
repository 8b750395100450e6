"""A Gluon DataLoader whose batch size changes from iteration to iteration.

The slicing rule (docs/ARCHITECTURE.md): epoch e shuffles the data set with a permutation that
depends only on (seed, e); the permutation is cut into consecutive global batches of
``global_batch_size`` samples; at iteration t worker i takes the slice of global batch t that
starts at b_0(t) + ... + b_{i-1}(t) and has b_i(t) samples. So every sample is used exactly once
per epoch across the cluster, every worker runs the same number of iterations, and the union of
the workers' batches at iteration t is exactly what one process takes at iteration t.

With ``num_workers > 0`` samples are loaded by Gluon's worker pool. Prefetching follows the
split: the next batch is submitted to the pool the moment its size is known (at once in
``bsp``/``asp`` and in a single process; in ``lbbsp`` as soon as the coordinator's split of it
has arrived, normally an iteration before it begins, so at once too).
"""
from __future__ import annotations

import hashlib
import pickle
import threading
from typing import Optional

import numpy as np
from mxnet import context, gluon
from mxnet.gluon.data import dataloader as _gdl

from mxlbbsp.core import env as _env
from mxlbbsp.core import epochs as _epochs
from mxlbbsp.core import lr as _lr
from mxlbbsp.core.planner import replay_from_metrics
from mxlbbsp.worker import checkpoint as _ckpt
from mxlbbsp.worker import hold as _hold
from mxlbbsp.worker import session as _session

LAST_BATCH = _epochs.LAST_BATCH


class DataLoader:
    """Loads a data set in global batches split among the workers of the job.

    Parameters
    ----------
    dataset : gluon.data.Dataset (anything with ``__len__`` and ``__getitem__``)
    global_batch_size : int
        B, the number of samples per iteration summed over all workers.
    shuffle : bool
        Shuffle every epoch with a permutation seeded by (``seed``, epoch), identical on every
        worker.
    seed : int
    last_batch : 'keep' | 'discard'
        What to do with the last, short global batch of an epoch.
    batchify_fn, num_workers, thread_pool, timeout :
        As in ``gluon.data.DataLoader``.
    max_batch_size : int, optional
        The most samples this worker can take in one iteration (e.g. its memory limit).
    batch_schedule : sequence of int, optional
        Replay, in a single process, the global batch sizes B(0), B(1), ... of a job whose
        coordinator chose them (``--sync courier``): each global batch is cut from the
        epoch's permutation right after the previous one, exactly as that job cut them.
        Given as the job's metrics file (a path), the learning-rate factor of each iteration
        is the one the job recorded (``lr_factor``: ``--lr-scaling adascale`` needs it);
        given as sizes, the ``--lr-scaling`` rule's (``MXLBBSP_LR_SCALING``). Also read from
        ``MXLBBSP_BATCH_SCHEDULE`` (a metrics file) when not given.

    Outside a job started by ``mxlbbsp launch``, every batch is the whole global batch.
    In a sync mode whose coordinator sets the global batch (``courier``), global batch t has
    the size B(t) the coordinator sends, cut right after batch t-1; every sample is still
    used once per epoch, and the number of iterations of an epoch is known only as it runs.
    """

    def __init__(self, dataset, global_batch_size: int, shuffle: bool = False, seed: int = 0,
                 last_batch: str = "keep", batchify_fn=None, num_workers: int = 0,
                 thread_pool: bool = False, timeout: float = 120,
                 max_batch_size: Optional[int] = None, batch_schedule=None):
        if not isinstance(global_batch_size, (int, np.integer)) or global_batch_size < 1:
            raise ValueError(f"global_batch_size must be a positive integer, got "
                             f"{global_batch_size!r}")
        if last_batch not in LAST_BATCH:
            raise ValueError(f"last_batch must be one of {LAST_BATCH}, got {last_batch!r}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if batch_schedule is None:
            batch_schedule = _env.batch_schedule()
        self._lr_factors = None
        if isinstance(batch_schedule, str):
            batch_schedule, self._lr_factors = replay_from_metrics(batch_schedule)
        if batch_schedule is not None:
            batch_schedule = [int(b) for b in batch_schedule]
            if not batch_schedule or min(batch_schedule) < 1:
                raise ValueError("batch_schedule must be a non-empty list of positive sizes")
            if self._lr_factors is None and _env.lr_scaling() == _lr.ADASCALE:
                raise ValueError("--lr-scaling adascale: the learning-rate factors came from "
                                 "the job's coordinator; give batch_schedule as the job's "
                                 "metrics file, which records them")
        self._schedule = batch_schedule
        self._dataset = dataset
        self._size = len(dataset)
        if self._size == 0:
            raise ValueError("the data set is empty")
        self.global_batch_size = int(global_batch_size)
        self._shuffle = shuffle
        self._seed = int(seed)
        self._last_batch = last_batch
        self._plan = _epochs.EpochPlan(self._size, self.global_batch_size, last_batch)
        self._max_batch = max_batch_size
        self._timeout = timeout
        self._epoch = 0
        self._pool = None
        self._thread_pool = thread_pool
        if num_workers > 0:
            # Gluon builds the worker pool (shared-memory batches, SIGINT handling); we only
            # borrow it and decide ourselves what to load when.
            self._gluon = gluon.data.DataLoader(dataset, batch_size=1, num_workers=num_workers,
                                                thread_pool=thread_pool, batchify_fn=batchify_fn,
                                                timeout=timeout, prefetch=0)
            self._pool = self._gluon._worker_pool
            self._batchify = self._gluon._batchify_fn
        else:
            self._batchify = batchify_fn or _gdl.default_batchify_fn
        self._lock = threading.Lock()
        self._pending = {}          # iteration -> async result
        self._expect = None         # (iteration, indices-getter) of the next batch to prefetch
        self._listening = False
        self._start = 0             # the first iteration this job runs (> 0 when resumed)
        resume = _hold.resume()
        if resume is not None:
            self._start = _ckpt.loader_start(resume, self.global_batch_size, self._size,
                                             len(self))

    @property
    def resumed_iteration(self) -> int:
        """Iterations done before this process started (0 unless resumed from a checkpoint).

        A resumed loader yields nothing for the epochs already done and starts the current
        epoch where the checkpoint stopped, so a script's ``for epoch in range(E)`` loop
        needs no change.
        """
        return self._start

    # ---- the epoch plan -----------------------------------------------------------------

    def __len__(self) -> int:
        sess = _session.current()
        if self._schedule is not None or (sess is not None and sess.sets_batch):
            raise TypeError("the number of iterations of an epoch is not fixed: the "
                            "coordinator chooses each global batch (--sync courier)")
        return self._plan.length

    # ---- iteration ----------------------------------------------------------------------

    def identity(self) -> dict:
        """What every worker's loader must share, for the coordinator to compare at
        registration: the data set's fingerprint (:func:`fingerprint`) and how each epoch
        orders it (shuffle, seed, last_batch)."""
        return {"data_fingerprint": fingerprint(self._dataset),
                "order": {"shuffle": bool(self._shuffle),
                          "seed": self._seed if self._shuffle else None,
                          "last_batch": self._last_batch}}

    def __iter__(self):
        sess = _session.open_session(self.global_batch_size, self._size,
                                     self._plan.smallest, self._max_batch,
                                     identity=self.identity)
        if self._pool is not None and not self._listening:
            sess.on_slice(self._on_slice)
            self._listening = True
        if sess.sets_batch or self._schedule is not None:
            sess.follow(self._schedule is not None, self._lr_factors)
            yield from self._iter_following(sess)
            return
        plan = self._plan
        order = _epochs.order(self._size, self._epoch, self._shuffle, self._seed)
        epoch, self._epoch = self._epoch, self._epoch + 1
        skip = plan.first_index(self._start, epoch)
        # an epoch done before the checkpoint runs nothing: no iteration resumes in it
        sess.begin_epoch(plan.length, 0 if skip is None else self._start)
        if skip is None:
            return
        for k in range(skip, plan.length):
            start, size = plan.batch(k)
            # B(t+1) and B(t+2), which the coordinator splits ahead
            sess.announce(plan.next_size(k), plan.next_size(k, 2))
            t, offset, local = sess.next_iteration(size)
            indices = order[start + offset:start + offset + local]
            if self._pool is None:
                yield self._batchify([self._dataset[int(i)] for i in indices])
                continue
            if k + 1 < plan.length:
                self._arm(sess, t + 1, order, plan.batch(k + 1))
            yield self._collect(t, indices)
        with self._lock:
            self._expect = None

    def _iter_following(self, sess):
        """One epoch whose global batches B(t) are chosen as it runs (by the coordinator, or
        by ``batch_schedule``), cut one after another from the epoch's permutation."""
        order = _epochs.order(self._size, self._epoch, self._shuffle, self._seed)
        self._epoch += 1
        N, cursor = self._size, 0
        while cursor < N:
            size = None
            if self._schedule is not None and not sess.coordinated:
                t = sess.iteration + 1
                if t >= len(self._schedule):
                    raise ValueError(f"batch_schedule has {len(self._schedule)} sizes; "
                                     f"iteration {t} needs one more")
                size = self._schedule[t]
                if size > N - cursor:
                    raise ValueError(f"batch_schedule[{t}] = {size} runs past the end of the "
                                     f"epoch ({N - cursor} samples left)")
            t, offset, local = sess.next_iteration(size)
            total = sess.batch_global
            if total > N - cursor:
                raise RuntimeError(f"global batch {total} of iteration {t} runs past the end "
                                   f"of the epoch ({N - cursor} samples left)")
            indices = order[cursor + offset:cursor + offset + local]
            cursor += total
            # B(t+2) depends on B(t+1), which the coordinator chose: it knows it itself
            sess.announce(_epochs.next_cap(N, cursor))
            if self._pool is None:
                yield self._batchify([self._dataset[int(i)] for i in indices])
            else:
                yield self._collect(t, indices)

    def _arm(self, sess, t_next: int, order, batch) -> None:
        """Prefetch global batch ``batch`` at ``t_next`` as soon as its split is known."""
        start, size = batch

        def indices(part):
            return order[start + part.offset:start + part.offset + part.size]

        with self._lock:
            self._expect = (t_next, size, indices, sess)
        part = sess.slice(t_next, size, block=False)
        if part is not None:
            self._on_slice(t_next, part)

    def _on_slice(self, t: int, part) -> None:
        with self._lock:
            if self._expect is None or self._expect[0] != t or t in self._pending:
                return
            _, size, indices, sess = self._expect
            self._expect = None
            part = sess.rescale(part, size)
            self._pending[t] = self._submit(indices(part))

    def _submit(self, indices):
        samples = [int(i) for i in indices]
        if self._thread_pool:
            return self._pool.apply_async(_gdl._thread_worker_fn,
                                          (samples, self._batchify, self._dataset))
        return self._pool.apply_async(_gdl._worker_fn, (samples, self._batchify, None))

    def _collect(self, t: int, indices):
        with self._lock:
            pending = self._pending.pop(t, None)
            if pending is None:
                pending = self._submit(indices)
        result = pending.get(self._timeout)
        if self._thread_pool:
            return result
        # Worker processes hand batches over in shared memory (cpu_shared), which a
        # hybridized network refuses next to its cpu parameters: give them back on cpu.
        return _gdl._as_in_context(pickle.loads(result), context.cpu())


#: how many items of a data set its fingerprint reads (each twice)
FINGERPRINT_ITEMS = 8


def fingerprint(dataset) -> str:
    """A short hash of a data set: its size and a few items spread over it, so that workers
    holding different data (a shard per rank, another file) are told apart at registration.

    Each item is read twice: a part that differs between the two reads is random (a data
    augmentation) and counts by its shape and type only; the rest (labels, fixed data)
    counts by value."""
    size = len(dataset)
    digest = hashlib.sha1(f"{size}".encode())
    for i in sorted({int(k) for k in np.linspace(0, size - 1, min(FINGERPRINT_ITEMS, size))}):
        for a, b in zip(_parts(dataset[i]), _parts(dataset[i])):
            value_a, value_b = _value(a), _value(b)
            digest.update(value_a if value_a == value_b else _kind(a))
    return digest.hexdigest()[:16]


def _parts(item):
    return list(item) if isinstance(item, (tuple, list)) else [item]


def _kind(part) -> bytes:
    shape = getattr(part, "shape", None)
    return f"{type(part).__name__}{tuple(shape) if shape is not None else ''}".encode()


def _value(part) -> bytes:
    if hasattr(part, "asnumpy"):
        part = part.asnumpy()
    if isinstance(part, np.ndarray):
        return _kind(part) + str(part.dtype).encode() + np.ascontiguousarray(part).tobytes()
    if isinstance(part, (int, float, str, bytes, bool, np.generic)):
        return repr(part).encode()
    return _kind(part)          # an object we cannot read by value: its type alone
