"""Rewards of generated groups: the task's verifier, then the length penalty when configured."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import torch

from scalerl import algo
from scalerl.config.groups.reward import RewardScale
from scalerl.task.base import score_counted


def score_groups(
    task, prompts, groups, *, reward: RewardScale, length_control, verifier_timeout_s: float
) -> Counter[str]:
    """Set ``correct`` (the verifier's score, 1/0: pass rates stay fractions correct) and
    ``reward`` (that score on the ``reward`` option's scale, plus the ``length_control`` option's
    length penalty if it is one) on every sample; each verifier call is limited to
    ``verifier_timeout_s`` (the task option's). Returns counts: ``"errors"``, the verifier calls that
    failed (raised or timed out), and per kind the programs that failed in a counted way
    (``task=code``: ``"timeout"``, ``"network"`` ...); all of those score 0."""
    counts: Counter[str] = Counter()
    lc = length_control
    lo, hi = float(reward.incorrect), float(reward.correct)
    results = iter(_verify(task, prompts, groups, verifier_timeout_s))
    for group in groups:
        for s in group:
            r, err, kind = next(results)
            counts["errors"] += err is not None
            if kind is not None:
                counts[kind] += 1
            s.correct = r
            s.verdict = verdict(r, err, kind)  # for the step's verifier/<outcome> shares
            s.reward = lo + r * (hi - lo)
        if lc.name == "length_penalty":
            lengths = torch.tensor([float(s.num_sampled) for s in group])
            correct = torch.tensor([s.correct for s in group])
            pen = algo.length_penalty(lengths, correct, lc.l_max, lc.l_cache)
            for s, p in zip(group, pen.tolist()):
                s.reward += p
    return counts


def verdict(reward: float, error: str | None, kind: str | None) -> str:
    """One sample's verifier outcome: ``error`` (the verifier failed), the program's failure ``kind``,
    ``pass`` or ``wrong``."""
    if error is not None:
        return "error"
    if kind is not None:
        return kind
    return "pass" if reward > 0 else "wrong"


def _verify(task, prompts, groups, timeout_s: float) -> list[tuple[float, str | None, str | None]]:
    """(reward, verifier error, program failure kind) of every sample, in order. Samples whose
    verifier runs the completion in a sandboxed process of its own (``task.sandboxed(prompt)``:
    ``task=code``) are verified concurrently, one thread per core (each program is limited by the
    sandbox itself); the others here, one at a time, under the ``timeout_s`` alarm."""
    jobs = [(p, s.text) for p, g in zip(prompts, groups) for s in g]
    out: list = [None] * len(jobs)
    sandboxed = getattr(task, "sandboxed", None)
    parallel = [i for i, (p, _) in enumerate(jobs) if sandboxed is not None and sandboxed(p)]
    if len(parallel) > 1:
        workers = min(len(parallel), os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verifier") as pool:
            done = pool.map(lambda i: score_counted(task, jobs[i][0], jobs[i][1], timeout_s), parallel)
            for i, res in zip(parallel, done):
                out[i] = res
    for i, (p, text) in enumerate(jobs):
        if out[i] is None:
            out[i] = score_counted(task, p, text, timeout_s)
    return out
