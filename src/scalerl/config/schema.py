"""Structured configs: the schema every composed recipe is checked against.

The top-level :class:`Config` holds one field per config group (typed by the chosen option's
dataclass, see :mod:`scalerl.config.options`) and the run-wide settings below. Each option's YAML
lists its dataclass (stored in Hydra's ConfigStore under ``scalerl_schema/<group>/<name>``) first in
its defaults, so the composed group node is typed by that option: a key the option does not declare
(``loss=cispo loss.eps_high=0.3``) is an error, and so is a value of the wrong type. Value ranges
are checked by each dataclass's ``check`` (:mod:`scalerl.config.validate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from scalerl.config.checks import at_least, problems
from scalerl.config.options import GROUPS, SCHEMA_ROOT, Option, options
from scalerl.scaling.protocol import FitProtocol, bootstrap_problem, fit_problems
from scalerl.scaling.sigmoid import N_PARAMS

PROGRESS = ("auto", "bar", "log")


# eval.batch_prompts=0: a decode batch takes a training batch's rows, or more held-out prompts (up
# to all of them) while their KV cache at the model's whole context stays within this many bytes:
# a small model's decode step costs about the same for 768 rows as for 128 (the embedded default's
# evaluation: 1.6 -> 1.1 CPU s), a large model's cache does not fit more than a training batch
EVAL_KV_BUDGET_BYTES = 512 * 2**20


@dataclass
class EvalConfig(Option):
    # the default's design: 128 prompts x 6 samples (one point's standard error <= 0.018; the mean of
    # 3 seeds' last evaluation, <= 0.011: the end the prediction is checked on averages the last tenth
    # of the compute, one or more of them), every 15 steps
    # (10 points after the early cut in the first half of 300 steps; about a sixth of the run's time)
    every: int = 15  # evaluate every N optimiser steps (and at step 0)
    num_prompts: int = 128
    samples_per_prompt: int = 6  # K: pass rate = mean over K samples at the training temperature
    # k values (each in 1..samples_per_prompt) whose pass@k is logged as val/pass_at_<k> at every
    # evaluation (task=multi: also val/pass_at_<k>/<domain>): the unbiased estimator from the K
    # samples (Chen et al. 2021); pass@1 is val/pass_rate. [] logs none; scaling.metric may fit one
    pass_at_k: list[int] = field(default_factory=list)
    log_samples: int = 8  # generations logged as an artifact per evaluation
    # prompts per decode batch: 0 = as many rows as a training batch (batch_size / K prompts), or
    # more, up to all of them, while their KV cache at the model's whole context fits 512 MiB (the
    # embedded model: all at once; decode_prompts below); a decode step of a small
    # model, or on a GPU, costs about the same for 256 rows as for 32, so fewer batches are faster
    batch_prompts: int = 0

    def check(self):
        return problems(
            at_least("every", self.every, 1),
            at_least("batch_prompts", self.batch_prompts, 0),
            at_least("num_prompts", self.num_prompts, 1),
            at_least("samples_per_prompt", self.samples_per_prompt, 1),
            self._pass_at_k_problem(),
            at_least("log_samples", self.log_samples, 0, ""),
        )

    def decode_prompts(self, batch_size: int, n_val: int, row_bytes: int | None) -> int:
        """Held-out prompts a decode batch of the evaluation takes: ``batch_prompts`` where set;
        else a training batch's rows (``batch_size`` / K), or more, up to all ``n_val``, while their
        KV cache (``row_bytes`` a row) stays within :data:`EVAL_KV_BUDGET_BYTES`."""
        if int(self.batch_prompts):
            return int(self.batch_prompts)
        K = int(self.samples_per_prompt)
        base = max(1, int(batch_size) // K)
        if not row_bytes:
            return base
        return max(base, min(int(n_val), EVAL_KV_BUDGET_BYTES // (row_bytes * K)))

    def _pass_at_k_problem(self):
        k_max = self.samples_per_prompt
        if all(isinstance(k, int) and 1 <= k <= k_max for k in self.pass_at_k):
            return None
        return (
            "pass_at_k",
            list(self.pass_at_k),
            f"integers k with 1 <= k <= eval.samples_per_prompt ({k_max}): pass@k is estimated from "
            "the samples drawn per prompt",
        )


def evaluates_at(step: int, total_steps: int, every: int) -> bool:
    """Whether a run evaluates on the held-out prompts after ``step`` optimiser steps: at step 0 (before
    any update), every ``eval.every`` steps and at the last (the loop, and a sweep's plan counting a
    run's points)."""
    return step % every == 0 or step == total_steps


SCORED_POINTS = N_PARAMS + 1
"""Evaluations past the early cut a run's fit needs to be scored: a fit through N_PARAMS points has
no interval, and its A is set by those points alone (scalerl.analysis.verdicts)."""


def points_past_cut(total_steps: int, every: int, min_step: int) -> int:
    """A run's evaluations at or after the early cut's step (:func:`evaluates_at`)."""
    return sum(evaluates_at(s, total_steps, every) for s in range(max(0, min_step), total_steps + 1))


def fit_too_short(steps: int, every: int, cut: int) -> str:
    """What makes a run too short for a scored fit ('' when it is long enough): fewer evaluations
    past the early cut than :data:`SCORED_POINTS` (``steps``: trainer.total_steps, ``every``:
    eval.every, ``cut``: scaling.min_step)."""
    n = points_past_cut(steps, every, cut)
    if n >= SCORED_POINTS:
        return ""
    return (
        f"{n} evaluation{'s' * (n != 1)} a run at or after scaling.min_step={cut} (trainer.total_steps={steps}, "
        f"eval.every={every}): a sigmoid needs {N_PARAMS} to be fitted and {SCORED_POINTS} to have an "
        "interval and be scored"
    )


@dataclass
class TrackingConfig(Option):
    uri: Optional[str] = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd
    experiment: str = "scalerl"
    run_name: Optional[str] = None
    parent_run_id: Optional[str] = None  # set by sweeps
    tags: dict[str, str] = field(default_factory=dict)

    def check(self):
        return [("experiment", self.experiment, "a non-empty name")] if not self.experiment else []


@dataclass
class ScalingConfig(Option):
    # the fit's x-axis: flops = 2N per generated + 6N per trained token (counted work: machine load
    # and idle time do not move it, so runs on a shared machine stay comparable); device_hours = wall
    # clock x devices held, idle time included (the paper's GPU-hours; on CPU a device is one CPU
    # thread), for runs whose generation and training hold separate devices (conf/experiment/paper_scale)
    compute_axis: str = "flops"  # flops | device_hours
    refit_every: int = 5  # refit the sigmoid every M evaluations
    # early points left out of every fit (live, final, report, half-budget check), the same absolute
    # cut for every run of a sweep: evaluations before optimiser step min_step, and below min_compute
    # (in compute_axis units; the paper's ~1.5k GPU-hours)
    min_step: int = 10
    min_compute: float = 0.0
    method: str = "direct"  # grid | direct
    # the grid method's ranges; null: from the data. The paper's: grid_A=[0.45,0.8,0.005]
    # grid_C_mid=[100,40000,100] (GPU-hours, linearly spaced)
    grid_A: Optional[list[float]] = None  # [low, high, step]
    grid_C_mid: Optional[list[float]] = None  # [low, high, n]
    bootstrap: int = 200
    extrapolate: float = 2.0  # the plot extends the fit to this multiple of the budget
    # the metric every fit is made of (live, final, summary, sweep report): pass_rate (val/pass_rate,
    # pass@1) or pass_at_<k> (val/pass_at_<k>, k one of eval.pass_at_k); R0 is its step-0 value
    metric: str = "pass_rate"

    def check(self):
        # the fit settings' ranges are the fit protocol's (scalerl.scaling.protocol), in this order
        fit = fit_problems(self)
        return problems(
            fit.get("compute_axis"),
            fit.get("method"),
            at_least("refit_every", self.refit_every, 1),
            *(fit.get(k) for k in ("min_step", "min_compute", "grid_A", "grid_C_mid")),
            # a run's and a sweep's intervals are at the protocol's level
            fit.get("bootstrap") or bootstrap_problem("bootstrap", self.bootstrap, FitProtocol.level),
            fit.get("extrapolate"),
            fit.get("metric"),
        )


@dataclass
class Config:
    # one per config group: typed by the chosen option's dataclass (its YAML names it)
    loss: Any = MISSING
    correction: Any = MISSING
    async_mode: Any = MISSING
    precision: Any = MISSING
    aggregation: Any = MISSING
    norm: Any = MISSING
    filter: Any = MISSING
    length_control: Any = MISSING
    reward: Any = MISSING
    model: Any = MISSING
    task: Any = MISSING
    generator: Any = MISSING
    trainer: Any = MISSING
    placement: Any = MISSING
    launcher: Any = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    seed: int = 0  # the run's random seed (model=tiny's warm-started base has its own: warmstart_seed)
    # checkpoints, logs and the resolved config go here (conf/config.yaml: a dated folder under outputs/)
    out_dir: str = MISSING
    checkpoint_every: int = 10  # optimiser steps between checkpoints (and at the last)
    # a progress bar on an interactive terminal and log lines otherwise (auto), or either always
    progress: str = "auto"  # auto | bar | log


# what may differ when a run is resumed in its out_dir (keys, or prefixes ending in "."): its length,
# cadences, threads, where it logs, runs or caches; every other key is its recipe and must match
RESUMABLE_CHANGES = (
    "trainer.total_steps",
    "trainer.threads",
    "checkpoint_every",
    "progress",
    "out_dir",
    "eval.log_samples",
    "model.cache_dir",
    "tracking.",
    "launcher.",
    "placement.",
    "scaling.",
    # how the engines lay out their work (issue 56: continuous, or in waves as before), like
    # placement.*: the samples' distribution and the staleness bound are the recipe's either way
    "generator.continuous",
    "generator.max_running",
)

# recipe keys added since runs were first written, each with the value that reproduces what a run
# written before it did: a run resumed from such an out_dir has no such key in its recipe and may go
# on with exactly that value (scalerl.loop.checkpointing.check_same_recipe)
ADDED_KEYS = {
    "correction.name": "none",  # the correction group (issue 57): none is the loss as before
    "correction.level": "token",
    "task.sandbox": "strong",  # issue 55: the strongest boundary, as runs before chose (now never a weak one)
    "task.domains.code.sandbox": "strong",
    "generator.stale_kv": "keep",  # issue 57: the stale KV cache kept, as before
    "eval.pass_at_k": "[]",  # issue 57: no pass@k logged, as before
}


def recipe(cfg) -> dict[str, str]:
    """The resolved config, flat, without what may change on resume (:data:`RESUMABLE_CHANGES`): what
    a resumed run must match (``scalerl.loop.checkpointing`` keeps it beside the first checkpoint)."""
    from omegaconf import OmegaConf

    from scalerl.tracking.secrets import redact
    from scalerl.tracking.tracker import flatten

    flat = flatten(OmegaConf.to_container(cfg, resolve=True))
    return {k: redact(v) for k, v in flat.items() if not k.startswith(RESUMABLE_CHANGES)}


def recipe_file(out_dir):
    """Where a run keeps the recipe it started with (:func:`recipe`, beside its first checkpoint)."""
    from pathlib import Path

    return Path(out_dir) / "checkpoint" / "recipe.json"


def length_file(out_dir):
    """Where a run keeps the length (``trainer.total_steps``) it ran with at its last checkpoint."""
    from pathlib import Path

    return Path(out_dir) / "checkpoint" / "length.json"


def run_length(out_dir) -> int | None:
    """The ``trainer.total_steps`` the run in ``out_dir`` ran with at its last checkpoint, or None
    (no run there, or one checkpointed before runs kept it: it resumes to the config's length)."""
    import json

    try:
        return int(json.loads(length_file(out_dir).read_text())["total_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recipe_change(cfg) -> tuple[str, str, str] | None:
    """The first key whose value in ``cfg`` differs from the recipe the run in ``cfg.out_dir``
    started with, as ``(key, then, now)`` (``"(unset)"`` for a key one side lacks); None where the
    recipes agree or no run started there. A key added since that run began, at the value that does
    what the run did (:data:`ADDED_KEYS`), is no change. A group's option (``loss.name``) is named
    before the settings that come with it (``loss.eps_high``)."""
    import json

    path = recipe_file(cfg.out_dir)
    if not path.is_file():
        return None
    before, now = json.loads(path.read_text()), recipe(cfg)
    for key in sorted(set(before) | set(now), key=lambda k: (not k.endswith(".name"), k)):
        if key not in before and now.get(key) == ADDED_KEYS.get(key):
            continue
        if before.get(key) != now.get(key):
            return key, before.get(key, "(unset)"), now.get(key, "(unset)")
    return None


# the run-wide sections, checked like options
SECTIONS = {"eval": EvalConfig, "tracking": TrackingConfig, "scaling": ScalingConfig}


_stored: tuple = ()  # the (group, name, class) of every option schema last stored


def register_configs() -> None:
    """Store the top-level schema and every option's schema in Hydra's ConfigStore.

    ``conf/config.yaml`` lists ``scalerl_schema`` first in its defaults; each option's YAML lists
    ``/scalerl_schema/<group>/<name>@_here_`` first in its own. Stores again only when an option
    was registered or changed since (storing every schema costs an eighth of a compose).
    :func:`scalerl.config.register_configs` also registers the ``scalerl_help`` resolver.
    """
    global _stored
    cs = ConfigStore.instance()
    schemas = tuple((group, name, cls) for group in GROUPS for name, cls in options(group).items())
    if schemas != _stored or "scalerl_schema.yaml" not in cs.repo:
        cs.store(name="scalerl_schema", node=Config)
        for group, name, cls in schemas:
            cs.store(group=f"{SCHEMA_ROOT}/{group}", name=name, node=cls)
        _stored = schemas
