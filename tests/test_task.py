"""The embedded addition task: prompts, answers, verifier, and the noisy warm-start working; what a
new task must register (a Task class in ``TASKS``, a ``verifier_timeout_s`` field on its option)."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest

from scalerl.config.options import options
from scalerl.task import TASKS, AdditionTask, build_task, final_answer, make_task
from scalerl.task.base import check_answer

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
    cfg = type("Cfg", (), {"task": {"name": "addition", "num_val": 8}})()
    with pytest.raises(TypeError, match="'addition' has no verifier_timeout_s field"):
        build_task(cfg)
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
