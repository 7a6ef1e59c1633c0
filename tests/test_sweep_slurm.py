"""Sweeps through ``launcher=slurm`` on the real single-node cluster of launch/start_slurm.sh.

Needs ``SLURM_CONF`` (see tests/slurm_fixture.py): skipped without it, failed without it when
``SCALERL_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_fixture import preempt, took_sigterm
from test_sweep import REPO, TINY_BASE, TINY_TASK, _client, _csv, _runs, write_sweep

pytestmark = pytest.mark.slurm


def _env() -> dict:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    return env


@contextlib.contextmanager
def _sweep_in_background(f: Path, out: Path, uri: str, partition: str, cwd: Path):
    """``python sweep.py f launcher=slurm ...`` running while the test acts on its jobs; killed on
    the way out if still running."""
    proc = subprocess.Popen(
        _sweep_cmd(f, out, uri, partition),
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def _sweep_cmd(f: Path, out: Path, uri: str, partition: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "sweep.py"),
        str(f),
        "--out",
        str(out),
        "--tracking-uri",
        uri,
        "launcher=slurm",
        f"launcher.partition={partition}",
        "launcher.cpus_per_task=1",
        "launcher.mem_gb=2",
    ]


def _json(path: Path) -> dict:
    """The JSON file at ``path``, or {} while it is not there (or being replaced)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"the sweep exited ({proc.returncode}) while waiting for {what}:\n{err[-3000:]}"
            )
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _job_id(out: Path, job: str) -> str | None:
    try:
        return json.loads((out / "status.json").read_text())[job]["job_id"]
    except (OSError, ValueError, KeyError):
        return None


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"the sweep did not finish within {timeout:.0f} s (hanging?):\n{stderr[-3000:]}"
        ) from None
    return proc.returncode, stdout, stderr


def test_slurm_sweep_reaches_mlflow_and_a_preempted_job_resumes(slurm_cluster, tmp_path, _cache_dir):
    """Two variants as a SLURM job array; one is preempted mid-run (SIGTERM + USR2, what SLURM sends),
    requeued through submitit's checkpointing, and resumes from its own checkpoint in the same
    MLflow run."""
    f = write_sweep(
        tmp_path / "tiny.yaml",
        {"cispo": ["trainer.total_steps=12"], "dapo": ["loss=dapo"]},
        name="tiny_slurm",
        base=[*TINY_BASE, *TINY_TASK],
        baseline="cispo",
    )
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    with _sweep_in_background(f, out, uri, slurm_cluster.partition, tmp_path) as proc:
        # preempt once the first checkpoint is complete (its file is renamed into place when written)
        ckpt = out / "cispo" / "checkpoint" / "last.pt"
        _wait_for(ckpt.exists, 240, "cispo's first checkpoint", proc)
        job = _job_id(out, "cispo")
        assert job and "_" in job, job  # an element of the sweep's job array
        preempt(job, lambda: took_sigterm(_json(out / "status.json")["cispo"]["log"]))
        rc, stdout, stderr = _finish(proc, 300)
    assert rc == 0, stderr[-3000:]

    client = _client(uri)
    runs = _runs(client, "tiny_slurm")
    parent = next(r for r in runs if r.data.tags.get("sweep.role") == "parent")
    children = {r.info.run_name: r for r in runs if r.info.run_id != parent.info.run_id}
    assert set(children) == {"cispo", "dapo"}  # the requeued job continued its own run
    for run in children.values():
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert "fit/A" in run.data.metrics
    steps = [m.step for m in client.get_metric_history(children["cispo"].info.run_id, "progress/step")]
    assert sorted(steps) == list(range(13))  # resumed: no step twice, none missing
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/fits.csv", "report/fits.md", "report/scaling_curves.png", "report/linearised.png"} <= arts
    assert parent.info.status == "FINISHED"
    rows = _csv(out / "report" / "fits.csv")
    assert rows["cispo"]["status"] == rows["dapo"]["status"] == "finished"

    log = Path(json.loads((out / "status.json").read_text())["cispo"]["log"])
    text = log.read_text() + log.with_suffix(".out").read_text()
    # preempted and requeued: submitit says so, unless SLURM's requeue, which signals the job's
    # processes, ends submitit's `scontrol requeue` before it can (seen in CI): then SLURM's line
    assert "this job is preempted" in text
    assert "Requeued job" in text or "DUE TO JOB REQUEUE" in text, text[-3000:]
    assert "[sweep] requeued job (restart 1)" in text and "resumed" in text
    raw = slurm_cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State")
    assert [ln.split()[0] for ln in raw.splitlines() if ln.strip()][:1] == ["REQUEUED"], raw


def test_slurm_cancelled_job_is_reported_not_waited_for(slurm_cluster, tmp_path, _cache_dir):
    f = write_sweep(
        tmp_path / "c.yaml",
        {"short": [], "long": ["trainer.total_steps=2000"]},
        name="cancel_slurm",
        base=[*TINY_BASE, *TINY_TASK],
    )
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    with _sweep_in_background(f, out, uri, slurm_cluster.partition, tmp_path) as proc:
        # its MLflow run exists (run_info.json holds the run's key before the run, its id after)
        _wait_for(
            lambda: "run_id" in _json(out / "long" / "run_info.json"), 240, "the long run to start", proc
        )
        job = _job_id(out, "long")
        t0 = time.monotonic()
        subprocess.run(["scancel", job], check=True, timeout=20)
        rc, stdout, stderr = _finish(proc, 240)
    assert rc == 1, stderr[-3000:]  # a run did not finish; the sweep says so and ends
    log = json.loads((out / "status.json").read_text())["long"]["log"]
    assert f"long: CANCELLED: job {job} ended with state CANCELLED" in stderr and f"log: {log}" in stderr
    rows = _csv(out / "report" / "fits.csv")
    assert rows["long"]["status"] == "cancelled" and rows["long"]["log"] == log
    assert rows["short"]["status"] == "finished"
    assert "| long | cancelled |" in stdout
    assert slurm_cluster.sacct_state(job) == "CANCELLED"
    client = _client(uri)
    long_run = next(r for r in _runs(client, "cancel_slurm") if r.info.run_name == "long")
    assert long_run.info.status == "KILLED"  # not left RUNNING
    assert time.monotonic() - t0 < 200
