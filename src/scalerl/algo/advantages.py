"""Group-relative advantages with batch-, prompt- or no std normalisation.

Khatri et al. 2025, Sec. 3.2 ("advantage normalization"): ``A_i = r_i - mean(r of the prompt's G
generations)``, then divided by the std of all advantages in the batch (ScaleRL), by the std of the
prompt's rewards (GRPO), or left as is (Dr. GRPO).
"""

from __future__ import annotations

import torch

from scalerl.algo._groups import group_index, group_sum

NORMS: tuple[str, ...] = ("batch", "prompt", "none")


def compute_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    norm: str = "batch",
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-centred, optionally std-normalised advantages (Khatri et al. 2025, Sec. 3.2).

    Args:
        rewards: ``[N]`` rewards (any numeric dtype; computed in floating point).
        group_ids: ``[N]`` prompt id of each sample (any integers, any order).
        norm: ``"batch"``: divide by the population std (divisor n) of all centred advantages
            passed in; ``"prompt"``: divide by the population std of the sample's group rewards;
            ``"none"``: centring only.
        eps: added to the std before dividing, so zero-variance groups/batches give 0, not NaN.

    Returns:
        ``[N]`` float advantages (no gradient is expected to flow through rewards).
    """
    if norm not in NORMS:
        raise ValueError(f"unknown advantage norm {norm!r}: must be one of {', '.join(NORMS)}")
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length, got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if not torch.is_floating_point(rewards):
        rewards = rewards.to(torch.get_default_dtype())
    if rewards.numel() == 0:
        return rewards.clone()

    inverse, num_groups = group_index(group_ids)
    counts = group_sum(torch.ones_like(rewards), inverse, num_groups)
    mean = group_sum(rewards, inverse, num_groups) / counts
    adv = rewards - mean[inverse]

    if norm == "batch":
        std = adv.std(correction=0)  # population std (divisor n)
        adv = adv / (std + eps)
    elif norm == "prompt":
        std = (group_sum(adv.pow(2), inverse, num_groups) / counts).sqrt()
        adv = adv / (std[inverse] + eps)
    return adv
