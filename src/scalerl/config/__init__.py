"""Configuration: the option registries, the structured schema, value checks, and composition
outside a Hydra app."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig

from scalerl.config.help import register_help_resolver
from scalerl.config.options import GROUPS, option_class, options, register_option
from scalerl.config.schema import Config, evaluates_at
from scalerl.config.schema import register_configs as _register_schemas
from scalerl.config.validate import ConfigError, check_overrides, option_of, validate
from scalerl.config.variants import group_variants


def register_configs() -> None:
    """The structured schemas in Hydra's ConfigStore (:func:`scalerl.config.schema.register_configs`)
    and the ``scalerl_help`` resolver that ``--help`` lists the options with (the help describes the
    schema, so it is registered here, above both)."""
    _register_schemas()
    register_help_resolver()


def conf_dir() -> str:
    """The folder holding the Hydra config groups (``conf/`` at the repository root)."""
    env = os.environ.get("SCALERL_CONF_DIR")
    if env:
        return str(Path(env).resolve())
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "conf" / "config.yaml").is_file():
            return str(parent / "conf")
    raise FileNotFoundError(
        "scalerl: cannot find conf/config.yaml; install with `pip install -e .` from the repository "
        "or set SCALERL_CONF_DIR"
    )


@contextlib.contextmanager
def hydra_initialized() -> Iterator[None]:
    """Hydra initialised on ``conf/`` (and the structured configs registered) as ``train.py`` has it,
    for composing outside its run (:func:`compose`, the expansion of ``train.py -m``'s jobs)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="scalerl"):
        yield


def compose(
    overrides: list[str] | None = None, *, check: bool = True, with_hydra: bool = False
) -> DictConfig:
    """Compose the recipe like ``python train.py <overrides>`` would, without running it.

    Used by sweeps (to check every variant before launching), ``train.py --help`` (``with_hydra``:
    the ``hydra`` node is kept, for its help template) and by tests.
    """
    from hydra import compose as hydra_compose

    with hydra_initialized():
        cfg = hydra_compose(
            config_name="config", overrides=list(overrides or []), return_hydra_config=with_hydra
        )
    if check:
        check_overrides(cfg, list(overrides or []))
        validate(cfg)
    return cfg


def typed(cfg: DictConfig) -> Config:
    """The config read once: a :class:`~scalerl.config.schema.Config` whose group fields are the
    chosen options' dataclasses (``config/groups``) and whose sections are ``EvalConfig``,
    ``TrackingConfig`` and ``ScalingConfig``, interpolations resolved. Setup turns the composed
    config into this and hands each part only its own options. A config without the schema's types
    (one read back from a run's ``config.yaml``) is typed by its options' names first."""
    from omegaconf import OmegaConf

    if OmegaConf.get_type(cfg) is not Config:
        node = OmegaConf.structured(Config)
        for group in GROUPS:
            if group in cfg:
                cls = option_class(group, cfg[group].name)
                node[group] = OmegaConf.merge(OmegaConf.structured(cls), cfg[group])
        rest = {k: v for k, v in cfg.items() if k not in GROUPS}
        cfg = OmegaConf.merge(node, rest)
    return OmegaConf.to_object(cfg)


def preflight(cfg: DictConfig) -> None:
    """Checks on the folders and servers ``cfg`` points at (:mod:`scalerl.config.preflight`); the task's
    data is checked by :func:`scalerl.task.checks.check_task` (both: :func:`scalerl.cli.preflight`)."""
    from scalerl.config.preflight import preflight as _preflight

    _preflight(cfg)


__all__ = [
    "GROUPS",
    "Config",
    "ConfigError",
    "compose",
    "conf_dir",
    "evaluates_at",
    "group_variants",
    "hydra_initialized",
    "option_class",
    "option_of",
    "options",
    "preflight",
    "register_configs",
    "register_option",
    "typed",
    "validate",
]
