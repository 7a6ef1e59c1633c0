"""Tracking faults lose no data: a tracking server that goes away, a crash between checkpoint and flush."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import free_port, start_server, stop_server, unavailable_server
from omegaconf import OmegaConf

from scalerl.config import compose, typed
from scalerl.tracking import SENTINEL, Tracker, run_params

ROOT = Path(__file__).resolve().parents[1]


def tracker(cfg, out: Path) -> Tracker:
    """The tracker of ``cfg``'s tracking section, as setup builds it (the typed section)."""
    return Tracker(typed(cfg).tracking, out)


def described(cfg, extra: dict[str, str] | None = None) -> dict:
    """What the loop starts a run's MLflow run with: the flat config (and ``extra``) as params, and
    the resolved config as its config.yaml (``Tracker.start``'s keywords)."""
    return {
        "params": {**run_params(cfg), **(extra or {})},
        "config_yaml": OmegaConf.to_yaml(cfg, resolve=True),
    }


def steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_server_that_goes_away_loses_no_metrics(tmp_path, caplog):
    """Metrics and artifacts written while the server is away are kept and written when it is back;
    the outage is one warning (and one when it is over), not one a flush."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = start_server(tmp_path, port)
    try:
        cfg = compose([f"tracking.uri={uri}", "tracking.experiment=outage", f"out_dir={tmp_path / 'run'}"])
        (tmp_path / "run").mkdir()
        tr = tracker(cfg, tmp_path / "run")
        run_id = tr.start(None, **described(cfg))
        for s in range(3):
            tr.log(s, {"train/reward": 0.1 * s})
            tr.log_step_done(s)
        assert tr.flush()
        stop_server(proc, graceful=False)  # the server goes away mid-run
        for s in range(3, 6):
            tr.log(s, {"train/reward": 0.1 * s})
            tr.log_step_done(s)
        t0 = time.time()
        caplog.clear()
        assert not tr.flush()  # fails fast, keeps the metrics
        assert time.time() - t0 < 60
        assert len(tr.pending) == 6
        tr.log_artifact_text("samples/step_000005.jsonl", '{"output": "12"}\n')
        png = tmp_path / "run" / "scaling_curve.png"
        png.write_bytes(b"\x89PNG figure")
        tr.log_artifact_file(png)
        png.write_bytes(b"\x89PNG a later figure")  # the next evaluation's, drawn before the next flush
        assert not tr.flush()
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and warned[0].startswith(f"tracking: {uri} did not take 6 metric values"), (
            warned
        )
        assert len(tr.unsent_artifacts()) == 2
        proc = start_server(tmp_path, port)  # back again
        assert tr.flush()
        client = MlflowClient(uri)
        assert steps(client, run_id, "train/reward") == [0, 1, 2, 3, 4, 5]
        assert steps(client, run_id, SENTINEL) == [0, 1, 2, 3, 4, 5]
        assert client.download_artifacts(run_id, "scaling_curve.png", str(tmp_path))
        assert (tmp_path / "scaling_curve.png").read_bytes() == b"\x89PNG figure"  # the one it did not take
        assert [a.path for a in client.list_artifacts(run_id, "samples")] == ["samples/step_000005.jsonl"]
        assert not tr.unsent_artifacts() and not (tmp_path / "run" / "tracking_outbox").exists()
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"][1:]
        assert warned == [f"tracking: {uri} answers again: the metrics it lacked are written"]
    finally:
        stop_server(proc, graceful=False)


def test_resume_rewrites_only_what_the_store_lacks(tmp_path, new_store):
    """A crash after a checkpoint but during/before its flush: the buffer saved in the checkpoint is
    written on resume, minus the steps the store already has."""
    uri = new_store(tmp_path, "m.db")
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=crash", f"out_dir={tmp_path / 'run'}"])
    (tmp_path / "run").mkdir()
    tr = tracker(cfg, tmp_path / "run")
    run_id = tr.start(None, **described(cfg))
    for s in range(4):
        tr.log(s, {"train/reward": float(s)})
        tr.log_step_done(s)
    saved = tr.pending_state()  # what a checkpoint holds
    # the flush wrote steps 0-1 only before the process died
    tr.pending = [p for p in saved if p[2] <= 1]
    assert tr.flush()
    again = tracker(cfg, tmp_path / "run")
    assert again.start(None, **described(cfg)) == run_id  # same MLflow run, found through run_info.json
    again.restore_pending(saved)
    assert {p[2] for p in again.pending} == {2, 3}
    assert again.flush()
    client = MlflowClient(uri)
    assert steps(client, run_id, "train/reward") == [0, 1, 2, 3]
    assert len(client.search_runs([client.get_experiment_by_name("crash").experiment_id])) == 1


def test_a_copied_out_dir_is_refused_not_resumed_into_the_original_s_run(tmp_path, new_store):
    """A copy of a run's folder resumed into the original's MLflow run: its steps were logged
    twice and the original's status became the copy's. Refused, touching nothing; a folder that
    was moved (the original gone) resumes as before."""
    import shutil

    from scalerl.tracking.tracker import RunOfAnotherOutDir

    uri = new_store(tmp_path, "m.db")
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=copies"])
    (tmp_path / "run").mkdir()
    tr = tracker(cfg, tmp_path / "run")
    run_id = tr.start(None, **described(cfg))
    tr.end("FINISHED")
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    with pytest.raises(RunOfAnotherOutDir, match=r"out_dir .*copy: a copy of .*run, whose MLflow run"):
        tracker(cfg, tmp_path / "copy").start(run_id, **described(cfg))
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"  # untouched
    # a copy of the folder and of its store: the copy's run is its own
    shutil.copy(uri[len("sqlite:///") :], tmp_path / "m2.db")
    cfg2 = compose([f"tracking.uri=sqlite:///{tmp_path / 'm2.db'}", "tracking.experiment=copies"])
    assert tracker(cfg2, tmp_path / "copy").start(run_id, **described(cfg2)) == run_id
    (tmp_path / "run").rename(tmp_path / "moved")
    assert tracker(cfg, tmp_path / "moved").start(run_id, **described(cfg)) == run_id


def test_a_resume_that_names_another_store_is_refused_naming_the_store_the_run_was_made_in(
    tmp_path, new_store, monkeypatch
):
    """The run's run_info.json keeps its store as given and as found from anywhere. A resume whose
    config names another store that exists but lacks the run is refused at once (no retries) in one
    line naming the store it was made in, and nothing is created there; one naming a sqlite file that
    does not exist (the default mlflow.db from another directory) is refused by the preflight,
    before anything is built or created."""
    from scalerl.config.preflight import PathError, check_resumed_store
    from scalerl.tracking.tracker import RunNotInStore

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = new_store(tmp_path / "a", "mlflow.db")
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose(["tracking.uri=sqlite:///a/mlflow.db", "tracking.experiment=moved", f"out_dir={run}"])
    run_id = tracker(cfg, run).start(None, **described(cfg))
    info = json.loads((run / "run_info.json").read_text())
    assert (
        info["uri"] == "sqlite:///a/mlflow.db"
        and info["store"] == first == f"sqlite:///{tmp_path}/a/mlflow.db"
    )
    other = new_store(tmp_path / "b", "mlflow.db")
    again = compose([f"tracking.uri={other}", "tracking.experiment=moved", f"out_dir={run}"])
    t0 = time.monotonic()
    with pytest.raises(RunNotInStore) as e:
        tracker(again, run).start(None, **described(again))
    assert time.monotonic() - t0 < 1.0  # "no such run" is an answer, not a fault to retry
    assert str(e.value) == (
        f"tracking.uri={other!r}: this store has no MLflow run {run_id}, the run being resumed in out_dir "
        f"{run} (made in {first}, its run_info.json): resume it with tracking.uri={first}"
    )
    assert MlflowClient(other).search_experiments(filter_string="name = 'moved'") == []
    check_resumed_store(run, first)  # the store it was made in: fine
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(PathError) as e:
        check_resumed_store(run, "sqlite:///mlflow.db")
    assert f"{tmp_path}/elsewhere/mlflow.db does not exist" in str(e.value)
    assert str(e.value).endswith(f"resume it with tracking.uri={first}")
    assert not (tmp_path / "elsewhere" / "mlflow.db").exists()


def test_resume_from_an_older_checkpoint_logs_the_redone_steps_once(tmp_path, new_store):
    """The latest checkpoint was corrupt, so the run resumes from the one before it: the steps it
    redoes are already in MLflow and are not written again."""
    uri = new_store(tmp_path, "m.db")
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=older", f"out_dir={tmp_path / 'run'}"])
    (tmp_path / "run").mkdir()
    tr = tracker(cfg, tmp_path / "run")
    run_id = tr.start(None, **described(cfg))
    for s in range(6):
        tr.log(s, {"train/reward": float(s)})
        tr.log_step_done(s)
        if s == 2:
            older = tr.pending_state()  # what the checkpoint at step 2 held (nothing flushed yet)
            assert tr.flush()
    assert tr.flush()  # the checkpoint at step 5 flushed steps 3-5, then it was lost
    again = tracker(cfg, tmp_path / "run")
    assert again.start(None, **described(cfg)) == run_id
    again.restore_pending(older)
    for s in range(3, 8):  # redone from step 3, then new steps
        again.log(s, {"train/reward": float(s)})
        again.log_step_done(s)
    assert again.flush()
    client = MlflowClient(uri)
    assert steps(client, run_id, "train/reward") == list(range(8))
    assert steps(client, run_id, SENTINEL) == list(range(8))


def test_a_run_killed_while_it_wrote_its_params_gets_them_when_resumed(tmp_path, new_store):
    """Killed after run_info.json named its MLflow run but before all its params (and config.yaml)
    were written: the resumed run writes the rest, and a later resume whose resumable keys changed
    writes nothing over them."""
    uri = new_store(tmp_path, "m.db")
    out = tmp_path / "run"
    out.mkdir()
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=killed", f"out_dir={out}"])
    client = MlflowClient(uri)
    # what the killed run left: its MLflow run, run_info.json, the first of its params
    exp_id = client.create_experiment("killed")
    run_id = client.create_run(exp_id).info.run_id
    (out / "run_info.json").write_text(json.dumps({"run_id": run_id, "experiment_id": exp_id, "uri": uri}))
    client.log_param(run_id, "seed", str(cfg.seed))
    assert tracker(cfg, out).start(None, **described(cfg, {"device": "cpu"})) == run_id
    params = client.get_run(run_id).data.params
    assert params["loss.name"] == str(cfg.loss.name) and params["device"] == "cpu" and len(params) > 50
    assert "config.yaml" in [a.path for a in client.list_artifacts(run_id)]
    longer = compose(
        [f"tracking.uri={uri}", "tracking.experiment=killed", f"out_dir={out}", "trainer.total_steps=99"]
    )
    assert tracker(longer, out).start(run_id, **described(longer, {"device": "cpu"})) == run_id
    assert client.get_run(run_id).data.params == params
    assert len(client.search_runs([exp_id])) == 1


def test_a_run_killed_before_it_wrote_its_run_id_is_found_by_its_key(tmp_path, new_store):
    """Killed between creating its MLflow run and writing the run's id to run_info.json: the next start
    finds that run by the key run_info.json held before the run existed, and continues it (one run in
    the experiment, not an empty RUNNING one beside a second); killed before creating it, the next
    start creates it under the same key."""
    from scalerl.tracking.tracker import RUN_KEY_TAG

    uri = new_store(tmp_path, "m.db")
    client = MlflowClient(uri)
    exp_id = client.create_experiment("keyed")
    for name, created in (("created", True), ("not_created", False)):
        out = tmp_path / name
        out.mkdir()
        cfg = compose([f"tracking.uri={uri}", "tracking.experiment=keyed", f"out_dir={out}"])
        key = f"key-{name}"
        (out / "run_info.json").write_text(json.dumps({"run_key": key, "experiment_id": exp_id, "uri": uri}))
        left = client.create_run(exp_id, tags={RUN_KEY_TAG: key}).info.run_id if created else None
        run_id = tracker(cfg, out).start(None, **described(cfg, {"device": "cpu"}))
        assert (run_id == left) == created
        info = json.loads((out / "run_info.json").read_text())
        assert info["run_id"] == run_id and info["run_key"] == key
        run = client.get_run(run_id)
        assert run.info.status == "RUNNING" and run.data.tags[RUN_KEY_TAG] == key
        assert run.data.params["device"] == "cpu" and run.data.params["loss.name"] == str(cfg.loss.name)
        # through run_info.json now
        assert tracker(cfg, out).start(None, **described(cfg, {"device": "cpu"})) == run_id
    assert len(client.search_runs([exp_id])) == 2


def test_a_disk_that_fills_before_the_run_id_is_written_leaves_no_running_run(
    tmp_path, new_store, small_disk
):
    """The out_dir's disk has room for run_info.json's key but not for its rewrite with the run's id:
    the start fails with the disk's error and the MLflow run it created is FAILED, not RUNNING for
    ever; once there is room, the next start continues that run."""
    uri = new_store(tmp_path, "m.db")  # the store is not on the small disk
    out = small_disk / "run"
    out.mkdir()
    spare = small_disk / "spare"
    spare.write_bytes(b"\0" * 4096)  # one page, freed below: room for one small file, not two
    with open(small_disk / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * 4096)
    spare.unlink()
    cfg = compose([f"tracking.uri={uri}", "tracking.experiment=full", f"out_dir={out}"])
    with pytest.raises(OSError, match="No space left on device"):
        tracker(cfg, out).start(None, **described(cfg))
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("full").experiment_id
    [left] = client.search_runs([exp_id])
    assert left.info.status == "FAILED"
    assert "run_id" not in json.loads((out / "run_info.json").read_text())  # the key, as before
    (small_disk / "filler").unlink()
    assert tracker(cfg, out).start(None, **described(cfg)) == left.info.run_id
    assert [r.info.status for r in client.search_runs([exp_id])] == ["RUNNING"]
    assert not [p.name for p in out.iterdir() if p.name != "run_info.json"]  # no temporary file left


def test_a_store_whose_writer_was_killed_mid_transaction_is_not_refused(tmp_path, new_store):
    """A process SIGKILLed while it wrote to the store leaves a hot journal, which a read-only
    connection cannot roll back: the preflight called the store "not an SQLite database" and every
    later run on it was refused (CI: the DeepSpeed resume tests after a SIGKILL). MLflow's own
    connection rolls it back, and the runs in the store are all there."""
    from scalerl.config.preflight import check_tracking_uri, sqlite_problem

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("kept")).info.run_id
    db = uri[len("sqlite:///") :]
    writer = (
        "import os, signal, sqlite3\n"
        f"c = sqlite3.connect({db!r})\n"
        "c.execute('PRAGMA cache_size=1')\n"  # the transaction's pages reach the file before it ends
        "c.execute('BEGIN')\n"
        "for i in range(20000):\n"
        "    c.execute('INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)', (f'k{i}', 'x' * 100, 'none'))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", writer]).returncode == -9
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0  # the hot journal
    assert sqlite_problem(uri) is None
    check_tracking_uri(uri)
    assert [
        r.info.run_id
        for r in MlflowClient(uri).search_runs([client.get_experiment_by_name("kept").experiment_id])
    ] == [run_id]
    assert not MlflowClient(uri).get_run(run_id).data.tags.get("k0")


@pytest.mark.slow
def test_a_tracking_server_that_answers_only_errors_ends_the_run_in_one_line(tmp_path):
    """Something answers on the tracking server's port (so the preflight passes) but MLflow behind it
    does not (a proxy answering 503): the run ends in one line naming the store, exit 1, before it
    trains or checkpoints anything."""
    with unavailable_server() as uri:
        args = _train_args(tmp_path / "run", uri, "down", "async_mode=sync", "trainer.total_steps=2")
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    errors = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert len(errors) == 1 and errors[0].startswith(f"error: could not start the MLflow run in {uri}"), (
        errors
    )
    assert not (tmp_path / "run" / "checkpoint").exists()


@pytest.mark.slow
def test_a_run_whose_server_fails_while_it_describes_itself_is_not_left_running(tmp_path):
    """The server creates the run, then refuses its params (a proxy in front of a real server answers
    503 to log-batch): the run ends in one line, and its MLflow run is FAILED, not RUNNING for ever;
    once the server takes writes again, the same command continues that run."""
    import http.server
    import threading
    import urllib.error
    import urllib.request

    port = free_port()
    server = start_server(tmp_path, port)
    refuse = {"log-batch": True}

    class Proxy(http.server.BaseHTTPRequestHandler):
        def forward(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            if refuse["log-batch"] and self.path.endswith("/runs/log-batch"):
                self.send_response(503)
                self.end_headers()
                return
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}{self.path}", data=body, method=self.command
            )
            for k in ("Content-Type", "Authorization"):
                if self.headers.get(k):
                    req.add_header(k, self.headers[k])
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status, data = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, data = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = forward

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{proxy.server_address[1]}"
    out = tmp_path / "run"
    args = _train_args(out, uri, "describe", "async_mode=sync", "trainer.total_steps=2")
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        errors = r.stderr.strip().splitlines()
        assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
        assert len(errors) == 1 and errors[0].startswith(f"error: could not start the MLflow run in {uri}")
        client = MlflowClient(f"http://127.0.0.1:{port}")
        [run] = client.search_runs([client.get_experiment_by_name("describe").experiment_id])
        assert run.info.status == "FAILED"
        refuse["log-batch"] = False
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads((out / "summary.json").read_text())["run_id"] == run.info.run_id
        again = client.get_run(run.info.run_id)
        assert again.info.status == "FINISHED" and again.data.params["loss.name"]
    finally:
        proxy.shutdown()
        stop_server(server, graceful=False)


def _train_args(out, uri: str, experiment: str, *extra: str) -> list[str]:
    from conftest import TINY

    keep = [o for o in TINY if not o.startswith(("trainer.total_steps", "checkpoint_every"))]
    return [
        sys.executable,
        str(ROOT / "train.py"),
        *keep,
        f"out_dir={out}",
        f"tracking.uri={uri}",
        f"tracking.experiment={experiment}",
        *extra,
    ]


def _checkpoint_step(path) -> int:
    import torch

    try:
        return int(torch.load(path, weights_only=True)["step"])
    except Exception:  # not there yet, or being replaced
        return -1


@pytest.mark.slow
def test_a_run_that_outlived_its_tracking_server_writes_every_step_once_when_run_again(tmp_path):
    """The server dies mid-run: the run ends saying its metrics and artifacts (the evaluations'
    samples, the scaling-curve figure) are not written (exit 1, one line, the MLflow run not
    FINISHED; the artifacts kept in the out_dir). Once the server is back, the same command writes
    what the store lacks, marks the run FINISHED and says there is nothing left to do."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    store = tmp_path / "server"
    store.mkdir()
    server = start_server(store, port)
    out = tmp_path / "run"
    args = _train_args(
        out, uri, "outage-run", "async_mode=sync", "trainer.total_steps=10", "checkpoint_every=2"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.time() + 240
        while _checkpoint_step(out / "checkpoint" / "last.pt") < 2:
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
            time.sleep(0.1)
        stop_server(server, graceful=False)  # the server goes away mid-run
        text, _ = proc.communicate(timeout=300)
        assert proc.returncode == 1, text
        assert "Traceback" not in text
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "run the same command again to write them" in errors[0], text
        assert " artifacts could not be written" in errors[0] and "tracking_outbox" in errors[0], text
        summary = json.loads((out / "summary.json").read_text())
        assert summary["metrics_unflushed"] > 0 and summary["mlflow_status"] != "FINISHED"
        assert summary["artifacts_unsent"] == len(list((out / "tracking_outbox").rglob("*.*"))) >= 5
        run_id = summary["run_id"]

        server = start_server(store, port)  # back again
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "already finished" in r.stdout + r.stderr
        client = MlflowClient(uri)
        assert steps(client, run_id, "train/reward") == list(range(1, 11))
        assert steps(client, run_id, SENTINEL) == list(range(0, 11))
        assert steps(client, run_id, "val/pass_rate") == [0, 2, 4, 6, 8, 10]
        assert client.get_run(run_id).info.status == "FINISHED"
        assert json.loads((out / "summary.json").read_text())["metrics_unflushed"] == 0
        samples = [a.path for a in client.list_artifacts(run_id, "samples")]
        assert samples == [f"samples/step_{s:06d}.jsonl" for s in (0, 2, 4, 6, 8, 10)]
        assert "scaling_curve.png" in [a.path for a in client.list_artifacts(run_id)]
        assert not (out / "tracking_outbox").exists()
        # and once more: nothing pending, nothing written twice
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0 and "already finished" in r.stdout + r.stderr
        assert steps(client, run_id, SENTINEL) == list(range(0, 11))
    finally:
        stop_server(server, graceful=False)


_START_ONE = """
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
from scalerl.config import compose, typed
from scalerl.tracking import Tracker, run_params
uri, out, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
cfg = compose([f"tracking.uri={uri}", "tracking.experiment=together", f"out_dir={out}"])
out.mkdir()
while not go.exists():
    time.sleep(0.01)
Tracker(typed(cfg).tracking, out).start(None, run_params(cfg), config_yaml=OmegaConf.to_yaml(cfg, resolve=True))
"""


@pytest.mark.slow
def test_runs_started_together_on_a_new_sqlite_store_all_start(tmp_path):
    """Four processes open the same sqlite file that does not exist yet at the same moment: MLflow
    would build the schema in each (one then fails on 'duplicate column'); every one starts its run."""
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _START_ONE, uri, str(tmp_path / f"run{i}"), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(4)
    ]
    time.sleep(8)  # past their imports
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(o[-1500:] for o in outs)
    client = MlflowClient(uri)
    assert len(client.search_runs([client.get_experiment_by_name("together").experiment_id])) == 4


def test_a_store_found_mid_creation_is_opened_only_after_its_creator_is_done(tmp_path):
    """The race behind a flaky start of four runs on one new sqlite store: a process that finds the
    file already written (its first migration made it) but its creator still holding the creation
    lock waits for the lock instead of migrating beside it, then opens the finished store."""
    import threading

    from scalerl.lock import hold
    from scalerl.tracking.tracker import _client

    db = tmp_path / "new.db"
    uri = f"sqlite:///{db}"
    got: list = []
    with hold(db.with_name(db.name + ".lock"), "the new MLflow store", wait=True):
        _client(f"sqlite:///{tmp_path / 'other.db'}")  # a store being made: written, not released
        (tmp_path / "other.db").rename(db)
        waiter = threading.Thread(target=lambda: got.append(_client(uri)))
        waiter.start()
        waiter.join(timeout=3)
        assert waiter.is_alive() and not got  # waits for the creator's lock
    waiter.join(timeout=60)
    assert got and got[0].search_experiments(max_results=1)  # opened once the lock was free
