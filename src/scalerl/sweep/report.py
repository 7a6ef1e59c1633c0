"""The sweep report: the report of :func:`scalerl.analysis.report` (the same table, files, plots
and ``fit/*`` write-back as ``python -m scalerl.analysis compare``) on the sweep's finished runs,
with ΔA and ΔB against the sweep's declared baseline variant, plus what only a sweep knows: the
planned runs that did not finish (also those that failed before reaching MLflow) with their status,
error and log, and the parent run, whose description opens with the verdict table (then the whole
report), the counts as metrics
and the files as artifacts ``report/*`` (among them ``report.json``, the machine-readable report,
whose ``wall_s`` is the span of the finished runs: the first start to the last end in MLflow).
Everything is written into ``<sweep dir>/report/``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalerl.sweep.plan import PlannedRun
from scalerl.sweep.state import STATUS_FILE, SweepState, client_for, read_json


@dataclass
class Report:
    rows: list[dict]
    markdown: str
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    parent_run_id: str = ""
    view: str = ""  # the MLflow UI's run table with the verdict columns, after the server's root


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _run_status(run: PlannedRun, status: dict, mlflow_run) -> str:
    s = read_json(Path(run.out_dir) / "summary.json")
    if s and int(s.get("steps", 0)) >= int(run.total_steps):
        return "finished"
    st = (status.get(run.name) or {}).get("status")
    if st and st not in ("finished", "skipped"):
        return st
    if mlflow_run is not None:
        steps = s.get("steps") if s else None
        return f"incomplete ({mlflow_run.info.status.lower()}" + (f", step {steps})" if steps else ")")
    return "not started"


def _children(client, exp_id: str, parent: str) -> dict[str, object]:
    runs, token = [], None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent}'",
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    by_name: dict[str, object] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        by_name[r.info.run_name] = r  # the latest of a name wins
    return by_name


def _run_id(run: PlannedRun, uri: str, children: dict) -> str | None:
    info = read_json(Path(run.out_dir) / "run_info.json")
    if info.get("run_id") and info.get("uri", uri) == uri:
        return info["run_id"]
    child = children.get(run.name)
    return child.info.run_id if child is not None else None


def study_wall_s(spans: list[tuple[int, int]]) -> float | None:
    """The study's wall time in seconds: the first finished run's start to the last one's end (MLflow
    times in ms); None without finished runs. Runs that ran side by side count once."""
    if not spans:
        return None
    return max(0.0, (max(e for _, e in spans) - min(s for s, _ in spans)) / 1000.0)


@dataclass
class _Collected:
    """The sweep's runs as the report takes them: the finished ones' curves, with the sweep's keys
    for their rows; the others' rows, unfitted; the finished ones' MLflow start and end (ms)."""

    runs: list = field(default_factory=list)
    extra: dict[str, dict] = field(default_factory=dict)
    pending: list[dict] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)


def _collect(state: SweepState, client, protocol) -> _Collected:
    """Which planned runs exist and their status: the finished ones are loaded to be fitted, the
    others listed with their status, error, log and the fitted metric's ends from their summary."""
    from scalerl.analysis.mlflow_io import load_run

    status = read_json(Path(state.sweep_dir) / STATUS_FILE)
    children = _children(client, state.experiment_id, state.parent_run_id)
    got = _Collected()
    for run in state.runs:
        rid = _run_id(run, state.tracking_uri, children)
        mrun = None
        if rid:
            try:
                mrun = client.get_run(rid)
            except Exception:
                mrun = None
        st = _run_status(run, status, mrun)
        summ = read_json(Path(run.out_dir) / "summary.json")
        entry = status.get(run.name) or {}
        info = {
            "run_name": run.name,
            "job": run.name,
            "variant": run.variant,
            "seed": run.seed,
            "status": st,
            "overrides": " ".join(run.overrides),
            "steps": summ.get("steps", 0) if summ else 0,
            "log": entry.get("log", ""),
            "error": entry.get("error", "") if st != "finished" else "",
        }
        if st == "finished" and mrun is not None:
            if mrun.info.start_time and mrun.info.end_time:
                got.spans.append((int(mrun.info.start_time), int(mrun.info.end_time)))
            data = load_run(client, mrun, reward_key=protocol.reward_key)
            data.run_name = run.name
            data.tags.setdefault("variant", run.variant)
            got.runs.append(data)
            got.extra[data.run_id] = info
        else:
            info.update(
                run_id=mrun.info.run_id if mrun is not None else "",
                # the fitted metric's (the summary's <metric>_start, _final)
                pass_rate_start=_num(summ.get(f"{protocol.metric}_start")) if summ else math.nan,
                pass_rate_final=_num(summ.get(f"{protocol.metric}_final")) if summ else math.nan,
            )
            got.pending.append(info)
    return got


def _title(state: SweepState, got: _Collected) -> str:
    """``fits.md``'s first lines: the sweep, its runs counted by status, where it tracks."""
    counts: dict[str, int] = {}
    for r in [*got.extra.values(), *got.pending]:
        key = r["status"].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    return (
        f"# Sweep {state.name}: {len(state.runs)} runs ({', '.join(f'{v} {k}' for k, v in counts.items())})\n\n"
        f"MLflow: experiment `{state.name}`, parent run `{state.parent_run_id}`, tracking `{state.tracking_uri}`."
    )


def _not_run(state: SweepState) -> dict[str, str]:
    """variant -> why: the variants none of whose runs were launched (their component cannot act
    where they would run)."""
    runs_of: dict[str, list[PlannedRun]] = {}
    for r in state.runs:
        runs_of.setdefault(r.variant, []).append(r)
    return {v: rs[0].skip for v, rs in runs_of.items() if all(r.skip for r in rs)}


def _parent_metrics(rows: list[dict], A_mean: float) -> list:
    """The parent run's counts (``sweep/runs*``) and the mean fitted A over the runs."""
    from mlflow.entities import Metric

    from scalerl.scaling.sigmoid import round_to

    ts = int(time.time() * 1000)
    pm = [
        Metric("sweep/runs", float(len(rows)), ts, 0),
        Metric("sweep/runs_finished", float(sum(r["status"] == "finished" for r in rows)), ts, 0),
        Metric(
            "sweep/runs_failed",
            float(sum(r["status"] in ("failed", "cancelled", "timeout") for r in rows)),
            ts,
            0,
        ),
        Metric("sweep/runs_fitted", float(sum(bool(r.get("ok")) for r in rows)), ts, 0),
    ]
    if math.isfinite(A_mean):
        pm.append(Metric("fit/A_mean", round_to(A_mean), ts, 0))
    return pm


def build_report(state: SweepState, *, write_back: bool = True, say=print) -> Report:
    """Fit the runs of a launched sweep (``state``: its ``sweep.json``) and write the report: the
    finished runs go through :func:`scalerl.analysis.report` (ΔA, ΔB against the sweep's declared
    baseline variant), the others are listed with their status and log; the files and the table
    are attached to the parent run."""
    from scalerl.analysis import FitProtocol, ReportInput, report
    from scalerl.analysis.reporting import write_parent

    client = client_for(state.tracking_uri)
    protocol = FitProtocol.from_config(state.scaling)  # its metric: the curves loaded and fitted
    got = _collect(state, client, protocol)
    asked = ReportInput(
        baseline=state.baseline,
        baseline_given_by=f"the sweep file {state.file or state.name!r}",
        protocol=protocol,
        name=f"Sweep {state.name}",
        title=_title(state, got),
        tags={"fit.report": f"parent run {state.parent_run_id}"},
        pending=got.pending,
        extra=got.extra,
        order=[r.name for r in state.runs],
        variant_order=list(dict.fromkeys(r.variant for r in state.runs)),
        not_run=_not_run(state),
        wall_s=study_wall_s(got.spans),
    )
    rep = report(got.runs, Path(state.sweep_dir) / "report", asked, client=client if write_back else None)

    # ---- the parent run: counts, the table as its description, the files as artifacts
    parent, rows = state.parent_run_id, rep.rows
    client.log_batch(parent, metrics=_parent_metrics(rows, rep.result.A_mean))
    view = write_parent(client, parent, rep, description=state.description or "")
    for f in rep.files:
        client.log_artifact(parent, str(f), "report")
    failed = [r for r in rows if r["status"] in ("failed", "cancelled", "timeout", "interrupted")]
    return Report(
        rows=rows,
        markdown=rep.markdown,
        out_dir=rep.out_dir,
        files=rep.files,
        failed=failed,
        parent_run_id=parent,
        view=view,
    )
