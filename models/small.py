"""Small networks for tests and quick examples: no BatchNorm and no dropout, so the loss of a
sample does not depend on the other samples of its batch."""
from mxnet.gluon import nn


class MLP(nn.HybridSequential):
    """Flatten -> Dense(hidden, relu) -> Dense(classes)."""

    def __init__(self, classes: int = 10, hidden: int = 64, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.add(nn.Flatten(), nn.Dense(hidden, activation="relu"), nn.Dense(classes))


class CNN(nn.HybridSequential):
    """Two 3x3 conv + max-pool blocks, then a dense classifier; for 8x8 to 32x32 images."""

    def __init__(self, classes: int = 10, channels: int = 16, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.add(nn.Conv2D(channels, 3, padding=1, activation="relu"),
                     nn.MaxPool2D(2),
                     nn.Conv2D(2 * channels, 3, padding=1, activation="relu"),
                     nn.MaxPool2D(2),
                     nn.Flatten(),
                     nn.Dense(classes))
