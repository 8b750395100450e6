"""Speed predictors behind one interface (:class:`Predictor`) and a registry by name."""
from ._api import Predictor, available, create, register
from . import simple  # noqa: F401  (registers last, ema)

__all__ = ["Predictor", "available", "create", "register"]
