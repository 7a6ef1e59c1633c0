"""Tracking faults lose no data: a tracking server that goes away, a crash between checkpoint and flush."""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import free_port, start_server, stop_server

from scalerl.config import compose
from scalerl.tracking import SENTINEL, Tracker


def steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_server_that_goes_away_loses_no_metrics(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = start_server(tmp_path, port)
    try:
        cfg = compose([f"tracking.uri={uri}", "tracking.experiment=outage", f"out_dir={tmp_path / 'run'}"])
        (tmp_path / "run").mkdir()
        tr = Tracker(cfg, tmp_path / "run")
        run_id = tr.start(None, {})
        for s in range(3):
            tr.log(s, {"train/reward": 0.1 * s})
            tr.log_step_done(s)
        assert tr.flush()
        stop_server(proc, graceful=False)  # the server goes away mid-run
        for s in range(3, 6):
            tr.log(s, {"train/reward": 0.1 * s})
            tr.log_step_done(s)
        t0 = time.time()
        assert not tr.flush()  # fails fast, keeps the metrics
        assert time.time() - t0 < 60
        assert len(tr.pending) == 6
        proc = start_server(tmp_path, port)  # back again
        assert tr.flush()
        client = MlflowClient(uri)
        assert steps(client, run_id, "train/reward") == [0, 1, 2, 3, 4, 5]
        assert steps(client, run_id, SENTINEL) == [0, 1, 2, 3, 4, 5]
    finally:
        stop_server(proc, graceful=False)


def test_resume_rewrites_only_what_the_store_lacks(tmp_path):
    """A crash after a checkpoint but during/before its flush: the buffer saved in the checkpoint is
    written on resume, minus the steps the store already has."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=crash", f"out_dir={tmp_path / 'run'}"])
    (tmp_path / "run").mkdir()
    tr = Tracker(cfg, tmp_path / "run")
    run_id = tr.start(None, {})
    for s in range(4):
        tr.log(s, {"train/reward": float(s)})
        tr.log_step_done(s)
    saved = tr.pending_state()  # what a checkpoint holds
    # the flush wrote steps 0-1 only before the process died
    tr.pending = [p for p in saved if p[2] <= 1]
    assert tr.flush()
    again = Tracker(cfg, tmp_path / "run")
    assert again.start(None, {}) == run_id  # same MLflow run, found through run_info.json
    again.restore_pending(saved)
    assert {p[2] for p in again.pending} == {2, 3}
    assert again.flush()
    client = MlflowClient(uri)
    assert steps(client, run_id, "train/reward") == [0, 1, 2, 3]
    assert len(client.search_runs([client.get_experiment_by_name("crash").experiment_id])) == 1


def test_resume_from_an_older_checkpoint_logs_the_redone_steps_once(tmp_path):
    """The latest checkpoint was corrupt, so the run resumes from the one before it: the steps it
    redoes are already in MLflow and are not written again."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=older", f"out_dir={tmp_path / 'run'}"])
    (tmp_path / "run").mkdir()
    tr = Tracker(cfg, tmp_path / "run")
    run_id = tr.start(None, {})
    for s in range(6):
        tr.log(s, {"train/reward": float(s)})
        tr.log_step_done(s)
        if s == 2:
            older = tr.pending_state()  # what the checkpoint at step 2 held (nothing flushed yet)
            assert tr.flush()
    assert tr.flush()  # the checkpoint at step 5 flushed steps 3-5, then it was lost
    again = Tracker(cfg, tmp_path / "run")
    assert again.start(None, {}) == run_id
    again.restore_pending(older)
    for s in range(3, 8):  # redone from step 3, then new steps
        again.log(s, {"train/reward": float(s)})
        again.log_step_done(s)
    assert again.flush()
    client = MlflowClient(uri)
    assert steps(client, run_id, "train/reward") == list(range(8))
    assert steps(client, run_id, SENTINEL) == list(range(8))
