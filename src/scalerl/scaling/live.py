"""Scaling fits inside a training run: the calls the training loop makes.

Neither function raises: a failure of any kind yields a fit with ``ok == False`` and its reason,
and metrics with NaN values, so a bad refit can never stop training.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from scalerl.scaling.sigmoid import DEFAULT_METHOD, SigmoidFit, fit_sigmoid

log = logging.getLogger(__name__)


def _safe_fit(compute, reward, *, method, min_compute_frac, bootstrap, level, seed) -> SigmoidFit:
    try:
        c = np.asarray(compute, dtype=float)
        finite = c[np.isfinite(c)]
        min_compute = float(min_compute_frac) * float(finite.max()) if finite.size else 0.0
        return fit_sigmoid(
            c,
            reward,
            min_compute=min_compute,
            method=method,
            bootstrap=int(bootstrap),
            level=level,
            seed=seed,
            drop_nonfinite=True,
        )
    except Exception as e:  # noqa: BLE001 - a refit must never stop training
        log.warning("scaling fit failed: %s", e)
        return SigmoidFit(
            ok=False, reason=f"fit error: {type(e).__name__}: {e}", method=str(method), level=0.9
        )


def fit_metrics(
    compute,
    reward,
    *,
    method: str = DEFAULT_METHOD,
    min_compute_frac: float = 0.1,
    bootstrap: int = 200,
    level: float = 0.9,
    prefix: str = "fit/",
    seed: int = 0,
) -> tuple[SigmoidFit, dict[str, float]]:
    """Refit the sigmoid to the evaluations so far (``compute`` cumulative, step-0 point included).

    Points below ``min_compute_frac * max(compute)`` are left out; NaN evaluations are skipped.
    Returns the fit and ``fit.to_metrics(prefix)`` (``fit/A``, ``fit/A_lo`` ... ``fit/ok``).
    """
    fit = _safe_fit(
        compute,
        reward,
        method=method,
        min_compute_frac=min_compute_frac,
        bootstrap=bootstrap,
        level=level,
        seed=seed,
    )
    return fit, fit.to_metrics(prefix)


def final_report(
    compute,
    reward,
    *,
    out_png,
    extrapolate: float = 2.0,
    method: str = DEFAULT_METHOD,
    min_compute_frac: float = 0.1,
    bootstrap: int = 200,
    level: float = 0.9,
    title: str | None = None,
    xlabel: str = "compute",
    prefix: str = "fit/",
    seed: int = 0,
) -> tuple[SigmoidFit, dict[str, float]]:
    """The end-of-run fit: like :func:`fit_metrics`, and also writes the plot ``out_png``
    (conventionally ``<run dir>/scaling_curve.png``; log it as an MLflow artifact) with the curve
    extrapolated to ``extrapolate`` x the budget.  The metrics include
    ``fit/pred_at_{extrapolate}x`` (predicted reward at that multiple of the budget)."""
    fit, metrics = fit_metrics(
        compute,
        reward,
        method=method,
        min_compute_frac=min_compute_frac,
        bootstrap=bootstrap,
        level=level,
        prefix=prefix,
        seed=seed,
    )
    try:
        c = np.asarray(compute, dtype=float)
        budget = float(np.nanmax(c)) if c.size else math.nan
        key = f"{prefix}pred_at_{float(extrapolate):g}x"
        metrics[key] = float(fit.predict(budget * float(extrapolate))) if fit.ok else math.nan
    except Exception as e:  # noqa: BLE001
        log.warning("scaling prediction failed: %s", e)
    try:
        from scalerl.scaling.plot import plot_fit

        Path(out_png).parent.mkdir(parents=True, exist_ok=True)
        plot_fit(out_png, [("run", fit)], extrapolate=extrapolate, title=title, xlabel=xlabel)
    except Exception as e:  # noqa: BLE001 - the plot is a nicety
        log.warning("scaling plot failed: %s", e)
    return fit, metrics
