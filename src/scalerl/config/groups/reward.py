"""``reward``: the scale of the verifier's reward, 1/0 or the paper's +1/-1."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.config.options import Option, register_option


@dataclass
class RewardScale(Option):
    """A correct sample gets ``correct``, an incorrect one ``incorrect`` (a verifier's score s in
    [0, 1] maps to incorrect + s * (correct - incorrect)); a length penalty (in [-1, 0]) is added on
    this scale, as the paper and DAPO add it to +1/-1 rewards."""

    name: str = ""
    correct: float = 1.0
    incorrect: float = 0.0

    def check(self):
        if not self.correct > self.incorrect:
            return [("correct", self.correct, f"> reward.incorrect ({self.incorrect})")]
        return []


@register_option("reward", "zero_one")
@dataclass
class ZeroOne(RewardScale):
    """1 for a correct sample, 0 for an incorrect one."""

    name: str = "zero_one"
    correct: float = 1.0
    incorrect: float = 0.0


@register_option("reward", "plus_minus_one")
@dataclass
class PlusMinusOne(RewardScale):
    """+1 for a correct sample, -1 for an incorrect one (the paper's choice)."""

    name: str = "plus_minus_one"
    correct: float = 1.0
    incorrect: float = -1.0
