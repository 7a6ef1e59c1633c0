"""The sweep report: fit every run's scaling curve and compare the variants by A and B.

Uses the scaling engine (:mod:`scalerl.analysis`, :mod:`scalerl.scaling`) and adds what a sweep
knows on top: the planned runs (also those that failed before reaching MLflow), their status and
logs, and the baseline. Writes, into ``<sweep dir>/report/`` and as artifacts ``report/*`` of the
parent run: ``fits.csv``, ``fits.md``, ``scaling_curves.png`` (every curve on one figure),
``linearised.png`` (``log F(R)`` against ``log C``, A fixed to the sweep mean: slope = B); and
``fit/*`` metrics on every fitted child run, so the MLflow UI compares variants by ``fit/A``,
``fit/B``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalerl.sweep.state import STATUS_FILE, client_for, read_json

MARGIN_A = 0.02  # the paper's margin on A (three seeds differed by at most 0.015)


@dataclass
class Report:
    rows: list[dict]
    markdown: str
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    parent_run_id: str = ""


# a fitted ceiling whose interval reaches this is bounded by the pass rate's range, not by the data
A_CEILING_NOTE = 0.999


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _fmt(v, spec: str, signed: bool = False) -> str:
    f = _num(v)
    if not math.isfinite(f):
        return ""
    return format(f, ("+" if signed else "") + spec)


def _run_status(run: dict, status: dict, mlflow_run) -> str:
    s = read_json(Path(run["out_dir"]) / "summary.json")
    if s and int(s.get("steps", 0)) >= int(run["total_steps"]):
        return "finished"
    st = (status.get(run["name"]) or {}).get("status")
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


def _run_id(run: dict, uri: str, children: dict) -> str | None:
    info = read_json(Path(run["out_dir"]) / "run_info.json")
    if info.get("run_id") and info.get("uri", uri) == uri:
        return info["run_id"]
    child = children.get(run["name"])
    return child.info.run_id if child is not None else None


def build_report(state: dict, *, write_back: bool = True, say=print) -> Report:
    """Fit the runs of a launched sweep (``state`` = its ``sweep.json``) and write the report."""
    from scalerl.analysis import analyse_runs
    from scalerl.analysis.mlflow_io import load_run
    from scalerl.analysis.mlflow_io import write_back as write_fit
    from scalerl.scaling.plot import plot_fit, plot_linearised

    uri, parent, exp_id = state["tracking_uri"], state["parent_run_id"], state["experiment_id"]
    sweep_dir = Path(state["runs"][0]["out_dir"]).parent if state.get("runs") else Path(".")
    sweep_dir = Path(state.get("sweep_dir", sweep_dir))
    status = read_json(sweep_dir / STATUS_FILE)
    client = client_for(uri)
    children = _children(client, exp_id, parent)
    scaling = state.get("scaling") or {}
    baseline = state.get("baseline")
    multi_seed = len({r["seed"] for r in state["runs"]}) > 1

    # ---- which runs exist, their status, and the data of the finished ones
    planned = state["runs"]
    mruns: dict[str, object] = {}
    rows: list[dict] = []
    for run in planned:
        rid = _run_id(run, uri, children)
        mrun = None
        if rid:
            try:
                mrun = client.get_run(rid)
            except Exception:
                mrun = None
        st = _run_status(run, status, mrun)
        summ = read_json(Path(run["out_dir"]) / "summary.json")
        entry = status.get(run["name"]) or {}
        rows.append(
            {
                "job": run["name"],
                "variant": run["variant"],
                "seed": run["seed"],
                "status": st,
                "run_id": mrun.info.run_id if mrun is not None else "",
                "overrides": " ".join(run["overrides"]),
                "steps": summ.get("steps", 0) if summ else 0,
                "pass_rate_start": _num(summ.get("pass_rate_start")) if summ else math.nan,
                "pass_rate_final": _num(summ.get("pass_rate_final")) if summ else math.nan,
                "log": entry.get("log", ""),
                "error": entry.get("error", "") if st != "finished" else "",
            }
        )
        if st == "finished" and mrun is not None:
            mruns[run["name"]] = mrun

    data = {name: load_run(client, r) for name, r in mruns.items()}
    res = None
    if data:
        res = analyse_runs(
            list(data.values()),
            method=scaling.get("method", "direct"),
            min_compute_frac=float(scaling.get("min_compute_frac", 0.1)),
            bootstrap=int(scaling.get("bootstrap", 200)),
            baseline=None,
            fixed_A=True,
            predict_check=True,
        )
    by_id = {r["run_id"]: r for r in res.rows} if res else {}

    # ---- fits into the rows; delta A against the baseline (mean over its seeds)
    for row in rows:
        fitted = by_id.get(row["run_id"]) if row["job"] in data else None
        row["ok"] = bool(fitted and fitted["ok"])
        row["reason"] = (fitted or {}).get("reason", "") if fitted else ""
        for k in ("A", "A_lo", "A_hi", "B", "B_lo", "B_hi", "C_mid", "C_mid_lo", "C_mid_hi", "R0"):
            row[k] = _num((fitted or {}).get(k))
        for k in ("n_points", "n_evals"):
            row[k] = int((fitted or {}).get(k, 0) or 0)
        row["compute_axis"] = (fitted or {}).get("compute_axis", "")
        row["A_fixed"] = _num(res.A_mean) if res else math.nan
        row["B_fixed_A"] = _num((fitted or {}).get("B_fixed_A"))
        row["C_mid_fixed_A"] = _num((fitted or {}).get("C_mid_fixed_A"))
        row["pred_mae"] = _num((fitted or {}).get("pred_mae"))
        row["pred_err_last"] = _num((fitted or {}).get("pred_err_last"))
        row["baseline"] = row["variant"] == baseline
    base_a = [r["A"] for r in rows if r["baseline"] and r["ok"]]
    base_A = float(np.mean(base_a)) if base_a else math.nan
    for row in rows:
        if row["ok"] and math.isfinite(base_A):
            row["delta_A"] = row["A"] - base_A
            row["exceeds_margin"] = abs(row["delta_A"]) > MARGIN_A
        else:
            row["delta_A"] = math.nan
            row["exceeds_margin"] = ""

    # ---- files
    out = sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    files = []
    from scalerl.analysis import rows_to_csv

    files.append(rows_to_csv(rows, out / "fits.csv"))
    md = render_markdown(state, rows, res, multi_seed=multi_seed)
    (out / "fits.md").write_text(md)
    files.append(out / "fits.md")
    if res is not None:
        name_of = {r.run_id: job for job, r in data.items()}
        axis = {r.compute_axis for r in data.values()}
        xlabel = {"flops": "compute (FLOPs)", "device_hours": "compute (device-hours)"}.get(
            axis.pop() if len(axis) == 1 else "", "compute"
        )
        order = [row["run_id"] for row in rows if row["job"] in data]
        files.append(
            plot_fit(
                out / "scaling_curves.png",
                [(name_of[i], res.fits[i]) for i in order],
                extrapolate=float(scaling.get("extrapolate", 2.0)),
                title=f"Sweep {state['name']}: validation pass rate vs compute",
                xlabel=xlabel,
            )
        )
        lin = [(name_of[i], res.fixed_fits[i]) for i in order if i in res.fixed_fits and res.fixed_fits[i].ok]
        title = f"Sweep {state['name']}: linearised, A fixed to the mean {res.A_mean:.3f} (slope = B)"
        if not lin:
            lin = [(name_of[i], res.fits[i]) for i in order if res.fits[i].ok]
            title = f"Sweep {state['name']}: linearised fits (slope = B)"
        files.append(plot_linearised(out / "linearised.png", lin, title=title, xlabel=xlabel))

    # ---- MLflow: artifacts, note and counts on the parent; fit/* on the children
    from mlflow.entities import Metric, RunTag

    ts = int(time.time() * 1000)
    n_fin = sum(r["status"] == "finished" for r in rows)
    n_bad = sum(r["status"] in ("failed", "cancelled", "timeout") for r in rows)
    pm = [
        Metric("sweep/runs", float(len(rows)), ts, 0),
        Metric("sweep/runs_finished", float(n_fin), ts, 0),
        Metric("sweep/runs_failed", float(n_bad), ts, 0),
        Metric("sweep/runs_fitted", float(sum(r["ok"] for r in rows)), ts, 0),
    ]
    if res is not None and math.isfinite(res.A_mean):
        pm.append(Metric("fit/A_mean", float(res.A_mean), ts, 0))
    note = (state.get("description") or "").strip()
    client.log_batch(
        state["parent_run_id"],
        metrics=pm,
        tags=[RunTag("mlflow.note.content", ((note + "\n\n") if note else "") + md)],
    )
    for f in files:
        client.log_artifact(parent, str(f), "report")
    if write_back and res is not None:
        for job, rd in data.items():
            row = next(r for r in rows if r["job"] == job)
            fit = res.fits[rd.run_id]
            metrics = fit.to_metrics("fit/")
            for k in ("delta_A", "A_fixed", "B_fixed_A", "C_mid_fixed_A"):
                metrics[f"fit/{k}"] = _num(row[k])
            if row["exceeds_margin"] != "":
                metrics["fit/exceeds_margin"] = 1.0 if row["exceeds_margin"] else 0.0
            tags = {
                "fit.summary": fit.summary(),
                "fit.reason": fit.reason or "ok",
                "fit.variant": row["variant"],
                "fit.report": f"parent run {parent}",
            }
            write_fit(client, rd, metrics, tags=tags)
    failed = [r for r in rows if r["status"] in ("failed", "cancelled", "timeout", "interrupted")]
    return Report(rows=rows, markdown=md, out_dir=out, files=files, failed=failed, parent_run_id=parent)


def render_markdown(state: dict, rows: list[dict], res, *, multi_seed: bool) -> str:
    scaling = state.get("scaling") or {}
    a_mean = res.A_mean if res is not None else math.nan
    n = len(rows)
    counts: dict[str, int] = {}
    for r in rows:
        key = r["status"].split(" ")[0]
        counts[key] = counts.get(key, 0) + 1
    lines = [
        f"# Sweep {state['name']}: {n} runs ({', '.join(f'{v} {k}' for k, v in counts.items())})",
        "",
        f"MLflow: experiment `{state['name']}`, parent run `{state['parent_run_id']}`, tracking `{state['tracking_uri']}`.",
        f"Fit: `R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)` of `val/pass_rate` against compute "
        f"({scaling.get('compute_axis', 'flops')}), method {scaling.get('method', 'direct')}, points below "
        f"{float(scaling.get('min_compute_frac', 0.1)):.0%} of each run's budget left out, "
        f"90% bootstrap intervals ({int(scaling.get('bootstrap', 200))} resamples).",
        "",
    ]
    b_head = f"B @ A={a_mean:.3f}" if math.isfinite(a_mean) else "B @ mean A"
    head = (
        ["variant"]
        + (["seed"] if multi_seed else [])
        + [
            "status",
            "A [90% CI]",
            "B",
            "C_mid",
            "ΔA vs baseline",
            f"abs(ΔA) > {MARGIN_A}",
            b_head,
            "pass rate start → final",
            "note",
        ]
    )
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        a = ""
        if r["ok"]:
            a = f"{r['A']:.3f}"
            if math.isfinite(r["A_lo"]):
                a += f" [{r['A_lo']:.3f}, {r['A_hi']:.3f}]"
        notes = []
        if r["baseline"]:
            notes.append("baseline")
        if r["status"] == "finished" and not r["ok"]:
            notes.append(f"not fittable: {r['reason']}")
        if r["ok"] and _num(r.get("A_hi")) >= A_CEILING_NOTE:
            notes.append(
                "A unsettled: its interval reaches 1, so the data cannot rule out a ceiling of 1 (run longer)"
            )
        if r["status"] not in ("finished",) and r.get("error"):
            notes.append(r["error"])
        if r["status"] not in ("finished",) and r.get("log"):
            notes.append(f"log: {r['log']}")
        pr = ""
        if math.isfinite(r["pass_rate_start"]):
            pr = f"{r['pass_rate_start']:.3f} → {r['pass_rate_final']:.3f}"
        exceeds = {True: "yes", False: "no"}.get(r["exceeds_margin"], "") if r["exceeds_margin"] != "" else ""
        cells = (
            [r["job"]]
            + ([str(r["seed"])] if multi_seed else [])
            + [
                r["status"],
                a,
                _fmt(r["B"], ".2f") if r["ok"] else "",
                _fmt(r["C_mid"], ".3g") if r["ok"] else "",
                _fmt(r["delta_A"], ".3f", signed=True),
                exceeds,
                _fmt(r["B_fixed_A"], ".2f"),
                pr,
                "; ".join(notes),
            ]
        )
        lines.append("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |")
    lines.append("")
    baseline = state.get("baseline")
    if baseline:
        lines.append(
            f"ΔA = A - A({baseline}); `abs(ΔA) > {MARGIN_A}` flags a difference beyond the paper's "
            f"seed-to-seed margin on A."
        )
    lines.append(
        "B @ A: B refitted with A fixed to the mean A over the fitted runs (the paper's way to compare "
        "efficiency when the ceilings are close)."
    )
    return "\n".join(lines) + "\n"
