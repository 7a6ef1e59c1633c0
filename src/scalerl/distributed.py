"""The collectives shared by trainer processes (trainer=deepspeed under torchrun), and the one
function that merges per-rank statistics into those of all ranks.

In a single process (torch.distributed not initialised) every helper returns the local value and
communicates nothing. With several, every helper here except :func:`merge_stats` is a collective:
every rank must call it, in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def collective_device() -> torch.device:
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


def scatter_objects(parts: list | None):
    """Rank 0's ``parts[i]`` on rank i (``parts``: one picklable object per rank, given on rank 0;
    other ranks pass None)."""
    n = world_size()
    if n == 1:
        return parts[0]
    out: list = [None]
    dist.scatter_object_list(out, parts if rank() == 0 else None, src=0)
    return out[0]


_OPS = {"sum": "SUM", "min": "MIN", "max": "MAX"}


def all_reduce(values: Sequence[float], op: str) -> list[float]:
    """``values`` combined element-wise over the ranks with ``op`` (``sum``, ``min`` or ``max``), in
    float64."""
    if op not in _OPS:
        raise ValueError(f"all_reduce op={op!r}: one of {sorted(_OPS)}")
    if world_size() == 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=getattr(dist.ReduceOp, _OPS[op]))
    return t.tolist()


def global_sum(x: float) -> float:
    return all_reduce([x], "sum")[0]


def merge_stats(
    parts: Sequence[Mapping[str, float]],
    *,
    weights: Sequence[Mapping[str, float]] | None = None,
    summed: Collection[str] = (),
    maxed: Collection[str] = (),
) -> dict[str, float]:
    """The statistics of all ranks from each rank's own (``parts``, one mapping per rank, e.g. from
    :func:`gather_objects`).

    A key in ``summed`` is summed; in ``maxed``, or ending in ``_max``, the maximum; any other is a
    mean weighted by ``weights[rank][key]`` (default 1; all weights 0: 0.0). A key counts over the
    ranks that have it. One part is returned as it is."""
    if len(parts) == 1:
        return dict(parts[0])
    keys: dict[str, None] = {}
    for p in parts:
        keys.update(dict.fromkeys(p))
    out: dict[str, float] = {}
    for k in keys:
        have = [i for i, p in enumerate(parts) if k in p]
        vals = [float(parts[i][k]) for i in have]
        if k in summed:
            out[k] = float(sum(vals))
        elif k in maxed or k.endswith("_max"):
            out[k] = float(max(vals, default=-math.inf))
        else:
            w = [float(weights[i].get(k, 1.0)) if weights is not None else 1.0 for i in have]
            total = sum(w)
            out[k] = float(sum(v * n for v, n in zip(vals, w)) / total) if total else 0.0
    return out
