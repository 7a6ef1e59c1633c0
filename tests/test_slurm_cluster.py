"""submitit on the local SLURM cluster of launch/start_slurm.sh.

Needs ``SLURM_CONF`` (see tests/slurm_fixture.py): skipped without it, failed without it when
``SCALERL_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from slurm_fixture import preempt, took_sigterm
from submitit.core.utils import UncompletedJobError

pytestmark = pytest.mark.slurm

# pytest imports this file as a top-level module ("test_slurm_cluster") that the job's Python
# cannot import: ship the functions/classes below by value instead of by reference.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ----------------------------------------------------------------------------- job payloads
def add(a: int, b: int) -> dict:
    return {
        "sum": a + b,
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "executor": os.environ.get("SUBMITIT_EXECUTOR"),
    }


def sleep_forever(started: str) -> str:
    Path(started).write_text(str(os.getpid()))
    time.sleep(600)
    return "should have been cancelled"


class CountingTask(submitit.helpers.Checkpointable):
    """Counts to ``total``, one step every 0.5 s; submitit checkpoints ``self`` on preemption
    (Checkpointable.checkpoint pickles the instance, step counter included) and requeues."""

    def __init__(self) -> None:
        self.step = 0
        self.runs: list[dict] = []

    def __call__(self, progress: str, total: int) -> dict:
        self.runs.append(
            {"from_step": self.step, "restart_count": os.environ.get("SLURM_RESTART_COUNT", "0")}
        )
        while self.step < total:
            self.step += 1
            Path(progress).write_text(str(self.step))
            time.sleep(0.5)
        return {"step": self.step, "runs": self.runs}


# ----------------------------------------------------------------------------- helpers
def make_executor(folder: Path, cluster, timeout_min: int = 10) -> submitit.AutoExecutor:
    # cluster="slurm" explicitly: with srun on PATH, AutoExecutor() would pick slurm anyway,
    # but a missing srun must be an error here, not a silent fallback to the local executor.
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(timeout_min=timeout_min, slurm_partition=cluster.partition, cpus_per_task=1)
    return executor


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def squeue_state(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=20
    )
    return out.stdout.strip()


def result_within(job: submitit.Job, timeout: float):
    """job.result(), but fail instead of hanging when it does not return in time."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = job.result()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        subprocess.run(["scancel", job.job_id], check=False, timeout=20)
        raise AssertionError(f"job.result() of job {job.job_id} still blocked after {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def job_log(job: submitit.Job) -> str:
    parts = []
    for path in (job.paths.stdout, job.paths.stderr):
        if path.exists():
            parts.append(f"--- {path}\n{path.read_text()[-3000:]}")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- tests
def test_submitit_round_trip(slurm_cluster, tmp_path):
    job = make_executor(tmp_path / "logs", slurm_cluster).submit(add, 2, 3)
    try:
        out = result_within(job, 45)
    except Exception as exc:
        raise AssertionError(f"job {job.job_id} failed: {exc}\n{job_log(job)}") from exc
    assert out["sum"] == 5
    assert out["job_id"] == job.job_id
    assert out["executor"] == "slurm"
    # The result pickle can land before slurmdbd has the final record: give it a few seconds.
    wait_until(
        lambda: slurm_cluster.sacct_state(job.job_id) == "COMPLETED",
        15,
        f"sacct to show job {job.job_id} COMPLETED (now: {slurm_cluster.sacct_state(job.job_id)!r})",
    )
    # submitit's own view (job.state is only a cache: the result file can end the wait first).
    assert job.watcher.get_state(job.job_id, mode="force") == "COMPLETED"


def test_scancel_raises_instead_of_hanging(slurm_cluster, tmp_path):
    started = tmp_path / "started"
    job = make_executor(tmp_path / "logs", slurm_cluster).submit(sleep_forever, str(started))
    wait_until(started.exists, 30, f"job {job.job_id} to start (squeue: {squeue_state(job.job_id)!r})")
    t0 = time.monotonic()
    subprocess.run(["scancel", job.job_id], check=True, timeout=20)
    with pytest.raises(UncompletedJobError) as info:
        result_within(job, 30)
    assert "CANCELLED" in str(info.value)
    # KillWait (5 s: submitit ignores SIGTERM, so SIGKILL ends it) + sacct poll + submitit's
    # 15 s grace for a late result file: ~17 s here.
    assert time.monotonic() - t0 < 30
    wait_until(lambda: slurm_cluster.sacct_state(job.job_id) == "CANCELLED", 15, "sacct to show CANCELLED")


def test_an_error_result_of_a_job_slurm_runs_again_is_not_its_outcome(slurm_cluster, tmp_path):
    """What a preempted job's requeue can leave (its `scontrol requeue`, killed by the requeue's own
    SIGTERM, makes submitit write an error result): while SLURM runs or queues the job again, the
    sweep's driver keeps waiting (`requeued`); once SLURM has ended it, the error stands."""
    from submitit.core.utils import cloudpickle_dump

    from scalerl.sweep.launch import requeued

    started = tmp_path / "started"
    job = make_executor(tmp_path / "logs", slurm_cluster).submit(sleep_forever, str(started))
    wait_until(started.exists, 30, f"job {job.job_id} to start (squeue: {squeue_state(job.job_id)!r})")
    job.watcher.get_state(job.job_id, mode="force")
    cloudpickle_dump(
        ("error", "CalledProcessError: scontrol requeue died with SIGTERM"), job.paths.result_pickle
    )
    assert job.done() and requeued(job)  # the result file is there, and SLURM runs the job
    cloudpickle_dump(("success", {"steps": 3}), job.paths.result_pickle)
    assert not requeued(job)  # a result of success is the job's outcome
    cloudpickle_dump(("error", "the training raised"), job.paths.result_pickle)
    subprocess.run(["scancel", job.job_id], check=True, timeout=20)
    wait_until(lambda: slurm_cluster.sacct_state(job.job_id) == "CANCELLED", 30, "sacct to show CANCELLED")
    job.watcher.get_state(job.job_id, mode="force")
    assert not requeued(job)  # SLURM has ended it: the error is its outcome


def test_checkpointable_job_is_requeued_and_resumes(slurm_cluster, tmp_path):
    progress = tmp_path / "progress"
    total = 8
    # timeout_min large enough that submitit reads USR2 as a preemption, not a timeout
    # (it calls it a timeout after min(0.8 * limit, limit - 10 min) of walltime).
    job = make_executor(tmp_path / "logs", slurm_cluster, timeout_min=60).submit(
        CountingTask(), str(progress), total
    )

    def progressed() -> bool:
        return progress.exists() and int(progress.read_text() or 0) >= 3

    wait_until(progressed, 30, f"job {job.job_id} to make progress (squeue: {squeue_state(job.job_id)!r})")
    # What SLURM does on preemption: SIGTERM (submitit ignores it), then USR2 (the
    # --signal=USR2@90 of submitit's sbatch script). The handler checkpoints and runs
    # `scontrol requeue` (JobRequeue=1); the job restarts after cred_expire (15 s here).
    preempt(job.job_id, lambda: took_sigterm(job.paths.stderr))
    try:
        out = result_within(job, 50)
    except Exception as exc:
        raise AssertionError(f"job {job.job_id} failed: {exc}\n{job_log(job)}") from exc

    assert out["step"] == total
    assert len(out["runs"]) == 2, out
    first, second = out["runs"]
    assert first == {"from_step": 0, "restart_count": "0"}
    assert second["restart_count"] == "1"
    assert 3 <= second["from_step"] < total, "second run must resume from the checkpoint, not from 0"

    def states() -> list[str]:
        raw = slurm_cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job.job_id, "-o", "State")
        return [line.split()[0] for line in raw.splitlines() if line.strip()]

    wait_until(
        lambda: states() == ["REQUEUED", "COMPLETED"],
        15,
        f"sacct -D to show REQUEUED then COMPLETED (now: {states()})",
    )
    log = job_log(job)
    assert "this job is preempted" in log and "Requeued job" in log, log


@pytest.mark.slurm
def test_every_daemon_listens_on_loopback_only(slurm_cluster):
    from procs import listening_addresses

    run_dir = slurm_cluster.conf.parent.parent / "run"
    pid_files = {name: run_dir / f"{name}.pid" for name in ("slurmctld", "slurmdbd", "mariadbd")}
    pid_files |= {f.stem: f for f in run_dir.glob("slurmd-*.pid")}  # one slurmd a node
    assert len(pid_files) == 3 + len(slurm_cluster.nodes), sorted(run_dir.iterdir())
    seen = {name: listening_addresses(int(f.read_text().strip())) for name, f in pid_files.items()}
    assert all(seen.values()), f"a daemon listens on nothing: {seen}"
    # each slurmd on its node's address (127.0.0.1 unless SCALERL_SLURM_OWN_ADDRS=1 was given, which
    # makes the slurmd listen on every interface: this test then fails), every other on 127.0.0.1
    node_addr = dict(
        line.split() for line in slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %o").splitlines()
    )
    for name, addrs in seen.items():
        want = node_addr[name.removeprefix("slurmd-")] if name.startswith("slurmd-") else "127.0.0.1"
        assert {a for a, _ in addrs} == {want}, f"{name} listens on {addrs}"
