"""The model zoo names and the data sets that need no download."""
import pickle

import numpy as np
import pytest
from mxnet import nd

from mxlbbsp.worker import datasets
from mxlbbsp.models import available, batch_independent, get_model


@pytest.mark.parametrize("name, shape", [
    ("mlp", (2, 1, 8, 8)), ("cnn", (2, 1, 8, 8)), ("cifar_resnet20_v1", (2, 3, 32, 32)),
    ("resnet20", (2, 3, 32, 32)), ("resnet18", (1, 3, 64, 64)), ("mobilenet", (1, 3, 64, 64)),
    ("vgg", (1, 3, 32, 32)),
])
def test_models_by_name_run_forward(name, shape):
    net = get_model(name, classes=10)
    net.initialize()
    assert net(nd.ones(shape)).shape == (shape[0], 10)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        get_model("nope")
    assert {"mlp", "cnn", "resnet20", "vgg", "mobilenet"} <= set(available())
    assert batch_independent("mlp") and not batch_independent("resnet20")


def test_synthetic_is_deterministic_and_learnable_shape():
    a, b = datasets.synthetic(50, (3, 4, 4), seed=1), datasets.synthetic(50, (3, 4, 4), seed=1)
    assert len(a) == 50 and a[0][0].shape == (3, 4, 4)
    assert np.array_equal(a[7][0].asnumpy(), b[7][0].asnumpy())
    labels = {int(a[i][1]) for i in range(50)}
    assert len(labels) > 3


def test_digits_split_is_seeded():
    train, test = datasets.digits(seed=0)
    assert len(train) + len(test) == 1797 and train[0][0].shape == (1, 8, 8)


def test_cifar10_from_a_local_python_folder(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                         b"labels": list(rng.integers(0, 10, 4))}, fh)
    train, test = datasets.load("cifar10", data_dir=str(tmp_path))
    assert len(train) == 20 and len(test) == 4
    assert train[0][0].shape == (3, 32, 32)


def test_cifar10_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="needs --data-dir"):
        datasets.load("cifar10")
    with pytest.raises(ValueError, match="no CIFAR-10 in"):
        datasets.load("cifar10", data_dir=str(tmp_path))
