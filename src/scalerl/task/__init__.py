"""Tasks: prompts with verifiable answers, seeded train/validation splits, verifiers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from scalerl.task.addition import AdditionTask
from scalerl.task.base import THINK_END, ProgramFailed, Prompt, Task, final_answer, safe_score
from scalerl.task.code import CodeTask
from scalerl.task.jsonl import DataFileError, JsonlTask
from scalerl.task.math_tasks import ChampTask, GsmTask
from scalerl.task.multi import MultiTask

# task option name -> the Task class built from that option's fields (verifier_timeout_s is the loop's)
TASKS: dict[str, type[Task]] = {
    "addition": AdditionTask,
    "jsonl": JsonlTask,
    "code": CodeTask,
    "multi": MultiTask,
    "gsm": GsmTask,
    "champ": ChampTask,
}
_LOOP_FIELDS = ("name", "verifier_timeout_s")


def build_task(task) -> Task:
    """The task the ``task`` option chooses (its dataclass, :mod:`scalerl.config.groups.task`), built
    from its fields."""
    fields = dataclasses.asdict(task)
    if "verifier_timeout_s" not in fields:  # read by the loop (scalerl.task.score), not by the task
        raise TypeError(
            f"task option {fields.get('name')!r} has no verifier_timeout_s field: every task option "
            "declares one (scalerl.config.groups.task), the time limit the loop puts on its verifier"
        )
    return make_task(fields)


def make_task(fields: Mapping) -> Task:
    """A task from one task option's fields (``name`` picks it). A ``task=multi`` domain's settings
    are completed with that option's defaults first."""
    name = fields.get("name")
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r}: no Task class under that name in scalerl.task.TASKS"
            f" (tasks: {', '.join(TASKS)}); a task option needs its class registered there too"
        )
    if name == "multi":
        from scalerl.config.groups.task import domain_option
        from scalerl.config.validate import ConfigError

        domains = {}
        for d, sub in fields["domains"].items():
            option, problem = domain_option(dict(sub), fields["verifier_timeout_s"])
            if problem is not None:
                raise ConfigError(f"task.domains.{d}.{problem[0]}", problem[1], problem[2])
            domains[d] = dataclasses.asdict(option)
        fields = {**fields, "domains": domains}
    return TASKS[name](**{k: v for k, v in fields.items() if k not in _LOOP_FIELDS})


__all__ = [
    "THINK_END",
    "AdditionTask",
    "CodeTask",
    "MultiTask",
    "ProgramFailed",
    "make_task",
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
