"""Tasks: prompts with verifiable answers, seeded train/validation splits, verifiers."""

from __future__ import annotations

from scalerl.task.addition import AdditionTask
from scalerl.task.base import THINK_END, Prompt, Task, final_answer, safe_score
from scalerl.task.jsonl import DataFileError, JsonlTask


def build_task(cfg) -> Task:
    """The task named by ``cfg.task.name`` (``cfg`` is the whole run config)."""
    t = cfg.task
    if t.name == "addition":
        return AdditionTask(
            seed=t.seed,
            min_digits=t.min_digits,
            max_digits=t.max_digits,
            warmstart_max_digits=t.warmstart_max_digits,
            warmstart_hard_frac=t.warmstart_hard_frac,
            warmstart_slip_prob=t.warmstart_slip_prob,
            num_val=t.num_val,
            num_train=t.num_train,
        )
    if t.name == "jsonl":
        return JsonlTask(t.path, seed=t.seed, val_fraction=t.val_fraction, num_val=t.num_val)
    raise ValueError(f"unknown task {t.name!r}")


__all__ = [
    "THINK_END",
    "AdditionTask",
    "DataFileError",
    "JsonlTask",
    "Prompt",
    "Task",
    "build_task",
    "final_answer",
    "safe_score",
]
