"""The parts of one run (:class:`Components`), built once by :func:`scalerl.loop.setup.build`, and
what the loop keeps between steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from scalerl import algo
from scalerl.generator import Generator
from scalerl.rollout.modes import AsyncMode, Placement
from scalerl.rollout.prompts import MixedSampler, PromptSampler
from scalerl.scaling import FitProtocol
from scalerl.state import RunState
from scalerl.tracking import Checkpointer, Tracker


@dataclass
class Components:
    """Everything a run is built from (once, by :func:`~scalerl.loop.setup.build`), and what the loop keeps between steps."""

    cfg: DictConfig
    out_dir: Path
    task: Any
    val: list  # validation prompts
    tokenizer: Any
    precision: Any
    trainer: Any
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
    fit_protocol: FitProtocol  # how every scaling fit of the run is made (from cfg.scaling)
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
