"""The end of a run: its ``summary.json``, the lines it prints, and a rerun of a finished run (which
writes the metrics the tracking store lacked, then only prints its summary)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from scalerl.messages import RunError
from scalerl.scaling.live import FIT_LEVEL, horizon_line
from scalerl.scaling.sigmoid import N_PARAMS
from scalerl.storage import write_json
from scalerl.tracking import Checkpointer, Tracker
from scalerl.tracking.secrets import redact
from scalerl.tracking.tracker import absolute_uri, sqlite_file

if TYPE_CHECKING:
    from scalerl.config.schema import TrackingConfig
    from scalerl.loop.components import Components

log = logging.getLogger("scalerl")


class MetricsUnflushed(RunError):
    """The run ended, but the tracking store did not take all its metrics or artifacts: they are kept
    (the metrics in the checkpoint, the artifacts in the out_dir's ``tracking_outbox``), and running
    the same command again writes them."""


def unflushed_message(n: int, uri: str, ckpt, artifacts: int = 0, outbox=None) -> str:
    what, where = [], []
    if n or not artifacts:
        what.append(f"{n} metric values")
        where.append(str(ckpt))
    if artifacts:
        what.append(f"{artifacts} artifacts")
        where.append(str(outbox))
    return (
        f"the run ended, but {' and '.join(what)} could not be written to the tracking store {redact(uri)}; "
        f"they are kept in {' and '.join(where)}: run the same command again to write them"
    )


def write_summary(run: Components) -> dict:
    """The run's summary (``summary.json`` in its out_dir, written by rank 0)."""
    st, metric = run.state, run.fit_protocol.metric
    summary = {
        "run_id": run.tracker.run_id,
        "out_dir": str(run.out_dir),
        "steps": st.step,
        "evals": st.evals,
        "pass_rate_start": st.evals[0]["pass_rate"] if st.evals else None,
        "pass_rate_final": st.evals[-1]["pass_rate"] if st.evals else None,
        "wall_seconds": st.elapsed,
        "metrics_unflushed": len(run.tracker.pending),
        "artifacts_unsent": len(run.tracker.unsent_artifacts()) if run.is_main else 0,
        "mlflow_status": run.tracker.status,
        "tracking_uri": redact(run.tracker.uri),
        "fit": run.final_fit or {},
        "fit_level": FIT_LEVEL,
        "fit_metric": run.fit_protocol.reward_key,  # what fit/* is fitted to (scaling.metric)
    }
    if metric != "pass_rate":  # <metric>_start, _final: the fitted pass@k's (a sweep's report reads them)
        summary[f"{metric}_start"] = st.evals[0].get(metric) if st.evals else None
        summary[f"{metric}_final"] = st.evals[-1].get(metric) if st.evals else None
    if run.is_main:
        write_json(run.out_dir / "summary.json", summary)
    return summary


def summary_lines(summary: dict) -> list[str]:
    """The lines a finished run ends with: pass rate, fit, where its outputs and MLflow run are."""
    wall = summary["wall_seconds"]
    took = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.1f} min"
    lines = [f"done: {summary['steps']} steps in {took}"]
    if summary.get("pass_rate_start") is not None:
        lines.append(
            f"held-out pass rate: {summary['pass_rate_start']:.3f} -> {summary['pass_rate_final']:.3f}"
        )
    key = summary.get("fit_metric", "val/pass_rate")
    metric = key.removeprefix("val/")
    start, final = summary.get(f"{metric}_start"), summary.get(f"{metric}_final")
    if key != "val/pass_rate" and start is not None and final is not None:
        lines.append(f"held-out {key}: {start:.3f} -> {final:.3f}")
    fit = summary.get("fit") or {}
    level = summary.get("fit_level", FIT_LEVEL)
    of = "" if key == "val/pass_rate" else f" of {key}"
    lines += fit_lines(fit, f"scaling fit{of}", level) or [no_fit_line(fit, len(summary.get("evals") or []))]
    for d in fit_domains(fit):  # task=multi: each domain's own fit (the paper's Fig. 11 fits them apart)
        lines += fit_lines(fit, f"scaling fit{of}, {d}", level, prefix=f"fit/{d}/", what=f"the {d} fit")
    lines.append(f"outputs: {summary['out_dir']}")
    uri = summary.get("tracking_uri", "")
    uri = absolute_uri(uri) if sqlite_file(uri) is not None else uri  # opens from any directory
    lines.append(f"MLflow run {summary['run_id']} in {uri}")
    if uri and not uri.startswith(("http://", "https://", "databricks")):
        lines.append(f"open it: mlflow ui --backend-store-uri {uri}")
    elif uri:
        lines.append(f"open it: {uri}")
    return lines


FIT_MIN_EVALS = 4  # held-out evaluations (step 0's included) before a run fits its curve


def no_fit_line(fit: dict, evals: int) -> str:
    """Why a run ends without a scaling fit: too few evaluations, or a fit that failed on its points."""
    if evals < FIT_MIN_EVALS:
        return (
            f"no scaling fit: {evals} held-out evaluation{'s' * (evals != 1)}, a fit needs {FIT_MIN_EVALS} "
            "(a larger trainer.total_steps or a smaller eval.every)"
        )
    n = int(fit.get("fit/n_points", 0) or 0)
    if n < N_PARAMS:
        return (
            f"no scaling fit: {n} held-out evaluation{'s' * (n != 1)} at or after the early cut "
            f"(scaling.min_step), a sigmoid needs {N_PARAMS} (a smaller scaling.min_step, a larger "
            "trainer.total_steps or a smaller eval.every)"
        )
    return f"no scaling fit: the sigmoid did not fit the {n} points past the early cut (scaling.min_step)"


def fit_domains(fit: dict) -> list[str]:
    """The ``task=multi`` domains a run's fit metrics hold a fit of (``fit/<domain>/ok``)."""
    return sorted({k.split("/")[1] for k in fit if k.count("/") == 2 and k.endswith("/ok")})


def fit_lines(
    fit: dict, name: str, level: float, *, prefix: str = "fit/", what: str = "the scaling fit"
) -> list[str]:
    """A fit's lines at the end of a run (none where it failed): A and B with their intervals and
    what they can be read as, then whether extrapolating it is supported (the horizon and fall
    rules) or how much more compute would make it so."""
    if fit.get(f"{prefix}ok") != 1.0:
        return []

    def est(param: str) -> str:
        v, lo, hi = (fit.get(f"{prefix}{param}{s}", math.nan) for s in ("", "_lo", "_hi"))
        return f"{param} = {v:.3g}" + ("" if math.isnan(lo) else f" [{lo:.3g}, {hi:.3g}]")

    lines = [f"{name}: {est('A')}, {est('B')} " + fit_caveat(fit, level, prefix=prefix)]
    if horizon := horizon_line(fit, prefix, what=what):
        lines.append(horizon)
    return lines


def fit_caveat(fit: dict, level: float, *, prefix: str = "fit/") -> str:
    """What a run's fitted A and B can be read as: with their intervals (of this run's points, not
    of a repeat), or why they have none and whether the ceiling sits at its bound (then these points
    do not determine it)."""
    n = int(fit.get(f"{prefix}n_points", 0) or 0)
    a, lo = fit.get(f"{prefix}A", math.nan), fit.get(f"{prefix}A_lo", math.nan)
    if 0 < n <= N_PARAMS:
        at_bound = "; A at its bound 1" if a >= 0.999 else ""
        return (
            f"(fitted on {n} points for {N_PARAMS} parameters: nothing is left to check the curve against, "
            f"so A is not a measured ceiling and nothing is extrapolated from it{at_bound})"
        )
    if math.isnan(lo):
        notes = [f"no intervals: {n} points after the early cut leave none to estimate them"]
    else:
        # the bootstrap of this run's points: a repeat of the run (pipeline_rl's timing differs
        # between runs of one seed) can land outside them, so a run's spread comes from seeds
        notes = [f"{level:.0%} intervals of this run's points; a repeat can land outside them: compare seeds"]
    if a >= 0.999:
        notes.append("A at its bound 1: these points do not determine the ceiling")
    return "(" + "; ".join(notes) + ")"


def print_summary(summary: dict) -> None:
    for line in summary_lines(summary):
        print(f"[scalerl] {line}", flush=True)


def finished_summary(out_dir: Path, total_steps: int, tracking: TrackingConfig) -> dict | None:
    """The summary of the run in ``out_dir`` that finished its ``total_steps``, or None if it has
    not. Metrics its checkpoint holds that the tracking store (the ``tracking`` section's) lacks
    are written first, and its MLflow run is marked FINISHED (the store was unreachable when it
    ended)."""
    out_dir = Path(out_dir)
    done = out_dir / "summary.json"
    if not done.is_file():
        return None
    summary = json.loads(done.read_text())
    if summary.get("steps", 0) < total_steps:
        return None
    if (
        summary.get("metrics_unflushed")
        or summary.get("artifacts_unsent")
        or summary.get("mlflow_status") != "FINISHED"
    ):
        ck = Checkpointer(out_dir)
        if ck.exists():
            state = ck.load()
            run_id, pending = state["run_id"], state["pending_metrics"]
        else:  # nothing kept to write: only the run's status to set
            run_id, pending = summary["run_id"], []
        tracker = Tracker(tracking, out_dir)
        try:
            written = tracker.catch_up(run_id, pending)
        except Exception as e:
            unsent = len(tracker.unsent_artifacts())
            raise MetricsUnflushed(
                unflushed_message(len(pending), tracker.uri, ck.path, unsent, tracker.outbox)
                + f" ({type(e).__name__})"
            ) from None
        unsent = len(tracker.unsent_artifacts())
        if tracker.pending or unsent or tracker.status != "FINISHED":
            raise MetricsUnflushed(
                unflushed_message(len(tracker.pending), tracker.uri, ck.path, unsent, tracker.outbox)
            )
        summary.update(
            metrics_unflushed=0,
            artifacts_unsent=0,
            mlflow_status=tracker.status,
            tracking_uri=redact(tracker.uri),
        )
        write_json(done, summary)
        log.info(
            "wrote %d metric values (and any kept artifacts) the tracking store lacked; MLflow run %s is FINISHED",
            written,
            summary["run_id"],
        )
    log.info("run in %s already finished (%d steps); nothing to do", out_dir, summary["steps"])
    return summary
