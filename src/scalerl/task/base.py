"""What every task provides: prompts with verifiable answers, splits, and a verifier."""

from __future__ import annotations

import random
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

THINK_END = "</think>"


@dataclass(frozen=True)
class Prompt:
    uid: int  # stable id within its split (train uids and val uids are disjoint)
    text: str  # what the model is given
    answer: str  # the reference answer
    difficulty: int = 0  # task-specific (addition: number of digits)
    domain: str = ""  # task=multi: which domain (task) the prompt comes from


class Task(Protocol):
    name: str

    def train_prompts(self) -> list[Prompt]: ...

    def val_prompts(self) -> list[Prompt]: ...

    def score(self, prompt: Prompt, completion: str) -> float:
        """Reward of ``completion`` (the generated text after the prompt); may raise."""
        ...

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """(prompt text, target completion) pairs for the supervised warm-start."""
        ...


def final_answer(completion: str) -> str:
    """The text after the last ``</think>`` (the whole completion if there is none), stripped."""
    idx = completion.rfind(THINK_END)
    return (completion[idx + len(THINK_END) :] if idx >= 0 else completion).strip()


class VerifierTimeout(Exception):
    pass


class ProgramFailed(Exception):
    """Raised by a verifier that runs the completion as a program (``task=code``) when the program
    failed in a way worth counting (an infinite loop, a fork bomb, a network attempt ...): it scores
    0 and is counted under ``kind`` (the loop logs ``data/verifier_<kind>``)."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


# a plain number as data files write it, which LaTeX would misread: digits grouped by spaces
# (``1 000 000`` is 1 0 0 0 0 0 0 multiplied, i.e. 0) and scientific notation (``1e3`` is 3e)
_GROUPED = re.compile(r"[-+]?\d{1,3}(?:[ \u2009\u202f]\d{3})+(?:\.\d+)?")
_SCIENTIFIC = re.compile(r"([-+]?\d+(?:\.\d+)?)[eE]([-+]?\d+)")


def gold_latex(gold: str) -> str:
    """The reference answer as LaTeX: plain numbers written with grouped digits or an exponent
    rewritten (``1 000 000`` -> ``1000000``, ``1.5e-3`` -> ``1.5 \\times 10^{-3}``), the rest as is."""
    g = gold.strip()
    if _GROUPED.fullmatch(g):
        return re.sub(r"[ \u2009\u202f]", "", g)
    m = _SCIENTIFIC.fullmatch(g)
    return f"{m[1]} \\times 10^{{{m[2]}}}" if m else g


def check_answer(gold: str, completion: str) -> float:
    """1.0 iff math-verify finds the gold answer in the completion (its last ``\\boxed{}``, else
    its last number or formula), else 0.0. The gold answer is parsed as LaTeX math (so ``1/(n+1)``
    is a formula, not the number 1; :func:`gold_latex`)."""
    from math_verify import parse, verify

    gold_parsed = parse(f"${gold_latex(gold)}$")
    pred = parse(final_answer(completion))
    return 1.0 if gold_parsed and pred and verify(gold_parsed, pred) else 0.0


@contextmanager
def _time_limit(seconds: float):
    # SIGALRM works only in the main thread; elsewhere the verifier runs without a limit.
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def handler(signum, frame):
        raise VerifierTimeout(f"verifier took longer than {seconds}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def safe_score(task: Task, prompt: Prompt, completion: str, timeout_s: float) -> tuple[float, str | None]:
    """Score with a time limit; a verifier that raises or times out scores 0 and says why."""
    reward, err, _ = score_counted(task, prompt, completion, timeout_s)
    return reward, err


def score_counted(
    task: Task, prompt: Prompt, completion: str, timeout_s: float
) -> tuple[float, str | None, str | None]:
    """(reward, verifier error, program failure kind): like :func:`safe_score`, and a program that
    failed (:class:`ProgramFailed`) scores 0 with its kind (not a verifier error)."""
    try:
        with _time_limit(timeout_s):
            return float(task.score(prompt, completion)), None, None
    except ProgramFailed as e:
        return 0.0, None, e.kind
    except VerifierTimeout:
        return 0.0, "timeout", None
    except Exception as e:  # a broken verifier must never kill the run
        return 0.0, f"error: {type(e).__name__}", None
