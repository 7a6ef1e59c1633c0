"""PNG plots of scaling-curve fits (matplotlib's Agg canvas; pyplot and its global backend are not
touched, so this is safe in headless training jobs and inside notebooks alike)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scalerl.scaling.sigmoid import SigmoidFit, linearised

FitsLike = SigmoidFit | Mapping[str, SigmoidFit] | Sequence[SigmoidFit | tuple[str, SigmoidFit]]


def _items(fits_and_data: FitsLike) -> list[tuple[str, SigmoidFit]]:
    if isinstance(fits_and_data, SigmoidFit):
        return [("run", fits_and_data)]
    if isinstance(fits_and_data, Mapping):
        return [(str(k), v) for k, v in fits_and_data.items()]
    out = []
    for i, item in enumerate(fits_and_data):
        if isinstance(item, SigmoidFit):
            out.append((f"run {i}", item))
        else:
            label, fit = item
            out.append((str(label), fit))
    return out


def save_figure(fig: Figure, path, dpi: int = 110) -> Path:
    """Write ``fig`` (made without pyplot) to ``path`` as a PNG, creating its folder.  The image is
    cut to what was drawn (with a small margin), so a legend placed outside the axes is never
    clipped by the figure's edge."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    return path


def _figure(width: float, height: float, n_items: int):
    """A figure whose legend goes below the axes when there are many entries."""
    below = n_items > 3
    extra = 0.165 * (n_items + 1) + 0.1 if below else 0.0
    fig = Figure(figsize=(width, height + extra))
    total = height + extra
    bottom = (extra + 0.55) / total
    fig.subplots_adjust(left=0.09, right=0.98, bottom=bottom, top=1.0 - 0.4 / total)
    return fig, fig.add_subplot(1, 1, 1)


def _legend(fig: Figure, ax, n_items: int, loc: str) -> None:
    if n_items == 0:
        return
    if n_items > 3:
        h = fig.get_figheight()
        ax.legend(
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(0.0, -0.5 / (h * ax.get_position().height)),
            borderaxespad=0.0,
            frameon=False,
        )
    else:
        ax.legend(fontsize=7, loc=loc)


def _label(name: str, fit: SigmoidFit) -> str:
    if not fit.ok:
        return f"{name}: unfittable ({fit.reason})"
    a_ci = fit.ci.get("A")
    a = f"A={fit.A:.3f}"
    if a_ci and not math.isnan(a_ci[0]) and not fit.fixed_A:
        a += f" [{a_ci[0]:.3f}, {a_ci[1]:.3f}]"
    return f"{name}: {a}, B={fit.B:.2f}, C_mid={fit.C_mid:.3g}, R0={fit.R0:.3f}"


def _used(fit: SigmoidFit) -> np.ndarray:
    n = np.asarray(fit.compute).size
    return np.asarray(fit.used, bool) if fit.used.size == n else np.ones(n, bool)


def _shown(fit: SigmoidFit, log_x: bool) -> np.ndarray:
    c, r = np.asarray(fit.compute, float), np.asarray(fit.reward, float)
    return np.isfinite(c) & np.isfinite(r) & ((c > 0) if log_x else True)


def plot_fit(
    path,
    fits_and_data: FitsLike,
    extrapolate: float = 2.0,
    log_x: bool = True,
    title: str | None = None,
    *,
    xlabel: str = "compute",
    ylabel: str = "validation pass rate",
    level: float | None = None,
) -> Path:
    """Evaluation points (points left out of the fit drawn hollow), the fitted curve over the data,
    and its extrapolation to ``extrapolate`` x the budget (dashed), with the bootstrap band (shaded
    over the data, dashed bounds beyond).  Several runs share one figure.  With ``log_x`` the
    C = 0 (step-0) points cannot be drawn; R0 is in the legend."""
    items = _items(fits_and_data)
    # the "hollow" legend entry counts towards the legend's size, which decides where it goes
    any_excluded = any((~_used(f) & _shown(f, log_x)).any() for _, f in items)
    fig, ax = _figure(9.0, 5.0, len(items) + any_excluded)
    colors = [f"C{i % 10}" for i in range(len(items))]
    for (name, fit), color in zip(items, colors):
        c, r = np.asarray(fit.compute, float), np.asarray(fit.reward, float)
        if c.size == 0:
            continue
        used, show = _used(fit), _shown(fit, log_x)
        ax.plot(c[used & show], r[used & show], "o", color=color, ms=4, label=_label(name, fit))
        ax.plot(
            c[~used & show],
            r[~used & show],
            "o",
            mfc="none",
            color=color,
            ms=5,
            alpha=0.8,
            label="_nolegend_",
        )
        if not fit.ok:
            continue
        pos = c[np.isfinite(c) & (c > 0)]
        if pos.size == 0:
            continue
        budget = float(pos.max())
        lo_c = float(pos.min()) if log_x else 0.0
        end = budget * max(float(extrapolate), 1.0)
        grid_in = np.geomspace(lo_c, budget, 200) if log_x else np.linspace(lo_c, budget, 200)
        grid_out = np.geomspace(budget, end, 100) if log_x else np.linspace(budget, end, 100)
        ax.plot(grid_in, fit.predict(grid_in), "-", color=color, lw=1.8)
        if end > budget:
            ax.plot(grid_out, fit.predict(grid_out), "--", color=color, lw=1.8)
        band_lo, band_hi = fit.predict_band(grid_in, level)
        if np.isfinite(band_lo).any():
            ax.fill_between(grid_in, band_lo, band_hi, color=color, alpha=0.15, lw=0)
            if end > budget:
                out_lo, out_hi = fit.predict_band(grid_out, level)
                ax.plot(grid_out, out_lo, ":", color=color, lw=1.0)
                ax.plot(grid_out, out_hi, ":", color=color, lw=1.0)
                ax.fill_between(grid_out, out_lo, out_hi, color=color, alpha=0.07, lw=0)
        ax.axhline(fit.A, color=color, lw=0.6, ls=(0, (1, 4)), alpha=0.7)
    if any_excluded:
        ax.plot([], [], "o", mfc="none", color="gray", label="hollow: left out of the fit")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel + (" (log scale)" if log_x else ""))
    ax.set_ylabel(ylabel)
    ax.set_title(title or "Sigmoid scaling fit (solid: fitted range, dashed: extrapolation)")
    ax.grid(True, which="both", alpha=0.25)
    _legend(fig, ax, len(items) + any_excluded, loc="lower right")
    return save_figure(fig, path)


def plot_linearised(
    path,
    fits_and_data: FitsLike,
    title: str | None = None,
    *,
    xlabel: str = "compute",
    c_ref: float | None = None,
) -> Path:
    """The paper's leave-one-out plot: ``log F(R_C)`` against ``log C``, with
    ``F(R_C) = C_mid**B / ((A - R0) / (R_C - R0) - 1)`` (= ``C**B`` on the curve), so each run is a
    line of slope B.  Both axes are taken relative to ``c_ref`` (default: the geometric mean of
    the plotted compute): ``log10(C / c_ref)`` and ``log10(F / c_ref**B)``, so all lines cross at
    the origin and only their slopes differ.  Pass fits made with ``fit_fixed_A`` at a common A to
    compare B the paper's way."""
    items = [(n, f) for n, f in _items(fits_and_data)]
    fig, ax = _figure(7.5, 5.0, len(items))
    l10 = math.log(10.0)
    pts = {name: linearised(fit) if fit.ok else (np.zeros(0), np.zeros(0)) for name, fit in items}
    all_c = np.concatenate([p[0] for p in pts.values()]) if pts else np.zeros(0)
    log_ref = math.log(c_ref) if c_ref else (float(all_c.mean()) if all_c.size else 0.0)
    for i, (name, fit) in enumerate(items):
        if not fit.ok:
            continue
        color = f"C{i % 10}"
        logc, logf = pts[name]
        if logc.size:
            ax.plot((logc - log_ref) / l10, (logf - fit.B * log_ref) / l10, "o", color=color, ms=4, alpha=0.8)
            xs = np.linspace(logc.min(), logc.max(), 50) - log_ref
            ax.plot(xs / l10, fit.B * xs / l10, "-", color=color, label=f"{name}: B={fit.B:.2f}")
        else:
            ax.plot([], [], "-", color=color, label=f"{name}: B={fit.B:.2f} (no points in (R0, A))")
    ax.set_xlabel(f"log10({xlabel} / C_ref), C_ref = {math.exp(log_ref):.3g}")
    ax.set_ylabel("log10(F(R) / C_ref^B)")
    ax.set_title(title or "Linearised fit: slope = B")
    ax.grid(True, alpha=0.25)
    _legend(fig, ax, len(items), loc="upper left")
    return save_figure(fig, path)
