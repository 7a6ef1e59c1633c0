"""Value checks on a composed config, run before any model is built.

Hydra and the structured schema already reject unknown groups, options and keys and wrongly typed
values. This module checks *ranges and relations* (a negative epsilon, ``k=0``, a batch that does
not divide into prompts x generations, an unknown dtype) and raises :class:`ConfigError` with one
line naming the key, the value and what is allowed.
"""

from __future__ import annotations

from omegaconf import DictConfig

from scalerl.algo import registry

DTYPES = ("fp32", "bf16", "fp16")
ASYNC_MODES = ("sync", "ppo_off_policy", "pipeline_rl")
AGGREGATIONS = ("prompt", "sample", "token")
NORMS = ("batch", "prompt", "none")
LENGTH_CONTROLS = ("interruption", "length_penalty", "none")
TASKS = ("addition", "jsonl")
TRAINERS = ("torch", "deepspeed")
GENERATORS = ("hf", "vllm")
ARCHS = ("gpt2", "qwen2", "llama")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "slurm")
COMPUTE_AXES = ("flops", "device_hours")
FIT_METHODS = ("grid", "direct")
PROGRESS = ("auto", "bar", "log")


class ConfigError(ValueError):
    """A user error in the configuration; its message is one line."""

    def __init__(self, key: str, value: object, allowed: str, where: str = ""):
        self.key, self.value, self.allowed = key, value, allowed
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}invalid config value {key}={value!r}: must be {allowed}")


def _one_of(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, value, "one of " + ", ".join(choices))


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


def validate(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` on the first out-of-range or inconsistent value in ``cfg``."""
    loss = cfg.loss
    for key, value, allowed in registry.check_loss_params(loss.name, dict(loss)):
        raise ConfigError(f"loss.{key}", value, allowed)

    am = cfg.async_mode
    _one_of("async_mode.name", am.name, ASYNC_MODES)
    _check(am.minibatches >= 1, "async_mode.minibatches", am.minibatches, "an integer >= 1")
    _check(am.max_lag >= 1, "async_mode.max_lag", am.max_lag, "an integer >= 1")
    _check(am.max_buffered_batches > 0, "async_mode.max_buffered_batches", am.max_buffered_batches, "> 0")

    _one_of("precision.body", cfg.precision.body, DTYPES)
    _one_of("precision.head", cfg.precision.head, DTYPES)
    _one_of("precision.impl", cfg.precision.impl, ("auto", "native", "emulated"))
    _one_of("aggregation.name", cfg.aggregation.name, AGGREGATIONS)
    _one_of("norm.name", cfg.norm.name, NORMS)

    thr = cfg.filter.pass_rate_threshold
    _check(0 < thr <= 1, "filter.pass_rate_threshold", thr, "a number in (0, 1]")

    lc = cfg.length_control
    _one_of("length_control.name", lc.name, LENGTH_CONTROLS)
    _check(lc.max_new_tokens >= 1, "length_control.max_new_tokens", lc.max_new_tokens, "an integer >= 1")
    if lc.name == "interruption":
        _check(lc.think_budget_min >= 1, "length_control.think_budget_min", lc.think_budget_min, ">= 1")
        _check(
            lc.think_budget_max >= lc.think_budget_min,
            "length_control.think_budget_max",
            lc.think_budget_max,
            f">= think_budget_min ({lc.think_budget_min})",
        )
        _check(lc.answer_budget >= 1, "length_control.answer_budget", lc.answer_budget, ">= 1")
        _check(
            lc.think_budget_max + lc.answer_budget <= lc.max_new_tokens,
            "length_control.think_budget_max",
            lc.think_budget_max,
            f"<= max_new_tokens - answer_budget ({lc.max_new_tokens - lc.answer_budget})",
        )
        _check(bool(lc.phrase), "length_control.phrase", lc.phrase, "a non-empty string")
    elif lc.name == "length_penalty":
        _check(lc.l_cache >= 1, "length_control.l_cache", lc.l_cache, "an integer >= 1")
        _check(lc.l_max > lc.l_cache, "length_control.l_max", lc.l_max, f"> l_cache ({lc.l_cache})")

    m = cfg.model
    _one_of("model.arch", m.arch, ARCHS)
    if m.name_or_path is None:
        for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            _check(m[key] >= 1, f"model.{key}", m[key], "an integer >= 1")
        _check(
            m.hidden_size % m.num_heads == 0,
            "model.num_heads",
            m.num_heads,
            f"a divisor of hidden_size ({m.hidden_size})",
        )
        _check(
            m.num_heads % m.num_kv_heads == 0,
            "model.num_kv_heads",
            m.num_kv_heads,
            f"a divisor of num_heads ({m.num_heads})",
        )
        if m.arch == "gpt2":
            _check(
                m.num_kv_heads == m.num_heads,
                "model.num_kv_heads",
                m.num_kv_heads,
                f"equal to num_heads ({m.num_heads}): gpt2 has no grouped-query attention",
            )
    _check(m.warmstart_steps >= 0, "model.warmstart_steps", m.warmstart_steps, ">= 0")

    t = cfg.task
    _one_of("task.name", t.name, TASKS)
    if t.name == "addition":
        _check(t.min_digits >= 1, "task.min_digits", t.min_digits, ">= 1")
        _check(
            t.max_digits >= t.min_digits, "task.max_digits", t.max_digits, f">= min_digits ({t.min_digits})"
        )
        _check(t.warmstart_max_digits >= 1, "task.warmstart_max_digits", t.warmstart_max_digits, ">= 1")
        for key in ("warmstart_hard_frac", "warmstart_slip_prob"):
            _check(0.0 <= t[key] <= 1.0, f"task.{key}", t[key], "a number in [0, 1]")
    _check(t.num_val >= 1, "task.num_val", t.num_val, "an integer >= 1")
    _check(t.num_train >= 1, "task.num_train", t.num_train, "an integer >= 1")
    _check(t.verifier_timeout_s > 0, "task.verifier_timeout_s", t.verifier_timeout_s, "> 0")

    g = cfg.generator
    _one_of("generator.name", g.name, GENERATORS)
    _check(g.temperature > 0, "generator.temperature", g.temperature, "> 0")
    _check(g.chunk_prompts >= 1, "generator.chunk_prompts", g.chunk_prompts, "an integer >= 1")

    tr = cfg.trainer
    _one_of("trainer.name", tr.name, TRAINERS)
    _check(tr.total_steps >= 1, "trainer.total_steps", tr.total_steps, "an integer >= 1")
    _check(
        tr.generations_per_prompt >= 2,
        "trainer.generations_per_prompt",
        tr.generations_per_prompt,
        "an integer >= 2 (advantages compare generations of one prompt)",
    )
    _check(
        tr.batch_size >= tr.generations_per_prompt and tr.batch_size % tr.generations_per_prompt == 0,
        "trainer.batch_size",
        tr.batch_size,
        f"a multiple of trainer.generations_per_prompt ({tr.generations_per_prompt}) "
        "so the batch divides into prompts x generations",
    )
    if tr.micro_batch_size:
        _check(
            tr.micro_batch_size % tr.generations_per_prompt == 0 and tr.batch_size % tr.micro_batch_size == 0,
            "trainer.micro_batch_size",
            tr.micro_batch_size,
            "0 (whole batch) or a multiple of generations_per_prompt dividing batch_size",
        )
    _check(tr.lr > 0, "trainer.lr", tr.lr, "> 0")
    _check(
        len(tr.betas) == 2 and all(0 <= b < 1 for b in tr.betas),
        "trainer.betas",
        list(tr.betas),
        "two numbers in [0, 1)",
    )
    _check(tr.adam_eps > 0, "trainer.adam_eps", tr.adam_eps, "> 0")
    _check(tr.weight_decay >= 0, "trainer.weight_decay", tr.weight_decay, ">= 0")
    _check(tr.warmup_steps >= 0, "trainer.warmup_steps", tr.warmup_steps, ">= 0")
    _check(tr.grad_clip >= 0, "trainer.grad_clip", tr.grad_clip, ">= 0 (0 = off)")
    _check(tr.max_nonfinite_steps >= 1, "trainer.max_nonfinite_steps", tr.max_nonfinite_steps, ">= 1")
    _check(tr.zero_stage in (0, 1, 2, 3), "trainer.zero_stage", tr.zero_stage, "one of 0, 1, 2, 3")
    _one_of("trainer.device", tr.device, DEVICES)
    _check(tr.threads >= 0, "trainer.threads", tr.threads, ">= 0 (0 = all cores)")

    e = cfg.eval
    _check(e.every >= 1, "eval.every", e.every, "an integer >= 1")
    _check(e.num_prompts >= 1, "eval.num_prompts", e.num_prompts, "an integer >= 1")
    _check(e.samples_per_prompt >= 1, "eval.samples_per_prompt", e.samples_per_prompt, "an integer >= 1")
    _check(e.log_samples >= 0, "eval.log_samples", e.log_samples, ">= 0")

    s = cfg.scaling
    _one_of("scaling.compute_axis", s.compute_axis, COMPUTE_AXES)
    _one_of("scaling.method", s.method, FIT_METHODS)
    _check(s.refit_every >= 1, "scaling.refit_every", s.refit_every, "an integer >= 1")
    _check(0 <= s.min_compute_frac < 1, "scaling.min_compute_frac", s.min_compute_frac, "a number in [0, 1)")
    _check(s.bootstrap >= 0, "scaling.bootstrap", s.bootstrap, ">= 0")
    _check(s.extrapolate >= 1, "scaling.extrapolate", s.extrapolate, ">= 1")

    _one_of("launcher.name", cfg.launcher.name, LAUNCHERS)
    _check(cfg.checkpoint_every >= 1, "checkpoint_every", cfg.checkpoint_every, "an integer >= 1")
    _one_of("progress", cfg.progress, PROGRESS)
    _check(bool(cfg.tracking.experiment), "tracking.experiment", cfg.tracking.experiment, "a non-empty name")
