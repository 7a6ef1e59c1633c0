"""The parts of one run (:class:`Components`), built once by :func:`scalerl.loop.setup.build`, and
what the loop keeps between steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from scalerl import algo
from scalerl.config import Config
from scalerl.generator import Generator
from scalerl.model.precision import Precision
from scalerl.rollout.modes import AsyncMode, Placement
from scalerl.rollout.prompts import MixedSampler, PromptSampler
from scalerl.scaling import FitProtocol
from scalerl.state import RunState
from scalerl.task.base import Prompt, Task
from scalerl.tracking import Checkpointer, Tracker
from scalerl.trainer import Trainer


@dataclass
class Components:
    """Everything a run is built from (once, by :func:`~scalerl.loop.setup.build`), and what the loop keeps between steps."""

    # the run's options, read once (scalerl.config.typed): what the loop reads its settings from
    config: Config
    # the composed config itself, for what needs the whole recipe as one tree: the recipe a checkpoint
    # keeps (checkpointing.check_same_recipe) and the params and config.yaml of the MLflow run
    cfg: DictConfig
    out_dir: Path
    task: Task
    val: list[Prompt]  # validation prompts
    tokenizer: PreTrainedTokenizerBase
    precision: Precision
    trainer: Trainer
    generator: Generator  # in this process, over the trainer's module: evaluation (and sync/ppo rollouts)
    source: AsyncMode  # the groups of each optimiser step
    sampler: PromptSampler | MixedSampler
    pass_rates: algo.PassRateTracker  # no-positive-resampling history
    tracker: Tracker
    ckpt: Checkpointer
    state: RunState
    placement: Placement
    device: torch.device
    devices: int  # devices the run holds (for compute/device_hours)
    n_params: int  # without embeddings (the N of the FLOPs)
    n_params_all: int
    fit_protocol: FitProtocol  # how every scaling fit of the run is made (from config.scaling)
    last_pass_rate: float = float("nan")
    final_fit: dict | None = None  # the final scaling fit's metrics, once made
    checkpointed: int = 0  # the step of the last checkpoint written (or resumed from)

    @property
    def is_main(self) -> bool:
        return self.trainer.rank == 0

    @property
    def domains(self) -> list[str]:
        """The domains of a ``task=multi`` run (none otherwise)."""
        return list(getattr(self.task, "domains", ()))
