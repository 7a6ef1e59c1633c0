"""Structured configs: the schema every composed recipe is checked against.

Each config group (``conf/<group>/``) has one dataclass here holding the union of the
hyper-parameters its options use; ``name`` says which option was chosen. Registering these in
Hydra's ConfigStore makes the composed config *struct*: a key that is not declared here
(``loss.eps_maxx=3``) is an error, and a value of the wrong type is an error. Value ranges
(a negative epsilon, ``k=0``) are checked by :mod:`scalerl.config.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class LossConfig:
    """Policy loss (paper Sec. 3.2, Eqs. for CISPO / DAPO / GSPO / GRPO)."""

    name: str = MISSING
    eps_max: Optional[float] = None  # CISPO truncation of the IS weight
    eps_low: Optional[float] = None  # PPO-style clip, lower side
    eps_high: Optional[float] = None  # PPO-style clip, upper side


@dataclass
class AsyncModeConfig:
    """Off-policy / asynchronous setup (paper Sec. 3.1)."""

    name: str = MISSING
    minibatches: int = 8  # ppo_off_policy: batches generated with one policy, one optimiser step each
    max_lag: int = 8  # pipeline_rl: most versions the trainer may be ahead of the data it trains on
    # pipeline_rl: how many groups the generator may hold finished and unconsumed, in batches
    # (bounds staleness when the trainer is the slower side).
    max_buffered_batches: float = 1.0


@dataclass
class PrecisionConfig:
    """Numerical precision of generator and trainer (paper Sec. 3.2, FP32 LM head)."""

    name: str = MISSING
    body: str = "fp32"  # dtype of the transformer body: fp32 | bf16 | fp16
    head: str = "fp32"  # dtype of the LM head + log-softmax
    # native: real low-precision tensors; emulated: fp32 math rounded to the dtype at every layer
    # (for CPUs without native bf16); auto: native on CUDA, emulated on CPU
    impl: str = "auto"


@dataclass
class AggregationConfig:
    """How per-token losses are averaged (paper Sec. 3.2, loss aggregation)."""

    name: str = MISSING


@dataclass
class NormConfig:
    """Advantage normalisation (paper Sec. 3.2)."""

    name: str = MISSING


@dataclass
class FilterConfig:
    """Data filters (paper Sec. 3.2): zero-variance filtering and no-positive-resampling."""

    name: str = MISSING
    zero_variance: bool = True
    no_positive_resampling: bool = True
    pass_rate_threshold: float = 0.9


@dataclass
class LengthControlConfig:
    """Length control (paper Sec. 3.2): forced interruptions or a length penalty."""

    name: str = MISSING
    max_new_tokens: int = 64  # hard limit on generated tokens (truncation beyond it)
    think_budget_min: int = 0  # interruption: thinking budget drawn in [min, max]
    think_budget_max: int = 0
    answer_budget: int = 0  # interruption: tokens allowed after the phrase
    phrase: str = ""  # interruption: text appended when the budget is hit
    l_max: int = 0  # length penalty: maximum length
    l_cache: int = 0  # length penalty: soft window


@dataclass
class ModelConfig:
    """The policy model: a tiny randomly initialised transformers model, or a local/hub checkpoint."""

    name: str = MISSING
    name_or_path: Optional[str] = None  # a local path or hub name; None = build from the fields below
    arch: str = "gpt2"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = False
    # supervised warm-start (stand-in for a pretrained base), cached on disk keyed by its config
    warmstart_steps: int = 0
    warmstart_batch_size: int = 64
    warmstart_lr: float = 2e-3
    cache_dir: str = "${oc.env:SCALERL_CACHE,${oc.env:HOME,.}/.cache/scalerl}"


@dataclass
class TaskConfig:
    """The task: prompts, verifiable answers, train/validation splits."""

    name: str = MISSING
    seed: int = 1234
    # addition task
    min_digits: int = 3
    max_digits: int = 4
    warmstart_max_digits: int = 3
    warmstart_hard_frac: float = 0.0  # share of warm-start problems at max_digits
    warmstart_slip_prob: float = 0.0  # chance a warm-start scratchpad column is off by one
    num_val: int = 128
    num_train: int = 100_000
    # jsonl task (real data): one {"prompt": ..., "answer": ...} per line
    path: Optional[str] = None
    val_fraction: float = 0.05
    verifier_timeout_s: float = 2.0


@dataclass
class GeneratorConfig:
    """Rollout generation."""

    name: str = MISSING
    temperature: float = 1.0
    chunk_prompts: int = 4  # prompts generated together (pipeline_rl streams groups per chunk)


@dataclass
class TrainerConfig:
    """Optimisation (paper Sec. 2: AdamW, constant LR after warm-up)."""

    name: str = MISSING
    total_steps: int = 100
    batch_size: int = 128  # sequences per optimiser step = prompts x generations
    generations_per_prompt: int = 8
    micro_batch_size: int = 0  # sequences per forward/backward; 0 = whole batch
    share_prompts: bool = True  # compute a prompt's positions once per group, not once per sample
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    adam_eps: float = 1e-8
    weight_decay: float = 0.01
    warmup_steps: int = 0
    grad_clip: float = 1.0
    max_nonfinite_steps: int = 5
    zero_stage: int = 0  # deepspeed only
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch threads per process; 0 = all cores (split in pipeline_rl)


@dataclass
class EvalConfig:
    every: int = 25  # evaluate every N optimiser steps (and at step 0)
    num_prompts: int = 128
    samples_per_prompt: int = 4  # K: pass rate = mean over K samples at the training temperature
    log_samples: int = 8  # generations logged as an artifact per evaluation


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd
    experiment: str = "scalerl"
    run_name: Optional[str] = None
    parent_run_id: Optional[str] = None  # set by sweeps
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class ScalingConfig:
    compute_axis: str = "flops"  # flops | device_hours
    refit_every: int = 5  # refit the sigmoid every M evaluations
    min_compute_frac: float = 0.1  # points below this fraction of the budget are excluded
    method: str = "direct"  # grid | direct
    bootstrap: int = 200
    extrapolate: float = 2.0  # the plot extends the fit to this multiple of the budget


@dataclass
class LauncherConfig:
    name: str = MISSING
    max_parallel: int = 0  # local: variants at once (0 = sized to the machine)
    partition: Optional[str] = None
    gpus_per_node: int = 0
    cpus_per_task: int = 2
    mem_gb: int = 8
    timeout_min: int = 60
    array_parallelism: int = 16
    max_requeue: int = 3
    additional_parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    loss: LossConfig = MISSING
    async_mode: AsyncModeConfig = MISSING
    precision: PrecisionConfig = MISSING
    aggregation: AggregationConfig = MISSING
    norm: NormConfig = MISSING
    filter: FilterConfig = MISSING
    length_control: LengthControlConfig = MISSING
    model: ModelConfig = MISSING
    task: TaskConfig = MISSING
    generator: GeneratorConfig = MISSING
    trainer: TrainerConfig = MISSING
    launcher: LauncherConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    seed: int = 0
    out_dir: str = MISSING
    checkpoint_every: int = 10
    progress: str = "auto"  # auto | bar | log


GROUPS: tuple[str, ...] = (
    "loss",
    "async_mode",
    "precision",
    "aggregation",
    "norm",
    "filter",
    "length_control",
    "model",
    "task",
    "generator",
    "trainer",
    "launcher",
)


def register_configs() -> None:
    """Register the top-level schema in Hydra's ConfigStore.

    ``conf/config.yaml`` lists ``scalerl_schema`` first in its defaults, so every group option is
    merged into a typed, struct node: unknown keys and wrongly typed values are errors.
    """
    ConfigStore.instance().store(name="scalerl_schema", node=Config)
