"""``generator``: the rollout sampler."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.config.checks import at_least, positive, problems
from scalerl.config.options import Option, register_option


@dataclass
class GeneratorOption(Option):
    name: str = ""
    temperature: float = 1.0
    chunk_prompts: int = 4  # prompts generated together (pipeline_rl streams groups per chunk)

    def check(self):
        return problems(
            positive("temperature", self.temperature), at_least("chunk_prompts", self.chunk_prompts, 1)
        )


@register_option("generator", "hf")
@dataclass
class HFGeneratorOption(GeneratorOption):
    """Batched sampling over the transformers model with a KV cache, weights swapped in flight."""

    name: str = "hf"


@register_option("generator", "vllm")
@dataclass
class VLLMGeneratorOption(GeneratorOption):
    """vLLM (optional extra, imported only when chosen)."""

    name: str = "vllm"
    chunk_prompts: int = 64
