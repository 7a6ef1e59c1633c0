"""Benchmark of the sigmoid scaling fit: speed, accuracy, extrapolation error, CI coverage.

    python benchmarks/bench_fit.py                 # full run (~3 min on 2 cores), Markdown tables
    python benchmarks/bench_fit.py --cases 30      # quicker, noisier percentages
    python benchmarks/bench_fit.py --json out.json # also write the numbers as JSON
    python benchmarks/bench_fit.py --mlflow        # also time the CLI end to end on a sqlite store

Synthetic runs: true (R0, A, B, C_mid) drawn with R0 in [0.05, 0.3], A in [max(0.45, R0 + 0.2), 0.85],
B in [1, 2.5] (the paper's range and a bit beyond); 30 evenly spaced evaluations plus the step-0 one,
each a binomial pass rate over `trials` samples (512 = 128 prompts x 4; 2048 = 256 prompts x 8;
16000 = the paper's 1000 prompts x 16).  Seeded: the same cases for every method.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np

from scalerl.scaling import fit_sigmoid
from scalerl.scaling.synthetic import random_curve, sample_run

TRIALS = (512, 2048, 16000)


def _cases(n, seed, **kw):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        curve = random_curve(rng)
        out.append((curve, *sample_run(curve, rng, **kw)))
    return out


def bench_timing(repeats: int = 20) -> dict:
    """One run (30 points + step 0) with 200 bootstrap resamples; a 9-run sweep analysis."""
    from scalerl.analysis.experiment import analyse_runs
    from scalerl.analysis.mlflow_io import RunData
    from scalerl.scaling import FitProtocol

    rng = np.random.default_rng(0)
    curve = random_curve(rng)
    c, y = sample_run(curve, rng, reach=6.0, trials=2048)
    out = {}
    for method in ("direct", "grid"):
        fit_sigmoid(c, y, method=method, bootstrap=200)  # warm up
        ts = []
        for i in range(repeats):
            t = time.perf_counter()
            fit_sigmoid(c, y, method=method, bootstrap=200, seed=i)
            ts.append(time.perf_counter() - t)
        out[f"one_fit_boot200_{method}_s"] = float(np.median(ts))
        t = time.perf_counter()
        for _ in range(repeats):
            fit_sigmoid(c, y, method=method, bootstrap=0)
        out[f"one_fit_noboot_{method}_s"] = (time.perf_counter() - t) / repeats

    runs = []
    for i in range(9):
        cv = random_curve(rng)
        cc, yy = sample_run(cv, rng, reach=6.0, trials=2048)
        runs.append(
            RunData(
                f"id{i}",
                f"run{i}",
                "FINISHED",
                "0",
                {"loss": f"l{i % 3}"},
                {},
                "flops",
                np.arange(cc.size) * 10,  # a step per 10: the default early cut (step 10) drops step 0 only
                cc,
                yy,
            )
        )
    t = time.perf_counter()
    res = analyse_runs(runs, FitProtocol(bootstrap=200))
    # fits + CIs + half-budget checks + fixed-A refits + verdicts
    out["sweep9_fits_s"] = time.perf_counter() - t
    from scalerl.scaling.plot import plot_fit, plot_linearised

    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        for r in runs:
            plot_fit(Path(d) / f"{r.run_id}.png", [(r.run_name, res.fits[r.run_id])])
        plot_fit(Path(d) / "all.png", [(r.run_name, res.fits[r.run_id]) for r in runs])
        plot_linearised(Path(d) / "lin.png", [(r.run_name, res.fixed_fits[r.run_id]) for r in runs])
        out["sweep9_plots_s"] = time.perf_counter() - t
    return out


def bench_accuracy(n: int) -> list[dict]:
    """|A_fit - A_true| for each method, noise level and reach (data up to reach x C_mid)."""
    rows = []
    for trials in TRIALS:
        for reach in (4.0, 8.0):
            cases = _cases(n, 1, reach=reach, trials=trials)
            for method in ("direct", "grid"):
                errs = np.array(
                    [abs(fit_sigmoid(c, y, method=method, bootstrap=0).A - cv.A) for cv, c, y in cases]
                )
                errs = np.nan_to_num(errs, nan=1.0)
                rows.append(
                    {
                        "trials": trials,
                        "reach": reach,
                        "method": method,
                        "within_0.02": float(np.mean(errs <= 0.02)),
                        "median_err": float(np.median(errs)),
                        "p90_err": float(np.quantile(errs, 0.9)),
                    }
                )
    return rows


def bench_extrapolation(n: int) -> list[dict]:
    """Fit on the first half of the compute (reaching `half` x C_mid), predict at the full budget."""
    rows = []
    for trials in TRIALS:
        for half in (1.0, 2.0, 4.0):
            cases = _cases(n, 2, reach=2 * half, trials=trials)
            for method in ("direct", "grid"):
                errs = []
                for cv, c, y in cases:
                    k = c <= c.max() / 2
                    fit = fit_sigmoid(c[k], y[k], method=method, bootstrap=0)
                    errs.append(abs(float(fit.predict(c.max())) - float(cv(c.max()))) if fit.ok else 1.0)
                errs = np.array(errs)
                rows.append(
                    {
                        "trials": trials,
                        "half_reach": half,
                        "method": method,
                        "within_0.02": float(np.mean(errs <= 0.02)),
                        "median_err": float(np.median(errs)),
                        "p90_err": float(np.quantile(errs, 0.9)),
                    }
                )
    return rows


def bench_coverage(n: int) -> list[dict]:
    """How often the 90% bootstrap intervals contain the truth (reach 4-8 x C_mid)."""
    rows = []
    for trials in (512, 2048):
        rng = np.random.default_rng(3)
        hits = {"A": 0, "B": 0, "C_mid": 0}
        widths = []
        for i in range(n):
            cv = random_curve(rng)
            c, y = sample_run(
                cv, rng, reach=float(rng.uniform(4, 8)), trials=trials, n_points=int(rng.integers(20, 41))
            )
            fit = fit_sigmoid(c, y, bootstrap=200, seed=i)
            for k, true in (("A", cv.A), ("B", cv.B), ("C_mid", cv.C_mid)):
                lo, hi = fit.ci.get(k, (np.nan, np.nan))
                hits[k] += bool(lo <= true <= hi)
            widths.append(fit.ci["A"][1] - fit.ci["A"][0])
        rows.append(
            {
                "trials": trials,
                **{f"cover_{k}": v / n for k, v in hits.items()},
                "median_A_width": float(np.median(widths)),
            }
        )
    return rows


def bench_cli(tmp: Path) -> dict:
    """End to end: 9 runs in a sqlite MLflow store, `python -m scalerl.analysis compare`."""
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    eid = client.create_experiment("bench", artifact_location=str(tmp / "artifacts"))
    rng = np.random.default_rng(0)
    for i in range(9):
        cv = random_curve(rng)
        c, y = sample_run(cv, rng, reach=6.0, trials=2048)
        run = client.create_run(eid, run_name=f"run{i}")
        ts = int(time.time() * 1000)
        ms = [Metric("val/pass_rate", float(v), ts, 10 * s) for s, v in enumerate(y)]
        ms += [Metric("compute/flops", float(v) * 1e15, ts, 10 * s) for s, v in enumerate(c)]
        client.log_batch(run.info.run_id, metrics=ms, params=[Param("loss", f"l{i}")])
        client.set_terminated(run.info.run_id)
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scalerl.analysis",
            "compare",
            "--tracking-uri",
            uri,
            "--experiment",
            "bench",
            "--out",
            str(tmp / "out"),
        ],
        check=True,
        capture_output=True,
    )
    return {"cli_compare_9_runs_s": time.perf_counter() - t}


def _md(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    for r in rows:
        cells = []
        for k in keys:
            v = r[k]
            cells.append(f"{v:.3f}" if isinstance(v, float) and not float(v).is_integer() else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100, help="synthetic runs per table cell (default 100)")
    ap.add_argument("--json", default=None, help="also write the results as JSON to this path")
    ap.add_argument("--mlflow", action="store_true", help="also time the CLI end to end on a sqlite store")
    ap.add_argument(
        "--skip", default="", help="comma list of sections to skip: accuracy,extrapolation,coverage"
    )
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.perf_counter()
    result = {
        "date": common.utc_now(),
        "commit": common.commit(),
        "machine": common.machine(),
        "load": common.load(),
        "cases": args.cases,
    }
    print(
        f"# Scaling fit ({result['date']}, commit {result['commit']}; {result['machine']}, load {result['load']})\n"
    )
    result["timing"] = bench_timing()
    if args.mlflow:
        with tempfile.TemporaryDirectory() as d:
            result["timing"].update(bench_cli(Path(d)))
    print("## Timing (seconds)\n")
    print(_md([{"what": k, "seconds": v} for k, v in result["timing"].items()]))
    if "accuracy" not in skip:
        result["accuracy"] = bench_accuracy(args.cases)
        print(f"\n## A recovery (|A_fit - A_true|; data to reach x C_mid; {args.cases} cases per row)\n")
        print(_md(result["accuracy"]))
    if "extrapolation" not in skip:
        result["extrapolation"] = bench_extrapolation(args.cases)
        print(
            "\n## Extrapolation: fit on the first half (reaching half_reach x C_mid), error at the full budget\n"
        )
        print(_md(result["extrapolation"]))
    if "coverage" not in skip:
        result["coverage"] = bench_coverage(args.cases)
        print("\n## 90% bootstrap interval coverage (default method, 200 resamples, reach 4-8 x C_mid)\n")
        print(_md(result["coverage"]))
    result["total_s"] = time.perf_counter() - t0
    print(f"\ntotal {result['total_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
