"""Group bookkeeping shared by the algorithm modules.

``group_ids`` name the prompt each sequence was generated from. They need not be contiguous or
sorted, so everything here works through ``torch.unique(..., return_inverse=True)`` and
``index_add``.
"""

from __future__ import annotations

import torch


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group index ``[N]`` (0..G-1) for arbitrary ``group_ids`` ``[N]``, and the group count G."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
    if group_ids.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=group_ids.device), 0
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1
    return inverse, num_groups


def group_sum(values: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum of ``values`` ``[N]`` per group: ``[G]`` (differentiable)."""
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.index_add(0, inverse, values)
