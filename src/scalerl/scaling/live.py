"""Scaling fits inside a training run: the calls the training loop makes.

None of these functions raises: a failure of any kind yields a fit with ``ok == False`` and its reason,
and metrics with NaN values, so a bad refit can never stop training.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from scalerl.scaling.horizon import BELOW_BOUND, HORIZON, Horizon, fit_horizon, reach_text
from scalerl.scaling.protocol import FitProtocol
from scalerl.scaling.sigmoid import N_PARAMS, SigmoidFit, round_to

log = logging.getLogger(__name__)

FIT_LEVEL = (
    FitProtocol.level
)  # the confidence level of a run's scaling-fit intervals (the protocol's default)


def _safe_fit(compute, reward, protocol: FitProtocol, *, steps) -> SigmoidFit:
    try:
        c = np.asarray(compute, dtype=float)
        s = np.arange(c.size) if steps is None else np.asarray(steps, dtype=float)
        return protocol.fit(c, reward, min_compute=protocol.cut(s, c))
    except Exception as e:  # noqa: BLE001 - a refit must never stop training
        log.warning("scaling fit failed: %s", e)
        return SigmoidFit(
            ok=False,
            reason=f"fit error: {type(e).__name__}: {e}",
            method=protocol.method,
            level=protocol.level,
        )


def fit_metrics(
    compute,
    reward,
    protocol: FitProtocol = FitProtocol(),
    *,
    steps=None,
    prefix: str = "fit/",
    trials: float | None = None,
) -> tuple[SigmoidFit, dict[str, float]]:
    """Refit the sigmoid to the evaluations so far (``compute`` cumulative, step-0 point included)
    with ``protocol``.

    Points evaluated before step ``protocol.min_step`` (``steps``: each evaluation's optimiser step;
    default: its index) or below ``protocol.min_compute`` are left out (:meth:`FitProtocol.cut`: the
    same absolute cut as the report's); NaN evaluations are skipped. Returns the fit and
    ``fit.to_metrics(prefix)`` (``fit/A``, ``fit/A_lo`` ... ``fit/ok``) and the horizon rule's
    (:func:`horizon_metrics`: ``fit/supported`` ...; with ``trials``, the samples of one
    evaluation, the fall rule's too).
    """
    fit = _safe_fit(compute, reward, protocol, steps=steps)
    return fit, logged_metrics(fit, prefix, trials=trials)


def logged_metrics(fit: SigmoidFit, prefix: str = "fit/", *, trials: float | None = None) -> dict[str, float]:
    """A fit's ``fit/*`` as a run logs them: ``fit.to_metrics(prefix)`` and the horizon rule's
    (:func:`horizon_metrics`; with ``trials``, the fall rule's too). A report writing its own fit
    back to a run logs the same keys, so that none is left describing another fit."""
    return {**fit.to_metrics(prefix), **horizon_metrics(fit, prefix, trials=trials)}


def prediction_metric(fit: SigmoidFit, compute, extrapolate: float, prefix: str = "fit/") -> dict[str, float]:
    """``fit/pred_at_<x>x``: the fit's pass rate at ``extrapolate`` x the budget (the largest of
    ``compute``, values that are not finite skipped); NaN where the fit failed or there is no
    budget."""
    c = np.asarray(compute, dtype=float)
    c = c[np.isfinite(c)]
    budget = float(c.max()) if c.size else math.nan
    ok = fit.ok and math.isfinite(budget)
    return {
        f"{prefix}pred_at_{float(extrapolate):g}x": round_to(float(fit.predict(budget * float(extrapolate))))
        if ok
        else math.nan
    }


def final_report(
    compute,
    reward,
    protocol: FitProtocol = FitProtocol(),
    *,
    out_png,
    steps=None,
    title: str | None = None,
    xlabel: str = "compute",
    prefix: str = "fit/",
    trials: float | None = None,
) -> tuple[SigmoidFit, dict[str, float]]:
    """The end-of-run fit: like :func:`fit_metrics`, and also writes the plot ``out_png``
    (conventionally ``<run dir>/scaling_curve.png``; log it as an MLflow artifact) with the curve
    extrapolated to ``protocol.extrapolate`` x the budget.  The metrics include
    ``fit/pred_at_{extrapolate}x`` (predicted reward at that multiple of the budget) and, as every
    refit's, the horizon rule's verdict on extrapolating it (``fit/supported``, ``fit/reach``,
    ``fit/more_compute``, ``fit/shape_bias``); :func:`horizon_line` says it in words."""
    fit, metrics = fit_metrics(compute, reward, protocol, steps=steps, prefix=prefix, trials=trials)
    # a fit on as many points as it has parameters predicts nothing: no pred_at, no dashed line
    extrapolate = 1.0 if fit.through_points else protocol.extrapolate
    try:
        if not fit.through_points:
            metrics.update(prediction_metric(fit, compute, extrapolate, prefix))
    except Exception as e:  # noqa: BLE001
        log.warning("scaling prediction failed: %s", e)
    try:
        from scalerl.scaling.plot import plot_fit

        Path(out_png).parent.mkdir(parents=True, exist_ok=True)
        title = title or figure_title(fit, metrics, prefix)
        plot_fit(out_png, [("run", fit)], extrapolate=extrapolate, title=title, xlabel=xlabel)
    except Exception as e:  # noqa: BLE001 - the plot is a nicety
        log.warning("scaling plot failed: %s", e)
    return fit, metrics


def figure_title(fit: SigmoidFit, metrics: dict[str, float], prefix: str = "fit/") -> str:
    """The end-of-run figure's title: why there is no fit, or what its extrapolation is worth
    (:func:`extrapolation_title`)."""
    if not fit.ok:
        return f"No sigmoid fit: {fit.reason or 'the fit failed'}"
    if fit.through_points:
        return f"Sigmoid scaling fit on {fit.n_points} points for {N_PARAMS} parameters: nothing extrapolated"
    return extrapolation_title(metrics, prefix)


def extrapolation_title(metrics: dict[str, float], prefix: str = "fit/") -> str:
    """The end-of-run figure's title for a fit it extrapolates: what its dashed extrapolation is
    worth by the horizon and fall rules (``fit/supported``, ``fit/reach``, ``fit/fall``), so that a
    figure read alone does not pass an unsupported extrapolation for a prediction."""
    head = "Sigmoid scaling fit (solid: fitted range, dashed: extrapolation)\nextrapolation "
    h = _logged_horizon(metrics, prefix)
    if h is None:
        return head + "not judged"
    if h.supported:
        return head + f"supported (the window reaches {reach_text(h.reach, h.horizon)}x C_mid)"
    why = []
    if math.isfinite(h.reach) and h.reach < h.horizon:
        why.append(f"the window ends at {reach_text(h.reach, h.horizon)}x C_mid, it needs {h.horizon:g}x")
    if h.unstable:
        why.append(f"the curve fell {h.fall:.2f} inside it")
    return head + "NOT supported" + (": " + "; ".join(why) if why else "")


def progress_text(metrics: dict[str, float]) -> str:
    """The live fit's part of a progress line: its A with the interval, and whether extrapolating
    it is supported yet (the horizon and fall rules); nothing where no fit was judged (none made,
    or one through as few points as it has parameters, whose A is set by those points alone)."""
    a, lo, hi = (metrics.get(f"fit/A{s}", math.nan) for s in ("", "_lo", "_hi"))
    sup = metrics.get("fit/supported", math.nan)
    if not (math.isfinite(a) and math.isfinite(sup)):
        return ""
    ci = f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    if sup:
        return f" fit/A={a:.3f}{ci}"
    h = _logged_horizon(metrics, "fit/")
    # a fall inside the window is not outgrown by more compute: no "yet"
    return f" fit/A={a:.3f}{ci} (extrapolation not supported{'' if h is not None and h.unstable else ' yet'})"


def horizon_metrics(
    fit: SigmoidFit, prefix: str = "fit/", *, trials: float | None = None
) -> dict[str, float]:
    """The horizon rule (:mod:`scalerl.scaling.horizon`) for a run's fit: whether its window (the
    largest compute it was fitted on) reaches :data:`~scalerl.scaling.horizon.HORIZON` x its fitted
    C_mid, so that extrapolating it is supported, and, with ``trials`` (the samples of one
    evaluation), whether its curve falls inside the window (the fall rule); NaN values when the fit
    failed. Never raises."""
    try:
        return fit_horizon(fit, trials=trials).metrics(prefix)
    except Exception as e:  # noqa: BLE001 - a refit must never stop training
        log.warning("horizon rule failed: %s", e)
        return Horizon().metrics(prefix)


def horizon_line(metrics: dict[str, float], prefix: str = "fit/", *, what: str = "the scaling fit") -> str:
    """The horizon rule's sentence from a run's ``fit/*`` metrics ("" when not judged): supported,
    or "not supported ... about 1.8x the compute so far would make it supported"."""
    h = _logged_horizon(metrics, prefix)
    return "" if h is None else h.line(what)


def _logged_horizon(metrics: dict[str, float], prefix: str) -> Horizon | None:
    """The horizon rule's finding as a run logged it (``fit/supported`` ...), None where not judged."""
    sup = metrics.get(f"{prefix}supported", math.nan)
    if sup is None or not math.isfinite(sup):
        return None
    return Horizon(
        reach=float(metrics.get(f"{prefix}reach", math.nan)),
        horizon=HORIZON,
        supported=bool(sup),
        more_compute=float(metrics.get(f"{prefix}more_compute", math.nan)),
        bias=float(metrics.get(f"{prefix}shape_bias", math.nan)),
        below_bound=float(metrics.get(f"{prefix}A", math.nan)) < BELOW_BOUND,
        fall=float(metrics.get(f"{prefix}fall", math.nan)),
        fall_se=float(metrics.get(f"{prefix}fall_se", math.nan)),
    )


def evaluation_fits(
    evals: list[dict],
    protocol: FitProtocol,
    *,
    domains=(),
    out_dir: Path | None = None,
    trials: float | None = None,
    domain_trials: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], list[Path]]:
    """The live fit over a run's evaluations so far: of the fitted metric (``protocol.metric``: the
    pass rate, or a pass@k) as ``fit/*`` and, for ``task=multi``, of each domain's
    (``fit/<domain>/*``, as the paper's Fig. 11 fits math and code apart). ``evals``: the run's
    points (``step``, the ``protocol.compute_axis`` and ``<metric>[/d]``);
    ``protocol``: the run's :class:`FitProtocol` (``FitProtocol.from_config(cfg.scaling)``). With ``out_dir`` (the final fit) each curve's figure is
    written there too (``scaling_curve[_<domain>].png``). ``trials``: the samples of one evaluation
    of the fitted metric, for the fall rule on the whole curve; ``domain_trials``: each domain's
    share of them, for the rule on its curve (a domain not in it is judged by the horizon rule
    alone). Returns the metrics and the figures written; never raises (a fit must never stop a run)."""
    m = protocol.metric
    series = [(m, "fit/", "scaling_curve.png", trials)]
    shares = domain_trials or {}
    series += [(f"{m}/{d}", f"fit/{d}/", f"scaling_curve_{d}.png", shares.get(d)) for d in domains]
    metrics: dict[str, float] = {}
    figures: list[Path] = []
    for key, prefix, png_name, n in series:
        points = [e for e in evals if key in e]
        if len(points) < 4:
            continue
        compute = [e[protocol.compute_axis] for e in points]
        reward = [e[key] for e in points]
        where = dict(steps=[e["step"] for e in points], prefix=prefix, trials=n)
        try:
            if out_dir is not None:
                png = Path(out_dir) / png_name
                _, m = final_report(compute, reward, protocol, out_png=str(png), **where)
                if png.is_file():
                    figures.append(png)
            else:
                _, m = fit_metrics(compute, reward, protocol, **where)
        except Exception as e:  # noqa: BLE001 - a fit must never kill a run
            log.warning("scaling fit failed: %s", e)
            continue
        metrics.update(m)
    return metrics, figures
