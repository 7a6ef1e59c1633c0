"""Fit every run of an experiment, compare recipes, build report rows.

One :class:`RunRow` per run (sorted by A, unfittable runs last), its fit's cells a :class:`FitCells`
and its half-budget prediction check a :class:`HalfCheck`; :meth:`RunRow.as_dict` is the row as the
table, ``fits.csv`` and ``fits.json`` hold it (keys ``run_id, run_name, status, variant, <each recipe
param that differs between runs>, compute_axis, ok, reason, A, A_lo, A_hi, B, B_lo, B_hi, C_mid,
C_mid_lo, C_mid_hi, R0, n_points, n_excluded, n_evals, budget, pass_rate_start, pass_rate_final,
pred_n, pred_mae, pred_err_last, baseline, delta_A, delta_B, A_fixed, B_fixed_A, C_mid_fixed_A,
verdict``; ``pass_rate_start`` and ``_final``: the fitted metric's, ``FitProtocol.metric``).

The baseline is a variant (all its runs, i.e. its seeds): ``delta_A = A - mean A`` and
``delta_B = B - mean B`` over its fitted runs (:func:`choose_baseline`). These per-run deltas are
point estimates and flag nothing; ``B_fixed_A`` is B refitted with A fixed to ``A_fixed``, the
baseline's A. What the runs support about each variant (estimates over every fitted seed, Welch's
test on each pair Bonferroni-corrected over the table, equivalence on A, components that cannot or did not act, prediction) is
:mod:`scalerl.analysis.verdicts`, whose verdict every row of that variant carries.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from scalerl.analysis.mlflow_io import REWARD_KEY, AnalysisError, RunData, declared_baseline, load_runs
from scalerl.analysis.verdicts import (
    A_UNSETTLED,
    VariantVerdict,
    baseline_A,
    fixed_A_fits,
    verdicts,
)
from scalerl.config.options import RECIPE_GROUPS  # groups logged as params named after the group
from scalerl.config.schema import RESUMABLE_CHANGES
from scalerl.scaling.protocol import FitProtocol
from scalerl.scaling.sigmoid import N_PARAMS, SigmoidFit

DEFAULT_MIN_STEP = FitProtocol.min_step
"""The early cut of the analysis CLI, as ``scaling.min_step``'s default (the fit protocol's)."""
IGNORED_PARAM_PREFIXES = ("tracking.", "launcher.", "scaling.", "hydra.", "mlflow.", "progress", "out_dir")
IGNORED_PARAM_WORDS = ("dir", "path", "uri", "host", "port", "checkpoint")
IGNORED_PARAMS = (
    "run_name",
    "experiment",
    "experiment_name",
    "variant",
    "sweep.variant",
    "git_sha",
    "git.sha",
)
SEED_KEYS = ("seed",)
VARIANT_KEYS = ("scalerl.variant", "variant", "sweep.variant")
"""Tags or params that name a run's variant in a sweep (first found wins)."""
SAME_RECIPE = "(one recipe)"
"""The variant name of runs that name no variant when no recipe param differs between them."""


_NAN_CI = (math.nan, math.nan)


@dataclass(frozen=True)
class FitCells:
    """A fit's cells in a report row (a run's own fit, or a recipe's seeds pooled)."""

    ok: bool
    """Whether the fit succeeded (its values are meaningful)."""
    reason: str
    """Why the fit failed ('' when it did not)."""
    A: float
    """The fitted ceiling of the pass rate."""
    A_lo: float
    """The lower end of A's bootstrap interval (NaN without a bootstrap)."""
    A_hi: float
    """The upper end of A's bootstrap interval."""
    B: float
    """The fitted efficiency exponent."""
    B_lo: float
    """The lower end of B's bootstrap interval."""
    B_hi: float
    """The upper end of B's bootstrap interval."""
    C_mid: float
    """The compute at which the curve is half way from R0 to A (compute-axis units)."""
    C_mid_lo: float
    """The lower end of C_mid's bootstrap interval."""
    C_mid_hi: float
    """The upper end of C_mid's bootstrap interval."""
    R0: float
    """The pass rate at compute 0 (the curve's start)."""
    n_points: int
    """Evaluations the fit used."""
    n_excluded: int
    """Evaluations the fit left out (the early cut, non-finite values)."""

    @classmethod
    def of(cls, fit: SigmoidFit) -> FitCells:
        ci = fit.ci
        return cls(
            ok=bool(fit.ok),
            reason=fit.reason,
            A=fit.A,
            A_lo=ci.get("A", _NAN_CI)[0],
            A_hi=ci.get("A", _NAN_CI)[1],
            B=fit.B,
            B_lo=ci.get("B", _NAN_CI)[0],
            B_hi=ci.get("B", _NAN_CI)[1],
            C_mid=fit.C_mid,
            C_mid_lo=ci.get("C_mid", _NAN_CI)[0],
            C_mid_hi=ci.get("C_mid", _NAN_CI)[1],
            R0=fit.R0,
            n_points=int(fit.n_points),
            n_excluded=len(fit.excluded),
        )

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class HalfCheck:
    """The prediction check of a run: a fit on its first half of the compute against its second half."""

    pred_n: int
    """Evaluations in the second half that were predicted (0: no check could be made)."""
    pred_mae: float
    """The prediction's mean absolute error over those evaluations (NaN without a check)."""
    pred_err_last: float
    """The prediction's signed error (predicted - observed) at the last evaluation."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


NO_CHECK = HalfCheck(pred_n=0, pred_mae=math.nan, pred_err_last=math.nan)


@dataclass(frozen=True)
class RunRow:
    """One run's row of the comparison table (:func:`analyse_runs`); :meth:`as_dict` is its table
    form, the columns of ``fits.csv`` and ``fits.json``."""

    run_id: str
    """The MLflow run id."""
    run_name: str
    """The MLflow run name."""
    status: str
    """The run's MLflow status, lower case (``finished``, ``running``, ``failed`` ...)."""
    variant: str
    """The run's variant: its ``scalerl.variant`` tag or param, else its differing recipe params."""
    params: dict[str, str]
    """The recipe params that differ between the analysed runs (:func:`differing_params`), this
    run's values ('' for one it did not log): each a column of its own in the table form."""
    compute_axis: str
    """What the run's compute is measured in (``device_hours``, ``flops``)."""
    fit: FitCells
    """The run's own fit."""
    n_evals: int
    """Evaluations of the fitted metric paired with compute."""
    budget: float
    """The run's largest compute (NaN without any)."""
    pass_rate_start: float
    """The fitted metric's first evaluation (by step; NaN without any)."""
    pass_rate_final: float
    """The fitted metric's last evaluation."""
    check: HalfCheck | None
    """The half-budget prediction check; None when it was not asked for (then no ``pred_*`` keys)."""
    baseline: bool
    """Whether the run belongs to the baseline variant."""
    delta_A: float
    """A minus the baseline's A (the mean over its fitted seeds); NaN without both."""
    delta_B: float
    """B minus the baseline's B; NaN without both."""
    A_fixed: float
    """The baseline's A at which every run's B is refitted (:func:`~scalerl.analysis.verdicts.baseline_A`)."""
    B_fixed_A: float
    """B refitted with A fixed to ``A_fixed`` (NaN where that fit failed or was not made)."""
    C_mid_fixed_A: float
    """C_mid of that refit."""
    verdict: str
    """The verdict of the run's variant (:mod:`scalerl.analysis.verdicts`; '' without one)."""

    def as_dict(self) -> dict:
        """The row's table form: the keys of the module docstring, in that order."""
        return {
            "run_id": self.run_id,
            "run_name": self.run_name,
            "status": self.status,
            "variant": self.variant,
            **self.params,
            "compute_axis": self.compute_axis,
            **self.fit.as_dict(),
            "n_evals": self.n_evals,
            "budget": self.budget,
            "pass_rate_start": self.pass_rate_start,
            "pass_rate_final": self.pass_rate_final,
            **(self.check.as_dict() if self.check is not None else {}),
            "baseline": self.baseline,
            "delta_A": self.delta_A,
            "delta_B": self.delta_B,
            "A_fixed": self.A_fixed,
            "B_fixed_A": self.B_fixed_A,
            "C_mid_fixed_A": self.C_mid_fixed_A,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class PooledRow:
    """One recipe's seeds fitted together (``analyse_runs(pool_seeds=True)``)."""

    variant: str
    """The recipe: its differing params as ``key=value, ...`` ("all runs" when none differs)."""
    n_runs: int
    """The seeds pooled."""
    run_ids: str
    """Their run ids, comma-separated."""
    fit: FitCells
    """The pooled fit."""

    def as_dict(self) -> dict:
        return {"variant": self.variant, "n_runs": self.n_runs, "run_ids": self.run_ids, **self.fit.as_dict()}


@dataclass
class ExperimentResult:
    rows: list[RunRow]
    runs: list[RunData]
    fits: dict[str, SigmoidFit]
    """run_id -> full fit."""
    fixed_fits: dict[str, SigmoidFit] = field(default_factory=dict)
    """run_id -> fit with A fixed to the baseline's A (the mean over its seeds)."""
    half_fits: dict[str, SigmoidFit] = field(default_factory=dict)
    """run_id -> fit on the first half of the compute (prediction check)."""
    differing: list[str] = field(default_factory=list)
    baseline: Baseline | None = None
    A_mean: float = math.nan
    A_fixed: float = math.nan
    """The baseline's A (mean over its seeds), at which every run's B is refitted."""
    pooled_rows: list[PooledRow] = field(default_factory=list)
    pooled_fits: dict[str, SigmoidFit] = field(default_factory=dict)
    verdicts: list[VariantVerdict] = field(default_factory=list)
    """One per variant, the baseline first (:func:`scalerl.analysis.verdicts.verdicts`)."""


def _ignored(key: str) -> bool:
    """Whether a param is bookkeeping, not recipe: a dir, the tracking, or what a run may change
    when it resumes (:data:`~scalerl.config.schema.RESUMABLE_CHANGES`: its length, threads,
    placement ...), so that a run extended by a resume is not a variant of its own."""
    k = key.lower()
    if k in IGNORED_PARAMS or k.startswith(IGNORED_PARAM_PREFIXES) or key.startswith(RESUMABLE_CHANGES):
        return True
    leaf = k.rsplit(".", 1)[-1]
    return any(w in leaf for w in IGNORED_PARAM_WORDS)


def differing_params(runs: Sequence[RunData]) -> list[str]:
    """Recipe params whose values differ between runs: the config groups first, then flat params
    (``trainer.lr`` ...) in name order; bookkeeping params (dirs, tracking, launcher) are left out."""
    keys = set()
    for r in runs:
        keys.update(k for k in r.params if not _ignored(k))
    diff = [k for k in keys if len({r.params.get(k) for r in runs}) > 1]
    groups = [k for k in RECIPE_GROUPS if k in diff]
    return groups + sorted(k for k in diff if k not in RECIPE_GROUPS)


def _variant_name(run: RunData, differing: list[str]) -> str:
    for k in VARIANT_KEYS:
        if k in run.tags:
            return run.tags[k]
        if k in run.params:
            return run.params[k]
    parts = [f"{k}={run.params.get(k, '-')}" for k in differing if k not in SEED_KEYS]
    return ", ".join(parts) if parts else SAME_RECIPE


@dataclass
class Baseline:
    """The reference of ``delta_A`` / ``delta_B``: one variant (all its runs, i.e. its seeds).
    ``A``, ``B``: the means over its fitted runs (NaN when none was fitted, and then every
    ``delta_A`` / ``delta_B`` is NaN). ``why``: one line saying how it was chosen."""

    variant: str | None
    run_ids: list[str] = field(default_factory=list)
    fitted: int = 0
    A: float = math.nan
    B: float = math.nan
    why: str = ""
    given: bool = False

    @property
    def ok(self) -> bool:
        return self.fitted > 0

    def describe(self) -> str:
        """One line: which variant (and runs) the baseline is, and why."""
        if self.variant is None:
            return f"no baseline: {self.why}"
        runs = f"{len(self.run_ids)} run{'s' if len(self.run_ids) != 1 else ''}, {self.fitted} fitted"
        return f"baseline: variant {self.variant!r} ({runs}): {self.why}"


def choose_baseline(
    runs: Sequence[RunData],
    fits: dict[str, SigmoidFit],
    names: dict[str, str],
    differing: list[str],
    baseline: str | None = None,
    *,
    given_by: str = "--baseline",
    other_variants: Sequence[str] = (),
) -> Baseline:
    """The baseline variant.

    ``baseline`` given (a run id, run name or variant name; ``given_by`` says who gave it, e.g. a
    sweep file): that run's variant, fitted or not (an unfitted one leaves the deltas empty, never
    replaced by another run). A name found in none of the runs nor ``other_variants`` (variants
    of runs that have no data, e.g. a sweep's failed jobs) raises :class:`AnalysisError`.

    Not given: among *fitted* runs only, in this order: a run or variant named "baseline"; in a
    leave-one-out layout (3+ runs) the variant whose runs take the most common value of every
    differing recipe param (a value more common than any other); else the first fitted run (runs come ordered by start time). No
    fitted run: no baseline.
    """

    def made(variant: str, why: str, given: bool = False) -> Baseline:
        ids = [r.run_id for r in runs if names[r.run_id] == variant]
        ok = [fits[i] for i in ids if fits[i].ok]
        use = [f for f in ok if not f.through_points]  # as the verdicts' A (a_unusable)
        return Baseline(
            variant=variant,
            run_ids=ids,
            fitted=len(ok),
            A=float(np.mean([f.A for f in use])) if use else math.nan,
            B=float(np.mean([f.B for f in use])) if use else math.nan,
            why=why,
            given=given,
        )

    if baseline:
        for r in runs:
            if baseline in (r.run_id, r.run_name, names[r.run_id]):
                how = "" if baseline == names[r.run_id] else f" (the variant of run {baseline!r})"
                b = made(names[r.run_id], f"given by {given_by}{how}", given=True)
                if not b.ok:
                    b.why += "; none of its runs could be fitted, so delta_A and delta_B are empty"
                return b
        if baseline in other_variants:
            return Baseline(
                variant=baseline,
                why=f"given by {given_by}; none of its runs has data to fit, so delta_A and delta_B are empty",
                given=True,
            )
        known = sorted({names[r.run_id] for r in runs} | set(other_variants))
        raise AnalysisError(
            f"baseline {baseline!r} ({given_by}): no run id, run name or variant of that name among the "
            f"{len(runs)} runs (variants: {', '.join(known) or 'none'})"
        )

    fitted = [r for r in runs if fits[r.run_id].ok]
    if not fitted:
        return Baseline(None, why="no run could be fitted, so delta_A and delta_B are empty")
    skipped = ""
    named = [r for r in runs if "baseline" in (names[r.run_id], r.run_name)]
    hits = [r for r in named if fits[r.run_id].ok]
    if hits:
        r = hits[0]
        why = "its variant is named baseline" if names[r.run_id] == "baseline" else "a run is named baseline"
        return made(names[r.run_id], f"{why} (run {r.run_name!r})")
    if named:
        skipped = f" (run {named[0].run_name!r} is named baseline but could not be fitted: {fits[named[0].run_id].reason})"
    keys = [k for k in differing if k not in SEED_KEYS]
    if keys and len(runs) >= 3:
        top = {k: Counter(r.params.get(k) for r in runs).most_common(2) for k in keys}
        mode = {k: t[0][0] for k, t in top.items()}
        clear = all(len(t) == 1 or t[0][1] > t[1][1] for t in top.values())  # no ties
        centre = [r for r in runs if all(r.params.get(k) == mode[k] for k in keys)]
        variants = {names[r.run_id] for r in centre}
        if clear and len(variants) == 1:
            ok = [r for r in centre if fits[r.run_id].ok]
            values = ", ".join(f"{k}={mode[k]}" for k in keys)
            if ok:
                return made(
                    names[ok[0].run_id],
                    f"the leave-one-out centre, with the most common value of every differing param "
                    f"({values}){skipped}",
                )
            skipped += (
                f" (the leave-one-out centre {values} could not be fitted: {fits[centre[0].run_id].reason})"
            )
    first = fitted[0]
    return made(
        names[first.run_id],
        f"the first-started fitted run, {first.run_name!r}: no fitted run is named baseline and there "
        f"is no leave-one-out centre{skipped}; set {given_by} to choose",
    )


def _half_check(run: RunData, protocol: FitProtocol, *, cut) -> tuple[SigmoidFit | None, HalfCheck]:
    """Fit on compute <= budget/2 (with the run's early cut ``cut``, the same as its full fit's),
    compare with the observed second half."""
    out = NO_CHECK
    c, y = run.compute, run.reward
    fin = np.isfinite(c) & np.isfinite(y)
    if not fin.any():
        return None, out
    budget = float(c[fin].max())
    first = fin & (c <= budget / 2)
    second = fin & (c > budget / 2)
    if not second.any():
        return None, out
    fit = protocol.fit(c[first], y[first], min_compute=cut, bootstrap=0)
    if not fit.ok or fit.through_points:  # it predicts nothing
        return fit, out
    pred = fit.predict(c[second])
    err = pred - y[second]
    last = int(np.argmax(c[second]))
    return fit, HalfCheck(int(second.sum()), float(np.mean(np.abs(err))), float(err[last]))


def _sort_key(row: RunRow | PooledRow):
    a = row.fit.A
    return (0, -a) if math.isfinite(a) else (1, 0.0)


def analyse_runs(
    runs: Sequence[RunData],
    protocol: FitProtocol | None = None,
    *,
    baseline: str | None = None,
    baseline_given_by: str = "--baseline",
    other_variants: Sequence[str] = (),
    fixed_A: bool = True,
    predict_check: bool = True,
    pool_seeds: bool = False,
    sort: bool = True,
    variant_order: Sequence[str] = (),
) -> ExperimentResult:
    """Fit every run, build the comparison rows (see the module docstring for the keys) and the
    per-variant verdicts.

    ``protocol``: how every fit is made (default: ``FitProtocol()``, the ``scaling`` config's
    defaults). Early points, those before step ``protocol.min_step`` or below
    ``protocol.min_compute`` (compute-axis units), are left out of every fit, the same absolute cut
    for every run (:meth:`FitProtocol.cut`).
    ``delta_A = A - A(baseline)`` and ``delta_B = B - B(baseline)``, where ``A(baseline)``,
    ``B(baseline)`` are the means over the fitted runs of the baseline *variant* (all its seeds);
    see :func:`choose_baseline` for ``baseline``, ``baseline_given_by`` and ``other_variants``.
    Rows are sorted by A (unfittable last) unless ``sort`` is false (then in the order of ``runs``);
    verdicts list the baseline first, then ``variant_order``."""
    protocol = protocol or FitProtocol()
    runs = list(runs)
    _check_metric(runs, protocol)
    differing = differing_params(runs)
    names = {r.run_id: _variant_name(r, differing) for r in runs}
    fits = {r.run_id: _fit_run(r, protocol) for r in runs}
    checks: dict[str, HalfCheck] = {}
    half_fits: dict[str, SigmoidFit] = {}
    if predict_check:
        for r in runs:
            hf, checks[r.run_id] = _half_check(r, protocol, cut=protocol.cut_of(r))
            if hf is not None:
                half_fits[r.run_id] = hf

    base = choose_baseline(
        runs, fits, names, differing, baseline, given_by=baseline_given_by, other_variants=other_variants
    )
    ok_a = [f.A for f in fits.values() if f.ok]
    a_fix = baseline_A([fits[i] for i in base.run_ids] if base.variant is not None else [])[0]
    fixed_fits = fixed_A_fits(runs, fits, a_fix) if fixed_A else {}
    vs = verdicts(
        runs,
        names,
        fits,
        base.variant,
        protocol,
        order=variant_order,
        fixed_fits=fixed_fits if fixed_A else None,
        predict=predict_check,
    )
    said = {v.variant: v.verdict for v in vs}
    rows = [
        _run_row(
            r,
            differing,
            FitCells.of(fits[r.run_id]),
            checks.get(r.run_id),
            variant=names[r.run_id],
            base=base,
            A_fixed=a_fix,
            refit=fixed_fits.get(r.run_id),
            verdict=said.get(names[r.run_id], ""),
        )
        for r in runs
    ]
    if sort:
        rows.sort(key=_sort_key)
    res = ExperimentResult(
        rows=rows,
        runs=runs,
        fits=fits,
        fixed_fits=fixed_fits,
        half_fits=half_fits,
        differing=differing,
        baseline=base,
        A_mean=float(np.mean(ok_a)) if ok_a else math.nan,
        A_fixed=a_fix,
        verdicts=vs,
    )
    if pool_seeds:
        _pool(res, protocol)
    return res


def _check_metric(runs: Sequence[RunData], protocol: FitProtocol) -> None:
    """Refuse a run whose curve is another metric than the one the protocol says it fits."""
    other = next((r for r in runs if r.reward_key != protocol.reward_key), None)
    if other is not None:
        raise AnalysisError(
            f"run {other.run_name}: its curve is {other.reward_key}, the fit protocol's metric is "
            f"{protocol.reward_key} (load the runs with reward_key=protocol.reward_key)"
        )


def _fit_run(r: RunData, protocol: FitProtocol) -> SigmoidFit:
    """The run's own fit, its failure reason naming the evaluations the loading skipped."""
    fit = protocol.fit(r.compute, r.reward, min_compute=protocol.cut_of(r))
    if r.compute.size == 0:
        fit.reason = f"no {r.reward_key} evaluations paired with compute"
    if not fit.ok and r.notes:  # say which evaluations were skipped, and why
        fit.reason = f"{fit.reason} ({'; '.join(r.notes)})"
    return fit


def _run_row(
    r: RunData,
    differing: Sequence[str],
    fit: FitCells,
    check: HalfCheck | None,
    *,
    variant: str,
    base: Baseline,
    A_fixed: float,
    refit: SigmoidFit | None,
    verdict: str,
) -> RunRow:
    """The run's row: its fit, its curve's ends, and how it compares with the baseline ``base``."""
    fin = r.compute[np.isfinite(r.compute)]
    order = np.argsort(r.steps, kind="stable")
    compared = base.ok and fit.ok
    refitted = refit is not None and refit.ok
    return RunRow(
        run_id=r.run_id,
        run_name=r.run_name,
        status=r.status.lower(),
        variant=variant,
        params={k: r.params.get(k, "") for k in differing},
        compute_axis=r.compute_axis,
        fit=fit,
        n_evals=int(r.compute.size),
        budget=float(fin.max()) if fin.size else math.nan,
        pass_rate_start=float(r.reward[order[0]]) if r.reward.size else math.nan,
        pass_rate_final=float(r.reward[order[-1]]) if r.reward.size else math.nan,
        check=check,
        baseline=base.variant is not None and variant == base.variant,
        delta_A=fit.A - base.A if compared else math.nan,
        delta_B=fit.B - base.B if compared else math.nan,
        A_fixed=A_fixed,
        B_fixed_A=refit.B if refitted else math.nan,
        C_mid_fixed_A=refit.C_mid if refitted else math.nan,
        verdict=verdict,
    )


def _pool(res: ExperimentResult, p: FitProtocol) -> None:
    """One pooled fit per recipe that has several seeds (seed-level bootstrap)."""
    recipe_keys = [k for k in res.differing if k not in SEED_KEYS]
    groups: dict[tuple, list[RunData]] = {}
    for r in res.runs:
        groups.setdefault(tuple(r.params.get(k, "") for k in recipe_keys), []).append(r)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        fit = p.fit_runs([(m.compute, m.reward) for m in members], [p.cut_of(m) for m in members])
        name = ", ".join(f"{k}={v}" for k, v in zip(recipe_keys, key)) or "all runs"
        res.pooled_fits[name] = fit
        res.pooled_rows.append(
            PooledRow(
                name, n_runs=len(members), run_ids=",".join(m.run_id for m in members), fit=FitCells.of(fit)
            )
        )
    res.pooled_rows.sort(key=_sort_key)


def fit_experiment(
    client,
    experiment_or_runs: str | Sequence[str] | Sequence[RunData],
    *,
    include_running: bool = False,
    protocol: FitProtocol | None = None,
    baseline: str | None = None,
    fixed_A: bool = True,
    predict_check: bool = True,
) -> list[RunRow]:
    """Fit the runs of an MLflow experiment (by name) or a list of run ids / loaded runs and
    return the report rows, sorted by A (see the module docstring).  ``baseline``: run id, run
    name or variant name; its variant is the reference of ``delta_A``/``delta_B`` (default: the
    baseline the runs' sweep declared, else :func:`choose_baseline`'s rules); each row carries its
    variant's ``verdict`` (:mod:`scalerl.analysis.verdicts`)."""
    key = (protocol or FitProtocol()).reward_key  # the fitted metric
    if isinstance(experiment_or_runs, str):
        runs = load_runs(client, experiment_or_runs, include_running=include_running, reward_key=key)
    elif experiment_or_runs and isinstance(next(iter(experiment_or_runs)), RunData):
        runs = list(experiment_or_runs)
    else:
        runs = load_runs(client, run_ids=list(experiment_or_runs), reward_key=key)
    baseline, given_by = baseline_argument(client, runs, baseline)
    return analyse_runs(
        runs,
        protocol,
        baseline=baseline,
        baseline_given_by=given_by,
        fixed_A=fixed_A,
        predict_check=predict_check,
    ).rows


def left_out_rows(runs: Sequence[RunData], left_out: Sequence[tuple[RunData, str]]) -> list[dict]:
    """Table rows (:func:`~scalerl.analysis.reporting.report`'s ``pending``) of the runs
    :func:`~scalerl.analysis.mlflow_io.load_runs` left out (``(run, why)``): named, never fitted,
    their variant named as the fitted runs' are, with the params it differs from them in (a param
    it did not log, e.g. a run that crashed at its start, names nothing)."""
    base = differing_params(runs)

    def differing(r: RunData) -> list[str]:
        return [k for k in differing_params([*runs, r]) if k in base or k in r.params]

    return [
        {
            "run_id": r.run_id,
            "run_name": r.run_name,
            "variant": _variant_name(r, differing(r)),
            **{k: r.params.get(k, "") for k in differing(r)},
            "status": r.status.lower(),
            "ok": False,
            "reason": "",
            "left_out": why,
        }
        for r, why in left_out
    ]


def left_out_summary(left_out: Sequence[tuple[RunData, str]], limit: int = 4) -> str:
    """One line: the left-out runs grouped by why, e.g. ``3 runs FAILED (a, b, c); 1 run still
    RUNNING (--include-running fits it) (d)``."""
    by: dict[str, list[str]] = {}
    for r, why in left_out:
        by.setdefault(why, []).append(r.run_name)
    parts = []
    for why, names in by.items():
        shown = ", ".join(names[:limit]) + (
            f", ... ({len(names) - limit} more)" if len(names) > limit else ""
        )
        what = why[4:] if why.startswith("run ") else why
        parts.append(f"{len(names)} run{'s' if len(names) != 1 else ''} {what} ({shown})")
    return "; ".join(parts)


def baseline_argument(client, runs: Sequence[RunData], baseline: str | None) -> tuple[str | None, str]:
    """(baseline, who gave it) for :func:`analyse_runs`: ``baseline`` as given (``--baseline``);
    else the baseline variant the runs' sweep declared (param ``sweep.baseline`` of the parent run
    they all share), so the analysis of a sweep's runs measures deltas against the same variant as
    the sweep report; else ``(None, "--baseline")`` (chosen by :func:`choose_baseline`)."""
    if baseline:
        return baseline, "--baseline"
    declared = declared_baseline(client, runs)
    if declared:
        return declared
    return None, "--baseline"


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------

_FLOAT3 = {"A", "A_lo", "A_hi", "R0", "delta_A", "A_fixed", "pred_mae", "pred_err_last"}
_FLOAT2 = {"B", "B_lo", "B_hi", "B_fixed_A", "delta_B"}
_SIGNED = {"delta_A", "delta_B", "pred_err_last"}
FIT_KEYS = (
    "run_id",
    "run_name",
    "status",
    "variant",
    "compute_axis",
    "ok",
    "reason",
    "A",
    "A_lo",
    "A_hi",
    "B",
    "B_lo",
    "B_hi",
    "C_mid",
    "C_mid_lo",
    "C_mid_hi",
    "R0",
    "n_points",
    "n_excluded",
    "n_evals",
    "budget",
    "pass_rate_start",
    "pass_rate_final",
    "baseline",
    "delta_A",
    "delta_B",
    "A_fixed",
    "B_fixed_A",
    "C_mid_fixed_A",
    "pred_n",
    "pred_mae",
    "pred_err_last",
    "verdict",
    "n_runs",
    "run_ids",
    "left_out",
)
"""Row keys that are not recipe params (everything else in a row is a table column of its own)."""
EXTRA_KEYS = ("job", "seed", "overrides", "steps", "log", "error")
"""Row keys a sweep adds (see :mod:`scalerl.sweep.report`); ``seed`` is shown when it differs."""
START_FINAL = " start → final"
"""The end of the table column of the fitted metric's first and last evaluation (the rows'
``pass_rate_start`` and ``pass_rate_final``, whichever metric was fitted)."""


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(key: str, v) -> str:
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        spec = ".3f" if key in _FLOAT3 else ".2f" if key in _FLOAT2 else ".4g"
        return format(v, ("+" if key in _SIGNED else "") + spec)
    return str(v).replace("|", "/").replace("\n", " ")


def default_columns(rows: Sequence[dict], *, level: float = 0.9, metric: str = REWARD_KEY) -> list[str]:
    """run name, variant (when runs name one), the recipe params that differ, status, A [CI], B,
    C_mid, R0, points, the deltas to the baseline (point estimates), B at the mean A, the
    prediction check, the fitted ``metric`` (the pass rate, or a pass@k) at the start and the end,
    the variant's verdict and a note; columns with nothing to show are left out."""
    if not rows:
        return []
    skip = set(FIT_KEYS) | set(EXTRA_KEYS)
    recipe: list[str] = []
    for r in rows:
        recipe += [k for k in r if k not in skip and k not in recipe]
    name = "run_name" if "run_name" in rows[0] else "variant"
    cols = [name]
    if name == "run_name" and any(
        r.get("variant") not in ("", None, r.get("run_name")) and "=" not in str(r.get("variant"))
        for r in rows
    ):
        cols.append("variant")
    if "seed" not in recipe and len({str(r.get("seed", "")) for r in rows}) > 1:
        cols.append("seed")
    cols += recipe
    if "status" in rows[0]:
        cols.append("status")
    cols += [f"A [{level:.0%} CI]", "B", "C_mid", "R0", "points"]
    if any(_finite(r.get("delta_A")) for r in rows):
        cols += ["delta_A", "delta_B"]
    if any(_finite(r.get("B_fixed_A")) for r in rows):
        cols += ["B_fixed_A"]
    if any("pred_mae" in r for r in rows):
        cols += ["pred_mae", "pred_err_last"]
    if any(_finite(r.get("pass_rate_start")) for r in rows):
        cols += [("pass rate" if metric == REWARD_KEY else metric) + START_FINAL]
    if any(r.get("verdict") for r in rows):
        cols += ["verdict"]
    cols += ["note"]
    return cols


def _header(col: str, rows: Sequence[dict]) -> str:
    if col == "B_fixed_A":
        a = next((r.get("A_fixed") for r in rows if _finite(r.get("A_fixed"))), math.nan)
        return f"B @ A={a:.3f}"
    return {"delta_A": "ΔA", "delta_B": "ΔB", "verdict": "verdict (variant)"}.get(col, col)


def row_notes(row: dict) -> list[str]:
    """The note column: baseline, why a run was not fitted, an unsettled ceiling, a sweep job's error
    and log."""
    notes = []
    if row.get("baseline"):
        notes.append("baseline")
    if row.get("left_out"):
        notes.append(f"left out: {row['left_out']}")
    status = str(row.get("status", "finished")).lower()
    fitted_status = status in ("finished", "running")
    if not row.get("ok") and row.get("reason") and fitted_status:
        notes.append(f"unfittable: {row['reason']}")
    if row.get("ok") and not fitted_status:  # chosen by run id: fitted on what it logged before it stopped
        notes.append(f"run {status.upper()}: fitted on the evaluations it logged before it ended")
    if row.get("ok") and _finite(row.get("A_hi")) and row["A_hi"] >= A_UNSETTLED:
        notes.append(
            "A censored at 1: its interval reaches 1, so the data cannot rule out a ceiling of 1 (run longer); "
            "kept in its variant's A at its fitted value"
        )
    elif row.get("ok") and _finite(row.get("A")):
        why = _a_unsettled_row(row)
        if why.startswith("fitted through"):
            notes.append(f"A unusable ({why}): not in its variant's A")
        elif why:
            notes.append(f"A censored ({why}): kept in its variant's A at its fitted value")
    if not fitted_status:
        if row.get("error"):
            notes.append(str(row["error"]))
        if row.get("log"):
            notes.append(f"log: {row['log']}")
    return notes


def _a_unsettled_row(row: dict) -> str:
    """:func:`~scalerl.analysis.verdicts.a_unsettled` from a row's values (the interval aside); an A at
    R0 (a curve that did not rise) is an ordinary value under the verdicts' rule."""
    n = row.get("n_points")
    if isinstance(n, int) and n <= N_PARAMS:
        return f"fitted through {n} points for {N_PARAMS} parameters: A is set by those points alone, not a ceiling"
    if row["A"] >= A_UNSETTLED:
        return "A at 1"
    return ""


def _cell(row: dict, col: str) -> str:
    if col.startswith("A [") and col.endswith("CI]"):
        if not row.get("ok"):
            return ""
        s = f"{row['A']:.3f}"
        if _finite(row.get("A_lo")):
            s += f" [{row['A_lo']:.3f}, {row['A_hi']:.3f}]"
        return s
    if col in ("B", "C_mid", "R0") and not row.get("ok"):
        return ""
    if col == "points":
        if "n_points" not in row:
            return ""
        return f"{row.get('n_points', 0)}/{row.get('n_evals', row.get('n_points', 0))}"
    if col.endswith(START_FINAL):
        a, b = row.get("pass_rate_start"), row.get("pass_rate_final")
        return f"{a:.3f} → {b:.3f}" if _finite(a) and _finite(b) else ""
    if col == "note":
        return "; ".join(row_notes(row)).replace("|", "/").replace("\n", " ")
    return _fmt(col, row.get(col, ""))


TableRow = dict | RunRow | PooledRow
"""A row as the table takes it: an analysed run's or a pooled recipe's, or a dict in the table form
(the runs :func:`left_out_rows` and a sweep's failed jobs, which have no fit)."""


def table_form(rows: Sequence[TableRow]) -> list[dict]:
    """The rows as dicts: :meth:`RunRow.as_dict` for an analysed one, a dict as it is."""
    return [r if isinstance(r, dict) else r.as_dict() for r in rows]


def rows_to_markdown(
    rows: Sequence[TableRow],
    columns: Sequence[str] | None = None,
    *,
    level: float = 0.9,
    metric: str = REWARD_KEY,
) -> str:
    """A Markdown table of the rows (default columns: :func:`default_columns`; ``metric``: what the
    rows' ``pass_rate_start`` and ``pass_rate_final`` hold, the fitted metric)."""
    rows = table_form(rows)
    if not rows:
        return "(no runs)\n"
    cols = list(columns) if columns else default_columns(rows, level=level, metric=metric)
    head = [_header(c, rows) for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r, c) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def rows_to_csv(rows: Sequence[TableRow], path) -> Path:
    """All scalar keys of the rows' table form as CSV (union of keys, first-seen order)."""
    rows = table_form(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in keys and (v is None or isinstance(v, (str, int, float, bool))):
                keys.append(k)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    return path
