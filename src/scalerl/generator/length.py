"""Length control, read once for every generator: the ``length_control`` option and the policy's
tokenizer turned into the token ids, budgets and rules that decide where a completion ends.

Both generators (:mod:`scalerl.generator.hf`, :mod:`scalerl.generator.vllm_gen`) take one
:class:`LengthControl`; what they share is here, so ``</think>`` and the interruption phrase are
tokenized once, the settings are checked once (one line each, as the config's checks say them), and
the rules below read the same in both:

* ``none`` / ``length_penalty``: a completion ends at eos or after ``max_new_tokens`` sampled
  tokens (``truncated`` if no eos). The penalty itself is a reward term (:mod:`scalerl.task.score`).
* ``interruption``: each completion draws a thinking budget ``b`` uniformly in
  ``[think_budget_min, think_budget_max]`` from the generator's random stream
  (:meth:`LengthControl.draw_budgets`). If ``</think>`` was not sampled within ``b`` thinking
  tokens, the phrase's tokens are appended (forced: log-prob 0, version -1, mask 0; the sample is
  ``interrupted``). After ``</think>`` (sampled, or the end of the phrase) at most
  ``answer_budget`` more tokens are sampled (eos included), never past ``max_new_tokens`` sampled
  tokens overall; no eos by then: ``truncated``. Thinking tokens are the sampled ones before
  ``</think>``, neither ``</think>`` nor eos.

The HF generator applies these rules to every row at once with tensor ops (one decode step at a
time); the vLLM generator runs the thinking and the answer as one engine request each
(:meth:`LengthControl.thinking_tokens`, :meth:`LengthControl.think_stop`,
:meth:`LengthControl.answer_tokens`). The limits they compute are the same ones.

The settings checked here are the ones the generators need to run at all; the config's own checks
(:class:`scalerl.config.groups.length_control.Interruption`) are stricter (budgets >= 1, thinking
plus answer within ``max_new_tokens``) and run when a config is composed. A generator built directly
(tests, benchmarks) may take the looser values, e.g. a budget over ``max_new_tokens``, where the hard
limit then ends the completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scalerl.config.options import options
from scalerl.config.validate import ConfigError

THINK_END = "</think>"


def single_token_id(tokenizer: Any, token: str) -> int | None:
    """Id of ``token`` if the tokenizer has it as one token, else None (a tokenizer without a
    ``</think>`` token: nothing ends the thinking but the budget)."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else None


@dataclass(frozen=True)
class LengthControl:
    """One ``length_control`` option over one tokenizer (build it with :meth:`build`).

    ``phrase_ids`` is empty and the budgets are 0 unless :attr:`interrupts`."""

    name: str
    max_new_tokens: int
    think_end_id: int | None = None
    think_budget_min: int = 0
    think_budget_max: int = 0
    answer_budget: int = 0
    phrase: str = ""
    phrase_ids: tuple[int, ...] = ()

    @classmethod
    def build(cls, length_control: Any, tokenizer: Any) -> LengthControl:
        """From the ``length_control`` option (the composed config's node, its dataclass, or any
        object with its fields) and the policy's tokenizer; an existing :class:`LengthControl` is
        returned as it is. Raises :class:`~scalerl.config.validate.ConfigError` (one line: the
        setting, its value, what is allowed) on a setting the generators cannot run with.

        Only the fields of the chosen option are read: the budgets and the phrase belong to
        ``interruption`` alone."""
        if isinstance(length_control, LengthControl):
            return length_control
        name = str(length_control.name)
        known = options("length_control")
        if name not in known:
            raise ConfigError("length_control.name", name, "one of " + ", ".join(known))
        max_new_tokens = int(length_control.max_new_tokens)
        if max_new_tokens < 1:
            raise ConfigError("length_control.max_new_tokens", max_new_tokens, "an integer >= 1")
        think_end_id = single_token_id(tokenizer, THINK_END)
        if name != "interruption":
            return cls(name, max_new_tokens, think_end_id)
        lo, hi = int(length_control.think_budget_min), int(length_control.think_budget_max)
        answer, phrase = int(length_control.answer_budget), str(length_control.phrase)
        if lo < 0:
            raise ConfigError("length_control.think_budget_min", lo, "an integer >= 0")
        if hi < lo:
            raise ConfigError("length_control.think_budget_max", hi, f">= think_budget_min ({lo})")
        if answer < 0:
            raise ConfigError("length_control.answer_budget", answer, "an integer >= 0")
        phrase_ids = tuple(int(i) for i in tokenizer(phrase, add_special_tokens=False)["input_ids"])
        if not phrase_ids:
            allowed = "text of at least one token (interruption forces it in at the thinking budget)"
            raise ConfigError("length_control.phrase", phrase, allowed)
        return cls(name, max_new_tokens, think_end_id, lo, hi, answer, phrase, phrase_ids)

    @property
    def interrupts(self) -> bool:
        """Whether thinking is cut at a drawn budget and the phrase forced in."""
        return self.name == "interruption"

    @property
    def max_steps(self) -> int:
        """The most tokens a completion can hold: ``max_new_tokens`` sampled ones plus the forced
        phrase (empty unless :attr:`interrupts`)."""
        return self.max_new_tokens + len(self.phrase_ids)

    @property
    def longest(self) -> int:
        """The most tokens a completion can take under these rules: :attr:`max_steps`, or when
        interrupting, where fewer, the thinking budget's maximum and the answer budget sampled and
        the phrase forced between them."""
        if not self.interrupts:
            return self.max_steps
        return min(self.max_new_tokens, self.think_budget_max + self.answer_budget) + len(self.phrase_ids)

    @property
    def answer_limit(self) -> int:
        """The answer tokens a completion may sample after ``</think>``: ``answer_budget`` when
        interrupting, else more than it can hold (only ``max_new_tokens`` ends it)."""
        return self.answer_budget if self.interrupts else self.max_steps + 1

    def draw_budgets(
        self, k: int, rng: torch.Generator, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """[k] thinking budgets: drawn uniformly in ``[think_budget_min, think_budget_max]`` from
        ``rng`` when interrupting (the only draw length control makes), else more than a completion
        can hold (``rng`` untouched)."""
        if self.interrupts:
            return torch.randint(
                self.think_budget_min, self.think_budget_max + 1, (k,), generator=rng, device=device
            )
        return torch.full((k,), self.max_steps + 1, dtype=torch.long, device=device)

    def think_stop(self, eos: list[int]) -> list[int]:
        """The tokens that end thinking: eos, and ``</think>`` where the tokenizer has it."""
        return list(eos) + ([self.think_end_id] if self.think_end_id is not None else [])

    def thinking_tokens(self, budget: int) -> int:
        """The tokens a completion may sample while thinking, given its drawn ``budget``."""
        return min(int(budget), self.max_new_tokens)

    def answer_tokens(self, sampled: int) -> int:
        """The tokens a completion that has sampled ``sampled`` may still sample for its answer (<= 0:
        none, it is truncated)."""
        return min(self.answer_budget, self.max_new_tokens - int(sampled))
