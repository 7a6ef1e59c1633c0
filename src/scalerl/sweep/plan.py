"""Planning: the runs of a sweep (variant x seed), each composed and validated before anything runs.

Every run's config is ``compose(base + variant + command line [+ seed])`` plus the settings the
sweep owns (``out_dir``, ``tracking.*``), exactly what its job will compose. Any error (unknown
group, option or key, a bad value) becomes one line naming the file, the variant and the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from scalerl.config import typed
from scalerl.config.errors import explain, override_key
from scalerl.config.schema import fit_too_short, recipe_change
from scalerl.config.settings import build_config
from scalerl.estimate import WORK_GROUPS
from scalerl.layout import LayoutOptions
from scalerl.sweep.spec import SweepError, SweepSpec, display_path
from scalerl.tracking.tracker import absolute_uri

# Keys the sweep sets for every run; a sweep file or the command line may not set them.
OWNED = ("out_dir", "tracking.experiment", "tracking.run_name", "tracking.parent_run_id", "tracking.tags")
COMMAND_LINE = "command line"


# ---------------------------------------------------------------------------- overrides
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


@functools.cache
def option_keys(group: str, option: str) -> frozenset[str]:
    """The dotted keys (``length_control.l_max``, ...) that ``group=option`` has (composed once per
    option: a plan asks for each variant's base and command-line settings)."""
    from scalerl.config import compose

    def keys(node, prefix: str) -> set[str]:
        if not isinstance(node, dict):
            return {prefix}
        return {prefix} | {k for name, v in node.items() for k in keys(v, f"{prefix}.{name}")}

    cfg = compose([f"{group}={option}"], check=False)
    return frozenset(keys(OmegaConf.to_container(cfg[group], resolve=False), group))


def carried(shared: list[str], variant: list[str]) -> tuple[list[str], list[str]]:
    """``shared`` overrides (the sweep's base, or the command line) split into those that apply to a
    run of ``variant`` and those that do not: a setting of a group's key (``length_control.
    think_budget_min=20``) where the variant picks another option of that group
    (``length_control=length_penalty``) that has no such key. The setting was made for the option
    the others run (sizing the interruption budget to the task); the variant's option keeps its own
    values, as the paper's leave-one-out swaps a component with its settings. A key both options
    have (``length_control.max_new_tokens``) applies to both."""
    picked = {
        override_key(o): o.split("=", 1)[1].strip()
        for o in variant
        if "=" in o and "." not in override_key(o) and not o.startswith("~")
    }
    apply, dropped = [], []
    for ov in shared:
        key = override_key(ov)
        group = key.split(".", 1)[0]
        if "." in key and group in picked and not ov.startswith("~"):
            if key not in option_keys(group, picked[group]):
                dropped.append(ov)
                continue
        apply.append(ov)
    return apply, dropped


def _owned(key: str) -> bool:
    """``key`` is, is under, or holds (``tracking`` as a whole) a key the sweep sets."""
    return (
        any(key == o or key.startswith(o + ".") or o.startswith(key + ".") for o in OWNED)
        or key == "hydra"
        or key.startswith("hydra.")
    )


# ---------------------------------------------------------------------------- tracking URI
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
    skip: str = ""  # why the sweep does not launch it: its component cannot act where it would run

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
    # said before the runs start (a budget too short for a verdict)
    warnings: list[str] = field(default_factory=list)
    # variant -> the options its work is counted from (scalerl.estimate.WORK_GROUPS), read
    # from its first run's config as planning composed and checked it (not written to sweep.json):
    # the launch order reads each variant's work from them instead of composing it again
    work_options: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

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


def _check_places(uri: str, sweep_dir: Path) -> None:
    """The tracking store answers and the sweep folder can be written, before any run is planned."""
    from scalerl.config.preflight import PathError, check_out_dir, check_tracking_uri

    try:
        check_tracking_uri(uri, key="tracking URI")
        check_out_dir(str(sweep_dir), key="sweep folder (--out)")
    except PathError as e:
        raise SweepError(str(e)) from None


@contextlib.contextmanager
def _named(where: str, overrides: list[str]) -> Iterator[None]:
    """A composition's error (Hydra, OmegaConf, a ConfigError) as one line naming ``where``."""
    try:
        yield
    except Exception as e:  # Hydra/OmegaConf/ConfigError: one line naming where
        raise SweepError(f"{where}: {explain(e, overrides)}") from None


def _compose_variant(overrides: list[str], where: str) -> DictConfig:
    """``overrides`` composed (not yet checked: :func:`build_config` checks each run's copy)."""
    from scalerl.config import compose

    try:
        return compose(overrides, check=False)
    except Exception as e:  # Hydra/OmegaConf: one line naming where
        raise SweepError(f"{where}: {explain(e, overrides)}") from None


def _check_layout(options, launcher, where: str) -> None:
    """The run of ``options`` (its :class:`~scalerl.layout.LayoutOptions`) laid out on the job the
    ``launcher`` option asks for (its nodes x tasks, GPUs and CPUs): every rank's devices, threads,
    ports and batch share can work (:func:`scalerl.layout.plan`), before anything is submitted."""
    from scalerl import layout
    from scalerl.config.validate import ConfigError

    try:
        layout.plan(options, layout.launch_from_launcher(launcher, options.trainer))
    except ConfigError as e:
        raise SweepError(f"{where}: {e}") from None


# ---------------------------------------------------------------------------- planning
def split_cli(args: list[str]) -> tuple[list[str], list[str], str | None]:
    """Command-line overrides -> (training overrides, launcher overrides, tracking uri or None)."""
    train, launch, uri = [], [], None
    for ov in args:
        key = override_key(ov)
        if ("=" not in ov and not ov.startswith("~")) or not key:
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


def _cuda_where(trainer, launcher) -> bool:
    """Whether a run whose trainer option is ``trainer``, launched by ``launcher`` (the launcher
    option), gets a CUDA device: a SLURM job that holds GPUs, or a local run on a machine with one
    (unless its trainer is pinned to the CPU)."""
    if str(trainer.device).startswith("cpu"):
        return False
    if launcher.name == "slurm":
        return int(launcher.gpus_per_node) > 0 or int(launcher.gpus_per_task) > 0
    import torch

    return torch.cuda.is_available()


def cannot_act_here(precision, trainer, launcher) -> str:
    """Why a run's component cannot act where ``launcher`` would run it ("" = it can), from its
    precision and trainer options: a reduced-precision LM head that would be emulated (fp32 math,
    rounded: no CUDA there), so the paper's mechanism behind the FP32 head, a kernel mismatch between
    the generator's and the trainer's head, cannot act."""
    head = str(precision.head)
    impl = str(precision.impl)
    if head == "fp32" or impl == "native" or (impl == "auto" and _cuda_where(trainer, launcher)):
        return ""
    where = "by precision.impl=emulated" if impl == "emulated" else "without a CUDA device where it would run"
    return (
        f"precision.head={head} would be emulated {where} (fp32 math, rounded), so the paper's mechanism "
        "(a kernel mismatch between generator and trainer) cannot act"
    )


def make_plan(
    spec: SweepSpec,
    cli_overrides: list[str] | None = None,
    *,
    sweep_dir: str | Path | None = None,
    tracking_uri: str | None = None,
    stored_uri: str | None = None,
    run_all: bool = False,
) -> Plan:
    """Compose and validate every run of ``spec`` (base + variant + ``cli_overrides`` [+ seed], plus
    the sweep's own keys); :class:`SweepError` (one line) on the first problem. Writes nothing.
    A run of a variant other than the baseline whose component cannot act where it would run
    (:func:`cannot_act_here`) is planned with ``skip`` set (not launched) unless ``run_all``."""
    path = spec.path or spec.name
    cli_train, cli_launch, cli_uri = split_cli(list(cli_overrides or []))
    base_train, base_launch, base_uri = _split_base(spec.base, path)
    _refuse_sweep_keys(spec, path, base_train, cli_train)

    # sweep level: base alone, then with the command line, so the error names the right place
    launch = merge_overrides(base_launch, cli_launch)
    with _named(f"{path}: base", base := merge_overrides(base_train, base_launch)):
        build_config(base, {})
    with _named(COMMAND_LINE, line := merge_overrides(base_train, cli_train, launch)):
        sweep = build_config(line, {})
    sweep = typed(sweep)

    # --tracking-uri, then tracking.uri= on the command line or in base, then the sweep folder's
    # (a re-run continues in the same store), then $MLFLOW_TRACKING_URI / sqlite:///mlflow.db
    uri = absolute_uri(tracking_uri or cli_uri or base_uri or stored_uri or default_tracking_uri())
    sdir = Path(sweep_dir) if sweep_dir else Path("outputs") / "sweeps" / spec.name
    sdir = sdir.resolve()
    _check_places(uri, sdir)

    runs: list[PlannedRun] = []
    work_options: dict[str, dict[str, Any]] = {}  # variant -> its first run's WORK_GROUPS options
    short: dict[str, list[str]] = {}  # what is too short -> the variants it is said of
    notes: list[str] = []  # settings of a group a variant replaced with another option
    for vname, vovs in spec.variants.items():
        base_v, base_off = carried(base_train, vovs)
        cli_v, cli_off = carried(cli_train, vovs)
        notes += _not_applied(vname, vovs, base_off, cli_off)
        overrides = merge_overrides(base_v, vovs, cli_v)
        where = f"{path}: variant {vname!r}"
        composed = _compose_variant(overrides, where)  # once for all its seeds
        if composed.scaling.metric != sweep.scaling.metric:  # the report fits one metric
            raise SweepError(
                f"{where}: scaling.metric={composed.scaling.metric}: the sweep fits "
                f"scaling.metric={sweep.scaling.metric} for every run; set it in base or on the command line"
            )
        for seed in spec.seeds if spec.seeds is not None else [None]:
            run = _new_run(spec, vname, seed, overrides, sdir)
            # composed exactly as its job will compose it, read into its typed options, each check
            # given its own: the layout on the sweep's launcher, and (the baseline and --run-all
            # always run) whether its component can act where it would run
            settings = run_settings(spec.name, run, uri, "0" * 32)
            with _named(where, overrides):
                config = build_config(overrides, settings, seed, composed=composed)
            if change := recipe_change(config):  # a run that began keeps its recipe
                raise SweepError(_recipe_kept(where, run, *change))
            config = typed(config)
            if vname not in work_options:  # its values checked (build_config): once a variant
                work_options[vname] = {g: getattr(config, g) for g in WORK_GROUPS}
                c = config
                if too_short := fit_too_short(c.trainer.total_steps, c.eval.every, c.scaling.min_step):
                    short.setdefault(too_short, []).append(vname)
            run.seed, run.total_steps = config.seed, int(config.trainer.total_steps)
            layout = LayoutOptions.of(config)
            _check_layout(layout, sweep.launcher, where)
            if not run_all and vname != spec.baseline:
                run.skip = cannot_act_here(config.precision, config.trainer, sweep.launcher)
            runs.append(run)
    return Plan(
        spec=spec,
        runs=runs,
        sweep_dir=sdir,
        tracking_uri=uri,
        launcher=dataclasses.asdict(sweep.launcher),
        launcher_overrides=launch,
        cli_overrides=list(cli_overrides or []),
        scaling=dataclasses.asdict(sweep.scaling),
        warnings=[
            (
                "every variant"
                if len(names) == len(spec.variants)
                else "variant " + ", ".join(map(repr, names))
            )
            + ": "
            + what
            for what, names in short.items()
        ]
        + notes,
        work_options=work_options,
    )


def _recipe_kept(where: str, run: PlannedRun, key: str, then: str, now: str) -> str:
    """Why a run that has started already (finished or not: its ``out_dir`` keeps the recipe it
    began with, ``key`` was ``then``) cannot run on under its variant's ``now``: a variant edited
    since would be scored on the old run (a finished run is skipped), or fail when its job resumes
    it. One line."""
    return (
        f"{where}: {key}={now}, but its run {run.name} in {display_path(run.out_dir)} began with "
        f"{key}={then}; a run keeps the recipe it began with: give the variant its old value back, "
        "or the sweep another folder (--out)"
    )


def _split_base(base: list[str], path: str) -> tuple[list[str], list[str], str | None]:
    """The sweep file's base overrides as (training overrides, launcher overrides, tracking URI);
    a key the sweep sets for every run is refused."""
    base_train, base_launch, base_uri = [], [], None
    for ov in base:
        key = override_key(ov)
        if key == "tracking.uri":
            base_uri = ov.split("=", 1)[1]
        elif _owned(key):
            raise SweepError(f"{path}: base: {key} is set by the sweep for every run")
        elif is_launcher(ov):
            base_launch.append(ov)
        else:
            base_train.append(ov)
    return base_train, base_launch, base_uri


def _refuse_sweep_keys(spec: SweepSpec, path: str, base_train: list[str], cli_train: list[str]) -> None:
    """A variant may not set what the sweep sets (its own keys, the launcher, the seed of a sweep
    with a seeds list); nor may base or the command line set the seed such a sweep sets."""
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


def _not_applied(vname: str, vovs: list[str], base_off: list[str], cli_off: list[str]) -> list[str]:
    """The notes on base and command-line settings a variant's option has no key for (:func:`carried`)."""
    notes = []
    for whose, off in (("base", base_off), (COMMAND_LINE, cli_off)):
        if off:
            picks = ", ".join(
                o for o in vovs if override_key(o) in {override_key(x).split(".")[0] for x in off}
            )
            notes.append(
                f"variant {vname!r}: the {whose}'s {', '.join(off)} not applied: {picks} has no key "
                "of that name (it keeps its own settings)"
            )
    return notes


def run_work(run: PlannedRun, options: dict[str, Any] | None = None) -> float:
    """The token positions ``run`` processes by its config (:attr:`scalerl.estimate.Work.tokens`;
    0 where that is not countable here: it only orders runs, and never stops a sweep). ``options``:
    its :data:`~scalerl.estimate.WORK_GROUPS` options where planning has them (:attr:`Plan.work_options`), else read
    from its overrides composed again."""
    from scalerl.estimate import work

    try:
        if options is None:
            o = typed(build_config(run.overrides, {}))
            options = {g: getattr(o, g) for g in WORK_GROUPS}
        return work(**options).tokens
    except Exception:
        return 0.0


def launch_order(
    runs: list[PlannedRun], work_options: dict[str, dict[str, Any]] | None = None
) -> list[PlannedRun]:
    """The order the local launcher starts ``runs`` in: the most work first (ties in plan order), so
    that a sweep's last minutes run short runs side by side rather than a long one alone. A
    variant's seeds do the same work: counted once per variant, from ``work_options`` (the plan's
    :attr:`Plan.work_options`) where it has the variant, else from its overrides composed again."""
    work: dict[str, float] = {}
    for r in runs:
        if r.variant not in work:
            work[r.variant] = run_work(r, (work_options or {}).get(r.variant))
    return sorted(runs, key=lambda r: -work[r.variant])


def _new_run(spec: SweepSpec, vname: str, seed: int | None, overrides: list[str], sdir: Path) -> PlannedRun:
    """Run ``vname`` (its seed ``seed``, None: the config's) as named and placed in the sweep folder
    ``sdir``, before its config is composed (which sets its seed and length)."""
    seeds = spec.seeds
    job = vname if seeds is None or len(seeds) == 1 else f"{vname}-seed{seed}"
    ovs = overrides + ([f"seed={seed}"] if seed is not None else [])
    return PlannedRun(name=job, variant=vname, seed=-1, overrides=ovs, out_dir=str(sdir / job), total_steps=0)


def plan_lines(plan: Plan) -> list[str]:
    """The dry-run output: one line per run, its name and its overrides."""
    width = max(len(r.name) for r in plan.runs)
    return [
        f"{r.name:<{width}}  {' '.join(r.overrides)}".rstrip() + (f"  (not run: {r.skip})" if r.skip else "")
        for r in plan.runs
    ]
