"""Reading training runs from MLflow and writing fit results back.

Data contract of a training run: metric ``val/pass_rate`` at each evaluation with ``step`` = the
optimiser step (step 0 = before any update); at the same steps the cumulative ``compute/flops`` and
``compute/device_hours``.  The run param ``scaling.compute_axis`` ("flops" | "device_hours",
default "flops") says which is the x-axis.  Points are paired by step.  Another fitted metric
(``reward_key``: ``val/pass_at_<k>``, logged at the same steps with ``eval.pass_at_k``) is read the
same way.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REWARD_KEY = "val/pass_rate"
COMPUTE_KEYS = {"flops": "compute/flops", "device_hours": "compute/device_hours"}
DEFAULT_URI = "sqlite:///mlflow.db"


class AnalysisError(RuntimeError):
    """A user-facing problem (no such experiment, no runs): the CLI prints it and exits 2."""


def resolve_tracking_uri(uri: str | None = None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def check_uri(uri: str) -> None:
    """:class:`AnalysisError` (one line) for a malformed tracking URI or a server that does not answer."""
    from scalerl.config.preflight import PathError, check_tracking_uri
    from scalerl.tracking.tracker import sqlite_file

    try:
        check_tracking_uri(uri, key="--tracking-uri")
    except PathError as e:
        raise AnalysisError(str(e)) from None
    except ValueError as e:  # urlparse's own (an unclosed IPv6 bracket ...)
        raise AnalysisError(f"--tracking-uri={uri!r}: not a URI ({e})") from None
    # reading must not create a store: a mistyped sqlite or folder path is an error, not an empty store
    local = None
    if (db := sqlite_file(uri)) is not None:
        local = str(db)
    elif uri.startswith("file://"):
        local = uri[len("file://") :]
    elif "://" not in uri:
        local = uri
    if local and local != ":memory:" and not Path(local).expanduser().exists():
        raise AnalysisError(f"--tracking-uri={uri!r}: no such tracking store ({local} does not exist)")
    if db is not None and local and Path(local).expanduser().is_file():
        empty = _empty_sqlite(Path(local).expanduser())
        if empty:  # MLflow would create its tables in it: reading must write nothing
            raise AnalysisError(f"--tracking-uri={uri!r}: {empty}, not an MLflow store (nothing to read)")


def _empty_sqlite(path: Path) -> str:
    """Why the sqlite file ``path`` holds no store ("" when it has tables): an empty file or a
    database without tables (what MLflow would turn into a new store)."""
    import sqlite3

    if path.stat().st_size == 0:
        return f"{path} is an empty file"
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            n = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return ""  # locked or not a database: check_tracking_uri and MLflow say which
    return f"{path} is an SQLite database with no tables" if n == 0 else ""


def _get_run(client, run_id: str):
    from mlflow.exceptions import MlflowException

    from scalerl.tracking.secrets import redact

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        if "not found" in str(e).lower() or "RESOURCE_DOES_NOT_EXIST" in str(getattr(e, "error_code", "")):
            raise AnalysisError(
                f"no MLflow run with id {run_id!r} at {redact(client.tracking_uri)}"
            ) from None
        raise AnalysisError(f"run {run_id!r}: {str(e).strip().splitlines()[0]}") from None


def make_client(uri: str | None = None):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=resolve_tracking_uri(uri))


@dataclass
class RunData:
    run_id: str
    run_name: str
    status: str
    experiment_id: str
    params: dict[str, str]
    tags: dict[str, str]
    compute_axis: str
    steps: np.ndarray
    compute: np.ndarray
    reward: np.ndarray
    notes: list[str] = field(default_factory=list)
    activity: dict[str, float] = field(default_factory=dict)
    """What the run's components did (see :data:`ACTIVITY`); a key is missing when the run did not
    log its metric."""
    reward_key: str = REWARD_KEY
    """The metric ``reward`` holds: ``val/pass_rate``, or the ``val/pass_at_<k>`` fitted instead."""

    @property
    def last_step(self) -> int:
        return int(self.steps.max()) if self.steps.size else 0


ACTIVITY = {
    "retired": ("data/prompts_retired", "last"),
    "epochs": ("data/epochs", "last"),
    "lag_max": ("train/policy_lag_max", "max"),
    "interruptions": ("train/interruption_rate", "max"),
    "zero_variance_groups": ("data/zero_variance_groups_step", "sum"),
    "zero_variance_dropped": ("data/zero_variance_dropped", "last"),
}
"""activity key -> (metric, how its history is summarised): prompts retired by the pass-rate
tracker, epochs over the train split, the largest policy lag trained on, the largest fraction of
interrupted samples in a step, zero-variance groups seen (whether or not dropped) and dropped."""


def load_activity(client, run_id: str, latest: dict[str, float]) -> dict[str, float]:
    """The :data:`ACTIVITY` summaries of a run (``latest``: its latest metric values); cumulative
    metrics are read from ``latest``, the others from their history."""
    out = {}
    for key, (metric, how) in ACTIVITY.items():
        if metric not in latest:
            continue
        if how == "last":
            out[key] = float(latest[metric])
            continue
        values = list(metric_history(client, run_id, metric).values())
        values = [v for v in values if math.isfinite(v)]
        if values:
            out[key] = float(max(values) if how == "max" else sum(values))
    return out


def metric_history(client, run_id: str, key: str) -> dict[int, float]:
    """step -> value (the latest by timestamp when a step was logged twice)."""
    return _history(client, run_id, key)[0]


def _history(client, run_id: str, key: str) -> tuple[dict[int, float], list[int]]:
    """:func:`metric_history` and the steps logged more than once with different values."""
    out: dict[int, tuple[int, float]] = {}
    conflicts = set()
    for m in client.get_metric_history(run_id, key):
        prev = out.get(m.step)
        if prev is not None and not _same(prev[1], float(m.value)):
            conflicts.add(int(m.step))
        if prev is None or m.timestamp >= prev[0]:
            out[m.step] = (m.timestamp, float(m.value))
    return {s: v for s, (_, v) in out.items()}, sorted(conflicts)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


MLFLOW_INF = sys.float_info.max
"""MLflow stores an infinite metric value as the largest float (and -inf as its negative)."""


def _usable(v: float) -> bool:
    return math.isfinite(v) and abs(v) < MLFLOW_INF


def _steps(steps: list[int], limit: int = 6) -> str:
    """``step 10`` / ``steps 10, 20, 30`` / ``steps 10, 20, 30, ... 200 (20 evaluations)``."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= limit:
        return "steps " + ", ".join(map(str, steps))
    head = ", ".join(map(str, steps[: limit - 1]))
    return f"steps {head}, ... {steps[-1]} ({len(steps)} evaluations)"


def load_run(client, run, *, reward_key: str = REWARD_KEY) -> RunData:
    info, data = run.info, run.data
    params = dict(data.params)
    axis = params.get("scaling.compute_axis", "flops")
    notes = []
    if axis not in COMPUTE_KEYS:
        notes.append(f"unknown scaling.compute_axis {axis!r}; using flops")
        axis = "flops"
    ckey = COMPUTE_KEYS[axis]
    rew, rew_twice = _history(client, info.run_id, reward_key)
    comp, comp_twice = _history(client, info.run_id, ckey)
    steps, cs, rs = [], [], []
    unpaired, bad = [], []
    for s in sorted(rew):
        if s in comp:
            c = comp[s]
        elif s == 0:
            c = 0.0  # the step-0 evaluation: no compute spent yet
        else:
            unpaired.append(s)
            continue
        # a fit or a plot of inf/nan is noise (MLflow stores inf as the largest float)
        if not (_usable(c) and _usable(rew[s])):
            bad.append((s, rew[s], c))
            continue
        steps.append(s)
        cs.append(c)
        rs.append(rew[s])
    if unpaired:
        notes.append(f"{_steps(unpaired)}: {reward_key} without {ckey}; skipped")
    if bad:

        def shown(v: float) -> str:
            return ("inf" if v > 0 else "-inf") if math.isfinite(v) and abs(v) >= MLFLOW_INF else f"{v:g}"

        s, r_, c = bad[0]
        first = f"{reward_key}={shown(r_)}, {ckey}={shown(c)}"
        if len(bad) == 1:
            notes.append(f"step {s}: {first} not finite; skipped")
        else:
            notes.append(f"{_steps([b[0] for b in bad])}: not finite (step {s}: {first}); skipped")
    for key, twice in ((reward_key, rew_twice), (ckey, comp_twice)):
        if twice:
            notes.append(
                f"{_steps(twice)}: {key} logged more than once with different values; the latest used"
            )
    return RunData(
        run_id=info.run_id,
        run_name=info.run_name or data.tags.get("mlflow.runName", info.run_id[:8]),
        status=info.status,
        experiment_id=info.experiment_id,
        params=params,
        tags=dict(data.tags),
        compute_axis=axis,
        steps=np.asarray(steps, dtype=int),
        compute=np.asarray(cs, dtype=float),
        reward=np.asarray(rs, dtype=float),
        notes=notes,
        activity=load_activity(client, info.run_id, dict(data.metrics)),
        reward_key=reward_key,
    )


def load_runs(
    client,
    experiment: str | None = None,
    run_ids: list[str] | None = None,
    *,
    include_running: bool = False,
    reward_key: str = REWARD_KEY,
    left_out: list[tuple[RunData, str]] | None = None,
) -> list[RunData]:
    """Runs of ``experiment`` (by name) that logged ``reward_key`` (finished ones, plus running
    ones with ``include_running``), or exactly the given ``run_ids`` (any status).

    ``left_out``: a list that receives ``(run, why)`` for each other run of the experiment (failed,
    killed, still running, or without ``reward_key``; ``run`` has no curve), so that a report can
    name them rather than leave them out silently; parent runs (a sweep's) are not listed."""
    if run_ids:
        runs = [_get_run(client, r) for r in run_ids]
    else:
        if not experiment:
            raise AnalysisError("give an experiment name or run ids")
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise AnalysisError(f"no MLflow experiment named {experiment!r}")
        if exp.lifecycle_stage == "deleted":  # its runs are hidden: say why there are none
            raise AnalysisError(
                f"MLflow experiment {experiment!r} is deleted; restore it first "
                f"(mlflow experiments restore --experiment-id {exp.experiment_id})"
            )
        statuses = {"FINISHED"} | ({"RUNNING"} if include_running else set())
        runs, token = [], None
        while True:  # MLflow filters have no OR: filter the status here
            page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                break
        runs.sort(key=lambda r: r.info.start_time or 0)
        if left_out is not None:
            parents = {r.data.tags.get("mlflow.parentRunId") for r in runs}
            for r in runs:
                why = _left_out_why(r, statuses, reward_key)
                if why and r.info.run_id not in parents and r.data.tags.get("sweep.role") != "parent":
                    left_out.append((_bare_run(r), why))
        runs = [r for r in runs if r.info.status in statuses and reward_key in r.data.metrics]
    return [load_run(client, r, reward_key=reward_key) for r in runs]


def _left_out_why(run, statuses: set[str], reward_key: str) -> str:
    """Why :func:`load_runs` leaves ``run`` out ("" when it does not)."""
    status = run.info.status
    if status == "RUNNING" and status not in statuses:
        return "still RUNNING (--include-running fits such runs)"
    if status not in statuses:
        return f"run {status}" + ("" if reward_key in run.data.metrics else f", without {reward_key}")
    if reward_key not in run.data.metrics:
        return f"without {reward_key}"
    return ""


def _bare_run(run) -> RunData:
    """A run's identity, params and tags, without its curve."""
    info, data = run.info, run.data
    empty = np.zeros(0)
    return RunData(
        run_id=info.run_id,
        run_name=info.run_name or data.tags.get("mlflow.runName", info.run_id[:8]),
        status=info.status,
        experiment_id=info.experiment_id,
        params=dict(data.params),
        tags=dict(data.tags),
        compute_axis=data.params.get("scaling.compute_axis", "flops"),
        steps=empty.astype(int),
        compute=empty,
        reward=empty,
    )


def write_back(
    client,
    run: RunData,
    metrics: dict[str, float],
    *,
    tags: dict[str, str] | None = None,
    artifact: str | Path | None = None,
) -> None:
    """One ``log_batch`` of the fit metrics (at the run's last step, so they are the latest
    values the MLflow UI shows as columns), tags, and the plot as artifact ``scaling_curve.png``."""
    from mlflow.entities import Metric, RunTag

    ts = int(time.time() * 1000)
    step = run.last_step
    ms = [Metric(k, float(v) if v is not None else math.nan, ts, step) for k, v in metrics.items()]
    ts_tags = [RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()]
    client.log_batch(run.run_id, metrics=ms, tags=ts_tags)
    if artifact is not None:
        client.log_artifact(run.run_id, str(artifact))


def declared_baseline(client, runs: list[RunData]) -> tuple[str, str] | None:
    """(variant, who declared it) when all ``runs`` are children of one sweep parent run whose
    param ``sweep.baseline`` names the baseline variant; else None."""
    parents = {r.tags.get("mlflow.parentRunId") for r in runs}
    if len(parents) != 1 or None in parents:
        return None
    parent = parents.pop()
    try:
        run = client.get_run(parent)
    except Exception:  # a parent run that is gone declares nothing
        return None
    variant = run.data.params.get("sweep.baseline", "")
    if not variant:
        return None
    sweep = run.data.params.get("sweep.name") or run.info.run_name or parent[:8]
    return variant, f"sweep {sweep!r} (param sweep.baseline of its parent run {parent[:8]})"


def logged_fit_settings(runs: list[RunData], keys) -> tuple[dict, dict[str, list[str]]]:
    """The fit settings ``keys`` (``scaling`` config keys: ``min_step``, ``metric``, ...) the runs
    logged as their ``scaling.<key>`` params: ``(agreed, differing)``, ``agreed`` holding each key
    every run logged with one value (parsed: ``"108"`` -> 108, ``"None"`` -> None, a grid's list), and
    ``differing`` each key the runs logged with several values (those values, sorted). A key some
    run did not log, or logged as text that is no value, is in neither."""
    import ast

    agreed: dict = {}
    differing: dict[str, list[str]] = {}
    for key in keys:
        values = {r.params.get(f"scaling.{key}") for r in runs}
        if None in values or not values:
            continue
        if len(values) > 1:
            differing[key] = sorted(values)
            continue
        text = values.pop()
        try:
            agreed[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            if text.isidentifier():  # a name: "direct", "pass_rate"
                agreed[key] = text
    return agreed, differing
