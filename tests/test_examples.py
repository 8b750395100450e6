"""The examples users copy run as documented, on 2 workers (real processes)."""
import re

import mxnet as mx
import numpy as np
import pytest

from conftest import PY, ROOT, run_mxlbbsp

pytestmark = pytest.mark.cluster

GLUONCV = ROOT / "examples" / "train_gluoncv_cifar.py"


def test_the_gluoncv_cifar_recipe_converted_to_mxlbbsp_trains_on_two_workers(tmp_path):
    params = tmp_path / "resnet.params"
    r = run_mxlbbsp("launch", "-n", 2, "--emulate-slowdown", "1,3", "--progress", 30, "--",
                    PY, GLUONCV, "--samples", 512, "--batch-size", 64, "--epochs", 2,
                    "--save-params", params, timeout=600)
    assert r.rc == 0, r.output
    epochs = re.findall(r"\[worker 0\] \[Epoch (\d)\] train accuracy [\d.]+ .*test accuracy "
                        r"([\d.]+)", r.stdout)
    assert [e for e, _ in epochs] == ["0", "1"], r.stdout
    # gluoncv's step(batch_size) inside a job says nothing: it is the constant global batch
    assert "trainer.step(" not in r.stderr, r.stderr
    saved = mx.nd.load(str(params))
    assert sum(k.endswith("running_var") for k in saved) == 21        # a BatchNorm ResNet-20
    assert all(np.isfinite(v.asnumpy()).all() for v in saved.values())
