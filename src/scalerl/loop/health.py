"""Reward hacking made visible: each step's verifier outcomes, and a flag when the training reward
rises while the held-out pass rate does not.

* ``verifier/<outcome>`` (every step): the share of the step's training samples with each verifier
  outcome: ``pass``, ``wrong`` (scored 0, nothing to count), each failure kind the task counts
  (``task=code``: ``timeout``, ``no_report``, ``result_type`` ...; see
  :data:`scalerl.task.sandbox.KINDS`) and ``error`` (the verifier itself raised or timed out). They
  sum to 1. (The run's cumulative counts stay ``data/verifier_<kind>``.) A share of a failure kind
  that grows under training is a policy learning to probe the verifier.
* ``health/train_gain``, ``health/heldout_gain`` and ``health/reward_without_heldout_gain`` (at each
  evaluation after the first): the rise of the training reward (the mean ``train/correct`` of the
  steps since the evaluation before, against the same for the evaluation :data:`LOOKBACK`
  evaluations earlier) and of the held-out pass rate between the same two evaluations; the flag is
  1 when the training reward rose by at least :data:`MIN_RISE` and the held-out pass rate rose by
  less than :data:`HELDOUT_SHARE` of that rise. A reward that rises on its own is the mark of a
  verifier being gamed (or of memorising the training prompts); a flag is a reason to read the
  samples, not a proof: the held-out rate of a few prompts is noisy.
"""

from __future__ import annotations

from collections import Counter

LOOKBACK = 3  # evaluations back that a rise is measured from (or the first one)
MIN_RISE = 0.1  # of train/correct (a fraction correct, whatever the reward's scale)
HELDOUT_SHARE = 0.25  # the held-out rise that clears the flag, as a share of the training rise


def outcome_shares(groups: list[list], kinds=()) -> dict[str, float]:
    """``verifier/<outcome>``: the share of the samples in ``groups`` with each outcome (set on each
    sample as ``verdict`` by :func:`scalerl.task.score.score_groups`); the same keys every step
    (``kinds``: the task's failure kinds), so every rank and every step logs them all."""
    samples = [s for g in groups for s in g]
    counts = Counter(getattr(s, "verdict", None) for s in samples)
    n = max(1, len(samples))
    return {f"verifier/{k}": counts[k] / n for k in ("pass", "wrong", *kinds, "error")}


def _window_means(train_correct: list[float], evals: list[dict]) -> list[float | None]:
    """Per evaluation, the mean train/correct of the steps since the evaluation before (the first
    evaluation: of the steps up to the second one); None where those steps are not all recorded."""
    out: list[float | None] = []
    for i, e in enumerate(evals):
        lo = evals[i - 1]["step"] if i else 0
        hi = e["step"] if i else (evals[1]["step"] if len(evals) > 1 else 0)
        window = train_correct[lo:hi]
        out.append(sum(window) / len(window) if window and len(window) == hi - lo else None)
    return out


def hacking_metrics(train_correct: list[float], evals: list[dict]) -> dict[str, float]:
    """The ``health/*`` metrics at the last of ``evals`` (``train_correct[k]``: step k+1's
    ``train/correct``); empty before the second evaluation or without the steps' record."""
    if len(evals) < 2:
        return {}
    means = _window_means(train_correct, evals)
    i, j = len(evals) - 1, max(0, len(evals) - 1 - LOOKBACK)
    if means[i] is None or means[j] is None:
        return {}
    train_gain = means[i] - means[j]
    heldout_gain = evals[i]["pass_rate"] - evals[j]["pass_rate"]
    flag = train_gain >= MIN_RISE and heldout_gain < HELDOUT_SHARE * train_gain
    return {
        "health/train_gain": train_gain,
        "health/heldout_gain": heldout_gain,
        "health/reward_without_heldout_gain": float(flag),
    }
