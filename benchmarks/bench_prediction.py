"""The half-budget predictor and its horizon rule, measured on synthetic curves and on real runs.

    python benchmarks/bench_prediction.py                 # ~1 min on 2 cores
    python benchmarks/bench_prediction.py --reps 48 --json out.json

What it measures (issue 53, items 3 and 5), each at the leave-one-out study's design (sweeps/loo.yaml:
180 steps, an evaluation every 9, 768 samples each, 3 seeds, the early cut at step 10; compute = the
step) with the report's own predictor (:func:`scalerl.analysis.verdicts.predict_variant`):

1. **Shape error against reach** on curves whose local exponent rises
   (:class:`~scalerl.scaling.synthetic.RisingCurve`: the measured case, 1.15 to 2.23 at 2.56x C_mid,
   fitted to the 2-digit runs below, and five variations of it), C_mid moved so that the half
   window ends at 1.5-6.5x C_mid: the mean error (the bias), its sd and rms per reach. The tables
   of :mod:`scalerl.scaling.horizon` come from here and from 3.
2. **True sigmoids** (C_mid 20-45 steps, B 1.1-1.6, A 0.85-1, R0 0.3-0.45, the seeds' A sd 0.01
   and C_mid 10%): mean error, share within 0.03, band coverage and half-width, skill against
   persistence.
3. **The real 2-digit runs** evaluated to 360 steps (3 seeds,
   benchmarks/results/2026-11-29_9842746_stability-2digit.json): the pooled fit of the seeds over
   steps 18..k predicts the seeds' mean at 2k, for k = 54..180: reach, horizon verdict, error, band,
   persistence's error. And the ceiling design's baseline (``sweeps/loo_ceiling.yaml``, early cut
   at step 108) run to 1440 steps (3 seeds, an evaluation every 36,
   benchmarks/results/2026-12-02_ca71813_ceiling-4x.json): the same, for k = 180..720 (k = 360 is
   that design at a 720-step budget).
4. **Where supported** (long budgets: the half window at 4.5-8x C_mid), sigmoids and rising curves
   with the band: coverage, median half-width, share within 0.03.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import common
import numpy as np

from scalerl.analysis.mlflow_io import RunData
from scalerl.analysis.synthetic import study_runs
from scalerl.analysis.verdicts import PRED_TOLERANCE, predict_variant
from scalerl.scaling.horizon import HORIZON
from scalerl.scaling.protocol import FitProtocol
from scalerl.scaling.synthetic import RisingCurve, TrueCurve

MEASURED = dict(B=1.15, B_late=2.23, rise_at=2.56, width=0.074)
"""The rising curve fitted to the real 2-digit runs' mean (R0 0.40, A 1, C_mid 39 steps; rmse 0.009)."""
SHAPES = {
    "measured": MEASURED,
    "rise at 2.0x": {**MEASURED, "rise_at": 2.0},
    "rise at 3.2x": {**MEASURED, "rise_at": 3.2},
    "late 2.6": {**MEASURED, "B_late": 2.6},
    "late 1.8": {**MEASURED, "B_late": 1.8},
    "wide rise": {**MEASURED, "width": 0.3},
}
C_MIDS = (60, 45, 36, 30, 26, 23, 20, 18, 15, 12)  # steps: the half window (90 steps) at 1.5-7.5x
REAL = Path(__file__).parent / "results" / "2026-11-29_9842746_stability-2digit.json"
CEILING = Path(__file__).parent / "results" / "2026-12-02_ca71813_ceiling-4x.json"


def _seeds(make, rng, cmid, a=1.0, sd_log_cmid=0.05):
    return [
        make(min(1.0, a + rng.normal(0, 0.01)), cmid * math.exp(rng.normal(0, sd_log_cmid))) for _ in range(3)
    ]


def shape_error(reps: int, rng) -> list[dict]:
    p = FitProtocol(bootstrap=0)
    rows = []
    for name, shape in SHAPES.items():
        for cmid in C_MIDS:
            errs, reach = [], []
            for _ in range(reps):
                curves = _seeds(lambda a, c, shape=shape: RisingCurve(0.4, a, C_mid=c, **shape), rng, cmid)
                pr, _ = predict_variant(study_runs(curves, rng), p)
                errs.append(pr.err)
                reach.append(pr.reach)
            e = np.array(errs)
            rows.append(
                dict(
                    shape=name,
                    c_mid=cmid,
                    reach=float(np.nanmedian(reach)),
                    bias=float(np.nanmean(e)),
                    sd=float(np.nanstd(e)),
                    rms=float(np.sqrt(np.nanmean(e**2))),
                )
            )
    return rows


def _f(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else "-"


def _summary(preds) -> dict:
    e = np.array([p.err for p in preds])
    banded = [p for p in preds if p.inside is not None]
    sup = [p for p in banded if p.supported]
    return dict(
        coverage_supported=float(np.mean([p.inside for p in sup])) if sup else math.nan,
        half_width_supported=float(np.median([p.half_width for p in sup])) if sup else math.nan,
        n=len(preds),
        supported=sum(bool(p.supported) for p in preds),
        mean_err=float(np.mean(e)),
        within=float(np.mean(np.abs(e) <= PRED_TOLERANCE)),
        coverage=float(np.mean([p.inside for p in banded])) if banded else math.nan,
        half_width=float(np.median([p.half_width for p in banded])) if banded else math.nan,
        beats_persistence=float(np.mean([p.skill > 0 for p in preds])),
        skill=float(np.nanmedian([p.skill for p in preds])),
    )


def sigmoids(reps: int, rng, cmid_range=(20, 45)) -> dict:
    p = FitProtocol()
    preds = []
    for _ in range(reps):
        cmid = float(np.exp(rng.uniform(*np.log(cmid_range))))
        b, a, r0 = rng.uniform(1.1, 1.6), rng.uniform(0.85, 1.0), rng.uniform(0.3, 0.45)
        curves = _seeds(lambda a_, c, r0=r0, b=b: TrueCurve(r0, a_, b, c), rng, cmid, a=a, sd_log_cmid=0.1)
        preds.append(predict_variant(study_runs(curves, rng), p)[0])
    return _summary(preds)


def rising(reps: int, rng, cmid_range) -> dict:
    p = FitProtocol()
    preds = []
    for _ in range(reps):
        cmid = float(np.exp(rng.uniform(*np.log(cmid_range))))
        curves = _seeds(lambda a, c: RisingCurve(0.4, a, C_mid=c, **MEASURED), rng, cmid, sd_log_cmid=0.1)
        preds.append(predict_variant(study_runs(curves, rng), p)[0])
    return _summary(preds)


def real_runs(path: Path = REAL, setting: str = "d2", ks=range(54, 181, 9), min_step: int = 10) -> list[dict]:
    """The pooled fit over the seeds' steps up to k (from ``min_step``, the protocol's early cut) of
    the runs recorded in ``path`` predicting their mean at 2k (the report's predictor on the runs
    cut at 2k)."""
    seeds = json.loads(path.read_text())["settings"][setting]["seeds"]
    rows = []
    for k in ks:
        runs = []
        for i, s in enumerate(seeds):
            st = np.array(s["steps"], dtype=float)
            keep = st <= 2 * k
            y = np.array(s["pass_rate"], dtype=float)[keep]
            runs.append(
                RunData(
                    f"s{i}",
                    f"s{i}",
                    "FINISHED",
                    "0",
                    {"eval.num_prompts": "192", "eval.samples_per_prompt": "4"},
                    {},
                    "steps",
                    st[keep],
                    st[keep],
                    y,
                )
            )
        pr, fit = predict_variant(runs, FitProtocol(min_step=min_step))
        rows.append(
            dict(
                window_end=k,
                reach=pr.reach,
                supported=pr.supported,
                predicted=pr.predicted,
                observed=pr.observed,
                err=pr.err,
                lo=pr.lo,
                hi=pr.hi,
                inside=pr.inside,
                persistence_err=pr.persistence - pr.observed,
                skill=pr.skill,
            )
        )
    return rows


def _real_table(rows: list[dict]) -> None:
    print(
        "| k | reach | supported | predicted | observed | error | band | inside | persistence's error | skill |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['window_end']} | {_f(r['reach'], '.2f')} | {r['supported']} | {_f(r['predicted'], '.3f')} | "
            f"{_f(r['observed'], '.3f')} | {_f(r['err'], '+.3f')} | [{_f(r['lo'], '.3f')}, {_f(r['hi'], '.3f')}] | "
            f"{r['inside']} | {_f(r['persistence_err'], '+.3f')} | {_f(r['skill'], '+.2f')} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=24, help="replicates per setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    out: dict = {"reps": a.reps, "seed": a.seed, "horizon": HORIZON}
    out["shape_error"] = shape_error(a.reps, rng)
    print("## 1. Shape error against reach (rising exponent; bootstrap 0)\n")
    print("| shape | C_mid (steps) | reach (median) | bias | sd | rms |\n|---|---|---|---|---|---|")
    for r in out["shape_error"]:
        print(
            f"| {r['shape']} | {r['c_mid']} | {r['reach']:.2f} | {r['bias']:+.3f} | {r['sd']:.3f} | {r['rms']:.3f} |"
        )
    out["sigmoids"] = sigmoids(a.reps * 5, rng)
    out["supported_sigmoids"] = sigmoids(a.reps * 2, rng, cmid_range=(11, 20))
    out["supported_rising"] = rising(a.reps * 2, rng, cmid_range=(11, 20))
    out["unsupported_rising"] = rising(a.reps * 2, rng, cmid_range=(30, 45))
    print("\n## 2 and 4. Predictions at the study's design (the band with bootstrap 200)\n")
    print(
        "| curves | n | supported | mean error | within 0.03 | coverage | median half-width | coverage, supported "
        "| median half-width, supported | beats persistence | median skill |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, label in (
        ("sigmoids", "true sigmoids, C_mid 20-45 steps"),
        ("supported_sigmoids", "true sigmoids, C_mid 11-20 steps"),
        ("supported_rising", "rising exponent, C_mid 11-20 steps"),
        ("unsupported_rising", "rising exponent, C_mid 30-45 steps"),
    ):
        s = out[key]
        print(
            f"| {label} | {s['n']} | {s['supported']} | {s['mean_err']:+.4f} | {s['within']:.0%} | "
            f"{s['coverage']:.0%} | {s['half_width']:.3f} | {_f(s['coverage_supported'], '.0%')} | "
            f"{_f(s['half_width_supported'], '.3f')} | {s['beats_persistence']:.0%} | {s['skill']:+.2f} |"
        )
    out["real"] = real_runs()
    print("\n## 3. The real 2-digit runs (3 seeds to 360 steps): fit over steps 18..k, predicting 2k\n")
    _real_table(out["real"])
    out["real_ceiling"] = real_runs(CEILING, "ceiling_4x", range(180, 721, 36), min_step=108)
    print(
        "\n## 3b. The ceiling design's baseline (sweeps/loo_ceiling.yaml, 3 seeds to 1440 steps, an evaluation "
        "every 36): fit over steps 108..k, predicting 2k (k = 360: the design at a 720-step budget)\n"
    )
    _real_table(out["real_ceiling"])
    out["wall_s"] = round(time.time() - t0, 1)
    out["commit"] = common.commit()
    out["machine"] = common.machine()
    out["load_avg"] = common.loadavg()
    print(f"\nwall {out['wall_s']} s, commit {out['commit']}, load {out['load_avg']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
