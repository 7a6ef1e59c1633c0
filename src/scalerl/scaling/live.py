"""Scaling fits inside a training run: the calls the training loop makes.

None of these functions raises: a failure of any kind yields a fit with ``ok == False`` and its reason,
and metrics with NaN values, so a bad refit can never stop training.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from scalerl.scaling.sigmoid import DEFAULT_METHOD, SigmoidFit, early_cutoff, fit_sigmoid

log = logging.getLogger(__name__)


def grid_options(scaling) -> dict:
    """``grid_A`` / ``grid_C_mid`` of a ``scaling`` config (or a dict of it) as fit arguments."""
    get = scaling.get if hasattr(scaling, "get") else lambda k, d=None: getattr(scaling, k, d)
    out = {}
    for key in ("grid_A", "grid_C_mid"):
        v = get(key, None)
        out[key] = None if v is None else tuple(float(x) for x in v)
    return out


def _safe_fit(
    compute, reward, *, steps, min_step, min_compute, method, bootstrap, level, seed, grid
) -> SigmoidFit:
    try:
        c = np.asarray(compute, dtype=float)
        s = np.arange(c.size) if steps is None else np.asarray(steps, dtype=float)
        cut = early_cutoff(s, c, min_step=int(min_step), min_compute=float(min_compute))
        return fit_sigmoid(
            c,
            reward,
            min_compute=cut,
            method=method,
            bootstrap=int(bootstrap),
            level=level,
            seed=seed,
            drop_nonfinite=True,
            **(grid or {}),
        )
    except Exception as e:  # noqa: BLE001 - a refit must never stop training
        log.warning("scaling fit failed: %s", e)
        return SigmoidFit(
            ok=False, reason=f"fit error: {type(e).__name__}: {e}", method=str(method), level=level
        )


def fit_metrics(
    compute,
    reward,
    *,
    steps=None,
    min_step: int = 0,
    min_compute: float = 0.0,
    method: str = DEFAULT_METHOD,
    bootstrap: int = 200,
    level: float = 0.9,
    prefix: str = "fit/",
    seed: int = 0,
    grid: dict | None = None,
) -> tuple[SigmoidFit, dict[str, float]]:
    """Refit the sigmoid to the evaluations so far (``compute`` cumulative, step-0 point included).

    Points evaluated before step ``min_step`` (``steps``: each evaluation's optimiser step) or below
    ``min_compute`` are left out (:func:`~scalerl.scaling.sigmoid.early_cutoff`: the same absolute cut
    as the report's); NaN evaluations are skipped. ``grid``: ``grid_A`` / ``grid_C_mid`` for the grid
    method. Returns the fit and ``fit.to_metrics(prefix)`` (``fit/A``, ``fit/A_lo`` ... ``fit/ok``).
    """
    fit = _safe_fit(
        compute,
        reward,
        steps=steps,
        min_step=min_step,
        min_compute=min_compute,
        method=method,
        bootstrap=bootstrap,
        level=level,
        seed=seed,
        grid=grid,
    )
    return fit, fit.to_metrics(prefix)


def final_report(
    compute,
    reward,
    *,
    out_png,
    extrapolate: float = 2.0,
    steps=None,
    min_step: int = 0,
    min_compute: float = 0.0,
    method: str = DEFAULT_METHOD,
    bootstrap: int = 200,
    level: float = 0.9,
    title: str | None = None,
    xlabel: str = "compute",
    prefix: str = "fit/",
    seed: int = 0,
    grid: dict | None = None,
) -> tuple[SigmoidFit, dict[str, float]]:
    """The end-of-run fit: like :func:`fit_metrics`, and also writes the plot ``out_png``
    (conventionally ``<run dir>/scaling_curve.png``; log it as an MLflow artifact) with the curve
    extrapolated to ``extrapolate`` x the budget.  The metrics include
    ``fit/pred_at_{extrapolate}x`` (predicted reward at that multiple of the budget)."""
    fit, metrics = fit_metrics(
        compute,
        reward,
        steps=steps,
        min_step=min_step,
        min_compute=min_compute,
        method=method,
        bootstrap=bootstrap,
        level=level,
        prefix=prefix,
        seed=seed,
        grid=grid,
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


FIT_LEVEL = 0.9  # the confidence level of a run's scaling-fit intervals


def evaluation_fits(
    evals: list[dict], scaling, *, domains=(), out_dir: Path | None = None
) -> tuple[dict[str, float], list[Path]]:
    """The live fit over a run's evaluations so far: of the pass rate (``fit/*``) and, for
    ``task=multi``, of each domain's (``fit/<domain>/*``, as the paper's Fig. 11 fits math and code
    apart). ``evals``: the run's points (``step``, the ``scaling.compute_axis`` and ``pass_rate[/d]``);
    ``scaling``: the run's ``scaling`` config. With ``out_dir`` (the final fit) each curve's figure is
    written there too (``scaling_curve[_<domain>].png``). Returns the metrics and the figures written;
    never raises (a fit must never stop a run)."""
    series = [("pass_rate", "fit/", "scaling_curve.png")]
    series += [(f"pass_rate/{d}", f"fit/{d}/", f"scaling_curve_{d}.png") for d in domains]
    metrics: dict[str, float] = {}
    figures: list[Path] = []
    for key, prefix, png_name in series:
        points = [e for e in evals if key in e]
        if len(points) < 4:
            continue
        compute = [e[scaling.compute_axis] for e in points]
        reward = [e[key] for e in points]
        protocol = dict(
            steps=[e["step"] for e in points],
            min_step=scaling.min_step,
            min_compute=scaling.min_compute,
            method=scaling.method,
            bootstrap=scaling.bootstrap,
            level=FIT_LEVEL,
            grid=grid_options(scaling),
            prefix=prefix,
        )
        try:
            if out_dir is not None:
                png = Path(out_dir) / png_name
                _, m = final_report(
                    compute, reward, out_png=str(png), extrapolate=scaling.extrapolate, **protocol
                )
                if png.is_file():
                    figures.append(png)
            else:
                _, m = fit_metrics(compute, reward, **protocol)
        except Exception as e:  # noqa: BLE001 - a fit must never kill a run
            log.warning("scaling fit failed: %s", e)
            continue
        metrics.update(m)
    return metrics, figures
