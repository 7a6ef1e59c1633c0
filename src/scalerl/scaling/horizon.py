"""The horizon rule: how far a sigmoid fitted on a window of compute may be extrapolated.

A sigmoid fitted to a window that ends soon after the bend fixes the curve's shape before the data
do. The real runs show why that matters: their local exponent (the slope of ``log((A - R) / (R - R0))``
against ``log C``) is about 1.1-1.3 up to about 2.5x C_mid and about 2.1 after it, so a fit whose
window ends there rises too slowly past it and under-estimates the end (issue 53). Measured on
synthetic curves with that shape (:class:`~scalerl.scaling.synthetic.RisingCurve`, the study's
design: 3 seeds, 768-sample evaluations, predicting twice the window's end) and on the 2-digit
runs evaluated to 360 steps, the error of the extrapolation shrinks with the window's **reach**,
its end over the fitted C_mid: about -0.04 at 2.5x, -0.03 at 3.5x, -0.015 at 4.5x and under
0.01 past 5x (benchmarks/results/ holds the measurement: ``*_prediction-horizon.md``;
benchmarks/bench_prediction.py reruns it).

The rule: an extrapolation is **supported** when the fit's window reaches :data:`HORIZON` x its
fitted C_mid: from there the measured shape bias is within half the prediction tolerance (0.015)
for the measured case and within 0.02 for every rising-exponent variation measured (a rise as late
as 3.2x C_mid is the worst), and the real runs' fit over steps 18-180 (4.65x) predicts step 360
within 0.009, where one ending at 2.7x misses by 0.06; a window that ends before it is reported as not supported,
with the bias measured at its reach and the compute that would carry the window to the horizon
(C_mid stays where it is, so the window must grow by ``HORIZON / reach``). The rule cannot see a
change of shape that starts past the horizon; it states what the measured curves support.

**A ceiling below 1.** The bias table was measured on curves whose ceiling is the bound 1. On the
ceiling-below-1 design (``sweeps/loo_ceiling.yaml``, reference 0.75) the error at the horizon has
the other sign and is set by the early cut, not the reach: a pooled half fit whose window ended at
about 5x its C_mid over-predicted by 0.044 from step 10 and by 0.005 with the first 30% of the
budget left out (``*_ceiling-seeds.md`` in benchmarks/results/), because a sigmoid cannot follow
that design's early rise. So a supported fit whose A is below 1 says that its bias figure is the
ceiling-1 one, and a study of such curves sets ``scaling.min_step`` past the first rise.

**A curve that falls.** The rule reads the fit's own C_mid, so it cannot see a window whose curve
falls and recovers (an unstable recipe's dips): the fit takes its A and C_mid from the dips. The
fall rule (:data:`FALL_LIMIT`, :data:`FALL_SE`, :func:`is_unstable`) leaves such an extrapolation
unsupported whatever the reach: a run's own curve in its live fit (:func:`fit_horizon` with the
samples of an evaluation), each seed's in a sweep's report (the median seed).

:func:`shape_error` is the band's share of that shape error (calibrated on the same curves and on
the real runs' measured errors): the sd to add to a prediction's band at a given reach, so that the
band covers the shape error as well as the bootstrap and the binomial noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HORIZON = 4.5
"""The reach (window end / fitted C_mid) from which an extrapolation to twice the window is supported."""

FALL_LIMIT = 0.09
"""A fall this large inside a fit's window, from the curve's running maximum (three of the report's
0.03 prediction tolerances), leaves its extrapolation unsupported whatever the reach (with
:data:`FALL_SE`): a sigmoid rises monotonically, so a window whose curve falls does not fix its shape,
and more compute does not make it. Measured on the ceiling study's curves (benchmarks/results/
``*_prediction-fall-rule.md``): the seeds and variants that fell this far missed their end."""
FALL_SE = 3.0
"""... and at least this many binomial standard errors of the difference of two evaluations, so
that evaluation noise alone does not make it."""

BELOW_BOUND = 0.999
"""A fit whose A is under this has a ceiling below the bound 1 (the pass rate's)."""

_REACH = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.5)
"""The reaches at which the shape error was measured (interpolated in log reach between them, held
at the ends beyond them)."""
_BIAS = (-0.024, -0.040, -0.043, -0.033, -0.027, -0.019, -0.014, -0.010, -0.006, -0.004)
"""Mean error of the extrapolation to twice the window at each reach, on synthetic curves whose
exponent rises as the measured runs' did (1.15 to 2.23 at 2.56x C_mid)."""
_SHAPE_SD = (0.050, 0.065, 0.070, 0.055, 0.035, 0.025, 0.016, 0.012, 0.008, 0.005)
"""The root-mean-square shape error at each reach: the larger of the rising-exponent curves' (over
rise points 2-3.2x C_mid and late exponents 1.8-2.6) and the real runs' measured errors."""


def _interp(reach: float, table) -> float:
    if not math.isfinite(reach) or reach <= 0:
        return float(table[0])
    return float(np.interp(math.log(reach), np.log(_REACH), table))


def shape_bias(reach: float) -> float:
    """The measured mean error (predicted - observed) of an extrapolation to twice a window of this
    reach, on curves whose exponent rises as measured (negative: an under-estimate); NaN below the
    smallest reach measured (a window ending before 1.5x C_mid has barely seen the bend)."""
    if not math.isfinite(reach) or reach < _REACH[0]:
        return math.nan
    return _interp(reach, _BIAS)


def shape_error(reach: float) -> float:
    """The sd of the shape error to add to a prediction band at this reach (see the module)."""
    return _interp(reach, _SHAPE_SD)


@dataclass(frozen=True)
class Horizon:
    """Whether a fit's extrapolation is supported by the reach of its window."""

    reach: float = math.nan  # window end / fitted C_mid
    horizon: float = HORIZON
    supported: bool | None = None  # None: not judged (no fit)
    more_compute: float = math.nan  # the factor of compute that carries the window to the horizon (1: none)
    bias: float = math.nan  # measured mean shape error at this reach
    shape_sd: float = math.nan  # the band's shape error at this reach
    below_bound: bool = False  # the fit's A below the bound 1: the bias table is not its kind of curve
    fall: float = math.nan  # the curve's largest fall inside the window (NaN: not judged)
    fall_se: float = math.nan  # that fall in binomial standard errors (NaN: the evaluations' size unknown)

    @property
    def unstable(self) -> bool:
        """The curve falls inside the window by :data:`FALL_LIMIT` and :data:`FALL_SE` standard errors
        (by the fall alone where the standard error is unknown)."""
        return is_unstable(self.fall, self.fall_se)

    def line(self, what: str = "the fit") -> str:
        """One sentence for a report: supported, or why not and how much more compute it needs."""
        if self.supported is None:
            return f"{what}: extrapolation not judged (no fit)"
        where = f"{what}'s window ends at {reach_text(self.reach, self.horizon)}x C_mid"
        if self.unstable:
            se = f", {self.fall_se:.1f} se" if math.isfinite(self.fall_se) else ""
            short = f" (predictions need >= {self.horizon:g}x)" if self.reach < self.horizon else ""
            return (
                f"{where}{short}, and the curve fell {self.fall:.3f} inside it{se}: extrapolation not supported "
                "(a sigmoid rises monotonically and cannot follow a fall; more compute does not make it)"
            )
        if self.supported:
            kind = (
                ", on curves whose ceiling is 1; below 1 it depends on the early cut (scaling.min_step)"
                if self.below_bound
                else ""
            )
            return (
                f"{where}, past the horizon ({self.horizon:g}x): extrapolation supported "
                f"(measured shape bias there {self.bias:+.3f}{kind})"
            )
        bias = (
            f"measured bias at this reach {self.bias:+.3f}, on curves whose exponent rises as the real runs' did"
            if math.isfinite(self.bias)
            else "bias not measured this early"
        )
        return (
            f"{where}; predictions need >= {self.horizon:g}x: extrapolation not supported ({bias}); "
            f"{compute_text(self.more_compute)} would make it supported"
        )

    def metrics(self, prefix: str = "fit/") -> dict[str, float]:
        """``fit/reach``, ``fit/supported`` (1/0, NaN when not judged), ``fit/more_compute``,
        ``fit/shape_bias``, ``fit/fall`` and ``fit/fall_se`` for MLflow."""
        sup = math.nan if self.supported is None else float(self.supported)
        return {
            f"{prefix}reach": round(self.reach, 3) if math.isfinite(self.reach) else math.nan,
            f"{prefix}supported": sup,
            f"{prefix}more_compute": round(self.more_compute, 2)
            if math.isfinite(self.more_compute)
            else math.nan,
            f"{prefix}shape_bias": round(self.bias, 3) if math.isfinite(self.bias) else math.nan,
            f"{prefix}fall": round(self.fall, 4) if math.isfinite(self.fall) else math.nan,
            f"{prefix}fall_se": round(self.fall_se, 2) if math.isfinite(self.fall_se) else math.nan,
        }


def is_unstable(fall: float, fall_se: float) -> bool:
    """A fall of at least :data:`FALL_LIMIT` and :data:`FALL_SE` standard errors (the fall alone where
    ``fall_se`` is NaN); False where the fall is NaN (not judged)."""
    return bool(fall >= FALL_LIMIT and not fall_se < FALL_SE)


def largest_fall(compute, reward) -> tuple[float, float]:
    """A curve's largest fall from its running maximum, over its finite points in compute order:
    ``(fall, the maximum it fell from)``; NaN with fewer than 3 points."""
    c, y = np.asarray(compute, dtype=float), np.asarray(reward, dtype=float)
    ok = np.isfinite(c) & np.isfinite(y)
    if ok.sum() < 3:
        return math.nan, math.nan
    y = y[ok][np.argsort(c[ok], kind="stable")]
    top = np.maximum.accumulate(y)
    i = int(np.argmax(top - y))
    return float(top[i] - y[i]), float(top[i])


def fall_in_se(fall: float, top: float, trials: float) -> float:
    """``fall`` from the maximum ``top`` in binomial standard errors of the difference of two
    evaluations of ``trials`` samples each, at their pooled pass rate (``top - fall / 2``, as the
    two-proportion test takes it under "no fall"): a maximum of 1.0 does not make any fall from it
    infinitely many; NaN where ``trials`` is unknown."""
    if not (math.isfinite(fall) and math.isfinite(trials) and trials > 0):
        return math.nan
    rate = top - fall / 2
    se = math.sqrt(2 * rate * (1 - rate) / trials)
    return fall / se if se > 0 else (math.inf if fall > 0 else 0.0)


def reach_text(reach: float, horizon: float = HORIZON) -> str:
    """A reach for a sentence: one decimal, or two where one would print the horizon itself for a
    reach short of it (4.47 is "4.47", not "4.5")."""
    text = f"{reach:.1f}"
    return f"{reach:.2f}" if reach < horizon and float(text) >= horizon else text


def compute_text(factor: float, of: str = "the compute so far") -> str:
    """The compute a window needs to reach the horizon, in words: "about 1.8x the compute so far", or
    "about 3% more than the compute so far" for a factor under 1.1 (where "1.0x" would read as none)."""
    if factor < 1.1:
        return f"about {max(1, math.ceil(100 * (factor - 1)))}% more than {of}"
    return f"about {factor:.1f}x {of}"


def horizon_of(
    c_mid: float,
    window_end: float,
    *,
    horizon: float = HORIZON,
    below_bound: bool = False,
    fall: float = math.nan,
    fall_se: float = math.nan,
) -> Horizon:
    """The rule for a fit with this fitted ``c_mid`` whose window ends at ``window_end`` (the largest
    compute it was fitted on); not judged when either is missing. ``below_bound``: the fit's A is
    below 1 (its line then says which curves its bias figure was measured on). ``fall``, ``fall_se``:
    the curve's largest fall inside the window (:func:`largest_fall`, :func:`fall_in_se`; NaN: not
    judged); an unstable curve (:func:`is_unstable`) is not supported whatever its reach."""
    if not (math.isfinite(c_mid) and c_mid > 0 and math.isfinite(window_end) and window_end > 0):
        return Horizon(horizon=horizon)
    reach = window_end / c_mid
    far = reach >= horizon
    return Horizon(
        reach=reach,
        horizon=horizon,
        supported=bool(far and not is_unstable(fall, fall_se)),
        more_compute=1.0 if far else horizon / reach,
        bias=shape_bias(reach),
        shape_sd=shape_error(reach),
        below_bound=bool(below_bound),
        fall=fall,
        fall_se=fall_se,
    )


def fit_horizon(fit, *, horizon: float = HORIZON, trials: float | None = None) -> Horizon:
    """:func:`horizon_of` for a :class:`~scalerl.scaling.sigmoid.SigmoidFit` (its window: the largest
    compute among the points it used); not judged when the fit failed. With ``trials`` (the samples
    of one evaluation; NaN where unknown) the fall rule is judged too, on a one-curve fit's points
    (a pooled fit's seeds are judged one by one by the report: ``scalerl.analysis.verdicts``)."""
    if fit is None or not fit.ok or fit.through_points:  # (its reach means nothing: through_points)
        return Horizon(horizon=horizon)
    used = np.asarray(fit.used, dtype=bool)
    c = np.asarray(fit.compute, dtype=float)
    y = np.asarray(fit.reward, dtype=float)
    if used.size == c.size and used.any():
        c, y = c[used], y[used]
    fall = fall_se = math.nan
    if trials is not None and fit.run_index is None and y.size == c.size:
        fall, top = largest_fall(c, y)
        fall_se = fall_in_se(fall, top, trials)
    c = c[np.isfinite(c)]
    end = float(c.max()) if c.size else math.nan
    return horizon_of(
        fit.C_mid, end, horizon=horizon, below_bound=bool(fit.A < BELOW_BOUND), fall=fall, fall_se=fall_se
    )
