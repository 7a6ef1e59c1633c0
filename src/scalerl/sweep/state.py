"""The sweep folder and the MLflow parent run.

``<sweep dir>/sweep.json`` holds the plan of the last launch and the MLflow parent run id, so a
re-run (or ``--report``) reuses the same experiment and parent run; it is read once into a
:class:`SweepState` (:func:`load_state`). ``status.json`` holds the outcome of every job (status,
job id, log path, error line).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.storage import write_json
from scalerl.sweep.plan import Plan, PlannedRun
from scalerl.sweep.spec import SweepError
from scalerl.tracking.secrets import redact

SWEEP_FILE = "sweep.json"
STATUS_FILE = "status.json"


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


@dataclass(frozen=True)
class SweepState:
    """``sweep.json``: what the last launch planned and where it tracks. :meth:`to_dict` is the file's
    form (its keys and their order); :meth:`from_dict` reads that file as every version of this
    code wrote it."""

    name: str
    """The sweep's name: its MLflow experiment and its parent run's name."""
    file: str | None
    """The sweep file it was launched from."""
    description: str | None
    """The sweep file's description (the parent run's description opens with it)."""
    baseline: str | None
    """The baseline variant the sweep file declared (None: the report chooses one)."""
    seeds: list[int] | None
    """The sweep file's seeds (None: the config's one seed)."""
    sweep_dir: str
    """The sweep's folder (the runs' ``out_dir`` are inside it)."""
    tracking_uri: str
    """The MLflow tracking URI the runs log to."""
    experiment_id: str
    """The MLflow experiment's id."""
    parent_run_id: str
    """The MLflow parent run of the sweep's runs."""
    launcher: dict[str, Any]
    """The composed launcher group."""
    cli_overrides: list[str]
    """The command line's own overrides, applied to every run after the file's."""
    scaling: dict[str, Any]
    """The composed ``scaling`` settings (how the report fits: :meth:`FitProtocol.from_config`)."""
    updated: str
    """When the launch wrote the file (local time, ISO 8601)."""
    runs: list[PlannedRun]
    """The planned runs, in the plan's (and the report table's) order."""
    other: dict[str, Any] = field(default_factory=dict)
    """Keys of the file this code does not know (kept, and written back as they were)."""

    @classmethod
    def of_plan(cls, plan: Plan, *, experiment_id: str, parent_run_id: str) -> SweepState:
        spec = plan.spec
        return cls(
            name=spec.name,
            file=spec.path,
            description=spec.description,
            baseline=spec.baseline,
            seeds=spec.seeds,
            sweep_dir=str(plan.sweep_dir),
            tracking_uri=plan.tracking_uri,
            experiment_id=experiment_id,
            parent_run_id=parent_run_id,
            launcher=plan.launcher,
            cli_overrides=plan.cli_overrides,
            scaling=plan.scaling,
            updated=time.strftime("%Y-%m-%dT%H:%M:%S"),
            runs=list(plan.runs),
        )

    @classmethod
    def from_dict(cls, d: dict) -> SweepState:
        """The state ``sweep.json`` holds. Keys a file may lack: ``sweep_dir`` (the folder of its
        first run's ``out_dir``), ``scaling`` (the fit protocol's defaults), and those the report
        does not need; a run without ``skip`` was launched."""
        known = {f.name for f in dataclasses.fields(cls)} - {"other"}
        run_keys = {f.name for f in dataclasses.fields(PlannedRun)}
        runs = [PlannedRun(**{k: v for k, v in r.items() if k in run_keys}) for r in d.get("runs") or []]
        default_dir = str(Path(runs[0].out_dir).parent) if runs else "."
        return cls(
            name=d["name"],
            file=d.get("file"),
            description=d.get("description"),
            baseline=d.get("baseline"),
            seeds=d.get("seeds"),
            sweep_dir=d.get("sweep_dir") or default_dir,
            tracking_uri=d["tracking_uri"],
            experiment_id=str(d["experiment_id"]),
            parent_run_id=d["parent_run_id"],
            launcher=d.get("launcher") or {},
            cli_overrides=list(d.get("cli_overrides") or []),
            scaling=d.get("scaling") or {},
            updated=d.get("updated", ""),
            runs=runs,
            other={k: v for k, v in d.items() if k not in known},
        )

    def to_dict(self) -> dict:
        """The file's form: the unknown keys first (a file's own, kept where they were), then the
        known ones in the order the launch writes them."""
        return {
            **self.other,
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if f.name not in ("other", "runs")
            },
            "runs": [r.to_dict() for r in self.runs],
        }


def client_for(uri: str):
    import logging

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    for noisy in ("mlflow", "alembic"):  # "Creating initial MLflow database tables..." and the like
        logging.getLogger(noisy).setLevel(logging.WARNING)

    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, *, create: bool) -> str | None:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    if not create:
        return None
    try:
        return client.create_experiment(name)
    except MlflowException:  # created concurrently
        return client.get_experiment_by_name(name).experiment_id


def _parent_exists(client, run_id: str | None, exp_id: str) -> bool:
    if not run_id:
        return False
    try:
        run = client.get_run(run_id)
    except Exception:
        return False
    return run.info.experiment_id == exp_id and run.info.lifecycle_stage == "active"


def _parent_of_folder(client, exp_id: str, folder: Path):
    """The active parent run of the sweep in ``folder`` (tag ``sweep.folder``), or None."""
    from scalerl.tracking.tracker import run_by_tags

    return run_by_tags(client, exp_id, {"sweep.role": "parent", "sweep.folder": str(folder)})


def start_parent(plan: Plan) -> tuple[str, str]:
    """(experiment id, parent run id): reuse the sweep folder's parent run when it still exists,
    else create one. Writes ``sweep.json`` and marks the parent RUNNING."""
    from mlflow.entities import Param, RunTag

    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    state = read_json(plan.sweep_dir / SWEEP_FILE)
    client = client_for(plan.tracking_uri)
    exp_id = experiment_id(client, plan.spec.name, create=True)
    spec = plan.spec
    parent = state.get("parent_run_id") if state.get("tracking_uri") == plan.tracking_uri else None
    launch_tags = [
        RunTag("sweep.command_line", redact(" ".join(plan.cli_overrides))[:5000]),
        RunTag("sweep.launcher", " ".join(plan.launcher_overrides) or "launcher=local"),
        RunTag("sweep.folder", str(plan.sweep_dir)),
    ]
    params = {
        "sweep.name": spec.name,
        "sweep.file": spec.path,
        "sweep.base": " ".join(spec.base),
        "sweep.seeds": ",".join(map(str, spec.seeds)) if spec.seeds is not None else "config",
        "sweep.baseline": spec.baseline or "",
        "sweep.variants": ",".join(spec.variants),
        # the command line's own overrides, applied to every run after the file's
        "sweep.cli_overrides": " ".join(plan.cli_overrides) or "(none)",
    }
    for name, ovs in spec.variants.items():
        params[f"variant.{name}"] = " ".join(ovs) or "(no overrides)"
    params = {k[:250]: redact(v)[:6000] for k, v in params.items()}
    if not _parent_exists(client, parent, exp_id):
        # a parent created by a start killed before it wrote sweep.json: found by its folder
        found = _parent_of_folder(client, exp_id, plan.sweep_dir)
        parent = found.info.run_id if found is not None else None
    if parent is not None:
        client.update_run(parent, status="RUNNING")
        have = client.get_run(parent).data.params
        params = {k: v for k, v in params.items() if k not in have}
    else:
        tags = {
            "sweep": spec.name,
            "sweep.role": "parent",
            "sweep.file": spec.path,
            "sweep.folder": str(plan.sweep_dir),
            "host": socket.gethostname(),
        }
        if spec.description:
            tags["mlflow.note.content"] = spec.description
        parent = client.create_run(exp_id, run_name=spec.name, tags=tags).info.run_id
    client.log_batch(parent, params=[Param(k, v) for k, v in params.items()], tags=launch_tags)
    # a key of the last launch's file this code does not write is kept, where it was
    launched = SweepState.of_plan(plan, experiment_id=exp_id, parent_run_id=parent).to_dict()
    write_json(plan.sweep_dir / SWEEP_FILE, {**state, **launched})
    return exp_id, parent


def end_parent(uri: str, parent_run_id: str, status: str = "FINISHED") -> None:
    try:
        client_for(uri).set_terminated(parent_run_id, status=status)
    except Exception as e:  # the report is on disk anyway
        from scalerl.messages import fault_reason

        print(
            f"[sweep] warning: could not mark the parent run {status} at {redact(uri)}: {redact(fault_reason(e, detail=True))}",
            flush=True,
        )


def load_state(sweep_dir: Path) -> SweepState:
    """The sweep folder's ``sweep.json``, read once."""
    state = read_json(Path(sweep_dir) / SWEEP_FILE)
    if not state.get("parent_run_id") or not state.get("runs"):
        raise SweepError(f"{sweep_dir}: no sweep launched here ({SWEEP_FILE} missing); run the sweep first")
    return SweepState.from_dict(state)
