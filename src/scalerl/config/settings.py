"""A run's config as a sweep's job composes it: its overrides composed like ``python train.py``
would, the keys the sweep owns for every run (``out_dir``, ``tracking.*``) set on the result (not as
overrides: they never show in plans), and the whole checked. Config composition, so it lives here;
:mod:`scalerl.sweep.plan` (planning every run) and :class:`scalerl.sweep.job.TrainJob` (running one)
both call :func:`build_config`, so a plan checks exactly what its jobs will run."""

from __future__ import annotations

import copy

from omegaconf import DictConfig, OmegaConf, open_dict


def apply_settings(cfg: DictConfig, settings: dict) -> DictConfig:
    """Set ``settings`` (dotted key -> value) on ``cfg`` in place, keys the schema may not list
    (``tracking.tags``' entries) included; returns ``cfg``."""
    with open_dict(cfg):
        for key, value in settings.items():
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def build_config(
    overrides: list[str], settings: dict, seed: int | None = None, *, composed: DictConfig | None = None
) -> DictConfig:
    """Compose ``overrides`` like ``python train.py`` would, set the sweep's keys, validate.
    This is what every job runs (and what planning checks). Keys added with ``+key=value`` that no
    schema declares are refused by :func:`~scalerl.config.validate`, as for a single run.
    ``composed``: ``overrides`` composed already (planning composes a variant once for all its
    seeds: a composition takes about a third of a second); a copy of it is set and checked."""
    from scalerl.config import compose, validate

    cfg = copy.deepcopy(composed) if composed is not None else compose(overrides, check=False)
    if seed is not None:
        cfg.seed = int(seed)
    apply_settings(cfg, settings)
    validate(cfg)
    return cfg
