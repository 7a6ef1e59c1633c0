"""python sweep.py: run a study (many training runs) and compare its variants by A and B.

    python sweep.py --loo                               # sweeps/loo_ceiling.yaml: ScaleRL + 8 leave-one-out variants + an A-mover
    python sweep.py loo                                 # sweeps/loo.yaml: the same 8 on a task learnt whole (A = 1)
    python sweep.py sweeps/loss_comparison.yaml         # any sweep file (or its name: loss_comparison)
    python sweep.py --loo --dry-run                     # print the plan; launch and write nothing
    python sweep.py --loo trainer.total_steps=200       # extra overrides for every variant
    python sweep.py --loo launcher=slurm launcher.partition=gpu launcher.gpus_per_node=8
    python sweep.py --report loo_ceiling                # re-fit and rewrite the report at any time

Exit status: 0 all runs finished, 1 some run failed (the others complete; the report marks it),
2 a problem with the sweep file or the command line (nothing was launched or written),
130 interrupted (run the same command again to resume).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from scalerl.collector import run_as_program
from scalerl.messages import OneLineParser
from scalerl.sweep.spec import SweepError, display_path

if TYPE_CHECKING:
    from scalerl.sweep.state import SweepState

EXIT_FAILED_RUNS = 1
EXIT_USAGE = 2


def sweeps_dir() -> Path:
    """The shipped sweep files: ``sweeps/`` next to ``conf/`` (the repository root)."""
    from scalerl.config import conf_dir

    return Path(conf_dir()).parent / "sweeps"


LOO = "loo_ceiling"
"""The shipped sweep ``--loo`` runs: the paper's leave-one-out variants where ceilings (A) can differ
(``sweeps/loo.yaml`` runs them on a task every variant learns whole, comparing B alone)."""


def shipped() -> list[str]:
    d = sweeps_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def resolve_file(arg: str) -> Path:
    """A sweep file path, or the name of a shipped sweep (``loo`` -> ``sweeps/loo.yaml``)."""
    p = Path(arg)
    if p.is_file():
        return p
    if "/" not in arg and not arg.endswith((".yaml", ".yml")):
        for cand in (Path("sweeps") / f"{arg}.yaml", sweeps_dir() / f"{arg}.yaml"):
            if cand.is_file():
                return cand
        raise SweepError(f"no sweep file or shipped sweep named {arg!r} (shipped: {', '.join(shipped())})")
    if p.is_dir():
        raise SweepError(f"{display_path(p)}: is a folder, not a sweep file (a YAML file)")
    raise SweepError(f"{display_path(p)}: no such sweep file")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python sweep.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="shipped sweeps (sweeps/*.yaml): " + ", ".join(shipped()),
    )
    p.add_argument(
        "args",
        nargs="*",
        metavar="SWEEP_OR_OVERRIDE",
        help="a sweep file (or a shipped sweep's name), then overrides for every variant "
        "(group=option, key=value, launcher=local|slurm, launcher.<key>=...)",
    )
    p.add_argument(
        "--loo",
        action="store_true",
        help="the leave-one-out study, on a task whose ceiling is below 1 (sweeps/loo_ceiling.yaml)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, one line per run; launch nothing")
    p.add_argument(
        "--report", metavar="SWEEP", help="re-fit a launched sweep (name or file) and rewrite its report"
    )
    p.add_argument("--out", metavar="DIR", help="sweep folder (default: outputs/sweeps/<name>)")
    p.add_argument(
        "--run-all",
        action="store_true",
        help="also launch the variants whose component cannot act where they would run (a bf16 LM head "
        "emulated without a GPU); by default they are planned, reported as such and not run",
    )
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI (default: the sweep folder's, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    return p


def say(msg: str) -> None:
    print(f"[sweep] {msg}", file=sys.stderr, flush=True)


def _split_args(args, parser) -> tuple[str | None, list[str]]:
    sweep, overrides = None, []
    for a in args.args:  # the sweep file: the first argument that is not an override
        if sweep is None and "=" not in a and not a.startswith("~"):
            sweep = a
        else:
            overrides.append(a)
    if args.loo:
        if sweep is not None:
            raise SweepError(f"give either --loo or a sweep file, not both (got {sweep!r})")
        sweep = str(resolve_file(LOO))
    if sweep is None:
        raise SweepError("give a sweep file or --loo (shipped sweeps: " + ", ".join(shipped()) + ")")
    return sweep, overrides


def _sweep_dir(args, name: str) -> Path:
    return (Path(args.out) if args.out else Path("outputs") / "sweeps" / name).resolve()


def cmd_report(args) -> int:
    from scalerl.sweep.report import build_report
    from scalerl.sweep.spec import load_spec
    from scalerl.sweep.state import load_state

    target = args.report
    try:
        name = load_spec(resolve_file(target)).name
    except SweepError:
        if Path(target).is_file() or target.endswith((".yaml", ".yml")):
            raise
        name = target  # a sweep name without a file: its folder is enough
    sdir = _sweep_dir(args, name)
    state = dataclasses.replace(load_state(sdir), sweep_dir=str(sdir))  # where it is now
    if args.tracking_uri:
        from scalerl.tracking.tracker import absolute_uri

        state = dataclasses.replace(state, tracking_uri=absolute_uri(args.tracking_uri))
    from scalerl.config.preflight import PathError, check_tracking_uri

    try:
        check_tracking_uri(state.tracking_uri, key="tracking URI")
    except PathError as e:
        raise SweepError(str(e)) from None
    t0 = time.time()
    try:
        report = build_report(state)
    except Exception as e:  # e.g. the store went away while the report read it: nothing is lost
        print(f"error: {name}: the report failed ({_report_failure(e, state.tracking_uri)})", file=sys.stderr)
        return EXIT_FAILED_RUNS
    _print_report(report, state, t0)
    return 0  # the report was written; failed runs are marked in it


def _report_failure(error: Exception, uri: str) -> str:
    """What made the report fail, in one line. A fault of what it talks to (the tracking store, the
    disk) is named with the store's URI, credentials masked; anything else is a bug in the report,
    whose traceback is printed first, as what to send with a bug report."""
    from mlflow.exceptions import MlflowException

    from scalerl.messages import CONNECTION_FAULTS, fault_reason, first_line
    from scalerl.tracking.secrets import redact

    if isinstance(error, (MlflowException, OSError)) and any(k in str(error) for k in CONNECTION_FAULTS):
        return f"the tracking store at {redact(uri)} failed: {fault_reason(error)}"
    if isinstance(error, MlflowException):
        return f"the tracking store at {redact(uri)}: {redact(first_line(error))}"
    if not isinstance(error, OSError):
        import traceback

        traceback.print_exc()
    return redact(fault_reason(error, detail=True))


def _print_report(report, state: SweepState, t0: float) -> None:
    print(report.markdown, flush=True)
    for r in report.failed:
        say(
            f"{r['job']}: {r['status']}: {r.get('error') or '(no error message)'}; log: {r.get('log') or '-'}"
        )
    written = sorted(Path(f).name for f in report.files)
    if (Path(report.out_dir) / "runs").is_dir():  # per-run plots (not among the report's files)
        written.append("runs/*/scaling_curve.png")
    say(
        f"report: {display_path(report.out_dir)}/ ({', '.join(written)}) and "
        f"artifacts report/* of MLflow run {report.parent_run_id} (experiment {state.name!r}, "
        f"{state.tracking_uri}) [{time.time() - t0:.1f} s]"
    )
    if report.view:
        uri = state.tracking_uri
        root = uri.rstrip("/") + "/" if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000/"
        how = (
            ""
            if uri.startswith(("http://", "https://"))
            else f" (after: mlflow ui --backend-store-uri {uri})"
        )
        say(f"verdicts in the MLflow run table: {root}{report.view}{how}")


def cmd_run(args, sweep: str, overrides: list[str]) -> int:
    from scalerl.sweep.plan import make_plan, plan_lines
    from scalerl.sweep.spec import load_spec
    from scalerl.sweep.state import read_json

    spec = load_spec(resolve_file(sweep))
    sdir = _sweep_dir(args, spec.name)
    stored = read_json(sdir / "sweep.json").get("tracking_uri")  # reading writes nothing
    plan = make_plan(
        spec,
        overrides,
        sweep_dir=sdir,
        tracking_uri=args.tracking_uri,
        stored_uri=stored,
        run_all=args.run_all,
    )
    lc = plan.launcher
    from scalerl.sweep.launch import core_slots, max_parallel

    slots = core_slots(lc) if lc["name"] == "local" else []
    held = f", each held to cores {' | '.join(','.join(map(str, c)) for c in slots)}" if slots else ""
    where = (
        f"launcher=local (up to {max_parallel(lc)} at once{held})"
        if lc["name"] == "local"
        else f"launcher=slurm (partition {lc['partition'] or 'default'}, array parallelism {lc['array_parallelism']})"
    )
    header = (
        f"sweep {spec.name}: {len(plan.runs)} runs"
        + (
            f" ({len(spec.variants)} variant{'s' * (len(spec.variants) != 1)} x {len(spec.seeds)} seeds)"
            if spec.seeds and len(spec.seeds) > 1
            else ""
        )
        + f", baseline {spec.baseline or '-'}, {where}, folder {display_path(sdir)}, tracking {plan.tracking_uri}"
    )
    skipped = [r for r in plan.runs if r.skip]
    if skipped:
        header += (
            f"; {len(skipped)} not run, since their component cannot act here "
            f"({', '.join(dict.fromkeys(r.variant for r in skipped))}; --run-all runs them)"
        )
    for w in plan.warnings:
        say("note: " + w)
    if args.dry_run:
        say("dry run: " + header + "; nothing launched or written")
        print("\n".join(plan_lines(plan)), flush=True)
        say(estimate_line(plan))
        return 0
    return launch(plan, header)


def estimate_line(plan) -> str:
    """The sweep's estimated wall time (:mod:`scalerl.estimate`): each variant's run as its job
    will run it (its overrides, the launcher's and the thread share the local launcher gives it),
    probed once per model shape, then its runs scheduled in the launcher's order (the most work
    first: :func:`~scalerl.sweep.plan.launch_order`) as many at once as the launcher starts,
    each slowed by the cores the runs at once and the machine's present load share. A SLURM sweep
    runs on nodes and behind a queue this machine does not know: said, not guessed."""
    from scalerl import estimate
    from scalerl.config.settings import build_config
    from scalerl.sweep.launch import local_threads, max_parallel
    from scalerl.sweep.plan import launch_order

    lc = plan.launcher
    if lc["name"] != "local":
        return estimate.Unknown(
            f"launcher={lc['name']}: its nodes' speed and its queue's wait are not known on this machine"
        ).line()
    probes: dict = {}
    per_variant: dict[str, object] = {}
    runs = []
    try:
        for r in launch_order(plan.runs, plan.work_options):  # scheduled as the launcher starts them
            if r.skip:
                continue
            if r.variant not in per_variant:
                ovs = [*r.overrides, *plan.launcher_overrides]
                cfg = build_config(ovs + local_threads(lc, ovs), {})
                per_variant[r.variant] = estimate.estimate(cfg, probes=probes, load=False)
            runs.append(per_variant[r.variant])
    except Exception as e:  # the plan is checked already; an estimate problem never stops a dry run
        return f"estimated wall time: not estimated ({type(e).__name__}: {e})"
    load, cores = estimate.machine_load()
    return estimate.sweep_estimate(runs, max_parallel(lc), cores, load).line()


def launch(plan, header: str) -> int:
    from filelock import FileLock, Timeout

    try:
        plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # e.g. a read-only or virtual file system the preflight cannot foresee
        raise SweepError(
            f"sweep folder (--out)={str(plan.sweep_dir)!r}: cannot be created ({e.strerror or type(e).__name__})"
        ) from None
    lock = FileLock(str(plan.sweep_dir / ".sweep.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise SweepError(
            f"another `python sweep.py` is running the sweep in {display_path(plan.sweep_dir)}; "
            "wait for it (or use --out for a separate folder)"
        ) from None
    try:
        return _launch(plan, header)
    finally:
        lock.release()


def _launch(plan, header: str) -> int:
    from scalerl.sweep.launch import Launcher, is_finished
    from scalerl.sweep.report import build_report
    from scalerl.sweep.state import end_parent, load_state, start_parent

    t0 = time.time()
    say(header)
    exp_id, parent = start_parent(plan)
    say(f"MLflow experiment {plan.spec.name!r} (id {exp_id}), parent run {parent}")
    todo = []
    launcher = Launcher(plan, parent, say=say)
    for r in plan.runs:
        if r.skip:
            launcher.not_run(r)
        elif is_finished(r):
            launcher.already_finished(r)
        else:
            todo.append(r)
    try:
        launcher.run(todo)
    except KeyboardInterrupt:
        end_parent(plan.tracking_uri, parent, "KILLED")
        if plan.launcher["name"] == "slurm":
            say("interrupted; the SLURM jobs keep running: run the same command again to wait for them")
        else:
            say("interrupted; run the same command again to resume (finished runs are skipped)")
        return 130
    state = load_state(plan.sweep_dir)
    try:
        report = build_report(state)
    except Exception as e:  # the runs are done and on disk: never lose them to a report problem
        say(
            f"the report failed ({_report_failure(e, plan.tracking_uri)}); retry with: python sweep.py --report {plan.spec.name}"
        )
        end_parent(plan.tracking_uri, parent, "FAILED")
        return EXIT_FAILED_RUNS
    end_parent(plan.tracking_uri, parent, "FINISHED")
    _print_report(report, state, t0)
    return EXIT_FAILED_RUNS if report.failed else 0


def _quiet_logs() -> None:
    import logging
    import os

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for noisy in ("mlflow", "alembic", "urllib3", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    _quiet_logs()
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    try:
        if args.report:
            if args.dry_run or args.loo or args.args:
                raise SweepError("--report takes only a sweep name or file (and --out / --tracking-uri)")
            return cmd_report(args)
        sweep, overrides = _split_args(args, parser)
        return cmd_run(args, sweep, overrides)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def program() -> NoReturn:
    """:func:`main` as a program (``python sweep.py``, ``scalerl-sweep``): the same, then the process
    ends without the interpreter's finalisation (:func:`scalerl.collector.run_as_program`)."""
    run_as_program(main)


if __name__ == "__main__":
    program()
