"""Off-policy correction between the policy that generated and the policy that trains, and the
diagnostics of that gap.

Three policies meet in a step: the generator's ``mu`` (its log-probs recorded at sampling time,
``gen_logp``: another process, another precision or kernel, and under ``pipeline_rl`` or
``ppo_off_policy`` older weights), the trainer's *proximal* policy ``pi_prox`` (its weights before
this step) and the policy being trained ``pi_theta``. Every loss of :mod:`scalerl.algo.losses` takes
one ratio ``rho = pi_theta / mu``, so generator/trainer mismatch and staleness share one clip.
A correction separates them (the decoupled objective of Hilton et al. 2021, "Batch size-invariance
for policy optimization", as AReaL and verl's rollout correction use it):

    loss_t = w_t * L(pi_theta / pi_prox)_t,   w = pi_prox / mu (behaviour weight, detached)

the loss ``L`` clipping ``pi_theta / pi_prox``, and the behaviour weight ``w`` correcting for what
the generator did differently, used whole (``decoupled``), truncated at a threshold (``tis``:
``min(w, C)``; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training", verl's ``rollout_is``) or masked outside a band (``mis``: ``w * 1[lower <= w <= C]``;
Liu et al. 2025, "When speed kills stability", verl's rollout rejection sampling), at token level or at
sequence level. A sequence's weight is the exponential of the *mean* of its tokens' log-ratios (the
geometric mean of the token weights), so its length does not explode it (TRL #5814 summed them).

The trainer takes one optimiser step per batch: its proximal policy is the policy the step's forward
runs, so ``pi_prox``'s log-probs are that forward's, detached, with no second pass, and
``pi_theta / pi_prox`` is 1 in value (its gradient is the policy gradient): the loss's clip does not
fire, and the behaviour weight does the work the clip against ``mu`` did. ``none`` is today's
``L(pi_theta / mu)``, bit for bit.

Generators sample from the full tempered distribution (no top-p or top-k setting exists in scalerl),
and the trainer's log-probs are at the same temperature, so ``w`` compares like with like; a
generator that truncated its distribution would have to record the truncated log-probs (TRL #6789).

Diagnostics (:func:`mismatch_stats`, every step, every option): with ``r = pi_train / mu`` on tokens
drawn from ``mu``, the k3 estimate of KL(mu || pi_train) ``r - 1 - log r`` (Schulman's k3), the
chi-squared divergence ``E[r^2] - 1``, at token level and at sequence level (``r`` a sequence's
geometric-mean ratio), the normalised effective sample size ``(sum w)^2 / (n sum w^2)`` of the
weights the loss used (the raw ``r`` under ``none``), and the share of tokens and sequences the
correction truncated or masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CORRECTIONS = ("none", "decoupled", "tis", "mis")
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class Correction:
    """One correction option: ``name`` (:data:`CORRECTIONS`), its ``level`` (:data:`LEVELS`) and its
    thresholds (``tis``: ``threshold`` = C; ``mis``: ``lower <= w <= threshold``)."""

    name: str = "none"
    level: str = "token"
    threshold: float = math.inf
    lower: float = 0.0

    def __post_init__(self):
        if self.name not in CORRECTIONS:
            raise ValueError(f"correction {self.name!r}: must be one of {', '.join(CORRECTIONS)}")
        if self.level not in LEVELS:
            raise ValueError(f"correction.level={self.level!r}: must be one of {', '.join(LEVELS)}")
        if not self.threshold > 0:
            raise ValueError(f"correction.threshold={self.threshold!r}: must be a number > 0")
        if not 0 <= self.lower < self.threshold:
            raise ValueError(f"correction.lower={self.lower!r}: must be in [0, threshold={self.threshold})")

    @property
    def decoupled(self) -> bool:
        """Whether the loss's ratio is taken against the proximal policy (every option but none)."""
        return self.name != "none"


NONE = Correction()


def _mask(mask: torch.Tensor) -> torch.Tensor:
    return mask != 0 if mask.dtype != torch.bool else mask


def log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """``log(p / ref)`` per token ``[N, T]``, or at ``level="sequence"`` each sequence's mean over its
    masked tokens, broadcast over them; 0 on unmasked positions (padding may hold -inf)."""
    m = _mask(mask)
    diff = torch.where(m, logp - ref_logp, torch.zeros_like(logp))
    if level == "token":
        return diff
    n = m.sum(dim=1, keepdim=True)
    mean = diff.sum(dim=1, keepdim=True) / n.clamp(min=1)
    return torch.where(m, mean.expand_as(diff), torch.zeros_like(diff))


def behaviour_weights(
    prox_logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor, correction: Correction
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights, truncated, masked), each ``[N, T]`` (no gradient): the weight each token's loss is
    multiplied by, and where the correction truncated it (``tis``: ``w > C``) or masked it (``mis``:
    ``w`` outside ``[lower, C]``, weight 0). Unmasked positions get weight 0."""
    m = _mask(mask)
    with torch.no_grad():
        w = torch.exp(log_ratio(prox_logp.detach(), gen_logp.detach(), mask, correction.level))
        none = torch.zeros_like(m)
        if correction.name == "tis":
            truncated = m & (w > correction.threshold)
            w, masked = torch.clamp(w, max=correction.threshold), none
        elif correction.name == "mis":
            masked = m & ((w > correction.threshold) | (w < correction.lower))
            w, truncated = torch.where(masked, torch.zeros_like(w), w), none
        else:
            truncated = masked = none
        return torch.where(m, w, torch.zeros_like(w)), truncated, masked


@torch.no_grad()
def mismatch_stats(
    train_logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor, correction: Correction = NONE
) -> dict[str, float]:
    """The generator/trainer gap of one batch (``train_logp``: the trainer's log-probs before its step)
    and what the correction did to it: ``k3_token``, ``k3_seq``, ``chi2_token``, ``chi2_seq``,
    ``ess_token``, ``ess_seq`` (of the weights the loss used: the correction's, or under ``none``
    the raw ratio ``pi_train / mu``; a sequence's weight is the mean of its tokens'), ``truncated_tokens``, ``truncated_sequences``,
    ``masked_tokens``, ``masked_sequences`` (shares). With no masked token: k3, chi2 and the shares
    0, ESS 1. The sums behind each value (:func:`mismatch_sums`) add up across micro-batches."""
    return finish_mismatch(mismatch_sums(train_logp, gen_logp, mask, correction))


@torch.no_grad()
def mismatch_sums(
    train_logp: torch.Tensor, gen_logp: torch.Tensor, mask: torch.Tensor, correction: Correction = NONE
) -> dict[str, float]:
    """The sums :func:`finish_mismatch` turns into :func:`mismatch_stats`: counts, sums of k3 and of
    ``r^2``, sums of weights and squared weights, and counts truncated or masked, at both levels."""
    m = _mask(mask)
    seqs = m.any(dim=1)
    tok_log = log_ratio(train_logp, gen_logp, mask, "token")[m].double()
    seq_log = log_ratio(train_logp, gen_logp, mask, "sequence")
    n_tok = m.sum(dim=1).clamp(min=1)
    seq_log = (seq_log.sum(dim=1) / n_tok)[seqs].double()
    if correction.decoupled:
        w, truncated, masked = behaviour_weights(train_logp, gen_logp, mask, correction)
    else:
        w = torch.exp(log_ratio(train_logp, gen_logp, mask, "token"))
        truncated = masked = torch.zeros_like(m)
    w_seq = (torch.where(m, w, torch.zeros_like(w)).sum(dim=1) / n_tok)[seqs].double()
    w_tok = w[m].double()
    out = {"tokens": float(m.sum()), "sequences": float(seqs.sum())}
    for level, lr, ww, trunc, mk in (
        ("token", tok_log, w_tok, truncated[m], masked[m]),
        ("seq", seq_log, w_seq, truncated.any(dim=1)[seqs], masked.any(dim=1)[seqs]),
    ):
        r = torch.exp(lr)
        out[f"k3_{level}"] = float((r - 1 - lr).sum())
        out[f"r2_{level}"] = float((r * r).sum())
        out[f"w_{level}"] = float(ww.sum())
        out[f"w2_{level}"] = float((ww * ww).sum())
        out[f"truncated_{level}"] = float(trunc.sum())
        out[f"masked_{level}"] = float(mk.sum())
    return out


def finish_mismatch(sums: dict[str, float]) -> dict[str, float]:
    """:func:`mismatch_stats`'s values from summed :func:`mismatch_sums` (of one or more micro-batches)."""
    out = {}
    for level, count, share in (("token", "tokens", "tokens"), ("seq", "sequences", "sequences")):
        n = sums[count]
        if n == 0:
            out.update({f"k3_{level}": 0.0, f"chi2_{level}": 0.0, f"ess_{level}": 1.0})
            out.update({f"truncated_{share}": 0.0, f"masked_{share}": 0.0})
            continue
        w, w2 = sums[f"w_{level}"], sums[f"w2_{level}"]
        out[f"k3_{level}"] = sums[f"k3_{level}"] / n
        out[f"chi2_{level}"] = sums[f"r2_{level}"] / n - 1
        out[f"ess_{level}"] = w * w / (n * w2) if w2 > 0 else 0.0
        out[f"truncated_{share}"] = sums[f"truncated_{level}"] / n
        out[f"masked_{share}"] = sums[f"masked_{level}"] / n
    return out


__all__ = [
    "CORRECTIONS",
    "LEVELS",
    "NONE",
    "Correction",
    "behaviour_weights",
    "finish_mismatch",
    "log_ratio",
    "mismatch_stats",
    "mismatch_sums",
]
