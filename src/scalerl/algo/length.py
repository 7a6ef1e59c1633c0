"""Length penalty, the paper's alternative to interruptions for length control.

Khatri et al. 2025, Sec. 3.2 ("length control"; the DAPO-style overlong penalty):
``clip((L_max - |y|) / L_cache - 1, -1, 0)`` added to the reward of correct traces
(paper: L_max = 14k, L_cache = 2k).
"""

from __future__ import annotations

import torch


def length_penalty(
    lengths: torch.Tensor,
    correct: torch.Tensor,
    l_max: float,
    l_cache: float,
) -> torch.Tensor:
    """Per-sample penalty ``[N]`` to add to the reward (Khatri et al. 2025, Sec. 3.2).

    ``clip((l_max - |y|) / l_cache - 1, -1, 0)`` for correct traces, 0 for incorrect ones: 0 while
    ``|y| <= l_max - l_cache``, falling linearly to -1 at ``|y| = l_max`` and staying -1 beyond.

    Args:
        lengths: ``[N]`` generated lengths ``|y|`` in tokens.
        correct: ``[N]`` bool, or numbers where ``> 0.5`` means correct (so 1/0 and +1/-1 both work).
        l_max: maximum length ``L_max``.
        l_cache: width ``L_cache`` (> 0) of the soft-penalty zone below ``L_max``.
    """
    if not l_cache > 0:
        raise ValueError(f"l_cache must be > 0, got {l_cache!r}")
    if lengths.shape != correct.shape:
        raise ValueError(
            f"lengths and correct must have the same shape, got {tuple(lengths.shape)} and {tuple(correct.shape)}"
        )
    dtype = lengths.dtype if torch.is_floating_point(lengths) else torch.get_default_dtype()
    y = lengths.to(dtype)
    penalty = torch.clamp((l_max - y) / l_cache - 1.0, min=-1.0, max=0.0)
    is_correct = correct if correct.dtype == torch.bool else correct > 0.5
    return torch.where(is_correct, penalty, torch.zeros_like(penalty))
