"""Calibration and power of the verdict test on synthetic leave-one-out sweeps.

    python benchmarks/bench_verdicts.py                      # 100 sweeps per setting (~3 min on 2 cores)
    python benchmarks/bench_verdicts.py --seeds 5            # the seeds Welch's test needs at the measured spread
    python benchmarks/bench_verdicts.py --sweeps 40 --trials 2048 --reach 6
    python benchmarks/bench_verdicts.py --json out.json
    python benchmarks/bench_verdicts.py --solved             # a task the policy solves: B compared at A = 1

Each sweep: the nine variants of sweeps/loo.yaml x 3 seeds, every seed the baseline's true sigmoid
(R0 0.15, A 0.62, B 1.9) with its own A and C_mid (10%), 20 evaluations up to 4x C_mid, each a
binomial pass rate over the evaluation's samples (default: the repository's eval.num_prompts x
eval.samples_per_prompt) -- :mod:`scalerl.analysis.synthetic`. The seeds' spread of A is the one the
real studies measured (sd 0.03; 0.06 for PPO-off-policy and no-zero-variance-filter, the variants
whose seeds spread most: :data:`~scalerl.analysis.synthetic.MEASURED_SD_A`); ``--seed-sd-a 0.015
--no-noisy`` is the paper's 0.015 for all. Settings: a null sweep (no variant differs), and one
variant (dapo) with a ceiling lower by 0.05, 0.10, 0.20. Reported: the share of sweeps with any call
(the family-wise error rate under the null; the table states 5%), the share in which dapo's A is
called lower (the power), calls on the other, truly equal variants, the smallest detectable ΔA the
report states (median over sweeps), and the equivalence test: the share of the truly equal variants
shown "equivalent" on A, and the table's equivalence margin (median).

``--solved``: the task is learnt to a pass rate of 1 (true A = 1 for every seed, as on the embedded
default), so the baseline's ceiling reaches 1, A is not compared and B is compared at A = 1 (fits
with bootstrap intervals, which that decision needs); dapo's true B is the baseline's times 1, 0.9,
0.8, 0.7. Reported the same way for B, with the smallest detectable ΔB the report states.
"""

from __future__ import annotations

import argparse
import json
import time

import common
import numpy as np
from scipy import stats

from scalerl.analysis.synthetic import MEASURED_NOISY, MEASURED_SD_A, Design, analyse_sweep, sweep_runs
from scalerl.analysis.verdicts import FAMILY_LEVEL
from scalerl.scaling.synthetic import TrueCurve

DELTAS = (0.0, -0.05, -0.10, -0.20)
B_FACTORS = (1.0, 0.9, 0.8, 0.7)
SOLVED = TrueCurve(R0=0.15, A=1.0, B=1.9, C_mid=2.0e17)
SOLVED_BOOTSTRAP = 20


def run_setting(delta: float, sweeps: int, design: Design, seed: int, solved: bool = False) -> dict:
    """``delta``: dapo's ΔA, or with ``solved`` its factor on B."""
    any_call = dapo_lower = others = at_max = 0
    mdd, equivalent, margins = [], [], []
    key = "B" if solved else "A"
    for k in range(sweeps):
        if solved:
            rng = np.random.default_rng([seed, 7, int(round(delta * 1000)), k])
            runs = sweep_runs(rng, design, base=SOLVED, b_factors={"dapo": delta})
            vs = analyse_sweep(runs, bootstrap=SOLVED_BOOTSTRAP)
        else:
            rng = np.random.default_rng([seed, int(round(-delta * 1000)), k])
            vs = analyse_sweep(sweep_runs(rng, design, {"dapo": delta} if delta else None))
        any_call += any(v.called for v in vs)
        equal = [v for v in vs if v.scored and v.variant != "dapo"]
        equivalent.append(sum(v.label == "equivalent" for v in equal) / max(len(equal), 1))
        if np.isfinite(vs[0].family.eq_margin):
            margins.append(vs[0].family.eq_margin)
        dapo_lower += any(v.variant == "dapo" and v.called.get(key) == -1 for v in vs)
        others += any(v.called for v in vs if v.variant != "dapo")
        fam = vs[0].family
        at_max += fam.at_max
        m = fam.mdd_B if solved else fam.mdd_A
        if np.isfinite(m):
            mdd.append(m)
    lo, hi = (
        stats.beta.ppf(0.025, dapo_lower, sweeps - dapo_lower + 1) if dapo_lower else 0.0,
        stats.beta.ppf(0.975, dapo_lower + 1, sweeps - dapo_lower) if dapo_lower < sweeps else 1.0,
    )
    return {
        ("B_factor" if solved else "delta_A"): delta,
        "sweeps": sweeps,
        "any_call": any_call / sweeps,
        f"dapo_{key}_lower": dapo_lower / sweeps,
        f"dapo_{key}_lower_95ci": [float(lo), float(hi)],
        "other_variant_called": others / sweeps,
        f"mdd_{key}_median": float(np.median(mdd)) if mdd else float("nan"),
        "baseline_at_max": at_max / sweeps,
        "equal_shown_equivalent": float(np.mean(equivalent)) if equivalent else float("nan"),
        "eq_margin_median": float(np.median(margins)) if margins else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=100)
    ap.add_argument(
        "--trials", type=int, default=None, help="samples per evaluation (default: the repo's eval)"
    )
    ap.add_argument("--reach", type=float, default=4.0, help="budget / C_mid")
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed-sd-a", type=float, default=MEASURED_SD_A)
    ap.add_argument("--no-noisy", action="store_true", help="every variant at --seed-sd-a (no noisier pair)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--solved", action="store_true", help="true A = 1: B compared at A = 1")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kw = {"trials": args.trials} if args.trials else {}
    sd_a = 0.0 if args.solved else args.seed_sd_a
    noisy = () if args.no_noisy or args.solved else MEASURED_NOISY
    design = Design(
        seeds=args.seeds, n_points=args.points, reach=args.reach, seed_sd_A=sd_a, noisy=noisy, **kw
    )
    t0 = time.time()
    settings = B_FACTORS if args.solved else DELTAS
    rows = [run_setting(d, args.sweeps, design, args.seed, args.solved) for d in settings]
    took = time.time() - t0
    print(f"# Verdict calibration ({time.strftime('%Y-%m-%d')}, commit {common.commit()})\n")
    print(
        f"Machine: {common.machine()}, load average {common.load()}; "
        f"{took:.0f} s for {len(settings) * args.sweeps} sweeps.\n"
    )
    print(f"Design: {design}; stated family-wise level {FAMILY_LEVEL:.0%}.\n")
    if args.solved:
        print(
            f"The baseline's true curve reaches 1 ({SOLVED}); fits with {SOLVED_BOOTSTRAP} bootstrap "
            "resamples; B compared at A = 1 where the baseline's ceiling reaches 1.\n"
        )
    key, name = ("B", "dapo's true B / the baseline's") if args.solved else ("A", "true ΔA of dapo")
    print(f"| {name} | sweeps | baseline's ceiling reaches 1 | any variant called | dapo's {key} called lower "
          f"[95% CI] | another variant called | stated smallest detectable Δ{key} (median) "
          "| equal variants shown equivalent on A | equivalence margin (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r[f"dapo_{key}_lower_95ci"]
        d = r["B_factor"] if args.solved else r["delta_A"]
        print(
            f"| {d:{'.2f' if args.solved else '+.2f'}} | {r['sweeps']} | {r['baseline_at_max']:.0%} | "
            f"{r['any_call']:.0%} | {r[f'dapo_{key}_lower']:.0%} [{lo:.0%}, {hi:.0%}] | "
            f"{r['other_variant_called']:.0%} | {r[f'mdd_{key}_median']:.3f} | "
            f"{r['equal_shown_equivalent']:.0%} | {r['eq_margin_median']:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"design": design.__dict__, "rows": rows, "seconds": took}, fh, indent=1)


if __name__ == "__main__":
    main()
