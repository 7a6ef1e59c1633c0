"""Checks on a composed config, run before any model is built.

Hydra and the option schemas reject unknown groups and options, keys an option does not declare
and wrongly typed values. :func:`validate` checks what composition cannot: keys added with ``+``,
required values left unset (``model=hf`` without ``model.name_or_path``), each option's own value
checks (its dataclass's ``check``), non-finite numbers anywhere, the run-wide sections, and the
relations between groups. It raises :class:`ConfigError` with one line naming the key, the value and
what is allowed. What the config points at (folders, files, servers) is checked by
:func:`scalerl.config.preflight.preflight`.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from scalerl.config.checks import non_finite, seed
from scalerl.config.options import GROUPS, options
from scalerl.config.schema import PROGRESS, SECTIONS, Config
from scalerl.messages import UserError


class ConfigError(UserError):
    """A user error in the configuration; its message is one line."""

    def __init__(self, key: str, value: object, allowed: str, where: str = ""):
        self.key, self.value, self.allowed = key, value, allowed
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}invalid config value {key}={value!r}: must be {allowed}")


class UnknownKeyError(ConfigError):
    """A key no schema declares (added with ``+key=...``)."""

    def __init__(self, key: str, value: object, known: list[str], owner: str):
        self.key, self.value, self.allowed = key, value, ", ".join(known)
        ValueError.__init__(
            self, f"unknown key {key}={value!r} (keys of {owner}: {', '.join(known) or 'none'})"
        )


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


def _unknown_keys(node: DictConfig, path: str) -> None:
    """Keys of ``node`` (and of its structured children) that its dataclass does not declare."""
    cls = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(cls):
        return  # a free mapping (tracking.tags, launcher.additional_parameters)
    declared = [f.name for f in dataclasses.fields(cls)]
    for key in node.keys():
        child_path = f"{path}.{key}" if path else str(key)
        if key not in declared:
            owner = f"{path}={node.name}" if path in GROUPS else (path or "the config")
            value = OmegaConf.to_container(node, resolve=False)[key]
            raise UnknownKeyError(child_path, value, declared if path not in GROUPS else declared[1:], owner)
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        child = node[key]
        if isinstance(child, DictConfig):
            _unknown_keys(child, child_path)


def _deleted(cfg: DictConfig) -> None:
    """A top-level setting removed with ``~key`` (a group's ``~group`` leaves it unset instead)."""
    for f in dataclasses.fields(Config):
        if f.name not in cfg:
            raise ConfigError(f.name, "???", "set (required)")


def _unresolved(cfg: DictConfig) -> None:
    """An interpolation (``${oc.env:VAR}``, ``${key}``) that does not resolve, or not to its key's type."""
    from omegaconf.errors import InterpolationResolutionError

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as e:
        key = str(getattr(e, "full_key", "") or "?")
        node: object = OmegaConf.to_container(cfg, resolve=False)
        for part in key.split("."):
            node = node.get(part, "?") if isinstance(node, dict) else "?"
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(key, node, f"an interpolation that resolves ({detail})") from None


def _missing(node: DictConfig, path: str) -> None:
    for key in node.keys():
        if OmegaConf.is_missing(node, key):
            what = f"required by {path}={node.name}" if path in GROUPS else "required"
            raise ConfigError(f"{path}.{key}" if path else str(key), "???", f"set ({what})")


def _problems(obj, path: str) -> None:
    bad = non_finite(obj)
    if bad is not None:
        raise ConfigError(f"{path}.{bad[0]}", bad[1], bad[2])
    for key, value, allowed in obj.check():
        raise ConfigError(f"{path}.{key}", value, allowed)


def option_of(cfg: DictConfig, group: str):
    """The chosen option of ``group`` as an instance of its dataclass (values resolved and typed)."""
    node = cfg[group]
    cls = options(group).get(node.name)
    if cls is None:
        raise ConfigError(f"{group}.name", node.name, "one of " + ", ".join(options(group)))
    if OmegaConf.get_type(node) is not cls:
        # `group.name=other` changes the name but not the schema the node was composed with
        raise ConfigError(f"{group}.name", node.name, f"{group}={node.name} chosen as an option, not by name")
    return OmegaConf.to_object(node)


def validate(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` on the first unknown key, missing or out-of-range value, or
    inconsistent value in ``cfg``."""
    _deleted(cfg)
    _unknown_keys(cfg, "")
    _missing(cfg, "")
    _unresolved(cfg)
    for group in GROUPS:
        _missing(cfg[group], group)
        _problems(option_of(cfg, group), group)
    for section in SECTIONS:
        _problems(OmegaConf.to_object(cfg[section]), section)
    bad_seed = seed("seed", cfg.seed)
    if bad_seed:
        raise ConfigError(*bad_seed)
    _check(cfg.checkpoint_every >= 1, "checkpoint_every", cfg.checkpoint_every, "an integer >= 1")
    _check(cfg.progress in PROGRESS, "progress", cfg.progress, "one of " + ", ".join(PROGRESS))
    _check(bool(str(cfg.out_dir).strip()), "out_dir", cfg.out_dir, "a folder path")
    _relations(cfg)


BOOLEAN_WORDS = ("true", "false", "yes", "no", "y", "n", "on", "off", "1", "0")


def check_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """What composing lets through on a command line: OmegaConf reads any integer as a boolean
    (``filter.zero_variance=2`` is true), so a true/false key takes one of :data:`BOOLEAN_WORDS`
    (any case); Hydra merges a list of a group's options (``trainer=[torch,deepspeed]`` ran
    deepspeed), so a group takes one option."""
    from scalerl.config.errors import override_key

    for ov in overrides:
        key = override_key(ov)
        if ov.startswith("~") or "=" not in ov:
            continue
        value = ov.split("=", 1)[1].strip()
        if key in GROUPS and value.startswith("["):
            raise ConfigError(key, value, f"one option (available: {', '.join(options(key))})")
        value = value.strip("'\"")
        if "/" in key or "${" in value:  # an interpolation: its target's own type decides
            continue
        if isinstance(OmegaConf.select(cfg, key, default=None), bool) and value.lower() not in BOOLEAN_WORDS:
            raise ConfigError(key, value, "true or false")


def addition_prompt_chars(task) -> int:
    """Characters in the longest prompt of ``task=addition`` (``a+b=``, both zero-padded; a held-out
    tier of ``val_digits`` or ``train_digits`` may be wider under ``operand_width=own``)."""
    mixes = [*map(int, task.get("val_digits") or {}), *map(int, task.get("train_digits") or {})]
    width = max(int(task.max_digits), int(task.warmstart_max_digits), *mixes)
    return 2 * width + 2


def _relations(cfg: DictConfig) -> None:
    """Checks across groups that the config alone decides."""
    task, model, eval_ = cfg.task, cfg.model, cfg.eval
    # the most validation prompts the task has (a data file may have fewer; GSM's originals: preflight)
    if "num_val" in task and task.get("val_split", "drawn") == "drawn":
        _check(
            eval_.num_prompts <= task.num_val,
            "eval.num_prompts",
            eval_.num_prompts,
            f"<= task.num_val ({task.num_val}), the validation prompts task={task.name} draws",
        )
    if task.name == "multi":  # validation alternates between domains: each needs one prompt at least
        n = len(task.domains)
        _check(
            eval_.num_prompts >= n,
            "eval.num_prompts",
            eval_.num_prompts,
            f">= {n}, the domains of task=multi (each is validated on its own)",
        )
    _fitted_metric(cfg)
    _placement_relations(cfg)
    _launcher_relations(cfg)
    if model.name == "tiny" and task.name == "addition":
        need = addition_prompt_chars(task) + int(cfg.length_control.max_new_tokens)
        _check(
            need <= model.max_position_embeddings,
            "length_control.max_new_tokens",
            cfg.length_control.max_new_tokens,
            f"<= model.max_position_embeddings - prompt length "
            f"({model.max_position_embeddings} - {addition_prompt_chars(task)} = "
            f"{model.max_position_embeddings - addition_prompt_chars(task)})",
        )


def _fitted_metric(cfg: DictConfig) -> None:
    """``scaling.metric=pass_at_<k>`` fits what the evaluation logs: k is one of ``eval.pass_at_k``."""
    from scalerl.scaling.pass_at_k import DEFAULT_METRIC, metric_k

    metric, logged = cfg.scaling.metric, sorted(set(cfg.eval.pass_at_k))
    if metric == DEFAULT_METRIC or metric_k(metric) in logged:
        return
    listed = ", ".join(f"pass_at_{k}" for k in logged)
    raise ConfigError(
        "scaling.metric",
        metric,
        f"pass_rate{', ' + listed if listed else ''} (a pass@k the evaluation logs: add its k to "
        f"eval.pass_at_k, now {list(cfg.eval.pass_at_k)})",
    )


def _launcher_relations(cfg: DictConfig) -> None:
    """A sweep's job of several tasks is one run of several trainer processes (its last
    ``placement.generator_tasks`` run engines instead): only DeepSpeed trains in several."""
    lc = cfg.launcher
    launched = int(lc.nodes) * int(lc.tasks_per_node)
    trainers = launched - int(cfg.placement.get("generator_tasks", 0) or 0)
    if launched > 1 and trainers > 1 and cfg.trainer.name != "deepspeed":
        key = "tasks_per_node" if int(lc.tasks_per_node) > 1 else "nodes"
        raise ConfigError(
            f"launcher.{key}",
            lc[key],
            f"1 with trainer={cfg.trainer.name}: {trainers} trainer processes of one run "
            "(launcher.nodes x launcher.tasks_per_node) need trainer=deepspeed",
        )


def _placement_relations(cfg: DictConfig) -> None:
    """What a placement needs of the async mode, the generator and the transport."""
    pl, mode, gen = cfg.placement, cfg.async_mode.name, cfg.generator.name
    if pl.name == "split" or int(pl.engines) > 1:
        what = "placement=split" if pl.name == "split" else f"placement.engines={pl.engines}"
        _check(
            mode == "pipeline_rl",
            "async_mode",
            mode,
            f"pipeline_rl with {what}: generator processes stream to the trainer only in pipeline_rl",
        )
    from scalerl.config.groups.generator import generator_option_class

    caps = generator_option_class(cfg.generator)
    if int(pl.tensor_parallel_size) > 1:
        _check(
            caps.tensor_parallel,
            "placement.tensor_parallel_size",
            pl.tensor_parallel_size,
            f"1 with generator={gen} (tensor parallelism is vLLM's)",
        )
    tasks = int(pl.get("generator_tasks", 0) or 0)
    if tasks:
        _check(
            int(pl.engines) == tasks,
            "placement.engines",
            pl.engines,
            f"{tasks}, one engine per generator task (placement.generator_tasks={tasks})",
        )
    if mode == "pipeline_rl" and cfg.async_mode.transport == "shm":
        _check(
            caps.shared_memory_weights and not tasks,
            "async_mode.transport",
            "shm",
            "auto, gloo or nccl: shared memory feeds HF engines on the trainer's machine only",
        )


__all__ = ["ConfigError", "UnknownKeyError", "option_of", "validate"]
