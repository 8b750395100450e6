"""Inside a SLURM allocation: hosts and slots from the allocation, roles started with srun."""
from __future__ import annotations

import os
from typing import Mapping, Optional


def in_allocation(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process runs inside a SLURM allocation (salloc, sbatch)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"))
