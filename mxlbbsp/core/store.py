"""Checkpoints: everything needed to continue a job exactly, written atomically.

Layout of a checkpoint folder (``--checkpoint-dir DIR``)::

    DIR/ckpt-00000119/          the state after iteration 119 (written by rank 0)
        params.npz              every parameter of the trainer, BatchNorm statistics too
        optimizer.pkl           the optimizer and its state (momentum, update counts, the
                                learning-rate schedule's position): MXNet's Updater format
        manifest.json           written last: iteration, global batch, data set size, the
                                loader's position (epoch, index in the epoch), the model's
                                signature (parameter names and shapes); ``final``: true in
                                the checkpoint rank 0 writes when the script ends normally
                                (the launcher then says the job is finished, and starts
                                nothing)
    DIR/coordinator-00000119.json   the coordinator's state after the same iteration
                                (predictor, balancer's split, fitted time models, how many
                                metrics records were written); optional for exactness

A checkpoint is written into ``DIR/.tmp-...``, every file fsynced, then renamed to
``ckpt-NNNNNNNN`` (and the folder fsynced): a crash while writing leaves a ``.tmp-`` folder
that is ignored (and removed by the next write), never a half checkpoint under a real name.
Only folders with a readable manifest count (:func:`latest`). The two newest are kept.

Every worker holds the same model and optimizer state (see :mod:`mxlbbsp.worker.trainer`), so rank
0's copy is the job's. The data order depends only on (seed, epoch, iteration), so a job
resumed from iteration k continues exactly, on any number of workers.

This module is the store: atomic writes, the manifest, the coordinator's state and
objects' state. The worker's half (saving and loading a trainer, with MXNet) is
:mod:`mxlbbsp.worker.checkpoint`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import Dict, List, Optional

import numpy as np

FORMAT = "mxlbbsp-checkpoint-1"
MANIFEST = "manifest.json"
KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{8,})$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, or does not fit this job."""


# ---- atomic files and folders ------------------------------------------------------------

def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_checkpoint(directory: str, iteration: int, files: Dict[str, object],
                     manifest: dict) -> str:
    """Write one checkpoint folder atomically; returns its path.

    ``files``: name -> bytes, or a callable that writes the file given its path. The
    manifest goes last; the folder gets its real name only when everything is on disk.
    """
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):          # leftovers of an interrupted write
        if name.startswith(".tmp-ckpt-"):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    final = os.path.join(directory, f"ckpt-{iteration:08d}")
    tmp = os.path.join(directory, f".tmp-ckpt-{iteration:08d}-{os.getpid()}")
    os.makedirs(tmp)
    try:
        for name, content in files.items():
            path = os.path.join(tmp, name)
            if callable(content):
                content(path)
            else:
                with open(path, "wb") as f:
                    f.write(content)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        manifest = dict(manifest, format=FORMAT, iteration=int(iteration), time=time.time())
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if os.path.exists(final):               # the same iteration again (a resumed run)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(directory)
    return final


def _prune(directory: str) -> None:
    found = sorted(_complete(directory))
    for it, path in found[:-KEEP]:
        shutil.rmtree(path, ignore_errors=True)
        coord = coordinator_path(directory, it)
        if os.path.exists(coord):
            os.remove(coord)


# ---- finding and reading ------------------------------------------------------------------

def read_manifest(path: str) -> dict:
    """The manifest of checkpoint folder ``path``; CheckpointError when not a checkpoint."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        raise CheckpointError(f"{path}: not a complete mxlbbsp checkpoint (no readable "
                              f"{MANIFEST})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: {MANIFEST} is not an mxlbbsp checkpoint manifest")
    return manifest


def _complete(directory: str) -> List[tuple]:
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        m = _NAME.match(name)
        path = os.path.join(directory, name)
        if m:
            try:
                read_manifest(path)
            except CheckpointError:
                continue
            out.append((int(m.group(1)), path))
    return out


def latest(directory: str) -> Optional[str]:
    """The newest complete checkpoint in ``directory`` (or ``directory`` itself when it is
    one); None when there is none."""
    if os.path.isfile(os.path.join(directory, MANIFEST)):
        try:
            read_manifest(directory)
            return directory
        except CheckpointError:
            return None
    found = _complete(directory)
    return max(found)[1] if found else None


def coordinator_path(directory: str, iteration: int) -> str:
    return os.path.join(directory, f"coordinator-{iteration:08d}.json")


def coordinator_state(checkpoint: str) -> Optional[dict]:
    """The coordinator's state saved with ``checkpoint`` (None when absent)."""
    it = read_manifest(checkpoint)["iteration"]
    path = coordinator_path(os.path.dirname(os.path.abspath(checkpoint)), it)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_coordinator(directory: str, iteration: int, state: dict) -> None:
    os.makedirs(directory, exist_ok=True)
    write_file(coordinator_path(directory, iteration), json.dumps(state).encode())


def truncate_metrics(path: str, iteration: int) -> int:
    """Keep only the metrics records of iterations <= ``iteration`` (a resumed run appends
    after them, so no record is written twice); returns how many were kept."""
    if not path or not os.path.exists(path):
        return 0
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["iteration"] <= iteration:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                continue
    write_file(path, "".join(kept).encode())
    return len(kept)


# ---- the coordinator's state (numpy + JSON) ------------------------------------------------

def object_state(obj) -> dict:
    """Every numpy array, number, string and random generator among ``obj``'s attributes, in
    a JSON-serialisable dict (predictors, time-model fits)."""
    state = {}
    for key, value in vars(obj).items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            state[key] = {"array": value.tolist(), "dtype": value.dtype.str}
        elif isinstance(value, np.random.Generator):
            state[key] = {"rng": value.bit_generator.state}
        elif isinstance(value, (bool, int, float, str)) or value is None:
            state[key] = {"value": value}
    return state


def load_object_state(obj, state: dict) -> None:
    """Restore :func:`object_state` into an object of the same class and size."""
    for key, entry in state.items():
        current = getattr(obj, key, None)
        if "array" in entry:
            value = np.array(entry["array"], dtype=np.dtype(entry["dtype"]))
            if isinstance(current, np.ndarray):
                if current.size != value.size:
                    raise ValueError(f"{type(obj).__name__}.{key}: saved {value.shape}, this "
                                     f"job {current.shape}")
                value = value.reshape(current.shape)
            setattr(obj, key, value)
        elif "rng" in entry:
            if isinstance(current, np.random.Generator):
                current.bit_generator.state = entry["rng"]
        else:
            setattr(obj, key, entry["value"])
