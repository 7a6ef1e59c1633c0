"""The report's figures of a sweep's verdicts: one panel per variant, a forest plot of ΔA and ΔB, a prediction calibration plot.

All three are drawn on matplotlib's Agg canvas (no pyplot state), one colour per role rather than per
run, and short legends: a sweep of 27 runs reads as 9 small panels, not 27 lines on one axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from scalerl.analysis.mlflow_io import RunData
from scalerl.analysis.verdicts import (
    FAMILY_LEVEL,
    MARGIN_A,
    PRED_LEVEL,
    PRED_TOLERANCE,
    VariantVerdict,
    seeds_cell,
)
from scalerl.scaling.plot import save_figure

VARIANT = "tab:blue"
HALF = "tab:orange"
BASE = "0.55"
CALLED = "tab:red"
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def _short(v: VariantVerdict) -> str:
    """A panel's or a row's few words: what the verdict says."""
    if v.baseline:
        return "baseline"
    if v.cannot_act:
        return "not scored: cannot act here"
    if v.inactive:
        return "not scored: inactive"
    if not v.fitted:
        return "unfittable"
    if v.called:
        return ", ".join(f"{k} {'higher' if s > 0 else 'lower'}" for k, s in v.called.items())
    if v.verdict.startswith("unsettled") or v.verdict.startswith("not scored"):
        return "unsettled"
    if v.label == "equivalent":
        return f"A equivalent (±{v.dA.eq_margin:g})"
    if v.label == "not shown":
        return "not shown at this budget"
    return "inconclusive"


def plot_variants(
    path,
    vs: Sequence[VariantVerdict],
    runs: dict[str, RunData],
    cut: Callable[[RunData], float],
    *,
    xlabel: str = "compute",
    title: str = "",
    extrapolate: float = 1.5,
) -> Path:
    """Small multiples, one panel per variant: each seed's evaluations (hollow: before the early
    cut), the pooled fit of all seeds (solid) and its extrapolation (dashed), the baseline's pooled
    fit (grey), the pooled fit of the first half of the compute (orange) with its prediction of the
    observed end (orange bar: the prediction band) against the observed end (black diamond: the
    mean of the seeds' evaluations in the last tenth of the compute), the early cut and half-budget lines."""
    n = max(len(vs), 1)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.3 * ncols, 3.1 * nrows + 1.0))
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.95 / (3.1 * nrows + 1.0), bottom=0.75 / (3.1 * nrows + 1.0),
                        hspace=0.45, wspace=0.18)  # fmt: skip
    base = next((v for v in vs if v.baseline), None)
    ymax = 0.0
    for i, v in enumerate(vs):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        members = [runs[r] for r in v.run_ids if r in runs]
        budget = max((float(np.nanmax(r.compute)) for r in members if r.compute.size), default=math.nan)
        for j, r in enumerate(members):
            c, y = r.compute, r.reward
            fin = np.isfinite(c) & np.isfinite(y)
            early = fin & (c < cut(r))
            m = MARKERS[j % len(MARKERS)]
            ax.plot(c[fin & ~early], y[fin & ~early], m, color=VARIANT, ms=3.5, alpha=0.55, lw=0)
            ax.plot(c[early], y[early], m, mfc="none", color=VARIANT, ms=3.5, alpha=0.55, lw=0)
            if y[fin].size:
                ymax = max(ymax, float(np.max(y[fin])))
        if math.isfinite(budget) and budget > 0:
            grid = np.linspace(0.0, budget, 200)
            beyond = np.linspace(budget, budget * extrapolate, 60)
            if base is not None and base is not v and base.pooled is not None and base.pooled.ok:
                ax.plot(grid, base.pooled.predict(grid), "-", color=BASE, lw=1.4)
            if v.pooled is not None and v.pooled.ok:
                ax.plot(grid, v.pooled.predict(grid), "-", color=VARIANT, lw=1.8)
                ax.plot(beyond, v.pooled.predict(beyond), "--", color=VARIANT, lw=1.4)
            if v.half is not None and v.half.ok:
                ax.plot(grid, v.half.predict(grid), ":", color=HALF, lw=1.8)
            cuts = [cut(r) for r in members if math.isfinite(cut(r))]
            if cuts:
                ax.axvline(min(cuts), color="0.3", ls=(0, (1, 2)), lw=0.9)
            ax.axvline(budget / 2, color="0.3", ls="-.", lw=0.9)
            pr = v.prediction
            if math.isfinite(pr.predicted):
                x_end = budget * 1.02
                if math.isfinite(pr.lo):
                    ax.plot(
                        [x_end, x_end],
                        [pr.lo, pr.hi],
                        "-",
                        color=HALF,
                        lw=3,
                        alpha=0.5,
                        solid_capstyle="butt",
                    )
                ax.plot([x_end], [pr.predicted], "_", color=HALF, ms=12, mew=2.5)
                ax.plot([x_end], [pr.observed], "D", color="black", ms=5)
            ax.set_xlim(0, budget * extrapolate)
        a = f"A {v.A.mean:.3f}" if math.isfinite(v.A.mean) else "A -"
        if not v.baseline and math.isfinite(v.dA.delta):
            a += f", ΔA {v.dA.delta:+.3f}"
        color = CALLED if v.called else "black"
        ax.set_title(f"{v.variant}: {_short(v)}\n{a} ({seeds_cell(v)} seeds)", fontsize=9, color=color)
        ax.tick_params(labelsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
        ax.grid(True, alpha=0.25)
        if i % ncols == 0:
            ax.set_ylabel("validation pass rate", fontsize=8)
        if i >= n - ncols:
            ax.set_xlabel(xlabel, fontsize=8)
    for ax in fig.axes:
        ax.set_ylim(0, min(1.0, ymax + 0.1) if ymax else 1.0)
    handles = [
        Line2D(
            [], [], marker="o", color=VARIANT, lw=0, alpha=0.6, label="seed evaluations (marker per seed)"
        ),
        Line2D([], [], marker="o", mfc="none", color=VARIANT, lw=0, label="before the early cut"),
        Line2D([], [], color=VARIANT, lw=1.8, label="pooled fit (dashed: extrapolation)"),
        Line2D([], [], color=BASE, lw=1.4, label="baseline's pooled fit"),
        Line2D([], [], color=HALF, ls=":", lw=1.8, label="fit on the first half"),
        Line2D([], [], color=HALF, lw=3, alpha=0.5, label=f"predicted end, {PRED_LEVEL:.0%} band"),
        Line2D([], [], marker="D", color="black", lw=0, label="observed end (mean of the last evaluations)"),
        Line2D([], [], color="0.3", ls=(0, (1, 2)), label="early cut"),
        Line2D([], [], color="0.3", ls="-.", label="half budget"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=min(5, 3 * ncols // 2 + 1), fontsize=7.5, frameon=False
    )
    fig.suptitle(title or "Validation pass rate per variant", fontsize=11)
    return save_figure(fig, path, dpi=100)


def plot_forest(path, vs: Sequence[VariantVerdict], *, title: str = "") -> Path:
    """ΔA and ΔB (at the baseline's A) of every variant against the baseline with their
    simultaneous intervals, the ±0.02 margin on A (shaded) and the smallest detectable ΔA (grey
    ticks); called differences in red; variants not scored are named with the reason. Where the
    baseline's ceiling reaches 1 (no A compared), the ΔA panel says so."""
    rows = [v for v in vs if not v.baseline]
    n = max(len(rows), 1)
    h = 0.42 * n + 1.6
    fig = Figure(figsize=(10.0, h))
    fig.subplots_adjust(left=0.2, right=0.98, top=1 - 0.75 / h, bottom=0.6 / h, wspace=0.08)
    axA, axB = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ys = np.arange(n)[::-1]
    at_max = any(v.family.at_max for v in vs)
    for ax, key in ((axA, "dA"), (axB, "dB")):
        if key == "dA" and at_max:  # no ceiling is compared: say so instead of an empty panel
            ax.text(0.5, 0.5, "A not compared:\nthe baseline's ceiling is not\nbounded below 1 at this budget",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35")  # fmt: skip
            ax.set_xticks([])
            ax.set_ylim(-0.7, n - 0.3)
            continue
        ax.axvline(0.0, color="0.3", lw=0.8)
        if key == "dA":
            ax.axvspan(-MARGIN_A, MARGIN_A, color="0.85", lw=0)
        for y, v in zip(ys, rows):
            c = getattr(v, key)
            if not v.scored or not math.isfinite(c.delta):
                ax.text(0.0, y, f" {_short(v)}", fontsize=7.5, color="0.45", va="center", ha="left")
                continue
            color = CALLED if c.called else "black"
            if c.tested and math.isfinite(c.lo):
                ax.plot([c.lo, c.hi], [y, y], "-", color=color, lw=1.6)
            tested = c.tested and not c.untestable
            ax.plot([c.delta], [y], "o", color=color, ms=5, mfc=color if tested else "white")
            if key == "dA" and math.isfinite(c.mdd):
                ax.plot([-c.mdd, c.mdd], [y, y], "|", color="0.5", ms=9, mew=1.5)
        ax.set_ylim(-0.7, n - 0.3)
        ax.grid(True, axis="x", alpha=0.25)
        ax.tick_params(labelsize=8)
    axA.set_yticks(ys)
    axA.set_yticklabels([v.variant for v in rows], fontsize=9)
    axB.set_yticks(ys)
    axB.set_yticklabels([])
    a_fix = next((v.family.A_fixed for v in vs if math.isfinite(v.family.A_fixed)), math.nan)
    m = next((v.family.m for v in vs), 0)
    if not at_max:
        axA.set_xlabel(f"ΔA (grey band: ±{MARGIN_A:g}; grey ticks: ± smallest detectable ΔA)", fontsize=8)
    axB.set_xlabel(
        f"ΔB at A fixed to the baseline's {a_fix:.3f}" if math.isfinite(a_fix) else "ΔB", fontsize=8
    )
    fig.suptitle(
        title
        or f"Difference from the baseline, simultaneous intervals (t-test, Bonferroni over {m}, "
        f"family-wise {FAMILY_LEVEL:.0%}); red: called; hollow: not tested",
        fontsize=9.5,
    )
    return save_figure(fig, path, dpi=100)


def plot_calibration(path, vs: Sequence[VariantVerdict], *, title: str = "") -> Path:
    """Left: predicted (from the first half of the compute) against observed end (the seeds' mean
    over their evaluations in the last tenth of the compute) per variant, the diagonal and the ±0.03
    tolerance (misses named). Right: the error per variant,
    observed - predicted, with the prediction band around it (relative to the prediction)."""
    pts = [v for v in vs if math.isfinite(v.prediction.err)]
    n = max(len(pts), 1)
    h = max(4.8, 0.36 * n + 1.6)
    fig = Figure(figsize=(11.0, h))
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.8 / h, bottom=0.55 / h, wspace=0.45)
    ax = fig.add_subplot(1, 2, 1)
    vals = [
        x
        for v in pts
        for x in (v.prediction.predicted, v.prediction.observed, v.prediction.lo, v.prediction.hi)
    ]
    vals = [x for x in vals if math.isfinite(x)]
    lo, hi = (min(vals) - 0.05, max(vals) + 0.05) if vals else (0.0, 1.0)
    lo, hi = max(lo, 0.0), min(hi, 1.0)
    grid = np.array([lo, hi])
    ax.fill_between(grid, grid - PRED_TOLERANCE, grid + PRED_TOLERANCE, color="0.88", lw=0)
    ax.plot(grid, grid, "-", color="0.4", lw=0.9)

    def color(v):
        return ("tab:green" if v.pred_ok else CALLED) if _counted(v) else "0.6"

    for v in pts:
        pr = v.prediction
        ax.plot([pr.predicted], [pr.observed], "o", color=color(v), ms=6)
        if not v.pred_ok:
            ax.annotate(
                v.variant,
                (pr.predicted, pr.observed),
                xytext=(4, 3),
                textcoords="offset points",
                fontsize=7.5,
            )
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.grid(True, alpha=0.25)
    ax.set_xlabel("predicted from the first half of the compute", fontsize=9)
    ax.set_ylabel("observed end: the seeds' last evaluations", fontsize=9)
    ax.set_title(f"grey band: ±{PRED_TOLERANCE:g}; misses named", fontsize=9)
    axe = fig.add_subplot(1, 2, 2)
    ys = np.arange(len(pts))[::-1]
    axe.axvspan(-PRED_TOLERANCE, PRED_TOLERANCE, color="0.88", lw=0)
    axe.axvline(0.0, color="0.4", lw=0.9)
    for y, v in zip(ys, pts):
        pr = v.prediction
        if math.isfinite(pr.lo):
            axe.plot(
                [pr.lo - pr.predicted, pr.hi - pr.predicted], [y, y], "-", color=color(v), lw=3, alpha=0.35
            )
        axe.plot([pr.observed - pr.predicted], [y], "o", color=color(v), ms=6)
    axe.set_yticks(ys)
    axe.set_yticklabels([v.variant for v in pts], fontsize=8.5)
    axe.set_ylim(-0.7, len(pts) - 0.3)
    axe.grid(True, axis="x", alpha=0.25)
    axe.set_xlabel("observed - predicted (bar: the prediction band)", fontsize=9)
    axe.set_title(
        f"{PRED_LEVEL:.0%} prediction band: half fit's bootstrap + binomial noise + shape error", fontsize=9
    )
    fig.suptitle(title or calibration_title(pts), fontsize=10)
    return save_figure(fig, path, dpi=100)


def _counted(v: VariantVerdict) -> bool:
    """Whether a variant's prediction counts toward the goal: a scored variant's, supported."""
    return (v.baseline or v.scored) and v.prediction.supported is True


def calibration_title(vs: Sequence[VariantVerdict]) -> str:
    """The calibration figure's title: the supported predictions within the tolerance and their
    bands' coverage (as the report's goal line counts them), and how many were not supported."""
    pts = [v for v in vs if math.isfinite(v.prediction.err)]
    scored = [v for v in pts if v.baseline or v.scored]
    supported = [v for v in scored if _counted(v)]
    ok_n = sum(bool(v.pred_ok) for v in supported)
    banded = [v for v in supported if v.prediction.inside is not None]
    cov = f"; coverage {sum(bool(v.prediction.inside) for v in banded) / len(banded):.0%}" if banded else ""
    return (
        f"Prediction from half the compute: {ok_n} of {len(supported)} supported predictions within "
        f"{PRED_TOLERANCE:g}{cov}, {len(scored) - len(supported)} not supported "
        "(green: within; red: missed; grey: not supported or not scored)"
    )
