"""Calibration and power of the verdict test on synthetic leave-one-out sweeps.

    python benchmarks/bench_verdicts.py                      # 100 sweeps per setting (~3 min on 2 cores)
    python benchmarks/bench_verdicts.py --sweeps 40 --trials 2048 --reach 6
    python benchmarks/bench_verdicts.py --json out.json

Each sweep: the nine variants of sweeps/loo.yaml x 3 seeds, every seed the baseline's true sigmoid
(R0 0.15, A 0.62, B 1.9) with its own A (sd 0.015) and C_mid (10%), 20 evaluations up to 4x C_mid,
each a binomial pass rate over the evaluation's samples (default: the repository's eval.num_prompts x
eval.samples_per_prompt) -- :mod:`scalerl.analysis.synthetic`. Settings: a null sweep (no variant
differs), and one variant (dapo) with a ceiling lower by 0.05, 0.10, 0.20. Reported: the share of
sweeps with any call (the family-wise error rate under the null; the table states 5%), the share in
which dapo's A is called lower (the power), calls on the other, truly equal variants, and the
smallest detectable ΔA the report states (median over sweeps).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import numpy as np
from scipy import stats

from scalerl.analysis.synthetic import Design, analyse_sweep, sweep_runs
from scalerl.analysis.verdicts import FAMILY_LEVEL

DELTAS = (0.0, -0.05, -0.10, -0.20)


def run_setting(delta: float, sweeps: int, design: Design, seed: int) -> dict:
    any_call = dapo_lower = others = 0
    mdd = []
    for k in range(sweeps):
        rng = np.random.default_rng([seed, int(round(-delta * 1000)), k])
        vs = analyse_sweep(sweep_runs(rng, design, {"dapo": delta} if delta else None))
        any_call += any(v.called for v in vs)
        dapo_lower += any(v.variant == "dapo" and v.called.get("A") == -1 for v in vs)
        others += any(v.called for v in vs if v.variant != "dapo")
        fam = vs[0].family
        if np.isfinite(fam.mdd_A):
            mdd.append(fam.mdd_A)
    lo, hi = (
        stats.beta.ppf(0.025, dapo_lower, sweeps - dapo_lower + 1) if dapo_lower else 0.0,
        stats.beta.ppf(0.975, dapo_lower + 1, sweeps - dapo_lower) if dapo_lower < sweeps else 1.0,
    )
    return {
        "delta_A": delta,
        "sweeps": sweeps,
        "any_call": any_call / sweeps,
        "dapo_A_lower": dapo_lower / sweeps,
        "dapo_A_lower_95ci": [float(lo), float(hi)],
        "other_variant_called": others / sweeps,
        "mdd_A_median": float(np.median(mdd)) if mdd else float("nan"),
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
    ap.add_argument("--seed-sd-a", type=float, default=0.015)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kw = {"trials": args.trials} if args.trials else {}
    design = Design(seeds=args.seeds, n_points=args.points, reach=args.reach, seed_sd_A=args.seed_sd_a, **kw)
    t0 = time.time()
    rows = [run_setting(d, args.sweeps, design, args.seed) for d in DELTAS]
    took = time.time() - t0
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"# Verdict calibration ({time.strftime('%Y-%m-%d')}, commit {sha})\n")
    print(
        f"Machine: {platform.node()} ({os.cpu_count()} CPUs), load average {os.getloadavg()[0]:.2f}; "
        f"{took:.0f} s for {len(DELTAS) * args.sweeps} sweeps.\n"
    )
    print(f"Design: {design}; stated family-wise level {FAMILY_LEVEL:.0%}.\n")
    print("| true ΔA of dapo | sweeps | any variant called | dapo's A called lower [95% CI] "
          "| another variant called | stated smallest detectable ΔA (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["dapo_A_lower_95ci"]
        print(
            f"| {r['delta_A']:+.2f} | {r['sweeps']} | {r['any_call']:.0%} | {r['dapo_A_lower']:.0%} "
            f"[{lo:.0%}, {hi:.0%}] | {r['other_variant_called']:.0%} | {r['mdd_A_median']:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"design": design.__dict__, "rows": rows, "seconds": took}, fh, indent=1)


if __name__ == "__main__":
    main()
