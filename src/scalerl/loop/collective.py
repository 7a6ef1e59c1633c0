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


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _device() -> torch.device:
    """Where collective tensors live: NCCL only moves CUDA tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_objects(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` (picklable objects)."""
    n = world_size()
    if n == 1:
        return [obj]
    out: list = [None] * n
    dist.all_gather_object(out, obj)
    return out


def global_sum(x: float) -> float:
    if world_size() == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return float(t.item())


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
        [float(a.numel()), float(a.sum()), float((a * a).sum())], dtype=torch.float64, device=_device()
    )
    dist.all_reduce(m)
    n, s, ss = m.tolist()
    if n == 0:
        return adv
    mean = s / n
    std = math.sqrt(max(ss / n - mean * mean, 0.0))
    return (adv / (std + eps)).to(adv.dtype)


# step statistics of the loop: how each combines over ranks (default: mean weighted by samples)
_SUM = ("data/zero_variance_dropped_step", "train/groups_trained")
_MAX = ("train/policy_lag_max", "train/versions_in_batch")
_BY_LAGS = ("train/policy_lag_mean",)


def reduce_step(
    stats: dict[str, float], counts: dict[str, float], *, samples: int, lags: int
) -> tuple[dict, dict]:
    """(stats of all ranks' groups, ``counts`` summed over ranks).

    ``stats``: per-rank means over its ``samples`` samples (or its ``lags`` policy-lag entries)
    become means over all ranks; counts per step are summed; maxima are maxima (for
    ``train/versions_in_batch``, the most versions any rank saw).
    """
    if world_size() == 1:
        return dict(stats), dict(counts)
    parts = gather_objects((stats, counts, samples, lags))
    out: dict[str, float] = {}
    for k in stats:
        vals = [(p[0][k], p[2], p[3]) for p in parts if k in p[0]]
        if k in _SUM:
            out[k] = float(sum(v for v, _, _ in vals))
        elif k in _MAX or k.endswith("_max"):
            out[k] = float(max(v for v, _, _ in vals))
        else:
            w = [(v, (nl if k in _BY_LAGS else ns)) for v, ns, nl in vals]
            total = sum(n for _, n in w)
            out[k] = float(sum(v * n for v, n in w) / total) if total else 0.0
    summed = {k: float(sum(p[1][k] for p in parts)) for k in counts}
    return out, summed
