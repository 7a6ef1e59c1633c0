"""Rewards of generated groups: the task's verifier, then the length penalty when configured."""

from __future__ import annotations

from collections import Counter

import torch

from scalerl import algo
from scalerl.task.base import score_counted


def score_groups(task, prompts, groups, cfg) -> Counter[str]:
    """Set ``reward`` (with the length penalty, if configured) and ``correct`` on every sample.
    Returns counts: ``"errors"``, the verifier calls that failed (raised or timed out), and per
    kind the programs that failed in a counted way (``task=code``: ``"timeout"``, ``"network"`` ...);
    all of those score 0."""
    counts: Counter[str] = Counter()
    lc = cfg.length_control
    for prompt, group in zip(prompts, groups):
        for s in group:
            r, err, kind = score_counted(task, prompt, s.text, cfg.task.verifier_timeout_s)
            counts["errors"] += err is not None
            if kind is not None:
                counts[kind] += 1
            s.correct = r
            s.reward = r
        if lc.name == "length_penalty":
            lengths = torch.tensor([float(s.num_sampled) for s in group])
            correct = torch.tensor([s.correct for s in group])
            pen = algo.length_penalty(lengths, correct, lc.l_max, lc.l_cache)
            for s, p in zip(group, pen.tolist()):
                s.reward = s.correct + p
    return counts
