"""Loss aggregation: token-, sample- or prompt-level averaging of per-token losses.

Khatri et al. 2025, Sec. 3.2 ("loss aggregation"):

- ``token``: sum of all token losses in the batch / number of tokens (DAPO).
- ``sample``: mean over tokens within each sequence, then mean over sequences (GRPO).
- ``prompt``: for each prompt, sum the token losses of its G generations and divide by their total
  token count; then average over prompts, so every prompt weighs the same (ScaleRL).

Empty rows and groups: a sequence (group) whose mask is all zero contributes 0 to the numerator and
is *excluded* from the sample-level (prompt-level) mean, i.e. the mean is over non-empty sequences
(groups). A batch with no masked token at all gives a zero that stays connected to the autograd
graph of ``token_loss`` (so ``backward()`` works and yields zero gradients).

Micro-batching: :func:`aggregation_totals` counts the whole batch once and
:func:`aggregation_weight` gives each micro-batch (split on group boundaries for ``prompt``) the factor
that makes ``sum(weight_k * aggregate(micro_k)) == aggregate(batch)``.
"""

from __future__ import annotations

import torch

from scalerl.algo._groups import group_index, group_sum

AGGREGATIONS: tuple[str, ...] = ("token", "sample", "prompt")


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}: must be one of {', '.join(AGGREGATIONS)}")


def _masked(token_loss: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask-weighted loss with padding forced to an exact 0, float mask)."""
    if token_loss.shape != mask.shape or token_loss.dim() != 2:
        raise ValueError(
            f"token_loss and mask must both be [N, T], got {tuple(token_loss.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(token_loss.dtype)
    # torch.where (not l * m) so NaN/inf in padded positions cannot leak into the value or gradient.
    masked = torch.where(m != 0, token_loss, torch.zeros_like(token_loss)) * m
    return masked, m


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return num / torch.where(den > 0, den, torch.ones_like(den))


def aggregate(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    mode: str,
) -> torch.Tensor:
    """Aggregate a per-token loss ``[N, T]`` into a scalar (Khatri et al. 2025, Sec. 3.2).

    Args:
        token_loss: ``[N, T]`` per-token loss.
        mask: ``[N, T]`` bool or float; non-zero on generated tokens that count (a float mask acts
            as a token weight).
        group_ids: ``[N]`` prompt id per sequence (any integers, any order).
        mode: ``"token"``, ``"sample"`` or ``"prompt"`` (see the module docstring).

    Returns:
        Scalar loss. Empty sequences/groups are left out of the sample/prompt means; an entirely
        empty batch gives a graph-connected zero.
    """
    _check_mode(mode)
    masked, m = _masked(token_loss, mask)
    if mode == "token":
        return _safe_div(masked.sum(), m.sum())

    row_num, row_den = masked.sum(dim=1), m.sum(dim=1)
    if mode == "sample":
        per_row = _safe_div(row_num, row_den)
        nonempty = (row_den > 0).sum().to(per_row.dtype)
        return _safe_div(per_row.sum(), nonempty)

    if group_ids.shape != (token_loss.shape[0],):
        raise ValueError(f"group_ids must be [N]={token_loss.shape[0]}, got {tuple(group_ids.shape)}")
    inverse, num_groups = group_index(group_ids)
    g_num = group_sum(row_num, inverse, num_groups)
    g_den = group_sum(row_den, inverse, num_groups)
    per_group = _safe_div(g_num, g_den)
    nonempty = (g_den > 0).sum().to(per_group.dtype)
    return _safe_div(per_group.sum(), nonempty)


def aggregation_totals(mask: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """Counts of a whole batch used by :func:`aggregation_weight`.

    Returns ``{"tokens": sum(mask), "sequences": non-empty sequences, "groups": non-empty groups}``
    (plain floats), matching the denominators :func:`aggregate` uses.
    """
    m = mask.detach().to(torch.float64)
    row_den = m.sum(dim=1)
    inverse, num_groups = group_index(group_ids)
    g_den = group_sum(row_den, inverse, num_groups)
    return {
        "tokens": float(m.sum().item()),
        "sequences": float((row_den > 0).sum().item()),
        "groups": float((g_den > 0).sum().item()),
    }


def aggregation_weight(
    mode: str,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    total: dict[str, float],
) -> float:
    """Scale for one micro-batch's :func:`aggregate` so the micro-batch losses sum to the batch loss.

    ``total`` holds the whole batch's counts (see :func:`aggregation_totals`: keys ``tokens``,
    ``sequences``, ``groups``). The weight is the micro-batch's share of the denominator of the
    mean: ``token``: tokens_micro / tokens_total; ``sample``: non-empty sequences_micro /
    non-empty sequences_total; ``prompt``: non-empty groups_micro / non-empty groups_total. For
    ``prompt`` the micro-batches must be split on group boundaries (a group wholly inside one
    micro-batch). A zero total gives weight 0.
    """
    _check_mode(mode)
    key = {"token": "tokens", "sample": "sequences", "prompt": "groups"}[mode]
    micro = aggregation_totals(mask, group_ids)[key]
    whole = float(total[key])
    return micro / whole if whole > 0 else 0.0
