"""Per-variant verdicts: what a sweep's runs support about each recipe against the baseline.

A variant is all the runs of one recipe (its seeds). For each variant:

- **A and B** as the mean and standard deviation of the per-seed fits, and a ``level`` interval
  from the *pooled* fit of its seeds (:func:`~scalerl.scaling.sigmoid.fit_sigmoid_runs`: the
  bootstrap resamples the seeds, then residuals within each seed, so the interval includes
  seed-to-seed variation; with one seed it is that run's residual bootstrap).
- **A difference** from the baseline is called only where the two variants' intervals do not
  overlap (for A and for B separately). Two non-overlapping 90% intervals is a conservative test:
  for estimates of similar precision it rejects "no difference" at roughly the 1% level.
  Otherwise the verdict is "no difference detected at this budget".
- **Unsettled fits are never called**: an interval of A that reaches 1 (or R0) is bounded by the
  pass rate's range, not by the data; an interval of B that reaches B's bounds likewise; and B is
  not scored while A is unsettled (the fit trades one against the other).
- **Inactive components are not scored**: a variant that differs from the baseline in a component
  that never acted in their runs (no prompt retired, policy lag never beyond the smaller k, no
  interruption, no zero-variance group) is reported as ``inactive: <reason>``.
- **Prediction**: the pooled fit on each seed's first half of the compute predicts each seed's
  final pass rate; the error is the mean over seeds of predicted minus observed, within
  :data:`PRED_TOLERANCE` counts as predicted.

Every fit uses the same absolute early cut (:func:`~scalerl.scaling.sigmoid.early_cutoff`) as the
live refits and the per-run table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scalerl.analysis.mlflow_io import RunData
from scalerl.scaling.sigmoid import B_BOUNDS, DEFAULT_METHOD, SigmoidFit, early_cutoff, fit_sigmoid_runs

PRED_TOLERANCE = 0.02
"""A prediction within this of the observed final pass rate counts as predicted (the paper's margin)."""
A_UNSETTLED = 0.999
"""An interval of A reaching this is bounded by the pass rate's range (1), not by the data."""
NO_DIFFERENCE = "no difference detected at this budget"


@dataclass
class Estimate:
    """One parameter of a variant: per-seed mean and sd, the pooled fit's interval."""

    mean: float = math.nan
    sd: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    unsettled: str = ""  # why the interval cannot be trusted ("" = settled)

    @property
    def settled(self) -> bool:
        return not self.unsettled and math.isfinite(self.lo) and math.isfinite(self.hi)

    def separates(self, other: Estimate) -> int:
        """+1 / -1 when this interval lies wholly above / below ``other``'s (both settled), else 0."""
        if not (self.settled and other.settled):
            return 0
        if self.lo > other.hi:
            return 1
        if self.hi < other.lo:
            return -1
        return 0


@dataclass
class VariantVerdict:
    variant: str
    run_ids: list[str]
    baseline: bool = False
    fitted: int = 0
    A: Estimate = field(default_factory=Estimate)
    B: Estimate = field(default_factory=Estimate)
    delta_A: float = math.nan  # mean A - baseline's mean A
    delta_B: float = math.nan
    pooled: SigmoidFit | None = None
    pred_err: float = math.nan  # mean over seeds of (predicted - observed) final pass rate
    pred_n: int = 0  # seeds with a prediction
    final_sd: float = math.nan  # sd over seeds of the observed final pass rate
    final_se: float = math.nan  # binomial standard error of one final evaluation (its samples)
    half_points: float = math.nan  # mean points per seed the half-budget fit rests on
    inactive: str = ""  # why the variant's component never acted ("" = active or unknown)
    reason: str = ""  # why nothing could be fitted
    verdict: str = ""
    called: dict[str, int] = field(default_factory=dict)  # "A"/"B" -> +1/-1 where a difference is called

    @property
    def pred_ok(self) -> bool | None:
        return None if not math.isfinite(self.pred_err) else abs(self.pred_err) <= PRED_TOLERANCE


@dataclass
class Protocol:
    """The fit settings every fit of the verdicts uses."""

    method: str = DEFAULT_METHOD
    min_step: int = 0
    min_compute: float = 0.0
    bootstrap: int = 200
    level: float = 0.9
    seed: int = 0
    grid: dict = field(default_factory=dict)

    def cut(self, run: RunData) -> float:
        return early_cutoff(run.steps, run.compute, min_step=self.min_step, min_compute=self.min_compute)


# ------------------------------------------------------------------------------------------------
# Which component a variant changes, and whether it acted
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
# Fits
# ------------------------------------------------------------------------------------------------


def _estimates(fits: Sequence[SigmoidFit], pooled: SigmoidFit | None) -> tuple[Estimate, Estimate]:
    ok = [f for f in fits if f.ok]

    def per_seed(name):
        v = np.array([getattr(f, name) for f in ok], dtype=float)
        return (
            float(v.mean()) if v.size else math.nan,
            float(v.std(ddof=1)) if v.size > 1 else math.nan,
        )

    A, B = Estimate(*per_seed("A")), Estimate(*per_seed("B"))
    if pooled is None or not pooled.ok or not pooled.ci:
        A.unsettled = B.unsettled = "no interval (the pooled fit failed or has no bootstrap)"
        return A, B
    A.lo, A.hi = pooled.ci["A"]
    B.lo, B.hi = pooled.ci["B"]
    if A.hi >= A_UNSETTLED:
        A.unsettled = "A's interval reaches 1"
    elif A.lo <= pooled.R0 + 1e-3:
        A.unsettled = "A's interval reaches R0"
    if B.lo <= B_BOUNDS[0] * 1.01 or B.hi >= B_BOUNDS[1] * 0.99:
        B.unsettled = "B's interval reaches its bound"
    elif A.unsettled:
        B.unsettled = "B not scored while A is unsettled"
    return A, B


def _pooled(runs: Sequence[RunData], p: Protocol, *, half: bool = False, bootstrap: int | None = None):
    """The pooled fit of ``runs`` (``half``: each run's points up to half its compute)."""
    series, cuts = [], []
    for r in runs:
        c, y = r.compute, r.reward
        if half:
            fin = np.isfinite(c)
            keep = fin & (c <= float(np.max(c[fin])) / 2) if fin.any() else fin
            c, y = c[keep], y[keep]
        series.append((c, y))
        cuts.append(p.cut(r))
    return fit_sigmoid_runs(
        series,
        min_compute=cuts,
        method=p.method,
        bootstrap=p.bootstrap if bootstrap is None else bootstrap,
        level=p.level,
        seed=p.seed,
        drop_nonfinite=True,
        **p.grid,
    )


def predict_final(runs: Sequence[RunData], p: Protocol) -> tuple[float, int]:
    """(mean over seeds of predicted - observed final pass rate, seeds predicted) from the pooled
    fit on each seed's first half of the compute; (NaN, 0) when that fit fails."""
    usable = [r for r in runs if r.compute.size >= 2 and np.isfinite(r.compute).any()]
    if not usable:
        return math.nan, 0
    fit = _pooled(usable, p, half=True, bootstrap=0)
    if not fit.ok:
        return math.nan, 0
    errs = []
    for r in usable:
        last = _last_point(r)
        if last is not None:
            errs.append(float(fit.predict(r.compute[last])) - float(r.reward[last]))
    return (float(np.mean(errs)), len(errs)) if errs else (math.nan, 0)


def _last_point(r: RunData) -> int | None:
    """Index of the run's evaluation at its largest finite compute (None: no finite point)."""
    fin = np.isfinite(r.compute) & np.isfinite(r.reward)
    return int(np.argmax(np.where(fin, r.compute, -np.inf))) if fin.any() else None


def _prediction_limits(runs: Sequence[RunData], p: Protocol) -> tuple[float, float, float]:
    """What bounds a half-budget prediction of these runs: the sd over seeds of the final pass rate,
    one final evaluation's binomial standard error (from its logged sample count), and the points
    per seed left to the half-budget fit after the early cut."""
    finals, ses, points = [], [], []
    for r in runs:
        last = _last_point(r)
        if last is None:
            continue
        fin = np.isfinite(r.compute) & np.isfinite(r.reward)
        y = float(r.reward[last])
        finals.append(y)
        n = _num(r.params.get("eval.num_prompts")) * _num(r.params.get("eval.samples_per_prompt"))
        if math.isfinite(n) and n > 0:
            ses.append(math.sqrt(max(y * (1 - y), 0.0) / n))
        half = float(np.max(r.compute[fin])) / 2
        points.append(int(np.sum(fin & (r.compute <= half) & (r.compute >= p.cut(r)))))
    sd = float(np.std(finals, ddof=1)) if len(finals) > 1 else math.nan
    return (
        sd,
        float(np.mean(ses)) if ses else math.nan,
        float(np.mean(points)) if points else math.nan,
    )


def prediction_summary(vs: Sequence[VariantVerdict], goal: int = 8) -> str:
    """One paragraph: how many variants' half-budget predictions landed within the tolerance, and,
    when fewer than ``goal`` (of 9, scaled to the variants there are) did, what in the data stands
    in the way: the measurement's own noise, the seed-to-seed spread, the points the fit had."""
    scored = [v for v in vs if v.pred_ok is not None]
    if not scored:
        return "Prediction: no variant could be predicted from half of its budget."
    ok = sum(bool(v.pred_ok) for v in scored)
    need = math.ceil(goal / 9 * len(scored))
    text = (
        f"Prediction: {ok} of {len(scored)} variants' final pass rates were predicted within "
        f"{PRED_TOLERANCE:g} from the first half of their compute (goal: {need} of {len(scored)})"
    )
    if ok >= need:
        return text + "."
    why = []
    se = [v.final_se for v in scored if math.isfinite(v.final_se)]
    if se and float(np.median(se)) >= PRED_TOLERANCE / 2:
        why.append(
            f"one final evaluation measures the pass rate with a standard error of about "
            f"{float(np.median(se)):.3f} (its sample count), so {PRED_TOLERANCE:g} is within the measurement's noise"
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
            f"the misses lean one way (mean {bias:+.3f}): the half-budget fits {side}-estimate the ceiling"
        )
    if not why:
        why.append("no single cause stands out in the data")
    return text + ": not met. Why: " + "; ".join(why) + "."


def verdicts(
    runs: Sequence[RunData],
    names: dict[str, str],
    fits: dict[str, SigmoidFit],
    baseline: str | None,
    protocol: Protocol,
    order: Sequence[str] = (),
) -> list[VariantVerdict]:
    """One :class:`VariantVerdict` per variant (``names``: run id -> variant; ``fits``: run id ->
    its own fit), the baseline first, then in ``order`` (variant names), then by name."""
    by: dict[str, list[RunData]] = {}
    for r in runs:
        by.setdefault(names[r.run_id], []).append(r)
    out: dict[str, VariantVerdict] = {}
    for name, members in by.items():
        v = VariantVerdict(name, [r.run_id for r in members], baseline=name == baseline)
        own = [fits[r.run_id] for r in members]
        v.fitted = sum(f.ok for f in own)
        ok_runs = [r for r in members if fits[r.run_id].ok]
        if ok_runs:
            v.pooled = _pooled(ok_runs, protocol)
        else:
            v.reason = next((f.reason for f in own if f.reason), "no run could be fitted")
        v.A, v.B = _estimates(own, v.pooled)
        v.pred_err, v.pred_n = predict_final(members, protocol)
        v.final_sd, v.final_se, v.half_points = _prediction_limits(members, protocol)
        out[name] = v
    base = out.get(baseline) if baseline else None
    for name, v in out.items():
        if base is not None and not v.baseline:
            v.inactive = inactive_reason(by[name], by[baseline])
            v.delta_A = v.A.mean - base.A.mean
            v.delta_B = v.B.mean - base.B.mean
        v.verdict = _verdict(v, base)
    rank = {n: i for i, n in enumerate(order)}
    return sorted(out.values(), key=lambda v: (not v.baseline, rank.get(v.variant, len(rank)), v.variant))


def _verdict(v: VariantVerdict, base: VariantVerdict | None) -> str:
    if v.baseline:
        return "baseline"
    if v.inactive:
        return f"inactive: {v.inactive}"
    if not v.fitted:
        return f"unfittable: {v.reason}"
    if base is None or not base.fitted:
        return "no baseline fit to compare with"
    called, unsettled = {}, []
    for name in ("A", "B"):
        mine, theirs = getattr(v, name), getattr(base, name)
        m, t = mine.unsettled, theirs.unsettled
        if m and m == t:
            unsettled.append(f"{m}, here and in the baseline")
        else:
            unsettled += [m] if m else []
            unsettled += [f"in the baseline {t}"] if t else []
        sign = mine.separates(theirs)
        if sign:
            called[name] = sign
    v.called = called
    if called:
        return ", ".join(f"{k} {'higher' if s > 0 else 'lower'}" for k, s in called.items())
    note = f" (unsettled: {'; '.join(dict.fromkeys(unsettled))})" if unsettled else ""
    return NO_DIFFERENCE + note


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def _f(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else "-"


def _est(e: Estimate, spec: str) -> str:
    s = _f(e.mean, spec)
    if math.isfinite(e.sd):
        s += f" ± {_f(e.sd, spec)}"
    if math.isfinite(e.lo):
        s += f" [{_f(e.lo, spec)}, {_f(e.hi, spec)}]"
    return s


def prediction_cell(v: VariantVerdict) -> str:
    if not math.isfinite(v.pred_err):
        return "-"
    return f"{v.pred_err:+.3f} ({'ok' if v.pred_ok else 'missed'})"


def verdict_table(vs: Sequence[VariantVerdict], level: float = 0.9) -> str:
    """The Markdown verdict table: variant, seeds, A and B (mean ± sd over seeds [pooled interval]),
    ΔA, ΔB, the half-budget prediction's error, the verdict."""
    head = (
        f"| variant | seeds | A mean ± sd [{level:.0%} CI] | B mean ± sd [{level:.0%} CI] | ΔA | ΔB "
        f"| prediction error (half budget) | verdict |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for v in vs:
        lines.append(
            "| "
            + " | ".join(
                [
                    v.variant,
                    f"{v.fitted}/{len(v.run_ids)}",
                    _est(v.A, ".3f"),
                    _est(v.B, ".2f"),
                    _f(v.delta_A, "+.3f") if not v.baseline else "",
                    _f(v.delta_B, "+.2f") if not v.baseline else "",
                    prediction_cell(v),
                    v.verdict.replace("|", "/"),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def verdict_legend(level: float = 0.9) -> list[str]:
    return [
        f"A, B: mean ± sd over the variant's fitted seeds; [..]: {level:.0%} interval of the pooled fit of "
        "its seeds (bootstrap over seeds, then residuals within each seed).",
        f"Verdict: a difference from the baseline is called only where the two {level:.0%} intervals do not "
        f"overlap (a conservative test: about the 1% level for estimates of similar precision); otherwise "
        f'"{NO_DIFFERENCE}". Intervals reaching a bound (A at 1 or R0, B at {B_BOUNDS[0]:g} or {B_BOUNDS[1]:g}) '
        "are unsettled and never called; neither is B while A is unsettled.",
        "inactive: the component the variant changes never acted in its or the baseline's runs (0 prompts "
        "retired or under one epoch, policy lag never beyond the smaller k, no interruption, no "
        "zero-variance group): not scored.",
        f"Prediction error: the pooled fit on each seed's first half of the compute predicts its final pass "
        f"rate; predicted - observed, mean over seeds; ok when within {PRED_TOLERANCE:g}.",
    ]
