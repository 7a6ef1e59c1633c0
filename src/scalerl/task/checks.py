"""Checks on a task's data, run before a run builds anything: the data file parses, the evaluation's
prompts exist, the tiny model's positions hold the longest prompt and the task has examples to
warm-start it on (:func:`scalerl.cli.preflight`)."""

from __future__ import annotations

import random

from scalerl.config import ConfigError
from scalerl.config.checks import no_warmstart_examples
from scalerl.config.schema import EvalConfig
from scalerl.task import build_task


def check_task(task, *, model, length_control, eval: EvalConfig) -> int:
    """Load the task's data (a data file is parsed here, so a bad one fails before anything is
    built) and check ``eval.num_prompts`` against its validation prompts; returns their number.
    ``task``, ``model``, ``length_control``: the run's options of those groups; ``eval``: its
    evaluation section (the tiny model's positions must hold the longest prompt and
    ``max_new_tokens``; its warm-start needs the task's examples)."""
    if task.name == "addition":  # decided by the config alone (validate)
        return int(task.num_val)
    path = getattr(task, "path", None)  # a task read from a data file names it
    built = build_task(task)
    n_val = len(built.val_prompts())
    if model.name == "tiny":  # the character tokenizer: one position per character
        longest = max(len(p.text) for p in [*built.train_prompts(), *built.val_prompts()])
        new, positions = int(length_control.max_new_tokens), int(model.max_position_embeddings)
        if longest + new > positions:
            raise ConfigError(
                "length_control.max_new_tokens",
                new,
                f"<= model.max_position_embeddings - the longest prompt ({positions} - {longest} characters"
                f" in {path if path is not None else task.name})",
            )
    if eval.num_prompts > n_val:
        where = f" in {path}" if path is not None else ""
        raise ConfigError(
            "eval.num_prompts",
            eval.num_prompts,
            f"<= {n_val}, the validation prompts task={task.name} has{where}",
        )
    warmstart = model.name == "tiny" and int(model.warmstart_steps) > 0
    if warmstart and not built.warmstart_examples(1, random.Random(0)):
        raise ConfigError(*no_warmstart_examples(model.warmstart_steps, task.name))
    return n_val
