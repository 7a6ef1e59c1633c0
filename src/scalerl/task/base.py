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
    try:
        with _time_limit(timeout_s):
            return float(task.score(prompt, completion)), None
    except VerifierTimeout:
        return 0.0, "timeout"
    except Exception as e:  # a broken verifier must never kill the run
        return 0.0, f"error: {type(e).__name__}"
