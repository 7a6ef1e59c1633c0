"""``trainer``: the optimiser step (paper Sec. 2: AdamW, constant LR after warm-up)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl.config.checks import at_least, one_of, positive, problems
from scalerl.config.options import Option, register_option

DEVICES = ("auto", "cpu", "cuda")


@register_option("trainer", "torch")
@dataclass
class TorchTrainerOption(Option):
    """Plain PyTorch trainer."""

    name: str = "torch"
    total_steps: int = 300
    batch_size: int = 128  # sequences per optimiser step = prompts x generations
    generations_per_prompt: int = 8
    micro_batch_size: int = 0  # sequences per forward/backward; 0 = whole batch
    # the G samples of a prompt share it: its positions go through the model once per group, and the
    # samples' completions attend to that prefix (the same log-probs and gradients, fewer FLOPs)
    share_prompts: bool = True
    # the LM head (log-probs of the chosen tokens, entropy) runs over this many positions at a time,
    # each chunk's logits recomputed in the backward instead of stored: memory holds one chunk's
    # [chunk, vocabulary] logits, never a micro-batch's (2 x 3600 x 49k fp32 = 1.4 GB for SmolLM2 at
    # micro_batch_size=8); 0 = all positions of a pass at once. The same values either way
    logits_chunk_tokens: int = 1024
    # checkpoint every transformer block: its activations are recomputed in the backward (about one
    # more forward of the body per step, far less memory) instead of stored. Turns share_prompts off
    # (a replayed block would write the shared prompt's KV cache twice)
    activation_checkpointing: bool = False
    # on a CPU (Linux, glibc), allocations of this many MB or more are mmapped and returned to the
    # system when freed; glibc's default keeps a step's freed activations in its heap (at 135M the
    # trainer step's resident peak was 7.1 GB by default, 3.1 GB with 1; the real-model command sets
    # it). 0 = glibc's default (kept for the embedded model, whose tensors are small)
    malloc_mmap_threshold_mb: int = 0
    lr: float = 1.0e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adam_eps: float = 1.0e-8
    weight_decay: float = 0.01
    warmup_steps: int = 10
    grad_clip: float = 1.0  # 0 = off
    max_nonfinite_steps: int = 5
    device: str = "auto"
    threads: int = 0  # torch threads per process; 0 = all cores (split in pipeline_rl)

    def check(self):
        g, b, mb = self.generations_per_prompt, self.batch_size, self.micro_batch_size
        out = problems(
            at_least("total_steps", self.total_steps, 1),
            ("generations_per_prompt", g, "an integer >= 2 (advantages compare generations of one prompt)")
            if g < 2
            else None,
            (
                "batch_size",
                b,
                f"a positive multiple of trainer.generations_per_prompt ({g}) so the batch divides "
                "into prompts x generations",
            )
            if g >= 2 and (b < g or b % g)
            else None,
            (
                "micro_batch_size",
                mb,
                "0 (whole batch) or a multiple of generations_per_prompt dividing batch_size",
            )
            if mb < 0 or (mb and g >= 2 and (mb % g or b % mb))
            else None,
            ("logits_chunk_tokens", self.logits_chunk_tokens, "an integer >= 0 (0 = no chunks)")
            if self.logits_chunk_tokens < 0
            else None,
            at_least("malloc_mmap_threshold_mb", self.malloc_mmap_threshold_mb, 0),
            positive("lr", self.lr),
            ("betas", list(self.betas), "two numbers in [0, 1)")
            if len(self.betas) != 2 or not all(0 <= x < 1 for x in self.betas)
            else None,
            positive("adam_eps", self.adam_eps),
            at_least("weight_decay", self.weight_decay, 0, ""),
            at_least("warmup_steps", self.warmup_steps, 0, ""),
            ("grad_clip", self.grad_clip, ">= 0 (0 = off)") if not self.grad_clip >= 0 else None,
            at_least("max_nonfinite_steps", self.max_nonfinite_steps, 1, ""),
            one_of("device", self.device, DEVICES),
            ("threads", self.threads, ">= 0 (0 = all cores)") if self.threads < 0 else None,
        )
        return out


@register_option("trainer", "deepspeed")
@dataclass
class DeepSpeedTrainerOption(TorchTrainerOption):
    """DeepSpeed ZeRO (optional extra): gloo on CPU, NCCL on GPUs; the torch trainer's fields plus zero_stage."""

    name: str = "deepspeed"
    zero_stage: int = 1

    def check(self):
        out = list(super().check())
        if self.zero_stage not in (0, 1, 2, 3):
            out.append(("zero_stage", self.zero_stage, "one of 0, 1, 2, 3"))
        return out
