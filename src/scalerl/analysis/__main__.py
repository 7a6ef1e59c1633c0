"""``python -m scalerl.analysis fit|compare|replicates``: sigmoid fits of the runs of an MLflow
experiment, and replicate studies compared.

fit      per-run fits (with bootstrap CIs and the half-budget prediction check), the verdict
         table per variant (A and B at the baseline's A over every fitted seed with t-intervals,
         differences called under Welch's t-test on each pair, Bonferroni-corrected over the table
         at a 5% family-wise level, equivalence on A (TOST), else the smallest detectable ΔA;
         components that cannot or did not act; the
         half-budget prediction with its band), the per-run table, per-run plots, and write-back
         of ``fit/*`` metrics + ``scaling_curve.png`` to each run.
compare  all of ``fit``, plus the comparison plots: panels per variant (variants.png), the forest
         plot of ΔA and ΔB (forest.png), predicted vs observed (calibration.png), the linearised
         leave-one-out plot (B refitted with A fixed to the baseline's A) and, up to 8 runs, every
         run's curve on one figure (scaling_curves.png).
replicates  two or more studies' ``report.json`` (the same sweep run again on other seeds or
         machines) side by side: per variant the verdicts counted, A's mean and spread, and the
         half-budget predictions' errors, coverage and skill against persistence
         (:mod:`scalerl.analysis.replicates`).

The same report as ``python sweep.py`` writes for a sweep (both call scalerl.analysis.report).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from scalerl.analysis import replicates
from scalerl.analysis.experiment import (
    DEFAULT_MIN_STEP,
    baseline_argument,
    left_out_rows,
    left_out_summary,
    rows_to_markdown,
)
from scalerl.analysis.mlflow_io import (
    AnalysisError,
    check_uri,
    load_runs,
    logged_fit_settings,
    make_client,
    resolve_tracking_uri,
)
from scalerl.analysis.reporting import ReportInput, report, safe_name
from scalerl.messages import OneLineParser
from scalerl.scaling.pass_at_k import DEFAULT_METRIC, METRIC_ALLOWED, metric_k
from scalerl.scaling.protocol import FitProtocol, FitProtocolError, bootstrap_problem
from scalerl.scaling.sigmoid import DEFAULT_METHOD, METHODS, N_PARAMS
from scalerl.storage import write_text_atomic


def _add_fit_options(common: argparse.ArgumentParser) -> None:
    """The fit settings (:data:`FIT_OPTIONS`): each left out is the one the runs logged, where they all
    logged the same (:func:`_runs_protocol`), else the protocol's default."""

    def default(key: str, otherwise) -> str:
        return f"default: the runs' scaling.{key} where they all logged one, else {otherwise}"

    common.add_argument(
        "--min-step",
        type=int,
        help=f"leave out evaluations before this optimiser step, in every run ({default('min_step', DEFAULT_MIN_STEP)})",
    )
    common.add_argument(
        "--min-compute",
        type=float,
        help="leave out evaluations below this compute (the runs' compute axis units), in every run "
        f"({default('min_compute', 0)})",
    )
    common.add_argument(
        "--grid-a",
        help="the grid method's A values LOW,HIGH,STEP (the paper's: 0.45,0.8,0.005; "
        f"{default('grid_A', 'from the data')})",
    )
    common.add_argument(
        "--grid-c-mid",
        help="the grid method's C_mid values LOW,HIGH,N linearly spaced (the paper's: 100,40000,100 "
        f"GPU-hours; {default('grid_C_mid', 'from the data')})",
    )
    common.add_argument("--method", choices=METHODS, help=f"fit method ({default('method', DEFAULT_METHOD)})")
    common.add_argument(
        "--bootstrap",
        type=int,
        help="bootstrap resamples for CIs (0 = none; else at least 2/(1-level), 20 at the default level; "
        f"{default('bootstrap', FitProtocol.bootstrap)})",
    )
    common.add_argument(
        "--metric",
        help=f"the metric fitted, val/<METRIC> of each evaluation: {DEFAULT_METRIC} or pass_at_<k>, "
        f"a val/pass_at_<k> the runs logged (eval.pass_at_k), as scaling.metric ({default('metric', DEFAULT_METRIC)})",
    )
    common.add_argument(
        "--extrapolate",
        type=float,
        help=f"plots extend fits to this x the budget ({default('extrapolate', f'{FitProtocol.extrapolate:g}')})",
    )


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
    _add_fit_options(common)
    common.add_argument("--level", type=float, default=0.9, help="confidence level of the intervals")
    common.add_argument(
        "--baseline",
        default=None,
        help="run id, run name or variant: its variant (all its seeds) is the reference of delta A and "
        "delta B (default: the baseline the runs' sweep declared, else a fitted run named 'baseline', "
        "else the leave-one-out centre, else the first fitted run; the choice is printed)",
    )
    common.add_argument("--include-running", action="store_true", help="also fit runs still RUNNING")
    common.add_argument(
        "--pool-seeds", action="store_true", help="also fit one pooled curve per recipe with several seeds"
    )
    common.add_argument("--no-write-back", action="store_true", help="do not log fit/* metrics to the runs")
    common.add_argument("--seed", type=int, default=0, help="bootstrap seed")

    p = OneLineParser(
        prog="python -m scalerl.analysis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("fit", parents=[common], help="per-run fits and write-back")
    sub.add_parser("compare", parents=[common], help="fits, comparison table and plots")
    rep = sub.add_parser(
        "replicates",
        help="replicate studies' report.json side by side: verdict counts, A's spread, predictions",
        description=replicates.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument(
        "studies", nargs="+", help="sweep folders, report folders or report.json files (two or more)"
    )
    rep.add_argument("--out", default=None, help="also write replicates.md and replicates.json here")
    rep.add_argument(
        "--within",
        type=float,
        default=replicates.WITHIN,
        help=f"a prediction error counted as within this (default {replicates.WITHIN})",
    )
    return p


MIN_POINTS = N_PARAMS  # a sigmoid fit has three free parameters


def _bad_argument(args) -> str | None:
    """One line for a numeric option out of its range (argparse checks only the types)."""
    finite = all(math.isfinite(v) for v in (args.min_compute, args.level, args.extrapolate) if v is not None)
    if not finite:
        return "--min-compute, --level and --extrapolate must be finite numbers"
    for flag, value in (("--min-step", args.min_step), ("--min-compute", args.min_compute)):
        if value is not None and value < 0:
            return f"{flag}={value}: must be >= 0"
    for flag, value in (("--grid-a", args.grid_a), ("--grid-c-mid", args.grid_c_mid)):
        if value is not None:
            try:
                parsed = _triple(value)
            except ValueError:
                return f"{flag}={value!r}: must be three numbers LOW,HIGH,{'STEP' if flag == '--grid-a' else 'N'}"
            if flag == "--grid-a" and not (0 <= parsed[0] <= parsed[1] <= 1 and parsed[2] > 0):
                return f"{flag}={value!r}: must be 0 <= LOW <= HIGH <= 1 and STEP > 0"
            if flag == "--grid-c-mid" and not (0 < parsed[0] <= parsed[1] and parsed[2] >= 1):
                return f"{flag}={value!r}: must be 0 < LOW <= HIGH and N >= 1"
    if not 0 < args.level < 1:
        return f"--level={args.level}: must be in (0, 1)"
    if args.bootstrap is not None and args.bootstrap < 0:
        return f"--bootstrap={args.bootstrap}: must be >= 0 (0 = no intervals)"
    bad = bootstrap_problem("--bootstrap", args.bootstrap, args.level) if args.bootstrap is not None else None
    if bad:
        return f"{bad[0]}={bad[1]}: must be {bad[2]}"
    if args.extrapolate is not None and args.extrapolate < 1:
        return f"--extrapolate={args.extrapolate}: must be >= 1"
    if args.metric is not None and metric_k(args.metric) is None:
        return f"--metric={args.metric!r}: must be {METRIC_ALLOWED}"
    if args.runs is not None:
        ids = [s.strip() for s in args.runs.split(",") if s.strip()]
        if not ids:
            return f"--runs={args.runs!r}: no run id (expected comma-separated MLflow run ids)"
        dup = next((r for r in ids if ids.count(r) > 1), None)
        if dup:  # one run counted twice would weigh as two seeds
            return f"--runs: run id {dup!r} is given twice (expected distinct run ids)"
    if args.tracking_uri is not None and not args.tracking_uri.strip():
        return (
            f"--tracking-uri={args.tracking_uri!r}: empty (give an MLflow tracking URI, e.g. "
            "sqlite:///mlflow.db, or leave the flag out for $MLFLOW_TRACKING_URI)"
        )
    if args.out is not None:
        from scalerl.config.preflight import PathError, check_out_dir

        try:
            check_out_dir(args.out, key="--out")
        except PathError as e:
            return str(e)
    return None


def mixed_axes(runs) -> str:
    """A warning when ``runs`` were fitted on different compute axes ("" when they share one)."""
    by: dict[str, list[str]] = {}
    for r in runs:
        by.setdefault(r.compute_axis, []).append(r.run_name)
    if len(by) < 2:
        return ""
    listed = "; ".join(f"{axis}: {', '.join(names)}" for axis, names in sorted(by.items()))
    return (
        f"the runs are on different compute axes ({listed}): their C_mid, a --min-compute cut and "
        "the curves' x-axis are each in its own unit; compare A and B only among runs of one axis"
    )


def _probe_out(out: Path) -> str | None:
    """Why ``out`` cannot be written (None: it can), found by creating it and a file in it, then
    removing what the probe made: a refusal leaves nothing behind, and the report is not cut off
    half-way by a folder the permission bits call writable (``/proc``, a read-only mount, root)."""
    made = []
    try:
        missing = [p for p in (out, *out.parents) if not p.exists()]
        out.mkdir(parents=True, exist_ok=True)
        made = list(missing)
        probe = out / f".scalerl-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"--out={str(out)!r}: cannot write there ({e.strerror or type(e).__name__})"
    finally:
        for p in made:  # deepest first
            try:
                p.rmdir()
            except OSError:
                pass
    return None


def _triple(value: str | None) -> tuple[float, float, float] | None:
    if value is None:
        return None
    parts = tuple(float(x) for x in value.split(","))
    if len(parts) != 3 or not all(math.isfinite(x) for x in parts):
        raise ValueError(value)
    return parts


class _Refused(Exception):
    """A run of the CLI that stops before any report: one ``error:`` line and exit status 2."""


# the command line's fit settings: option (its argparse name) -> the ``scaling`` config key
FIT_OPTIONS = {
    "min_step": "min_step",
    "min_compute": "min_compute",
    "method": "method",
    "grid_a": "grid_A",
    "grid_c_mid": "grid_C_mid",
    "bootstrap": "bootstrap",
    "extrapolate": "extrapolate",
    "metric": "metric",
}


def _protocol(args, logged: dict | None = None) -> FitProtocol:
    """The one object every fit of the report is made with: each setting the command line gives,
    else the one the runs logged (``logged``: ``scaling`` config keys, as their sweep or their
    ``train.py`` ran them), else the protocol's default."""
    values = dict(logged or {})
    for option, key in FIT_OPTIONS.items():
        given = getattr(args, option)
        if given is not None:
            values[key] = _triple(given) if key.startswith("grid_") else given
    try:
        return FitProtocol.from_config(values, level=args.level, seed=args.seed)
    except (FitProtocolError, TypeError, ValueError) as e:
        raise _Refused(str(e)) from None


def _runs_protocol(args, protocol: FitProtocol, runs, left_out):
    """The protocol with the fit settings the runs logged where the command line gives none (a
    sweep's early cut: ``scaling.min_step=108``), so that the CLI's report on a sweep's runs is the
    sweep's. A setting the runs logged with several values keeps the default, and one stderr line
    says so. Returns ``(protocol, runs, left_out)``: the runs loaded again where their logged metric
    is another than the one they were loaded for."""
    unset = [key for option, key in FIT_OPTIONS.items() if getattr(args, option) is None]
    logged, differing = logged_fit_settings(runs, unset)
    for key, values in differing.items():
        option = "--" + next(o for o, k in FIT_OPTIONS.items() if k == key).replace("_", "-")
        print(
            f"note: the runs logged scaling.{key} = {', '.join(values)}: the default "
            f"{getattr(FitProtocol, key)} is used (give {option} to choose)",
            file=sys.stderr,
        )
    if not logged:
        return protocol, runs, left_out
    mine = _protocol(args, logged)
    if mine.metric != protocol.metric:
        _, runs, left_out = _load(args, mine, resolve_tracking_uri(args.tracking_uri), _run_ids(args))
    return mine, runs, left_out


def _load(args, protocol: FitProtocol, uri: str, run_ids: list[str] | None):
    """(client, runs, left-out runs): the runs to fit, refused where none is there or none has
    enough evaluations to fit."""
    left_out: list = []
    try:
        check_uri(uri)
        client = make_client(uri)
        runs = load_runs(
            client,
            args.experiment,
            run_ids,
            include_running=args.include_running,
            left_out=left_out,
            reward_key=protocol.reward_key,
        )
    except AnalysisError as e:
        raise _Refused(str(e)) from None
    if not runs:
        status = "finished or running" if args.include_running else "finished"
        others = f" (left out: {left_out_summary(left_out)})" if left_out else ""
        raise _Refused(
            f"no {status} runs with {protocol.reward_key} in experiment {args.experiment!r} at {uri}{others}"
        )
    if all(r.steps.size < MIN_POINTS for r in runs):
        counts = ", ".join(f"{r.run_name}: {r.steps.size}" for r in runs[:5]) + (
            ", ..." if len(runs) > 5 else ""
        )
        raise _Refused(
            f"too few points to fit in {_where(args, run_ids)}: every run has fewer than {MIN_POINTS} "
            f"evaluations with compute ({counts}); a fit needs at least {MIN_POINTS}"
        )
    return client, runs, left_out


def _run_ids(args) -> list[str] | None:
    return [s.strip() for s in args.runs.split(",") if s.strip()] if args.runs is not None else None


def _where(args, run_ids: list[str] | None) -> str:
    return f"runs {','.join(run_ids)}" if run_ids else f"experiment {args.experiment!r}"


def _asked(args, client, runs, left_out, protocol: FitProtocol, title: str, *, selected: bool) -> ReportInput:
    """The report's input: the baseline (given, else the one the runs' sweep declared; a left-out
    run named as the baseline stands for its variant) and the left-out runs as unfitted rows."""
    baseline, given_by = baseline_argument(client, runs, args.baseline)
    pending = left_out_rows(runs, left_out)
    if baseline and not any(baseline in (r.run_id, r.run_name) for r in runs):
        # a left-out run named as the baseline: its variant (kept, with empty deltas)
        baseline = next((p["variant"] for p in pending if baseline in (p["run_id"], p["run_name"])), baseline)
    return ReportInput(
        baseline=baseline,
        baseline_given_by=given_by,
        protocol=protocol,
        pool_seeds=args.pool_seeds,
        comparison=args.command == "compare",
        name="Selected runs" if selected else args.experiment,
        title=title,
        pending=pending,
    )


def _say_done(args, rep, runs, left_out, out: Path, t0: float, *, metric: str) -> None:
    """What the run says after the report: how the baseline was chosen, the runs left out, mixed
    compute axes (stderr); the report, the notes, the pooled table and the files written (stdout)."""
    if not args.baseline:
        print(rep.baseline.describe(), file=sys.stderr)
    if left_out:
        print(f"left out (not fitted, listed in the table): {left_out_summary(left_out)}", file=sys.stderr)
    if mixed := mixed_axes(runs):
        print(f"warning: {mixed}", file=sys.stderr)
    print(rep.markdown, end="")
    for r in runs:
        for note in r.notes:
            print(f"note: {r.run_name}: {note}")
    if rep.result.pooled_rows:
        print("\n## Seeds pooled per recipe\n")
        print(rows_to_markdown(rep.result.pooled_rows, level=args.level, metric=metric))
    written = [f for f in rep.files if f is not None]  # a figure that failed to draw is None
    tables = [f.name for f in written if f.suffix != ".png"]  # the verdicts and pooled fits where written
    figures = [f.name for f in written if f.suffix == ".png"]
    print(f"\nwrote {out}/ ({', '.join([*tables, 'runs/*/scaling_curve.png', *figures])})")
    if rep.written_back:
        print(f"wrote fit/* metrics and scaling_curve.png back to {rep.written_back} runs")
    print(f"done in {time.perf_counter() - t0:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _replicates(args) if args.command == "replicates" else _run(args)
    except _Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # ``... | head``: the files are written; the reader has what it wanted
        from scalerl.messages import reader_gone

        reader_gone()
        return 0


def _replicates(args) -> int:
    """``replicates``: the studies' reports read (each checked; refused before anything is written),
    the table printed, and with ``--out`` written as replicates.md and replicates.json."""
    if len(args.studies) < 2:
        raise _Refused(f"replicates: {len(args.studies)} study given, expected two or more to compare")
    if not (math.isfinite(args.within) and args.within > 0):
        raise _Refused(f"--within={args.within}: must be a positive number")
    try:
        studies = [replicates.load_study(a) for a in args.studies]
    except replicates.ReplicatesError as e:
        raise _Refused(str(e)) from None
    paths = [s.path.resolve() for s in studies]
    dup = next((p for p in paths if paths.count(p) > 1), None)
    if dup is not None:  # one study counted twice would weigh as two replicates
        raise _Refused(f"replicates: {dup} is given twice (expected distinct studies)")
    reps = replicates.summarise(studies)
    md = replicates.to_markdown(studies, reps, args.within)
    if args.out is not None:
        out = Path(args.out)
        unwritable = _probe_out(out)
        if unwritable:
            raise _Refused(unwritable)
        out.mkdir(parents=True, exist_ok=True)
        doc = replicates.to_json(studies, reps, args.within)
        write_text_atomic(out / "replicates.json", json.dumps(doc, indent=1, allow_nan=False) + "\n")
        write_text_atomic(out / "replicates.md", md)
    print(md, end="")
    if args.out is not None:
        print(f"\nwrote {args.out}/ (replicates.md, replicates.json)")
    return 0


def _run(args) -> int:
    """Load the runs, write the report, say what was written (:class:`_Refused` before any report)."""
    bad = _bad_argument(args)
    if bad:
        raise _Refused(bad)
    protocol = _protocol(args)  # its metric: the curves loaded first
    t0 = time.perf_counter()
    uri = resolve_tracking_uri(args.tracking_uri)
    run_ids = _run_ids(args)
    client, runs, left_out = _load(args, protocol, uri, run_ids)
    protocol, runs, left_out = _runs_protocol(args, protocol, runs, left_out)
    out = Path(args.out) if args.out else Path("outputs") / "analysis" / safe_name(args.experiment)
    unwritable = _probe_out(out)
    if unwritable:
        raise _Refused(unwritable)
    counted = f"{len(runs)} runs" + (f", {len(left_out)} left out" if left_out else "")
    title = f"# Scaling fits: {_where(args, run_ids)} ({counted}, tracking {uri})"
    asked = _asked(args, client, runs, left_out, protocol, title, selected=bool(run_ids))
    try:
        rep = report(runs, out, asked, client=None if args.no_write_back else client)
    except AnalysisError as e:
        raise _Refused(str(e)) from None
    except OSError as e:  # the disk filled up, the folder went away: one line, not a traceback
        print(f"error: --out={str(out)!r}: writing the report failed ({e})", file=sys.stderr)
        return 1
    _say_done(args, rep, runs, left_out, out, t0, metric=protocol.reward_key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
