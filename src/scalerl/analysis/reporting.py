"""The report: one function that turns runs' curves into the comparison table, its files, its plots
and the ``fit/*`` metrics written back to the runs. ``python -m scalerl.analysis`` and the sweep
report (:mod:`scalerl.sweep.report`) both call :func:`report`.

Files written into ``out_dir``: ``fits.csv`` (every row key), ``fits.md`` (the title, the fit
settings, the table and its legend), ``fits.json``, ``runs/<run>/scaling_curve.png`` (one per run),
and with ``comparison``: ``scaling_curves.png`` (every run on one figure), ``linearised.png``
(``log F(R)`` against ``log C``, A fixed to the mean A: slope = B) and, with seeds pooled,
``pooled_curves.png`` / ``pooled_fits.csv``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalerl.analysis.experiment import (
    MARGIN_A,
    Baseline,
    ExperimentResult,
    analyse_runs,
    rows_to_csv,
    rows_to_markdown,
)
from scalerl.analysis.mlflow_io import RunData, write_back
from scalerl.scaling.sigmoid import DEFAULT_METHOD

WRITE_BACK_KEYS = (
    "delta_A",
    "delta_B",
    "A_fixed",
    "B_fixed_A",
    "C_mid_fixed_A",
    "pred_mae",
    "pred_err_last",
)
"""Row values logged as ``fit/<key>`` next to the fit's own metrics (``SigmoidFit.to_metrics``)."""


@dataclass
class FitOptions:
    """How the runs are fitted and compared (the analysis CLI's options; a sweep's ``scaling``)."""

    method: str = DEFAULT_METHOD
    min_compute_frac: float = 0.1
    bootstrap: int = 200
    level: float = 0.9
    margin: float = MARGIN_A
    extrapolate: float = 2.0
    pool_seeds: bool = False
    seed: int = 0

    def describe(self, axis: str) -> str:
        return (
            f"Fit: `R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)` of `val/pass_rate` against compute "
            f"({axis}), method {self.method}, points below {self.min_compute_frac:.0%} of each run's "
            f"budget left out, {self.level:.0%} bootstrap intervals ({self.bootstrap} resamples)."
        )


@dataclass
class Report:
    rows: list[dict]
    """One per run (fitted runs and the ``pending`` ones), in table order."""
    markdown: str
    """The content of ``fits.md``: title, fit settings, table, legend."""
    table: str
    """The Markdown table alone."""
    legend: list[str]
    """The lines under the table (baseline and what the columns mean)."""
    baseline: Baseline
    result: ExperimentResult
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    """The top-level files of ``out_dir`` (CSV, Markdown, JSON, comparison plots)."""
    run_plots: dict[str, Path] = field(default_factory=dict)
    """run id -> its ``scaling_curve.png``."""
    written_back: int = 0


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


def _axis_label(runs: Sequence[RunData]) -> str:
    axes = {r.compute_axis for r in runs}
    return {"flops": "compute (FLOPs)", "device_hours": "compute (device-hours)"}.get(
        axes.pop() if len(axes) == 1 else "", "compute"
    )


def _labels(res: ExperimentResult) -> dict[str, str]:
    out = {}
    for r in res.runs:
        v = next(row["variant"] for row in res.rows if row["run_id"] == r.run_id)
        out[r.run_id] = r.run_name if v in ("", r.run_name) else f"{r.run_name} ({v})"
    return out


def _legend(res: ExperimentResult, opts: FitOptions) -> list[str]:
    base = res.baseline
    lines = []
    if base is not None and base.ok:
        lines.append(
            f"ΔA = A - A(baseline), ΔB = B - B(baseline), with A(baseline), B(baseline) the means over the "
            f"fitted runs of the baseline variant {base.variant!r} ({base.fitted} fitted: A {base.A:.3f}, "
            f"B {base.B:.2f}), {base.why}; `abs(ΔA) > {opts.margin:g}` flags a difference beyond the "
            f"paper's seed-to-seed margin on A."
        )
    elif base is not None:
        lines.append(f"ΔA, ΔB: {base.describe()}.")
    if math.isfinite(res.A_mean):
        lines.append(
            f"B @ A={res.A_mean:.3f}: B refitted with A fixed to the mean A over the fitted runs (the paper's "
            "way to compare efficiency when the ceilings are close)."
        )
    if any("pred_mae" in r for r in res.rows):
        lines.append(
            "pred_mae, pred_err_last: fit on the first half of the compute, its prediction's mean absolute "
            "error on the observed second half and signed error at the last evaluation."
        )
    return lines


def _plots(res: ExperimentResult, opts: FitOptions, out: Path, *, name: str, comparison: bool):
    from scalerl.scaling.plot import plot_fit, plot_linearised

    xlabel = _axis_label(res.runs)
    labels = _labels(res)
    run_plots: dict[str, Path] = {}
    for r in res.runs:
        run_plots[r.run_id] = plot_fit(
            out / "runs" / safe_name(f"{r.run_name}-{r.run_id[:8]}") / "scaling_curve.png",
            [(labels[r.run_id], res.fits[r.run_id])],
            extrapolate=opts.extrapolate,
            title=f"{r.run_name}: sigmoid fit",
            xlabel=xlabel,
        )
    files: list[Path] = []
    if not comparison or not res.runs:
        return files, run_plots
    order = [row["run_id"] for row in res.rows if row.get("run_id") in res.fits]
    files.append(
        plot_fit(
            out / "scaling_curves.png",
            [(labels[i], res.fits[i]) for i in order],
            extrapolate=opts.extrapolate,
            title=f"{name}: validation pass rate vs compute",
            xlabel=xlabel,
        )
    )
    lin = [(labels[i], res.fixed_fits[i]) for i in order if i in res.fixed_fits and res.fixed_fits[i].ok]
    title = f"{name}: linearised, A fixed to the mean {res.A_mean:.3f} (slope = B)"
    if not lin:
        lin = [(labels[i], res.fits[i]) for i in order if res.fits[i].ok]
        title = f"{name}: linearised fits (slope = B)"
    files.append(plot_linearised(out / "linearised.png", lin, title=title, xlabel=xlabel))
    if res.pooled_fits:
        files.append(
            plot_fit(
                out / "pooled_curves.png",
                list(res.pooled_fits.items()),
                extrapolate=opts.extrapolate,
                title=f"{name}: seeds pooled per recipe",
                xlabel=xlabel,
            )
        )
    return files, run_plots


def _write_back(client, res: ExperimentResult, rows: dict[str, dict], plots, opts: FitOptions, tags) -> int:
    n = 0
    base = res.baseline.variant if res.baseline is not None else None
    for r in res.runs:
        fit, row = res.fits[r.run_id], rows[r.run_id]
        metrics = fit.to_metrics("fit/")
        for key in WRITE_BACK_KEYS:
            v = row.get(key, math.nan)
            metrics[f"fit/{key}"] = float(v) if isinstance(v, (int, float)) else math.nan
        if math.isfinite(metrics["fit/delta_A"]):
            metrics["fit/exceeds_margin"] = 1.0 if row["exceeds_margin"] else 0.0
        run_tags = {
            "fit.method": opts.method,
            "fit.min_compute_frac": f"{opts.min_compute_frac:g}",
            "fit.variant": row["variant"],
            "fit.baseline": base or "",
            "fit.reason": fit.reason or "ok",
            "fit.summary": fit.summary(),
            **(tags or {}),
        }
        write_back(client, r, metrics, tags=run_tags, artifact=plots.get(r.run_id))
        n += 1
    return n


def report(
    runs: Sequence[RunData],
    out_dir,
    *,
    baseline: str | None = None,
    baseline_given_by: str = "--baseline",
    options: FitOptions | None = None,
    client=None,
    comparison: bool = True,
    name: str = "All runs",
    title: str = "",
    pending: Sequence[dict] = (),
    extra: dict[str, dict] | None = None,
    order: Sequence[str] | None = None,
    tags: dict[str, str] | None = None,
) -> Report:
    """Fit ``runs``, compare them with the baseline variant, write the files, write ``fit/*`` back.

    - ``baseline``: a run id, run name or variant name, given by ``baseline_given_by`` (a CLI
      flag, a sweep file); its variant (all its seeds) is the reference of ΔA and ΔB. None: chosen
      among the fitted runs, and :attr:`Report.baseline` says which and why
      (:func:`scalerl.analysis.experiment.choose_baseline`).
    - ``options``: :class:`FitOptions`.
    - ``client``: an MLflow client to write ``fit/*`` metrics, ``fit.*`` tags (plus ``tags``) and
      the run's ``scaling_curve.png`` back to every run; None writes nothing back.
    - ``comparison``: also draw the all-runs and linearised plots.
    - ``name``: plot titles; ``title``: the first line(s) of ``fits.md``.
    - ``pending``: rows of runs that have no curve to fit (a sweep's jobs that failed or did not
      finish), shown in the table unfitted; ``extra``: run id -> more row keys (a sweep's job,
      status, log); ``order``: run names in table order (default: sorted by A, unfittable last).
    """
    opts = options or FitOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = analyse_runs(
        runs,
        method=opts.method,
        min_compute_frac=opts.min_compute_frac,
        bootstrap=opts.bootstrap,
        level=opts.level,
        baseline=baseline,
        baseline_given_by=baseline_given_by,
        other_variants=[p["variant"] for p in pending if p.get("variant")],
        margin=opts.margin,
        pool_seeds=opts.pool_seeds,
        seed=opts.seed,
        sort=order is None,
    )
    base = res.baseline
    for row in res.rows:
        row.update((extra or {}).get(row["run_id"], {}))
    rows = list(res.rows)
    for p in pending:
        row = {"run_id": "", "ok": False, "reason": "", **p}
        row["baseline"] = base is not None and base.variant is not None and row.get("variant") == base.variant
        rows.append(row)
    if order is not None:
        rank = {n: i for i, n in enumerate(order)}
        rows.sort(key=lambda r: rank.get(r.get("run_name", ""), len(rank)))

    table = rows_to_markdown(rows, level=opts.level, margin=opts.margin)
    legend = _legend(res, opts)
    axes = sorted({r.compute_axis for r in res.runs}) or ["flops"]
    parts = [title.rstrip("\n") + "\n"] if title else []
    parts.append(opts.describe(", ".join(axes)) + "\n")
    markdown = "\n".join(parts) + "\n" + table + "\n" + "".join(line + "\n" for line in legend)

    files = [rows_to_csv(rows, out / "fits.csv")]
    (out / "fits.md").write_text(markdown)
    (out / "fits.json").write_text(json.dumps(rows, indent=1, default=str, allow_nan=True))
    files += [out / "fits.md", out / "fits.json"]
    if res.pooled_rows:
        files.append(rows_to_csv(res.pooled_rows, out / "pooled_fits.csv"))
    plot_files, run_plots = _plots(res, opts, out, name=name, comparison=comparison)
    files += plot_files
    n_back = 0
    if client is not None:
        n_back = _write_back(client, res, {r["run_id"]: r for r in res.rows}, run_plots, opts, tags)
    return Report(
        rows=rows,
        markdown=markdown,
        table=table,
        legend=legend,
        baseline=base,
        result=res,
        out_dir=out,
        files=files,
        run_plots=run_plots,
        written_back=n_back,
    )
