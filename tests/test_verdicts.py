"""The per-variant verdicts on synthetic seeded curves (no MLflow, no training; a few seconds):
a difference is called only where the intervals separate, unsettled fits are never called,
inactive components are flagged instead of scored, and the half-budget prediction is reported."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from scalerl.analysis.mlflow_io import RunData
from scalerl.analysis.verdicts import (
    NO_DIFFERENCE,
    Estimate,
    Protocol,
    inactive_reason,
    prediction_summary,
    verdict_table,
    verdicts,
)
from scalerl.scaling.sigmoid import fit_sigmoid
from scalerl.scaling.synthetic import TrueCurve, sample_run

PROTOCOL = Protocol(min_step=10, bootstrap=100, level=0.9)
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


def _verdicts(groups: dict[str, list[RunData]], baseline="base"):
    runs = [r for g in groups.values() for r in g]
    names = {r.run_id: v for v, g in groups.items() for r in g}
    fits = {
        r.run_id: fit_sigmoid(
            r.compute, r.reward, min_compute=PROTOCOL.cut(r), bootstrap=0, drop_nonfinite=True
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
    assert base.verdict == "baseline" and base.fitted == 3
    # per-seed spread and the pooled fit's interval around the truth
    assert abs(base.A.mean - 0.62) < 0.02 and 0 < base.A.sd < 0.02
    assert base.A.lo <= 0.62 <= base.A.hi
    assert lower.called["A"] == -1 and lower.verdict.startswith("A lower")
    assert lower.delta_A == pytest.approx(lower.A.mean - base.A.mean)
    # 0.002 apart: the intervals overlap, nothing is called
    assert same.called == {} and same.verdict.startswith(NO_DIFFERENCE)
    # the prediction from each seed's first half of the compute
    for v in vs.values():
        assert v.pred_n == 3 and abs(v.pred_err) < 0.02 and v.pred_ok is True
    table = verdict_table(list(vs.values()))
    assert table.splitlines()[2].startswith("| base | 3/3 | 0.6") and "A lower" in table


def test_one_noisy_seed_calls_nothing():
    """With one seed of 64-sample evaluations the intervals are wide: a 0.04 gap is not called."""
    vs = _verdicts(
        {
            "base": _runs("base", BASE, seeds=1, trials=64),
            "other": _runs(
                "other", TrueCurve(0.15, 0.58, 1.9, 1000.0), seeds=1, trials=64, params={"loss": "dapo"}
            ),
        }
    )
    other = vs["other"]
    assert math.isnan(other.A.sd)  # one seed: no spread over seeds
    assert other.A.hi - other.A.lo > 0.04 and other.verdict.startswith(NO_DIFFERENCE)


def test_unsettled_fits_are_never_called():
    """Curves still rising at the end of the budget: the interval of A reaches 1, so a variant is
    not called even when its point estimates differ a lot."""
    rising = TrueCurve(0.15, 0.95, 1.5, 1000.0)
    vs = _verdicts(
        {
            "base": _runs("base", rising, reach=0.8),
            "slow": _runs("slow", TrueCurve(0.15, 0.95, 1.5, 3000.0), reach=0.8 / 3, params={"loss": "dapo"}),
        }
    )
    base, slow = vs["base"], vs["slow"]
    assert base.A.hi >= 0.999 and "reaches 1" in base.A.unsettled
    assert not base.B.settled  # B is not scored while A is unsettled
    assert slow.called == {} and slow.verdict.startswith(NO_DIFFERENCE + " (unsettled: ")
    assert "reaches 1" in slow.verdict, slow.verdict


def test_estimate_separation_needs_both_settled():
    a, b = Estimate(0.8, 0.01, 0.78, 0.82), Estimate(0.6, 0.01, 0.58, 0.62)
    assert a.separates(b) == 1 and b.separates(a) == -1
    assert a.separates(Estimate(0.79, 0.01, 0.77, 0.81)) == 0
    assert a.separates(Estimate(0.6, 0.01, 0.58, 0.62, unsettled="A's interval reaches 1")) == 0


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
    assert "inactive" in verdict_table(list(vs.values()))


def test_the_prediction_summary_says_why_the_goal_was_missed():
    """Precise, dense curves meet the half-budget prediction goal; one seed apart from the others,
    with 512-sample evaluations and 10 points a run, it is missed, and the summary names the
    noise of one evaluation, the seeds' spread and the few points the half-budget fit had."""
    good = _verdicts({"base": _runs("base", BASE), "same": _runs("same", BASE, params={"loss": "dapo"})})
    assert prediction_summary(list(good.values())).startswith(
        "Prediction: 2 of 2 variants' final pass rates were predicted within 0.02"
    )
    params = {"eval.num_prompts": "128", "eval.samples_per_prompt": "4"}
    sparse = {
        v: _runs(v, BASE, trials=512, n_points=10, reach=2.0, params={**params, "loss": v})
        for v in ("base", "dapo")
    }
    for i, r in enumerate(sparse["dapo"] + sparse["base"]):
        r.reward = r.reward + 0.06 * (i % 3 - 1)  # the seeds end 0.06 apart
    vs = list(_verdicts(sparse).values())
    text = prediction_summary(vs)
    assert "not met. Why:" in text, text
    assert "standard error of about 0.02" in text  # sqrt(0.3 * 0.7 / 512)
    assert "differs between seeds by a median sd of 0.06" in text
    assert "points a seed" in text
    assert all(v.final_se == pytest.approx(0.021, abs=0.002) for v in vs)
