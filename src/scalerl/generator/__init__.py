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

from scalerl.config.groups.generator import GeneratorOption
from scalerl.config.groups.placement import Colocated, PlacementOption
from scalerl.generator.base import Generator

# the built-in generators register themselves on import
from scalerl.generator.hf import HFGenerator
from scalerl.generator.length import LengthControl
from scalerl.generator.registry import GENERATORS, generator_class, get_generator, register_generator
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
    "generator_class",
    "get_generator",
    "make_generator",
    "register_generator",
]


def make_generator(
    generator: GeneratorOption,
    length_control: Any,
    model: torch.nn.Module,
    tokenizer: Any,
    precision: Precision,
    device: torch.device | str = "cpu",
    seed: int = 0,
    *,
    placement: PlacementOption | None = None,
) -> Generator:
    """The generator registered as ``generator.name`` (its option), over ``model``: its factory gets
    that option, one :class:`LengthControl` (``length_control``: the ``length_control`` option,
    built here with the tokenizer, or a LengthControl already built) and the ``placement`` option
    (where engines run; the default placement, colocated, when not given)."""
    factory = get_generator(generator.name)
    return factory(
        generator,
        LengthControl.build(length_control, tokenizer),
        model,
        tokenizer,
        precision,
        device=device,
        seed=seed,
        placement=Colocated() if placement is None else placement,
    )
