"""Checks on a task's data, run before a run builds anything: the data file parses, the evaluation's
prompts exist, the tiny model's positions hold the longest prompt and the task has examples to
warm-start it on (:func:`scalerl.cli.preflight`)."""

from __future__ import annotations

import random

from omegaconf import DictConfig

from scalerl.config import ConfigError
from scalerl.config.checks import no_warmstart_examples
from scalerl.task import build_task


def check_task(cfg: DictConfig) -> int:
    """Load the task's data (a data file is parsed here, so a bad one fails before anything is
    built) and check ``eval.num_prompts`` against its validation prompts; returns their number."""
    if cfg.task.name == "addition":  # decided by the config alone (validate)
        return int(cfg.task.num_val)
    task = build_task(cfg)
    n_val = len(task.val_prompts())
    if cfg.model.name == "tiny":  # the character tokenizer: one position per character
        longest = max(len(p.text) for p in [*task.train_prompts(), *task.val_prompts()])
        new, positions = int(cfg.length_control.max_new_tokens), int(cfg.model.max_position_embeddings)
        if longest + new > positions:
            raise ConfigError(
                "length_control.max_new_tokens",
                new,
                f"<= model.max_position_embeddings - the longest prompt ({positions} - {longest} characters"
                f" in {cfg.task.path if 'path' in cfg.task else cfg.task.name})",
            )
    if cfg.eval.num_prompts > n_val:
        where = f" in {cfg.task.path}" if "path" in cfg.task else ""
        raise ConfigError(
            "eval.num_prompts",
            cfg.eval.num_prompts,
            f"<= {n_val}, the validation prompts task={cfg.task.name} has{where}",
        )
    warmstart = cfg.model.name == "tiny" and int(cfg.model.warmstart_steps) > 0
    if warmstart and not task.warmstart_examples(1, random.Random(0)):
        raise ConfigError(*no_warmstart_examples(cfg.model.warmstart_steps, cfg.task.name))
    return n_val
