"""The report: one function that turns runs' curves into the comparison table, its files, its plots
and the ``fit/*`` metrics written back to the runs. ``python -m scalerl.analysis`` and the sweep
report (:mod:`scalerl.sweep.report`) both call :func:`report`.

Files written into ``out_dir``: ``fits.csv`` (every row key), ``fits.md`` (the title, the fit
settings, the verdict table per variant and its legend, then the per-run table and its legend),
``fits.json``, ``verdicts.csv`` (one row per variant), ``report.json`` (the machine-readable report
beside ``fits.md``: :func:`report_json`), ``runs/<run>/scaling_curve.png`` (one per run),
and with ``comparison``: ``variants.png`` (one panel per variant), ``forest.png`` (ΔA and ΔB with
their intervals), ``calibration.png`` (predicted vs observed end) (:mod:`scalerl.analysis.figures`),
``linearised.png`` (``log F(R)`` against ``log C``, A fixed to the baseline's A: slope = B; one line
per variant beyond :data:`MAX_LINES` runs), up to :data:`MAX_LINES` runs ``scaling_curves.png``
(every run on one figure) and, with seeds pooled, ``pooled_curves.png`` / ``pooled_fits.csv``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalerl.analysis.experiment import (
    SAME_RECIPE,
    Baseline,
    ExperimentResult,
    analyse_runs,
    rows_to_csv,
    rows_to_markdown,
)
from scalerl.analysis.mlflow_io import RunData, write_back
from scalerl.analysis.verdicts import (
    FAMILY_LEVEL,
    MARGIN_A,
    VariantVerdict,
    a_censored,
    a_unusable,
    eval_trials,
    family_summary,
    prediction_cell,
    prediction_summary,
    skill_summary,
    verdict_legend,
    verdict_table,
)
from scalerl.scaling.live import logged_metrics, prediction_metric
from scalerl.scaling.protocol import FitProtocol
from scalerl.scaling.sigmoid import SigmoidFit, fit_fixed_A, round_sig, round_to
from scalerl.storage import write_text_atomic

WRITE_BACK_KEYS = (
    "delta_A",
    "delta_B",
    "A_fixed",
    "B_fixed_A",
    "C_mid_fixed_A",
    "pred_mae",
    "pred_err_last",
)
"""Row values logged as ``fit/<key>`` next to the fit's own metrics (``SigmoidFit.to_metrics``),
rounded: pass-rate quantities to 0.001 (a difference of 1e-16 is 0), B's to 0.01, C_mid to 3
significant figures."""
_ROUND = {"delta_A": 3, "A_fixed": 3, "pred_mae": 3, "pred_err_last": 3, "delta_B": 2, "B_fixed_A": 2}
UI_TAGS = ("1 variant", "2 verdict", "3 A with CI", "4 B", "5 prediction error")
"""Short run tags that sort first in the MLflow run table (digits before letters): each run's
variant, its variant's verdict, A with the pooled interval, B and the half-budget prediction."""


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
    verdicts: list[VariantVerdict] = field(default_factory=list)
    verdict_table: str = ""
    """The Markdown verdict table alone (one row per variant)."""


def verdict_row(v: VariantVerdict) -> dict:
    """One row of ``verdicts.csv``."""
    pr = v.prediction
    return {
        "variant": v.variant,
        "baseline": v.baseline,
        "runs": len(v.run_ids),
        "fitted": v.fitted,
        "label": v.label,
        "A_settled": v.A.n,
        "A_censored": v.A.censored,
        "A_mean": v.A.mean,
        "A_sd": v.A.sd,
        "A_lo": v.A.lo,
        "A_hi": v.A.hi,
        "A_unsettled": v.A.unsettled,
        "A_fixed": v.family.A_fixed,
        "B_settled": v.B.n,
        "B_censored": v.B.censored,
        "B_mean": v.B.mean,
        "B_sd": v.B.sd,
        "B_lo": v.B.lo,
        "B_hi": v.B.hi,
        "B_unsettled": v.B.unsettled,
        "delta_A": v.dA.delta,
        "delta_A_lo": v.dA.lo,
        "delta_A_hi": v.dA.hi,
        "delta_A_p": v.dA.p,
        "eq_margin_A": v.dA.eq_margin,
        "eq_A_lo": v.dA.eq_lo,
        "eq_A_hi": v.dA.eq_hi,
        "eq_A_p": v.dA.eq_p,
        "equivalent_A": v.dA.equivalent,
        "detectable_A": v.dA.mdd,
        "delta_B": v.dB.delta,
        "delta_B_lo": v.dB.lo,
        "delta_B_hi": v.dB.hi,
        "delta_B_p": v.dB.p,
        "test_alpha": v.dA.alpha,
        "pred": pr.predicted,
        "observed": pr.observed,
        "pred_err": pr.err,
        "pred_lo": pr.lo,
        "pred_hi": pr.hi,
        "pred_ok": v.pred_ok,
        "pred_inside": pr.inside,
        "cannot_act": v.cannot_act,
        "inactive": v.inactive,
        "verdict": v.verdict,
    }


REPORT_SCHEMA = 2
"""``report.json``'s ``schema_version``: raised when a key changes meaning or goes away (a new key
does not raise it). 2: ``prediction.observed`` is the seeds' end over the last tenth of the compute
(1: their last evaluation), ``predicted`` and the band are of that end."""


def _json_safe(x):
    """``x`` with every NaN or infinity as None (JSON has no NaN: ``json.loads`` of a strict parser
    refuses it) and numpy scalars as Python numbers."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if hasattr(x, "item") and not isinstance(x, (int, float)):  # numpy scalar
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


def code_commit() -> str | None:
    """The git commit of the code writing the report (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else None


def machine() -> dict:
    """The machine the report is written on: CPU model (``/proc/cpuinfo``), logical cores, host."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": cpu or platform.processor() or None,
        "cores": os.cpu_count(),
        "host": platform.node() or None,
    }


def _seed(r: RunData) -> int | None:
    s = r.params.get("seed", r.tags.get("seed"))
    try:
        return int(str(s))
    except (TypeError, ValueError):
        return None


def _runs_commits(runs: Sequence[RunData]) -> list[str]:
    """The commits the runs logged (tag ``git_commit``), each once, sorted."""
    return sorted({r.tags.get("git_commit", "") for r in runs} - {""})


def _runs_commit(runs: Sequence[RunData]) -> str | None:
    """The commit the runs logged (tag ``git_commit``) when they agree; the report's own code's
    where none logged one; None where they disagree (no one commit made the study: ``commits``
    lists them)."""
    logged = _runs_commits(runs)
    if len(logged) == 1:
        return logged[0]
    return code_commit() if not logged else None


def variant_json(
    v: VariantVerdict,
    runs: dict[str, RunData],
    fits: dict[str, SigmoidFit],
    fixed_fits: dict[str, SigmoidFit] | None = None,
) -> dict:
    """One entry of ``report.json``'s ``variants``: the verdict table's numbers unrounded, the
    machine label (:attr:`VariantVerdict.label`), each seed's own fit and the prediction.
    ``C_mid``: the pooled fit of the variant's seeds (the figures'), else the geometric mean of
    the seeds' own fits' C_mid. ``A``, ``A_lo``, ``A_hi`` are the mean and interval over the usable
    seeds whether or not A is shown: where ``A_shown`` is false (at least half the seeds censored
    at 1, or fewer than 2 usable: ``A_not_shown_because``) they describe those seeds' fits, not a
    ceiling the data bound, and are not compared; likewise ``B``, ``B_shown``. ``A_equivalent``:
    the TOST on A found it equivalent within ``A_equivalence_margin`` (its ``1 - 2 alpha`` interval
    ``dA_eq_lo``, ``dA_eq_hi`` inside the margin), false where that was not shown, null where A was
    not tested for it; ``dA_p`` / ``dB_p`` the pair's two-sided Welch p-values (null: not tested,
    or ``dA_untestable`` / ``dB_untestable`` says why not). ``per_seed``: each seed's own fit, why
    its A is left out of ``A`` (``A_unusable``: fitted through too few points; null: in the mean),
    why it is censored at 1 (null: bounded), and its B refitted at the baseline's A (``B_at_A``,
    the values ``B`` averages)."""
    own = [fits[i] for i in v.run_ids if i in fits and fits[i].ok]
    c_mid = math.nan
    if v.pooled is not None and v.pooled.ok:
        c_mid = v.pooled.C_mid
    elif own and all(f.C_mid > 0 for f in own):
        c_mid = math.exp(sum(math.log(f.C_mid) for f in own) / len(own))
    pr = v.prediction
    per_seed = []
    for rid in v.run_ids:
        f = fits.get(rid)
        r = runs.get(rid)
        ok = f is not None and f.ok
        refit = (fixed_fits or {}).get(rid)
        per_seed.append(
            {
                "run_id": rid,
                "seed": _seed(r) if r is not None else None,
                "A": f.A if ok else None,
                "B": f.B if ok else None,
                "C_mid": f.C_mid if ok else None,
                "ok": bool(ok),
                # why the seed's A is left out of the variant's A (fitted through too few points)
                "A_unusable": (a_unusable(f) or None) if ok else None,
                "A_censored": (a_censored(f) or None) if ok and not a_unusable(f) else None,
                "B_at_A": refit.B if refit is not None and refit.ok else None,
            }
        )
    compared = not v.baseline
    return {
        "variant": v.variant,
        "baseline": bool(v.baseline),
        "seeds": len(v.run_ids),
        "A": v.A.mean,
        "A_lo": v.A.lo,
        "A_hi": v.A.hi,
        "B": v.B.mean,
        "B_lo": v.B.lo,
        "B_hi": v.B.hi,
        "C_mid": c_mid,
        "dA": v.dA.delta if not v.baseline else None,
        "dA_lo": v.dA.lo if not v.baseline else None,
        "dA_hi": v.dA.hi if not v.baseline else None,
        # "lower" where dA and its interval bound ΔA from below (the variant's A is censored at 1)
        "dA_bound": (v.dA.bound or None) if not v.baseline else None,
        "dB": v.dB.delta if not v.baseline else None,
        "dB_lo": v.dB.lo if not v.baseline else None,
        "dB_hi": v.dB.hi if not v.baseline else None,
        "verdict": v.label,
        "verdict_text": v.verdict,
        "A_censored": v.A.censored,
        "A_shown": v.A.settled,
        "A_not_shown_because": v.A.unsettled or None,
        "B_shown": v.B.settled,
        "A_equivalence_margin": v.dA.eq_margin if v.dA.tested and not v.dA.untestable else None,
        "A_equivalent": _equivalent(v.dA) if compared else None,
        "dA_eq_lo": v.dA.eq_lo if compared else None,
        "dA_eq_hi": v.dA.eq_hi if compared else None,
        "dA_p": v.dA.p if compared else None,
        "dB_p": v.dB.p if compared else None,
        "dA_untestable": (v.dA.untestable or None) if compared else None,
        "dB_untestable": (v.dB.untestable or None) if compared else None,
        "per_seed": per_seed,
        "prediction": {
            "predicted": pr.predicted,
            "observed": pr.observed,
            "lo": pr.lo,
            "hi": pr.hi,
            "supported": pr.supported,
            # why not supported: "reach" (the half window ends before the horizon), "fall" (the seeds'
            # curves fall inside it), both; null where supported or not scored
            "unsupported_because": _unsupported_because(pr),
            "reach": pr.reach,
            "fall": pr.fall,  # the median seed's largest fall in the half window
            "persistence": pr.persistence,  # the first half's last value: the forecast the skill is against
        },
    }


def _equivalent(c) -> bool | None:
    """The TOST's finding on A: True / False where A was tested for equivalence, else None."""
    if not c.tested or c.bound or c.untestable or not math.isfinite(c.eq_margin):
        return None
    return bool(c.equivalent)


def tests_json(verdicts: Sequence[VariantVerdict]) -> dict:
    """``report.json``'s ``tests``: what every comparison of the table shares (the module
    docstring of :mod:`scalerl.analysis.verdicts`): the test, the family-wise level, the number of
    comparisons it is split over, the per-test level and the levels of the intervals reported,
    the equivalence margin on A and the A at which B is compared."""
    fam = next((v.family for v in verdicts if v.family.m), None)
    alpha = fam.alpha if fam is not None else math.nan
    return {
        "test": "Welch's two-sample t-test on each pair (variant - baseline), two-sided; TOST for equivalence on A",
        "family_level": FAMILY_LEVEL,
        "comparisons": fam.m if fam is not None else 0,
        "alpha": alpha,
        "interval_level": 1 - alpha,  # dA_lo / dA_hi, dB_lo / dB_hi
        "equivalence_interval_level": 1 - 2 * alpha,  # dA_eq_lo / dA_eq_hi
        "estimate_level": fam.level if fam is not None else None,  # A_lo / A_hi, B_lo / B_hi
        "equivalence_margin": fam.eq_margin if fam is not None else None,
        "margin_A": MARGIN_A,
        "A_fixed": fam.A_fixed if fam is not None else None,
    }


def _unsupported_because(pr) -> list[str] | None:
    """Why a prediction is not supported (:class:`~scalerl.analysis.verdicts.Prediction`)."""
    if pr.supported is not False:
        return None
    return [w for w, on in (("reach", pr.short), ("fall", pr.unstable)) if on]


def report_json(
    verdicts: Sequence[VariantVerdict],
    runs: Sequence[RunData],
    fits: dict[str, SigmoidFit],
    *,
    wall_s: float | None = None,
    fixed_fits: dict[str, SigmoidFit] | None = None,
) -> dict:
    """The machine-readable report (``report.json``): ``schema_version`` (:data:`REPORT_SCHEMA`),
    ``commit`` (:func:`_runs_commit`), ``commits`` (every commit the runs logged: several where the
    code changed while the study ran), ``wall_s`` (the study's wall time where the caller knows it,
    else None), ``machine`` (:func:`machine`), ``variants`` (:func:`variant_json`, in the verdict
    table's order; ``verdict`` one of :data:`~scalerl.analysis.verdicts.LABELS`),
    ``prediction_skill`` (:func:`~scalerl.analysis.verdicts.skill_summary`: the supported
    predictions against persistence). NaN is None."""
    by_id = {r.run_id: r for r in runs}
    doc = {
        "schema_version": REPORT_SCHEMA,
        "commit": _runs_commit(runs),
        "commits": _runs_commits(runs),
        "wall_s": wall_s,
        "machine": machine(),
        "tests": tests_json(verdicts),
        "variants": [variant_json(v, by_id, fits, fixed_fits) for v in verdicts],
        "prediction_skill": skill_summary(verdicts),
    }
    return _json_safe(doc)


def write_report_json(path: Path, doc: dict) -> Path:
    """``doc`` into ``path`` atomically (a temporary file renamed into place: a reader never sees half
    a report); strict JSON (NaN refused)."""
    write_text_atomic(Path(path), json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return Path(path)


MAX_LINES = 8
"""Figures with one line per run are drawn only up to this many runs (a sweep reads as panels per variant)."""
VIEW_KEY = "scalerl-verdicts"
"""The MLflow UI's shared view (experiment tag ``mlflow.sharedViewState.<key>``) the report writes."""


def share_verdict_view(client, experiment_id: str) -> str:
    """Store an MLflow UI view of the experiment's run table with the :data:`UI_TAGS` as its
    columns (wide enough to read), and return its address after the server's root
    (``#/experiments/<id>/runs?viewStateShareKey=scalerl-verdicts``). The UI shows no tag or metric
    column until one is chosen; this view has them chosen."""
    widths = {UI_TAGS[0]: 130, UI_TAGS[1]: 300, UI_TAGS[2]: 190, UI_TAGS[3]: 70, UI_TAGS[4]: 150}
    state = {
        "selectedColumns": [f"tags.`{t}`" for t in UI_TAGS],
        "columnOrder": [f"tags.`{t}`" for t in UI_TAGS],  # the UI sets the widths of these only
        "columnWidths": {f"tags.`{t}`": w for t, w in widths.items()},
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
    }
    client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(state))
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}"


def verdict_head(vtable: str, vs: Sequence[VariantVerdict]) -> str:
    """The verdict section's opening, in the report and the parent run's description alike: the
    table, then how well the half-budget fits predicted the final pass rates."""
    return (
        "## Verdicts per variant\n\n"
        + vtable
        + "\n"
        + family_summary(vs)
        + "\n\n"
        + prediction_summary(vs)
        + "\n\n"
    )


def write_parent(client, parent_id: str, rep: Report, *, description: str = "") -> str:
    """The parent (sweep) run's description opens with the verdict table, then ``description`` and
    the full report (ending at a whole line, with a line naming the report's artifact, where it is
    longer than MLflow keeps); its tags ``2 verdict`` (one line per variant) and ``1 variant`` (the baseline)
    show them in the run table. Also stores the run-table view (:func:`share_verdict_view`) and
    returns its address."""
    from mlflow.entities import RunTag

    head = ""
    if rep.verdict_table:
        head = verdict_head(rep.verdict_table, rep.verdicts)
    note = _within_tag(head + ((description.strip() + "\n\n") if description.strip() else "") + rep.markdown)
    lines = "; ".join(f"{v.variant}: {v.verdict}" for v in rep.verdicts if not v.baseline)
    tags = [RunTag("mlflow.note.content", note)]
    if lines:
        tags.append(RunTag(UI_TAGS[1], lines[:5000]))
    if rep.baseline is not None and rep.baseline.variant:
        tags.append(RunTag(UI_TAGS[0], f"baseline: {rep.baseline.variant}"))
    client.log_batch(parent_id, tags=tags)
    return share_verdict_view(client, client.get_run(parent_id).info.experiment_id)


CUT_NOTE = (
    "\n\n*The description stops here: MLflow keeps {limit} characters of it. The whole report is the "
    "run's artifact `report/fits.md`.*\n"
)


def _within_tag(note: str) -> str:
    """``note`` as MLflow keeps a tag's value whole (at most its limit of characters): a longer one
    ends at the last whole line that leaves room for a line saying where the whole report is,
    instead of MLflow cutting it mid-sentence."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH as limit

    if len(note) <= limit:
        return note
    tail = CUT_NOTE.format(limit=limit)
    kept = note[: limit - len(tail)]
    return kept[: kept.rfind("\n") + 1].rstrip() + tail


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
        v = next(row.variant for row in res.rows if row.run_id == r.run_id)
        # runs of one recipe (no variants) need no variant in their label
        out[r.run_id] = r.run_name if v in ("", r.run_name, SAME_RECIPE) else f"{r.run_name} ({v})"
    return out


def _legend(res: ExperimentResult, opts: FitProtocol) -> list[str]:
    base = res.baseline
    lines = []
    if base is not None and base.ok:
        lines.append(
            f"ΔA = A - A(baseline), ΔB = B - B(baseline), with A(baseline), B(baseline) the means over the "
            f"fitted runs of the baseline variant {base.variant!r} ({base.fitted} fitted: A {base.A:.3f}, "
            f"B {base.B:.2f}), {base.why}. Per-run ΔA and ΔB are point estimates: the verdict column "
            "is the variant's (see the verdict table)."
        )
    elif base is not None:
        lines.append(f"ΔA, ΔB: {base.describe()}.")
    if math.isfinite(res.A_fixed):
        lines.append(
            f"B @ A={res.A_fixed:.3f}: B refitted with A fixed to the baseline's A (the mean over its "
            "seeds, or 1 where half or more of its seeds' ceilings reach 1; the paper's way to compare efficiency)."
        )
    if any(r.check is not None for r in res.rows):
        lines.append(
            "pred_mae, pred_err_last: fit on the first half of the compute, its prediction's mean absolute "
            "error on the observed second half and signed error at the last evaluation."
        )
    return lines


def _draw(path: Path, draw) -> Path | None:
    """``draw(path)``; a figure that fails is reported in ``<path>.error.txt``, never the report
    (matplotlib's notes on an empty panel are not printed)."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No artists with labels found")
            return draw(path)
    except Exception as e:  # noqa: BLE001 - a figure must not cost the report
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / (path.name + ".error.txt")).write_text(f"{type(e).__name__}: {e}\n")
        return None


def _plots(res: ExperimentResult, opts: FitProtocol, out: Path, *, name: str, comparison: bool):
    from scalerl.scaling.plot import plot_fit, plot_linearised

    xlabel = _axis_label(res.runs)
    labels = _labels(res)
    run_plots: dict[str, Path] = {}
    for r in res.runs:
        plot = _draw(
            out / "runs" / safe_name(f"{r.run_name}-{r.run_id[:8]}") / "scaling_curve.png",
            lambda p, r=r: plot_fit(
                p,
                [(labels[r.run_id], res.fits[r.run_id])],
                extrapolate=opts.extrapolate,
                title=f"{r.run_name}: sigmoid fit",
                xlabel=xlabel,
            ),
        )
        if plot is not None:
            run_plots[r.run_id] = plot
    files: list[Path] = []
    if not comparison or not res.runs:
        return files, run_plots
    order = [row.run_id for row in res.rows if row.run_id in res.fits]
    if len(order) <= MAX_LINES:
        files.append(
            _draw(
                out / "scaling_curves.png",
                lambda p: plot_fit(
                    p,
                    [(labels[i], res.fits[i]) for i in order],
                    extrapolate=opts.extrapolate,
                    title=f"{name}: validation pass rate vs compute",
                    xlabel=xlabel,
                ),
            )
        )
    title = f"{name}: linearised, A fixed to the baseline's {res.A_fixed:.3f} (slope = B)"
    if len(order) <= MAX_LINES:
        lin = [(labels[i], res.fixed_fits[i]) for i in order if i in res.fixed_fits and res.fixed_fits[i].ok]
    else:  # one line per variant: its seeds' points together, refitted at the baseline's A
        lin = []
        for v in res.verdicts:
            f = v.pooled
            if f is not None and f.ok and math.isfinite(res.A_fixed):
                ff = fit_fixed_A(
                    f.compute, f.reward, res.A_fixed, min_compute=f.min_compute, drop_nonfinite=True
                )
                if ff.ok:
                    lin.append((v.variant, ff))
    if not lin:
        lin = [(labels[i], res.fits[i]) for i in order if res.fits[i].ok][:MAX_LINES]
        title = f"{name}: linearised fits (slope = B)"
    files.append(_draw(out / "linearised.png", lambda p: plot_linearised(p, lin, title=title, xlabel=xlabel)))
    if res.pooled_fits:
        files.append(
            _draw(
                out / "pooled_curves.png",
                lambda p: plot_fit(
                    p,
                    list(res.pooled_fits.items())[:MAX_LINES],
                    extrapolate=opts.extrapolate,
                    title=f"{name}: seeds pooled per recipe",
                    xlabel=xlabel,
                ),
            )
        )
    if res.verdicts:
        files += _verdict_figures(res, opts, out, name=name, xlabel=xlabel)
    return [f for f in files if f is not None], run_plots


def _verdict_figures(
    res: ExperimentResult, opts: FitProtocol, out: Path, *, name: str, xlabel: str
) -> list[Path]:
    """``variants.png`` (one panel per variant), ``forest.png`` (ΔA, ΔB with intervals; with a
    baseline) and ``calibration.png`` (predicted vs observed end). A figure that fails to draw is
    reported in its place, never the report."""
    from scalerl.analysis.figures import plot_calibration, plot_forest, plot_variants

    by_id = {r.run_id: r for r in res.runs}
    jobs = [
        ("variants.png", lambda p: plot_variants(p, res.verdicts, by_id, opts.cut_of, xlabel=xlabel,
                                                 title=f"{name}: validation pass rate per variant")),
        ("calibration.png", lambda p: plot_calibration(p, res.verdicts)),
    ]  # fmt: skip
    if any(not v.baseline for v in res.verdicts) and any(v.baseline for v in res.verdicts):
        jobs.insert(1, ("forest.png", lambda p: plot_forest(p, res.verdicts)))
    files = [_draw(out / fname, draw) for fname, draw in jobs]
    return [f for f in files if f is not None]


def ui_tags(v: VariantVerdict | None, variant: str, level: float) -> dict[str, str]:
    """The :data:`UI_TAGS` of a run of variant ``variant`` (``v``: its verdict)."""
    if v is None:
        return {UI_TAGS[0]: variant}
    a = f"{v.A.mean:.3f}" if math.isfinite(v.A.mean) else "-"
    if math.isfinite(v.A.lo):
        a += f" [{v.A.lo:.3f}, {v.A.hi:.3f}]"
    return {
        UI_TAGS[0]: variant,
        UI_TAGS[1]: v.verdict,
        UI_TAGS[2]: a + (f" ({level:.0%})" if math.isfinite(v.A.lo) else ""),
        UI_TAGS[3]: f"{v.B.mean:.2f}" if math.isfinite(v.B.mean) else "-",
        UI_TAGS[4]: prediction_cell(v),
    }


def _write_back(client, res: ExperimentResult, rows: dict[str, dict], plots, opts: FitProtocol, tags) -> int:
    n = 0
    base = res.baseline.variant if res.baseline is not None else None
    by_variant = {v.variant: v for v in res.verdicts}
    for r in res.runs:
        fit, row = res.fits[r.run_id], rows[r.run_id]
        # the report's fit whole, with the keys a run's live fit logs beside A and B (its horizon
        # and fall rules, its prediction at the extrapolation): none left describing another fit
        metrics = {
            **logged_metrics(fit, trials=eval_trials(r)),
            **prediction_metric(fit, r.compute, opts.extrapolate),
        }
        for key in WRITE_BACK_KEYS:
            v = row.get(key, math.nan)
            v = float(v) if isinstance(v, (int, float)) else math.nan
            metrics[f"fit/{key}"] = round_to(v, _ROUND[key]) if key in _ROUND else round_sig(v)
        run_tags = {
            **ui_tags(by_variant.get(row["variant"]), row["variant"], opts.level),
            "fit.method": opts.method,
            "fit.min_step": str(opts.min_step),
            "fit.min_compute": f"{opts.min_compute:g}",
            "fit.variant": row["variant"],
            "fit.baseline": base or "",
            "fit.reason": fit.reason or "ok",
            "fit.summary": fit.summary(),
            **(tags or {}),
        }
        write_back(client, r, metrics, tags=run_tags, artifact=plots.get(r.run_id))
        n += 1
    return n


@dataclass(frozen=True)
class ReportInput:
    """What :func:`report` is asked for besides the runs, the folder and the MLflow client. The
    analysis CLI sets the first group; a sweep's report sets them all."""

    baseline: str | None = None
    """A run id, run name or variant name: its variant (all its seeds) is the reference of ΔA and
    ΔB. None: chosen among the fitted runs, and :attr:`Report.baseline` says which and why
    (:func:`scalerl.analysis.experiment.choose_baseline`)."""
    baseline_given_by: str = "--baseline"
    """Who gave ``baseline`` (a CLI flag, a sweep file), for its error and its legend."""
    protocol: FitProtocol = field(default_factory=FitProtocol)
    """How the runs are fitted (the analysis CLI's options, a sweep's ``scaling``)."""
    pool_seeds: bool = False
    """Also one pooled fit per recipe (``pooled_fits.csv``, ``pooled_curves.png``)."""
    comparison: bool = True
    """Also draw the all-runs, linearised and verdict figures (not only one plot per run)."""
    name: str = "All runs"
    """The figures' titles."""
    title: str = ""
    """The first line(s) of ``fits.md``."""
    tags: dict[str, str] = field(default_factory=dict)
    """More tags written back to every run (with a client)."""
    pending: Sequence[dict] = ()
    """Table-form rows of runs that have no curve to fit (a sweep's jobs that failed or did not
    finish, the runs the CLI left out), shown in the table unfitted."""
    extra: dict[str, dict] = field(default_factory=dict)
    """run id -> more table keys for its row (a sweep's job, status, log)."""
    order: Sequence[str] | None = None
    """Run names in table order (None: sorted by A, unfittable last)."""
    variant_order: Sequence[str] = ()
    """Variants in the verdict table's order after the baseline (empty: by name)."""
    not_run: dict[str, str] = field(default_factory=dict)
    """variant -> why a sweep did not launch it (its component cannot act on the hardware it would
    run on): a row of the verdict table, in no figure."""
    wall_s: float | None = None
    """The study's wall time, for ``report.json`` (None: unknown, written as null)."""


def report(runs: Sequence[RunData], out_dir, inputs: ReportInput | None = None, *, client=None) -> Report:
    """Fit ``runs``, compare them with the baseline variant, write the files into ``out_dir``
    (the module docstring lists them) and, given an MLflow ``client``, write ``fit/*`` metrics,
    ``fit.*`` tags (plus ``inputs.tags``) and each run's ``scaling_curve.png`` back to every run.
    ``inputs``: what else is asked (:class:`ReportInput`; default: its defaults)."""
    inputs = inputs or ReportInput()
    opts = inputs.protocol
    out = Path(out_dir)
    res = analyse_runs(
        runs,
        opts,
        baseline=inputs.baseline,
        baseline_given_by=inputs.baseline_given_by,
        other_variants=[p["variant"] for p in inputs.pending if p.get("variant")],
        pool_seeds=inputs.pool_seeds,
        sort=inputs.order is None,
        variant_order=list(inputs.variant_order),
    )
    analysed = {r.run_id: {**r.as_dict(), **inputs.extra.get(r.run_id, {})} for r in res.rows}
    rows = _table_rows(res, analysed, inputs)
    table = rows_to_markdown(rows, level=opts.level, metric=opts.reward_key)
    legend = _legend(res, opts)
    listed = _listed_verdicts(res.verdicts, inputs.not_run)
    vtable = verdict_table(listed, level=opts.level) if listed else ""
    markdown = _markdown(res, inputs, table, legend, vtable)

    out.mkdir(parents=True, exist_ok=True)  # after the analysis: a refused baseline writes nothing
    files = _write_tables(out, res, rows, listed, markdown, wall_s=inputs.wall_s)
    plot_files, run_plots = _plots(res, opts, out, name=inputs.name, comparison=inputs.comparison)
    files += plot_files
    n_back = 0
    if client is not None:
        n_back = _write_back(client, res, analysed, run_plots, opts, inputs.tags)
    return Report(
        rows=rows,
        markdown=markdown,
        table=table,
        legend=legend,
        baseline=res.baseline,
        result=res,
        verdicts=listed,
        verdict_table=vtable,
        out_dir=out,
        files=files,
        run_plots=run_plots,
        written_back=n_back,
    )


def _table_rows(res: ExperimentResult, analysed: dict[str, dict], inputs: ReportInput) -> list[dict]:
    """The table's rows in its order: the analysed runs' (with their extra keys), then the pending
    ones, unfitted (a pending row of the baseline variant is marked as such)."""
    base = res.baseline
    rows = [analysed[r.run_id] for r in res.rows]
    for p in inputs.pending:
        row = {"run_id": "", "ok": False, "reason": "", **p}
        row["baseline"] = base is not None and base.variant is not None and row.get("variant") == base.variant
        rows.append(row)
    if inputs.order is not None:
        rank = {n: i for i, n in enumerate(inputs.order)}
        rows.sort(key=lambda r: rank.get(r.get("run_name", ""), len(rank)))
    return rows


def _listed_verdicts(vs: list[VariantVerdict], not_run: dict[str, str]) -> list[VariantVerdict]:
    """The verdict table's variants: the analysed ones, then each variant a sweep did not run
    because its component cannot act there (when there is a table to add it to)."""
    listed = list(vs)
    if listed:
        for variant, why in not_run.items():
            if all(v.variant != variant for v in listed):
                v = VariantVerdict(variant, [], cannot_act=why, family=listed[0].family)
                v.verdict = f"cannot act here: {why} (not run)"
                listed.append(v)
    return listed


def _markdown(res: ExperimentResult, inputs: ReportInput, table: str, legend: list[str], vtable: str) -> str:
    """``fits.md``: the title, the fit settings, the verdict section and its legend, then the
    per-run table and its legend."""
    opts = inputs.protocol
    axes = sorted({r.compute_axis for r in res.runs}) or ["device_hours"]
    parts = [inputs.title.rstrip("\n") + "\n"] if inputs.title else []
    parts.append(opts.describe(", ".join(axes)) + "\n")
    markdown = "\n".join(parts) + "\n"
    if vtable:
        markdown += (
            verdict_head(vtable, res.verdicts)
            + "".join(line + "\n" for line in verdict_legend(opts.level))
            + "\n## Runs\n\n"
        )
    return markdown + table + "\n" + "".join(line + "\n" for line in legend)


def _write_tables(
    out: Path,
    res: ExperimentResult,
    rows: list[dict],
    listed: list[VariantVerdict],
    markdown: str,
    *,
    wall_s: float | None,
) -> list[Path]:
    """``fits.csv``, ``verdicts.csv``, ``fits.md``, ``fits.json``, ``report.json`` and
    ``pooled_fits.csv`` (each where there is something to write)."""
    files = [rows_to_csv(rows, out / "fits.csv")]
    if res.verdicts:
        files.append(rows_to_csv([verdict_row(v) for v in listed], out / "verdicts.csv"))
    (out / "fits.md").write_text(markdown)
    (out / "fits.json").write_text(json.dumps(rows, indent=1, default=str, allow_nan=True))
    files += [out / "fits.md", out / "fits.json"]
    doc = report_json(listed, res.runs, res.fits, wall_s=wall_s, fixed_fits=res.fixed_fits)
    files.append(write_report_json(out / "report.json", doc))
    if res.pooled_rows:
        files.append(rows_to_csv(res.pooled_rows, out / "pooled_fits.csv"))
    return files
