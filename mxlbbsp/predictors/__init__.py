"""Speed predictors behind one interface (:class:`Predictor`) and a registry by name.

The order of the imports below is the order of ``available()``: not sorted on purpose.
"""
# isort: skip_file
from ._api import (Predictor, available, create, join_states, predictor_class, register,
                   state_of_workers)
from . import simple  # noqa: F401  (registers last, ema)
from . import ar, narx, narx_adam  # noqa: F401  (registers ar, narx, narx-adam)
from . import oracle  # noqa: F401  (registers oracle: benchmarks only)

__all__ = ["Predictor", "available", "create", "join_states", "predictor_class", "register",
           "state_of_workers"]
