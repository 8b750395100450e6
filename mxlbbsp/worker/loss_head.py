"""What the script called ``backward()`` on: a per-sample loss, its sum, or its mean over the batch.

LB-BSP adds the workers' gradient sums and divides by the iteration's global batch B(t)
(:mod:`mxlbbsp.worker.trainer`). A loss averaged over the local batch (``loss.mean()``,
``nd.mean(loss)``, ``loss.sum() / len(data)``) leaves worker i with its sum divided by its
own b_i instead, so the update would be sum_i (g_i / b_i) / B: a learning rate b_i times too
small, and the workers weighted unequally. A scale undoes it: every gradient multiplied by
b_i before the push is the per-sample sum again, and the job is then exactly one process
training on ``loss.mean()`` with Gluon's ``step(1)``.

How it is told: the trainer wraps ``NDArray.backward`` (:func:`watch`); for a head of one
element the recorded graph (``autograd.get_symbol``) is read from the head down through
scalar multiplications and divisions to its reduction: ``sum`` over the batch axis is a sum;
``mean`` over every axis or over axis 0 is a mean; a ``sum`` divided by the local batch (or
multiplied by its inverse) is a mean. A mean inside a larger expression (``loss.mean() +
penalty``) cannot be undone by a scale (:data:`MIXED`). A head of the batch's length is a
per-sample loss, which ``backward()`` sums. The graph is read only while the kind is
unknown (the first iterations whose local batch is above 1: with one sample a mean and a
sum are the same), then the kind is kept: a script computes its loss the same way every
iteration. What is not seen through: a mean inside a hybridized block of the script's own
(one cached operator), which reads as neither.
"""
from __future__ import annotations

import json
import threading
from typing import Callable, Optional

from mxnet import autograd, nd

#: the kinds of head
SUM, MEAN, MIXED = "sum", "mean", "mixed"

_ADDS = {"elemwise_add", "elemwise_sub", "broadcast_add", "broadcast_sub", "broadcast_plus",
         "broadcast_minus", "_plus", "_minus", "_add", "_sub", "_Plus", "_Minus", "add_n",
         "ElementWiseSum", "_grad_add"}


def _axes(attrs: dict) -> tuple:
    """(the reduction's axes or None for all, exclude) from a node's attributes."""
    axis = attrs.get("axis")
    if axis in (None, "None", "()", "[]"):
        return None, False
    text = axis.strip("()[] ")
    axes = tuple(int(a) for a in text.split(",") if a.strip()) if text else None
    return axes, attrs.get("exclude", "False") in ("True", "true", "1")


def _reduces_batch(attrs: dict) -> bool:
    axes, exclude = _axes(attrs)
    if axes is None:
        return True
    return (0 not in axes) if exclude else (0 in axes)


def kind_of(graph: dict, node: int, batch: int) -> Optional[str]:
    """The kind of the scalar ``node`` of a symbol's JSON graph, for a local batch of
    ``batch`` samples: :data:`SUM`, :data:`MEAN`, :data:`MIXED` or None (neither: e.g. a
    penalty alone, or a block's own cached operator)."""
    n = graph["nodes"][node]
    op, attrs = n["op"], n.get("attrs") or n.get("param") or {}
    inputs = [i[0] for i in n.get("inputs", [])]
    if op in ("sum", "sum_axis", "_np_sum", "nansum"):
        return SUM if _reduces_batch(attrs) else None
    if op in ("mean", "_np_mean"):
        return MEAN if _reduces_batch(attrs) else None
    if op in ("_mul_scalar", "_div_scalar", "_npi_multiply_scalar", "_npi_true_divide_scalar"):
        inner = kind_of(graph, inputs[0], batch) if inputs else None
        try:
            scalar = float(attrs.get("scalar", "nan"))
        except ValueError:
            return inner
        per_batch = (abs(scalar - batch) < 1e-6 * batch if op.endswith("div_scalar")
                     or op.endswith("divide_scalar") else abs(scalar * batch - 1) < 1e-6)
        if inner == SUM and per_batch:
            return MEAN
        return inner
    if op in ("negative", "_copy", "identity", "reshape", "Reshape", "squeeze", "Flatten",
              "flatten", "make_loss", "MakeLoss", "BlockGrad", "Cast", "cast"):
        return kind_of(graph, inputs[0], batch) if inputs else None
    if op in _ADDS:
        kinds = {kind_of(graph, i, batch) for i in inputs}
        if MEAN in kinds or MIXED in kinds:
            return MIXED
        return SUM if kinds == {SUM} else None
    return None


class LossHead:
    """The kind of the heads ``backward()`` is called on in this process (see the module
    docstring); ``batch()`` gives the current local batch (the session's)."""

    def __init__(self):
        self.kind: Optional[str] = None       # decided: SUM, MEAN or MIXED
        self.last: Optional[str] = None       # of the last backward (None: per sample)
        self._batch: Callable[[], int] = lambda: 0
        self._lock = threading.Lock()

    def observe(self, head) -> None:
        """Called with every head of one element before its backward pass runs."""
        if self.kind is not None:
            self.last = self.kind
            return
        batch = int(self._batch() or 0)
        if batch <= 1:
            self.last = None              # one sample: a mean is a sum
            return
        try:
            graph = json.loads(autograd.get_symbol(head).tojson())
            kind = kind_of(graph, graph["heads"][0][0], batch)
        except Exception:  # noqa: BLE001 - a graph we cannot read is taken as it is
            kind = None
        self.last = kind
        if kind is not None:
            self.kind = kind

    def per_sample(self) -> None:
        self.last = None

    def take(self) -> Optional[str]:
        """The kind of the heads since the last call (None: per sample, or no backward)."""
        last, self.last = self.last, None
        return last


_head = LossHead()
_original = None
_install = threading.Lock()


def watch(batch: Callable[[], int]) -> LossHead:
    """Wrap ``NDArray.backward`` once per process so that its heads are read; returns the
    process's :class:`LossHead` (``batch``: the current local batch)."""
    global _original
    _head._batch = batch
    with _install:
        if _original is None:
            _original = nd.NDArray.backward

            def backward(self, out_grad=None, retain_graph=False, train_mode=True):
                if out_grad is None and self.size == 1:
                    _head.observe(self)
                else:
                    _head.per_sample()
                return _original(self, out_grad=out_grad, retain_graph=retain_graph,
                                 train_mode=train_mode)

            backward.__doc__ = _original.__doc__
            nd.NDArray.backward = backward
    return _head
