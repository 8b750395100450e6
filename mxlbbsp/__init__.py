"""mxlbbsp: load-balanced synchronous training (LB-BSP) for Apache MXNet.

A worker script needs two names::

    loader  = mxlbbsp.DataLoader(dataset, global_batch_size=512, shuffle=True, seed=0)
    trainer = mxlbbsp.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})

and is started with ``mxlbbsp launch -n 4 -- python train.py``. Without the launcher the same
script runs as one process training on the whole global batch.

``import mxlbbsp`` does not import MXNet: the two names above are loaded on first use, so the
launcher, the coordinator and the predictors stay free of the framework (and importing this
package in a process whose DMLC_ROLE is server never starts a parameter server by accident).
"""
import contextlib
import importlib

from mxlbbsp.core import env as _env
from mxlbbsp.core.env import NO_MXNET
from mxlbbsp.core.env import VERSION as __version__
from mxlbbsp.worker import scalars as _scalars
from mxlbbsp.worker import session as _session

__all__ = ["DataLoader", "Trainer", "rank", "num_workers", "local_rank", "local_size",
           "untimed", "log", "__version__"]


def rank() -> int:
    """This worker's rank in the job (0 in a single process)."""
    return _env.rank()


def num_workers() -> int:
    """The number of workers of the job (1 in a single process)."""
    return _env.num_workers() if _env.coordinator() is not None else 1


def local_rank() -> int:
    """This worker's index among the job's workers on its host, 0..local_size()-1 (0 in a
    single process): e.g. its GPU, ``mx.gpu(mxlbbsp.local_rank())``."""
    return _env.local_rank()


def local_size() -> int:
    """The number of the job's workers on this worker's host (1 in a single process)."""
    return _env.local_size()


def untimed():
    """A context manager: work inside is not counted as this worker's compute time.

    Use it for work between training steps that does not grow with the batch, such as
    rank 0 evaluating or checkpointing; otherwise the coordinator takes that worker for a
    slow one and gives it fewer samples. A no-op outside a job.
    """
    current = _session.current()
    return current.untimed() if current is not None else contextlib.nullcontext()


def log(loss=None, accuracy=None, **scalars) -> None:
    """Record this iteration's loss, accuracy or any other named number of the script::

        mxlbbsp.log(loss=loss.mean(), accuracy=acc, lr=trainer.learning_rate)

    Values: Python numbers or one-element arrays (numpy, MXNet NDArray). Inside a job they go
    into this worker's metrics record of the current iteration (``scalars``), which
    ``mxlbbsp report`` plots against time and iterations and ``--tensorboard DIR`` writes for
    TensorBoard; in a single process they are only kept in memory. A value that is not one
    number stops the script with one line (exit code 2). See :mod:`mxlbbsp.worker.scalars`.
    """
    _scalars.log(loss, accuracy, **scalars)


#: the two names that import MXNet, loaded on first use
_LAZY = {"DataLoader": ".worker.dataloader", "Trainer": ".worker.trainer"}

def __getattr__(name):
    if name in _LAZY:
        try:
            module = importlib.import_module(_LAZY[name], __name__)
        except ModuleNotFoundError as exc:
            if exc.name != "mxnet":
                raise
            raise ImportError(NO_MXNET) from None
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mxlbbsp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
