"""Tasks: prompts with verifiable answers, seeded train/validation splits, verifiers."""

from __future__ import annotations

from scalerl.task.addition import AdditionTask
from scalerl.task.base import THINK_END, Prompt, Task, final_answer, safe_score
from scalerl.task.jsonl import DataFileError, JsonlTask
from scalerl.task.math_tasks import ChampTask, GsmTask

# task option name -> the Task class built from that option's fields (verifier_timeout_s is the loop's)
TASKS: dict[str, type[Task]] = {
    "addition": AdditionTask,
    "jsonl": JsonlTask,
    "gsm": GsmTask,
    "champ": ChampTask,
}
_LOOP_FIELDS = ("name", "verifier_timeout_s")


def build_task(cfg) -> Task:
    """The task chosen by ``cfg.task`` (``cfg`` is the whole run config), built from its fields."""
    t = cfg.task
    if t.name not in TASKS:
        raise ValueError(f"unknown task {t.name!r} (tasks: {', '.join(TASKS)})")
    return TASKS[t.name](**{k: v for k, v in t.items() if k not in _LOOP_FIELDS})


__all__ = [
    "THINK_END",
    "AdditionTask",
    "ChampTask",
    "GsmTask",
    "DataFileError",
    "JsonlTask",
    "Prompt",
    "TASKS",
    "Task",
    "build_task",
    "final_answer",
    "safe_score",
]
