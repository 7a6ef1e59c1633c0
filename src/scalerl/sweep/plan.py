"""Planning: the runs of a sweep (variant x seed), each composed and validated before anything runs.

Every run's config is ``compose(base + variant + command line [+ seed])`` plus the settings the
sweep owns (``out_dir``, ``tracking.*``), exactly what its job will compose. Any error (unknown
group, option or key, a bad value) becomes one line naming the file, the variant and the key.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from scalerl.sweep.spec import SweepError, SweepSpec

# Keys the sweep sets for every run; a sweep file or the command line may not set them.
OWNED = ("out_dir", "tracking.experiment", "tracking.run_name", "tracking.parent_run_id", "tracking.tags")
COMMAND_LINE = "command line"


# ---------------------------------------------------------------------------- overrides
def override_key(ov: str) -> str:
    """``loss`` for ``loss=dapo``, ``trainer.lr`` for ``+trainer.lr=1``, ``x`` for ``~x``."""
    return ov.lstrip("+~").split("=", 1)[0].strip()


def is_launcher(ov: str) -> bool:
    k = override_key(ov)
    return k == "launcher" or k.startswith("launcher.")


def merge_overrides(*lists: list[str]) -> list[str]:
    """Concatenate; a later override of the same key replaces the earlier one (and moves last)."""
    out: dict[str, str] = {}
    for lst in lists:
        for ov in lst:
            k = override_key(ov)
            out.pop(k, None)
            out[k] = ov
    return list(out.values())


def _owned(key: str) -> bool:
    return (
        any(key == o or key.startswith(o + ".") for o in OWNED) or key == "hydra" or key.startswith("hydra.")
    )


# ---------------------------------------------------------------------------- tracking URI
def absolute_uri(uri: str) -> str:
    """Make a relative sqlite / file-store URI absolute, so jobs started elsewhere find the store."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///") :]
        if rest and not rest.startswith(":memory:"):
            return "sqlite:///" + str(Path(rest).resolve())
        return uri
    if uri.startswith("file:") and not uri.startswith("file:///"):
        return Path(uri[len("file:") :]).resolve().as_uri()
    if "://" not in uri and not uri.startswith(("databricks", "sqlite", "file:")):
        return str(Path(uri).resolve())
    return uri


def default_tracking_uri() -> str:
    return absolute_uri(os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db")


# ---------------------------------------------------------------------------- plan
@dataclass
class PlannedRun:
    name: str  # the job / MLflow run name: <variant> or <variant>-seed<s>
    variant: str
    seed: int
    overrides: list[str]  # everything the run composes from: base + variant + command line (+ seed)
    out_dir: str
    total_steps: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Plan:
    spec: SweepSpec
    runs: list[PlannedRun]
    sweep_dir: Path
    tracking_uri: str
    launcher: dict[str, Any]  # the composed launcher group
    launcher_overrides: list[str]
    cli_overrides: list[str]
    scaling: dict[str, Any]  # the composed scaling settings (fit method, bootstrap, ...)
    warnings: list[str] = field(default_factory=list)

    def run(self, name: str) -> PlannedRun:
        return next(r for r in self.runs if r.name == name)


def run_settings(plan_name: str, run: PlannedRun, tracking_uri: str, parent_run_id: str | None) -> dict:
    """The keys the sweep sets on a run's composed config (not overrides: they never show in plans)."""
    return {
        "out_dir": run.out_dir,
        "tracking.uri": tracking_uri,
        "tracking.experiment": plan_name,
        "tracking.run_name": run.name,
        "tracking.parent_run_id": parent_run_id,
        "tracking.tags": {
            "sweep": plan_name,
            "variant": run.variant,
            "seed": str(run.seed),
            "overrides": " ".join(run.overrides),
        },
    }


def apply_settings(cfg: DictConfig, settings: dict) -> DictConfig:
    with open_dict(cfg):
        for key, value in settings.items():
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def build_config(overrides: list[str], settings: dict, seed: int | None = None) -> DictConfig:
    """Compose ``overrides`` like ``python train.py`` would, set the sweep's keys, validate.
    This is what every job runs (and what planning checks). Keys added with ``+key=value`` that no
    schema declares are refused by :func:`~scalerl.config.validate`, as for a single run."""
    from scalerl.config import compose, validate

    cfg = compose(overrides, check=False)
    if seed is not None:
        cfg.seed = int(seed)
    apply_settings(cfg, settings)
    validate(cfg)
    return cfg


# ---------------------------------------------------------------------------- error messages
_DEFAULT_CFG: DictConfig | None = None


def _default_cfg() -> DictConfig:
    global _DEFAULT_CFG
    if _DEFAULT_CFG is None:
        from scalerl.config import compose

        _DEFAULT_CFG = compose([], check=False)
    return _DEFAULT_CFG


def _options(group: str) -> list[str]:
    from scalerl.config import GROUPS, options

    return sorted(options(group)) if group in GROUPS else []


def _groups() -> list[str]:
    from scalerl.config import GROUPS

    return list(GROUPS)


def _chosen_option(group: str, overrides: list[str]) -> str:
    """The option of ``group`` that ``overrides`` choose (the last ``group=option``), else the default."""
    chosen = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == group]
    return chosen[-1] if chosen else str(_default_cfg()[group].name)


def _unknown_key_message(key: str, value: str | None = None, overrides: list[str] | None = None) -> str:
    from scalerl.config import GROUPS, option_fields, options

    cfg = _default_cfg()
    parts = key.split(".")
    head = parts[0]
    if head in GROUPS and len(parts) == 2:
        name = _chosen_option(head, overrides or [])
        if name in options(head):
            keys = ", ".join(f.name for f in option_fields(options(head)[name]))
            return f"unknown key {key} (keys of {head}={name}: {keys or 'none'})"
    if head not in cfg:
        others = ", ".join(k for k in cfg if k not in _groups())
        if len(parts) == 1:
            return f"unknown group or key {key!r} (groups: {', '.join(_groups())}; other keys: {others})"
        return f"unknown key {key}: there is no group {head!r} (groups: {', '.join(_groups())})"
    # walk down to the deepest existing node
    node, path = cfg, []
    for p in parts[:-1]:
        if isinstance(node, DictConfig) and p in node:
            node = node[p]
            path.append(p)
        else:
            break
    parent = ".".join(path)
    if isinstance(node, DictConfig):
        if not dataclasses.is_dataclass(OmegaConf.get_type(node)):
            val = f"={value}" if value is not None else "=..."
            return f"unknown key {key} ({parent} is a free mapping: add keys with +{key}{val})"
        keys = [k for k in node.keys()]
        return f"unknown key {key} (keys of {parent}: {', '.join(keys)})"
    return f"unknown key {key} ({parent} is a value, not a group)"


def explain(exc: BaseException, overrides: list[str]) -> str:
    """One line for a compose/validate error, naming the override at fault."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    from scalerl.config import ConfigError

    msg = str(exc)
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    if isinstance(exc, ConfigError):
        return msg
    if isinstance(exc, MissingConfigException):
        import re

        m = re.search(r"Could not (?:find|load) '([^'/]+)/([^']+)'", msg)
        if m:
            group, option = m.group(1), m.group(2)
            # the user's override (a list value shows up as one of its elements)
            ov = next((o for o in overrides if override_key(o) == group), f"{group}={option}")
            value = ov.split("=", 1)[1] if "=" in ov else option
            avail = _options(group)
            return f"unknown option {group}={value} (available: {', '.join(avail)})"
        return first
    if isinstance(exc, OverrideParseException):
        bad = next((o for o in overrides if o in msg), None)
        lines = [x.strip() for x in msg.splitlines() if x.strip()]
        detail = lines[1] if len(lines) > 1 else first
        return f"malformed override {bad!r}: {detail}" if bad else f"malformed override: {first}"
    if isinstance(exc, ConfigCompositionException):
        import re

        m = re.search(r"Could not override '([^']+)'", msg)
        if m:
            key = m.group(1)
            ov = next((o for o in overrides if override_key(o) == key), None)
            return _unknown_key_message(key, ov.split("=", 1)[1] if ov and "=" in ov else None, overrides)
        m = re.search(r"Error merging override (.+)$", first)
        if m:
            cause = exc.__cause__
            detail = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
            return f"bad value {m.group(1)}" + (f": {detail}" if detail else "")
        m = re.search(r"Could not append to config. An item is already at '([^']+)'", msg)
        if m:
            return f"{m.group(1)} already exists: write {m.group(1)}=... without the '+'"
        return first
    return f"{type(exc).__name__}: {first}"


def _compose_or_raise(
    overrides: list[str], where: str, settings: dict | None = None, seed=None
) -> DictConfig:
    try:
        return build_config(overrides, settings or {}, seed)
    except Exception as e:  # Hydra/OmegaConf/ConfigError: one line naming where
        raise SweepError(f"{where}: {explain(e, overrides)}") from None


# ---------------------------------------------------------------------------- planning
def split_cli(args: list[str]) -> tuple[list[str], list[str], str | None]:
    """Command-line overrides -> (training overrides, launcher overrides, tracking uri or None)."""
    train, launch, uri = [], [], None
    for ov in args:
        key = override_key(ov)
        if "=" not in ov and not ov.startswith("~"):
            raise SweepError(
                f"{COMMAND_LINE}: malformed override {ov!r} (expected group=option or key=value)"
            )
        if key == "tracking.uri":
            uri = ov.split("=", 1)[1]
        elif _owned(key):
            raise SweepError(
                f"{COMMAND_LINE}: {key} is set by the sweep for every run; use --out / --tracking-uri"
            )
        elif is_launcher(ov):
            launch.append(ov)
        else:
            train.append(ov)
    return train, launch, uri


def make_plan(
    spec: SweepSpec,
    cli_overrides: list[str] | None = None,
    *,
    sweep_dir: str | Path | None = None,
    tracking_uri: str | None = None,
    stored_uri: str | None = None,
) -> Plan:
    """Compose and validate every run of ``spec`` (base + variant + ``cli_overrides`` [+ seed], plus
    the sweep's own keys); :class:`SweepError` (one line) on the first problem. Writes nothing."""
    path = spec.path or spec.name
    cli_train, cli_launch, cli_uri = split_cli(list(cli_overrides or []))

    base_train, base_launch, base_uri = [], [], None
    for ov in spec.base:
        key = override_key(ov)
        if key == "tracking.uri":
            base_uri = ov.split("=", 1)[1]
        elif _owned(key):
            raise SweepError(f"{path}: base: {key} is set by the sweep for every run")
        elif is_launcher(ov):
            base_launch.append(ov)
        else:
            base_train.append(ov)
    for vname, ovs in spec.variants.items():
        for ov in ovs:
            key = override_key(ov)
            if _owned(key) or key == "tracking.uri":
                raise SweepError(f"{path}: variant {vname!r}: {key} is set by the sweep for every run")
            if is_launcher(ov):
                raise SweepError(
                    f"{path}: variant {vname!r}: {key} is a launcher setting; put it in base or on the command line"
                )
            if spec.seeds is not None and key == "seed":
                raise SweepError(f"{path}: variant {vname!r}: seed is set by the sweep's seeds list")
    if spec.seeds is not None:
        if any(override_key(o) == "seed" for o in base_train):
            raise SweepError(f"{path}: base: seed is set by the sweep's seeds list")
        if any(override_key(o) == "seed" for o in cli_train):
            raise SweepError(f"{COMMAND_LINE}: seed is set by the sweep's seeds list ({path})")

    # sweep level: base alone, then with the command line, so the error names the right place
    launch = merge_overrides(base_launch, cli_launch)
    _compose_or_raise(merge_overrides(base_train, base_launch), f"{path}: base")
    sweep_cfg = _compose_or_raise(merge_overrides(base_train, cli_train, launch), COMMAND_LINE)

    # --tracking-uri, then tracking.uri= on the command line or in base, then the sweep folder's
    # (a re-run continues in the same store), then $MLFLOW_TRACKING_URI / sqlite:///mlflow.db
    uri = absolute_uri(tracking_uri or cli_uri or base_uri or stored_uri or default_tracking_uri())
    sdir = Path(sweep_dir) if sweep_dir else Path("outputs") / "sweeps" / spec.name
    sdir = sdir.resolve()

    runs: list[PlannedRun] = []
    seeds = spec.seeds
    for vname, vovs in spec.variants.items():
        overrides = merge_overrides(base_train, vovs, cli_train)
        for seed in seeds if seeds is not None else [None]:
            job = vname if seeds is None or len(seeds) == 1 else f"{vname}-seed{seed}"
            ovs = overrides + ([f"seed={seed}"] if seed is not None else [])
            run = PlannedRun(
                name=job, variant=vname, seed=-1, overrides=ovs, out_dir=str(sdir / job), total_steps=0
            )
            settings = run_settings(spec.name, run, uri, "0" * 32)
            cfg = _compose_or_raise(overrides, f"{path}: variant {vname!r}", settings, seed)
            run.seed = int(cfg.seed)
            run.total_steps = int(cfg.trainer.total_steps)
            runs.append(run)
    return Plan(
        spec=spec,
        runs=runs,
        sweep_dir=sdir,
        tracking_uri=uri,
        launcher=OmegaConf.to_container(sweep_cfg.launcher, resolve=True),
        launcher_overrides=launch,
        cli_overrides=list(cli_overrides or []),
        scaling=OmegaConf.to_container(sweep_cfg.scaling, resolve=True),
    )


def plan_lines(plan: Plan) -> list[str]:
    """The dry-run output: one line per run, its name and its overrides."""
    width = max(len(r.name) for r in plan.runs)
    return [f"{r.name:<{width}}  {' '.join(r.overrides)}".rstrip() for r in plan.runs]
