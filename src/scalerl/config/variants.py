"""What exactly ran: each group's option name plus the fields that differ from that option's YAML.

``filter=scalerl filter.zero_variance=false`` is the variant ``scalerl(zero_variance=false)``; the
option's defaults are what ``conf/<group>/<name>.yaml`` composes to, read through Hydra itself.
"""

from __future__ import annotations

import functools

from omegaconf import DictConfig, OmegaConf

from scalerl.config.options import GROUPS


def format_value(v: object) -> str:
    """A value as an override writes it: true/false, null, plain strings and numbers, [a, b]."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {format_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, str) and (not v or any(c in v for c in " ,()[]{}='\"")):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(v)


def compose_choices(choices: dict[str, str]) -> DictConfig:
    """The config composed with only ``group=option`` overrides (no validation): every chosen
    option's node holds its YAML defaults. Inside a running Hydra app its loader is reused; outside
    one the same choices are composed once per process (read-only: a sweep's runs share them)."""
    overrides = [f"{g}={o}" for g, o in choices.items()]
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        from hydra import compose as hydra_compose

        return hydra_compose(config_name="config", overrides=overrides)
    return _composed_choices(tuple(overrides))


@functools.lru_cache(maxsize=64)
def _composed_choices(overrides: tuple[str, ...]) -> DictConfig:
    from scalerl.config import compose

    cfg = compose(list(overrides), check=False)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def option_defaults(choices: dict[str, str], values: dict[str, dict] | None = None) -> dict[str, dict]:
    """{group: the YAML defaults of the chosen option} for the groups in ``choices``. A field whose
    YAML value follows another field of the option (``${.max_lag}``) defaults to that field's value
    in ``values`` (the run's own, resolved), so it is no difference when only the other one changed."""
    ref = compose_choices(choices)
    out = {}
    for g in choices:
        out[g] = OmegaConf.to_container(ref[g], resolve=True)
        for k, raw in OmegaConf.to_container(ref[g], resolve=False).items():
            if values and isinstance(raw, str) and raw.startswith("${.") and raw.endswith("}"):
                out[g][k] = values[g].get(raw[3:-1], out[g][k])
    return out


def variant(name: str, values: dict, defaults: dict) -> str:
    """``name`` or ``name(key=value, ...)`` listing the fields whose values differ from ``defaults``."""
    diff = [f"{k}={format_value(v)}" for k, v in values.items() if k != "name" and defaults.get(k) != v]
    return f"{name}({', '.join(diff)})" if diff else name


def group_variants(cfg: DictConfig) -> dict[str, str]:
    """{group: variant} for every group of ``cfg``: what the MLflow group params record. The recipe
    only: a field a resumed run may change (:data:`~scalerl.config.schema.RESUMABLE_CHANGES`: the
    run's length, threads, placement ...) is left out, so runs of one recipe name one variant."""
    from scalerl.config.schema import RESUMABLE_CHANGES

    choices = {g: str(cfg[g].name) for g in GROUPS}
    values = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in GROUPS}
    recipe = {
        g: {k: v for k, v in values[g].items() if not f"{g}.{k}".startswith(RESUMABLE_CHANGES)}
        for g in GROUPS
    }
    defaults = option_defaults(choices, values)
    return {g: variant(choices[g], recipe[g], defaults[g]) for g in GROUPS}
