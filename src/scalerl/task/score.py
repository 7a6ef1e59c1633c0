"""Rewards of generated groups: the task's verifier, then the length penalty when configured."""

from __future__ import annotations

import torch

from scalerl import algo
from scalerl.task.base import safe_score


def score_groups(task, prompts, groups, cfg) -> int:
    """Set ``correct`` (the verifier's score, 1/0: pass rates stay fractions correct) and
    ``reward`` (that score on ``cfg.reward``'s scale, plus the length penalty if configured) on
    every sample. Returns how many verifier calls failed (raised or timed out; those score 0)."""
    errors = 0
    lc = cfg.length_control
    lo, hi = float(cfg.reward.incorrect), float(cfg.reward.correct)
    for prompt, group in zip(prompts, groups):
        for s in group:
            r, err = safe_score(task, prompt, s.text, cfg.task.verifier_timeout_s)
            errors += err is not None
            s.correct = r
            s.reward = lo + r * (hi - lo)
        if lc.name == "length_penalty":
            lengths = torch.tensor([float(s.num_sampled) for s in group])
            correct = torch.tensor([s.correct for s in group])
            pen = algo.length_penalty(lengths, correct, lc.l_max, lc.l_cache)
            for s, p in zip(group, pen.tolist()):
                s.reward += p
    return errors
