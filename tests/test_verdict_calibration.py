"""Would a miscalibrated verdict be caught? Synthetic leave-one-out sweeps with a known truth
(:mod:`scalerl.analysis.synthetic`: nine variants at the repository's evaluation size, with the
seed-to-seed spread of A the real studies measured: sd 0.03, twice that for the two variants whose
seeds spread most, :data:`~scalerl.analysis.synthetic.MEASURED_SD_A`), logged to a real MLflow
sqlite store in the training runs' data contract and analysed through the same function as the
in-memory bulk: where every variant shares the baseline's true curve, no variant may be called in
more sweeps than the stated family-wise level allows (at the study's 3 seeds); a ceiling 0.20 lower
must be called in most sweeps (at 5 seeds: Welch's test on a pair of 3 seeds at this spread finds
it in about a third of the sweeps, benchmarks/bench_verdicts.py); the equivalence test shows equal
ceilings equivalent and does not call ceilings 0.05 apart equivalent. (The power at 0.10 is measured
by benchmarks/bench_verdicts.py, not here.)"""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import stats

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402

from scalerl.analysis import FitProtocol, ReportInput, load_runs, report  # noqa: E402
from scalerl.analysis.synthetic import (  # noqa: E402
    BASELINE,
    MEASURED_NOISY,
    MEASURED_SD_A,
    Design,
    analyse_sweep,
    log_sweep,
    sweep_runs,
)
from scalerl.analysis.verdicts import FAMILY_LEVEL, INCONCLUSIVE, family_summary  # noqa: E402
from scalerl.scaling.synthetic import TrueCurve  # noqa: E402

N_NULL = 30
N_WORSE = 10
STUDY = Design(seeds=3, seed_sd_A=MEASURED_SD_A, noisy=MEASURED_NOISY)
"""The shipped study's 3 seeds with the measured spread of A."""
POWERED = Design(seeds=5, seed_sd_A=MEASURED_SD_A, noisy=MEASURED_NOISY)
"""5 seeds at the measured spread: what finds a 0.20 lower ceiling in most sweeps under Welch's test."""


def _called(vs) -> list[str]:
    return [f"{v.variant}: {v.verdict}" for v in vs if v.called]


@pytest.mark.slow
def test_the_mlflow_path_and_the_in_memory_path_give_the_same_verdicts(tmp_path):
    """Two sweeps (one null, one with dapo's ceiling 0.20 lower) logged as training runs log them,
    read back with load_runs: the verdicts equal those of the same runs analysed in memory, every
    component counts as active (the activity metrics were read), and dapo is called lower. The
    report of the logged 27 runs draws the verdict figures, and no one-line-per-run figure."""
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    for k, deltas in enumerate((None, {"dapo": -0.20})):
        runs = sweep_runs(np.random.default_rng([7, k]), POWERED, deltas=deltas)
        log_sweep(client, f"syn{k}", runs, artifact_location=str(tmp_path / f"art{k}"))
        loaded = load_runs(client, f"syn{k}")
        assert len(loaded) == len(runs) == 45
        memory, logged = analyse_sweep(runs), analyse_sweep(loaded)
        assert [(v.variant, v.verdict) for v in memory] == [(v.variant, v.verdict) for v in logged]
        assert logged[0].variant == BASELINE and all(v.scored for v in logged[1:])
        if deltas:
            dapo = next(v for v in logged if v.variant == "dapo")
            assert dapo.called.get("A") == -1, dapo.verdict
            rep = report(
                loaded,
                tmp_path / "report",
                ReportInput(baseline=BASELINE, protocol=FitProtocol(bootstrap=20)),
            )
            names = {f.name for f in rep.files}
            assert {"variants.png", "forest.png", "calibration.png", "linearised.png"} <= names, names
            assert "scaling_curves.png" not in names and not list((tmp_path / "report").glob("*.error.txt"))
            assert "| dapo | 5/5 | " in rep.markdown and "family-wise level 5%" in rep.markdown


@pytest.mark.slow  # 30 synthetic sweeps of 27 fits each: a calibration study, not a unit test
def test_null_sweeps_call_no_more_than_the_stated_family_wise_level():
    """Every variant shares the baseline's true curve: the share of sweeps with any call is at most
    the stated level plus a binomial tolerance, and at least 90% of the sweeps call nothing: at the
    study's 3 seeds with the measured spread, two variants twice as noisy as the rest (where a spread
    pooled over the variants called too often)."""
    hits = []
    for k in range(N_NULL):
        vs = analyse_sweep(sweep_runs(np.random.default_rng([1, k]), STUDY))
        assert vs[0].family.m == 16  # 8 scored variants, A and B each
        if _called(vs):
            hits.append((k, _called(vs)))
        else:  # what a reader sees instead: A shown equivalent, or the design's resolution
            for v in vs[1:]:
                assert v.label in ("equivalent", "inconclusive") and "smallest detectable ΔA = " in v.verdict
                assert v.verdict.startswith(
                    "equivalent: A equivalent within ±" if v.dA.equivalent else INCONCLUSIVE
                )
    allowed = int(stats.binom.ppf(0.99, N_NULL, FAMILY_LEVEL))
    assert len(hits) <= min(allowed, 0.1 * N_NULL), hits


@pytest.mark.slow  # 10 synthetic sweeps of 27 fits each
def test_a_clearly_worse_variant_is_called_lower():
    """dapo's true ceiling 0.20 below the baseline's, 5 seeds at the measured spread: its A is called
    lower in most sweeps, and the truly equal variants stay uncalled in almost all of them."""
    lower, others = 0, 0
    for k in range(N_WORSE):
        vs = analyse_sweep(sweep_runs(np.random.default_rng([2, k]), POWERED, deltas={"dapo": -0.20}))
        dapo = next(v for v in vs if v.variant == "dapo")
        lower += dapo.called.get("A") == -1
        others += any(v.called for v in vs if v.variant != "dapo")
    assert lower >= 0.8 * N_WORSE, lower
    assert others <= 1, others


def test_censored_seeds_are_kept_but_not_called_and_the_summary_states_the_resolution():
    """A design that ends before the curves bend (0.6 x C_mid) leaves A at 1 in most seeds: those
    seeds stay in the mean at their fitted value (censored at 1, counted), the ceilings are "not
    shown", no A is compared (the baseline's ceiling reaches 1, so efficiency is compared at A = 1
    instead) and nothing is called in this null sweep; the summary names the test, its level and the
    smallest detectable ΔA."""
    rising = TrueCurve(0.15, 0.95, 1.2, 2.0e17)
    runs = sweep_runs(np.random.default_rng(3), Design(reach=0.6, seed_sd_A=0.0), base=rising)
    vs = analyse_sweep(runs, bootstrap=50)
    assert not vs[0].A.settled and "seeds censored at 1" in vs[0].A.unsettled
    assert vs[0].family.at_max and vs[0].family.A_fixed == 1.0
    for v in vs[1:]:
        assert not v.called and not v.dA.tested, v.verdict
        assert v.A.n == len(v.run_ids) and 2 * v.A.censored >= v.A.n  # every seed kept, most censored
    text = family_summary(analyse_sweep(sweep_runs(np.random.default_rng(4))))
    assert "Bonferroni over 16 comparisons" in text and "family-wise level 5%" in text
    # Welch's test on a pair of 3 seeds (about 4 df, not the pool's 18) resolves only about 0.14 at
    # this spread (0.024), and equivalence only within ±0.13: more than ±0.05, so the margin is 0.05
    assert "smallest detectable ΔA at 3 seeds per variant and 80% power: 0.1" in text, text
    assert "Welch's t-test on each pair" in text and "equivalence on A (TOST" in text and "±0.050" in text


SOLVED = TrueCurve(0.15, 1.0, 1.9, 2.0e17)
"""A task the policy learns to solve: the true ceiling is the pass rate's maximum."""


@pytest.mark.slow  # 30 synthetic sweeps of 27 fits with bootstrap intervals each
def test_where_the_ceilings_reach_1_null_sweeps_call_no_more_than_the_stated_level():
    """Every variant on the baseline's solved curve: the baseline's ceiling reaches 1 in almost every
    sweep, so B is compared at A = 1 (the family is B alone) and A is never compared; the share of
    sweeps with any call stays within the stated family-wise level."""
    hits, at_max = [], 0
    for k in range(N_NULL):
        vs = analyse_sweep(
            sweep_runs(np.random.default_rng([5, k]), Design(seed_sd_A=0.0), base=SOLVED), bootstrap=20
        )
        at_max += vs[0].family.at_max
        if vs[0].family.at_max:
            assert vs[0].family.m == 8 and not any(v.dA.tested for v in vs)
        if _called(vs):
            hits.append((k, _called(vs)))
    assert at_max >= 0.9 * N_NULL, at_max
    allowed = int(stats.binom.ppf(0.99, N_NULL, FAMILY_LEVEL))
    assert len(hits) <= min(allowed, 0.1 * N_NULL), hits


@pytest.mark.slow  # 10 synthetic sweeps of 27 fits with bootstrap intervals each
def test_where_the_ceilings_reach_1_a_clearly_less_efficient_variant_is_called():
    """dapo's true B 30% below the baseline's on the same solved task: called lower at A = 1 in most
    sweeps; the equal variants stay uncalled in almost all of them."""
    lower, others = 0, 0
    for k in range(N_WORSE):
        runs = sweep_runs(
            np.random.default_rng([6, k]), Design(seed_sd_A=0.0), base=SOLVED, b_factors={"dapo": 0.7}
        )
        vs = analyse_sweep(runs, bootstrap=20)
        dapo = next(v for v in vs if v.variant == "dapo")
        lower += dapo.called.get("B") == -1
        others += any(v.called for v in vs if v.variant != "dapo")
    assert lower >= 0.8 * N_WORSE, lower
    assert others <= 1, others


TWO = {"scalerl": {}, "dapo": {"loss": "dapo"}}
N_EQ = 20
EQ_DESIGN = Design(seeds=16, seed_sd_A=MEASURED_SD_A)
"""Two variants, 16 seeds each at the measured spread (the fitted A's spread 0.02-0.05 with the fit's
own noise): enough seeds that the design resolves equivalence within about ±0.04 (at 10 seeds the
margin often reaches its ±0.05 cap, and equivalence is shown in only about half the sweeps)."""


@pytest.mark.slow  # 2 x 20 sweeps of 32 fits each
def test_equivalence_on_A_is_shown_for_equal_ceilings_and_not_for_ceilings_0_05_apart():
    """TOST on A at the table's margin (the smallest this design resolves at 80% power, within
    [0.02, 0.05]): two variants with the same true ceiling are shown equivalent in most sweeps (about
    the stated power); ceilings 0.05 apart (outside every margin the table may use) are called
    equivalent in no more sweeps than the per-test level allows."""
    same = apart = 0
    margins = []
    for k in range(N_EQ):
        vs = analyse_sweep(sweep_runs(np.random.default_rng([8, k]), EQ_DESIGN, variants=TWO))
        dapo = vs[1]
        margins.append(dapo.family.eq_margin)
        same += dapo.label == "equivalent"
        vs = analyse_sweep(
            sweep_runs(np.random.default_rng([9, k]), EQ_DESIGN, {"dapo": -0.05}, variants=TWO)
        )
        apart += vs[1].dA.equivalent
    assert all(0.02 <= m <= 0.05 for m in margins) and max(margins) > 0.02, margins
    assert same >= 0.6 * N_EQ, same
    allowed = int(stats.binom.ppf(0.99, N_EQ, FAMILY_LEVEL / 2))
    assert apart <= allowed, apart
