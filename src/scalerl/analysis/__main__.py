"""``python -m scalerl.analysis fit|compare``: sigmoid fits of the runs of an MLflow experiment.

fit      per-run fits (with bootstrap CIs and the half-budget prediction check), the table,
         per-run plots, and write-back of ``fit/*`` metrics + ``scaling_curve.png`` to each run.
compare  all of ``fit``, plus the comparison plots: every run's curve on one figure and the
         linearised leave-one-out plot (B refitted with A fixed to the sweep mean).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from scalerl.analysis.experiment import (
    MARGIN_A,
    ExperimentResult,
    analyse_runs,
    rows_to_csv,
    rows_to_markdown,
)
from scalerl.analysis.mlflow_io import AnalysisError, load_runs, make_client, resolve_tracking_uri, write_back
from scalerl.scaling.sigmoid import DEFAULT_METHOD, METHODS


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--experiment",
        default=os.environ.get("MLFLOW_EXPERIMENT_NAME", "scalerl"),
        help="MLflow experiment name (default: $MLFLOW_EXPERIMENT_NAME or 'scalerl')",
    )
    common.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )
    common.add_argument(
        "--runs", default=None, help="comma-separated run ids (instead of the whole experiment)"
    )
    common.add_argument("--out", default=None, help="output folder (default: outputs/analysis/<experiment>)")
    common.add_argument(
        "--min-compute-frac",
        type=float,
        default=0.1,
        help="leave out points below this fraction of each run's budget (default 0.1)",
    )
    common.add_argument(
        "--method", choices=METHODS, default=DEFAULT_METHOD, help=f"fit method (default {DEFAULT_METHOD})"
    )
    common.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for CIs (0 = none)")
    common.add_argument("--level", type=float, default=0.9, help="confidence level of the intervals")
    common.add_argument(
        "--extrapolate", type=float, default=2.0, help="plots extend fits to this x the budget"
    )
    common.add_argument(
        "--baseline", default=None, help="run id / run name / variant of the reference run for delta A"
    )
    common.add_argument(
        "--margin", type=float, default=MARGIN_A, help="|delta A| above this is flagged (0.02)"
    )
    common.add_argument("--include-running", action="store_true", help="also fit runs still RUNNING")
    common.add_argument(
        "--pool-seeds", action="store_true", help="also fit one pooled curve per recipe with several seeds"
    )
    common.add_argument("--no-write-back", action="store_true", help="do not log fit/* metrics to the runs")
    common.add_argument("--seed", type=int, default=0, help="bootstrap seed")

    p = argparse.ArgumentParser(
        prog="python -m scalerl.analysis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("fit", parents=[common], help="per-run fits and write-back")
    sub.add_parser("compare", parents=[common], help="fits, comparison table and plots")
    return p


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


def _axis_label(res: ExperimentResult) -> str:
    axes = {r.compute_axis for r in res.runs}
    return {"flops": "compute (FLOPs)", "device_hours": "compute (device-hours)"}.get(
        axes.pop() if len(axes) == 1 else "", "compute"
    )


def _labels(res: ExperimentResult) -> dict[str, str]:
    out = {}
    for r in res.runs:
        v = next(row["variant"] for row in res.rows if row["run_id"] == r.run_id)
        out[r.run_id] = r.run_name if v in ("", r.run_name) else f"{r.run_name} ({v})"
    return out


def _write_outputs(res: ExperimentResult, args, out: Path, *, comparison: bool) -> dict[str, Path]:
    from scalerl.scaling.plot import plot_fit, plot_linearised

    out.mkdir(parents=True, exist_ok=True)
    xlabel = _axis_label(res)
    labels = _labels(res)
    paths: dict[str, Path] = {}
    for r in res.runs:
        p = out / "runs" / _safe(f"{r.run_name}-{r.run_id[:8]}") / "scaling_curve.png"
        plot_fit(
            p,
            [(labels[r.run_id], res.fits[r.run_id])],
            extrapolate=args.extrapolate,
            title=f"{r.run_name}: sigmoid fit",
            xlabel=xlabel,
        )
        paths[r.run_id] = p
    if comparison:
        order = [row["run_id"] for row in res.rows]
        plot_fit(
            out / "scaling_curves.png",
            [(labels[i], res.fits[i]) for i in order],
            extrapolate=args.extrapolate,
            title="All runs: sigmoid fits",
            xlabel=xlabel,
        )
        lin = [(labels[i], res.fixed_fits[i]) for i in order if i in res.fixed_fits and res.fixed_fits[i].ok]
        title = f"Linearised, A fixed to the mean {res.A_mean:.3f}: slope = B"
        if not lin:
            lin = [(labels[i], res.fits[i]) for i in order if res.fits[i].ok]
            title = "Linearised fits: slope = B"
        plot_linearised(out / "linearised.png", lin, title=title, xlabel=xlabel)
        if res.pooled_fits:
            plot_fit(
                out / "pooled_curves.png",
                list(res.pooled_fits.items()),
                extrapolate=args.extrapolate,
                title="Seeds pooled per recipe",
                xlabel=xlabel,
            )
    rows_to_csv(res.rows, out / "fits.csv")
    (out / "fits.md").write_text(rows_to_markdown(res.rows))
    (out / "fits.json").write_text(json.dumps(res.rows, indent=1, default=str, allow_nan=True))
    if res.pooled_rows:
        rows_to_csv(res.pooled_rows, out / "pooled_fits.csv")
    return paths


def _write_back(client, res: ExperimentResult, plots: dict[str, Path], args) -> int:
    by_id = {row["run_id"]: row for row in res.rows}
    n = 0
    for r in res.runs:
        fit = res.fits[r.run_id]
        row = by_id[r.run_id]
        metrics = fit.to_metrics("fit/")
        for key in ("delta_A", "A_fixed", "B_fixed_A", "C_mid_fixed_A", "pred_mae", "pred_err_last"):
            v = row.get(key, math.nan)
            metrics[f"fit/{key}"] = float(v) if isinstance(v, (int, float)) else math.nan
        tags = {
            "fit.method": args.method,
            "fit.min_compute_frac": f"{args.min_compute_frac:g}",
            "fit.variant": row["variant"],
            "fit.reason": fit.reason or "ok",
            "fit.summary": fit.summary(),
        }
        write_back(client, r, metrics, tags=tags, artifact=plots.get(r.run_id))
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    uri = resolve_tracking_uri(args.tracking_uri)
    client = make_client(uri)
    run_ids = [s.strip() for s in args.runs.split(",") if s.strip()] if args.runs else None
    try:
        runs = load_runs(client, args.experiment, run_ids, include_running=args.include_running)
    except AnalysisError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not runs:
        status = "finished or running" if args.include_running else "finished"
        print(
            f"error: no {status} runs with val/pass_rate in experiment {args.experiment!r} at {uri}",
            file=sys.stderr,
        )
        return 2
    res = analyse_runs(
        runs,
        method=args.method,
        min_compute_frac=args.min_compute_frac,
        bootstrap=args.bootstrap,
        level=args.level,
        baseline=args.baseline,
        margin=args.margin,
        pool_seeds=args.pool_seeds,
        seed=args.seed,
    )
    out = Path(args.out) if args.out else Path("outputs") / "analysis" / _safe(args.experiment)
    plots = _write_outputs(res, args, out, comparison=args.command == "compare")
    n_back = 0
    if not args.no_write_back:
        n_back = _write_back(client, res, plots, args)

    where = f"runs {','.join(run_ids)}" if run_ids else f"experiment {args.experiment!r}"
    print(f"# Scaling fits: {where} ({len(runs)} runs, tracking {uri})")
    print(
        f"method={args.method}, min_compute_frac={args.min_compute_frac:g}, "
        f"{args.level:.0%} bootstrap CIs ({args.bootstrap} resamples), sorted by A\n"
    )
    print(rows_to_markdown(res.rows))
    if res.baseline:
        base = next(r for r in res.rows if r["run_id"] == res.baseline)
        print(
            f"delta_A is against the baseline {base['run_name']} ({base['variant']}); "
            f"'exceeds_margin' = |delta_A| > {args.margin:g}."
        )
    if math.isfinite(res.A_mean):
        print(f"B_fixed_A: B refitted with A fixed to the mean A over fitted runs ({res.A_mean:.3f}).")
    print(
        "pred_*: fit on the first half of the compute, error of its prediction on the observed second half "
        "(mean abs error, and signed error at the last evaluation)."
    )
    for r in res.runs:
        for note in r.notes:
            print(f"note: {r.run_name}: {note}")
    if res.pooled_rows:
        print("\n## Seeds pooled per recipe\n")
        print(rows_to_markdown(res.pooled_rows))
    print(
        f"\nwrote {out}/ (fits.csv, fits.md, fits.json, runs/*/scaling_curve.png"
        + (", scaling_curves.png, linearised.png" if args.command == "compare" else "")
        + ")"
    )
    if n_back:
        print(f"wrote fit/* metrics and scaling_curve.png back to {n_back} runs")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
