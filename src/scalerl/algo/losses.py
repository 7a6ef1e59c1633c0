"""Per-token policy losses (CISPO, DAPO, GRPO, GSPO), the aggregated policy loss and its diagnostics.

Khatri et al. 2025, Sec. 3.2 ("loss type"). Notation: ``rho_{i,t} = pi_train(y_{i,t}) / pi_gen(y_{i,t})
= exp(logp - gen_logp)``, ``A_i`` the sequence's advantage broadcast over its tokens, ``sg`` =
stop-gradient. Every loss here returns the *per-token* loss ``[N, T]`` (to be minimised);
:func:`policy_loss` aggregates it. No KL term (the paper uses none).

Padded positions (mask 0) may hold any value, including -inf log-probs: the log-ratio is zeroed
there before exponentiating and aggregation ignores them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from scalerl.algo.aggregation import aggregate
from scalerl.algo.correction import NONE, Correction, behaviour_weights
from scalerl.algo.registry import (
    LOSSES,
    check_loss_params,
    get_loss,
    positive,
    register_loss,
    unit_interval_open,
)


def _bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask != 0 if mask.dtype != torch.bool else mask


def _log_ratio(logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logp - gen_logp`` on masked tokens, 0 elsewhere (keeps padding finite)."""
    diff = logp - gen_logp
    return torch.where(_bool_mask(mask), diff, torch.zeros_like(diff))


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """``-min(ratio * A, clip(ratio, 1-eps_low, 1+eps_high) * A)`` elementwise."""
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return -torch.minimum(unclipped, clipped)


def _surrogate_clipped_tokens(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """Where ``min`` picks the clipped branch and it differs from the unclipped one (zero gradient)."""
    return ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))


# ---------------------------------------------------------------------------------------------- CISPO


def _cispo_clipped(logp, gen_logp, advantages, mask, *, eps_max: float) -> torch.Tensor:
    return torch.exp(_log_ratio(logp, gen_logp, mask)) > eps_max


@register_loss("cispo", params={"eps_max": positive}, clip_indicator=_cispo_clipped)
def cispo_loss(
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    eps_max: float,
) -> torch.Tensor:
    """CISPO per-token loss ``-sg(min(rho, eps_max)) * A * log pi_train(y_t)`` (Khatri et al. 2025, Sec. 3.2).

    The truncated importance weight is a constant, so every token, clipped or not, keeps the
    REINFORCE gradient ``-min(rho, eps_max) * A``.
    """
    weight = torch.clamp(torch.exp(_log_ratio(logp, gen_logp, mask)), max=eps_max).detach()
    return -weight * advantages.unsqueeze(1) * logp


# ------------------------------------------------------------------------------------- DAPO and GRPO


def _ppo_clipped(logp, gen_logp, advantages, mask, *, eps_low: float, eps_high: float) -> torch.Tensor:
    ratio = torch.exp(_log_ratio(logp, gen_logp, mask))
    return _surrogate_clipped_tokens(ratio, advantages.unsqueeze(1).expand_as(ratio), eps_low, eps_high)


_PPO_PARAMS = {"eps_low": unit_interval_open, "eps_high": positive}


@register_loss(
    "grpo",
    params=_PPO_PARAMS,
    clip_indicator=_ppo_clipped,
    doc="GRPO per-token loss: the DAPO surrogate, used with a symmetric clip (Khatri et al. 2025, Sec. 3.2).",
)
@register_loss(
    "dapo",
    params=_PPO_PARAMS,
    clip_indicator=_ppo_clipped,
    doc="DAPO per-token loss ``-min(rho * A, clip(rho, 1-eps_low, 1+eps_high) * A)`` (Khatri et al. 2025, Sec. 3.2).",
)
def ppo_clip_loss(
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> torch.Tensor:
    """Per-token ``-min(rho * A, clip(rho, 1-eps_low, 1+eps_high) * A)`` (Khatri et al. 2025, Sec. 3.2):
    the loss of both ``dapo`` and ``grpo``.

    DAPO: an asymmetric clip (paper: eps_low=0.2, eps_high=0.26/0.28); tokens where the clipped
    branch wins get zero gradient. GRPO: the same surrogate with a symmetric clip; GRPO as published
    also uses sample-level aggregation and prompt-level advantage norm, chosen by the
    aggregation/norm config, not here. No KL term.
    """
    ratio = torch.exp(_log_ratio(logp, gen_logp, mask))
    return _clipped_surrogate(ratio, advantages.unsqueeze(1), eps_low, eps_high)


dapo_loss = grpo_loss = ppo_clip_loss  # the names the registry gives it


# ---------------------------------------------------------------------------------------------- GSPO


def _sequence_ratio(logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``s_i = exp(mean over masked tokens of (logp - gen_logp))`` ``[N]``; 1 for empty sequences."""
    m = mask.to(logp.dtype)
    lengths = m.sum(dim=1)
    mean = (_log_ratio(logp, gen_logp, mask) * m).sum(dim=1) / torch.where(
        lengths > 0, lengths, torch.ones_like(lengths)
    )
    return torch.exp(mean)


def _gspo_clipped(logp, gen_logp, advantages, mask, *, eps_low: float, eps_high: float) -> torch.Tensor:
    seq_ratio = _sequence_ratio(logp, gen_logp, mask)
    seq_clipped = _surrogate_clipped_tokens(seq_ratio, advantages, eps_low, eps_high)
    return seq_clipped.unsqueeze(1).expand_as(logp)


@register_loss("gspo", params=_PPO_PARAMS, clip_indicator=_gspo_clipped)
def gspo_loss(
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> torch.Tensor:
    """GSPO per-token loss with the sequence-level ratio (Khatri et al. 2025, Sec. 3.2; Zheng et al. 2025).

    ``s_i = (pi_train(y_i) / pi_gen(y_i)) ** (1/|y_i|)`` (geometric mean of the token ratios), clipped
    at the sequence level. Token form ``s_{i,t} = sg(s_i) * pi(y_t) / sg(pi(y_t))``: its value is
    ``s_i`` on every token of the sequence, so the loss value is the sequence-level
    ``-min(s_i A, clip(s_i, 1-eps_low, 1+eps_high) A)`` broadcast over the tokens, while the gradient
    flows per token (``d s_{i,t} / d logp_t = s_i``). Clip widths of order 1e-3 are what the paper used.
    """
    seq_ratio = _sequence_ratio(logp, gen_logp, mask).detach()
    # Zero out padding before exp so -inf log-probs there stay harmless.
    centred = torch.where(_bool_mask(mask), logp - logp.detach(), torch.zeros_like(logp))
    tok_ratio = seq_ratio.unsqueeze(1) * torch.exp(centred)
    return _clipped_surrogate(tok_ratio, advantages.unsqueeze(1), eps_low, eps_high)


# ---------------------------------------------------------------------------------------- entry points


def _loss_params(name: str, params: Mapping[str, object]) -> dict[str, object]:
    """The params ``name`` declares, checked. ``None`` values of other keys (and ``name``) are ignored,
    so a whole ``LossConfig`` can be splatted in; any other unexpected key is an error."""
    spec = get_loss(name)
    if params.get("name", name) != name:
        raise ValueError(f"loss parameter name={params['name']!r} disagrees with the loss {name!r}")
    extra = sorted(k for k, v in params.items() if k not in spec.params and k != "name" and v is not None)
    if extra:
        raise ValueError(
            f"loss {name!r} got unexpected parameter(s) {', '.join(extra)}; "
            f"it takes: {', '.join(spec.params) or '(none)'}"
        )
    problems = check_loss_params(name, dict(params))
    if problems:
        key, value, allowed = problems[0]
        raise ValueError(f"invalid loss parameter {name}.{key}={value!r}: must be {allowed}")
    return {k: params[k] for k in spec.params}


def _check_shapes(
    logp: torch.Tensor, gen_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> None:
    if logp.dim() != 2 or logp.shape != gen_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, gen_logp and mask must all be [N, T], got {tuple(logp.shape)}, "
            f"{tuple(gen_logp.shape)} and {tuple(mask.shape)}"
        )
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be [N]={logp.shape[0]}, got {tuple(advantages.shape)}")


def policy_loss(
    name: str,
    /,
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    aggregation: str,
    correction: Correction = NONE,
    **params: object,
) -> torch.Tensor:
    """Scalar policy loss to minimise: registered per-token loss ``name`` + :func:`aggregate`.

    Khatri et al. 2025, Sec. 3.2 (loss type x loss aggregation).

    Args:
        name: a registered loss (``cispo``, ``dapo``, ``grpo``, ``gspo`` or one added with
            :func:`~scalerl.algo.registry.register_loss`); unknown -> ValueError listing them.
        logp: ``[N, T]`` trainer log-probs of the sampled tokens (carries the gradient).
        gen_logp: ``[N, T]`` generator log-probs recorded at sampling time (detached here).
        advantages: ``[N]`` per-sequence advantages (detached here).
        mask: ``[N, T]`` bool/float, non-zero on generated tokens that count.
        group_ids: ``[N]`` prompt id per sequence.
        aggregation: ``"token"``, ``"sample"`` or ``"prompt"``.
        correction: the off-policy correction (:mod:`scalerl.algo.correction`); with ``none`` the
            ratio is ``pi_train / pi_gen``, as without it. Otherwise the loss's ratio is taken
            against the proximal policy ``pi_prox`` = ``logp`` detached (the trainer's weights before
            this step: one optimiser step per batch) and each token's loss is multiplied by the
            behaviour weight ``pi_prox / pi_gen``, whole, truncated or masked.
        **params: the loss's parameters (e.g. ``eps_max=5.0``); checked with the registry's checks.
            A whole ``LossConfig`` may be splatted in: ``name`` and ``None``-valued keys the loss
            does not declare are ignored; any other undeclared key is a ValueError.
    """
    spec = get_loss(name)
    kwargs = _loss_params(name, params)
    _check_shapes(logp, gen_logp, advantages, mask)
    if not correction.decoupled:
        token_loss = spec.fn(logp, gen_logp.detach(), advantages.detach(), mask, group_ids, **kwargs)
        return aggregate(token_loss, mask, group_ids, aggregation)
    prox = logp.detach()
    token_loss = spec.fn(logp, prox, advantages.detach(), mask, group_ids, **kwargs)
    weights, _, _ = behaviour_weights(prox, gen_logp, mask, correction)
    # padding keeps its own value (it may be infinite there; aggregation leaves it out)
    token_loss = torch.where(_bool_mask(mask), token_loss * weights, token_loss)
    return aggregate(token_loss, mask, group_ids, aggregation)


@torch.no_grad()
def loss_stats(
    name: str,
    /,
    logp: torch.Tensor,
    gen_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    correction: Correction = NONE,
    **params: object,
) -> dict[str, float]:
    """Off-policy diagnostics over the masked tokens (computed without grad).

    Returns ``is_ratio_mean`` / ``is_ratio_max`` of the token ratio ``rho = exp(logp - gen_logp)``
    and ``clip_fraction``: the fraction of masked tokens where the loss's clip is active (cispo:
    ``rho > eps_max``; dapo/grpo: the clipped branch wins the ``min`` and differs, i.e. zero
    gradient; gspo: the sequence ratio is outside ``[1-eps_low, 1+eps_high]`` on the side that zeroes
    the gradient, counted on each of the sequence's tokens). With no masked token the values are
    ``1.0, 1.0, 0.0``; a registered loss without a ``clip_indicator`` reports ``clip_fraction`` NaN.
    Under a decoupled ``correction`` the clip is the loss's against the proximal policy (``logp``
    itself: it does not fire), while the ratio stays trainer / generator.
    """
    spec = get_loss(name)
    kwargs = _loss_params(name, params)
    _check_shapes(logp, gen_logp, advantages, mask)
    m = _bool_mask(mask)
    n = int(m.sum().item())
    if n == 0:
        return {"is_ratio_mean": 1.0, "is_ratio_max": 1.0, "clip_fraction": 0.0}
    ratio = torch.exp(_log_ratio(logp, gen_logp, mask))[m]
    if spec.clip_indicator is None:
        clip_fraction = math.nan
    else:
        ref = logp if correction.decoupled else gen_logp
        clipped = spec.clip_indicator(logp, ref, advantages, mask, **kwargs)
        clip_fraction = float(clipped[m].sum().item()) / n
    return {
        "is_ratio_mean": float(ratio.mean().item()),
        "is_ratio_max": float(ratio.max().item()),
        "clip_fraction": clip_fraction,
    }


__all__ = [
    "LOSSES",
    "cispo_loss",
    "dapo_loss",
    "grpo_loss",
    "gspo_loss",
    "loss_stats",
    "policy_loss",
]
