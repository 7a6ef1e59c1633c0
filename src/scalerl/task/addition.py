"""The embedded task: multi-digit addition with a chain of thought.

Prompt ``0347+0589=`` (operands zero-padded to ``max_digits``). The model "thinks" with a
digit-by-digit scratchpad, least significant digit first, each step ``a+b+carry=partial``::

    7+9+0=16,4+8+1=13,3+5+1=09,0+0+0=00,</think>00936<eos>

then writes the zero-padded sum after ``</think>``; reward 1 iff that answer is right. Thinking
length matters: cut the scratchpad short (an interruption, a truncation) and the answer is a
guess. RL and validation prompts have ``min_digits..max_digits`` digits; the warm-start sees at
most ``warmstart_max_digits`` (plus a small fraction ``warmstart_hard_frac`` of full-length ones),
so RL must learn to add in columns the warm-start rarely exercised, not only sharpen it.

Overthinking: with probability ``warmstart_recheck_prob`` a warm-start solution goes over its columns
a second time before ``</think>`` (``check:`` and the same steps again), about twice the thinking a
solution needs, as a base model that talks on past its answer. Half of those stop part-way through
the re-check with the interruption phrase (``warmstart_phrase``) and then answer at once, as a base
model that follows a forced "time is up" does. So under a thinking budget between one and two
scratchpads, forced interruptions fire and cost nothing once the columns are done, while a run
without them must learn to stop re-checking before the token limit cuts the answer off.

Mixed difficulty (``operand_width="own"``, ``val_digits``, ``train_digits``): each problem written
at its own digits, ``47+85=`` with two columns and ``3470+5891=`` with four, so the thinking a problem
needs grows by 9 tokens a digit; and held-out and training sets whose mix of digits is set apart
(``{2: 0.75, 4: 0.25}``). Under a thinking budget of 20-24 tokens a 2-digit scratchpad (18) fits and a
4-digit one (36) does not: it is cut in its third column, two columns and their carries are left to
the answer, a guess, so the held-out pass rate cannot pass 0.75 however well the policy adds (the
reference ceiling by construction; ``val/pass_rate_d2`` and ``val/pass_rate_d4`` check it per tier),
while a longer budget admits both. A tier one column past the budget is not enough where the policy
trains on it: it learns to add that column in the answer.
"""

from __future__ import annotations

import random

from scalerl.task.base import THINK_END, Prompt, final_answer


class AdditionTask:
    name = "addition"

    def __init__(
        self,
        *,
        seed: int = 1234,
        min_digits: int = 3,
        max_digits: int = 4,
        warmstart_max_digits: int = 3,
        warmstart_hard_frac: float = 0.0,
        warmstart_slip_prob: float = 0.0,
        warmstart_recheck_prob: float = 0.0,
        warmstart_phrase: str = " time is up.</think>",
        num_val: int = 128,
        num_train: int = 100_000,
        operand_width: str = "common",
        val_digits: dict | None = None,
        train_digits: dict | None = None,
    ):
        self.seed = seed
        self.min_digits, self.max_digits = min_digits, max_digits
        self.ws_max_digits = warmstart_max_digits
        self.ws_hard_frac = warmstart_hard_frac
        self.ws_slip_prob = warmstart_slip_prob
        self.ws_recheck_prob = warmstart_recheck_prob
        self.ws_phrase = warmstart_phrase
        self.width = max(max_digits, warmstart_max_digits)
        self.own_width = operand_width == "own"
        self.val_digits = {int(d): float(v) for d, v in (val_digits or {}).items()}
        self.train_digits = {int(d): float(v) for d, v in sorted((train_digits or {}).items())}
        self.num_val = num_val
        self.num_train = num_train
        rng = random.Random(seed)
        self._val = []
        seen = set()
        for lo, hi in self._val_tiers():
            while True:
                a, b, d = self._draw(rng, lo, hi)
                if (a, b) in seen:
                    continue
                seen.add((a, b))
                self._val.append(self._prompt(1_000_000 + len(self._val), a, b, d))
                break
        self._val_pairs = seen
        self._train_rng_seed = seed + 1

    def _val_tiers(self) -> list[tuple[int, int]]:
        """The digit range each held-out prompt is drawn from, in order: min..max_digits for every one
        without ``val_digits``; with it, each tier's count (:func:`val_counts`) interleaved so that
        every prefix (``eval.num_prompts`` takes one) keeps the shares as nearly as counts allow."""
        if not self.val_digits:
            return [(self.min_digits, self.max_digits)] * self.num_val
        from scalerl.config.groups.task import val_counts

        counts = val_counts(self.val_digits, self.num_val)
        taken = dict.fromkeys(counts, 0)
        order = []
        for _ in range(self.num_val):  # the tier furthest behind its share next (fewer digits on ties)
            d = min(
                (t for t in counts if taken[t] < counts[t]), key=lambda t: ((taken[t] + 1) / counts[t], t)
            )
            taken[d] += 1
            order.append((d, d))
        return order

    def width_of(self, a: int, b: int) -> int:
        """The columns of a's and b's scratchpad: the common width, or (``operand_width="own"``) the
        problem's own digits."""
        return max(len(str(a)), len(str(b))) if self.own_width else self.width

    # ------------------------------------------------------------------ problems
    @staticmethod
    def _draw(rng: random.Random, lo: int, hi: int) -> tuple[int, int, int]:
        d = rng.randint(lo, hi)
        a = rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
        b = rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
        return a, b, d

    def _prompt(self, uid: int, a: int, b: int, d: int) -> Prompt:
        w = self.width_of(a, b)
        return Prompt(uid=uid, text=f"{a:0{w}d}+{b:0{w}d}=", answer=f"{a + b:0{w + 1}d}", difficulty=d)

    def scratchpad(self, a: int, b: int, *, slip_prob: float = 0.0, rng: random.Random | None = None) -> str:
        return self._work(a, b, slip_prob, rng)[0]

    def solution(self, a: int, b: int, *, slip_prob: float = 0.0, rng: random.Random | None = None) -> str:
        """Scratchpad, ``</think>``, answer. With ``slip_prob`` > 0 each column's partial sum is off by
        one with that probability, and the carry and the answer follow the slipped value (a
        consistent but wrong working: the "noisy base model" the warm-start imitates)."""
        steps, answer = self._work(a, b, slip_prob, rng)
        return f"{steps}{THINK_END}{answer}"

    def _work(self, a: int, b: int, slip_prob: float, rng: random.Random | None) -> tuple[str, str]:
        w = self.width_of(a, b)
        xs, ys = f"{a:0{w}d}", f"{b:0{w}d}"
        carry, steps, digits = 0, [], []
        for i in range(w - 1, -1, -1):
            x, y = int(xs[i]), int(ys[i])
            s = x + y + carry
            if slip_prob > 0 and rng is not None and rng.random() < slip_prob:
                s = s + 1 if s == 0 or (s < 19 and rng.random() < 0.5) else s - 1
            steps.append(f"{x}+{y}+{carry}={s:02d},")
            digits.append(str(s % 10))
            carry = s // 10
        return "".join(steps), str(carry) + "".join(reversed(digits))

    # ------------------------------------------------------------------ Task protocol
    def train_prompts(self) -> list[Prompt]:
        rng = random.Random(self._train_rng_seed)
        tiers, shares = list(self.train_digits), list(self.train_digits.values())
        out, uid = [], 0
        while len(out) < self.num_train:
            if tiers:  # each problem's digits drawn with train_digits' weights
                d = rng.choices(tiers, shares)[0]
                a, b, d = self._draw(rng, d, d)
            else:
                a, b, d = self._draw(rng, self.min_digits, self.max_digits)
            if (a, b) in self._val_pairs:
                continue
            out.append(self._prompt(uid, a, b, d))
            uid += 1
        return out

    def val_prompts(self) -> list[Prompt]:
        return list(self._val)

    def score(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if final_answer(completion) == prompt.answer else 0.0

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        out = []
        while len(out) < n:
            if rng.random() < self.ws_hard_frac:
                a, b, d = self._draw(rng, self.max_digits, self.max_digits)
            else:
                a, b, d = self._draw(rng, 1, self.ws_max_digits)
            if (a, b) in self._val_pairs:
                continue
            steps, answer = self._work(a, b, self.ws_slip_prob, rng)
            target = f"{steps}{THINK_END}{answer}"
            if rng.random() < self.ws_recheck_prob:
                recheck = f"check:{steps}"
                if rng.random() < 0.5:  # interrupted part-way through the re-check
                    target = f"{steps}{recheck[: rng.randrange(len(recheck))]}{self.ws_phrase}{answer}"
                else:
                    target = f"{steps}{recheck}{THINK_END}{answer}"
            out.append((self._prompt(-1, a, b, d).text, target))
        return out

    def think_tokens_needed(self) -> int:
        """The thinking the longest problem's scratchpad takes (every problem's, at the common width)."""
        if not self.own_width:  # every scratchpad has the common width's columns
            return len(self.scratchpad(0, 0))
        widest = max([self.width, *self.val_digits, *self.train_digits])
        return widest * len(self.scratchpad(0, 0))  # 0+0 at its own width: one column
