"""The model zoo (installed as ``mxlbbsp.models``): gluoncv models by name, and small models.

>>> net = get_model("cifar_resnet20_v1", classes=10)
>>> net = get_model("mlp", classes=10)

Short names: ``resnet20`` (cifar_resnet20_v1, the paper's CIFAR-10 model), ``resnet18``
(resnet18_v1), ``mobilenet`` (mobilenet1.0), ``vgg`` (vgg11); any other gluoncv model-zoo name
is passed through. ``mlp`` and ``cnn`` are defined here: tiny, batch-independent (no
BatchNorm, no dropout), so a distributed run can be compared bit for bit with a single process.
"""
from __future__ import annotations

ALIASES = {
    "resnet20": "cifar_resnet20_v1",
    "resnet18": "resnet18_v1",
    "mobilenet": "mobilenet1.0",
    "vgg": "vgg11",
}
GLUONCV = ("cifar_resnet20_v1", "resnet18_v1", "mobilenet1.0", "vgg11")
SMALL = ("mlp", "cnn")


def available() -> list:
    """Names accepted by :func:`get_model` (besides any gluoncv model-zoo name)."""
    return sorted(set(SMALL) | set(GLUONCV) | set(ALIASES))


def get_model(name: str, classes: int = 10, **kwargs):
    """A new, uninitialised Gluon network by name."""
    if name in SMALL:
        from . import small
        return getattr(small, name.upper())(classes=classes, **kwargs)
    name = ALIASES.get(name, name)
    try:
        from gluoncv.model_zoo import get_model as gcv_get_model
    except ImportError:  # pragma: no cover - gluoncv is in requirements.txt
        raise ValueError(f"model {name!r} needs gluoncv (pip install gluoncv)") from None
    try:
        return gcv_get_model(name, classes=classes, **kwargs)
    except ValueError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(available())} or a "
                         "gluoncv model-zoo name") from None


def batch_independent(name: str) -> bool:
    """True when a sample's loss does not depend on the rest of its batch (no BatchNorm)."""
    return name in SMALL
