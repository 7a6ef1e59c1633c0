"""Rollout generation: batched sampling with behaviour log-probs, policy versions and length control.

``hf`` (:class:`HFGenerator`) samples over the transformers model itself, with in-flight weight
updates between decode steps. ``vllm`` (:mod:`scalerl.generator.vllm_gen`) is the GPU option,
imported only when chosen.
"""

from __future__ import annotations

from typing import Any

import torch

from scalerl.generator.hf import HFGenerator
from scalerl.generator.sample import Sample
from scalerl.model.precision import Precision

__all__ = ["HFGenerator", "Sample", "make_generator"]


def make_generator(
    cfg: Any,
    model: torch.nn.Module,
    tokenizer: Any,
    precision: Precision,
    device: torch.device | str = "cpu",
    seed: int = 0,
):
    """The generator named by ``cfg.generator.name`` (``hf`` or ``vllm``)."""
    name = cfg.generator.name
    temperature = float(cfg.generator.temperature)
    if name == "hf":
        return HFGenerator(
            model, tokenizer, precision, cfg.length_control, temperature=temperature, device=device, seed=seed
        )
    if name == "vllm":
        from scalerl.generator.vllm_gen import VLLMGenerator

        return VLLMGenerator(
            model, tokenizer, precision, cfg.length_control, temperature=temperature, device=device, seed=seed
        )
    raise ValueError(f"unknown generator {name!r} (expected 'hf' or 'vllm')")
