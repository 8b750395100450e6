"""The coordinator's configuration, and the snapshots it gives the launcher.

No framework import.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from mxlbbsp import modes as _modes
from mxlbbsp import predictors as _pred
from mxlbbsp.control.speed import TIME_MODELS
from mxlbbsp.core import signals as _signals

#: ``mxlbbsp launch --control-period``'s default, seconds: on a model of a few milliseconds
#: per iteration the coordinator decides every few iterations and a worker writes to it a
#: few dozen times a second, not hundreds (benchmarks/overhead.py)
CONTROL_PERIOD = 0.05


@dataclasses.dataclass
class CoordinatorConfig:
    """What the coordinator needs to know about the job."""

    num_workers: int
    token: str
    sync: str = _modes.DEFAULT
    predictor: str = "narx"
    time_model: str = "auto"
    exog: tuple = _signals.DEFAULT        # the report fields the predictor sees (--exog)
    threshold: float = 0.03
    max_batch_size: Optional[int] = None  # per-worker cap (--max-batch-size)
    #: per-worker minimum (--min-batch-size); None: auto, 1 unless the workers' model has
    #: BatchNorm layers, then BATCHNORM_MIN_BATCH (see auto_min_batch)
    min_batch_size: Optional[int] = None
    tensorboard: Optional[str] = None     # --tensorboard: event files of the scalars
    metrics: Optional[str] = None         # --metrics: the JSON-lines file
    warmup: int = 1                       # first iterations (graph building) not learnt from
    #: --control-period: seconds a worker may hold its reports to send them in one write,
    #: and, on iterations shorter than it, one decision per period (a lease of several
    #: iterations: Coordinator._lease); 0: a decision per iteration, each report at once
    control_period: float = 0.0
    slowdown: Optional[list] = None       # per-rank emulated slowdown schedules (the oracle's)
    host: str = "127.0.0.1"               # address to listen on
    port: int = 0                         # 0: any free port
    #: a socket already listening, to serve instead of (host, port): an elastic job's next
    #: generation hands its address to the workers before the coordinator exists
    sock: object = None
    sync_options: dict = dataclasses.field(default_factory=dict)   # the mode's own options
    #: time.monotonic() of the job's launch (courier's deadline counts from it); None: when
    #: the coordinator is built
    started: Optional[float] = None
    # checkpoints (mxlbbsp.core.store): where and how often to save the coordinator's state,
    # and, when resuming, the checkpoint's manifest and the state saved with it
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    resume_manifest: Optional[dict] = None
    resume_state: Optional[dict] = None

    def __post_init__(self):
        if self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        problem = _modes.get(self.sync).check_options(self.sync_options)
        if problem:
            raise ValueError(problem)
        if self.time_model not in TIME_MODELS:
            raise ValueError(f"time_model must be one of {TIME_MODELS}")
        if not 0 <= self.control_period <= 60:
            raise ValueError("control_period must be between 0 and 60 seconds")
        if self.min_batch_size is not None and self.min_batch_size < 1:
            raise ValueError("min_batch_size must be >= 1")
        if self.predictor not in _pred.available():
            raise ValueError(f"unknown predictor {self.predictor!r}; choose from "
                             f"{', '.join(_pred.available())}")


@dataclasses.dataclass
class Progress:
    """A snapshot for progress lines and the stall timeout."""

    iteration: int            # last iteration every worker has finished (-1: none yet)
    samples: int              # samples trained so far (sum of global batches)
    last_change: float        # monotonic time the iteration last advanced
    samples_per_s: float      # over the recent iterations
    split: List[int]          # the split in force (of the latest iteration planned)
    iteration_s: Optional[float] = None   # median time between recent iterations


@dataclasses.dataclass
class Waiting:
    """What the job waits for (stall messages): which workers have not sent what."""

    iteration: Optional[int]  # the iteration waited for (None: registration)
    what: str                 # "hello", "report" or "done"
    ranks: List[int]          # the workers whose message never came
