"""From one optimiser step's scored groups to the trainer's batch: filters, advantages, collation
and the step's statistics. Pure functions of their arguments (with several trainer processes they
also combine every rank's groups through :mod:`scalerl.loop.collective`, collectively)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from scalerl import algo
from scalerl.generator.sample import Sample
from scalerl.loop import collective
from scalerl.trainer import TrainBatch, collate

# what a skipped step (every group filtered out on every rank) logs for the trainer's statistics
TRAINER_KEYS = (
    "loss",
    "grad_norm",
    "entropy",
    "gen_train_logprob_diff",
    "is_ratio_mean",
    "is_ratio_max",
    "clip_fraction",
)


@dataclass
class Prepared:
    batch: TrainBatch | None  # this rank's groups that survived the filters (None: none)
    train: bool  # some rank has groups to train on: every rank takes the (collective) step
    stats: dict[str, float]  # this rank's statistics of the step's groups
    counts: dict[str, float]  # this rank's dropped groups, generated and trained tokens
    samples: int  # samples the statistics are means over
    lags: int  # policy-lag entries the lag statistics are over


def mean(xs) -> float:
    """Mean of numbers or flags; 0.0 for none."""
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else 0.0


def quantile(xs, q: float) -> float:
    """The smallest value with at least a share ``q`` of ``xs`` at or below it (``xs`` not empty)."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def prepare_batch(
    groups: list[list[Sample]],
    *,
    version: int,
    zero_variance: bool,
    norm: str,
    pad_id: int,
    exclude_truncated: bool = False,
) -> Prepared:
    """Filter ``groups`` (scored, ``P`` groups of ``G`` samples) for the trainer at policy ``version``.

    ``exclude_truncated``: samples cut off at the token budget leave the effective batch before
    anything else (the paper's choice: their reward says nothing about the answer), so their group's
    advantages are computed over the rest; a group left empty is dropped. ``zero_variance``: groups
    whose rewards are all equal (zero advantage) are dropped. Advantages are normalised with ``norm``
    over every rank's kept groups. The step's statistics are over all generated samples;
    ``data/zero_variance_groups_step`` counts zero-variance groups whether or not they are dropped
    (the report tells a filter that had nothing to drop from one that acted)."""
    samples = [s for g in groups for s in g]
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    gids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    stats = {
        "train/reward": float(rewards.mean()),
        "train/correct": mean(s.correct for s in samples),
        "train/truncation_rate": mean(s.truncated for s in samples),
        "train/interruption_rate": mean(s.interrupted for s in samples),
        "train/response_length": mean(s.num_tokens for s in samples),
        "train/think_length": mean(s.think_tokens for s in samples),
    }
    keep_groups = groups
    if exclude_truncated:
        keep_groups = [[s for s in g if not s.truncated] for g in groups]
        stats["data/truncated_excluded_step"] = float(len(samples) - sum(len(g) for g in keep_groups))
        keep_groups = [g for g in keep_groups if g]
        rewards = torch.tensor([s.reward for g in keep_groups for s in g], dtype=torch.float32)
        gids = torch.tensor([i for i, g in enumerate(keep_groups) for _ in g], dtype=torch.long)
    keep = algo.zero_variance_mask(rewards, gids)
    kept_idx = sorted({int(i) for i in gids[keep].tolist()})
    stats["data/zero_variance_groups_step"] = float(len(keep_groups) - len(kept_idx))
    dropped = 0
    if zero_variance:
        dropped = len(keep_groups) - len(kept_idx)
        stats["data/zero_variance_dropped_step"] = float(dropped)
        keep_groups = [keep_groups[i] for i in kept_idx]
    # policy lag of the tokens trained on (paper Sec. 3.1): how many versions behind the trainer
    # the policy that sampled each token was
    lags = [version - v for s in samples for v in s.versions if v >= 0]
    stats["train/policy_lag_mean"] = mean(lags) if lags else 0.0
    stats["train/policy_lag_max"] = float(max(lags)) if lags else 0.0
    stats["train/policy_lag_p90"] = float(quantile(lags, 0.9)) if lags else 0.0
    stats["train/versions_in_batch"] = float(len({v for s in samples for v in s.versions if v >= 0}))
    stats["train/groups_trained"] = float(len(keep_groups))
    # only pipeline_rl (one trainer process) updates weights in flight, so only its samples carry it
    gaps = [s.stale_kv_gap for s in samples if s.stale_kv_gap is not None]
    if gaps:
        stats["gen/stale_kv_logprob_gap"] = mean(gaps)

    batch, trained_tokens = None, 0
    train = bool(collective.global_sum(len(keep_groups)))
    if train:
        flat = [s for g in keep_groups for s in g]
        r = torch.tensor([s.reward for s in flat], dtype=torch.float32)
        gi = torch.tensor([i for i, g in enumerate(keep_groups) for _ in g], dtype=torch.long)
        adv = collective.global_advantages(r, gi, norm)  # norm=batch: std over all ranks
        batch = collate(keep_groups, adv, pad_id) if keep_groups else None
        trained_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in flat)
    else:  # every group was filtered out: nothing to train on this step
        stats.update({f"train/{k}": float("nan") for k in TRAINER_KEYS})
        stats["train/step_skipped"] = 1.0
    counts = {
        **{f"lag/{k}": float(n) for k, n in Counter(lags).items()},  # tokens per policy lag
        "dropped": dropped,
        "gen_tokens": sum(len(s.completion_ids) for s in samples),
        "trained_tokens": trained_tokens,
    }
    return Prepared(batch, train, stats, counts, samples=len(samples), lags=len(lags))


def step_statistics(prepared: Prepared, trainer_stats: dict[str, float]) -> tuple[dict, dict]:
    """(statistics of every rank's groups with the trainer's, counts summed over ranks)."""
    stats = {**prepared.stats, **trainer_stats}
    return collective.reduce_step(stats, prepared.counts, samples=prepared.samples, lags=prepared.lags)
