"""What the training loop shares between trainer processes (trainer=deepspeed under torchrun).

Each rank generates and trains on its own share of a step's groups; these helpers make the pass-rate
history, the advantage normalisation, the logged statistics and the counters cover all ranks'
groups. In a single process they return the local values and communicate nothing. With several,
every function here is a collective: every rank must call it, in the same order.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from scalerl import algo
from scalerl.distributed import (
    collective_device,
    gather_objects,
    global_sum,
    merge_stats,
    scatter_objects,
    world_size,
)

__all__ = [
    "gather_objects",
    "global_advantages",
    "global_sum",
    "reduce_step",
    "scatter_objects",
    "world_size",
]


def global_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, norm: str, eps: float = 1e-6
) -> torch.Tensor:
    """:func:`algo.compute_advantages` as if all ranks' groups were one batch.

    Groups never span ranks, so the group centring (and ``norm=prompt``) is local; ``norm=batch``
    divides by the population std of the centred advantages of *every* rank's batch.
    """
    if world_size() == 1 or norm != "batch":
        return algo.compute_advantages(rewards, group_ids, norm, eps=eps)
    adv = algo.compute_advantages(rewards, group_ids, "none", eps=eps)
    a = adv.double()
    m = torch.tensor(
        [float(a.numel()), float(a.sum()), float((a * a).sum())],
        dtype=torch.float64,
        device=collective_device(),
    )
    dist.all_reduce(m)
    n, s, ss = m.tolist()
    if n == 0:
        return adv
    mean = s / n
    std = math.sqrt(max(ss / n - mean * mean, 0.0))
    return (adv / (std + eps)).to(adv.dtype)


# step statistics of the loop: how each combines over ranks (default: mean weighted by samples)
_SUM = (
    "data/zero_variance_dropped_step",
    "data/zero_variance_groups_step",
    "data/truncated_excluded_step",
    "train/groups_trained",
)
# (train/policy_lag_p90 of several ranks: the largest rank's, an upper bound; the run's async/lag_p90
# is exact, from every rank's tokens)
_MAX = ("train/policy_lag_max", "train/policy_lag_p90", "train/versions_in_batch")
_BY_LAGS = ("train/policy_lag_mean",)


def reduce_step(
    stats: dict[str, float], counts: dict[str, float], *, samples: int, lags: int
) -> tuple[dict, dict]:
    """(stats of all ranks' groups, ``counts`` summed over ranks).

    ``stats``: per-rank means over its ``samples`` samples (or its ``lags`` policy-lag entries)
    become means over all ranks; counts per step are summed (over the keys of any rank); maxima are
    maxima (for
    ``train/versions_in_batch``, the most versions any rank saw).
    """
    if world_size() == 1:
        return dict(stats), dict(counts)
    parts = gather_objects((stats, counts, samples, lags))
    weights = [{k: (nl if k in _BY_LAGS else ns) for k in st} for st, _, ns, nl in parts]
    out = merge_stats([p[0] for p in parts], weights=weights, summed=_SUM, maxed=_MAX)
    out = {k: out[k] for k in stats}  # this rank's keys (the same on every rank)
    keys = {k for p in parts for k in p[1]}  # (the lag/<n> counts differ between ranks)
    return out, merge_stats([p[1] for p in parts], summed=keys)
