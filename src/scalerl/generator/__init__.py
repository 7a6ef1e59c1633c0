"""Rollout generation: batched sampling with behaviour log-probs, policy versions and length control.

Every generator implements :class:`~scalerl.generator.base.Generator`. ``hf``
(:class:`HFGenerator`) samples over the transformers model itself, with in-flight weight updates
between decode steps. ``vllm`` (:class:`~scalerl.generator.vllm_gen.VLLMGenerator`) runs a vLLM
engine; vLLM itself is imported only when one is built.
"""

from __future__ import annotations

from typing import Any

import torch

from scalerl.generator.base import Generator
from scalerl.generator.hf import HFGenerator
from scalerl.generator.sample import Sample
from scalerl.generator.vllm_gen import VLLMGenerator
from scalerl.model.precision import Precision

# generator.name -> class; each takes (model, tokenizer, precision, length_control, *, temperature, device, seed)
GENERATORS: dict[str, type[Generator]] = {"hf": HFGenerator, "vllm": VLLMGenerator}

__all__ = ["GENERATORS", "Generator", "HFGenerator", "Sample", "make_generator"]


def make_generator(
    cfg: Any,
    model: torch.nn.Module,
    tokenizer: Any,
    precision: Precision,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Generator:
    """The generator named by ``cfg.generator.name``, over ``model``."""
    name = cfg.generator.name
    cls = GENERATORS.get(name)
    if cls is None:
        raise ValueError(f"generator.name={name!r}: must be one of {', '.join(GENERATORS)}")
    extra = {
        "stale_kv_samples": int(getattr(cfg.generator, "stale_kv_samples", 4)),
        "stale_kv": str(getattr(cfg.generator, "stale_kv", "keep")),
    }
    if name == "hf":
        extra["static_cache"] = bool(cfg.generator.get("static_cache", False))
    if name == "vllm":
        g = cfg.generator
        extra.update(
            kv_cache_gib=float(g.kv_cache_gib),
            gpu_memory_utilization=float(g.gpu_memory_utilization),
            max_num_seqs=int(g.max_num_seqs),
            sleep_while_training=bool(g.get("sleep_while_training", True)),
            bucket_mb=float(cfg.placement.bucket_mb) if "placement" in cfg else 256.0,
            tensor_parallel_size=int(cfg.placement.tensor_parallel_size) if "placement" in cfg else 1,
            # placement=split: engines on GPUs of their own; otherwise the trainer's GPU is shared
            shared_gpu=not ("placement" in cfg and str(cfg.placement.name) == "split"),
        )
    return cls(
        model,
        tokenizer,
        precision,
        cfg.length_control,
        temperature=float(cfg.generator.temperature),
        device=device,
        seed=seed,
        **extra,
    )
