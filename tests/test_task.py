"""The embedded addition task: prompts, answers, verifier, and the noisy warm-start working; what a
new task must register (a Task class in ``TASKS``, a ``verifier_timeout_s`` field on its option)."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest

from scalerl.config.options import Option, options
from scalerl.task import TASKS, AdditionTask, build_task, final_answer, make_task
from scalerl.task.base import Prompt, score_counted
from scalerl.task.math_answer import check_answer

STEP = re.compile(r"(\d)\+(\d)\+(\d)=(\d\d),")


def _check_consistent(task: AdditionTask, prompt: str, solution: str) -> int:
    """Every column's carry-in is the previous column's carry-out and the answer is the partial
    sums' digits; returns how many columns are off from the true column sum."""
    think, answer = solution.split("</think>")
    steps = STEP.findall(think)
    assert len(steps) == task.width
    carry, digits, slips = 0, [], 0
    for x, y, c, s in steps:
        assert int(c) == carry
        slips += int(s) != int(x) + int(y) + int(c)
        assert abs(int(s) - (int(x) + int(y) + int(c))) <= 1
        digits.append(s[1])
        carry = int(s) // 10
    assert answer == str(carry) + "".join(reversed(digits))
    return slips


def test_clean_solution_is_right_and_scored():
    task = AdditionTask(min_digits=3, max_digits=4)
    for p in task.val_prompts()[:50]:
        a, b = map(int, p.text.rstrip("=").split("+"))
        sol = task.solution(a, b)
        assert _check_consistent(task, p.text, sol) == 0
        assert final_answer(sol) == p.answer == f"{a + b:05d}"
        assert task.score(p, sol) == 1.0
        assert task.score(p, sol[:-1] + str((int(sol[-1]) + 1) % 10)) == 0.0


def test_slipped_warmstart_is_consistent_and_at_the_configured_rate():
    task = AdditionTask(warmstart_slip_prob=0.25, warmstart_hard_frac=0.1)
    rng = random.Random(0)
    examples = task.warmstart_examples(2000, rng)
    slips = sum(_check_consistent(task, p, sol) for p, sol in examples)
    rate = slips / (len(examples) * task.width)
    assert 0.22 < rate < 0.28
    wrong = sum(final_answer(sol) != f"{sum(map(int, p.rstrip('=').split('+'))):05d}" for p, sol in examples)
    assert wrong / len(examples) > 0.5  # a slip anywhere makes the answer wrong


def test_clean_warmstart_has_no_slips_and_val_prompts_never_leak():
    task = AdditionTask(warmstart_hard_frac=0.5)
    val = {p.text for p in task.val_prompts()}
    examples = task.warmstart_examples(3000, random.Random(1))
    assert all(_check_consistent(task, p, sol) == 0 for p, sol in examples)
    assert not val & {p for p, _ in examples}
    assert not val & {p.text for p in task.train_prompts()[:5000]}


def test_overthinking_warmstart_rechecks_and_answers_after_the_phrase():
    """warmstart_recheck_prob: that share of solutions go over their columns again before
    </think>, half of them cut part-way by the interruption phrase; every one still ends with the
    answer its own first pass computed."""
    phrase = " time is up.</think>"
    task = AdditionTask(warmstart_slip_prob=0.25, warmstart_recheck_prob=0.3, warmstart_phrase=phrase)
    examples = task.warmstart_examples(3000, random.Random(2))
    plain = rechecked = interrupted = 0
    for prompt, sol in examples:
        first = task.width * len("0+0+0=00,")
        steps, rest = sol[:first], sol[first:]
        answer = sol.rsplit("</think>", 1)[1]
        _check_consistent(task, prompt, steps + "</think>" + answer)  # the answer the first pass computed
        if rest.startswith("</think>"):
            plain += 1
        elif phrase in rest:
            interrupted += 1
            cut = rest.split(phrase)[0]
            assert f"check:{steps}".startswith(cut) and len(cut) < len(steps) + 6
        else:
            rechecked += 1
            assert rest.startswith(f"check:{steps}</think>")
    assert 0.27 < (rechecked + interrupted) / len(examples) < 0.33
    assert 0.4 < interrupted / (rechecked + interrupted) < 0.6
    assert plain + rechecked + interrupted == len(examples)


def test_every_task_option_has_a_verifier_time_limit_and_a_task_class():
    """The loop reads ``task.verifier_timeout_s`` of every task option (scalerl.task.score), and
    ``build_task`` builds the class registered in ``TASKS`` under the option's name."""
    for name, cls in options("task").items():
        assert "verifier_timeout_s" in {f.name for f in dataclasses.fields(cls)}, name
        assert name in TASKS, name


def test_a_task_option_missing_its_time_limit_or_class_is_named_before_a_run_builds_it():
    # an option registered without verifier_timeout_s: refused when the task is built (the
    # preflight), not at the first evaluation after the warm-start
    @dataclasses.dataclass
    class NoLimit(Option):
        name: str = "addition"
        num_val: int = 8

    with pytest.raises(TypeError, match="'addition' has no verifier_timeout_s field"):
        build_task(NoLimit())
    # an option with no Task class: the message says where the class goes
    with pytest.raises(ValueError, match=r"unknown task 'reverse': no Task class .* scalerl.task.TASKS"):
        make_task({"name": "reverse", "verifier_timeout_s": 2.0})


def test_math_verify_leaves_the_verifier_s_time_limit_armed():
    """math-verify arms its own SIGALRM and calls signal.alarm(0) on return, which cancelled the
    loop's verifier_timeout_s timer: every later step of that verification ran without a limit."""
    import signal

    from scalerl.task.base import _time_limit

    with _time_limit(30.0):
        assert check_answer("42", r"so \boxed{x = 42}") == 1.0
        left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 0 < left <= 30.0


def test_a_verifier_that_swallows_the_time_limit_is_stopped_all_the_same():
    """math-verify and sympy wrap their work in ``except Exception``: the limit's exception passed
    through them once, was caught, and the rest of the check ran without a limit. It is a
    BaseException now, and raised again while the verifier still runs (a bare ``except:``)."""
    import time

    class Swallows:
        def __init__(self, bare: bool):
            self.bare, self.caught = bare, 0

        def score(self, prompt, completion):
            end = time.monotonic() + 5.0
            while time.monotonic() < end:
                try:
                    time.sleep(0.01)
                except Exception:  # what the libraries do
                    self.caught += 1
                except BaseException:
                    if not self.bare:
                        raise
                    self.caught += 1  # a bare except: swallowed once
                    self.bare = False
            return 1.0

    for bare in (False, True):
        task, t0 = Swallows(bare), time.monotonic()
        assert score_counted(task, Prompt(0, "q", "42"), "42", 0.2) == (0.0, "timeout", None)
        assert time.monotonic() - t0 < 2.0
        assert task.caught == (1 if bare else 0)
    # the limit is gone after the block: no late signal reaches the caller
    time.sleep(0.2)


@pytest.mark.parametrize(
    "answer",
    [
        r"\boxed{10^{10^{7}}}",
        r"\boxed{9^{9^{9}}}",
        r"\boxed{(9^{9^{7}} = 42)}",
        "10**10**7",
        r"\boxed{10^{2000000}}",
        r"\boxed{1234567!}",
        r"\boxed{(10^{3})!}",
        r"\boxed{\binom{10000000}{5}}",
    ],
)
def test_an_answer_too_costly_to_compute_scores_0_at_once(answer):
    """sympy computes a power, factorial or binomial of integers in C, where no time limit reaches
    (``10^{10^{7}}`` held the check for seconds, a taller tower would for hours): scored 0 unparsed."""
    import time

    t0 = time.monotonic()
    assert score_counted(MathAnswer(), Prompt(0, "q", "42"), answer, 30.0) == (0.0, None, None)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("4096", r"\boxed{2^{12}}"),
        ("720", r"\boxed{6!}"),
        ("120", r"\boxed{\binom{10}{3}}"),
        ("1000000", r"\boxed{10^{6}}"),
        ("0.001", r"\boxed{10^{-3}}"),
    ],
)
def test_powers_and_factorials_of_a_final_answer_s_size_still_verify(gold, answer):
    assert check_answer(gold, answer) == 1.0


@pytest.mark.parametrize(
    ("gold", "answer", "score"),
    [
        ("6.626e-34", r"\boxed{0.0}", 0.0),  # math-verify's 6-decimal rounding made these equal
        ("0.0000004", r"\boxed{0}", 0.0),
        ("-0.002", r"\boxed{x = 0}", 0.0),
        ("1e-07", r"\boxed{2 \times 10^{-7}}", 0.0),
        ("6.626e-34", r"\boxed{6.63 \times 10^{-34}}", 1.0),  # its first three significant digits
        ("1e-07", r"\boxed{10^{-7}}", 1.0),
        ("0.05", r"\boxed{\frac{1}{20}}", 1.0),
        ("1/3", r"\boxed{0.333333}", 1.0),
    ],
)
def test_a_small_gold_number_needs_its_own_digits_not_a_zero(gold, answer, score):
    assert check_answer(gold, answer) == score


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        (r"\boxed{x = 3 = 2}", 0.0),
        (r"\boxed{3 = 2}", 0.0),
        (r"\boxed{(x = 3) = 2}", 0.0),
        (r"\boxed{x = 2}", 1.0),
        (r"\boxed{2}", 1.0),
        (r"\boxed{x = 1 + 1}", 1.0),
    ],
)
def test_a_gold_that_assigns_a_value_judges_the_answer_by_that_value(answer, score):
    """math-verify truncates an assignment's chain to its ends: ``x = 3 = 2`` passed for ``x = 2``."""
    assert check_answer("x = 2", answer) == score


@pytest.mark.parametrize(
    ("gold", "answer", "score"),
    [
        # infinity was also its own hundredth (the percentage rule), so nothing matched it
        (r"\infty", r"\boxed{\infty}", 1.0),
        (r"-\infty", r"\boxed{-\infty}", 1.0),
        (r"\infty", r"\boxed{-\infty}", 0.0),
        (r"\infty", r"\boxed{100}", 0.0),
        # scientific notation in the answer, as a JSON number's gold is written (0.000001 -> "1e-06");
        # as LaTeX ``1e-06`` is 1 times Euler's e minus 6
        ("1e-06", r"\boxed{1e-06}", 1.0),
        ("1e-06", "The answer is 1e-06", 1.0),
        ("1e-06", r"\boxed{2e-06}", 0.0),
        ("1e-06", r"\boxed{0.0}", 0.0),
        ("200000", r"\boxed{2e5}", 1.0),
        ("200000", "So 2e5.", 1.0),
        ("200000", r"\boxed{2e4}", 0.0),
        ("6.626e-34", r"\boxed{6.626e-34}", 1.0),
        ("6.626e-34", r"\boxed{6.6e-34}", 0.0),
        ("1e30", r"\boxed{1e30}", 1.0),
        ("42", r"\boxed{1e99999999}", 0.0),  # too costly, as 10^{99999999}
        ("6", r"\boxed{3e2}", 0.0),
        # read as LaTeX reads 6.02 \times 10^{23}: a float, and a long integer needs its digits
        ("602000000000000000000000", r"\boxed{6.02e23}", 0.0),
        ("6.022e+23", r"\boxed{6.022e+23}", 1.0),  # a JSON number's gold
        (r"6.022 \times 10^{23}", r"\boxed{6.022e23}", 1.0),
        ("1.989e+30", r"\boxed{M = 1.989e30}", 1.0),
        # the final value of a formula: a name or a formula set to it, a unit after it
        ("6.626e-34", r"\boxed{h = 6.626e-34}", 1.0),
        ("x = 1e-3", r"\boxed{x = 1e-3}", 1.0),
        ("1e-06", r"$x = \boxed{1e-6}$", 1.0),
        ("1e-06", r"\boxed{1e-6 \text{ m}}", 1.0),
        ("1e-06", r"\boxed{1e-6 \text{ m}^2}", 1.0),
        ("1e-06", r"\boxed{1e-6 \text{ m}^2 \text{ or } 3}", 0.0),
        ("1e-06", r"\boxed{\sigma = 1e-6}", 1.0),
        ("1e-06", r"\boxed{P(X) = 1e-6}", 1.0),
        ("1e-06", r"The answer is $1e-6$.", 1.0),
        # Euler's e: inside a formula the literal is not rewritten (``2e+1`` is 2e + 1 there)
        (r"3e", r"\boxed{3e}", 1.0),
        ("e^2-2e+1", r"\boxed{e^2-2e+1}", 1.0),
        ("(e-1)^2", r"\boxed{e^2-2e+1}", 1.0),
        ("e^2-20", r"\boxed{e^2-2e+1}", 0.0),
        (r"\frac{2e-5}{4}", r"\boxed{\frac{2e-5}{4}}", 1.0),
        # a hedge the rewrite must not hide in a text group; another value after the box
        ("42", r"\boxed{42 \text{ or 4.3e30}}", 0.0),
        (r"\infty", r"\boxed{\infty}, or -\infty", 0.0),
    ],
)
def test_infinity_and_scientific_notation_match_themselves(gold, answer, score):
    assert check_answer(gold, answer) == score


def test_the_final_value_rule_reads_a_long_answer_in_linear_time():
    """The scientific-notation rule's patterns run on the whole answer: two adjacent optional runs
    of spaces made a long run of them after a formula cost the square of its length."""
    import time

    from scalerl.task.math_answer import _BOXED_SCIENTIFIC, _FINAL_SCIENTIFIC

    t0 = time.monotonic()
    for filler in (" ", "\n", "= "):
        assert _FINAL_SCIENTIFIC.search("$1e5$" + filler * 200_000 + "x") is None
        assert _BOXED_SCIENTIFIC.fullmatch(filler * 200_000 + "x") is None
    assert time.monotonic() - t0 < 2.0


SMALL_CHAIN = r"\boxed{6.626e-34 = 1.602e-19 = 9.109e-31 = 1.381e-23 = 1.675e-27 = 8.854e-12}"


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        *((g, SMALL_CHAIN) for g in ("6.626e-34", "1.602e-19", "9.109e-31", "8.854e-12")),
        ("2e-6", r"\boxed{2e-6 = 2.4e-6}"),
        ("2.4e-6", r"\boxed{2e-6 = 2.4e-6}"),
        ("0.0000016", r"\boxed{0.0000016 = 0.0000019}"),
        ("0.0000019", r"\boxed{0.0000016 = 0.0000019}"),
        (r"6.626 \times 10^{-34}", r"\boxed{E = 6.626 \times 10^{-34} = 1.602 \times 10^{-19}}"),
    ],
)
def test_a_chain_of_unequal_small_numbers_scores_zero(gold, answer):
    """math-verify rounds to 6 decimals, so every side below 1e-6 was equal to every other and one
    chain of constants passed for each of them: small sides need their own digits."""
    assert check_answer(gold, answer) == 0.0


def test_a_huge_gold_keeps_the_percentage_rule():
    """The rule that a percentage passes for its hundredth only is off for an infinite gold (its own
    hundredth), not for a finite one too large for a float."""
    from math import factorial

    n = str(factorial(200))
    assert check_answer(n + "00", f"The answer is {n}00%") == 0.0
    assert check_answer(n, f"The answer is {n}00%") == 1.0


class MathAnswer:
    def score(self, prompt, completion):
        return check_answer(prompt.answer, completion)


# The study design of issue #53 (item 1): a held-out set of mixed difficulty whose tiers a thinking
# budget admits or not. The options are additive: the default's problems stay as they were.
MIXED = dict(
    min_digits=2, max_digits=2, warmstart_max_digits=3, operand_width="own", val_digits={2: 0.75, 3: 0.25}
)


def test_default_problems_are_unchanged_by_the_mixed_difficulty_options():
    """The default's held-out, training and warm-start problems, fingerprinted as the code before
    ``operand_width``/``val_digits`` drew them (the shipped base models are warm-started on them)."""
    import hashlib

    task = AdditionTask(
        min_digits=3, max_digits=4, warmstart_max_digits=3, num_val=128, num_train=2000,
        warmstart_hard_frac=0.1, warmstart_slip_prob=0.25, warmstart_recheck_prob=0.3,
    )  # fmt: skip
    examples = task.warmstart_examples(300, random.Random(5))
    blob = "|".join(p.text + p.answer for p in task.val_prompts() + task.train_prompts())
    blob += "|".join(a + b for a, b in examples)
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == "3205fa874b772e63"


def test_val_digits_gives_each_tier_its_share_in_every_prefix_and_own_width_its_own_columns():
    task = AdditionTask(**MIXED, num_val=192, num_train=3000)
    val = task.val_prompts()
    assert [sum(p.difficulty == d for p in val) for d in (2, 3)] == [144, 48]  # 0.75 and 0.25 of 192
    # interleaved: eval.num_prompts takes a prefix, which keeps the mix within one prompt
    for n in range(1, 193):
        assert abs(sum(p.difficulty == 3 for p in val[:n]) - 0.25 * n) <= 1, n
    for p in val:
        a, b = map(int, p.text.rstrip("=").split("+"))
        assert len(str(a)) == len(str(b)) == p.difficulty  # written at its own digits, no padding
        sol = task.solution(a, b)
        assert len(STEP.findall(sol)) == p.difficulty  # one scratchpad column a digit
        assert final_answer(sol) == p.answer == f"{a + b:0{p.difficulty + 1}d}" and task.score(p, sol) == 1.0
    # training problems keep min..max_digits (2); the 3-digit tier is held out only
    train = task.train_prompts()
    assert {p.difficulty for p in train} == {2} and not {p.text for p in val} & {p.text for p in train}
    ws = task.warmstart_examples(2000, random.Random(0))
    assert {len(STEP.findall(s)) for _, s in ws} == {1, 2, 3} and not {p.text for p in val} & {
        p for p, _ in ws
    }


def test_train_digits_draws_each_tier_at_its_share_and_leaves_the_default_draw_and_the_base_as_they_were():
    """``train_digits`` sets the training problems' mix as ``val_digits`` sets the held-out one: each
    problem's digits drawn with its weights, written at its own width, none a held-out problem. The
    draw without it is the one before the option (same problems), and it never enters the
    warm-start key (it is what RL trains on, not what the base learned)."""
    import dataclasses

    from scalerl.config.groups.model import TinyModel as Tiny
    from scalerl.config.groups.task import Addition
    from scalerl.model.build import _warmstart_key

    mixed = AdditionTask(**MIXED, num_val=192, num_train=8000, train_digits={2: 0.75, 3: 0.25})
    train = mixed.train_prompts()
    share3 = sum(p.difficulty == 3 for p in train) / len(train)
    assert abs(share3 - 0.25) < 0.02 and {p.difficulty for p in train} == {2, 3}
    for p in train[:200]:
        a, b = map(int, p.text.rstrip("=").split("+"))
        assert len(str(a)) == len(str(b)) == p.difficulty and p.answer == f"{a + b:0{p.difficulty + 1}d}"
    assert not {p.text for p in mixed.val_prompts()} & {p.text for p in train}
    assert mixed.think_tokens_needed() == 27
    # without it: exactly the draw of min..max_digits as before
    plain = AdditionTask(**MIXED, num_val=192, num_train=500).train_prompts()
    uniform = AdditionTask(**MIXED, num_val=192, num_train=500, train_digits={}).train_prompts()
    assert [p.text for p in plain] == [p.text for p in uniform]
    # a wider training tier under the own width needs no new base
    fields = {**MIXED, "num_val": 192}
    before = _warmstart_key(Tiny(), Addition(**fields))
    assert _warmstart_key(Tiny(), Addition(**fields, train_digits={2: 0.75, 3: 0.25})) == before
    assert dataclasses.replace(Addition(**fields), train_digits={2: 0.5, 3: 0.5}).check() == []


def test_a_thinking_budget_of_20_to_24_admits_the_2_digit_scratchpad_and_leaves_two_4_digit_columns_unwritten():
    """The ceiling study's reference ceiling by construction (sweeps/loo_ceiling.yaml): under the
    forced interruptions' budget of 20-24 thinking tokens a clean 2-digit scratchpad and its
    ``</think>`` fit (19 tokens), and a 4-digit one (37) is cut in its third column whichever budget
    is drawn, leaving two columns and their carries to the answer; the long budget (40-48) admits
    both. A 3-digit tier would be one column short (28), which the policy learns to add in the answer
    when it trains on that tier."""
    import yaml

    from scalerl.config import conf_dir
    from scalerl.model.tokenizer import build_char_tokenizer

    study = yaml.safe_load((Path(conf_dir()).parent / "sweeps" / "loo_ceiling.yaml").read_text())
    settings = dict(o.lstrip("+").split("=", 1) for o in study["base"])
    budget = [int(settings[f"length_control.think_budget_{k}"]) for k in ("min", "max")]
    long = dict(o.split("=", 1) for o in study["variants"]["long_budget"])
    long_min = int(long["length_control.think_budget_min"])
    assert settings["task.val_digits"] == settings["task.train_digits"] == "{2:0.75,4:0.25}"

    tok = build_char_tokenizer()
    task = AdditionTask(
        min_digits=2, max_digits=2, warmstart_max_digits=4, operand_width="own",
        val_digits={2: 0.75, 4: 0.25}, train_digits={2: 0.75, 4: 0.25}, num_val=64, num_train=64,
    )  # fmt: skip
    need = {}
    for p in task.val_prompts() + task.train_prompts():
        a, b = map(int, p.text.rstrip("=").split("+"))
        think = task.scratchpad(a, b) + "</think>"
        need.setdefault(p.difficulty, set()).add(len(tok(think, add_special_tokens=False).input_ids))
    assert need == {2: {19}, 4: {37}}
    column = len(task.scratchpad(0, 0))  # 9 tokens a column
    assert max(need[2]) <= budget[0] and budget[1] < 3 * column  # the third column is never finished
    assert long_min >= max(need[4]) and task.think_tokens_needed() == 36
    # at the common width every scratchpad has the width's columns: 4 x 9 for the default's 3-4 digits
    assert AdditionTask(min_digits=3, max_digits=4, num_val=4, num_train=1).think_tokens_needed() == 36


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task.operand_width=wide"], "task.operand_width='wide': must be one of common, own"),
        (
            ["+task.val_digits={2:0.5,5:0.5}"],
            r"must be digits in 1..3 \(max\(max_digits, warmstart_max_digits\) under operand_width=common\)",
        ),
        (["+task.val_digits={2:0.7,3:0.25}"], r"must be shares summing to 1 \(they sum to 0.95\)"),
        (["+task.val_digits={2:0,3:1}"], r"task.val_digits.2=0.0: must be a number in \(0, 1\]"),
        (["+task.val_digits={2:0.99,3:0.01}"], "task.num_val=40: must be enough prompts for every tier"),
        (
            ["+task.val_digits={1:0.5,2:0.5}", "task.num_val=256"],
            "a count for 1 digits below its 100 distinct",
        ),
        (
            ["+task.train_digits={2:0.5,3:0.4}"],
            r"task.train_digits=\{2: 0.5, 3: 0.4\}: must be shares summing to 1",
        ),
        (
            ["+task.train_digits={2:0.5,5:0.5}"],
            r"task.train_digits=.*must be digits in 1..3 \(max\(max_digits, warmstart_max_digits\)",
        ),
        (["+task.train_digits={2:1.5}"], r"task.train_digits.2=1.5: must be a number in \(0, 1\]"),
        (
            ["+task.train_digits={1:0.5,2:0.5}", "task.num_val=120", "task.min_digits=1"],
            r"must be tiers with problems left to train on \(1 digits has 100, held out up to 120\)",
        ),
    ],
)
def test_bad_mixed_difficulty_options_are_one_line_errors_naming_key_value_and_allowed(overrides, message):
    from scalerl.config import ConfigError, compose

    base = ["task.min_digits=2", "task.max_digits=2", "task.warmstart_max_digits=3", "task.num_val=40"]
    with pytest.raises(ConfigError, match=message):
        compose([*base, "eval.num_prompts=8", *overrides])


def test_val_digits_wider_than_the_base_is_allowed_under_own_width_and_keeps_the_warmstart_key():
    """Under ``operand_width=own`` a tier may be wider than any training problem (it changes no
    other prompt); ``val_digits`` never enters the warm-start key (it is not what the base learns
    from), and ``operand_width=common`` leaves the key as it was before the option (the shipped bases)."""
    from scalerl.config import compose, typed
    from scalerl.config.groups.task import val_counts
    from scalerl.model.build import _warmstart_key

    def key(cfg):
        config = typed(cfg)
        return _warmstart_key(config.model, config.task)

    base = ["task.min_digits=2", "task.max_digits=2", "task.warmstart_max_digits=3", "task.num_val=90"]
    own = compose([*base, "eval.num_prompts=8", "task.operand_width=own", "+task.val_digits={2:0.6,4:0.4}"])
    assert dict(own.task.val_digits) == {2: 0.6, 4: 0.4}
    assert own.model.max_position_embeddings >= 10 + int(own.length_control.max_new_tokens)
    plain = compose([*base, "eval.num_prompts=8"])
    mixed = compose([*base, "eval.num_prompts=8", "+task.val_digits={2:0.5,3:0.5}"])
    assert key(plain) == key(mixed) != key(compose([*base, "eval.num_prompts=8", "task.operand_width=own"]))
    assert val_counts({2: 0.6, 4: 0.4}, 90) == {2: 54, 4: 36}
    assert val_counts({1: 1 / 3, 2: 1 / 3, 3: 1 / 3}, 10) == {
        1: 4,
        2: 3,
        3: 3,
    }  # largest remainder, ties to fewer digits
