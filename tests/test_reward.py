"""The reward group: 1/0 or the paper's +1/-1 on the verifier's verdict, the length penalty added on
that scale, and ``correct`` staying 1/0 so that pass rates stay fractions correct."""

from __future__ import annotations

import pytest
from parts import options, scoring_options

from scalerl.config import compose
from scalerl.generator.sample import Sample
from scalerl.task import AdditionTask
from scalerl.task.score import score_groups


def sample(text: str, length: int) -> Sample:
    ids = list(range(length))
    return Sample(
        prompt_uid=0,
        group_id=0,
        prompt_ids=[1],
        completion_ids=ids,
        logprobs=[0.0] * length,
        versions=[0] * length,
        loss_mask=[1] * length,
        text=text,
        truncated=False,
        interrupted=False,
        think_tokens=0,
    )


def scored(overrides: list[str], lengths: list[int]) -> list[Sample]:
    """Four samples of one addition prompt: right, wrong, right, wrong, with these lengths."""
    task = AdditionTask(num_val=1, num_train=1)
    prompt = task.train_prompts()[0]
    texts = [f"</think>{prompt.answer}", "</think>00000", f"</think>{prompt.answer}", "</think>1"]
    group = [sample(t, n) for t, n in zip(texts, lengths)]
    assert score_groups(task, [prompt], [group], **scoring_options(options(overrides)))["errors"] == 0
    return group


@pytest.mark.parametrize("reward,correct,incorrect", [("zero_one", 1.0, 0.0), ("plus_minus_one", 1.0, -1.0)])
def test_reward_scales(reward, correct, incorrect):
    group = scored([f"reward={reward}"], [10, 10, 60, 60])
    assert [s.reward for s in group] == [correct, incorrect, correct, incorrect]
    assert [s.correct for s in group] == [1.0, 0.0, 1.0, 0.0]  # pass rates count correct samples


def test_default_reward_is_zero_one():
    assert compose([]).reward.name == "zero_one"


@pytest.mark.parametrize("reward,incorrect", [("zero_one", 0.0), ("plus_minus_one", -1.0)])
def test_length_penalty_is_added_on_the_reward_scale(reward, incorrect):
    # l_max 56, l_cache 8: no penalty up to 48 tokens, -(|y| - 48) / 8 up to 56, -1 beyond
    lp = ["length_control=length_penalty", f"reward={reward}"]
    group = scored(lp, [40, 40, 52, 60])
    assert [s.reward for s in group] == pytest.approx([1.0, incorrect, 1.0 - 0.5, incorrect])
    assert [s.correct for s in group] == [1.0, 0.0, 1.0, 0.0]
    group = scored(lp, [60, 52, 56, 10])
    # a correct sample at the limit gets 1 - 1: the penalty never touches incorrect samples
    assert [s.reward for s in group] == pytest.approx([0.0, incorrect, 0.0, incorrect])


def test_a_reward_scale_must_rank_correct_above_incorrect():
    from scalerl.config import ConfigError

    with pytest.raises(ConfigError, match=r"reward.correct=-1.0: must be > reward.incorrect \(0.0\)"):
        compose(["reward.correct=-1"])
