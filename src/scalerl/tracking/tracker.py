"""MLflow tracking for one training run.

* One MLflow run per training run; its id is kept in ``<out_dir>/run_info.json`` and in every
  checkpoint, so a resumed run continues the same MLflow run.
* Metrics are buffered and written in batches (``log_batch``) when a checkpoint is taken. The
  buffer is part of the checkpoint, and every flushed batch carries the sentinel metric
  ``progress/step``: after a crash, entries already in MLflow are recognised and not written
  twice, entries not yet written are written from the checkpoint. So a killed run that resumes has
  no duplicate and no missing metric steps.
* A tracking server that goes away loses nothing: a failed flush keeps the buffer (and warns);
  the next flush, the final one, or the next resume writes it. An artifact the server did not take
  is kept in ``<out_dir>/tracking_outbox/`` and sent at the next flush the same way.
* A new run's key is written to ``run_info.json`` before its MLflow run is created (as the run's
  tag ``scalerl.run_key``): a start killed in between leaves a run the next start finds and
  continues, not an empty RUNNING run beside a second one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Optional, Protocol

from omegaconf import DictConfig, OmegaConf

from scalerl.messages import UserError, fault_reason
from scalerl.storage import write_text_atomic
from scalerl.tracking.secrets import redact

log = logging.getLogger(__name__)
SENTINEL = "progress/step"
# the out_dir's key for its MLflow run, in run_info.json before the run exists
RUN_KEY_TAG = "scalerl.run_key"
OUTBOX = "tracking_outbox"  # in the out_dir: artifacts the tracking store has not taken yet
MAX_BATCH = 900  # MLflow's log_batch takes at most 1000 metrics per call

# Fail fast when a tracking server is unreachable: we retry ourselves at the next flush.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not its table-creation INFO lines
# not urllib3's "Retrying ... Connection refused" for each request to a server that went away: the
# tracker says once what the store did not take and where it is kept
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


class TrackingOptions(Protocol):
    """What the tracker reads of a run's ``tracking`` section (``scalerl.config.schema.TrackingConfig``;
    tracking knows no config, so it names only these)."""

    uri: Optional[str]  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd
    experiment: str
    run_name: Optional[str]
    parent_run_id: Optional[str]
    tags: dict[str, str]


def tracking_uri(tracking: TrackingOptions) -> str:
    """Where the ``tracking`` section sends a run: its ``uri``, else ``$MLFLOW_TRACKING_URI``, else
    ``mlflow.db`` in the working directory."""
    return tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


SQLITE = "sqlite:///"


def sqlite_file(uri: str) -> Path | None:
    """The file a ``sqlite:///`` URI names, as MLflow opens it (relative to the working directory,
    ``sqlite:////`` absolute; a ``~`` is a folder of that name, not the home), or None for any
    other URI."""
    return Path(uri[len(SQLITE) :]) if uri.startswith(SQLITE) else None


def absolute_uri(uri: str) -> str:
    """Make a relative sqlite / file-store URI absolute, so jobs started elsewhere find the store."""
    if (db := sqlite_file(uri)) is not None:
        rest = uri[len(SQLITE) :]
        if rest and not db.is_absolute() and not rest.startswith(":memory:"):
            return SQLITE + str(db.resolve())
        return uri
    if uri.startswith("file:") and not uri.startswith("file:///"):
        return Path(uri[len("file:") :]).resolve().as_uri()
    if "://" not in uri and not uri.startswith(("databricks", "sqlite", "file:")):
        return str(Path(uri).resolve())
    return uri


class RunNotInStore(UserError):
    """The run being resumed is not in the store the config names (another store, or another
    directory's ``sqlite:///mlflow.db``): one line naming the store it was made in."""

    def __init__(self, uri: str, run_id: str, out_dir, known: dict):
        made_in = store_made_in(known)
        super().__init__(
            f"tracking.uri={redact(uri)!r}: this store has no MLflow run {run_id}, the run being resumed in "
            f"out_dir {out_dir} (made in {made_in}, its run_info.json): resume it with tracking.uri={made_in}"
        )


class RunOfAnotherOutDir(RunNotInStore):
    """The out_dir being resumed is a copy of another that still holds the same MLflow run: both
    would write into that one run (steps twice, the other's status overwritten)."""

    def __init__(self, out_dir, other: str, run_id: str):
        UserError.__init__(
            self,
            f"out_dir {out_dir}: a copy of {other}, whose MLflow run {run_id} it names; resuming it here "
            f"would write into that run (its steps twice, its status overwritten): resume out_dir={other}",
        )


def store_made_in(run_info: dict) -> str:
    """The store a run was made in, as its ``run_info.json`` records it: as found from any directory
    (``store``), else as given (``uri``: a run made before ``store`` was kept)."""
    return run_info.get("store") or run_info.get("uri") or "another store"


def _not_found(e: Exception) -> bool:
    """Whether ``e`` is MLflow's answer that what was asked for does not exist (not a fault)."""
    return getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST"


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except Exception:
        return ""


def flatten(d, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = str(d)
    return out


def run_params(cfg: DictConfig, variants: dict[str, str] | None = None) -> dict[str, str]:
    """The flat resolved config, plus ``variants``: under each group's name the variant that ran (the
    option's name and the fields that differ from its YAML, e.g. ``filter=scalerl(zero_variance=false)``,
    :func:`scalerl.config.group_variants`; the caller passes them, tracking knows no config groups).
    A new MLflow run gets these (and the caller's own, :meth:`Tracker.start`) as its params."""
    container = OmegaConf.to_container(cfg, resolve=True)
    params = flatten(container)
    params.update(variants or {})
    return {k[:250]: redact(v)[:6000] for k, v in params.items()}


def run_by_tags(client, experiment_id: str, tags: dict[str, str]):
    """A run of the experiment that carries every tag of ``tags``, or None (also when a value holds a
    quote, which MLflow's filter string cannot express)."""
    if any("'" in str(v) for v in tags.values()):
        return None
    where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    found = client.search_runs([experiment_id], where, max_results=1)
    return found[0] if found else None


def keyed_run(client, experiment_id: str, key: str):
    """The MLflow run created under the out_dir key ``key`` (``run_info.json``'s ``run_key``), or None."""
    return run_by_tags(client, experiment_id, {RUN_KEY_TAG: key})


def _client(uri: str):
    """An MlflowClient of ``uri``. A sqlite file that does not exist yet is created under a lock
    beside it (``<file>.lock``): MLflow builds a new store's schema by migrations, and two runs
    started at once on the same new file would both run them (one then fails on "duplicate column",
    or on a migration step another process already made). A store that has that lock file is opened
    under it too: the file exists as soon as its first migration writes, so a process that found
    it then would otherwise run the remaining migrations beside the one making them."""
    from mlflow.tracking import MlflowClient

    db = sqlite_file(uri)
    lock = None if db is None else db.with_name(db.name + ".lock")
    if db is None or (db.is_file() and db.stat().st_size > 0 and not lock.exists()):
        return MlflowClient(tracking_uri=uri)
    from scalerl.lock import hold

    with hold(lock, f"the new MLflow store {db}", wait=True):
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the store's tables made (or found made)
    return client


class Tracker:
    def __init__(self, tracking: TrackingOptions, out_dir: Path, *, enabled: bool = True):
        self.tracking = tracking  # the run's tracking section: the store, experiment, run name, tags
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.pending: list[tuple[str, float, int, int]] = []  # (key, value, step, timestamp ms)
        # after a resume: the last step MLflow already holds; a run resumed from an older checkpoint
        # (the latest was corrupt) redoes those steps without logging them twice
        self.logged_through = -1
        self.run_id: str | None = None
        self.uri = tracking_uri(tracking)
        self.client = _client(self.uri) if enabled else None
        self.flush_failures = 0
        self.failing = False  # the store's last write failed: the next failures are not warned again
        self.status = "RUNNING"  # as this tracker last set it in MLflow (UNKNOWN: could not)

    # ------------------------------------------------------------------ run lifecycle
    def start(self, run_id: str | None, params: dict[str, str], *, config_yaml: str) -> str:
        """Open the MLflow run (a new one, or ``run_id``/the one ``run_info.json`` names when resuming);
        a new one is described by ``params`` (:func:`run_params` of the config, with the caller's
        own) and the resolved config as ``config.yaml`` (a resumed one gets those it lacks)."""
        if not self.enabled:
            self.run_id = run_id or "disabled"
            return self.run_id
        info = self.out_dir / "run_info.json"
        known = json.loads(info.read_text()) if info.is_file() else {}
        run_id = run_id or known.get("run_id")
        if run_id is not None:
            self.run_id = run_id
            try:
                run = self._retry(lambda: self.client.get_run(run_id))
                self._check_not_a_copy(run)
                self._retry(lambda: self.client.update_run(run_id, status="RUNNING"))
            except Exception as e:
                if _not_found(e):  # no run here to mark FAILED
                    self.run_id = None
                    raise RunNotInStore(self.uri, run_id, self.out_dir, known) from None
                raise
            # a run stopped while it described itself (after run_info.json) has the rest written now
            have = run.data.params
            if missing := {k: v for k, v in params.items() if k not in have}:
                self._describe(missing, config_yaml)
            return run_id
        exp_name = self.tracking.experiment
        exp = self._retry(lambda: self.client.get_experiment_by_name(exp_name))
        exp_id = exp.experiment_id if exp is not None else self._create_experiment(exp_name)
        # The run's key is on disk before the run exists: a process killed between creating the run
        # and writing its id (or a disk that fills there) leaves a run that the next start finds by
        # its key, not an empty RUNNING run beside a second one.
        key = known.get("run_key") or uuid.uuid4().hex
        if "run_key" not in known:
            write_text_atomic(info, json.dumps({"run_key": key, "experiment_id": exp_id, **self._store()}))
        run = self._run_with_key(exp_id, key) or self._retry(
            lambda: self.client.create_run(exp_id, run_name=self.tracking.run_name, tags=self._tags(key))
        )
        self.run_id = run.info.run_id
        record = {"run_id": self.run_id, "run_key": key, "experiment_id": exp_id, **self._store()}
        try:
            write_text_atomic(info, json.dumps(record))
        except OSError:  # a full disk: the run is FAILED until a start that can write finds it by key
            self.end("FAILED")
            raise
        self._describe({k: v for k, v in params.items() if k not in run.data.params}, config_yaml)
        return self.run_id

    def _check_not_a_copy(self, run) -> None:
        """Refuse (:class:`RunOfAnotherOutDir`) where the MLflow ``run`` was made for another out_dir
        that still exists and names the same run (this folder is a copy); a moved folder resumes."""
        run_id, made_for = run.info.run_id, run.data.tags.get("out_dir")
        here = str(self.out_dir.resolve())
        if not made_for or made_for == here:
            return
        try:
            if os.path.samefile(made_for, here):  # one folder by two names (a mount, a link)
                return
            theirs = json.loads((Path(made_for) / "run_info.json").read_text())
        except (OSError, ValueError):
            theirs = {}  # moved, or not readable from here: this folder is the run's now
        # the same run in the same store (a copy of the folder and of its store writes its own)
        if theirs.get("run_id") == run_id and store_made_in(theirs) == redact(absolute_uri(self.uri)):
            self.run_id = None  # nothing of the other's run is touched
            raise RunOfAnotherOutDir(self.out_dir, made_for, run_id)

    def _store(self) -> dict[str, str]:
        """``run_info.json``'s record of the store: the URI as given, and as found from any directory
        (a relative sqlite path made absolute), both without credentials."""
        return {"uri": redact(self.uri), "store": redact(absolute_uri(self.uri))}

    def _tags(self, key: str) -> dict[str, str]:
        tags = {
            "host": socket.gethostname(),
            "git_commit": _git_commit(),
            "out_dir": str(self.out_dir.resolve()),
            RUN_KEY_TAG: key,
        }
        tags.update({k: str(v) for k, v in (self.tracking.tags or {}).items()})
        if self.tracking.parent_run_id:
            tags["mlflow.parentRunId"] = self.tracking.parent_run_id
        return tags

    def _run_with_key(self, exp_id: str, key: str):
        """The run created for this out_dir by a start that stopped before writing its id, or None."""
        found = self._retry(lambda: keyed_run(self.client, exp_id, key))
        if found is not None:
            self._retry(lambda: self.client.update_run(found.info.run_id, status="RUNNING"))
        return found

    def _describe(self, params: dict[str, str], config_yaml: str) -> None:
        """The run's config.yaml, then its params: a run that has all its params has its config.yaml."""
        self.log_artifact_text("config.yaml", redact(config_yaml))
        self._log_params(params)

    def _create_experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.create_experiment(name)
        except MlflowException:  # created concurrently by another run of the same sweep
            return self.client.get_experiment_by_name(name).experiment_id

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            chunk = items[i : i + 100]
            self._retry(lambda c=chunk: self.client.log_batch(self.run_id, params=c))

    def _retry(self, fn, tries: int = 3):
        for attempt in range(tries):
            try:
                return fn()
            except Exception as e:
                if attempt == tries - 1 or _not_found(e):  # a store that answered "no such run"
                    raise
                time.sleep(1.0 + attempt)

    # ------------------------------------------------------------------ metrics
    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:  # ranks other than 0 log nothing
            return
        if step <= self.logged_through:
            return
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is None:
                continue
            self.pending.append((k, float(v), int(step), ts))

    def log_step_done(self, step: int) -> None:
        """Mark ``step`` complete: its metrics are in the buffer."""
        self.log(step, {SENTINEL: float(step)})

    def pending_state(self) -> list:
        return list(self.pending)

    def restore_pending(self, pending: list) -> None:
        """After a resume: keep only buffered entries MLflow does not have yet."""
        last = self.last_logged_step()
        self.logged_through = last
        self.pending = [tuple(p) for p in pending if p[2] > last]

    def last_logged_step(self) -> int:
        if not self.enabled or self.run_id is None:
            return -1
        hist = self._retry(lambda: self.client.get_metric_history(self.run_id, SENTINEL))
        return int(max((m.step for m in hist), default=-1))

    def flush(self) -> bool:
        """Write buffered metrics, then the artifacts kept in :attr:`outbox`; False (both kept) when the
        tracking store does not take them all."""
        return self._flush_metrics() and self.send_artifacts()

    def _flush_metrics(self) -> bool:
        if not self.enabled or not self.pending:
            self.pending = [] if not self.enabled else self.pending
            return True
        from mlflow.entities import Metric

        # chunk on step boundaries so each log_batch (atomic) holds whole steps with their sentinel
        by_step: dict[int, list] = {}
        for p in self.pending:
            by_step.setdefault(p[2], []).append(p)
        chunks, cur = [], []
        for step in sorted(by_step):
            if cur and len(cur) + len(by_step[step]) > MAX_BATCH:
                chunks.append(cur)
                cur = []
            cur.extend(by_step[step])
        if cur:
            chunks.append(cur)
        for i, chunk in enumerate(chunks):
            try:
                self.client.log_batch(self.run_id, metrics=[Metric(k, v, ts, s) for k, v, s, ts in chunk])
            except Exception as e:
                self.flush_failures += 1
                self.pending = [p for c in chunks[i:] for p in c]
                self._failed(f"{len(self.pending)} metric values", e)
                return False
        if self.failing:
            log.warning("tracking: %s answers again: the metrics it lacked are written", redact(self.uri))
            self.failing = False
        self.pending = []
        return True

    def _failed(self, what: str, error: Exception) -> None:
        """A write the store did not take. The first of an outage is a warning saying where what it
        lacks is kept; the next ones, until a write succeeds, are not repeated (debug)."""
        say = log.debug if self.failing else log.warning
        say(
            "tracking: %s did not take %s (%s); what it lacks is kept (metrics in the checkpoint, "
            "artifacts in %s) and written when it answers again",
            redact(self.uri),
            what,
            fault_reason(error),
            self.outbox,
        )
        self.failing = True

    # ------------------------------------------------------------------ artifacts and end
    @property
    def outbox(self) -> Path:
        """Artifacts the tracking store did not take, under their artifact paths; sent at every flush."""
        return self.out_dir / OUTBOX

    def log_artifact_text(self, path: str, text: str) -> None:
        """``text`` as the artifact ``path``; kept in :attr:`outbox` if the store does not take it."""
        if not self.enabled:
            return
        try:
            self.client.log_text(self.run_id, text, path)
        except Exception as e:
            self._keep(path, e, lambda dest: dest.write_text(text))

    def log_artifact_file(self, local: str | Path, artifact_dir: str | None = None) -> None:
        """The file ``local`` as an artifact (under ``artifact_dir``); a copy is kept in :attr:`outbox`
        if the store does not take it (the file itself may be rewritten before the next flush)."""
        if not self.enabled:
            return
        try:
            self.client.log_artifact(self.run_id, str(local), artifact_dir)
        except Exception as e:
            path = f"{artifact_dir}/{Path(local).name}" if artifact_dir else Path(local).name
            self._keep(path, e, lambda dest: shutil.copyfile(local, dest))

    def _keep(self, path: str, error: Exception, write) -> None:
        dest = self.outbox / path
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            write(dest)
        except OSError as e:
            log.warning(
                "tracking: artifact %s lost: %s did not take it (%s) and %s",
                path,
                redact(self.uri),
                fault_reason(error),
                e,
            )
            return
        self._failed(f"the artifact {path}", error)

    def unsent_artifacts(self) -> list[Path]:
        """The artifacts kept in :attr:`outbox` that the store does not have yet."""
        return sorted(p for p in self.outbox.rglob("*") if p.is_file()) if self.outbox.is_dir() else []

    def send_artifacts(self) -> bool:
        """Send what :attr:`outbox` holds (each file removed once the store has it); False if the
        store did not take them all."""
        if not self.enabled:
            return True
        for f in self.unsent_artifacts():
            parent = f.parent.relative_to(self.outbox).as_posix()
            try:
                self.client.log_artifact(self.run_id, str(f), None if parent == "." else parent)
            except Exception as e:
                self._failed(f"the kept artifact {f.relative_to(self.outbox).as_posix()}", e)
                return False
            f.unlink()
        shutil.rmtree(self.outbox, ignore_errors=True)
        return True

    def set_tag(self, key: str, value: str) -> None:
        if self.enabled:
            try:
                self.client.set_tag(self.run_id, key, value)
            except Exception as e:
                log.warning("tracking: could not set tag %s (%s)", key, type(e).__name__)

    def end(self, status: str = "FINISHED") -> bool:
        """Mark the MLflow run ``status`` (FINISHED, FAILED, KILLED); False if the store is unreachable."""
        if not self.enabled:
            return True
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as e:
            self.status = "UNKNOWN"
            log.warning("tracking: could not mark the run %s (%s)", status, type(e).__name__)
            return False
        self.status = status
        return True

    def catch_up(self, run_id: str, pending: list) -> int:
        """For a run that ended while the tracking store was unreachable: write the metrics of
        ``pending`` (its last checkpoint's buffer) that the store lacks, then mark the run FINISHED.
        Returns how many were written; ``self.pending`` keeps those the store did not take."""
        self.run_id = run_id
        self.restore_pending(pending)
        n = len(self.pending)
        if not self.flush():
            return 0
        self.end("FINISHED")
        return n
