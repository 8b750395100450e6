"""The worker's half of checkpoints: a trainer's parameters and optimizer into the store
(:mod:`mxlbbsp.core.store`, which describes the layout), and back.

MXNet is imported only inside :func:`load_trainer` (``save_trainer`` reads NDArrays it is given).
"""
from __future__ import annotations

import os
import sys
from typing import List

import numpy as np

from mxlbbsp.core import env as _env
from mxlbbsp.core import epochs as _epochs
from mxlbbsp.core.store import CheckpointError, read_manifest, write_checkpoint
from mxlbbsp.worker import session as _session

# ---- worker side (MXNet) ------------------------------------------------------------------

def _signature(params) -> List[list]:
    return [[p.name, [int(d) for d in (p.shape or ())]] for p in params]


def save_trainer(trainer, directory: str, final: bool = False) -> str:
    """Rank 0's checkpoint after the last ``trainer.step()``: see the module docstring.
    ``final``: the job ended normally after this iteration (its manifest says so: a job
    started from it has nothing to do)."""
    sess = _session.current()
    if sess is None or sess.iteration < 0:
        raise CheckpointError("save_checkpoint() needs at least one trainer.step() on batches "
                              "from an mxlbbsp.DataLoader")
    check_saveable(trainer)
    arrays = {f"p{i}": p.data().asnumpy() for i, p in enumerate(trainer._params)}
    return write_state(directory, sess, trainer._params, sess.iteration, arrays,
                       trainer._updaters[0].get_states(dump_optimizer=True), final)


def check_saveable(trainer) -> None:
    if trainer._kvstore is not None and trainer._update_on_kvstore:
        raise CheckpointError("checkpoints need the optimizer on the workers "
                              "(update_on_kvstore=False); --sync asp updates on the servers")


def write_state(directory: str, sess, params, t: int, arrays: dict, optimizer: bytes,
                final: bool = False) -> str:
    """A checkpoint of the state after iteration ``t``: ``arrays`` (``p<i>``: the value of
    the trainer's i-th parameter), ``optimizer`` (MXNet's Updater states with the
    optimizer, pickled), the loader's position from the session."""
    manifest = {
        "global_batch_size": sess.global_batch_size,
        "dataset_size": getattr(sess, "dataset_size", None),
        **_epochs.checkpoint_position(t, getattr(sess, "epoch_length", None)),
        "num_workers": sess.num_workers,
        "sync": sess.sync,
        "params": _signature(params),
    }
    if final:
        manifest["final"] = True

    def write_params(path):
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    files = {"params.npz": write_params, "optimizer.pkl": optimizer}
    return write_checkpoint(directory, t, files, manifest)


def _fail(message: str):
    """A checkpoint that does not fit: one line, exit 2 (the launcher names the worker)."""
    sys.stderr.write(f"mxlbbsp: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def load_trainer(trainer, path: str) -> None:
    """Load parameters and optimizer state from checkpoint ``path`` into ``trainer``."""
    from mxnet import nd
    try:
        manifest = read_manifest(path)
    except CheckpointError as exc:
        _fail(str(exc))
    saved = manifest["params"]
    mine = _signature(trainer._params)
    same = len(saved) == len(mine) and all(
        a[0] == b[0] and (not b[1] or 0 in b[1] or a[1] == b[1]) for a, b in zip(saved, mine))
    if not same:
        diff = next((f"{a} vs {b}" for a, b in zip(saved, mine) if a != b),
                    f"{len(saved)} vs {len(mine)} parameters")
        _fail(f"--resume {path}: the checkpoint holds a different model (saved vs this "
              f"script: {diff}); resume with the script and model that wrote it")
    with np.load(os.path.join(path, "params.npz")) as data:
        for i, p in enumerate(trainer._params):
            value = data[f"p{i}"]
            p._load_init(nd.array(value, dtype=value.dtype), None)
    with open(os.path.join(path, "optimizer.pkl"), "rb") as f:
        states = f.read()
    for updater in trainer._updaters:
        updater.set_states(states)
        updater.optimizer = trainer._updaters[0].optimizer
    trainer._optimizer = trainer._updaters[0].optimizer
    trainer._optimizer.param_dict = {i: p for i, p in enumerate(trainer._params)}


def loader_start(path: str, global_batch_size: int, dataset_size: int, epoch_length: int) -> int:
    """The first iteration a resumed DataLoader runs (checks that the data is the same)."""
    try:
        m = read_manifest(path)
    except CheckpointError as exc:
        _fail(str(exc))
    start = _epochs.resume_start(m, global_batch_size, dataset_size, epoch_length)
    if start is None:
        if _env.coordinator() is not None:
            return 0        # the coordinator refuses the job at registration, in one line
        _fail(f"--resume {path}: the checkpoint was written with a global batch size of "
              f"{m['global_batch_size']} on {m.get('dataset_size')} samples, this job has "
              f"{global_batch_size} on {dataset_size}; resume with the same data and batch size")
    return start
