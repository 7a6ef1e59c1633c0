"""What a trainer hands a generator after an optimiser step: its policy's weights, by reference.

A generator that samples from the trainer's own module (the HF generator in the trainer's
process) only needs to know that ``module`` is its model; one that holds a copy (another process,
vLLM) materialises :meth:`PolicyWeights.tensors`, which gathers partitioned parameters first
(ZeRO-3: a collective, so every rank must call it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class PolicyWeights:
    module: nn.Module  # the trainer's live policy
    # context in which every parameter of ``module`` is whole (ZeRO-3 gathers them); collective
    gathered: Callable[[], AbstractContextManager] = field(default=contextlib.nullcontext)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight of the policy, as CPU copies (``state_dict`` names)."""
        with self.gathered(), torch.no_grad():
            return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}
