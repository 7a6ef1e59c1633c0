"""Fit every run of an experiment, compare recipes, build report rows.

Row keys (one dict per run, sorted by A, unfittable runs last):
``run_id, run_name, status, variant, <each recipe param that differs between runs>, compute_axis,
ok, reason, A, A_lo, A_hi, B, B_lo, B_hi, C_mid, C_mid_lo, C_mid_hi, R0, n_points, n_excluded,
n_evals, budget, baseline, delta_A, exceeds_margin, A_fixed, B_fixed_A, C_mid_fixed_A,
pred_n, pred_mae, pred_err_last``.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalerl.analysis.mlflow_io import RunData, load_runs
from scalerl.scaling.sigmoid import DEFAULT_METHOD, SigmoidFit, fit_fixed_A, fit_sigmoid, fit_sigmoid_runs

RECIPE_GROUPS = ("loss", "async_mode", "precision", "aggregation", "norm", "filter", "length_control")
"""Config groups logged as params named after the group (value = the chosen option)."""
MARGIN_A = 0.02
"""The paper's margin on A: three seeds differed by at most 0.015."""
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


@dataclass
class ExperimentResult:
    rows: list[dict]
    runs: list[RunData]
    fits: dict[str, SigmoidFit]
    """run_id -> full fit."""
    fixed_fits: dict[str, SigmoidFit] = field(default_factory=dict)
    """run_id -> fit with A fixed to the sweep mean."""
    half_fits: dict[str, SigmoidFit] = field(default_factory=dict)
    """run_id -> fit on the first half of the compute (prediction check)."""
    differing: list[str] = field(default_factory=list)
    baseline: str | None = None
    A_mean: float = math.nan
    pooled_rows: list[dict] = field(default_factory=list)
    pooled_fits: dict[str, SigmoidFit] = field(default_factory=dict)


def _ignored(key: str) -> bool:
    k = key.lower()
    if k in IGNORED_PARAMS or k.startswith(IGNORED_PARAM_PREFIXES):
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
    return ", ".join(parts) if parts else "baseline"


def _pick_baseline(runs: list[RunData], names: dict[str, str], differing: list[str], baseline: str | None):
    if baseline:
        for r in runs:
            if baseline in (r.run_id, r.run_name, names[r.run_id]):
                return r.run_id
        return None
    for r in runs:
        if names[r.run_id] == "baseline" or r.run_name == "baseline":
            return r.run_id
    # A leave-one-out sweep: the baseline takes the most common value on every axis.
    keys = [k for k in differing if k not in SEED_KEYS]
    if not keys or len(runs) < 3:
        return None
    mode = {k: Counter(r.params.get(k) for r in runs).most_common(1)[0][0] for k in keys}
    hits = [r.run_id for r in runs if all(r.params.get(k) == mode[k] for k in keys)]
    return hits[0] if len(hits) == 1 else None


def _half_check(run: RunData, *, method, min_compute_frac) -> tuple[SigmoidFit | None, dict]:
    """Fit on compute <= budget/2, compare with the observed second half."""
    out = {"pred_n": 0, "pred_mae": math.nan, "pred_err_last": math.nan}
    c, y = run.compute, run.reward
    fin = np.isfinite(c) & np.isfinite(y)
    if not fin.any():
        return None, out
    budget = float(c[fin].max())
    first = fin & (c <= budget / 2)
    second = fin & (c > budget / 2)
    if not second.any():
        return None, out
    half_budget = float(c[first].max()) if first.any() else 0.0
    fit = fit_sigmoid(
        c[first],
        y[first],
        min_compute=min_compute_frac * half_budget,
        method=method,
        bootstrap=0,
        drop_nonfinite=True,
    )
    if not fit.ok:
        return fit, out
    pred = fit.predict(c[second])
    err = pred - y[second]
    last = int(np.argmax(c[second]))
    out.update(pred_n=int(second.sum()), pred_mae=float(np.mean(np.abs(err))), pred_err_last=float(err[last]))
    return fit, out


def _fit_row(fit: SigmoidFit) -> dict:
    row = {
        "ok": bool(fit.ok),
        "reason": fit.reason,
        "A": fit.A,
        "A_lo": fit.ci.get("A", (math.nan, math.nan))[0],
        "A_hi": fit.ci.get("A", (math.nan, math.nan))[1],
        "B": fit.B,
        "B_lo": fit.ci.get("B", (math.nan, math.nan))[0],
        "B_hi": fit.ci.get("B", (math.nan, math.nan))[1],
        "C_mid": fit.C_mid,
        "C_mid_lo": fit.ci.get("C_mid", (math.nan, math.nan))[0],
        "C_mid_hi": fit.ci.get("C_mid", (math.nan, math.nan))[1],
        "R0": fit.R0,
        "n_points": int(fit.n_points),
        "n_excluded": len(fit.excluded),
    }
    return row


def _sort_key(row):
    a = row.get("A", math.nan)
    return (0, -a) if isinstance(a, float) and math.isfinite(a) else (1, 0.0)


def analyse_runs(
    runs: Sequence[RunData],
    *,
    method: str = DEFAULT_METHOD,
    min_compute_frac: float = 0.1,
    bootstrap: int = 200,
    level: float = 0.9,
    baseline: str | None = None,
    margin: float = MARGIN_A,
    fixed_A: bool = True,
    predict_check: bool = True,
    pool_seeds: bool = False,
    seed: int = 0,
) -> ExperimentResult:
    """Fit every run and build the comparison rows (see the module docstring for the keys)."""
    runs = list(runs)
    differing = differing_params(runs)
    names = {r.run_id: _variant_name(r, differing) for r in runs}
    fits: dict[str, SigmoidFit] = {}
    rows: list[dict] = []
    half_fits: dict[str, SigmoidFit] = {}
    for r in runs:
        c = r.compute
        fin = c[np.isfinite(c)]
        budget = float(fin.max()) if fin.size else math.nan
        mc = min_compute_frac * budget if math.isfinite(budget) else 0.0
        fit = fit_sigmoid(
            c,
            r.reward,
            min_compute=mc,
            method=method,
            bootstrap=bootstrap,
            level=level,
            seed=seed,
            drop_nonfinite=True,
        )
        if r.compute.size == 0:
            fit.reason = "no val/pass_rate evaluations paired with compute"
        fits[r.run_id] = fit
        row = {
            "run_id": r.run_id,
            "run_name": r.run_name,
            "status": r.status,
            "variant": names[r.run_id],
            **{k: r.params.get(k, "") for k in differing},
            "compute_axis": r.compute_axis,
            **_fit_row(fit),
            "n_evals": int(r.compute.size),
            "budget": budget,
        }
        if predict_check:
            hf, pred = _half_check(r, method=method, min_compute_frac=min_compute_frac)
            if hf is not None:
                half_fits[r.run_id] = hf
            row.update(pred)
        rows.append(row)

    base_id = _pick_baseline(runs, names, differing, baseline)
    base_fit = fits.get(base_id) if base_id else None
    ok_a = [f.A for f in fits.values() if f.ok]
    a_mean = float(np.mean(ok_a)) if ok_a else math.nan
    fixed_fits: dict[str, SigmoidFit] = {}
    for row in rows:
        rid = row["run_id"]
        row["baseline"] = rid == base_id
        if base_fit is not None and base_fit.ok and row["ok"]:
            row["delta_A"] = row["A"] - base_fit.A
            row["exceeds_margin"] = abs(row["delta_A"]) > margin
        else:
            row["delta_A"] = math.nan
            row["exceeds_margin"] = False
        row["A_fixed"] = a_mean
        row["B_fixed_A"] = math.nan
        row["C_mid_fixed_A"] = math.nan
        if fixed_A and row["ok"] and math.isfinite(a_mean):
            f = fits[rid]
            ff = fit_fixed_A(f.compute, f.reward, a_mean, min_compute=f.min_compute, drop_nonfinite=True)
            fixed_fits[rid] = ff
            if ff.ok:
                row["B_fixed_A"] = ff.B
                row["C_mid_fixed_A"] = ff.C_mid
    rows.sort(key=_sort_key)
    res = ExperimentResult(
        rows=rows,
        runs=runs,
        fits=fits,
        fixed_fits=fixed_fits,
        half_fits=half_fits,
        differing=differing,
        baseline=base_id,
        A_mean=a_mean,
    )
    if pool_seeds:
        _pool(
            res, method=method, min_compute_frac=min_compute_frac, bootstrap=bootstrap, level=level, seed=seed
        )
    return res


def _pool(res: ExperimentResult, *, method, min_compute_frac, bootstrap, level, seed) -> None:
    """One pooled fit per recipe that has several seeds (seed-level bootstrap)."""
    recipe_keys = [k for k in res.differing if k not in SEED_KEYS]
    groups: dict[tuple, list[RunData]] = {}
    for r in res.runs:
        groups.setdefault(tuple(r.params.get(k, "") for k in recipe_keys), []).append(r)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        budget = (
            max(float(np.nanmax(m.compute)) for m in members if m.compute.size)
            if any(m.compute.size for m in members)
            else 0.0
        )
        fit = fit_sigmoid_runs(
            [(m.compute, m.reward) for m in members],
            min_compute=min_compute_frac * budget,
            method=method,
            bootstrap=bootstrap,
            level=level,
            seed=seed,
            drop_nonfinite=True,
        )
        name = ", ".join(f"{k}={v}" for k, v in zip(recipe_keys, key)) or "all runs"
        res.pooled_fits[name] = fit
        res.pooled_rows.append(
            {
                "variant": name,
                "n_runs": len(members),
                "run_ids": ",".join(m.run_id for m in members),
                **_fit_row(fit),
            }
        )
    res.pooled_rows.sort(key=_sort_key)


def fit_experiment(
    client,
    experiment_or_runs: str | Sequence[str] | Sequence[RunData],
    *,
    include_running: bool = False,
    method: str = DEFAULT_METHOD,
    min_compute_frac: float = 0.1,
    bootstrap: int = 200,
    level: float = 0.9,
    baseline: str | None = None,
    margin: float = MARGIN_A,
    fixed_A: bool = True,
    predict_check: bool = True,
    seed: int = 0,
) -> list[dict]:
    """Fit the runs of an MLflow experiment (by name) or a list of run ids / loaded runs and
    return the report rows, sorted by A (see the module docstring).  ``baseline``: run id, run
    name or variant name of the reference run for ``delta_A`` (default: a run tagged/named
    "baseline", else in a leave-one-out sweep the run with the most common value on every axis).
    ``exceeds_margin``: ``|delta_A| > margin`` (the paper's 0.02)."""
    if isinstance(experiment_or_runs, str):
        runs = load_runs(client, experiment_or_runs, include_running=include_running)
    elif experiment_or_runs and isinstance(next(iter(experiment_or_runs)), RunData):
        runs = list(experiment_or_runs)
    else:
        runs = load_runs(client, run_ids=list(experiment_or_runs))
    return analyse_runs(
        runs,
        method=method,
        min_compute_frac=min_compute_frac,
        bootstrap=bootstrap,
        level=level,
        baseline=baseline,
        margin=margin,
        fixed_A=fixed_A,
        predict_check=predict_check,
        seed=seed,
    ).rows


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------

_FLOAT3 = {"A", "A_lo", "A_hi", "R0", "delta_A", "A_fixed", "pred_mae", "pred_err_last"}
_FLOAT2 = {"B", "B_lo", "B_hi", "B_fixed_A"}


def _fmt(key: str, v) -> str:
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if key in _FLOAT3:
            return f"{v:+.3f}" if key in ("delta_A", "pred_err_last") else f"{v:.3f}"
        if key in _FLOAT2:
            return f"{v:.2f}"
        return f"{v:.4g}"
    return str(v).replace("|", "/")


def default_columns(rows: Sequence[dict]) -> list[str]:
    """run, variant columns, A [CI], B, C_mid, R0, points, comparison and prediction columns."""
    if not rows:
        return []
    fixed = [
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
        "baseline",
        "delta_A",
        "exceeds_margin",
        "A_fixed",
        "B_fixed_A",
        "C_mid_fixed_A",
        "pred_n",
        "pred_mae",
        "pred_err_last",
        "n_runs",
        "run_ids",
    ]
    recipe = [k for k in rows[0] if k not in fixed]
    cols = ["run_name"] + recipe + ["A [CI]", "B", "C_mid", "R0", "points"]
    if any(isinstance(r.get("delta_A"), float) and math.isfinite(r["delta_A"]) for r in rows):
        cols += ["delta_A", "exceeds_margin"]
    if any(isinstance(r.get("B_fixed_A"), float) and math.isfinite(r["B_fixed_A"]) for r in rows):
        cols += ["B_fixed_A"]
    if any("pred_mae" in r for r in rows):
        cols += ["pred_mae", "pred_err_last"]
    cols += ["note"]
    if "run_name" not in rows[0]:
        cols[0] = "variant"
    return cols


def _cell(row: dict, col: str) -> str:
    if col == "A [CI]":
        if not row.get("ok"):
            return ""
        s = f"{row['A']:.3f}"
        if math.isfinite(row.get("A_lo", math.nan)):
            s += f" [{row['A_lo']:.3f}, {row['A_hi']:.3f}]"
        return s
    if col == "points":
        return f"{row.get('n_points', 0)}/{row.get('n_evals', row.get('n_points', 0))}"
    if col == "note":
        notes = []
        if row.get("baseline"):
            notes.append("baseline")
        if not row.get("ok"):
            notes.append(f"unfittable: {row.get('reason', '')}")
        return "; ".join(notes).replace("|", "/")
    return _fmt(col, row.get(col, ""))


def rows_to_markdown(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of the rows (default columns: :func:`default_columns`)."""
    rows = list(rows)
    if not rows:
        return "(no runs)\n"
    cols = list(columns) if columns else default_columns(rows)
    head = [c if c != "B_fixed_A" else f"B @ A={rows[0].get('A_fixed', math.nan):.3f}" for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r, c) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def rows_to_csv(rows: Sequence[dict], path) -> Path:
    """All scalar keys of the rows as CSV (union of keys, first-seen order)."""
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
