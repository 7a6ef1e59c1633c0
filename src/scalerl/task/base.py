"""What every task provides: prompts with verifiable answers, splits, and a verifier."""

from __future__ import annotations

import random
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


class VerifierTimeout(BaseException):
    """A verifier ran past its time limit. A ``BaseException``, so that a library's ``except
    Exception`` (math-verify and sympy wrap their work in them) cannot swallow it and let the rest
    of the check run without a limit."""


class ProgramFailed(Exception):
    """Raised by a verifier that runs the completion as a program (``task=code``) when the program
    failed in a way worth counting (an infinite loop, a fork bomb, a network attempt ...): it scores
    0 and is counted under ``kind`` (the loop logs ``data/verifier_<kind>``)."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@contextmanager
def _time_limit(seconds: float):
    """Raise :class:`VerifierTimeout` in the block once it has run ``seconds``, and again every
    ``_REPEAT_S`` after that while it still runs (a bare ``except:`` that swallowed the first one
    does not end the limit). SIGALRM works only in the main thread; elsewhere the verifier runs
    without a limit."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return
    armed = [True]

    def handler(signum, frame):
        if armed[0]:  # a late signal, after the block, raises nothing
            raise VerifierTimeout(f"verifier took longer than {seconds}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds, _REPEAT_S)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_REPEAT_S = 0.05


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
