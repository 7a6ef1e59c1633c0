"""A run of two tasks (``launcher.tasks_per_node=2``) on the real single-node cluster of
launch/start_slurm.sh: each task becomes one rank of the run (scalerl.sweep.job.export_task_env),
DeepSpeed on CPU over gloo across the two tasks, rank 0's result is the sweep's; and the same job
preempted and requeued.

Needs ``SLURM_CONF`` (see tests/slurm_fixture.py): skipped without it, failed without it when
``SCALERL_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
import torch
from slurm_fixture import preempt
from test_sweep import TINY_BASE, TINY_TASK, _client, _runs, write_sweep
from test_sweep_slurm import _env, _finish, _job_id, _sweep_cmd, _wait_for

pytestmark = pytest.mark.slurm

TWO_TASKS = ["launcher.tasks_per_node=2"]
DEEPSPEED_CPU = ["trainer=deepspeed", "async_mode=sync", "trainer.device=cpu"]


@contextlib.contextmanager
def _sweep_in_background(f: Path, out: Path, uri: str, partition: str, cwd: Path, extra: list[str]):
    """``python sweep.py f launcher=slurm ... <extra>`` running while the test acts on its job."""
    cmd = [*_sweep_cmd(f, out, uri, partition), *extra]
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def _sweep(tmp_path: Path, name: str, extra: list[str]) -> tuple[Path, Path, str]:
    f = write_sweep(
        tmp_path / f"{name}.yaml",
        {"ds2": []},
        name=name,
        base=[*TINY_BASE, *TINY_TASK, *DEEPSPEED_CPU, *extra],
    )
    return f, tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"


def _task_logs(out: Path, job: str) -> list[str]:
    """Each task's stdout + stderr (submitit: <job>_<task>_log.out / .err)."""
    log0 = Path(json.loads((out / "status.json").read_text())[job]["log"])
    texts = []
    for task in (0, 1):
        err = log0.with_name(log0.name.replace("_0_log.err", f"_{task}_log.err"))
        texts.append(err.read_text() + err.with_suffix(".out").read_text())
    return texts


def _ranks_agree(out: Path, step: int) -> None:
    """Both ranks saved their state at ``step`` (DeepSpeed, one file per rank) with equal weights."""
    engine = out / "ds2" / "checkpoint" / "engine" / f"step_{step:08d}"
    files = sorted(p.name for p in engine.glob("scalerl_rank_*.pt"))
    assert files == ["scalerl_rank_00000.pt", "scalerl_rank_00001.pt"], files
    digests = {torch.load(engine / f, weights_only=False)["weights_digest"] for f in files}
    assert len(digests) == 1, "the ranks' weights differ"


def _one_child_run(uri: str, sweep: str):
    runs = _runs(_client(uri), sweep)
    parent = next(r for r in runs if r.data.tags.get("sweep.role") == "parent")
    children = [r for r in runs if r.info.run_id != parent.info.run_id]
    assert [r.info.run_name for r in children] == ["ds2"], [r.info.run_name for r in children]
    assert parent.info.status == "FINISHED"
    return children[0]


def test_two_task_job_runs_one_deepspeed_run_over_both_tasks(slurm_cluster, tmp_path, _cache_dir):
    """One job, two tasks: ranks 0 and 1 of world 2 on gloo, one result, one MLflow run."""
    f, out, uri = _sweep(tmp_path, "ds2_slurm", ["trainer.total_steps=4"])
    with _sweep_in_background(f, out, uri, slurm_cluster.partition, tmp_path, TWO_TASKS) as proc:
        rc, stdout, stderr = _finish(proc, 420)
    assert rc == 0, stderr[-3000:]

    status = json.loads((out / "status.json").read_text())
    assert list(status) == ["ds2"] and status["ds2"]["status"] == "finished", status
    job = status["ds2"]["job_id"]
    # the sweep has both results as the tasks exit; accounting records the end a moment later
    _wait_for(lambda: slurm_cluster.sacct_state(job) == "COMPLETED", 60, f"job {job} to be COMPLETED")
    logs = _task_logs(out, "ds2")
    for rank, text in enumerate(logs):
        assert f"[sweep] task: rank {rank} of 2 (local {rank} of 2), rendezvous " in text, text[-2000:]
    assert "ds2: finished" in stderr
    summary = json.loads((out / "ds2" / "summary.json").read_text())
    assert summary["steps"] == 4
    _ranks_agree(out, 4)
    run = _one_child_run(uri, "ds2_slurm")
    assert run.info.status == "FINISHED" and run.info.run_id == summary["run_id"]
    steps = [m.step for m in _client(uri).get_metric_history(run.info.run_id, "train/reward")]
    assert steps == [1, 2, 3, 4]  # logged once (by rank 0), every step


def test_two_task_job_preempted_resumes_both_ranks(slurm_cluster, tmp_path, _cache_dir):
    """Preempted after its first checkpoint (SIGTERM + USR2 to both tasks, what SLURM sends): rank 0
    checkpoints through submitit and requeues the job; both tasks start again and resume."""
    f, out, uri = _sweep(tmp_path, "ds2_preempt", ["trainer.total_steps=12", "checkpoint_every=3"])
    with _sweep_in_background(f, out, uri, slurm_cluster.partition, tmp_path, TWO_TASKS) as proc:
        ckpt = out / "ds2" / "checkpoint" / "last.pt"
        _wait_for(ckpt.exists, 300, "the first checkpoint", proc)
        job = _job_id(out, "ds2")
        preempt(job, lambda: all("Bypassing signal SIGTERM" in t for t in _task_logs(out, "ds2")))
        rc, stdout, stderr = _finish(proc, 420)
    assert rc == 0, stderr[-3000:]
    assert json.loads((out / "status.json").read_text())["ds2"]["status"] == "finished"
    logs = _task_logs(out, "ds2")
    assert "this job is preempted" in logs[0] and "Requeued job" in logs[0]
    assert "[sweep] requeued job (restart 1)" in logs[0] and "[sweep] requeued job (restart 1)" in logs[1]
    for rank, text in enumerate(logs):  # each task ran as its rank, before and after the requeue
        assert text.count(f"[sweep] task: rank {rank} of 2") == 2, text[-3000:]
    _ranks_agree(out, 12)
    run = _one_child_run(uri, "ds2_preempt")
    assert run.info.status == "FINISHED"
    steps = [m.step for m in _client(uri).get_metric_history(run.info.run_id, "progress/step")]
    assert sorted(steps) == list(range(13))  # resumed: no step twice, none missing
    raw = slurm_cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State")
    assert [ln.split()[0] for ln in raw.splitlines() if ln.strip()][:1] == ["REQUEUED"], raw


def test_a_generator_task_feeds_the_trainer_task_over_gloo(slurm_cluster, tmp_path, _cache_dir):
    """placement.generator_tasks=1: of the job's two tasks the first trains (a world of one) and the
    second runs the pipeline_rl engine, reaching the trainer's store at the job's MASTER_ADDR and
    taking every weight update over gloo; one run, trained from the engine's groups."""
    name = "gen_task"
    f = write_sweep(
        tmp_path / f"{name}.yaml",
        {"split": []},
        name=name,
        base=[
            *TINY_BASE,
            *TINY_TASK,
            "async_mode=pipeline_rl",
            "placement=split",
            "placement.generator_tasks=1",
            "trainer.total_steps=4",
        ],
    )
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    with _sweep_in_background(f, out, uri, slurm_cluster.partition, tmp_path, TWO_TASKS) as proc:
        rc, stdout, stderr = _finish(proc, 420)
    assert rc == 0, stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert status["split"]["status"] == "finished", status
    log0 = Path(status["split"]["log"])
    texts = []
    for task in (0, 1):
        err = log0.with_name(log0.name.replace("_0_log.err", f"_{task}_log.err"))
        texts.append(err.read_text() + err.with_suffix(".out").read_text())
    assert "[scalerl] generator task: engine 0, weights over gloo from " in texts[1], texts[1][-2000:]
    assert "generator task" not in texts[0]
    summary = json.loads((out / "split" / "summary.json").read_text())
    assert summary["steps"] == 4
    c = _client(uri)
    lags = [m.value for m in c.get_metric_history(summary["run_id"], "train/policy_lag_max")]
    assert len(lags) == 4 and max(lags) <= 8
    assert c.get_run(summary["run_id"]).data.metrics["perf/weight_update_s"] > 0
