"""``task``: prompts with verifiable answers and their train/validation splits."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from scalerl.config.checks import at_least, in_unit, positive, problems
from scalerl.config.options import Option, register_option


def distinct_problems(min_digits: int, max_digits: int) -> int:
    """How many (a, b) pairs ``task=addition`` can draw: both operands have the same number of digits."""
    if max_digits > 12:
        return 10**24  # more than any split asks for
    return sum((10 if d == 1 else 9 * 10 ** (d - 1)) ** 2 for d in range(min_digits, max_digits + 1))


@register_option("task", "addition")
@dataclass
class Addition(Option):
    """Multi-digit addition with a digit-by-digit scratchpad as the thinking; reward 1 iff the sum is right."""

    name: str = "addition"
    seed: int = 1234
    min_digits: int = 3  # RL and validation problems have min_digits..max_digits digits
    max_digits: int = 4
    warmstart_max_digits: int = 3  # warm-start problems have 1..warmstart_max_digits digits
    warmstart_hard_frac: float = 0.1  # share of warm-start problems at max_digits
    warmstart_slip_prob: float = 0.25  # chance a warm-start scratchpad column is off by one
    num_train: int = 1024
    num_val: int = 128
    verifier_timeout_s: float = 2.0

    def check(self):
        out = problems(
            at_least("min_digits", self.min_digits, 1, ""),
            at_least("warmstart_max_digits", self.warmstart_max_digits, 1, ""),
            in_unit("warmstart_hard_frac", self.warmstart_hard_frac),
            in_unit("warmstart_slip_prob", self.warmstart_slip_prob),
            at_least("num_val", self.num_val, 1),
            at_least("num_train", self.num_train, 1),
            positive("verifier_timeout_s", self.verifier_timeout_s),
        )
        if not out and self.max_digits < self.min_digits:
            out = [("max_digits", self.max_digits, f">= min_digits ({self.min_digits})")]
        n = distinct_problems(self.min_digits, self.max_digits) if not out else 0
        if not out and self.num_val >= n:
            allowed = f"< {n}, the distinct problems of {self.min_digits}..{self.max_digits} digits (some must train)"
            out = [("num_val", self.num_val, allowed)]
        return out


@register_option("task", "jsonl")
@dataclass
class Jsonl(Option):
    """A JSON-lines file, one {"prompt": ..., "answer": ...} per line, answers checked with math-verify;
    a seeded held-out fraction is the validation split."""

    name: str = "jsonl"
    path: str = MISSING  # required
    seed: int = 1234
    val_fraction: float = 0.05
    num_val: int = 1000  # at most this many validation prompts
    verifier_timeout_s: float = 2.0

    def check(self):
        return problems(
            ("path", self.path, "a path to a .jsonl file") if not self.path.strip() else None,
            in_unit("val_fraction", self.val_fraction, low_open=True, high_open=True),
            at_least("num_val", self.num_val, 1),
            positive("verifier_timeout_s", self.verifier_timeout_s),
        )
