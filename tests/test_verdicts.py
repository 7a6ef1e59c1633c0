"""The per-variant verdicts on synthetic seeded curves (no MLflow, no training; a few seconds):
a difference is called only where the t-test over the seeds (Bonferroni over the table) finds it
and it exceeds the margin, unsettled seeds are neither averaged nor called, components that cannot
act or did not act are flagged instead of scored, and the half-budget prediction is reported with
its band. (The calibration over many sweeps: tests/test_verdict_calibration.py.)"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from scipy import stats

from scalerl.analysis.figures import _short
from scalerl.analysis.mlflow_io import RunData
from scalerl.analysis.verdicts import (
    AT_MAX_NOTE,
    INCONCLUSIVE,
    MARGIN_A,
    cannot_act_reason,
    end_points,
    family_summary,
    inactive_reason,
    prediction_summary,
    seeds_cell,
    t_test,
    verdict_table,
    verdicts,
)
from scalerl.scaling import FitProtocol
from scalerl.scaling.sigmoid import fit_sigmoid
from scalerl.scaling.synthetic import TrueCurve, sample_run

PROTOCOL = FitProtocol(min_step=10, bootstrap=100, level=0.9)
BASE_PARAMS = {
    "loss": "cispo",
    "async_mode.name": "pipeline_rl",
    "async_mode.max_lag": "8",
    "filter.zero_variance": "True",
    "filter.no_positive_resampling": "True",
    "length_control.name": "interruption",
}


def _runs(variant, curve, seeds=3, *, trials=2048, params=None, activity=None, n_points=20, reach=6.0):
    out = []
    for seed in range(seeds):
        rng = np.random.default_rng([zlib.crc32(variant.encode()), seed])  # the same data every run
        c, y = sample_run(curve, rng, reach=reach, trials=trials, n_points=n_points)
        out.append(
            RunData(
                run_id=f"{variant}-{seed}",
                run_name=f"{variant}-s{seed}",
                status="FINISHED",
                experiment_id="0",
                params={**BASE_PARAMS, **(params or {}), "seed": str(seed)},
                tags={},
                compute_axis="device_hours",
                steps=np.arange(c.size) * 10,
                compute=c,
                reward=y,
                activity=dict(
                    activity or {"retired": 40, "epochs": 3, "lag_max": 8, "zero_variance_groups": 9}
                ),
            )
        )
    return out


def _verdicts(groups: dict[str, list[RunData]], baseline="base", bootstrap=0):
    runs = [r for g in groups.values() for r in g]
    names = {r.run_id: v for v, g in groups.items() for r in g}
    fits = {
        r.run_id: fit_sigmoid(
            r.compute, r.reward, min_compute=PROTOCOL.cut_of(r), bootstrap=bootstrap, drop_nonfinite=True
        )
        for r in runs
    }
    return {v.variant: v for v in verdicts(runs, names, fits, baseline, PROTOCOL)}


BASE = TrueCurve(0.15, 0.62, 1.9, 1000.0)


def test_separated_ceilings_are_called_and_close_ones_are_not():
    vs = _verdicts(
        {
            "base": _runs("base", BASE),
            "lower": _runs("lower", TrueCurve(0.15, 0.50, 1.9, 1000.0), params={"loss": "dapo"}),
            "same": _runs("same", TrueCurve(0.15, 0.622, 1.9, 1000.0), params={"loss": "gspo"}),
        }
    )
    base, lower, same = vs["base"], vs["lower"], vs["same"]
    assert base.verdict == "baseline" and base.fitted == 3 and base.A.n == 3
    # one estimator: the mean over the settled seeds and the t-interval around it, about the truth
    assert base.A.mean == pytest.approx(np.mean(base.A.values)) and abs(base.A.mean - 0.62) < 0.02
    assert 0 < base.A.sd < 0.02 and base.A.lo <= 0.62 <= base.A.hi
    assert base.A.lo < base.A.mean < base.A.hi
    # B compared at A fixed to the baseline's A
    assert base.family.A_fixed == pytest.approx(base.A.mean) and base.family.m == 4
    assert lower.called["A"] == -1 and lower.verdict.startswith("A lower (ΔA -0.1")
    assert lower.delta_A == pytest.approx(lower.A.mean - base.A.mean)
    assert lower.dA.hi < 0 and lower.dA.p < lower.dA.alpha == pytest.approx(0.05 / 4)
    assert lower.label == "A lower" and base.label == "baseline"
    # 0.002 apart: no difference is called; the equivalence test (TOST at the table's margin, which
    # these tight seeds resolve near the paper's 0.02) shows A equal, and the verdict states the
    # margin, ΔA's interval and what the design could have detected
    assert same.called == {} and same.dA.equivalent and same.label == "equivalent", same.verdict
    assert same.verdict.startswith(f"equivalent: A equivalent within ±{same.family.eq_margin:.3f} (ΔA ")
    assert MARGIN_A <= same.family.eq_margin < 0.05 and "smallest detectable ΔA = 0." in same.verdict
    assert -same.family.eq_margin < same.dA.eq_lo < same.dA.eq_hi < same.family.eq_margin
    assert MARGIN_A <= same.dA.mdd < 0.1
    # the lower ceiling is not equivalent: its interval lies far outside the margin
    assert not lower.dA.equivalent and lower.dA.eq_hi < -same.family.eq_margin
    # the prediction from the seeds' first half of the compute, inside its band
    for v in vs.values():
        assert v.pred_n == 3 and abs(v.pred_err) < 0.03 and v.pred_ok is True
        assert v.prediction.inside is True and v.prediction.lo < v.prediction.hi
    table = verdict_table(list(vs.values()))
    assert table.splitlines()[2].startswith("| base | 3/3 | 0.6") and "A lower" in table
    # the figures' panel titles say what the verdicts say
    assert _short(lower).startswith("A lower") and _short(base) == "baseline"
    assert _short(same) == f"A equivalent (±{same.family.eq_margin:g})"


def test_one_seed_calls_nothing():
    """One seed per variant has no seed-to-seed spread: even a 0.08 gap is not called."""
    vs = _verdicts(
        {
            "base": _runs("base", BASE, seeds=1),
            "other": _runs("other", TrueCurve(0.15, 0.54, 1.9, 1000.0), seeds=1, params={"loss": "dapo"}),
        }
    )
    other = vs["other"]
    assert math.isnan(other.A.sd) and other.A.n == 1
    assert other.called == {} and "no seed-to-seed spread" in other.verdict, other.verdict
    assert other.label == "not shown" and other.verdict.startswith("not shown at this budget")
    assert _short(other) == "not shown at this budget"  # the panel's title says so too


def test_censored_seeds_are_kept_in_the_mean_and_an_unbounded_A_is_never_called():
    """Curves still rising at the end of the budget: A runs to 1 in most seeds' fits. No seed is
    dropped for what its fit found: the censored seeds stay in the mean at their fitted value (the
    old rule averaged only the seeds that "settled", a selection by outcome), they are counted, and
    with most of them censored the variant's A is "not shown" and not scored, however much its
    curve differs."""
    rising = TrueCurve(0.15, 0.95, 1.5, 1000.0)
    vs = _verdicts(
        {
            "base": _runs("base", rising, reach=0.8),
            "slow": _runs("slow", TrueCurve(0.15, 0.95, 1.5, 3000.0), reach=0.8 / 3, params={"loss": "dapo"}),
        },
        bootstrap=50,
    )
    base, slow = vs["base"], vs["slow"]
    assert not base.A.settled and "seeds censored at 1" in base.A.unsettled, base.A
    assert base.A.n == 3 and base.A.censored >= 2 and base.A.mean == pytest.approx(np.mean(base.A.values))
    assert any(a >= 0.995 for a in base.A.values)  # kept at their fitted value
    assert base.A.hi <= 1.0  # the interval stays within the pass rate's range
    assert seeds_cell(base) == f"3/3 ({base.A.censored} at 1)"
    # the ceilings reach 1: A is compared nowhere, efficiency only at A = 1
    assert base.family.at_max and base.family.A_fixed == 1.0 and base.family.m == 1
    assert "A" not in slow.called and slow.verdict.endswith(AT_MAX_NOTE), slow.verdict
    assert slow.label in ("B lower", "inconclusive", "not shown"), slow.label


def test_a_variant_that_learns_the_whole_task_is_called_higher_by_its_seeds_lower_ends():
    """A component that lets the policy learn the whole task (the ceiling study's longer budget): its
    seeds' A runs to 1, so its A is not shown, yet over a baseline whose A is bounded (0.62) it is
    called "A higher" on its seeds' lower ends, and ΔA is reported as that lower bound. A variant
    whose curve merely has not bent yet (intervals reaching 1, lower ends near the baseline) gets no
    such call: a lower bound shows a higher ceiling or nothing."""
    vs = _verdicts(
        {
            "base": _runs("base", BASE),
            "whole": _runs("whole", TrueCurve(0.15, 1.0, 1.9, 1000.0), params={"loss": "dapo"}),
            "early": _runs("early", TrueCurve(0.15, 0.62, 1.2, 1000.0), reach=0.5, params={"loss": "gspo"}),
        },
        bootstrap=60,
    )
    base, whole, early = vs["base"], vs["whole"], vs["early"]
    assert base.A.settled and abs(base.A.mean - 0.62) < 0.02
    assert not whole.A.settled and whole.A.censored >= 2, whole.A
    assert whole.label == "A higher" and whole.called == {"A": 1} and whole.dA.bound == "lower"
    assert whole.verdict.startswith(
        f"A higher (by at least {whole.dA.lo:+.3f}: its seeds' lower ends lie +0.3"
    )
    # the lower ends: each censored seed's interval lower end, below its fitted A
    assert whole.dA.delta == pytest.approx(np.mean(whole.A.floors) - base.A.mean)
    assert whole.dA.delta <= whole.A.mean - base.A.mean and whole.dA.lo > MARGIN_A
    assert not whole.dB.tested and not whole.dA.equivalent  # no B at the baseline's A, no equivalence
    assert "| >= +0.3" in verdict_table(list(vs.values()))
    # censored like "whole" (2 of its 3 seeds' intervals reach 1), but its lower ends lie below the
    # baseline's A: tested on them, not called, and its A still not shown
    assert early.A.censored >= 2 and early.dA.bound == "lower" and early.dA.tested, early.A
    assert not early.called and early.label == "not shown", early.verdict
    assert "do not place A above the baseline's" in early.verdict and early.dA.delta < 0


def test_a_fit_through_as_many_points_as_parameters_is_not_settled():
    """Three evaluations past the early cut (a short sweep): the sigmoid passes through them, so its
    A is set by those points alone, with no interval. Such seeds are neither averaged in nor called,
    however far apart the variants' last points are."""
    vs = _verdicts(
        {
            "base": _runs("base", BASE, n_points=3),
            "lower": _runs("lower", TrueCurve(0.15, 0.40, 1.9, 1000.0), n_points=3, params={"loss": "dapo"}),
        },
        bootstrap=50,
    )
    for v in vs.values():
        assert v.fitted == 3 and v.A.n == 0, v.A
        assert v.A.unsettled == "A: 0 of 3 fitted seeds usable (3 points for 3 parameters in 3)", v.A
        assert not v.called and v.label in ("baseline", "not shown"), v.label
    # with a fourth point the same curves are fitted with an interval and can be scored
    vs = _verdicts({"base": _runs("base", BASE, n_points=4)}, bootstrap=50)
    assert "points for 3 parameters" not in vs["base"].A.unsettled


def test_where_the_ceilings_reach_1_efficiency_is_compared_at_1():
    """A task the policy learns to solve: every seed's ceiling reaches 1. A less efficient variant
    (B halved) is called lower at A = 1 and one on the baseline's curve is not; neither A is compared,
    and the summary says the family is B alone."""
    solved = TrueCurve(0.15, 0.995, 2.0, 1000.0)
    vs = _verdicts(
        {
            "base": _runs("base", solved, reach=3.0),
            "same": _runs("same", solved, reach=3.0, params={"norm": "prompt"}),
            "slow": _runs("slow", TrueCurve(0.15, 0.995, 1.0, 1000.0), reach=3.0, params={"loss": "dapo"}),
        },
        bootstrap=50,
    )
    base, same, slow = vs["base"], vs["same"], vs["slow"]
    assert not base.A.settled and base.family.at_max and base.family.m == 2
    assert slow.called == {"B": -1} and slow.verdict.startswith("B lower at A=1"), slow.verdict
    assert same.called == {} and same.verdict.startswith(INCONCLUSIVE + ": ΔB at A=1"), same.verdict
    assert all(not v.dA.tested for v in (same, slow))
    assert slow.label == "B lower" and same.label == "inconclusive"
    text = family_summary(list(vs.values()))
    assert "B at A=1 of 2 scored variants; A is not compared" in text, text


def test_the_t_test_calls_only_beyond_the_interval_and_the_margin():
    a = [0.60, 0.61, 0.62]
    assert t_test([0.50, 0.51, 0.52], a, 0.01, MARGIN_A).called == -1
    assert t_test([0.70, 0.71, 0.72], a, 0.01, MARGIN_A).called == 1
    # significant but within the margin: not called
    tight = t_test([0.625, 0.626, 0.627], [0.610, 0.611, 0.612], 0.01, MARGIN_A)
    assert tight.p < 0.01 and tight.called == 0
    # Welch's test on the pair alone: scipy's p-value and the Welch-Satterthwaite df
    x, y = [0.40, 0.60, 0.80], [0.58, 0.60, 0.62]
    noisy = t_test(x, y, 0.01, MARGIN_A)
    ref = stats.ttest_ind(x, y, equal_var=False)
    assert noisy.p == pytest.approx(ref.pvalue) and noisy.df == pytest.approx(ref.df) and noisy.df < 4
    assert noisy.called == 0


def test_seeds_without_spread_are_not_tested():
    """Identical values on both sides (fits at a bound, or float copies of one value) leave no
    spread to test with: no p-value, nothing called, no equivalence, the reason given; a spread
    the size of the values' float rounding counts as none, a real one is tested."""
    for x, y in (([0.76] * 3, [0.735] * 3), ([0.745] * 2, [0.735] * 2), ([0.1 + 0.2] * 3, [0.3] * 3)):
        c = t_test(x, y, 0.01, MARGIN_A, eq_margin=0.05)
        assert math.isnan(c.p) and math.isnan(c.eq_p) and c.called == 0 and not c.equivalent, (x, y)
        assert c.untestable == "no spread between seeds on either side" and math.isnan(c.lo)
    c = t_test([0.760, 0.765, 0.755], [0.735, 0.740, 0.730], 0.01, MARGIN_A, eq_margin=0.05)
    assert c.p < 0.01 and c.called == 1 and not c.untestable


def test_pairs_without_spread_are_not_counted_as_tested():
    """Seeds that are copies of one run on every side: every pair untested, the table says 0 of its
    comparisons could be tested, and no variant is labelled inconclusive."""
    import dataclasses

    def clones(variant, curve, params=None):
        (r,) = _runs(variant, curve, seeds=1, params=params)
        return [dataclasses.replace(r, run_id=f"{variant}-{i}", run_name=f"{variant}-s{i}") for i in range(3)]

    vs = _verdicts(
        {"base": clones("base", BASE), "v": clones("v", TrueCurve(0.15, 0.70, 1.9, 1000.0), {"loss": "dapo"})}
    )
    assert vs["v"].dA.untestable and vs["v"].label == "not shown"
    assert "0 of the 2 comparisons could be tested (both sides shown)" in family_summary(list(vs.values()))
    assert "(A and B of 1 scored variant)" in family_summary(list(vs.values()))
    # censored at 1 in every copy: the lower-bound test has no spread either, and says so
    vs = _verdicts(
        {"base": clones("base", BASE), "v": clones("v", TrueCurve(0.15, 1.0, 1.9, 1000.0))}, bootstrap=50
    )
    assert vs["v"].dA.bound == "lower" and vs["v"].verdict.endswith(
        "its seeds' lower ends not tested against the baseline's A (no spread between seeds on either side)"
    )


def test_a_half_budget_fit_through_its_points_is_not_scored():
    """One seed whose first half leaves 3 points past the early cut: its half fit passes through
    them, so its prediction is reported with the reason and scored nowhere, nor in the runs table."""
    from scalerl.analysis.experiment import NO_CHECK, _half_check

    vs = _verdicts({"base": _runs("base", BASE, seeds=1, n_points=7, reach=12.0)})
    pr = vs["base"].prediction
    assert pr.reason == "the half-budget fit rests on 3 points for 3 parameters"
    assert math.isnan(pr.err) and pr.supported is None and vs["base"].pred_ok is None
    (r,) = _runs("base", BASE, seeds=1, n_points=7, reach=12.0)
    fit, check = _half_check(r, PROTOCOL, cut=PROTOCOL.cut_of(r))
    assert fit.ok and fit.n_points == 3 and check == NO_CHECK


def test_report_json_names_the_seeds_a_leaves_out():
    """A seed fitted on as many points as parameters is left out of A (``A_unusable``) and, though
    its A sits at 1, is not counted censored: per_seed's counts add up to the variant's."""
    from scalerl.analysis.reporting import variant_json
    from scalerl.analysis.verdicts import VariantVerdict
    from scalerl.scaling.sigmoid import SigmoidFit

    fits = {
        "s0": SigmoidFit(A=1.0, B=1.3, C_mid=100.0, R0=0.1, ok=True, n_points=3),
        "s1": SigmoidFit(A=0.62, B=1.9, C_mid=100.0, R0=0.1, ok=True, n_points=9),
    }
    v = VariantVerdict("v", ["s0", "s1"], fitted=2)
    seeds = {s["run_id"]: s for s in variant_json(v, {}, fits)["per_seed"]}
    assert seeds["s0"]["A_unusable"] == "3 points for 3 parameters" and seeds["s0"]["A_censored"] is None
    assert seeds["s1"]["A_unusable"] is None and seeds["s1"]["A_censored"] is None


def test_a_interval_stays_a_pass_rate_and_the_runs_table_s_baseline_is_the_verdicts():
    """A's t-interval over widely spread seeds ends at 0 and 1, not beyond; the runs table's
    A(baseline), which each run's ΔA is taken from, leaves out a seed fitted on 3 points as the
    verdicts' A does."""
    from scalerl.analysis.experiment import choose_baseline
    from scalerl.analysis.verdicts import a_estimate
    from scalerl.scaling.sigmoid import SigmoidFit

    wide = [SigmoidFit(A=a, B=1.5, C_mid=100.0, R0=0.1, ok=True, n_points=9) for a in (0.05, 0.95, 0.5)]
    e = a_estimate(wide, 0.9)
    assert e.lo == 0.0 and e.hi == 1.0 and e.mean == pytest.approx(0.5)
    runs = _runs("base", BASE)
    fits = {
        runs[0].run_id: SigmoidFit(A=0.40, B=1.5, C_mid=100.0, R0=0.1, ok=True, n_points=3),
        runs[1].run_id: SigmoidFit(A=0.60, B=1.5, C_mid=100.0, R0=0.1, ok=True, n_points=9),
        runs[2].run_id: SigmoidFit(A=0.64, B=1.7, C_mid=100.0, R0=0.1, ok=True, n_points=9),
    }
    base = choose_baseline(runs, fits, {r.run_id: "base" for r in runs}, [], "base")
    assert base.fitted == 3 and base.A == pytest.approx(0.62) and base.B == pytest.approx(1.6)


def test_runs_of_different_lengths_compared_as_seeds_are_said_to_be():
    """A variant whose finished runs ended at different steps (a 60-step run beside 200-step ones) is
    still compared as one recipe's seeds, and its verdict says so, with why (other lengths asked
    for, or a run that did not finish its own); a live run is not judged by its length so far."""
    import dataclasses

    short = _runs("v", BASE)
    short[0] = dataclasses.replace(
        short[0], steps=short[0].steps[:7], compute=short[0].compute[:7], reward=short[0].reward[:7]
    )
    asked = [
        dataclasses.replace(r, params={**r.params, "trainer.total_steps": str(r.last_step)}) for r in short
    ]
    vs = _verdicts({"base": _runs("base", BASE), "v": asked})
    assert vs["v"].lengths == [60, 200, 200]
    assert vs["v"].verdict.endswith(
        "(its runs ended at steps 60-200 and are compared as seeds of one recipe, though a shorter run "
        "bounds its ceiling less: give them one trainer.total_steps)"
    )
    assert "its runs ended" not in vs["base"].verdict
    same = [dataclasses.replace(r, params={**r.params, "trainer.total_steps": "200"}) for r in short]
    vs = _verdicts({"base": _runs("base", BASE), "v": same})
    assert vs["v"].verdict.endswith(
        "bounds its ceiling less: the shorter ones did not finish their trainer.total_steps)"
    )
    live = [dataclasses.replace(same[0], status="RUNNING"), *same[1:]]
    vs = _verdicts({"base": _runs("base", BASE), "v": live})
    assert vs["v"].lengths == [200, 200] and "its runs ended" not in vs["v"].verdict


def test_the_exported_margin_A_is_the_one_the_verdicts_use(monkeypatch):
    """One MARGIN_A: the name the package exports (and the figures draw) is the verdicts' object,
    not a second constant of the same value, and the verdicts read it when they call: widening it
    past a 0.12 gap in A leaves that gap uncalled."""
    import scalerl.analysis as analysis
    from scalerl.analysis import experiment, figures
    from scalerl.analysis import verdicts as verdicts_module

    assert analysis.MARGIN_A is verdicts_module.MARGIN_A is figures.MARGIN_A
    assert getattr(experiment, "MARGIN_A", verdicts_module.MARGIN_A) is verdicts_module.MARGIN_A
    groups = {
        "base": _runs("base", BASE),
        "lower": _runs("lower", TrueCurve(0.15, 0.50, 1.9, 1000.0), params={"loss": "dapo"}),
    }
    assert _verdicts(groups)["lower"].called["A"] == -1
    monkeypatch.setattr(verdicts_module, "MARGIN_A", 0.2)
    wide = _verdicts(groups)["lower"]
    assert "A" not in wide.called and wide.dA.significant and abs(wide.dA.delta) <= 0.2, wide.verdict


def test_welch_on_the_pair_does_not_call_what_the_pooled_spread_did():
    """The issue's case: the 2-digit study's B at A=1 of PPO-off-policy (1.00, sd 0.14 over 3 seeds)
    against the baseline's (1.32, sd 0.12), Bonferroni over 7 comparisons: the pooled test (df 16)
    called it; Welch's test on the pair alone gives p = 0.040 > 0.05 / 7, not called."""
    ppo = [1.00 + 0.139 * d for d in (-1, 0, 1)]  # three values m + s * (-1, 0, 1) have sd s
    base = [1.32 + 0.119 * d for d in (-1, 0, 1)]
    c = t_test(ppo, base, 0.05 / 7)
    assert c.p == pytest.approx(0.040, abs=0.002) and c.called == 0 and c.lo < 0 < c.hi


def _exact_runs(variant: str, ceilings: list[float], params=None) -> list[RunData]:
    """One run per seed with the given true ceiling, measured with negligible noise."""
    out = []
    for s, a in enumerate(ceilings):
        curve = TrueCurve(0.15, a, 1.9, 1000.0)
        (r,) = _runs(f"{variant}{s}", curve, seeds=1, trials=10**8, params=params)
        r.run_id, r.run_name = f"{variant}-{s}", f"{variant}-s{s}"
        out.append(r)
    return out


def test_a_noisy_variant_is_judged_by_its_own_spread_not_the_pool():
    """Six variants with tight seeds (sd 0.01) and one as noisy as the 2-digit study's unstable ones
    (sd 0.02), its mean 0.035 above: the spread pooled over the table (the old test; the pair's
    F-ratio 2.1 stayed under the switch to Welch) called its A higher; Welch's test on the pair
    alone does not (p about 0.07 at 3 df against 0.05 / 14)."""
    tight = [0.60, 0.61, 0.62]
    losses = ("dapo", "gspo", "grpo", "ppo", "reinforce", "cispo2")
    groups = {"base": _exact_runs("base", tight)}
    groups |= {v: _exact_runs(v, tight, params={"loss": v}) for v in losses}
    groups["noisy"] = _exact_runs("noisy", [0.625, 0.645, 0.665], params={"loss": "noisy"})
    vs = _verdicts(groups)
    noisy, base = vs["noisy"], vs["base"]
    assert noisy.A.values == pytest.approx([0.625, 0.645, 0.665], abs=1e-3)
    assert noisy.family.m == 14
    ref = stats.ttest_ind(noisy.A.values, base.A.values, equal_var=False)
    assert noisy.dA.p == pytest.approx(ref.pvalue) and noisy.dA.df < 4
    assert "A" not in noisy.called and noisy.dA.p > noisy.dA.alpha, noisy.verdict


def test_a_component_that_cannot_act_here_is_not_scored():
    emulated = {"precision": "bf16", "precision/head_dtype": "bf16 (emulated: fp32 math, rounded)"}
    vs = _verdicts(
        {
            "base": _runs("base", BASE, params={"precision": "fp32_head", "precision/head_dtype": "fp32"}),
            "bf16": _runs("bf16", TrueCurve(0.15, 0.45, 1.9, 1000.0), params=emulated),
        }
    )
    v = vs["bf16"]
    assert v.verdict.startswith("cannot act here: precision") and v.called == {} and not v.scored
    assert v.label == "not run" and vs["base"].label == "baseline"
    assert v.family.m == 0
    gpu = {"precision": "bf16", "precision/head_dtype": "bf16 (native)", "device": "cuda:0"}
    base = _runs("base", BASE, seeds=1, params={"precision": "fp32_head", "device": "cuda:0"})
    assert cannot_act_reason(_runs("v", BASE, seeds=1, params=gpu), base) == ""
    cpu = {"precision": "bf16", "device": "cpu"}
    assert "on CPU" in cannot_act_reason(
        _runs("v", BASE, seeds=1, params=cpu), _runs("b", BASE, seeds=1, params={"device": "cpu"})
    )


@pytest.mark.parametrize(
    "params,activity,expect",
    [
        ({"filter.no_positive_resampling": "False"}, {"retired": 0, "epochs": 3}, "0 retired"),
        ({"filter.no_positive_resampling": "False"}, {"retired": 12, "epochs": 0.4}, "0.40 epochs"),
        ({"filter.no_positive_resampling": "False"}, {"retired": 12, "epochs": 2.5}, ""),
        ({"filter.zero_variance": "False"}, {"zero_variance_groups": 0}, "no zero-variance group"),
        ({"filter.zero_variance": "False"}, {"zero_variance_groups": 5}, ""),
        ({"async_mode.max_lag": "1"}, {"lag_max": 1}, "never exceeded the smaller k=1"),
        ({"async_mode.max_lag": "4"}, {"lag_max": 4}, "never exceeded the smaller k=4"),
        ({"async_mode.max_lag": "4"}, {"lag_max": 6}, ""),
        ({"length_control.name": "length_penalty"}, {"interruptions": 0.0}, "no generation was interrupted"),
        ({"length_control.name": "length_penalty"}, {"interruptions": 0.2}, ""),
        ({"loss": "dapo"}, {}, ""),  # a loss always acts
        ({"filter.zero_variance": "False"}, {}, ""),  # not logged: not flagged
    ],
)
def test_inactive_components(params, activity, expect):
    variant = _runs("v", BASE, seeds=1, params=params, activity=activity)
    base = _runs("base", BASE, seeds=1, activity=activity)
    why = inactive_reason(variant, base)
    assert (expect in why) if expect else why == "", why


def test_inactive_variants_are_flagged_not_scored():
    lazy = {"retired": 0, "epochs": 0.2, "lag_max": 1, "zero_variance_groups": 3}
    vs = _verdicts(
        {
            "base": _runs("base", BASE, activity=lazy),
            # a big gap in A that would be called, but the component never acted
            "no_npr": _runs(
                "no_npr",
                TrueCurve(0.15, 0.45, 1.9, 1000.0),
                params={"filter.no_positive_resampling": "False"},
                activity=lazy,
            ),
        }
    )
    v = vs["no_npr"]
    assert v.verdict.startswith("inactive: no-positive-resampling") and v.called == {}
    assert v.label == "not shown"
    assert "inactive" in verdict_table(list(vs.values()))


def test_the_design_s_resolution_leaves_out_variants_whose_ceiling_is_not_shown():
    """The seeds' spread that describes the design (the detectable ΔA, the equivalence margin it
    resolves) is pooled over the variants whose A is shown. A variant whose seeds' ceilings reach 1
    (A not shown) spreads from a seed at 0.70 to seeds at the bound; counted, it would make the design
    look unable to resolve anything and widen the equivalence margin."""
    groups = {
        "base": _runs("base", BASE),
        "same": _runs("same", TrueCurve(0.15, 0.622, 1.9, 1000.0), params={"loss": "gspo"}),
    }
    wild = _runs("wild", TrueCurve(0.15, 1.0, 1.9, 1000.0), params={"loss": "dapo"})
    lone = _runs("lone", TrueCurve(0.15, 0.70, 1.9, 1000.0), seeds=1, params={"loss": "dapo"})[0]
    wild[0].compute, wild[0].reward = lone.compute, lone.reward  # one seed settles at 0.70
    alone = _verdicts(groups)
    vs = _verdicts({**groups, "wild": wild})
    assert not vs["wild"].A.settled and vs["wild"].A.sd > 0.1  # shown neither as A nor as spread
    pooled = math.sqrt((vs["base"].A.sd ** 2 + vs["same"].A.sd ** 2) / 2)
    fam = vs["base"].family
    assert fam.sd_A == pytest.approx(pooled) and fam.df_sd == 4
    assert fam.sd_A == pytest.approx(alone["base"].family.sd_A) and fam.sd_A < 0.02
    assert fam.eq_resolution == pytest.approx(alone["base"].family.eq_resolution, rel=0.5)


def test_the_prediction_summary_says_why_the_goal_was_missed():
    """Precise, dense curves whose first half reaches past the horizon (budget 12x C_mid) meet the
    half-budget prediction goal; one seed apart from the others, with 512-sample evaluations and 10
    points a run up to 2x C_mid, it is missed, and the summary says by how much and names the window
    that ends before the horizon, the noise of one evaluation, the seeds' spread and the few points
    the fit had. (Before the horizon rule, a budget of 6x C_mid met the goal: its half window, 3x
    C_mid, is now not supported and not counted.)"""
    good = _verdicts(
        {
            "base": _runs("base", BASE, reach=12.0),
            "same": _runs("same", BASE, reach=12.0, params={"loss": "dapo"}),
        }
    )
    text = prediction_summary(list(good.values()))
    assert (
        "2 of 2 supported (the half window past 4.5x its fitted C_mid); 2 of 2 supported within 0.03" in text
    )
    assert "coverage 100% (2 of 2 inside their 90% band, median half-width 0.0" in text
    assert "Skill against persistence" in text and text.endswith(": met."), text
    params = {"eval.num_prompts": "128", "eval.samples_per_prompt": "4"}
    sparse = {
        v: _runs(v, BASE, trials=512, n_points=10, reach=2.0, params={**params, "loss": v})
        for v in ("base", "dapo")
    }
    for i, r in enumerate(sparse["dapo"] + sparse["base"]):
        r.reward = r.reward + 0.06 * (i % 3 - 1)  # the seeds end 0.06 apart
        r.reward[-1] += 0.25  # and the last evaluations jump, out of the band
    vs = list(_verdicts(sparse).values())
    text = prediction_summary(vs)
    assert ": missed by 2 more variants supported and within 0.03" in text, text
    assert "Not supported: 2 of 2, not counted toward the goal" in text and "ends before the horizon" in text
    assert "Why:" in text and "differs between seeds by a median sd of 0.06" in text
    assert "points a seed" in text
    for v in vs:  # a seed's observed end: its evaluations in the last tenth; the noise of 3 seeds' mean
        k = np.mean([end_points(r).size for r in sparse[v.variant]])
        assert k >= 1 and v.final_se == pytest.approx(0.02 / math.sqrt(k), abs=0.003)
        assert v.prediction.noise_sd == pytest.approx(0.012 / math.sqrt(k), abs=0.003)


@pytest.mark.parametrize(
    "curve,shows",
    [
        (TrueCurve(0.15, 1.0, 1.4, 1000.0), "steeper"),  # the shipped study's regime: the ceiling is 1
        (BASE, "higher"),  # a ceiling below 1: the whole budget's fit puts it higher instead
    ],
)
def test_the_prediction_summary_names_curves_that_steepen_after_the_half(curve, shows):
    """Curves whose exponent grows past half the budget (B 1.0, then up to 3.0 at the end): the
    half-budget fits under-estimate every end, and the summary says that the whole budget's fits are
    steeper (or higher) than the first half's. Curves that follow one sigmoid do not get that cause."""

    def steepening(variant, seeds=3):
        out = []
        for r in _runs(variant, curve, seeds=seeds, n_points=20, reach=6.0):
            c = r.compute
            half = c.max() / 2
            b = 1.0 + 2.0 * np.clip((c - half) / (c.max() - half), 0.0, 1.0)
            with np.errstate(divide="ignore"):
                true = curve.R0 + (curve.A - curve.R0) / (1.0 + (curve.C_mid / c) ** b)
            rng = np.random.default_rng(zlib.crc32(r.run_id.encode()))
            r.reward = np.where(c > 0, rng.binomial(2048, true) / 2048, r.reward)
            out.append(r)
        return out

    vs = list(_verdicts({"base": steepening("base"), "dapo": steepening("dapo")}).values())
    assert all(v.pred_err < -0.03 for v in vs), [v.pred_err for v in vs]
    text = prediction_summary(vs)
    assert "the half-budget fits under-estimate the outcome" in text, text
    assert f"the same seeds' curves are {shows} than on its first half" in text, text
    assert "steepen or rise after the half" in text
    plain = prediction_summary(
        list(_verdicts({"base": _runs("base", curve), "same": _runs("same", curve)}).values())
    )
    assert "after the half" not in plain, plain
