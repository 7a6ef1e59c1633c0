"""Ctrl-C (SIGINT) and SIGTERM stop a real `python train.py` at a step boundary with a checkpoint and
one line saying how to resume; the same command resumes with no gap and no duplicate step. One run
per out_dir: a second process on a live run's out_dir is refused, naming the first."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
# steps a run: the signal follows the first checkpoint seen at step 4 or later (checkpoints every 4),
# so the run must still be going then: 12 steps could end before a busy machine's test saw a checkpoint
TOTAL = 24


def train_args(out: Path, uri: str, experiment: str, *extra: str) -> list[str]:
    from conftest import TINY

    keep = [o for o in TINY if not o.startswith(("trainer.total_steps", "checkpoint_every"))]
    return [
        sys.executable,
        str(ROOT / "train.py"),
        *keep,
        f"trainer.total_steps={TOTAL}",
        "checkpoint_every=4",
        f"out_dir={out}",
        f"tracking.uri={uri}",
        f"tracking.experiment={experiment}",
        *extra,
    ]


def checkpoint_step(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["step"])
    except Exception:  # not there yet, or being replaced
        return -1


def steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )


def wait_for_checkpoint(proc: subprocess.Popen, path: Path, step: int) -> int:
    """The step of the first checkpoint seen at ``step`` or later (the signal follows it)."""
    deadline = time.time() + 240
    while (seen := checkpoint_step(path)) < step:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"no checkpoint at step >= {step}:\n{proc.stdout.read()}")
        time.sleep(0.1)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,sig,group",
    [
        ("sync", signal.SIGTERM, False),  # `kill <pid>`
        ("pipeline_rl", signal.SIGINT, True),  # Ctrl-C: the whole foreground process group
    ],
)
def test_a_signal_stops_the_run_at_a_step_with_a_checkpoint_and_it_resumes(
    tmp_path, mlflow_uri, mode, sig, group
):
    out = tmp_path / "run"
    exp = f"signal-{mode}"
    args = train_args(out, mlflow_uri, exp, f"async_mode={mode}")
    proc = start(args)
    try:
        seen = wait_for_checkpoint(proc, out / "checkpoint" / "last.pt", 4)
        (os.killpg if group else os.kill)(proc.pid, sig)
        text, _ = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, f"signalled after the checkpoint of step {seen}:\n{text}"  # 130, 143
    assert "Traceback" not in text
    stopped = [line for line in text.splitlines() if line.startswith(f"[scalerl] stopped by {name} at step")]
    assert len(stopped) == 1, text
    assert f"Resume with the same command (out_dir={out})" in stopped[0]
    at = int(stopped[0].split("at step ")[1].split("/")[0])
    assert 4 <= at < TOTAL
    assert checkpoint_step(out / "checkpoint" / "last.pt") == at
    run_id = json.loads((out / "run_info.json").read_text())["run_id"]
    c = MlflowClient(mlflow_uri)
    assert c.get_run(run_id).info.status == "KILLED"
    assert steps(mlflow_uri, run_id, "progress/step") == list(range(0, at + 1))  # flushed at the stop

    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumed {out} at step {at}" in r.stdout + r.stderr
    assert steps(mlflow_uri, run_id, "train/reward") == list(range(1, TOTAL + 1))
    assert steps(mlflow_uri, run_id, "progress/step") == list(range(0, TOTAL + 1))
    assert c.get_run(run_id).info.status == "FINISHED"
    assert len(c.search_runs([c.get_experiment_by_name(exp).experiment_id])) == 1


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_leaves_a_usable_checkpoint(tmp_path, mlflow_uri):
    out = tmp_path / "run"
    args = train_args(out, mlflow_uri, "signal-twice", "async_mode=sync")
    proc = start(args)
    try:
        wait_for_checkpoint(proc, out / "checkpoint" / "last.pt", 4)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        text, _ = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    last = [line for line in text.splitlines() if line.startswith("[scalerl]")][-1]
    assert last.startswith(("[scalerl] interrupted by SIGINT at step", "[scalerl] stopped by SIGINT")), text
    assert "Resume with the same command" in last
    step = checkpoint_step(out / "checkpoint" / "last.pt")
    assert step >= 4
    run_id = json.loads((out / "run_info.json").read_text())["run_id"]
    assert MlflowClient(mlflow_uri).get_run(run_id).info.status == "KILLED"
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert steps(mlflow_uri, run_id, "progress/step") == list(range(0, TOTAL + 1))


@pytest.mark.slow
def test_train_py_resumes_a_run_to_its_own_length(tmp_path, mlflow_uri):
    """``python train.py out_dir=runs/a`` on a finished 3-step run does not train it on to the
    default's 300 steps: the run is finished at its own length (test_checkpointing: naming
    trainer.total_steps extends it)."""
    from scalerl.config import compose
    from scalerl.loop import train

    out = tmp_path / "run"
    args = train_args(out, mlflow_uri, "own-length", "async_mode=sync")
    short = [a for a in args if not a.startswith("trainer.total_steps=")]
    train(compose([*short[2:], "trainer.total_steps=3"]))  # the first run, in this process
    r = subprocess.run(short, capture_output=True, text=True, timeout=300)  # the default's 300 steps
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed to its own length, trainer.total_steps=3" in r.stdout
    assert checkpoint_step(out / "checkpoint" / "last.pt") == 3
    run_id = json.loads((out / "run_info.json").read_text())["run_id"]
    assert steps(mlflow_uri, run_id, "train/reward") == [1, 2, 3]


@pytest.mark.slow
def test_a_second_run_on_a_live_runs_out_dir_is_refused_naming_it(tmp_path, mlflow_uri):
    out = tmp_path / "run"
    args = train_args(out, mlflow_uri, "one-per-dir", "async_mode=sync", "trainer.total_steps=100000")
    proc = start(args)
    try:
        wait_for_checkpoint(proc, out / "checkpoint" / "last.pt", 4)
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        assert r.stderr.strip().count("\n") == 0, r.stderr  # one line
        assert f"out_dir {out} is in use by pid {proc.pid} on host" in r.stderr
        assert proc.poll() is None  # the first run goes on
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_lock_left_by_a_dead_process_is_recovered_with_a_message(tmp_path, caplog):
    from scalerl.lock import LockBusy, busy, hold

    lock = tmp_path / "out" / ".lock"
    assert busy(lock, "the thing") is None and not lock.parent.exists()  # a probe creates nothing
    code = f"from scalerl.lock import hold\nwith hold({str(lock)!r}, 'x', wait=False):\n print('held', flush=True)\n input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy, match=f"the thing is in use by pid {holder.pid} on host"):
            with hold(lock, "the thing", wait=False):
                pass
        # what train.py says before it imports the run's libraries: the same line
        assert busy(lock, "the thing").startswith(f"the thing is in use by pid {holder.pid} on host")
    finally:
        holder.kill()
        holder.wait()
    with caplog.at_level("WARNING", logger="scalerl"), hold(lock, "the thing", wait=False):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert f"recovered the lock on the thing left by pid {holder.pid}" in caplog.text
    assert lock.read_text() == ""  # released: it names nobody
    assert busy(lock, "the thing") is None


def test_a_hosts_own_signal_handler_is_kept():
    """A sweep job under submitit bypasses SIGTERM itself (and requeues on SIGUSR2): the run does not
    replace that handler, installs its own for the signals left at their default, and gives those
    back when it ends."""
    from scalerl.loop.signals import StopSignals

    def host(signum, frame):  # like submitit's bypass
        host.calls += 1

    host.calls = 0
    old = signal.signal(signal.SIGTERM, host)
    try:
        with StopSignals() as stop:
            assert signal.getsignal(signal.SIGTERM) is host
            assert signal.getsignal(signal.SIGINT) == stop._handle
            stop.graceful = True
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            assert host.calls == 1 and stop.signum == signal.SIGINT  # the run stops at its next step
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_signal_while_the_stopped_run_is_marked_waits_for_the_mark():
    """A second Ctrl-C that lands just after a stop at a step boundary, while the run closes and
    marks its MLflow run, waits until the mark is written and stops the run then (it was seen to
    interrupt the mark under load, leaving the run RUNNING in the UI); a third stops at once."""
    from scalerl.loop.signals import Interrupted, StopSignals

    marked = []
    with StopSignals() as stop, pytest.raises(Interrupted) as e:
        with stop.marking():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            marked.append("KILLED")  # the cleanup goes on after the signal
    assert marked == ["KILLED"] and e.value.signum == signal.SIGINT
    with StopSignals() as stop, pytest.raises(Interrupted):
        with stop.marking():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            marked.append("not reached")
    assert marked == ["KILLED"]


def test_a_signal_that_lands_in_a_finalizer_still_stops_at_once_and_its_noise_is_left_out():
    """A signal that stops at once raises where the main thread is. Inside a finalizer (a __del__, a
    weak reference's callback: SQLAlchemy's sessions in MLflow's store have them) Python only reports
    the exception and goes on, so the stop was lost; it is delivered again after the finalizer. The
    errors the cut-short code's finalizers report after that are not printed; before it they are."""
    from scalerl.loop.signals import Interrupted, StopSignals

    class SignalledInside:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)
            sum(range(10_000))  # the handler runs here, between this finalizer's bytecodes

    class FailsInside:
        def __del__(self):
            raise AssertionError("a finalizer's own error")

    reported, old = [], sys.unraisablehook
    sys.unraisablehook = lambda report: reported.append(type(report.exc_value).__name__)
    try:
        with StopSignals(), pytest.raises(Interrupted) as e:
            FailsInside()  # before any stop: reported as usual
            SignalledInside()  # dropped at once: the signal lands in its finalizer
            deadline = time.time() + 5
            while time.time() < deadline:  # the loop the stop must end
                time.sleep(0.001)
        assert time.time() < deadline and e.value.signum == signal.SIGINT
        assert reported == ["AssertionError"]
        with StopSignals():
            with pytest.raises(Interrupted):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            FailsInside()  # after a stop at once: left out
        assert reported == ["AssertionError"]
        FailsInside()  # the handlers are gone: reported again
        assert reported == ["AssertionError", "AssertionError"]
    finally:
        sys.unraisablehook = old
