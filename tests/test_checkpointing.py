"""Checkpoints and resume (loop/checkpointing.py): the recipe a resumed run must keep, what may
change, and checkpoints that never hold weights that stopped being finite."""

from __future__ import annotations

import subprocess

import pytest
import torch
from test_loop import SYNC, history, make_run, uri_of

from scalerl.config import ConfigError, compose
from scalerl.config.schema import RESUMABLE_CHANGES, recipe, recipe_file
from scalerl.loop import RunError, train
from scalerl.loop.checkpointing import check_same_recipe
from scalerl.storage import write_json


def test_the_recipe_leaves_out_what_may_change_on_resume(tmp_path):
    cfg = compose([f"out_dir={tmp_path}", "trainer.total_steps=7", "tracking.uri=sqlite:///x.db"])
    keys = recipe(cfg)
    assert "loss.eps_max" in keys and "trainer.lr" in keys and "seed" in keys
    assert not [k for k in keys if k.startswith(RESUMABLE_CHANGES)]
    assert "trainer.total_steps" not in keys and "out_dir" not in keys and "tracking.uri" not in keys


def test_a_changed_recipe_is_named_in_one_line_and_a_longer_run_is_not(tmp_path):
    base = [f"out_dir={tmp_path}", "trainer.total_steps=4"]
    recipe_file(tmp_path).parent.mkdir(parents=True)
    write_json(recipe_file(tmp_path), recipe(compose(base)))
    check_same_recipe(compose([*base, "trainer.total_steps=8", "checkpoint_every=2"]))  # resumable
    with pytest.raises(ConfigError, match=r"trainer\.lr=.*as in the run being resumed") as e:
        check_same_recipe(compose([*base, "trainer.lr=0.5"]))
    assert "\n" not in str(e.value) and "trainer.total_steps" in str(e.value)


def test_a_resume_keeps_the_runs_length_unless_the_command_line_names_one(tmp_path, capsys):
    """``python train.py out_dir=runs/a`` resumes a 50-step run to step 50, not to the default's
    300; naming trainer.total_steps changes it, and a length that differs is said either way."""
    from scalerl.cli import _keep_run_length
    from scalerl.config.schema import length_file, run_length

    cfg = compose([f"out_dir={tmp_path}"])
    _keep_run_length(cfg, set())  # no run there yet: the config's own
    assert cfg.trainer.total_steps == 300 and capsys.readouterr().out == ""
    length_file(tmp_path).parent.mkdir(parents=True)
    write_json(length_file(tmp_path), {"total_steps": 50})
    assert run_length(tmp_path) == 50
    _keep_run_length(cfg, {"out_dir"})
    assert cfg.trainer.total_steps == 50
    assert "resumed to its own length, trainer.total_steps=50" in capsys.readouterr().out
    longer = compose([f"out_dir={tmp_path}", "trainer.total_steps=80"])
    _keep_run_length(longer, {"out_dir", "trainer.total_steps"})
    assert longer.trainer.total_steps == 80
    assert "trainer.total_steps=80 (it ran with 50 before)" in capsys.readouterr().out
    same = compose([f"out_dir={tmp_path}", "trainer.total_steps=50"])
    _keep_run_length(same, {"trainer.total_steps"})
    assert capsys.readouterr().out == ""
    length_file(tmp_path).write_text("not json")  # unreadable: the config's own, as before runs kept it
    assert run_length(tmp_path) is None


def test_a_run_from_before_a_key_was_added_resumes_at_its_old_behaviour(tmp_path):
    """A recipe written before the correction group (and task.sandbox) existed lacks their keys: it
    resumes with the values that do what it did, and with no other."""
    from scalerl.config.schema import ADDED_KEYS

    base = [f"out_dir={tmp_path}", "task=multi"]
    old = {k: v for k, v in recipe(compose(base)).items() if k not in ADDED_KEYS}
    assert len(recipe(compose(base))) - len(old) == len(ADDED_KEYS) - 1  # task.sandbox: task=code's
    recipe_file(tmp_path).parent.mkdir(parents=True)
    write_json(recipe_file(tmp_path), old)
    check_same_recipe(compose(base))
    with pytest.raises(ConfigError, match=r"correction\.name='tis'"):
        check_same_recipe(compose([*base, "correction=tis"]))


def test_weights_that_stop_being_finite_never_reach_a_checkpoint(tiny_overrides):
    """Weights that are no longer finite are never checkpointed: the last good checkpoint stays the
    last one, and the run stops in one line."""
    from scalerl.loop.checkpointing import checkpoint
    from scalerl.state import Clock

    cfg, run = make_run([*tiny_overrides, *SYNC, "trainer.total_steps=2"])
    train(cfg, components=run)
    with torch.no_grad():
        next(run.trainer.module.parameters()).view(-1)[0] = float("inf")
    with pytest.raises(RunError, match="no longer finite at step 2") as e:
        checkpoint(run, Clock(run.state))
    assert "\n" not in str(e.value) and str(run.ckpt.path) in str(e.value)
    kept = run.ckpt.load()
    assert kept["step"] == 2
    assert all(bool(torch.isfinite(v).all()) for v in kept["trainer"]["model"].values())


def test_resuming_with_a_changed_recipe_is_refused_in_one_line(tiny_overrides):
    """A run resumed in its out_dir keeps its recipe (the MLflow run's params describe it); its length
    may grow."""
    from scalerl.config import ConfigError

    train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=2"]))
    with pytest.raises(
        ConfigError, match=r"loss\.eps_max='4\.0': must be '5\.0' as in the run being resumed"
    ) as e:
        train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=3", "loss.eps_max=4.0"]))
    assert "\n" not in str(e.value)
    summary = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=3"]))  # longer: allowed
    assert summary["steps"] == 3
    # the run keeps its new length; MLflow keeps the param's first value, and the tag says the new one
    from mlflow import MlflowClient

    from scalerl.config.schema import run_length
    from scalerl.loop.run import LENGTH_TAG

    out_dir = next(o.split("=", 1)[1] for o in tiny_overrides if o.startswith("out_dir="))
    assert run_length(out_dir) == 3
    mlflow_run = MlflowClient(uri_of(tiny_overrides)).get_run(summary["run_id"])
    assert mlflow_run.data.params["trainer.total_steps"] == "2" and mlflow_run.data.tags[LENGTH_TAG] == "3"


def test_a_full_disk_ends_the_run_in_one_line_keeping_the_last_checkpoint(tiny_overrides, small_disk):
    """The out_dir's disk fills up: the checkpoint that does not fit ends the run in one line that says
    so (not torch's "unexpected pos"), the one before it stays usable, and once there is room the
    same command resumes from it with every step logged once."""
    from scalerl.tracking import Checkpointer

    out = small_disk / "run"
    args = [*[o for o in tiny_overrides if not o.startswith("out_dir=")], *SYNC, f"out_dir={out}"]
    args += ["trainer.total_steps=6", "checkpoint_every=2"]
    with pytest.raises(RunError, match=r"checkpoint of step 4: No space left on device") as e:
        train(compose(args))
    assert "\n" not in str(e.value) and "the last checkpoint is kept" in str(e.value)
    ck = Checkpointer(out)
    assert ck.load()["step"] == 2 and not list(ck.dir.glob(".*tmp*"))
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # room again
    summary = train(compose(args))
    assert summary["steps"] == 6
    uri = uri_of(tiny_overrides)
    assert [s for s, _ in history(uri, summary["run_id"], "train/reward")] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in history(uri, summary["run_id"], "progress/step")] == list(range(7))


@pytest.mark.slow  # a train.py process
def test_a_full_disk_before_the_first_checkpoint_is_one_line_from_train_py(tiny_overrides, small_disk):
    """The disk is full when the run writes its first files (run_info.json): one line naming the
    out_dir and the disk's error, exit 1, not a traceback."""
    import sys
    from pathlib import Path

    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * 4096)
    out = small_disk / "run"
    args = [*[o for o in tiny_overrides if not o.startswith("out_dir=")], *SYNC, f"out_dir={out}"]
    train_py = Path(__file__).resolve().parents[1] / "train.py"
    r = subprocess.run([sys.executable, str(train_py), *args], capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error") or "Traceback" in line]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors == [
        f"error: could not write in {out}: No space left on device; run the same command again once it "
        "can be written (the run resumes from its last checkpoint)"
    ], r.stderr[-3000:]
