"""Rollout generation: batched sampling with behaviour log-probs, policy versions and length control.

Every generator implements :class:`~scalerl.generator.base.Generator` and is registered by name in
:data:`~scalerl.generator.registry.GENERATORS` (:func:`~scalerl.generator.registry.register_generator`;
the module says how to add one). ``hf`` (:class:`HFGenerator`) samples over the transformers model
itself, with in-flight weight updates between decode steps. ``vllm``
(:class:`~scalerl.generator.vllm_gen.VLLMGenerator`) runs a vLLM engine; vLLM itself is imported
only when one is built. Both take one :class:`~scalerl.generator.length.LengthControl`.
"""

from __future__ import annotations

from typing import Any

import torch

from scalerl.generator.base import Generator

# the built-in generators register themselves on import
from scalerl.generator.hf import HFGenerator
from scalerl.generator.length import LengthControl
from scalerl.generator.registry import GENERATORS, get_generator, register_generator
from scalerl.generator.sample import Sample
from scalerl.generator.vllm_gen import VLLMGenerator
from scalerl.model.precision import Precision

__all__ = [
    "GENERATORS",
    "Generator",
    "HFGenerator",
    "LengthControl",
    "Sample",
    "VLLMGenerator",
    "get_generator",
    "make_generator",
    "register_generator",
]


def make_generator(
    cfg: Any,
    model: torch.nn.Module,
    tokenizer: Any,
    precision: Precision,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Generator:
    """The generator registered as ``cfg.generator.name``, over ``model``: its factory gets the
    ``generator`` option, one :class:`LengthControl` built from ``cfg.length_control`` and the
    tokenizer, and the ``placement`` option (a composed config has all three)."""
    factory = get_generator(cfg.generator.name)
    length_control = LengthControl.build(cfg.length_control, tokenizer)
    return factory(
        cfg.generator,
        length_control,
        model,
        tokenizer,
        precision,
        device=device,
        seed=seed,
        placement=cfg.placement,
    )
