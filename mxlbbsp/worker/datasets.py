"""Data sets that need no download: synthetic, scikit-learn's digits, CIFAR-10 from a folder."""
from __future__ import annotations

import os
import pickle
from typing import Optional, Tuple

import numpy as np
from mxnet import gluon, nd

CLASSES = {"synthetic": 10, "digits": 10, "cifar10": 10}


def num_classes(name: str) -> int:
    return CLASSES[name]


def load(name: str, data_dir: Optional[str] = None, samples: int = 4096,
         image_shape="3,32,32", seed: int = 0,
         noise: float = 1.0) -> Tuple[gluon.data.Dataset, Optional[gluon.data.Dataset]]:
    """(train, test) data sets by name; raises ValueError with what to do on bad input.
    ``synthetic``: ``samples`` training images and samples // 8 test images of the same
    classes, ``noise`` times as much noise as template (see :func:`synthetic`)."""
    if name == "synthetic":
        if not (noise > 0 and np.isfinite(noise)):
            raise ValueError(f"synthetic noise {noise!r} must be a positive number")
        shape = _shape(image_shape)
        return (synthetic(samples, shape, seed=seed, noise=noise),
                synthetic_test(max(samples // 8, 1), shape, seed=seed, noise=noise))
    if name == "digits":
        return digits(seed=seed)
    if name == "cifar10":
        if not data_dir:
            raise ValueError("--data cifar10 needs --data-dir (a folder with CIFAR-10; "
                             "nothing is downloaded)")
        return cifar10(data_dir)
    raise ValueError(f"unknown data set {name!r}; choose synthetic, digits or cifar10")


def _shape(text) -> tuple:
    if isinstance(text, (tuple, list)):
        return tuple(int(x) for x in text)
    try:
        shape = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"image shape {text!r} must be C,H,W, e.g. 3,32,32")
    return shape


def _dataset(x: np.ndarray, y: np.ndarray) -> gluon.data.ArrayDataset:
    return gluon.data.ArrayDataset(nd.array(x.astype(np.float32)), nd.array(y.astype(np.float32)))


def synthetic(samples: int, shape=(3, 32, 32), classes: int = 10, seed: int = 0,
              noise: float = 1.0):
    """Random images: each class has a fixed random template, and an image is its class's
    template plus ``noise`` times as much noise (at 1, learnable in a few dozen
    iterations; more noise, a harder task)."""
    rng, templates = _templates(seed, classes, shape)
    return _dataset(*_noisy(rng, templates, samples, noise))


def synthetic_test(samples: int, shape=(3, 32, 32), classes: int = 10, seed: int = 0,
                   noise: float = 1.0):
    """Held-out images of :func:`synthetic`'s classes (the same templates, other noise)."""
    _, templates = _templates(seed, classes, shape)
    return _dataset(*_noisy(np.random.default_rng([seed, 1]), templates, samples, noise))


def _templates(seed: int, classes: int, shape):
    """The classes' templates of ``seed``, and the generator that drew them (the training
    images draw on from it)."""
    rng = np.random.default_rng(seed)
    return rng, rng.standard_normal((classes,) + tuple(shape)).astype(np.float32)


def _noisy(rng, templates: np.ndarray, samples: int, noise: float):
    y = rng.integers(0, len(templates), samples)
    x = templates[y] + float(noise) * rng.standard_normal((samples,) + templates.shape[1:])
    return x.astype(np.float32), y


def digits(seed: int = 0, test_fraction: float = 0.2):
    """scikit-learn's bundled 8x8 digits as (1, 8, 8) images in [0, 1]; seeded 80/20 split."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None, :, :]
    y = data.target
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return _dataset(x[train], y[train]), _dataset(x[test], y[test])


def cifar10(data_dir: str):
    """CIFAR-10 from ``data_dir``: the python version (data_batch_1..5, test_batch) or the
    binary version (data_batch_1.bin.., test_batch.bin), possibly in a subfolder."""
    for sub in ("", "cifar-10-batches-py", "cifar-10-batches-bin"):
        folder = os.path.join(data_dir, sub)
        if os.path.isfile(os.path.join(folder, "data_batch_1")):
            return _cifar_py(folder)
        if os.path.isfile(os.path.join(folder, "data_batch_1.bin")):
            return _cifar_bin(folder)
    raise ValueError(f"no CIFAR-10 in {data_dir!r}: expected data_batch_1 (python version) or "
                     "data_batch_1.bin (binary version), possibly in cifar-10-batches-py/")


def _normalise(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    mean = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)[:, None, None]
    std = np.array([0.2023, 0.1994, 0.2010], dtype=np.float32)[:, None, None]
    return (x - mean) / std


def _cifar_py(folder):
    def read(name):
        with open(os.path.join(folder, name), "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        return _normalise(np.asarray(d[b"data"])), np.asarray(d[b"labels"])
    parts = [read(f"data_batch_{i}") for i in range(1, 6)]
    xt, yt = read("test_batch")
    return (_dataset(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])),
            _dataset(xt, yt))


def _cifar_bin(folder):
    def read(name):
        raw = np.fromfile(os.path.join(folder, name), dtype=np.uint8).reshape(-1, 3073)
        return _normalise(raw[:, 1:]), raw[:, 0]
    parts = [read(f"data_batch_{i}.bin") for i in range(1, 6)]
    xt, yt = read("test_batch.bin")
    return (_dataset(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])),
            _dataset(xt, yt))
