"""The ScaleRL algorithm library: advantages, policy losses, aggregation, filters, length penalty.

Pure functions on tensors (no model, no I/O), after Khatri et al. 2025, "The Art of Scaling
Reinforcement Learning Compute for LLMs", Sec. 3.2, and the off-policy corrections users ablate beside
them (:mod:`scalerl.algo.correction`). Importing this package registers the built-in
losses ``cispo``, ``dapo``, ``grpo`` and ``gspo`` in :data:`LOSSES`.
"""

from scalerl.algo.advantages import NORMS, compute_advantages
from scalerl.algo.aggregation import AGGREGATIONS, aggregate, aggregation_totals, aggregation_weight
from scalerl.algo.correction import CORRECTIONS, Correction, finish_mismatch, mismatch_stats, mismatch_sums
from scalerl.algo.filters import PassRateTracker, zero_variance_mask
from scalerl.algo.length import length_penalty
from scalerl.algo.losses import loss_stats, policy_loss
from scalerl.algo.registry import LOSSES, check_loss_params, get_loss, register_loss

__all__ = [
    "AGGREGATIONS",
    "CORRECTIONS",
    "Correction",
    "finish_mismatch",
    "mismatch_stats",
    "mismatch_sums",
    "LOSSES",
    "NORMS",
    "PassRateTracker",
    "aggregate",
    "aggregation_totals",
    "aggregation_weight",
    "check_loss_params",
    "compute_advantages",
    "get_loss",
    "length_penalty",
    "loss_stats",
    "policy_loss",
    "register_loss",
    "zero_variance_mask",
]
