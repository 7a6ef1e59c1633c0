"""Sigmoid scaling-curve fits on synthetic curves with known parameters (seeded, CPU, ~10 s)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl.scaling import (
    DEFAULT_METHOD,
    FitProtocol,
    SigmoidFit,
    _solvers,
    fit_fixed_A,
    fit_sigmoid,
    fit_sigmoid_runs,
    linearised,
    plot_fit,
    plot_linearised,
)
from scalerl.scaling.horizon import HORIZON
from scalerl.scaling.live import FIT_LEVEL, evaluation_fits, final_report, fit_metrics
from scalerl.scaling.sigmoid import (
    PAPER_GRID_A,
    PAPER_GRID_C_MID,
    _grid_b_curve_fit,
    early_cutoff,
    round_sig,
    round_to,
)
from scalerl.scaling.synthetic import TrueCurve, random_curve, sample_run

# Validation noise of 256 prompts x 8 samples per evaluation (binomial over 2048 trials).
TRIALS = 2048
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(rng, *, reach_lo=4.0, reach_hi=8.0, n_lo=25, n_hi=41, trials=TRIALS):
    curve = random_curve(rng)
    c, y = sample_run(
        curve,
        rng,
        reach=float(rng.uniform(reach_lo, reach_hi)),
        trials=trials,
        n_points=int(rng.integers(n_lo, n_hi)),
    )
    return curve, c, y


# ------------------------------------------------------------------------------------------------
# Exactness and API
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["direct", "grid"])
def test_noiseless_curve_is_recovered(method):
    truth = TrueCurve(R0=0.2, A=0.61, B=1.92, C_mid=2542.0)
    c = np.linspace(0, 8 * truth.C_mid, 33)
    fit = fit_sigmoid(c, truth(c), method=method, bootstrap=0)
    assert fit.ok, fit.reason
    tol_a = 1e-4 if method == "direct" else 0.005  # the grid's A step
    assert fit.A == pytest.approx(truth.A, abs=tol_a)
    assert fit.R0 == pytest.approx(0.2)
    assert fit.B == pytest.approx(truth.B, rel=1e-3 if method == "direct" else 0.1)
    assert fit.C_mid == pytest.approx(truth.C_mid, rel=1e-3 if method == "direct" else 0.1)
    assert np.allclose(fit.predict(c), truth(c), atol=1e-4 if method == "direct" else 6e-3)


def test_compute_units_do_not_matter():
    rng = np.random.default_rng(5)
    truth, c, y = _run(rng)
    f1 = fit_sigmoid(c, y, bootstrap=0)
    f2 = fit_sigmoid(c * 1e18, y, bootstrap=0)  # FLOPs instead of GPU-hours
    assert f2.A == pytest.approx(f1.A, abs=1e-6)
    assert f2.B == pytest.approx(f1.B, rel=1e-5)
    assert f2.C_mid == pytest.approx(f1.C_mid * 1e18, rel=1e-5)


def test_r0_and_min_compute_bookkeeping():
    truth = TrueCurve(R0=0.1, A=0.7, B=1.5, C_mid=100.0)
    c = np.linspace(0, 600, 31)
    y = truth(c)
    fit = fit_sigmoid(c, y, min_compute=100.0, bootstrap=0)
    assert fit.ok
    assert fit.R0 == pytest.approx(0.1)  # the step-0 evaluation
    assert fit.excluded[0] == "start point (R0)"
    below = [i for i, why in fit.excluded.items() if why == "below min_compute"]
    assert below == [i for i in range(1, 31) if c[i] < 100.0]
    assert fit.n_points == int(fit.used.sum()) == 31 - 1 - len(below)
    assert fit.min_compute == 100.0
    # A given r0 replaces the step-0 value; C = 0 points are still never fitted.
    fit2 = fit_sigmoid(c, y, r0=0.12, bootstrap=0)
    assert fit2.R0 == 0.12 and not fit2.used[0] and fit2.n_points == 30


def test_metrics_ci_and_band():
    rng = np.random.default_rng(11)
    truth, c, y = _run(rng)
    fit = fit_sigmoid(c, y, bootstrap=100, level=0.8)
    m = fit.to_metrics()
    expected = {
        "A",
        "B",
        "C_mid",
        "R0",
        "A_lo",
        "A_hi",
        "B_lo",
        "B_hi",
        "C_mid_lo",
        "C_mid_hi",
        "n_points",
        "ok",
    }
    assert {f"fit/{k}" for k in expected} <= set(m)
    assert all(isinstance(v, float) for v in m.values())
    assert m["fit/ok"] == 1.0 and m["fit/n_points"] == fit.n_points
    for k in ("A", "B", "C_mid"):
        lo, hi = fit.ci[k]
        assert lo <= getattr(fit, k) <= hi
    assert fit.R0 <= fit.ci["A"][0] and fit.ci["A"][1] <= 1.0
    grid = np.geomspace(c[1], 2 * c[-1], 20)
    lo, hi = fit.predict_band(grid)
    mid = fit.predict(grid)
    assert np.all(lo <= mid + 1e-9) and np.all(mid <= hi + 1e-9)
    lo95, hi95 = fit.predict_band(grid, level=0.95)
    assert np.all(hi95 - lo95 >= hi - lo - 1e-12)
    assert fit.to_metrics(prefix="x/")["x/A"] == round(fit.A, 3)
    assert "A=" in fit.summary()


def test_metrics_are_rounded_to_what_the_data_supports():
    fit = SigmoidFit(A=0.99999999999, B=1.234567, C_mid=12345.678, R0=0.1 + 1e-16, ok=True, rmse=0.0123456)
    fit.ci = {"A": (0.97512345, 1.0), "B": (0.81234, 2.0004), "C_mid": (1000.4, 99999.9)}
    m = fit.to_metrics()
    assert m["fit/A"] == 1.0 and m["fit/R0"] == 0.1 and m["fit/A_lo"] == 0.975
    assert m["fit/B"] == 1.23 and m["fit/B_lo"] == 0.812 and m["fit/C_mid"] == 12300.0
    assert m["fit/rmse"] == 0.0123
    assert round_to(1.1e-16) == 0.0 and str(round_to(-1e-17)) == "0.0"
    assert math.isnan(round_sig(math.nan)) and round_sig(0.0) == 0.0


def test_early_cutoff_is_absolute_and_the_same_for_every_run():
    steps = np.array([0, 10, 20, 30, 40])
    fast, slow = np.array([0.0, 1, 2, 3, 4]), np.array([0.0, 2, 4, 6, 8])
    # by step: each run's own compute at step 20, so both runs lose steps 10 (and 0 for R0)
    assert early_cutoff(steps, fast, min_step=20) == 2.0
    assert early_cutoff(steps, slow, min_step=20) == 4.0
    # by compute: the same absolute number for both (not a fraction of each budget)
    assert early_cutoff(steps, fast, min_compute=3.0) == early_cutoff(steps, slow, min_compute=3.0) == 3.0
    assert early_cutoff(steps, slow, min_step=20, min_compute=5.0) == 5.0
    assert early_cutoff(steps, fast, min_step=50) == math.inf  # no evaluation that late: all cut
    # the pooled fit takes one cut per run
    rng = np.random.default_rng(3)
    curve = random_curve(rng)
    runs = [sample_run(curve, rng, reach=6.0, trials=TRIALS, n_points=12) for _ in range(2)]
    cuts = [float(r[0][3]) for r in runs]
    fit = fit_sigmoid_runs(runs, min_compute=cuts, bootstrap=0)
    assert fit.ok and sum("below min_compute" in why for why in fit.excluded.values()) == 4
    with pytest.raises(ValueError, match="2 runs"):
        fit_sigmoid_runs(runs, min_compute=[1.0], bootstrap=0)


def test_grid_with_the_papers_ranges():
    c = np.array([0.0, 500, 1000, 2000, 4000, 8000, 16000])
    truth = dict(r0=0.2, A=0.62, B=1.9, C_mid=2500.0)
    y = truth["r0"] + (truth["A"] - truth["r0"]) / (1 + (truth["C_mid"] / np.maximum(c, 1e-9)) ** truth["B"])
    fit = fit_sigmoid(c, y, method="grid", grid_A=PAPER_GRID_A, grid_C_mid=PAPER_GRID_C_MID, bootstrap=0)
    a_grid = np.arange(0.45, 0.8 + 1e-9, 0.005)
    c_grid = np.linspace(100, 40000, 100)
    # A and C_mid are grid values; the closest grid pair to the truth wins
    assert np.min(np.abs(a_grid - fit.A)) < 1e-9 and abs(fit.A - 0.62) <= 0.005
    assert np.min(np.abs(c_grid - fit.C_mid)) < 1e-6 * fit.C_mid
    assert abs(fit.C_mid - 2500.0) <= 404.0
    with pytest.raises(ValueError, match="grid_A"):
        fit_sigmoid(c, y, method="grid", grid_A=(0.9, 0.5, 0.005))


def test_unknown_method_and_bad_level_raise():
    c, y = np.arange(5.0), np.array([0.1, 0.3, 0.4, 0.5, 0.55])
    with pytest.raises(ValueError, match="unknown method"):
        fit_sigmoid(c, y, method="lbfgs")
    with pytest.raises(ValueError, match="level"):
        fit_sigmoid(c, y, level=1.5)


def test_default_method_is_direct():
    # benchmarks/bench_fit.py: direct recovers A at least as well as the grid, ~15x faster.
    assert DEFAULT_METHOD == "direct"


# ------------------------------------------------------------------------------------------------
# Degenerate input: never raises, ok=False with a reason, NaN parameters
# ------------------------------------------------------------------------------------------------

DEGENERATE = {
    "too few points": ([0, 1, 2], [0.1, 0.2, 0.3], "points to fit"),
    "flat": (np.linspace(0, 10, 20), np.full(20, 0.3), "flat or falling"),
    "falling": (np.linspace(0, 10, 20), np.linspace(0.5, 0.2, 20), "flat or falling"),
    "nan": ([0, 1, 2, 3, 4], [0.1, 0.2, math.nan, 0.4, 0.5], "NaN"),
    "negative compute": ([-1, 1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5], "compute must be >= 0"),
    "no positive compute": ([0, 0, 0, 0], [0.1, 0.2, 0.3, 0.4], "points to fit"),
    "mismatched lengths": ([0, 1, 2, 3], [0.1, 0.2], "different lengths"),
    "empty": ([], [], "no points"),
    "not a pass rate": ([0, 1, 2, 3], [0.1, 0.5, 1.5, 0.6], "pass rates"),
    "not numbers": (["a", "b"], [0.1, 0.2], "non-numeric"),
    "2-D": ([[1, 2], [3, 4]], [0.1, 0.2, 0.3, 0.4], "1-D"),
}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_degenerate_input_gives_a_reason(name):
    c, y, needle = DEGENERATE[name]
    for fit in (fit_sigmoid(c, y), fit_fixed_A(c, y, 0.6), fit_sigmoid_runs([(c, y), (c, y)])):
        assert isinstance(fit, SigmoidFit)
        assert fit.ok is False
        assert fit.reason
        assert math.isnan(fit.A) and math.isnan(fit.B) and math.isnan(fit.C_mid)
        assert np.isnan(fit.predict([1.0, 2.0])).all()
        assert fit.to_metrics()["fit/ok"] == 0.0
        assert math.isnan(fit.to_metrics()["fit/A"])
    assert needle in fit_sigmoid(c, y).reason


def test_nan_points_can_be_dropped():
    truth = TrueCurve(0.2, 0.6, 2.0, 100.0)
    c = np.linspace(0, 600, 25)
    y = truth(c)
    y[7] = math.nan
    assert not fit_sigmoid(c, y).ok
    fit = fit_sigmoid(c, y, drop_nonfinite=True, bootstrap=0)
    assert fit.ok and fit.excluded[7] == "not finite"
    assert fit.A == pytest.approx(0.6, abs=1e-4)


def test_fixed_A_outside_range():
    truth = TrueCurve(0.2, 0.6, 2.0, 100.0)
    c = np.linspace(0, 600, 25)
    fit = fit_fixed_A(c, truth(c), A=0.1)  # below R0
    assert not fit.ok and "fixed A" in fit.reason


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.floats(-1, 1e6), st.just(0.0), st.just(math.nan)),
            st.one_of(st.floats(-0.1, 1.1), st.just(math.nan)),
        ),
        max_size=12,
    ),
    st.sampled_from(["direct", "grid"]),
)
def test_fit_never_raises_on_data(points, method):
    c = [p[0] for p in points]
    y = [p[1] for p in points]
    fit = fit_sigmoid(c, y, method=method, bootstrap=5, drop_nonfinite=True)
    assert isinstance(fit.ok, bool)
    if fit.ok:
        assert fit.R0 <= fit.A <= 1.0
        assert fit.B > 0 and fit.C_mid > 0
    else:
        assert fit.reason and math.isnan(fit.A)


# ------------------------------------------------------------------------------------------------
# Accuracy on noisy synthetic runs
# ------------------------------------------------------------------------------------------------


def test_A_recovered_within_002_in_90_percent():
    """Data to 4-8x C_mid, 25-40 evaluations, 2048-trial binomial noise: |A - A_true| <= 0.02."""
    rng = np.random.default_rng(0)
    errs = []
    for _ in range(80):
        truth, c, y = _run(rng)
        fit = fit_sigmoid(c, y, bootstrap=0)
        assert fit.ok, fit.reason
        assert fit.R0 <= fit.A <= 1.0 and fit.B > 0
        errs.append(abs(fit.A - truth.A))
    frac = float(np.mean(np.array(errs) <= 0.02))
    assert frac >= 0.9, f"A within 0.02 in only {frac:.0%} of cases"


def test_grid_method_recovers_A():
    rng = np.random.default_rng(0)
    errs = []
    for _ in range(25):
        truth, c, y = _run(rng)
        fit = fit_sigmoid(c, y, method="grid", bootstrap=0)
        assert fit.ok and fit.method == "grid"
        errs.append(abs(fit.A - truth.A))
    assert float(np.mean(np.array(errs) <= 0.02)) >= 0.8


def test_prediction_from_half_the_budget():
    """Fit on the first half (reaching 4-6x C_mid), predict the reward at the full budget."""
    rng = np.random.default_rng(0)
    errs = []
    for _ in range(80):
        truth = random_curve(rng)
        half = float(rng.uniform(4, 6))
        c, y = sample_run(truth, rng, reach=2 * half, trials=TRIALS, n_points=int(rng.integers(30, 41)))
        first = c <= c.max() / 2
        fit = fit_sigmoid(c[first], y[first], bootstrap=0)
        errs.append(abs(float(fit.predict(c.max())) - float(truth(c.max()))))
    frac = float(np.mean(np.array(errs) <= 0.02))
    assert frac >= 0.9, f"prediction within 0.02 in only {frac:.0%} of cases"


def test_bootstrap_interval_for_A_is_calibrated():
    rng = np.random.default_rng(3)
    hits = 0
    n = 80
    for i in range(n):
        truth, c, y = _run(rng, n_lo=20)
        fit = fit_sigmoid(c, y, bootstrap=200, level=0.9, seed=i)
        lo, hi = fit.ci["A"]
        hits += lo <= truth.A <= hi
    cover = hits / n
    assert 0.8 <= cover <= 0.97, f"90% interval covers A in {cover:.0%} of cases"


def test_fixed_A_recovers_B():
    rng = np.random.default_rng(7)
    rel = []
    for _ in range(30):
        truth, c, y = _run(rng)
        fit = fit_fixed_A(c, y, truth.A)
        assert fit.ok and fit.fixed_A and fit.A == truth.A
        rel.append(abs(fit.B / truth.B - 1))
    rel = np.array(rel)
    assert np.median(rel) < 0.05
    assert np.mean(rel < 0.15) >= 0.9


def test_fixed_A_bootstrap_keeps_A():
    rng = np.random.default_rng(8)
    truth, c, y = _run(rng)
    fit = fit_fixed_A(c, y, truth.A, bootstrap=50)
    assert fit.ci["A"] == (truth.A, truth.A)
    assert fit.ci["B"][0] <= fit.B <= fit.ci["B"][1]


def test_pooled_seeds():
    rng = np.random.default_rng(4)
    truth = TrueCurve(0.15, 0.62, 1.8, 2000.0)
    runs = [sample_run(truth, rng, reach=6, trials=TRIALS) for _ in range(3)]
    pooled = fit_sigmoid_runs(runs, bootstrap=100)
    assert pooled.ok
    assert pooled.n_points == sum(len(c) - 1 for c, _ in runs)
    assert set(np.unique(pooled.run_index)) == {0, 1, 2}
    assert pooled.R0 == pytest.approx(np.mean([y[0] for _, y in runs]))
    assert abs(pooled.A - truth.A) <= 0.02
    assert pooled.ci["A"][0] <= pooled.A <= pooled.ci["A"][1]
    single = fit_sigmoid(*runs[0], bootstrap=0)
    assert abs(pooled.A - truth.A) <= abs(single.A - truth.A) + 0.01


def test_pooled_seeds_kept_bootstrap_holds_these_seeds_not_others():
    """With the seeds resampled, the bootstrap of a pooled fit holds seed-to-seed variation (seeds
    whose ceilings lie 0.06 apart give A a wide interval, R0 re-drawn); with ``resample_runs=False``
    every seed is kept once and only residuals are redrawn: R0 stays the seeds' mean and A's
    interval is that of these seeds' mean curve, narrower than the spread between them."""
    rng = np.random.default_rng(5)
    runs = [
        sample_run(TrueCurve(0.15 + d / 3, 0.62 + d, 1.8, 2000.0), rng, reach=6, trials=TRIALS)
        for d in (-0.06, 0.0, 0.06)
    ]
    seeds = fit_sigmoid_runs(runs, bootstrap=200)
    kept = fit_sigmoid_runs(runs, bootstrap=200, resample_runs=False)
    assert seeds.A == kept.A and seeds.B == kept.B  # the point fit is the same
    assert np.ptp(seeds.boot[:, 3]) > 0.01 and np.all(kept.boot[:, 3] == kept.R0)
    width = {k: f.ci["A"][1] - f.ci["A"][0] for k, f in (("seeds", seeds), ("kept", kept))}
    assert width["kept"] < width["seeds"] / 2, width
    assert kept.ci["A"][0] <= kept.A <= kept.ci["A"][1]


def test_linearised_is_line_of_slope_B():
    truth = TrueCurve(0.2, 0.6, 1.7, 300.0)
    c = np.linspace(0, 2000, 30)
    fit = fit_sigmoid(c, truth(c), bootstrap=0)
    logc, logf = linearised(fit)
    assert logc.size > 10
    assert np.allclose(logf, fit.B * logc, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# Internals: the vectorised grid inner fit equals scipy's curve_fit
# ------------------------------------------------------------------------------------------------


def test_vectorised_B_fit_matches_curve_fit():
    rng = np.random.default_rng(2)
    truth, c, y = _run(rng)
    x, yy = np.log(c[1:]), y[1:]
    aa = rng.uniform(truth.A - 0.03, min(truth.A + 0.1, 1.0), 30)
    uu = np.log(truth.C_mid) + rng.uniform(-0.7, 0.7, 30)
    b_vec, s_vec = _solvers.fit_b_batched(x, yy, y[0], aa, uu, 0.1, 10.0)
    b_cf, s_cf = _grid_b_curve_fit(x, yy, y[0], aa, uu)
    assert np.all(s_vec <= s_cf * (1 + 1e-6) + 1e-12)
    assert np.allclose(b_vec, b_cf, rtol=2e-3)


# ------------------------------------------------------------------------------------------------
# Live refits, plots, speed
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "compute,reward,method",
    [
        ([0, 1, 2], [0.1, 0.2, 0.3], "direct"),
        ([0, 1, 2, 3, 4], [0.1, math.nan, 0.3, 0.4, 0.5], "direct"),
        (None, "x", "direct"),
        ([], [], "grid"),
    ],
)
def test_fit_metrics_never_raises(compute, reward, method):
    # (an unknown method no longer reaches a fit: FitProtocol rejects it, tests/test_fit_protocol.py)
    fit, metrics = fit_metrics(compute, reward, FitProtocol(method=method, min_step=1, bootstrap=10))
    assert isinstance(fit, SigmoidFit)
    assert "fit/A" in metrics and "fit/ok" in metrics


def test_fit_metrics_and_final_report(tmp_path):
    rng = np.random.default_rng(9)
    truth, c, y = _run(rng)
    steps = np.arange(c.size) * 10
    fit, metrics = fit_metrics(c, y, FitProtocol(min_step=30, method="direct", bootstrap=50), steps=steps)
    # the cut is the compute of the first evaluation at step >= 30: steps 10 and 20 are left out
    assert fit.ok and fit.min_compute == c[3]
    assert sorted(fit.excluded) == [0, 1, 2]
    assert metrics["fit/A"] == round(fit.A, 3) and abs(metrics["fit/A"] - fit.A) <= 5e-4
    png = tmp_path / "run" / "scaling_curve.png"
    protocol = FitProtocol(
        extrapolate=2.0, method="direct", min_step=0, min_compute=0.1 * c.max(), bootstrap=50
    )
    fit2, metrics2 = final_report(c, y, protocol, out_png=png)
    assert png.read_bytes()[:8] == PNG_MAGIC
    # a pass rate, rounded to what the data resolve (0.001) as the fit's other pass rates are
    assert metrics2["fit/pred_at_2x"] == round(float(fit2.predict(2 * c.max())), 3)
    # A failing fit still writes a plot of the points and returns NaN metrics.
    fit3, metrics3 = final_report(
        [0, 1], [0.1, 0.2], FitProtocol(min_step=0, extrapolate=2.0), out_png=tmp_path / "bad.png"
    )
    assert not fit3.ok and math.isnan(metrics3["fit/A"]) and (tmp_path / "bad.png").exists()


def test_a_runs_evaluations_are_fitted_per_domain_and_the_final_fit_draws_each_curve(tmp_path):
    """The live fit of a run's evaluations: the pass rate under fit/, each task=multi domain under
    fit/<domain>/ (a domain with fewer than 4 points is not fitted); the final one draws each curve."""
    from omegaconf import OmegaConf

    rng = np.random.default_rng(11)
    _, c, y = _run(rng)
    evals = [
        {"step": 10 * i, "device_hours": float(ci), "pass_rate": float(yi)}
        for i, (ci, yi) in enumerate(zip(c, y))
    ]
    for e in evals:
        e["pass_rate/math"] = e["pass_rate"] * 0.9
    evals[-1]["pass_rate/code"] = 0.3  # one point: no fit
    scaling = OmegaConf.create(
        {
            "compute_axis": "device_hours",
            "min_step": 0,
            "min_compute": 0.0,
            "method": "direct",
            "bootstrap": 20,
        }
        | {"grid_A": None, "grid_C_mid": None, "extrapolate": 2.0}
    )
    protocol = FitProtocol.from_config(scaling)
    metrics, figures = evaluation_fits(evals, protocol, domains=["math", "code"])
    assert metrics["fit/ok"] == 1.0 and metrics["fit/math/ok"] == 1.0 and figures == []
    assert not any(k.startswith("fit/code/") for k in metrics)
    _, direct = fit_metrics(
        c, y, FitProtocol(min_step=0, bootstrap=20, level=FIT_LEVEL), steps=[e["step"] for e in evals]
    )
    assert metrics["fit/A"] == direct["fit/A"] and metrics["fit/B"] == direct["fit/B"]
    final, figures = evaluation_fits(evals, protocol, domains=["math", "code"], out_dir=tmp_path)
    assert sorted(p.name for p in figures) == ["scaling_curve.png", "scaling_curve_math.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in figures) and "fit/pred_at_2x" in final
    # too few points: nothing, and no error
    assert evaluation_fits(evals[:3], protocol) == ({}, [])


def test_each_domains_curve_is_judged_by_the_fall_rule_on_its_own_share_of_the_samples():
    """task=multi: the live fit judges each domain's curve by the fall rule with that domain's own
    samples of an evaluation (``domain_trials``); a domain without them is judged by the horizon
    rule alone (its fall not judged). A domain that falls by 0.25 inside the window is not
    supported where its share of the samples makes the fall 3 standard errors; the same fall on
    a handful of samples is noise."""
    c = np.linspace(1.0, 40.0, 24)
    rise = 0.2 + 0.75 / (1 + (4.0 / c) ** 2.0)
    evals = [{"step": i, "flops": float(x), "pass_rate": float(y)} for i, (x, y) in enumerate(zip(c, rise))]
    for i, e in enumerate(evals):
        e["pass_rate/math"] = e["pass_rate"]
        e["pass_rate/code"] = e["pass_rate"] - (0.25 if 12 <= i < 16 else 0.0)  # a fall, then back
    protocol = FitProtocol(min_step=0, bootstrap=0, compute_axis="flops")
    alone, _ = evaluation_fits(evals, protocol, domains=["math", "code"], trials=512.0)
    assert math.isfinite(alone["fit/fall_se"]) and math.isnan(alone["fit/code/fall"])
    assert alone["fit/code/reach"] > HORIZON and alone["fit/code/supported"] == 1.0  # the horizon alone
    shares = {"math": 256.0, "code": 256.0}
    judged, _ = evaluation_fits(evals, protocol, domains=["math", "code"], trials=512.0, domain_trials=shares)
    # from the running maximum (step 11) to the first point of the fall (step 12): the rise between
    # them is taken off the 0.25
    fall = 0.25 - (rise[12] - rise[11])
    assert judged["fit/code/fall"] == pytest.approx(fall, abs=1e-4) and judged["fit/code/fall_se"] > 3
    assert judged["fit/code/supported"] == 0.0 and judged["fit/math/supported"] == 1.0
    assert judged["fit/math/fall"] < 0.01 and math.isfinite(judged["fit/math/fall_se"])
    few, _ = evaluation_fits(
        evals, protocol, domains=["math", "code"], trials=512.0, domain_trials={"math": 4.0, "code": 4.0}
    )
    assert few["fit/code/fall_se"] < 3


def _edges_blank(png) -> bool:
    """Nothing drawn touches the image's border: no legend or label was cut off by its edge."""
    from matplotlib.image import imread

    img = imread(png)[..., :3]
    border = np.concatenate(
        [
            img[:2].reshape(-1, 3),
            img[-2:].reshape(-1, 3),
            img[:, :2].reshape(-1, 3),
            img[:, -2:].reshape(-1, 3),
        ]
    )
    return bool((border > 0.98).all())


def test_plots(tmp_path):
    rng = np.random.default_rng(10)
    fits = []
    for i in range(3):
        truth, c, y = _run(rng)
        fits.append((f"run{i}", fit_sigmoid(c, y, min_compute=0.1 * c.max(), bootstrap=30)))
    fits.append(("broken", fit_sigmoid([0, 1, 2], [0.1, 0.1, 0.1])))
    p = plot_fit(tmp_path / "curves.png", fits, extrapolate=2.0, log_x=True, title="t")
    assert p.read_bytes()[:8] == PNG_MAGIC
    assert _edges_blank(p)
    # three runs with points left out: four legend entries, placed below the axes, none clipped
    p = plot_fit(tmp_path / "three.png", fits[:3], extrapolate=4.0)
    assert _edges_blank(p)
    p = plot_fit(tmp_path / "lin_x.png", fits[0][1], log_x=False)
    assert p.read_bytes()[:8] == PNG_MAGIC and _edges_blank(p)
    mean_a = float(np.mean([f.A for _, f in fits[:3]]))
    fixed = {name: fit_fixed_A(f.compute, f.reward, mean_a) for name, f in fits[:3]}
    p = plot_linearised(tmp_path / "linearised.png", fixed)
    assert p.read_bytes()[:8] == PNG_MAGIC
