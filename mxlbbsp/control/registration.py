"""Registration: the checks of the workers' hellos before the first iteration, and of
their iteration counts at the end.

Once every worker has said hello, the job's configuration as the workers declared it (global
batch, data set, per-worker caps) must agree with itself and with the command line; the
first problem found fails the job with one line that says what to change. The per-worker
batch caps found here are handed to the balancer.

No framework import.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from mxlbbsp import modes as _modes
from mxlbbsp.core.epochs import EpochPlan
from mxlbbsp.core.split import equal_split

#: the smallest local batch of a model with BatchNorm layers when --min-batch-size is not
#: given: their statistics come from each worker's own batch, and batch norm degrades quickly
#: below about 8 samples per device (Wu & He, "Group Normalization", 2018, fig. 1); at most a
#: half of the equal share B / (2 n), so that a slow worker can still be given less
BATCHNORM_MIN_BATCH = 8


def auto_min_batch(global_batch: int, num_workers: int, batchnorm: bool) -> int:
    """The default --min-batch-size: 1 without BatchNorm, else BATCHNORM_MIN_BATCH capped at
    half the equal share."""
    if not batchnorm:
        return 1
    return max(1, min(BATCHNORM_MIN_BATCH, global_batch // (2 * num_workers)))


def check_hellos(hellos: Sequence[dict], config, policy, balancer) -> Optional[str]:
    """The first problem with the job's configuration as the workers declared it
    (``hellos`` in rank order), or None; sets ``balancer.max_batch`` from the caps."""
    problem = _check_agreement(hellos)
    if problem:
        return problem
    B, N = hellos[0]["global_batch_size"], hellos[0]["dataset_size"]
    return (_check_data(hellos, config, B, N)
            or _check_least(config, policy, B)
            or _check_caps(hellos, config, policy, balancer, B))


def _check_agreement(hellos: Sequence[dict]) -> Optional[str]:
    """The workers build the same DataLoader over the same data."""
    for field, what in (("global_batch_size", "global batch size"),
                        ("dataset_size", "data set size")):
        values = {h[field] for h in hellos}
        if len(values) > 1:
            detail = ", ".join(f"rank {r}: {h[field]}" for r, h in enumerate(hellos))
            return f"the workers disagree on the {what} ({detail}); every worker must " \
                   "build the same mxlbbsp.DataLoader"
    return _check_identity(hellos)


def _check_data(hellos: Sequence[dict], config, B: int, N: int) -> Optional[str]:
    """The global batch against the workers, the data set and the checkpoint resumed."""
    n = config.num_workers
    saved = config.resume_manifest
    if saved is not None and (saved["global_batch_size"] != B
                              or saved.get("dataset_size") not in (None, N)):
        return (f"the checkpoint (iteration {saved['iteration']}) was written with a global "
                f"batch size of {saved['global_batch_size']} on {saved.get('dataset_size')} "
                f"samples, this job has {B} on {N}; resume with the same data and batch "
                "size, or start without --resume")
    if B < n:
        return (f"global batch size {B} is smaller than the number of workers ({n}): every "
                f"worker needs at least one sample per iteration; use a global batch size "
                f">= {n} or fewer workers (-n)")
    if N < B:
        return (f"the data set has {N} samples, fewer than one global batch ({B}); use a "
                "smaller global batch size")
    # the epoch's last, short global batch of B; a mode that chooses B(t) cuts its epochs
    # itself, within what the workers can split (modes.lbbsp.BatchChoosingPolicy)
    short = hellos[0].get("min_global_batch") or B
    if short < n and not _modes.get(config.sync).sets_batch:
        return (f"the last global batch of each epoch has {short} samples, fewer than the "
                f"{n} workers; pass last_batch='discard' to mxlbbsp.DataLoader or change "
                "the global batch size")
    return None


def _check_least(config, policy, B: int) -> Optional[str]:
    """--min-batch-size against the smallest global batch the job can have."""
    n = config.num_workers
    low = config.min_batch_size
    smallest = getattr(policy, "lo", None)        # courier: --batch-range's minimum
    if low is not None and isinstance(smallest, int) and low * n > smallest:
        return (f"--min-batch-size {low} is more than --batch-range's minimum {smallest} / "
                f"{n} workers ({smallest // n} each): every worker must be able to get it; "
                f"use at most {smallest // n}, or raise the --batch-range minimum")
    if low is not None and low * n > B:
        return (f"--min-batch-size {low} is more than the global batch size {B} / {n} "
                f"workers ({B // n} each): every worker must be able to get it; use at most "
                f"{B // n}, or fewer workers")
    return None


def _check_caps(hellos: Sequence[dict], config, policy, balancer, B: int) -> Optional[str]:
    """The workers' maximum batch sizes against the splits the mode makes; sets
    ``balancer.max_batch``."""
    n = config.num_workers
    low = config.min_batch_size
    smallest = getattr(policy, "lo", None)        # courier: --batch-range's minimum
    caps = [h.get("max_batch_size") for h in hellos]
    if config.max_batch_size is not None:
        cap = config.max_batch_size
        caps = [cap if c is None else min(c, cap) for c in caps]
    if low is not None and any(c is not None and c < low for c in caps):
        rank = next(r for r, c in enumerate(caps) if c is not None and c < low)
        return (f"--min-batch-size {low} is more than worker {rank}'s maximum batch size "
                f"{caps[rank]} (its DataLoader's max_batch_size or --max-batch-size): no "
                f"split can give it both; use --min-batch-size {caps[rank]} or less, or raise "
                "the maximum")
    if not policy.sends and any(c is not None for c in caps):
        # the workers split each global batch equally by themselves (bsp, asp): the largest
        # the equal split of B (a sample more to the lowest ranks when it does not divide)
        split = equal_split(B, n)
        rank = next((r for r, c in enumerate(caps) if c is not None and split[r] > c), None)
        if rank is not None:
            return (f"--sync {config.sync} splits every global batch equally: worker {rank} "
                    f"would get {split[rank]} samples of {B}, more than its maximum batch "
                    f"size {caps[rank]} (its DataLoader's max_batch_size or "
                    "--max-batch-size); raise it, use more workers, or use --sync lbbsp, "
                    "which splits within the caps")
    if all(c is not None for c in caps):
        balancer.max_batch = np.array(caps, dtype=np.int64)
        if sum(caps) < B:
            return (f"the workers' maximum batch sizes ({', '.join(map(str, caps))}) add up "
                    f"to less than the global batch size {B}; raise --max-batch-size or "
                    "use more workers")
    elif any(c is not None for c in caps):
        # an uncapped worker may take a whole global batch, the largest one the job can have
        # (a mode that chooses B(t) may go above the DataLoader's B)
        largest = max(B, smallest or 0, getattr(policy, "hi", 0) or 0)
        balancer.max_batch = np.array([largest if c is None else c for c in caps],
                                      dtype=np.int64)
    return None


def epoch_plan(hello: dict) -> EpochPlan:
    """How the DataLoader a worker's ``hello`` describes cuts its epochs into global
    batches (its global batch size, the short last batch of each epoch)."""
    order = hello.get("order") or {}
    return EpochPlan(int(hello["dataset_size"]), int(hello["global_batch_size"]),
                     order.get("last_batch") or "keep")


def _check_identity(hellos: Sequence[dict]) -> Optional[str]:
    """Workers whose loaders would not cut one global permutation: another order of the
    same data (a seed per rank), or other data of the same size (a shard per rank)."""
    orders = [h.get("order") for h in hellos]
    if all(o is not None for o in orders) and any(o != orders[0] for o in orders):
        rank = next(r for r, o in enumerate(orders) if o != orders[0])
        shown = lambda o: ", ".join(f"{k}={o[k]!r}" for k in sorted(o))
        return (f"the workers order the data differently (rank 0: {shown(orders[0])}; rank "
                f"{rank}: {shown(orders[rank])}): every worker must build mxlbbsp.DataLoader "
                "with the same shuffle, seed and last_batch, as the loader cuts each worker's "
                "slice from one permutation of the whole data set (no seed per rank)")
    prints = [h.get("data_fingerprint") for h in hellos]
    if all(p is not None for p in prints) and any(p != prints[0] for p in prints):
        ranks = [r for r, p in enumerate(prints) if p != prints[0]]
        return (f"the workers hold different data sets of the same size (rank "
                f"{', '.join(map(str, ranks[:5]))}{' ...' if len(ranks) > 5 else ''} and rank 0 "
                "read different samples at the same indices): every worker must build the same "
                "data set, whole; mxlbbsp.DataLoader takes each worker's slice itself (don't "
                "shard the data by rank)")
    return None


def uneven_end(bye_at: Dict[int, int], last_report: Dict[int, int]) -> Optional[str]:
    """The problem when a worker ended (``bye_at``: rank -> its last iteration) while another
    went on to a later iteration (``last_report``: rank -> its latest report's): in
    synchronous training the others would wait for it forever. None when there is none."""
    low_rank = min(bye_at, key=lambda r: (bye_at[r], r))
    low = bye_at[low_rank]
    ahead = {r: t for r, t in last_report.items() if t > low}
    if not ahead:
        return None
    high_rank = max(ahead, key=lambda r: (ahead[r], -r))
    what = "no iteration" if low < 0 else f"iteration {low}"
    return (f"worker {low_rank} ended after {what} while worker {high_rank} went on to "
            f"iteration {ahead[high_rank]}: every worker must run the same number of "
            "iterations; use the DataLoader's epochs (the same on every worker), not a "
            "wall clock or a per-worker iteration count")
