"""The per-pair Welch test's real level at 2-3 seeds, where the two sides' spreads differ.

    python benchmarks/bench_welch_level.py                 # ~2 min on 2 cores
    python benchmarks/bench_welch_level.py --draws 100000 --json out.json

The verdicts (:mod:`scalerl.analysis.verdicts`) test each variant against the baseline with Welch's
t-test on the pair's per-seed values, at the per-test level ``FAMILY_LEVEL / m`` (m = 16 for the
shipped leave-one-out study: A and B of 8 scored variants). Welch's degrees of freedom are
estimated from the seeds themselves; with 2-3 seeds a side that estimate is noisy, and the test is
known to be liberal in the far tail when one side is much noisier than the other. This measures,
with the project's own :func:`~scalerl.analysis.verdicts.t_test` on normal draws:

- the size of the difference test (share of draws called, no true difference) against its level,
  by the ratio of the two sides' true standard deviations and their seeds (3 v 3; 2 v 3, a variant
  that lost a run; 3 v 2);
- the size of the equivalence test (TOST: share shown equivalent when the true difference is the
  margin itself);
- the power at equal spreads, by the true difference in standard deviations;
- the spread ratios the shipped ceiling studies' reports show (``benchmarks/results/*ceiling-study*
  _report.json``: each stable variant's seeds' A against the baseline's), and how far they exceed
  what equal true spreads give at 3 seeds (log of a ratio of two 2-df sample sds: sd 0.907).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
import time
from pathlib import Path

import common
import numpy as np

from scalerl.analysis.verdicts import FAMILY_LEVEL, t_test

RATIOS = (1.0, 2.0, 3.0, 5.0, 10.0)
SEEDS = ((3, 3), (2, 3), (3, 2))  # (variant, baseline): the variant's sd is ratio x the baseline's
EQUAL_SD_LOG_RATIO = math.pi / math.sqrt(12)  # sd of 0.5 log F(2, 2): two 3-seed sds, equal truths


def size(
    rng, n_v: int, n_b: int, ratio: float, alpha: float, draws: int, delta: float = 0.0, eq: float = math.nan
):
    """Share of draws called (difference test) and shown equivalent (TOST at ``eq``)."""
    called = equivalent = 0
    for _ in range(draws):
        x = rng.standard_normal(n_v) * ratio + delta
        y = rng.standard_normal(n_b)
        c = t_test(x, y, alpha, 0.0, eq)
        called += c.called != 0
        equivalent += bool(c.equivalent)
    return called / draws, equivalent / draws


def measured_ratios(root: Path) -> dict:
    """log(sd of a variant's seeds' A / sd of the baseline's) over the shipped ceiling studies'
    stable variants (3 fitted seeds each, none at 1), and its spread against equal truths'."""
    logs, by = [], {}
    for f in sorted(glob.glob(str(root / "*ceiling-study*_report.json"))):
        if "-360" in f or "cap2" in f:  # designs whose baseline A was not bounded
            continue
        doc = json.loads(Path(f).read_text())
        base = next(v for v in doc["variants"] if v["baseline"])
        b = [s["A"] for s in base["per_seed"] if s.get("ok")]
        if len(b) < 3 or statistics.stdev(b) <= 0:
            continue
        for v in doc["variants"]:
            a = [s["A"] for s in v["per_seed"] if s.get("ok")]
            if v["baseline"] or len(a) < 3 or max(a) >= 0.999:
                continue
            lr = math.log(statistics.stdev(a) / statistics.stdev(b))
            logs.append(lr)
            by.setdefault(v["variant"], []).append(lr)
    return {
        "pairs": len(logs),
        "log_ratio_sd": statistics.stdev(logs) if len(logs) > 1 else None,
        "log_ratio_sd_if_equal": EQUAL_SD_LOG_RATIO,
        "geometric_mean_ratio": {k: math.exp(statistics.fmean(v)) for k, v in sorted(by.items())},
        "pairs_per_variant": {k: len(v) for k, v in sorted(by.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=20000, help="draws per setting")
    ap.add_argument(
        "--tests", type=int, default=16, help="m: the family's comparisons (16: the shipped study)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    alpha = FAMILY_LEVEL / args.tests
    t0 = time.time()
    rows = []
    for n_v, n_b in SEEDS:
        for ratio in RATIOS:
            # the equivalence margin at 5 baseline sds: a true difference on it, the TOST's worst case
            called, _ = size(rng, n_v, n_b, ratio, alpha, args.draws)
            _, eq = size(rng, n_v, n_b, ratio, alpha, args.draws, delta=5.0, eq=5.0)
            rows.append({"seeds": f"{n_v} v {n_b}", "ratio": ratio, "size": called, "tost_size": eq})
            print(
                f"{n_v} v {n_b} seeds, sd ratio {ratio:>4g}: difference test {called / alpha:.2f} x its level, "
                f"TOST {eq / alpha:.2f} x",
                flush=True,
            )
    power = []
    for d in (4.0, 6.0, 8.0, 10.0, 14.0):
        called, _ = size(rng, 3, 3, 1.0, alpha, args.draws // 4, delta=d)
        power.append({"delta_sd": d, "power": called})
        print(f"3 v 3 seeds, equal spreads, true difference {d:g} sd: called in {called:.0%}", flush=True)
    real = measured_ratios(Path(__file__).parent / "results")
    # the shipped table's A tests under the null, each variant at its measured spread ratio: the
    # share of tables with any A called, against the A half of the family's budget (8 x alpha)
    ratios = list(real["geometric_mean_ratio"].values())
    tables = args.draws // 4
    anyc = sum(
        any(t_test(rng.standard_normal(3) * r, base, alpha).called for r in ratios)
        for base in (rng.standard_normal(3) for _ in range(tables))
    )
    real["null_tables"] = tables
    real["null_any_A_called"] = anyc / tables
    real["null_A_budget"] = len(ratios) * alpha
    print(
        f"null tables of {len(ratios)} A tests at those ratios: any called in {anyc / tables:.2%} "
        f"(their share of the family's level: {len(ratios) * alpha:.2%})",
        flush=True,
    )
    print(
        f"shipped ceiling studies: {real['pairs']} variant/baseline pairs, sd of log(sd ratio) "
        f"{real['log_ratio_sd']:.3f} (equal true spreads give {EQUAL_SD_LOG_RATIO:.3f}); geometric mean "
        "ratio by variant: " + ", ".join(f"{k} {v:.2f}" for k, v in real["geometric_mean_ratio"].items())
    )
    out = {
        "alpha": alpha,
        "tests": args.tests,
        "draws": args.draws,
        "rows": rows,
        "power": power,
        "measured": real,
        "seconds": time.time() - t0,
        "environment": common.environment(),
        "load": common.loadavg(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
