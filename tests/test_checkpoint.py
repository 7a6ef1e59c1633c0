"""Checkpoints load no code and survive truncation and corruption."""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch

from scalerl.tracking import Checkpointer, CheckpointError, UnsafeCheckpointError, rng_state, set_rng_state


class _Payload:
    """Pickling this object makes the unpickler call os.system: what a crafted checkpoint does."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_carrying_code_is_refused_and_runs_nothing(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.dir.mkdir(parents=True)
    marker = tmp_path / "pwned"
    torch.save({"step": 3, "evil": _Payload(str(marker))}, ck.path)
    with pytest.raises(UnsafeCheckpointError) as e:
        ck.load()
    assert not marker.exists()
    msg = str(e.value)
    assert "\n" not in msg and str(ck.path) in msg and "refused" in msg
    # even with a good previous checkpoint beside it, a refused one is an error, not skipped
    torch.save({"step": 2}, ck.previous)
    with pytest.raises(UnsafeCheckpointError):
        ck.load()
    assert not marker.exists()


def test_a_plain_pickle_is_refused_too(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.dir.mkdir(parents=True)
    marker = tmp_path / "pwned"
    ck.path.write_bytes(pickle.dumps({"x": _Payload(str(marker))}))
    with pytest.raises(CheckpointError):
        ck.load()
    assert not marker.exists()


def test_truncated_latest_falls_back_to_the_previous_one(tmp_path, caplog):
    ck = Checkpointer(tmp_path)
    ck.save({"step": 10, "w": torch.arange(1000.0)})
    ck.save({"step": 20, "w": torch.arange(1000.0) + 1})
    assert ck.load()["step"] == 20
    data = ck.path.read_bytes()
    ck.path.write_bytes(data[: len(data) // 2])  # a crash or a full disk mid-copy
    with caplog.at_level("WARNING", logger="scalerl"):
        st = ck.load()
    assert st["step"] == 10 and torch.equal(st["w"], torch.arange(1000.0))
    assert "truncated or corrupt" in caplog.text


def test_corrupt_checkpoint_without_a_previous_one_is_one_line(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.dir.mkdir(parents=True)
    ck.path.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(CheckpointError) as e:
        ck.load()
    assert "\n" not in str(e.value) and "corrupt" in str(e.value)


def test_saving_keeps_the_previous_checkpoint_and_leaves_no_temporary_file(tmp_path):
    ck = Checkpointer(tmp_path)
    for step in range(3):
        ck.save({"step": step})
    assert torch.load(ck.previous, weights_only=True)["step"] == 1
    assert sorted(p.name for p in ck.dir.iterdir()) == ["last.pt", "previous.pt"]


def test_a_failed_save_leaves_the_last_checkpoint_and_no_temporary_file(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.save({"step": 1})
    with pytest.raises(OSError):
        ck.save({"step": 2, "bad": _Unpicklable()})
    assert ck.load()["step"] == 1
    assert sorted(p.name for p in ck.dir.iterdir()) == ["last.pt", "previous.pt"]


def test_a_save_onto_a_full_disk_says_so_and_leaves_the_last_checkpoint(tmp_path):
    """The disk is full (the temporary file is /dev/full): OSError ENOSPC, which the run reports in
    one line, not torch's own "unexpected pos" RuntimeError."""
    import errno

    from scalerl.storage import save_atomic

    ck = Checkpointer(tmp_path)
    ck.save({"step": 1})
    (ck.dir / f".last.pt.tmp{os.getpid()}").symlink_to("/dev/full")
    with pytest.raises(OSError) as e:
        save_atomic({"step": 2, "w": torch.zeros(100_000)}, ck.path)
    assert e.value.errno == errno.ENOSPC
    assert ck.load()["step"] == 1
    assert sorted(p.name for p in ck.dir.iterdir()) == ["last.pt"]


def test_a_signal_during_a_save_reaches_the_caller_as_itself(tmp_path):
    """A second Ctrl-C that lands while torch.save writes (the run then stops at once) reaches the
    caller as the signal's exception, so the command exits 130, not as torch's "unexpected pos"
    RuntimeError raised over it when its zip writer closes (exit 1; seen in CI); the checkpoint
    before it stays, and no temporary file is left."""
    import signal

    from scalerl.loop.signals import Interrupted
    from scalerl.storage import save_atomic

    ck = Checkpointer(tmp_path)
    ck.save({"step": 1})
    w = torch.zeros(50_000_000)  # 200 MB: the write outlasts the timer

    def stop(signum, frame):
        raise Interrupted(signum)

    old = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        with pytest.raises(Interrupted):
            save_atomic({"step": 2, "w": w}, ck.path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert ck.load()["step"] == 1
    assert sorted(p.name for p in ck.dir.iterdir()) == ["last.pt"]


class _Unpicklable:
    def __reduce__(self):
        raise OSError(28, "No space left on device")


_HANG = """
import sys, time
from scalerl.tracking import Checkpointer

class Hang:  # pickled mid-save: the process is killed while its temporary file is open
    def __reduce__(self):
        time.sleep(600)
"""
_SAVE_AND_HANG = _HANG + 'Checkpointer(sys.argv[1]).save({"step": 2, "hang": Hang()})\n'
_RESUME_AND_HANG = (
    _HANG
    + 'ck = Checkpointer(sys.argv[1])\nck.load()\nck.save({"step": 3, "hang": Hang()})\n'  # load: the resume
)


def _killed_while_saving(script: str, ck: Checkpointer) -> None:
    """Run ``script`` on ``ck``'s out_dir and SIGKILL it once its save has begun."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", script, str(ck.dir.parent)])
    try:
        deadline = time.time() + 120
        while not list(ck.dir.glob(".last.pt.tmp*")):
            assert proc.poll() is None and time.time() < deadline, "the save never began"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def test_the_temporary_file_of_a_save_killed_midway_goes_with_the_next_save(tmp_path):
    """SIGKILL while a checkpoint is written leaves its temporary file (a whole checkpoint's size):
    the next save removes it, so preemptions during saves do not fill the disk."""
    ck = Checkpointer(tmp_path)
    ck.save({"step": 1})
    _killed_while_saving(_SAVE_AND_HANG, ck)
    assert ck.load()["step"] == 1
    ck.save({"step": 3})
    assert sorted(p.name for p in ck.dir.iterdir()) == ["last.pt", "previous.pt"]
    assert ck.load()["step"] == 3


def test_a_run_resumed_from_the_previous_checkpoint_keeps_it_until_a_new_one_is_written(tmp_path):
    """The latest checkpoint is corrupt, so the run resumes from the one before it; killed while it
    writes its next one, the one before is still there to resume from (not replaced by the corrupt
    latest), and once the new one is written it is the one before."""
    ck = Checkpointer(tmp_path)
    ck.save({"step": 1})
    ck.save({"step": 2})
    data = ck.path.read_bytes()
    ck.path.write_bytes(data[: len(data) // 2])
    _killed_while_saving(_RESUME_AND_HANG, ck)
    again = Checkpointer(tmp_path)
    assert again.load()["step"] == 1
    again.save({"step": 3})
    assert again.load()["step"] == 3 and torch.load(again.previous, weights_only=True)["step"] == 1


def test_rng_states_round_trip_through_a_safe_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    ck = Checkpointer(tmp_path)
    ck.save({"rng": rng_state()})
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    set_rng_state(ck.load()["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected


@pytest.mark.slow
def test_resuming_from_a_crafted_checkpoint_refuses_it_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from conftest import TINY

    out = tmp_path / "run"
    ck = Checkpointer(out)
    ck.dir.mkdir(parents=True)
    marker = tmp_path / "pwned"
    torch.save({"step": 2, "evil": _Payload(str(marker))}, ck.path)
    r = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "train.py"),
            *TINY,
            "model.warmstart_steps=0",
            "async_mode=sync",
            f"out_dir={out}",
            f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "refused" in lines[0] and str(ck.path) in lines[0], r.stderr
    assert not marker.exists()
