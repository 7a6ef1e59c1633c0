"""``length_control``: the hard limit, forced interruptions or a length penalty (paper Sec. 3.2)."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.config.checks import at_least, problems
from scalerl.config.options import Option, register_option


@register_option("length_control", "none")
@dataclass
class NoLengthControl(Option):
    """Only the hard limit: generations longer than max_new_tokens are truncated."""

    name: str = "none"
    max_new_tokens: int = 64  # hard limit on generated tokens

    def check(self):
        return problems(at_least("max_new_tokens", self.max_new_tokens, 1))


@register_option("length_control", "interruption")
@dataclass
class Interruption(Option):
    """Thinking stops at a budget drawn in [think_budget_min, think_budget_max]: the phrase is
    forced in and the answer gets answer_budget tokens."""

    name: str = "interruption"
    max_new_tokens: int = 64
    think_budget_min: int = 40
    think_budget_max: int = 48
    answer_budget: int = 8
    phrase: str = " time is up.</think>"

    def check(self):
        out = problems(
            at_least("max_new_tokens", self.max_new_tokens, 1),
            at_least("think_budget_min", self.think_budget_min, 1, ""),
            at_least("answer_budget", self.answer_budget, 1, ""),
        )
        if out:
            return out
        if self.think_budget_max < self.think_budget_min:
            return [
                ("think_budget_max", self.think_budget_max, f">= think_budget_min ({self.think_budget_min})")
            ]
        if self.think_budget_max + self.answer_budget > self.max_new_tokens:
            allowed = f"<= max_new_tokens - answer_budget ({self.max_new_tokens - self.answer_budget})"
            return [("think_budget_max", self.think_budget_max, allowed)]
        if not self.phrase:
            return [("phrase", self.phrase, "a non-empty string")]
        return []


@register_option("length_control", "length_penalty")
@dataclass
class LengthPenalty(Option):
    """clip((l_max - |y|) / l_cache - 1, -1, 0) added to the reward of correct traces."""

    name: str = "length_penalty"
    max_new_tokens: int = 64
    l_max: int = 56  # maximum length
    l_cache: int = 8  # soft window below l_max

    def check(self):
        out = problems(
            at_least("max_new_tokens", self.max_new_tokens, 1), at_least("l_cache", self.l_cache, 1)
        )
        if not out and self.l_max <= self.l_cache:
            out = [("l_max", self.l_max, f"> l_cache ({self.l_cache})")]
        # samples are cut at max_new_tokens: a window past it never reaches its -1
        if not out and self.l_max > self.max_new_tokens:
            out = [("l_max", self.l_max, f"<= max_new_tokens ({self.max_new_tokens})")]
        return out
