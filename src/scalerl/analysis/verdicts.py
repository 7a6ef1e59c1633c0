"""Per-variant verdicts: the paper's leave-one-out protocol with one estimator, a named test and a stated level.

A variant is all the runs of one recipe (its seeds). The protocol:

- **One estimator, every fitted seed.** Each seed is fitted on its own (the per-run fits of the
  report). A variant's A is the **mean over every seed with a usable fit** and its interval the
  **t-interval** over them (``level``, n - 1 degrees of freedom): no seed is left out because of what
  its fit found (averaging only the seeds whose ceiling "settled" selected by outcome, biasing A low
  and dropping n). A fit is unusable only for reasons fixed before its outcome: it failed, or it was
  fitted through no more points than the curve has free parameters (it passes through them: A is set
  by those points alone, not a ceiling they bound). **Censored seeds**: a seed whose fitted A lies within
  :data:`A_BOUND_TOL` of 1, or whose bootstrap interval reaches 1 (the data do not bound its ceiling
  below the maximum), is *censored at 1*: it stays in the mean at its fitted value, and is counted.
  Where at least half of a variant's seeds are censored (or fewer than 2 are usable), its A is **not
  shown** at this budget (unbounded): reported, not scored. A seed with A at R0 (a curve that did
  not rise) is kept at its fitted value like any other.
- **A bounded below.** A variant whose A is not shown because at least half its seeds are censored
  at 1 (a component that lets the policy learn the whole task) can still be shown to raise the
  ceiling over a baseline whose A is shown: each censored seed enters at its interval's lower end
  (the least ceiling its data allow; the others at their fitted A), and the same Welch test calls
  "A higher" when even those lie above the baseline's A by more than the margin. ΔA and its
  interval are then a lower bound (:attr:`Comparison.bound`); no lower or equal A, and no
  equivalence, can be shown that way.
- **B at a fixed A** (the paper's protocol): every run is refitted with A fixed to the baseline's A
  (the same estimate over its seeds), and B is compared at that A, estimated the same way (mean and
  t-interval over every refitted seed; a B at its fit bound is censored there, by the same rule). B
  is not scored while the variant's A is not shown, except where the baseline's ceiling itself is
  not shown (most of its seeds censored at 1): then A = 1 and B alone is compared at A = 1.
- **The test.** A difference from the baseline (in A, and in B at the fixed A) is tested with
  **Welch's two-sample t-test on that pair alone** (the variant's and the baseline's per-seed
  values; no spread is pooled over other variants, whose seeds may be far less noisy: the measured
  seed-to-seed spread differs tenfold between variants), two-sided, **Bonferroni-corrected** over
  the family of every comparison in the table (A and B of each scored variant: m = 2 x the scored
  variants) at a **family-wise level of** :data:`FAMILY_LEVEL` (each test at ``FAMILY_LEVEL / m``).
  A difference is called only when the simultaneous ``1 - FAMILY_LEVEL / m`` interval of the
  difference excludes 0 **and** the difference exceeds the paper's margin (:data:`MARGIN_A` = 0.02
  for A; the paper gives no margin for B): "A higher" / "A lower" with ΔA and its interval. Its
  degrees of freedom come from 2-3 seeds a side, so the level holds while the two sides' spreads
  are within about 3x of each other (the shipped studies' stable variants: 0.7-1.4x); at 5-10x a
  single test calls up to 2.4x its level, more where the noisier side lost a run
  (benchmarks/bench_welch_level.py). A pair with no spread between seeds is not tested.
- **Equivalence on A** (TOST): for a variant whose A is not called, two one-sided Welch tests at the
  same per-test level ``FAMILY_LEVEL / m`` against a margin ``±δ``: "A equivalent within ±δ" when
  the ``1 - 2 FAMILY_LEVEL / m`` interval of ΔA lies inside ``±δ``, otherwise "equivalence not shown
  at this budget". ``δ`` is one margin for the whole table, stated with it: the paper's
  :data:`MARGIN_A` (±0.02), or where the design cannot resolve that, the smallest margin it
  resolves (TOST at :data:`POWER` power for equal ceilings, from the seeds' spread and the seeds per
  variant), at most :data:`EQ_MARGIN_MAX` (±0.05). A comparison of A either calls a difference or
  equivalence or neither, each at the per-test level, so the family-wise level holds over both.
  This is how "changes B, not A" is shown: B called, A equivalent.
- **Smallest detectable ΔA** (the design's resolution, under the same Welch test): the difference
  found with :data:`POWER` probability, ``(t(1 - a/2, df) + t(POWER, df)) * se``: per pair ``se`` and
  ``df`` are the pair's own (Welch); for the table, ``se = s * sqrt(1/n_v + 1/n_b)`` and
  ``df = n_v + n_b - 2`` (Welch's df at equal spreads), ``s`` the seeds' spread pooled over the
  variants as a description of the design (never in a test), ``n_v``, ``n_b`` the seeds of the
  variant and the baseline and ``a`` the per-test level; never below the margin.
- **Labels** (:attr:`VariantVerdict.label`, the machine-readable report's ``verdict``): ``baseline``;
  ``A higher`` / ``A lower`` (A called); else ``B higher`` / ``B lower`` (B called; the verdict text
  says whether A is equivalent); else ``equivalent`` (A equivalent, nothing called); else
  ``inconclusive`` (tested, nothing called or shown); ``not shown`` (nothing could be tested: A or
  B unbounded, unfittable, a component that never acted); ``not run`` (no runs, or a component
  that cannot act on this hardware).
- **Not scored**: a variant whose component cannot act on this hardware (a bf16 LM head emulated
  on CPU: the paper's mechanism, a generator/trainer kernel mismatch, cannot act) or did not act
  in its runs (no prompt retired, policy lag never beyond the smaller k, no interruption, no
  zero-variance group) is reported as such and left out of the family.
- **Prediction** (:class:`Prediction`): the pooled fit of the seeds' first half of the compute
  predicts the seeds' observed end (their evaluations in the last :data:`END_WINDOW` of the
  compute); the 90% prediction band combines the half fit's bootstrap (residuals within each seed,
  the seeds kept: the target is these seeds' end) with the binomial noise of those evaluations
  (their logged ``eval.num_prompts x eval.samples_per_prompt``; the half fit's rmse when not
  logged) and the shape error at the half window's reach (:mod:`scalerl.scaling.horizon`). The
  horizon rule: a prediction is *supported* only where the half window reaches
  :data:`~scalerl.scaling.horizon.HORIZON` x the half fit's C_mid; an unsupported one is reported
  with the bias measured at its reach and the budget that would support it. Nor is one whose seeds'
  curves fall inside the half window, from their running maximum, by at least :data:`FALL_LIMIT`
  and :data:`FALL_SE` standard errors (the median over seeds of each one's largest fall:
  :func:`half_fall`): a sigmoid rises monotonically, so a window with such falls does not fix its
  shape, and more compute does not make it (an unstable recipe's dips pull the half fit's A down).
  Goal: supported and abs error <= :data:`PRED_TOLERANCE` on :data:`PRED_GOAL_SHARE` of the
  scored variants and coverage >= :data:`PRED_GOAL_COVERAGE` of the supported ones' bands at a
  median half-width <= :data:`PRED_GOAL_HALF_WIDTH`; the skill against persistence (the first
  half's last value as the forecast) is reported beside it.

Every fit uses the same protocol (:class:`~scalerl.scaling.FitProtocol`: its absolute early cut) as the
live refits and the per-run table. The calibration of the test on synthetic null sweeps is checked
in tests/test_verdict_calibration.py and measured by benchmarks/bench_verdicts.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from scalerl.analysis.mlflow_io import RunData
from scalerl.scaling.horizon import (
    FALL_LIMIT,
    FALL_SE,
    HORIZON,
    compute_text,
    fall_in_se,
    fit_horizon,
    is_unstable,
    largest_fall,
    reach_text,
)
from scalerl.scaling.pass_at_k import evaluation_samples
from scalerl.scaling.protocol import FitProtocol
from scalerl.scaling.sigmoid import B_BOUNDS, N_PARAMS, SigmoidFit, _predict, fit_fixed_A

FAMILY_LEVEL = 0.05
"""Family-wise error rate of the verdict table: the chance that any comparison is called when no
variant differs from the baseline (Bonferroni over every A and B comparison)."""
MARGIN_A = 0.02
"""The paper's margin on A (three seeds differed by at most 0.015): smaller differences are not called."""
POWER = 0.8
"""The power at which the smallest detectable ΔA is stated."""
A_BOUND_TOL = 0.005
"""A seed whose fitted A lies within this of 1 is censored at 1 (A at the pass rate's maximum)."""
A_UNSETTLED = 1.0 - A_BOUND_TOL
PRED_TOLERANCE = 0.03
"""A prediction within this of the observed end (:func:`end_points`, the mean over seeds) counts as predicted."""
END_WINDOW = 0.1
"""A run's observed end: its evaluations in this last share of its compute (at least its last one).
One evaluation's binomial noise is about half the prediction tolerance at the studies' sample counts;
the few evaluations of the last tenth, where a curve past its bend moves less than that noise,
measure the end it converged to more closely."""
PRED_LEVEL = 0.9
"""Level of the prediction band."""
PRED_GOAL_SHARE = 0.75
"""The prediction goal: this share of the scored variants (6 of 8) within :data:`PRED_TOLERANCE` ..."""
PRED_GOAL_COVERAGE = 0.8
"""... and this share of observed values inside their prediction band ..."""
PRED_GOAL_HALF_WIDTH = 0.03
"""... whose median half-width is at most this (issue 53: a wide band is no prediction)."""
EQ_MARGIN_MAX = 0.05
"""The widest equivalence margin on A: a design that cannot resolve ±0.05 shows no equivalence."""
INCONCLUSIVE = "inconclusive at this budget"
NOT_SHOWN = "not shown at this budget"
LABELS = (
    "baseline",
    "A higher",
    "A lower",
    "B higher",
    "B lower",
    "equivalent",
    "inconclusive",
    "not shown",
    "not run",
)
"""The machine-readable verdicts (:attr:`VariantVerdict.label`)."""
NO_DIFFERENCE = INCONCLUSIVE  # the name of earlier versions


@dataclass
class Estimate:
    """One parameter of a variant: the mean and t-interval over every usable seed, the censored ones
    at their fitted value (the module's rule)."""

    mean: float = math.nan
    sd: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    n: int = 0  # seeds in the mean (every usable fit)
    total: int = 0  # fitted seeds
    unsettled: str = ""  # why the variant's value is not shown / not scored ("" = shown)
    values: list[float] = field(default_factory=list)
    censored: int = 0  # seeds censored at the bound (A at 1 or its interval reaching 1; B at a bound)
    # A only: each usable seed's least ceiling, its fitted A or, censored at 1, its interval's lower end
    floors: list[float] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Shown and scored: 2 or more usable seeds, fewer than half of them censored."""
        return not self.unsettled and self.n >= 2


@dataclass
class Comparison:
    """One difference from the baseline (variant - baseline) under Welch's t-test."""

    delta: float = math.nan
    lo: float = math.nan  # simultaneous (1 - FAMILY_LEVEL / m) interval
    hi: float = math.nan
    p: float = math.nan  # two-sided p-value of the single test
    alpha: float = math.nan  # the per-test level FAMILY_LEVEL / m
    df: float = math.nan
    margin: float = 0.0
    mdd: float = math.nan  # smallest detectable difference at POWER
    called: int = 0  # +1 / -1: a difference called
    tested: bool = False
    eq_margin: float = math.nan  # the equivalence margin ±δ (TOST; NaN: not tested)
    eq_lo: float = math.nan  # the 1 - 2 alpha interval of the difference, inside ±δ for equivalence
    eq_hi: float = math.nan
    eq_p: float = math.nan  # TOST p-value (the larger of the two one-sided tests)
    equivalent: bool = False
    untestable: str = ""  # why the test gave no p-value ("" = it did)
    # "lower": the variant's censored seeds entered at their intervals' lower ends (A bounded below,
    # the module docstring), so delta and its interval bound ΔA from below; "" = the plain test
    bound: str = ""

    @property
    def significant(self) -> bool:
        return self.tested and math.isfinite(self.p) and self.p < self.alpha


@dataclass
class Prediction:
    """The half-budget prediction of a variant's observed end (the mean over seeds of :func:`end_points`)."""

    predicted: float = math.nan
    observed: float = math.nan
    lo: float = math.nan  # PRED_LEVEL prediction band
    hi: float = math.nan
    n: int = 0  # seeds
    noise_sd: float = math.nan  # sd of the observed mean from the evaluations' binomial noise
    reason: str = ""
    supported: bool | None = None  # the half fit's window past the horizon (None: not scored)
    reach: float = math.nan  # the half fit's window end / its fitted C_mid
    more_compute: float = math.nan  # the budget factor that carries the half window to the horizon
    bias: float = math.nan  # the shape bias measured at this reach (scaling.horizon)
    shape_sd: float = math.nan  # the shape error in the band at this reach
    persistence: float = math.nan  # the forecast "no change": the mean of the seeds' last first-half values
    fall: float = math.nan  # the median over seeds of each one's largest fall in its half window (half_fall)
    fall_se: float = math.nan  # the median of those falls in binomial standard errors (NaN: size not logged)
    falls: list[float] = field(default_factory=list)  # each seed's largest fall there

    @property
    def short(self) -> bool:
        """The half window ends before the horizon (its reach under :data:`HORIZON`)."""
        return bool(self.reach < HORIZON)

    @property
    def unstable(self) -> bool:
        """The median seed falls in the half window by :data:`FALL_LIMIT` and :data:`FALL_SE` standard
        errors (or more; by the fall alone where the evaluations' size is not logged): the
        extrapolation is not supported whatever the reach."""
        return is_unstable(self.fall, self.fall_se)

    @property
    def err(self) -> float:
        return self.predicted - self.observed

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def skill(self) -> float:
        """``1 - |err| / |persistence's err|``: above 0 where the fit beats "no change after the half"."""
        e = self.persistence - self.observed
        if not (math.isfinite(e) and math.isfinite(self.err)) or e == 0:
            return math.nan
        return 1 - abs(self.err) / abs(e)

    @property
    def inside(self) -> bool | None:
        if not (math.isfinite(self.lo) and math.isfinite(self.observed)):
            return None
        return bool(self.lo <= self.observed <= self.hi)


@dataclass
class Family:
    """What the whole table's test shares: its size, levels, the seeds' spread and the resolution."""

    m: int = 0  # comparisons in the family
    alpha: float = math.nan  # per-test level
    sd_A: float = math.nan  # seeds' spread of A, pooled over variants
    sd_B: float = math.nan
    df_sd: int = 0
    df_sd_B: int = 0
    seeds: int = 0  # seeds per variant in the design (median)
    mdd_A: float = math.nan  # smallest detectable ΔA at the design's seeds
    mdd_B: float = math.nan  # smallest detectable ΔB (at the fixed A) at the design's seeds
    eq_margin: float = math.nan  # the table's equivalence margin on A (TOST), NaN where A is not compared
    eq_resolution: float = math.nan  # the margin the design resolves (may exceed EQ_MARGIN_MAX)
    A_fixed: float = math.nan  # the baseline's A, at which B is compared
    at_max: bool = False  # the baseline's ceiling reaches 1: A not compared, B compared at A = 1
    level: float = math.nan  # the level of each variant's A and B intervals (the protocol's)


@dataclass
class VariantVerdict:
    variant: str
    run_ids: list[str]
    baseline: bool = False
    fitted: int = 0
    A: Estimate = field(default_factory=Estimate)
    B: Estimate = field(default_factory=Estimate)  # B at A fixed to the baseline's A
    dA: Comparison = field(default_factory=Comparison)
    dB: Comparison = field(default_factory=Comparison)
    pooled: SigmoidFit | None = None  # the pooled fit of all the variant's fitted seeds (figures)
    half: SigmoidFit | None = None  # the pooled fit of the seeds' first half (the prediction)
    prediction: Prediction = field(default_factory=Prediction)
    final_sd: float = math.nan  # sd over seeds of the observed end (end_points)
    final_se: float = math.nan  # binomial standard error of one seed's observed end (its samples)
    half_points: float = math.nan  # mean points per seed the half-budget fit rests on
    lengths: list[int] = field(default_factory=list)  # each finished run's last logged step
    totals: list[str] = field(default_factory=list)  # and its logged trainer.total_steps
    cannot_act: str = ""  # why the component cannot act on this hardware
    inactive: str = ""  # why the variant's component never acted ("" = active or unknown)
    reason: str = ""  # why nothing could be fitted
    verdict: str = ""
    called: dict[str, int] = field(default_factory=dict)  # "A"/"B" -> +1/-1 where a difference is called
    family: Family = field(default_factory=Family)

    @property
    def scored(self) -> bool:
        """Compared with the baseline (not the baseline, not unable to act, not inactive, fitted)."""
        return not self.baseline and not self.cannot_act and not self.inactive and self.fitted > 0

    @property
    def label(self) -> str:
        """The machine-readable verdict, one of :data:`LABELS` (the rule: the module docstring)."""
        if self.baseline:
            return "baseline"
        if not self.run_ids or self.cannot_act:
            return "not run"
        for key in ("A", "B"):
            if self.called.get(key):
                return f"{key} {'higher' if self.called[key] > 0 else 'lower'}"
        if self.scored and self.dA.tested and self.dA.equivalent:
            return "equivalent"
        a_tested = self.dA.tested and not self.dA.bound and not self.dA.untestable
        if self.scored and (a_tested or self.dB.tested and not self.dB.untestable):
            return "inconclusive"
        return "not shown"

    @property
    def delta_A(self) -> float:
        return self.dA.delta

    @property
    def delta_B(self) -> float:
        return self.dB.delta

    @property
    def pred_err(self) -> float:
        return self.prediction.err

    @property
    def pred_n(self) -> int:
        return self.prediction.n

    @property
    def pred_ok(self) -> bool | None:
        e = self.pred_err
        return None if not math.isfinite(e) else abs(e) <= PRED_TOLERANCE


# ------------------------------------------------------------------------------------------------
# Which component a variant changes, and whether it acted (or can act here)
# ------------------------------------------------------------------------------------------------


def _flag(v) -> bool | None:
    s = str(v).strip().lower()
    return True if s in ("true", "1") else False if s in ("false", "0") else None


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _most(runs: Sequence[RunData], key: str, how=max) -> float:
    vals = [r.activity[key] for r in runs if key in r.activity and math.isfinite(r.activity[key])]
    return float(how(vals)) if vals else math.nan


def cannot_act_reason(variant: Sequence[RunData], baseline: Sequence[RunData]) -> str:
    """Why the component in which ``variant`` differs from ``baseline`` cannot act on the hardware
    the runs ran on ("" when it can, or when the runs do not log what would tell): a precision
    change whose reduced-precision head was emulated (param ``precision/head_dtype`` says
    "emulated") or ran on CPU (param ``device``) -- the paper's mechanism behind the FP32 head, a
    kernel mismatch between the generator's and the trainer's head, needs distinct native kernels."""
    if not variant or not baseline:
        return ""
    vp, bp = variant[0].params, baseline[0].params
    keys = [k for k in set(vp) | set(bp) if k == "precision" or k.startswith("precision.")]
    if not any(vp.get(k) != bp.get(k) for k in keys):
        return ""
    heads = [str(r.params.get("precision/head_dtype", "")) for r in [*variant, *baseline]]
    devices = {str(r.params.get("device", "")).split(":")[0] for r in [*variant, *baseline]}
    if any("emulated" in h for h in heads):
        how = "emulated on this hardware (fp32 math, rounded)"
    elif devices == {"cpu"}:
        how = "run on CPU"
    else:
        return ""
    return (
        f"precision: the reduced-precision LM head was {how}, so the paper's mechanism "
        "(a kernel mismatch between generator and trainer) cannot act"
    )


def inactive_reason(variant: Sequence[RunData], baseline: Sequence[RunData]) -> str:
    """Why the component in which ``variant``'s runs differ from ``baseline``'s never acted in
    either ("" when it acted, when the runs do not log what would tell, or for a component that
    always acts: a loss, a precision, an aggregation ...)."""
    if not variant or not baseline:
        return ""
    vp, bp = variant[0].params, baseline[0].params
    both = [*variant, *baseline]

    def differs(key: str) -> bool:
        return key in vp and key in bp and vp[key] != bp[key]

    reasons = []
    if differs("filter.no_positive_resampling"):
        retired, epochs = _most(both, "retired"), _most(both, "epochs")
        if retired == 0:
            reasons.append("no-positive-resampling: no prompt reached the pass-rate threshold (0 retired)")
        elif math.isfinite(epochs) and epochs < 1:
            reasons.append(f"no-positive-resampling: {epochs:.2f} epochs, so no retired prompt came up again")
    if differs("filter.zero_variance"):
        groups = _most(both, "zero_variance_groups", sum)
        if not math.isfinite(groups):  # runs from before data/zero_variance_groups_step
            on = [r for r in both if _flag(r.params.get("filter.zero_variance"))]
            groups = _most(on, "zero_variance_dropped", sum)
        if groups == 0:
            reasons.append("zero-variance filter: no zero-variance group occurred")
    pipeline = all(r.params.get("async_mode.name", "pipeline_rl") == "pipeline_rl" for r in both)
    if pipeline and differs("async_mode.max_lag"):
        kv, kb = _num(vp["async_mode.max_lag"]), _num(bp["async_mode.max_lag"])
        if math.isfinite(kv) and math.isfinite(kb):
            small = min(kv, kb)
            larger = variant if kv > kb else baseline
            lag = _most(larger, "lag_max")
            if math.isfinite(lag) and lag <= small:
                reasons.append(
                    f"pipeline k: the max policy lag ({lag:g}) never exceeded the smaller k={small:g}, "
                    "so both ran the same"
                )
    if differs("length_control.name") or differs("length_control"):
        inter = [r for r in both if str(r.params.get("length_control.name", "")) == "interruption"]
        if inter and _most(inter, "interruptions") == 0:
            reasons.append("interruptions: no generation was interrupted")
    return "; ".join(reasons)


# ------------------------------------------------------------------------------------------------
# Per-seed values, estimates, tests
# ------------------------------------------------------------------------------------------------


def a_unusable(fit: SigmoidFit | None) -> str:
    """Why a seed's fit gives no A at all ("" = usable), for reasons fixed before its outcome:
    unfitted, or fitted through as many points as the curve has free parameters (it passes through
    them: A is then set by those points alone, not a ceiling they bound, and has no interval)."""
    if fit is None or not fit.ok:
        return "unfitted"
    if fit.through_points:
        return f"{fit.n_points} points for {N_PARAMS} parameters"
    return ""


def a_censored(fit: SigmoidFit) -> str:
    """Why a usable seed's A is censored at 1 ("" = bounded): A at 1, or its interval reaching 1 (the
    data do not bound the ceiling below the maximum). The seed keeps its fitted value."""
    if fit.A >= A_UNSETTLED:
        return "A at 1"
    lo, hi = fit.ci.get("A", (math.nan, math.nan))
    if math.isfinite(hi) and hi >= A_UNSETTLED:
        return "A's interval reaches 1"
    return ""


def a_unsettled(fit: SigmoidFit | None) -> str:
    """Why a seed's A is unusable or censored at 1 ("" = a bounded A); see :func:`a_unusable`,
    :func:`a_censored`."""
    return a_unusable(fit) or a_censored(fit)


def b_unsettled(fit: SigmoidFit | None) -> str:
    """Why a seed's B (at the fixed A) is unusable or censored at a bound of the fit ("" = bounded)."""
    if fit is None or not fit.ok:
        return "not refitted at the fixed A" if fit is None else "the fixed-A fit failed"
    if fit.B <= B_BOUNDS[0] * 1.01 or fit.B >= B_BOUNDS[1] * 0.99:
        return "B at its bound"
    return ""


def _counts(why: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for w in why:
        counts[w] = counts.get(w, 0) + 1
    return ", ".join(f"{w} in {k}" for w, k in counts.items())


def _estimate(
    seeds: Sequence[tuple[float, str]],
    unusable: Sequence[str],
    total: int,
    level: float,
    name: str,
    bound: str,
) -> Estimate:
    """Mean and t-interval over every usable seed (``seeds``: its value and why it is censored at
    ``bound``, "" when it is not); ``unusable``: the other fitted seeds' reasons. Not shown
    (``unsettled``) with fewer than 2 usable seeds or at least half of them censored."""
    kept = [(float(x), c) for x, c in seeds if math.isfinite(x)]
    v = np.asarray([x for x, _ in kept], dtype=float)
    cens = [c for _, c in kept if c]
    e = Estimate(n=int(v.size), total=total, values=[float(x) for x in v], censored=len(cens))
    if v.size:
        e.mean = float(v.mean())
    if v.size > 1:
        e.sd = float(v.std(ddof=1))
        h = float(stats.t.ppf((1 + level) / 2, v.size - 1)) * e.sd / math.sqrt(v.size)
        e.lo, e.hi = e.mean - h, e.mean + h
    if v.size < 2:
        detail = _counts(unusable)
        e.unsettled = f"{name}: {v.size} of {total} fitted seeds usable" + (f" ({detail})" if detail else "")
        if not detail:
            e.unsettled += ", and an interval over seeds needs 2 or more"
    elif 2 * len(cens) >= v.size:
        e.unsettled = (
            f"{name}: {len(cens)} of {v.size} seeds censored at {bound} ({_counts(cens)}): "
            f"not bounded at this budget"
        )
    return e


def a_estimate(fits: Sequence[SigmoidFit | None], level: float = 0.9) -> Estimate:
    """A over the fitted ones of ``fits`` (the module's rule: every usable seed, censored ones kept)."""
    ok = [f for f in fits if f is not None and f.ok]
    usable = [f for f in ok if not a_unusable(f)]
    seeds = [(f.A, a_censored(f)) for f in usable]
    e = _estimate(seeds, [w for f in ok if (w := a_unusable(f))], len(ok), level, "A", "1")
    e.lo, e.hi = max(e.lo, 0.0), min(e.hi, 1.0)  # a pass rate's ceiling: the interval stays in [0, 1]
    e.floors = [_floor(f) for f in usable if math.isfinite(f.A)]
    return e


def _floor(fit: SigmoidFit) -> float:
    """The least ceiling a usable seed's data allow: its fitted A, or censored at 1 its interval's
    lower end (NaN where it has none)."""
    if not a_censored(fit):
        return float(fit.A)
    lo = fit.ci.get("A", (math.nan, math.nan))[0]
    return float(min(lo, fit.A)) if math.isfinite(lo) else math.nan


def bounded_below(e: Estimate) -> bool:
    """A not shown because at least half its (2 or more) usable seeds are censored at 1, each with
    a lower end: the case the lower-bound test of "A higher" covers (module docstring)."""
    return e.n >= 2 and 2 * e.censored >= e.n and len(e.floors) == e.n and all(map(math.isfinite, e.floors))


def b_estimate(fixed: Sequence[SigmoidFit | None], total: int, level: float = 0.9) -> Estimate:
    """B at the fixed A over the refitted seeds (a B at its fit bound is censored there)."""
    seeds = [(f.B, b_unsettled(f)) for f in fixed if f is not None and f.ok]
    unusable = [b_unsettled(f) for f in fixed if f is None or not f.ok]
    e = _estimate(seeds, unusable, total, level, "B", "its fit bound")
    e.lo, e.hi = max(e.lo, B_BOUNDS[0]), min(e.hi, B_BOUNDS[1])  # B's fits lie inside its bounds
    return e


A_TOP = ("A at 1", "A's interval reaches 1")
"""The reasons a seed is censored at 1: the data cannot bound its ceiling below the maximum."""


def baseline_A(fits: Sequence[SigmoidFit | None]) -> tuple[float, bool]:
    """The A at which every run's B is compared, and whether it is the pass rate's maximum 1.

    The baseline's A (:func:`a_estimate`: the mean over every usable seed) when it is shown. When
    instead at least half of its seeds are censored at 1 (A at 1, or an interval reaching 1: the
    data cannot bound the ceiling below the maximum, as on a task the policy learns to solve),
    A = 1: the ceilings are not separable at this budget, but efficiency at a fixed A still is (the
    paper's protocol, at the one ceiling the data do not rule out). Otherwise the mean over the
    usable seeds (NaN when none)."""
    est = a_estimate(fits)
    if est.settled:  # the same rule as a variant's A
        return est.mean, False
    if est.n and 2 * est.censored >= est.n:
        return 1.0, True
    return est.mean, False


def fixed_A_fits(runs: Sequence[RunData], fits: dict[str, SigmoidFit], A: float) -> dict[str, SigmoidFit]:
    """Every fitted run refitted with A fixed to ``A`` (same points and early cut as its own fit)."""
    out: dict[str, SigmoidFit] = {}
    if not math.isfinite(A):
        return out
    for r in runs:
        f = fits.get(r.run_id)
        if f is not None and f.ok:
            out[r.run_id] = fit_fixed_A(
                f.compute, f.reward, A, min_compute=f.min_compute, drop_nonfinite=True
            )
    return out


SPREAD_EPS = 1e-12
"""A pair whose standard error is below this (relative to the values) has no spread between seeds."""


def t_test(
    x: Sequence[float],
    y: Sequence[float],
    alpha: float,
    margin: float = 0.0,
    eq_margin: float = math.nan,
) -> Comparison:
    """Welch's two-sample t-test of mean(x) - mean(y) on this pair alone (each side's own spread:
    no variance is pooled with other variants'), two-sided at ``alpha``, with the ``1 - alpha``
    interval of the difference and the smallest difference it detects with :data:`POWER`; called
    (+1/-1) when the interval excludes 0 and ``|delta| > margin``. With a finite ``eq_margin``
    also the equivalence test (TOST, two one-sided Welch tests at ``alpha``): equivalent when the
    ``1 - 2 alpha`` interval of the difference lies inside ``±eq_margin``."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    c = Comparison(alpha=alpha, margin=margin, tested=True, eq_margin=eq_margin)
    c.delta = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(vx + vy)
    # identical values up to float rounding (their mean's last bits) count as no spread
    flat = se <= SPREAD_EPS * max(1.0, abs(float(x.mean())), abs(float(y.mean())))
    c.df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1)) if not flat else math.inf
    if flat:
        # identical values within each side (e.g. fits at a bound): no spread between seeds, so no
        # test can say how far the means could be apart; neither a difference nor equivalence is shown
        c.p = c.eq_p = math.nan
        c.untestable = "no spread between seeds on either side"
    else:
        c.p = float(2 * stats.t.sf(abs(c.delta / se), c.df))
        q = float(stats.t.ppf(1 - alpha / 2, c.df))
        c.lo, c.hi = c.delta - q * se, c.delta + q * se
        c.mdd = float(max((q + stats.t.ppf(POWER, c.df)) * se, margin))
        if math.isfinite(eq_margin):
            q1 = float(stats.t.ppf(1 - alpha, c.df))
            c.eq_lo, c.eq_hi = c.delta - q1 * se, c.delta + q1 * se
            c.eq_p = float(
                max(
                    stats.t.sf((c.delta + eq_margin) / se, c.df),
                    stats.t.cdf((c.delta - eq_margin) / se, c.df),
                )
            )
    if c.p < alpha and abs(c.delta) > margin:
        c.called = 1 if c.delta > 0 else -1
    c.equivalent = bool(math.isfinite(c.eq_p) and c.eq_p < alpha)
    return c


def detectable(
    sd: float, n_v: int, n_b: int, alpha: float, margin: float, df: int = 0, power: float = POWER
) -> float:
    """The difference the two-sided Welch test at ``alpha`` finds with probability ``power`` where
    both sides' seeds spread by ``sd`` (``df``: 0 for Welch's at equal spreads, ``n_v + n_b - 2``)
    with ``n_v``, ``n_b`` seeds; never below ``margin``; NaN when unknown."""
    if not (math.isfinite(sd) and n_v >= 1 and n_b >= 1 and math.isfinite(alpha)):
        return math.nan
    df = df or n_v + n_b - 2
    if df < 1:
        return math.nan
    d = (stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * sd * math.sqrt(1 / n_v + 1 / n_b)
    return float(max(d, margin))


def equivalence_resolution(sd: float, n_v: int, n_b: int, alpha: float, power: float = POWER) -> float:
    """The smallest margin ``δ`` within which TOST at ``alpha`` shows two equal means equivalent with
    probability ``power``, both sides' seeds spreading by ``sd`` (Welch's df at equal spreads,
    ``n_v + n_b - 2``): ``(t(1 - alpha, df) + t(1 - (1 - power) / 2, df)) * sd * sqrt(1/n_v + 1/n_b)``.
    NaN when unknown."""
    if not (math.isfinite(sd) and n_v >= 1 and n_b >= 1 and math.isfinite(alpha)) or n_v + n_b < 3:
        return math.nan
    df = n_v + n_b - 2
    q = stats.t.ppf(1 - alpha, df) + stats.t.ppf(1 - (1 - power) / 2, df)
    return float(q * sd * math.sqrt(1 / n_v + 1 / n_b))


def equivalence_margin(resolution: float) -> float:
    """The table's equivalence margin on A: the paper's :data:`MARGIN_A` where the design resolves
    it, else the margin it resolves, at most :data:`EQ_MARGIN_MAX` (then equivalence is unlikely to
    be shown, and the verdicts say so)."""
    if not math.isfinite(resolution):
        return EQ_MARGIN_MAX
    return float(min(max(resolution, MARGIN_A), EQ_MARGIN_MAX))


def _pooled_sd(estimates: Sequence[Estimate]) -> tuple[float, int]:
    """The within-variant sd pooled over the variants whose value is shown (2+ usable seeds, fewer
    than half censored at a bound), and its degrees of freedom. A variant not shown is left out: its
    seeds at the bound are limits, not estimates, and their spread says nothing of the design's."""
    ss, df = 0.0, 0
    for e in estimates:
        if e.n >= 2 and math.isfinite(e.sd) and e.settled:
            ss += e.sd**2 * (e.n - 1)
            df += e.n - 1
    return (math.sqrt(ss / df), df) if df else (math.nan, 0)


# ------------------------------------------------------------------------------------------------
# Fits and the prediction
# ------------------------------------------------------------------------------------------------


def _pooled(
    runs: Sequence[RunData],
    p: FitProtocol,
    *,
    half: bool = False,
    bootstrap: int | None = None,
    resample_runs: bool = True,
):
    """The pooled fit of ``runs`` (``half``: each run's points up to half its compute;
    ``resample_runs``: :meth:`~scalerl.scaling.FitProtocol.fit_runs`')."""
    series, cuts = [], []
    for r in runs:
        c, y = r.compute, r.reward
        if half:
            fin = np.isfinite(c)
            keep = fin & (c <= float(np.max(c[fin])) / 2) if fin.any() else fin
            c, y = c[keep], y[keep]
        series.append((c, y))
        cuts.append(p.cut_of(r))
    return p.fit_runs(series, cuts, bootstrap=bootstrap, resample_runs=resample_runs)


def end_points(r: RunData) -> np.ndarray:
    """Indices of the run's evaluations in the last :data:`END_WINDOW` of its compute (its last
    evaluation at least): the run's observed end, which the half-budget prediction is scored on."""
    fin = np.isfinite(r.compute) & np.isfinite(r.reward)
    if not fin.any():
        return np.zeros(0, dtype=int)
    top = float(np.max(r.compute[fin]))
    return np.flatnonzero(fin & (r.compute >= (1.0 - END_WINDOW) * top))


def _half_last(r: RunData) -> float:
    """The run's last evaluation in the first half of its compute (the persistence forecast)."""
    fin = np.isfinite(r.compute) & np.isfinite(r.reward)
    if not fin.any():
        return math.nan
    first = fin & (r.compute <= float(np.max(r.compute[fin])) / 2)
    return float(r.reward[np.flatnonzero(first)[np.argmax(r.compute[first])]]) if first.any() else math.nan


def _half_window(r: RunData, p: FitProtocol) -> np.ndarray:
    """The mask of the run's evaluations the half-budget fit uses: finite, from the early cut
    (``p``) to half its compute."""
    fin = np.isfinite(r.compute) & np.isfinite(r.reward)
    if not fin.any():
        return fin
    return fin & (r.compute <= float(np.max(r.compute[fin])) / 2) & (r.compute >= p.cut_of(r))


def seed_fall(r: RunData, p: FitProtocol) -> tuple[float, float]:
    """One seed's largest fall inside its half-budget window (its evaluations from the early cut,
    ``p``, to half its compute, in compute order), from the running maximum: ``(fall, in binomial
    standard errors of the difference of two evaluations, :func:`fall_in_se`)``; the second
    NaN where the evaluations' size is not logged, both NaN with fewer than 3 points there."""
    keep = _half_window(r, p)
    fall, top = largest_fall(r.compute[keep], r.reward[keep])
    return fall, fall_in_se(fall, top, eval_trials(r))


def half_fall(runs: Sequence[RunData], p: FitProtocol) -> tuple[float, float, list[float]]:
    """How far the seeds' curves fall inside the half-budget window (:func:`seed_fall`): ``(the
    median over seeds of each one's largest fall, the median of those falls in standard errors, each
    seed's fall)``. Per seed, then the median: an unstable recipe's seeds dip at different steps, so
    their mean curve hides what each one does. NaN where no seed has 3 points in its window."""
    per = [seed_fall(r, p) for r in runs]
    per = [f for f in per if math.isfinite(f[0])]
    if not per:
        return math.nan, math.nan, []
    falls = [f[0] for f in per]
    in_se = [f[1] for f in per]
    med_se = float(np.median(in_se)) if all(math.isfinite(x) for x in in_se) else math.nan
    return float(np.median(falls)), med_se, falls


def eval_trials(r: RunData) -> float:
    """Samples of one evaluation of the run's fitted curve, from its logged ``eval.num_prompts`` and
    ``eval.samples_per_prompt`` (:func:`~scalerl.scaling.pass_at_k.evaluation_samples`; NaN when
    not logged)."""
    n = evaluation_samples(
        _num(r.params.get("eval.num_prompts")),
        _num(r.params.get("eval.samples_per_prompt")),
        r.reward_key.removeprefix("val/"),
    )
    return n if math.isfinite(n) and n > 0 else math.nan


def predict_variant(
    runs: Sequence[RunData], p: FitProtocol, *, draws: int = 4000
) -> tuple[Prediction, SigmoidFit | None]:
    """The pooled fit of the seeds' first half of the compute, its prediction of the seeds' observed
    end (the mean over seeds of each seed's evaluations in the last :data:`END_WINDOW` of its compute,
    predicted at those same points) and the :data:`PRED_LEVEL` band: the half fit's bootstrap with
    the seeds kept (the target is these seeds' end, whose seed-to-seed spread the first half already
    shows; resampling seeds would add the spread of other seeds'), the binomial noise of the end's
    evaluations and the shape error at the half window's reach
    (:func:`~scalerl.scaling.horizon.shape_error`: a sigmoid fixed by the first half cannot foresee a
    curve that steepens after it; calibrated on rising-exponent curves and the real runs). The
    horizon rule says whether the extrapolation is supported (the window's end past
    :data:`~scalerl.scaling.horizon.HORIZON` x the half fit's C_mid); the persistence forecast (the
    seeds' last first-half values) is kept for the skill score."""
    usable = [r for r in runs if end_points(r).size and r.compute.size >= 2]
    if not usable:
        return Prediction(reason="no evaluations"), None
    fit = _pooled(usable, p, half=True, resample_runs=False)
    if not fit.ok:
        return Prediction(n=len(usable), reason=f"the half-budget fit failed: {fit.reason}"), fit
    if fit.through_points:  # nothing to judge its extrapolation by
        why = f"the half-budget fit rests on {fit.n_points} points for {N_PARAMS} parameters"
        return Prediction(n=len(usable), reason=why), fit
    ends = [end_points(r) for r in usable]
    end_c = [r.compute[i] for r, i in zip(usable, ends, strict=True)]
    pr = Prediction(n=len(usable))
    pr.predicted = float(np.mean([np.mean(fit.predict(c)) for c in end_c]))
    pr.observed = float(np.mean([np.mean(r.reward[i]) for r, i in zip(usable, ends, strict=True)]))
    pr.persistence = float(np.mean([_half_last(r) for r in usable]))
    h = fit_horizon(fit)
    pr.supported, pr.reach, pr.more_compute, pr.bias, pr.shape_sd = (
        h.supported,
        h.reach,
        h.more_compute,
        h.bias,
        h.shape_sd,
    )
    pr.fall, pr.fall_se, pr.falls = half_fall(usable, p)
    if pr.unstable and pr.supported is not None:
        pr.supported = False
    trials = np.array([eval_trials(r) * i.size for r, i in zip(usable, ends, strict=True)])
    q = min(max(pr.predicted, 0.0), 1.0)
    if np.isfinite(trials).all():
        per = q * (1 - q) / trials
    else:  # the half fit's residual spread stands in for one evaluation's noise
        per = fit.rmse**2 / np.array([i.size for i in ends], dtype=float)
    pr.noise_sd = float(math.sqrt(np.sum(per)) / len(usable))
    if fit.boot is not None and len(fit.boot) >= 2 and math.isfinite(pr.noise_sd):
        b = fit.boot
        reps = np.mean(
            [_predict(c[None, :], b[:, 3:4], b[:, 0:1], b[:, 1:2], b[:, 2:3]).mean(axis=1) for c in end_c],
            axis=0,
        )
        rng = np.random.default_rng(p.seed)
        sim = reps[rng.integers(0, reps.size, draws)] + rng.normal(0.0, pr.noise_sd, draws)
        if math.isfinite(pr.shape_sd):
            sim = sim + rng.normal(0.0, pr.shape_sd, draws)
        sim = np.clip(sim, 0.0, 1.0)  # a mean pass rate: the band never leaves [0, 1]
        pr.lo, pr.hi = (float(x) for x in np.quantile(sim, [(1 - PRED_LEVEL) / 2, (1 + PRED_LEVEL) / 2]))
    return pr, fit


def _prediction_limits(runs: Sequence[RunData], p: FitProtocol) -> tuple[float, float, float]:
    """What bounds a half-budget prediction of these runs: the sd over seeds of their observed end
    (:func:`end_points`), the binomial standard error of one seed's end (from the logged sample
    count), and the points per seed left to the half-budget fit after the early cut."""
    finals, ses, points = [], [], []
    for r in runs:
        end = end_points(r)
        if not end.size:
            continue
        y = float(np.mean(r.reward[end]))
        finals.append(y)
        n = eval_trials(r) * end.size
        if math.isfinite(n):
            ses.append(math.sqrt(max(y * (1 - y), 0.0) / n))
        points.append(int(np.sum(_half_window(r, p))))
    sd = float(np.std(finals, ddof=1)) if len(finals) > 1 else math.nan
    return (
        sd,
        float(np.mean(ses)) if ses else math.nan,
        float(np.mean(points)) if points else math.nan,
    )


SHAPE_B_RATIO = 1.1  # the whole budget's B this much above (or below) the first half's: a change of shape


def _shape_change(scored: Sequence[VariantVerdict], *, under: bool) -> str:
    """Where the half-budget fits miss one way, whether the curves change shape after the half: the
    pooled fit of the whole budget against that of its first half (medians over the variants). An
    under-estimate with a steeper (higher B) or higher (A) whole-budget fit means the curves steepen
    or rise after the half, which no sigmoid fitted before it foresees; an over-estimate with a flatter
    or lower one, that they flatten or stall. "" when the fits do not show it."""
    pairs = [(v.half, v.pooled) for v in scored if v.half is not None and v.pooled is not None]
    pairs = [(h, p) for h, p in pairs if h.ok and p.ok]
    if len(pairs) < max(1, len(scored) // 2):
        return ""
    bh, bp = (float(np.median([f.B for f in fs])) for fs in zip(*pairs))
    ah, ap = (float(np.median([f.A for f in fs])) for fs in zip(*pairs))
    sign = 1 if under else -1
    steeper = sign * math.log(bp / bh) > math.log(SHAPE_B_RATIO)
    higher = sign * (ap - ah) > PRED_TOLERANCE
    if not (steeper or higher):
        return ""
    what = " and ".join(
        w
        for w, on in (("steeper" if under else "flatter", steeper), ("higher" if under else "lower", higher))
        if on
    )
    change = "steepen or rise" if under else "flatten or stall"
    return (
        f"fitted on the whole budget the same seeds' curves are {what} than on its first half (median B "
        f"{bp:.2f} against {bh:.2f}, A {ap:.3f} against {ah:.3f}): the curves {change} after the half, "
        "which a sigmoid fitted before it cannot foresee"
    )


def prediction_summary(vs: Sequence[VariantVerdict]) -> str:
    """One paragraph over the scored variants (and the baseline): how many predictions the horizon
    rule supports and, of those, "k within 0.03; coverage p%; median band half-width"; the goal
    (:data:`PRED_GOAL_SHARE` of all the predicted variants within the tolerance **and supported**: an
    unsupported prediction is not counted toward it; :data:`PRED_GOAL_COVERAGE` coverage of the
    supported ones' bands at a median half-width of at most :data:`PRED_GOAL_HALF_WIDTH`), met or by
    how much it was missed; the unsupported ones with their reach, the measured bias there and the
    compute that would support them; the skill against persistence (the first half's last value as
    the forecast); and what in the data stands in the way."""
    pool = [v for v in vs if v.baseline or v.scored]
    scored = [v for v in pool if v.pred_ok is not None]
    if not scored:
        return "Prediction: no variant could be predicted from half of its budget."
    sup = [v for v in scored if v.prediction.supported]
    uns = [v for v in scored if v.prediction.supported is False]
    ok = sum(bool(v.pred_ok) for v in sup)
    banded = [v for v in sup if v.prediction.inside is not None]
    inside = sum(bool(v.prediction.inside) for v in banded)
    need = math.ceil(PRED_GOAL_SHARE * len(scored) - 1e-9)
    cov = inside / len(banded) if banded else math.nan
    hw = float(np.median([v.prediction.half_width for v in banded])) if banded else math.nan
    if banded:
        cov_txt = (
            f"coverage {cov:.0%} ({inside} of {len(banded)} inside their {PRED_LEVEL:.0%} band, median "
            f"half-width {hw:.3f})"
        )
    else:
        cov_txt = "coverage not measured (no bootstrap)" if sup else "coverage not measured (none supported)"
    text = (
        f"Prediction (fit on the first half of the compute, seeds pooled; the end: their evaluations in "
        f"the last {END_WINDOW:.0%} of the compute): {len(sup)} of {len(scored)} supported (the half window past {HORIZON:g}x its "
        "fitted C_mid)"
    )
    if sup:
        text += f"; {ok} of {len(sup)} supported within {PRED_TOLERANCE:g}; {cov_txt}"
    if uns:
        text += _unsupported_text(uns, len(scored))
    text += _skill_text(scored)
    text += (
        f". Goal: {need} of {len(scored)} supported and within {PRED_TOLERANCE:g}, and coverage >= "
        f"{PRED_GOAL_COVERAGE:.0%} at a median half-width <= {PRED_GOAL_HALF_WIDTH:g}"
    )
    missed = []
    if ok < need:
        missed.append(
            f"{need - ok} more variant{'s' if need - ok != 1 else ''} supported and within {PRED_TOLERANCE:g}"
        )
    if banded and cov < PRED_GOAL_COVERAGE:
        missed.append(f"coverage short by {(PRED_GOAL_COVERAGE - cov) * 100:.0f} points")
    if banded and hw > PRED_GOAL_HALF_WIDTH:
        missed.append(f"a median half-width of {hw:.3f}, above {PRED_GOAL_HALF_WIDTH:g}")
    if not missed:
        return text + ": met."
    errs = sorted(abs(v.pred_err) for v in scored)
    text += f": missed by {' and '.join(missed)} (abs errors: median {float(np.median(errs)):.3f}, max {errs[-1]:.3f})"
    return text + ". Why: " + "; ".join(_why_missed(scored, uns, banded, hw)) + "."


def _unsupported_text(uns: Sequence[VariantVerdict], n_scored: int) -> str:
    """The prediction summary's sentence on the predictions not supported: those whose half window
    ends before the horizon (how far it reached, the compute that would support them, the bias
    measured there) and those whose seeds' curves fall inside it (:data:`FALL_LIMIT`)."""
    k = sum(bool(v.pred_ok) for v in uns)
    text = f". Not supported: {len(uns)} of {n_scored}, not counted toward the goal (of them, "
    short = [v for v in uns if v.prediction.short]
    parts = []
    if short:
        reach = float(np.median([v.prediction.reach for v in short]))
        more = float(np.median([v.prediction.more_compute for v in short]))
        bias = float(np.median([v.prediction.bias for v in short]))  # NaN where any is unmeasured
        parts.append(
            f"{len(short)} whose half window ends at {reach_text(reach)}x C_mid, median; predictions need >= "
            f"{HORIZON:g}x: {compute_text(more, 'the budget')} would make them supported; "
            + (
                f"measured bias at that reach {bias:+.3f}"
                if math.isfinite(bias)
                else "bias not measured that early"
            )
        )
    fell = [v for v in uns if v.prediction.unstable]
    if fell:
        names = ", ".join(f"{v.variant} {v.prediction.fall:.3f}" for v in fell)
        parts.append(
            f"{len(fell)} whose seeds fall inside the half window by {FALL_LIMIT:g} or more (the median "
            f"seed, and {FALL_SE:g} standard errors): {names}; a sigmoid cannot follow a fall, and more "
            "compute does not remove it"
        )
    return text + "; ".join(parts) + f"); for reference {k} of {len(uns)} within {PRED_TOLERANCE:g}"


def mse_skill(errors: Sequence[float], persistence_errors: Sequence[float]) -> float:
    """The forecast skill score against persistence, ``1 - sum(err^2) / sum(persistence err^2)``
    over paired predictions (Murphy's mean-squared-error skill score): 1 a perfect forecast, 0 no
    better than "no change after the half", below 0 worse. One score over a set, unlike the win
    count: a variant whose end moved past the noise weighs by how far it moved, and a flat one,
    where both forecasts are within the evaluations' noise, weighs little. NaN where nothing is
    paired or persistence was exact everywhere."""
    e = np.asarray(errors, dtype=float)
    q = np.asarray(persistence_errors, dtype=float)
    if e.shape != q.shape:
        raise ValueError(f"mse_skill: {e.size} errors against {q.size} persistence errors")
    ok = np.isfinite(e) & np.isfinite(q)
    den = float(np.sum(q[ok] ** 2))
    if not ok.any() or den == 0:
        return math.nan
    return 1.0 - float(np.sum(e[ok] ** 2)) / den


def skill_summary(vs: Sequence[VariantVerdict]) -> dict:
    """The skill against persistence over the predictions the horizon rule supports (those counted
    toward the goal): ``supported`` (paired with a persistence forecast), ``fit_beats`` (where the
    fit's error is the smaller), ``mse_skill`` (:func:`mse_skill`), ``fit_mae``,
    ``persistence_mae``. NaN where none is paired."""
    per = [
        v.prediction
        for v in vs
        if (v.baseline or v.scored)
        and v.prediction.supported
        and math.isfinite(v.prediction.err)
        and math.isfinite(v.prediction.persistence)
    ]
    errs = [p.err for p in per]
    pers = [p.persistence - p.observed for p in per]
    return {
        "supported": len(per),
        "fit_beats": sum(abs(e) < abs(q) for e, q in zip(errs, pers, strict=True)),
        "mse_skill": mse_skill(errs, pers),
        "fit_mae": float(np.mean(np.abs(errs))) if per else math.nan,
        "persistence_mae": float(np.mean(np.abs(pers))) if per else math.nan,
    }


def _skill_text(scored: Sequence[VariantVerdict]) -> str:
    """The prediction summary's sentence on the skill against persistence ('' where none is finite):
    per variant (the median ratio skill and the win count, over every scored prediction) and over
    the supported ones as one mean-squared-error skill score (:func:`skill_summary`)."""
    skills = [v.prediction.skill for v in scored if math.isfinite(v.prediction.skill)]
    if not skills:
        return ""
    beat = sum(x > 0 for x in skills)
    per = [v.prediction for v in scored if math.isfinite(v.prediction.skill)]
    mae, mae_p = (
        float(np.mean([abs(x) for x in xs]))
        for xs in zip(*((p.err, p.persistence - p.observed) for p in per))
    )
    text = (
        f". Skill against persistence (the first half's last value as the forecast; 1 - |error| / "
        f"|persistence's error|): median {float(np.median(skills)):+.2f}, the fit beats it on {beat} "
        f"of {len(skills)} (mean abs error {mae:.3f} against persistence's {mae_p:.3f})"
    )
    s = skill_summary(scored)
    if math.isfinite(s["mse_skill"]):
        text += (
            f"; over the {s['supported']} supported, the skill score 1 - MSE / MSE(persistence) is "
            f"{s['mse_skill']:+.2f}"
        )
    return text


def _wide_band(banded: Sequence[VariantVerdict], hw: float) -> str:
    """Where the supported predictions' bands (``banded``, their median half-width ``hw``) are wider
    than :data:`PRED_GOAL_HALF_WIDTH`, what they are made of: the end evaluations' binomial noise
    and the shape error at the half window's reach (medians of their sds), the rest being the half
    fit's own bootstrap spread."""
    if not hw > PRED_GOAL_HALF_WIDTH:
        return ""
    band = [v.prediction for v in banded]
    noise = [p.noise_sd for p in band if math.isfinite(p.noise_sd)]
    shape = [p.shape_sd for p in band if math.isfinite(p.shape_sd)]
    parts = [
        f"{name} sd {float(np.median(x)):.3f}"
        for name, x in (("the end's binomial noise", noise), ("the shape error at the windows' reach", shape))
        if x
    ]
    return (
        f"the bands are wide (median half-width {hw:.3f}): "
        + (", ".join(parts) + ", and " if parts else "")
        + "the half fit's bootstrap over the seeds (more samples an evaluation narrow the first, more seeds "
        "the last)"
    )


def _why_missed(
    scored: Sequence[VariantVerdict],
    uns: Sequence[VariantVerdict],
    banded: Sequence[VariantVerdict],
    hw: float,
) -> list[str]:
    """What in the data stands in the way of a missed prediction goal: an unsupported half window,
    the observed end's noise, the seeds' spread, too few points, a one-sided bias, wide bands
    (``banded``: the supported predictions with a band, ``hw`` their median half-width)."""
    why = []
    if short := [v for v in uns if v.prediction.short]:
        why.append(
            f"the half window of {len(short)} of {len(scored)} ends before the horizon ({HORIZON:g}x C_mid), "
            "where a sigmoid fitted before the tail's shape is set is not supported"
        )
    if fell := [v for v in uns if v.prediction.unstable]:
        why.append(
            f"the seeds of {len(fell)} of {len(scored)} fall inside the half window "
            f"({', '.join(v.variant for v in fell)}): an unstable curve, which no sigmoid predicts"
        )
    se = [v.final_se for v in scored if math.isfinite(v.final_se)]
    if se and float(np.median(se)) >= PRED_TOLERANCE / 2:
        why.append(
            f"a seed's observed end (its evaluations in the last {END_WINDOW:.0%} of the compute) measures the "
            f"pass rate with a standard error of about {float(np.median(se)):.3f} (their sample count), "
            f"comparable to the {PRED_TOLERANCE:g} tolerance"
        )
    sd = [v.final_sd for v in scored if math.isfinite(v.final_sd)]
    if sd and float(np.median(sd)) > PRED_TOLERANCE:
        why.append(
            f"the final pass rate itself differs between seeds by a median sd of {float(np.median(sd)):.3f}, "
            "more than the tolerance"
        )
    pts = [v.half_points for v in scored if math.isfinite(v.half_points)]
    if pts and float(np.median(pts)) < 6:
        why.append(
            f"after the early cut the half-budget fit rests on {float(np.median(pts)):.0f} points a seed, "
            "too few to place a ceiling before the curve bends (a longer budget, or evaluations more "
            "often, gives it more)"
        )
    bias = float(np.mean([v.pred_err for v in scored]))
    if abs(bias) > PRED_TOLERANCE:
        side = "over" if bias > 0 else "under"
        why.append(
            f"the misses lean one way (mean {bias:+.3f}): the half-budget fits {side}-estimate the outcome"
        )
        if shape := _shape_change(scored, under=bias < 0):
            why.append(shape)
    if band := _wide_band(banded, hw):
        why.append(band)
    if not why:
        why.append("no single cause stands out in the data")
    return why


# ------------------------------------------------------------------------------------------------
# The verdicts
# ------------------------------------------------------------------------------------------------


def verdicts(
    runs: Sequence[RunData],
    names: dict[str, str],
    fits: dict[str, SigmoidFit],
    baseline: str | None,
    protocol: FitProtocol,
    order: Sequence[str] = (),
    *,
    fixed_fits: dict[str, SigmoidFit] | None = None,
    predict: bool = True,
) -> list[VariantVerdict]:
    """One :class:`VariantVerdict` per variant (``names``: run id -> variant; ``fits``: run id ->
    its own fit), the baseline first, then in ``order`` (variant names), then by name.
    ``fixed_fits``: run id -> its fit with A fixed to the baseline's A (:func:`fixed_A_fits` of
    :func:`baseline_A`; computed here when not given). ``predict``: also the half-budget prediction
    and the pooled fits (the figures'); off, only the verdicts (fast: the calibration tests)."""
    by: dict[str, list[RunData]] = {}
    for r in runs:
        by.setdefault(names[r.run_id], []).append(r)
    base_runs = by.get(baseline, []) if baseline else []
    A_fix, at_max = baseline_A([fits[r.run_id] for r in base_runs])
    if fixed_fits is None:
        fixed_fits = fixed_A_fits(runs, fits, A_fix)
    out: dict[str, VariantVerdict] = {}
    for name, members in by.items():
        v = VariantVerdict(name, [r.run_id for r in members], baseline=name == baseline)
        done = [r for r in members if r.status != "RUNNING"]  # a live run's length is not its own yet
        v.lengths = [r.last_step for r in done]
        v.totals = [str(r.params.get("trainer.total_steps", "")) for r in done]
        own = [fits[r.run_id] for r in members]
        v.fitted = sum(f.ok for f in own)
        ok_runs = [r for r in members if fits[r.run_id].ok]
        if not ok_runs:
            v.reason = next((f.reason for f in own if f.reason), "no run could be fitted")
        v.A = a_estimate(own, protocol.level)
        v.B = b_estimate([fixed_fits.get(r.run_id) for r in ok_runs], v.fitted, protocol.level)
        if predict:
            if ok_runs:
                v.pooled = _pooled(ok_runs, protocol)
            v.prediction, v.half = predict_variant(members, protocol)
        v.final_sd, v.final_se, v.half_points = _prediction_limits(members, protocol)
        if base_runs and not v.baseline:
            v.cannot_act = cannot_act_reason(members, base_runs)
            v.inactive = inactive_reason(members, base_runs)
        out[name] = v
    base = out.get(baseline) if baseline else None
    _compare(out, base, A_fix, at_max, protocol.level)
    rank = {n: i for i, n in enumerate(order)}
    return sorted(out.values(), key=lambda v: (not v.baseline, rank.get(v.variant, len(rank)), v.variant))


def _compare(
    out: dict[str, VariantVerdict], base: VariantVerdict | None, A_fix: float, at_max: bool, level: float
) -> None:
    scored = [v for v in out.values() if v.scored]
    # the family: A and B of every scored variant; B alone when the baseline's ceiling reaches 1
    fam = Family(m=(1 if at_max else 2) * len(scored), A_fixed=A_fix, at_max=at_max, level=level)
    fam.alpha = FAMILY_LEVEL / fam.m if fam.m else math.nan
    counted = [v for v in out.values() if v.baseline or v.scored]
    # the seeds' spread pooled over the variants describes the design (its resolution); no test uses it
    fam.sd_A, fam.df_sd = _pooled_sd([v.A for v in counted])
    fam.sd_B, fam.df_sd_B = _pooled_sd([v.B for v in counted])
    seeds = [len(v.run_ids) for v in counted]
    fam.seeds = int(np.median(seeds)) if seeds else 0
    fam.mdd_A = detectable(fam.sd_A, fam.seeds, fam.seeds, fam.alpha, MARGIN_A)
    fam.mdd_B = detectable(fam.sd_B, fam.seeds, fam.seeds, fam.alpha, 0.0)
    if not at_max and fam.m:
        fam.eq_resolution = equivalence_resolution(fam.sd_A, fam.seeds, fam.seeds, fam.alpha)
        fam.eq_margin = equivalence_margin(fam.eq_resolution)
    for v in out.values():
        v.family = fam
        if base is not None and v.scored:
            nv = v.A.n if v.A.n >= 2 else len(v.run_ids)
            nb = base.A.n if base.A.n >= 2 else len(base.run_ids)
            if v.A.settled and base.A.settled and not at_max:
                v.dA = t_test(v.A.values, base.A.values, fam.alpha, MARGIN_A, fam.eq_margin)
            elif bounded_below(v.A) and base.A.settled and not at_max:
                v.dA = t_test(v.A.floors, base.A.values, fam.alpha, MARGIN_A)
                v.dA.bound = "lower"
                v.dA.called = max(v.dA.called, 0)  # a lower bound shows a higher A or nothing
            else:
                v.dA = Comparison(alpha=fam.alpha, margin=MARGIN_A)
                v.dA.mdd = detectable(fam.sd_A, nv, nb, fam.alpha, MARGIN_A)
                if math.isfinite(v.A.mean) and math.isfinite(base.A.mean):
                    v.dA.delta = v.A.mean - base.A.mean
            if (at_max or (v.A.settled and base.A.settled)) and v.B.settled and base.B.settled:
                v.dB = t_test(v.B.values, base.B.values, fam.alpha, 0.0)
            else:
                v.dB = Comparison(alpha=fam.alpha)
                v.dB.mdd = detectable(fam.sd_B, nv, nb, fam.alpha, 0.0)
                if math.isfinite(v.B.mean) and math.isfinite(base.B.mean):
                    v.dB.delta = v.B.mean - base.B.mean
        v.verdict = _verdict(v, base) + _lengths_note(v.lengths, v.totals)


UNEVEN_LENGTHS = 1.5
"""A variant whose runs' lengths (last steps) span more than this factor is said to mix budgets."""


def _lengths_note(lengths: Sequence[int], totals: Sequence[str]) -> str:
    """Where a variant's finished runs ended at different steps (by more than
    :data:`UNEVEN_LENGTHS`; ``totals``: their ``trainer.total_steps``): they are compared as seeds of
    one recipe, though a shorter run's fit bounds its ceiling less; said after the verdict ("" otherwise)."""
    ran = [n for n in lengths if n > 0]
    if len(ran) < 2 or max(ran) <= UNEVEN_LENGTHS * min(ran):
        return ""
    why = (
        "give them one trainer.total_steps"
        if len(set(totals)) > 1
        else "the shorter ones did not finish their trainer.total_steps"
    )
    return (
        f" (its runs ended at steps {min(ran)}-{max(ran)} and are compared as seeds of one recipe, "
        f"though a shorter run bounds its ceiling less: {why})"
    )


def _verdict(v: VariantVerdict, base: VariantVerdict | None) -> str:
    if v.baseline:
        return "baseline"
    if v.cannot_act:
        return f"cannot act here: {v.cannot_act} (not scored)"
    if v.inactive:
        return f"inactive: {v.inactive} (not scored)"
    if not v.fitted:
        return f"unfittable: {v.reason}"
    if base is None or not base.fitted:
        return "no baseline fit to compare with"
    if v.A.n < 2 and base.A.n < 2 and v.A.n == v.fitted and base.A.n == base.fitted:
        return f"{NOT_SHOWN}: one seed each, no seed-to-seed spread to test with (run 2 or more seeds)"
    if v.family.at_max:
        return _verdict_at_max(v, base)
    if not base.A.settled:
        return f"{NOT_SHOWN}: the baseline's A is not shown ({base.A.unsettled})"
    if not v.A.settled:
        return _verdict_bounded_below(v)
    called = {}
    parts = []
    if v.dA.called:
        called["A"] = v.dA.called
        parts.append(
            f"A {'higher' if v.dA.called > 0 else 'lower'} (ΔA {v.dA.delta:+.3f} [{v.dA.lo:+.3f}, {v.dA.hi:+.3f}])"
        )
    if v.dB.called:
        called["B"] = v.dB.called
        parts.append(
            f"B {'higher' if v.dB.called > 0 else 'lower'} at A={v.family.A_fixed:.3f} "
            f"(ΔB {v.dB.delta:+.2f} [{v.dB.lo:+.2f}, {v.dB.hi:+.2f}])"
        )
    v.called = called
    if "A" not in called:
        parts.append(equivalence_text(v.dA, v.family))
    if called:
        return "; ".join(parts)
    untested = v.dA.untestable and (not v.dB.tested or v.dB.untestable)
    text = "equivalent: " if v.dA.equivalent else f"{NOT_SHOWN}: " if untested else f"{INCONCLUSIVE}: "
    text += parts[0]
    if math.isfinite(v.dA.mdd):
        text += f"; smallest detectable ΔA = {v.dA.mdd:.3f}"
    if v.dA.significant and abs(v.dA.delta) <= MARGIN_A:
        text += f" (ΔA {v.dA.delta:+.3f} is within the ±{MARGIN_A:g} margin)"
    notes = [e.unsettled for e in (v.B, base.B) if e.unsettled]
    if notes:
        text += f" (B not compared: {'; '.join(dict.fromkeys(notes))})"
    elif v.dB.untestable:
        text += f"; ΔB {v.dB.delta:+.2f} not tested: {v.dB.untestable}"
    elif v.dB.tested:
        text += f"; ΔB {v.dB.delta:+.2f} [{v.dB.lo:+.2f}, {v.dB.hi:+.2f}] not called"
    return text


def _verdict_bounded_below(v: VariantVerdict) -> str:
    """A variant whose A is not shown (:func:`bounded_below` or fewer usable seeds): "A higher" where
    its seeds' lower ends lie above the baseline's A, else not shown."""
    c = v.dA
    if c.bound != "lower":
        return f"{NOT_SHOWN}: {v.A.unsettled}"
    if c.untestable:
        return f"{NOT_SHOWN}: {v.A.unsettled}; its seeds' lower ends not tested against the baseline's A ({c.untestable})"
    interval = f"{c.delta:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]"
    if c.called:
        v.called = {"A": 1}
        return (
            f"A higher (by at least {c.lo:+.3f}: its seeds' lower ends lie {interval} above the baseline's A; "
            "its own A is not bounded below 1 at this budget)"
        )
    return (
        f"{NOT_SHOWN}: {v.A.unsettled}; its seeds' lower ends do not place A above the baseline's "
        f"({interval} from them)"
    )


def equivalence_text(c: Comparison, fam: Family) -> str:
    """What the equivalence test on A found: "A equivalent within ±δ (...)" or "A equivalence within
    ±δ not shown at this budget (...)", with ΔA and its 1 - 2 alpha interval, and the margin the
    design resolves where that is wider than the margin used."""
    if c.untestable:
        return f"A not tested: {c.untestable} (ΔA {c.delta:+.3f})"
    if not math.isfinite(c.eq_margin):
        return f"A not tested for equivalence (ΔA {c.delta:+.3f})"
    ci = f"ΔA {c.delta:+.3f}, {1 - 2 * c.alpha:.1%} interval [{c.eq_lo:+.3f}, {c.eq_hi:+.3f}]"
    if c.equivalent:
        return f"A equivalent within ±{c.eq_margin:.3f} ({ci})"
    text = f"A equivalence within ±{c.eq_margin:.3f} {NOT_SHOWN} ({ci}"
    if math.isfinite(fam.eq_resolution) and fam.eq_resolution > c.eq_margin:
        text += f"; at {fam.seeds} seeds this design resolves ±{fam.eq_resolution:.3f}"
    return text + ")"


AT_MAX_NOTE = "A not compared: the baseline's ceiling is not bounded below 1 at this budget"


def _verdict_at_max(v: VariantVerdict, base: VariantVerdict) -> str:
    """The baseline's ceiling reaches 1 (:func:`baseline_A`): B at A = 1 is compared, A is not."""
    if v.dB.called:
        v.called = {"B": v.dB.called}
        return (
            f"B {'higher' if v.dB.called > 0 else 'lower'} at A=1 "
            f"(ΔB {v.dB.delta:+.2f} [{v.dB.lo:+.2f}, {v.dB.hi:+.2f}]); {AT_MAX_NOTE}"
        )
    if not v.dB.tested or v.dB.untestable:
        notes = "; ".join(dict.fromkeys(e.unsettled for e in (v.B, base.B) if e.unsettled))
        notes = notes or (f"ΔB {v.dB.delta:+.2f} not tested: {v.dB.untestable}" if v.dB.untestable else "")
        return f"{NOT_SHOWN}: {notes or 'B not compared'}; {AT_MAX_NOTE}"
    return (
        f"{INCONCLUSIVE}: ΔB at A=1 {v.dB.delta:+.2f} [{v.dB.lo:+.2f}, {v.dB.hi:+.2f}], smallest "
        f"detectable {v.dB.mdd:.2f}; {AT_MAX_NOTE}"
    )


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def _f(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else "-"


def _est(e: Estimate, spec: str) -> str:
    s = _f(e.mean, spec)
    if math.isfinite(e.lo):
        s += f" [{_f(e.lo, spec)}, {_f(e.hi, spec)}]"
    return s


def _cmp(c: Comparison, spec: str) -> str:
    s = _f(c.delta, "+" + spec)
    if c.tested and math.isfinite(c.lo):
        s += f" [{_f(c.lo, '+' + spec)}, {_f(c.hi, '+' + spec)}]"
    return s


def prediction_cell(v: VariantVerdict) -> str:
    pr = v.prediction
    if not math.isfinite(pr.err):
        return "-"
    s = f"{pr.predicted:.3f} vs {pr.observed:.3f} ({pr.err:+.3f}, {'ok' if v.pred_ok else 'missed'}"
    if pr.inside is not None:
        s += f"; {'inside' if pr.inside else 'outside'} [{pr.lo:.3f}, {pr.hi:.3f}]"
    if math.isfinite(pr.skill):
        s += f"; skill {pr.skill:+.2f}"
    if pr.supported is False and pr.unstable:
        s += (
            f"; not supported: the seeds fell {', '.join(f'{x:.3f}' for x in pr.falls)} in the half window "
            f"(median {pr.fall_se:.1f} se)"
        )
    elif pr.supported is False:
        s += f"; not supported: window {reach_text(pr.reach)}x C_mid < {HORIZON:g}x, needs {compute_text(pr.more_compute, 'the budget')}"
    return s + ")"


def _md_cell(text: str) -> str:
    """``text`` as one Markdown table cell (a ``|`` or a line break would split the row)."""
    return str(text).replace("|", "/").replace("\r", " ").replace("\n", " ")


def seeds_cell(v: VariantVerdict) -> str:
    """Seeds in A's mean / the variant's runs, and how many of them are censored at 1."""
    s = f"{v.A.n}/{len(v.run_ids)}"
    return s + (f" ({v.A.censored} at 1)" if v.A.censored else "")


def verdict_table(vs: Sequence[VariantVerdict], level: float = 0.9) -> str:
    """The Markdown verdict table: variant, seeds (censored at 1), A and B at the baseline's A (mean
    [t-interval over every usable seed]), ΔA and ΔB [simultaneous interval], the smallest detectable
    ΔA, the half-budget prediction, the verdict."""
    a_fix = next((v.family.A_fixed for v in vs if math.isfinite(v.family.A_fixed)), math.nan)
    b_head = f"B @ A={a_fix:.3f}" if math.isfinite(a_fix) else "B @ baseline A"
    head = (
        f"| variant | seeds | A [{level:.0%} CI] | {b_head} [{level:.0%} CI] | ΔA [sim. CI] | ΔB [sim. CI] "
        f"| detectable ΔA | predicted vs observed end [{PRED_LEVEL:.0%} band] | verdict |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for v in vs:
        lines.append(
            "| "
            + " | ".join(
                [
                    _md_cell(v.variant),
                    seeds_cell(v),
                    _est(v.A, ".3f"),
                    _est(v.B, ".2f"),
                    ((">= " if v.dA.bound else "") + _cmp(v.dA, ".3f")) if not v.baseline else "",
                    _cmp(v.dB, ".2f") if not v.baseline else "",
                    _f(v.dA.mdd, ".3f") if v.scored else "",
                    prediction_cell(v),
                    _md_cell(v.verdict),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def _testable(c: Comparison) -> bool:
    return c.tested and not c.untestable


def family_summary(vs: Sequence[VariantVerdict]) -> str:
    """One line: the test, its family and level, the seeds' spread and the design's resolution."""
    fam = next((v.family for v in vs), Family())
    if not fam.m:
        return "Test: no variant is scored against the baseline."
    called = sum(bool(v.called) for v in vs)
    tested = sum(_testable(v.dA) + _testable(v.dB) for v in vs)
    sd = (
        f"{fam.sd_A:.3f} ({fam.df_sd} df)"
        if math.isfinite(fam.sd_A)
        else "unknown (fewer than 2 usable seeds)"
    )
    mdd = f"{fam.mdd_A:.3f}" if math.isfinite(fam.mdd_A) else "unknown"
    if fam.at_max:
        mdd_b = f"{fam.mdd_B:.2f}" if math.isfinite(fam.mdd_B) else "unknown"
        what = (
            f"B at A=1 of {fam.m} scored variants; A is not compared, since the baseline's ceiling is not "
            "bounded below 1 at this budget"
        )
        resolution = (
            f"smallest detectable ΔB at A=1, {fam.seeds} seeds per variant and {POWER:.0%} power: {mdd_b}"
        )
    else:
        what = f"A and B of {fam.m // 2} scored variant{'s' * (fam.m != 2)}"
        resolution = f"smallest detectable ΔA at {fam.seeds} seeds per variant and {POWER:.0%} power: {mdd}"
        equivalent = sum(v.scored and v.dA.equivalent and not v.called.get("A") for v in vs)
        res = f"±{fam.eq_resolution:.3f}" if math.isfinite(fam.eq_resolution) else "unknown"
        resolution += (
            f"; equivalence on A (TOST, each at the same level) within ±{fam.eq_margin:.3f} (the paper's "
            f"±{MARGIN_A:g}, or the smallest margin this design resolves, {res} at {POWER:.0%} power, at most "
            f"±{EQ_MARGIN_MAX:g}): {equivalent} variant{'s' if equivalent != 1 else ''} shown equivalent"
        )
    return (
        f"Test: Welch's t-test on each pair (variant against baseline) alone, on every usable seed's value, "
        f"Bonferroni over {fam.m} comparisons ({what}), "
        f"family-wise level {FAMILY_LEVEL:.0%} (each test at "
        f"{fam.alpha:.4f}); {tested} of the {fam.m} comparisons could be tested (both sides shown), "
        f"{called} variant{'s' if called != 1 else ''} called. Seeds' spread of A "
        f"(pooled sd, describing the design; no test pools it): {sd}; {resolution}."
    )


def verdict_legend(level: float = 0.9) -> list[str]:
    return [
        f"A: mean over every seed with a usable fit (failed fits, and fits through no more points than "
        f"parameters, excepted) [{level:.0%} t-interval over them]; seeds: in the mean / all, (k at 1): seeds "
        f"censored at 1 (fitted A within {A_BOUND_TOL:g} of 1, or its bootstrap interval reaching 1), kept at "
        "their fitted value. Where at least half a variant's seeds are censored its A is not shown at this "
        "budget (not bounded below 1) and not scored; no seed is left out for what its fit found. Such a "
        "variant is still tested for a higher A than a baseline whose A is shown: its censored seeds at their "
        'intervals\' lower ends, the others at their fitted A; "A higher" when even those lie above the '
        "baseline's A, and ΔA (shown as >=) is then a lower bound.",
        "B @ A: every run refitted with A fixed to the baseline's A (the paper's protocol), the same "
        "estimator over every refitted seed (a B at its fit bound censored there). Where at least half of the "
        "baseline's seeds are censored at 1, A is fixed to 1 and only B is compared (the family is then B "
        "alone); ΔA is not tested.",
        f"Verdict: ΔA and ΔB are tested with Welch's t-test on each pair (the variant's and the baseline's "
        f"per-seed values alone; no spread pooled over variants), two-sided, Bonferroni-corrected over every "
        f"comparison of the table (family-wise level {FAMILY_LEVEL:.0%}); "
        f"[sim. CI]: the matching simultaneous interval. A difference is called when that interval excludes 0 "
        f'and, for A, |ΔA| > {MARGIN_A:g} (the paper\'s margin); otherwise "{INCONCLUSIVE}" with the '
        f"smallest ΔA the test detects with {POWER:.0%} power (detectable ΔA). Where A is not called, the "
        f"equivalence test (TOST at the same level) says whether A is equivalent within the stated margin "
        f"(±{MARGIN_A:g}, or the smallest this design resolves, at most ±{EQ_MARGIN_MAX:g}) or that this is "
        f'{NOT_SHOWN}: B called with A equivalent shows "changes B, not A".',
        "cannot act here / inactive: the component cannot act on this hardware (a bf16 head emulated on "
        "CPU), or never acted in its or the baseline's runs (0 prompts retired or under one epoch, policy lag "
        "never beyond the smaller k, no interruption, no zero-variance group): not scored, not in the family.",
        f"Predicted vs observed end: the pooled fit of the seeds' first half of the compute predicts the mean of "
        f"their evaluations in the last {END_WINDOW:.0%} of the compute (the observed end); ok when within "
        f"{PRED_TOLERANCE:g}; the {PRED_LEVEL:.0%} band combines the half fit's bootstrap (residuals within each "
        "seed, the seeds kept: the target is their end), those evaluations' binomial noise and the shape error at "
        f"the half window's reach; not supported where that window ends before {HORIZON:g}x the half fit's C_mid "
        "(the curves' shape past the bend is not yet set: the measured bias and the budget that would support it "
        "are given); skill: 1 - |error| / |persistence's error|, persistence the first half's last value.",
    ]
