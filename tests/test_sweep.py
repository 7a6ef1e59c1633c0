"""Sweeps end to end: plans, sweep-file errors, and a tiny real sweep through submitit's local
executor into a real MLflow sqlite store (parent + child runs, report, fit/* metrics, a failing
variant with its log, re-runs that skip finished variants and resume unfinished ones)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow_server import free_port, unavailable_server
from procs import descendants

from scalerl.config import options
from scalerl.config.schema import points_past_cut
from scalerl.sweep import load_spec, make_plan, plan_lines
from scalerl.sweep.cli import main
from scalerl.sweep.launch import Outcome, Pace, _LocalOrphan
from scalerl.sweep.plan import launch_order
from scalerl.sweep.spec import SweepError

LOSS_OPTIONS = ", ".join(sorted(options("loss")))  # every registered loss, as the error lists them

REPO = Path(__file__).resolve().parents[1]

# A real run of a few seconds: tiny model (warm-start cached once per session), 2-digit addition,
# one evaluation per step so the sigmoid fit has points, synchronous (deterministic) updates.
TINY_BASE = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "model.warmstart_steps=300",
    "model.warmstart_batch_size=32",
    "trainer.batch_size=32",
    "trainer.generations_per_prompt=4",
    "trainer.total_steps=6",
    "trainer.lr=5e-4",
    "eval.every=1",
    "eval.num_prompts=16",
    "eval.samples_per_prompt=2",
    "checkpoint_every=3",
    "generator.chunk_prompts=4",
    "trainer.threads=1",
    "progress=log",
    "async_mode=sync",
    "scaling.bootstrap=20",
    "scaling.min_step=1",  # 6 steps: the default cut (step 10) would leave nothing to fit
    "filter.dynamic_sampling=false",  # as conftest's TINY: up to 4 batches a step on this model
]
# the addition task's keys: a variant choosing task=jsonl has none of them
TINY_TASK = [
    "task.min_digits=2",
    "task.max_digits=2",
    "task.warmstart_max_digits=2",
    "task.num_val=16",
    "task.num_train=256",
]
BROKEN = ["task=jsonl", "task.path=/nonexistent.jsonl"]  # composes fine, fails inside the job


def write_sweep(path: Path, variants: dict, **extra) -> Path:
    path.write_text(yaml.safe_dump({**extra, "variants": variants}, sort_keys=False))
    return path


def run_cli(args: list[str], cwd: Path, timeout: float = 420) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    return subprocess.run(
        [sys.executable, str(REPO / "sweep.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ----------------------------------------------------------------------------- plans (no runs)
def test_dry_run_prints_one_line_per_run_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_sweep(
        tmp_path / "s.yaml",
        {"base_recipe": [], "dapo": ["loss=dapo", "loss.eps_high=0.28"], "bf16": ["precision=bf16"]},
        name="s",
        base=["trainer.total_steps=5"],
        seeds=[0, 1],
        baseline="base_recipe",
    )
    before = listing(tmp_path)
    assert main(["s.yaml", "--dry-run", "trainer.lr=0.001", "launcher.max_parallel=2"]) == 0
    out = capsys.readouterr()
    import torch

    # without a GPU here the bf16 head would be emulated: planned, not run
    skip = (
        ""
        if torch.cuda.is_available()
        else "  (not run: precision.head=bf16 would be emulated without a CUDA"
    )
    lines = out.out.splitlines()
    assert lines[:4] == [
        "base_recipe-seed0  trainer.total_steps=5 trainer.lr=0.001 seed=0",
        "base_recipe-seed1  trainer.total_steps=5 trainer.lr=0.001 seed=1",
        "dapo-seed0         trainer.total_steps=5 loss=dapo loss.eps_high=0.28 trainer.lr=0.001 seed=0",
        "dapo-seed1         trainer.total_steps=5 loss=dapo loss.eps_high=0.28 trainer.lr=0.001 seed=1",
    ]
    for s, line in enumerate(lines[4:]):
        assert line.startswith(
            f"bf16-seed{s}         trainer.total_steps=5 precision=bf16 trainer.lr=0.001 seed={s}{skip}"
        )
    assert len(lines) == 6
    assert "nothing launched or written" in out.err and "up to 2 at once" in out.err
    assert listing(tmp_path) == before  # no sweep folder, no mlflow.db, no outputs/


def test_cli_override_replaces_the_variants_value(tmp_path):
    write_sweep(tmp_path / "s.yaml", {"a": ["loss=dapo", "trainer.lr=0.01"]}, name="s")
    plan = make_plan(load_spec(tmp_path / "s.yaml"), ["trainer.lr=0.002"], sweep_dir=tmp_path / "out")
    assert plan_lines(plan) == ["a  loss=dapo trainer.lr=0.002"]
    assert plan.runs[0].out_dir == str(tmp_path / "out" / "a") and not (tmp_path / "out").exists()


def test_a_variant_edited_after_its_run_began_is_refused_before_anything_is_written(tmp_path):
    """A run keeps the recipe it began with (checkpoint/recipe.json): a rerun of the sweep with that
    variant edited would skip the finished run and score it under the new recipe. Planning refuses
    it in one line naming the variant, the key, both values and what to do; unchanged, it plans."""
    from scalerl.config.schema import recipe, recipe_file
    from scalerl.config.settings import build_config
    from scalerl.storage import write_json
    from scalerl.sweep.plan import run_settings

    write_sweep(tmp_path / "s.yaml", {"a": [], "b": ["loss=dapo"]}, name="s")
    plan = make_plan(load_spec(tmp_path / "s.yaml"), [], sweep_dir=tmp_path / "out")
    run = plan.runs[1]  # b, as its job composes it: the recipe its first checkpoint keeps
    began = build_config(run.overrides, run_settings("s", run, plan.tracking_uri, "0" * 32), run.seed)
    recipe_file(run.out_dir).parent.mkdir(parents=True)
    write_json(recipe_file(run.out_dir), recipe(began))
    assert plan_lines(make_plan(load_spec(tmp_path / "s.yaml"), [], sweep_dir=tmp_path / "out"))  # the same
    write_sweep(tmp_path / "s.yaml", {"a": [], "b": ["loss=gspo"]}, name="s")
    before = listing(tmp_path)
    with pytest.raises(SweepError) as e:
        make_plan(load_spec(tmp_path / "s.yaml"), [], sweep_dir=tmp_path / "out")
    msg = str(e.value)
    assert "variant 'b': loss.name=gspo, but its run b in " in msg and "began with loss.name=dapo" in msg, msg
    assert "--out" in msg and "\n" not in msg
    assert listing(tmp_path) == before


def test_a_groups_settings_apply_to_a_variant_only_where_its_option_has_them(tmp_path):
    """The base sizes the interruption budget to the task; the variant that swaps interruptions for
    the length penalty keeps the penalty's own settings (and those it sets), not an error for keys the
    penalty does not have; a key both options have applies to both; the plan says what it left out."""
    write_sweep(
        tmp_path / "s.yaml",
        {"a": [], "lp": ["length_control=length_penalty", "length_control.l_max=32"]},
        name="s",
        base=["length_control.think_budget_min=20", "length_control.max_new_tokens=60"],
    )
    plan = make_plan(
        load_spec(tmp_path / "s.yaml"), ["length_control.answer_budget=6"], sweep_dir=tmp_path / "o"
    )
    assert plan_lines(plan) == [
        "a   length_control.think_budget_min=20 length_control.max_new_tokens=60 length_control.answer_budget=6",
        "lp  length_control.max_new_tokens=60 length_control=length_penalty length_control.l_max=32",
    ]
    tail = "not applied: length_control=length_penalty has no key of that name (it keeps its own settings)"
    assert plan.warnings == [
        f"variant 'lp': the base's length_control.think_budget_min=20 {tail}",
        f"variant 'lp': the command line's length_control.answer_budget=6 {tail}",
    ]
    # a key that no option has is still an error, named where it was written
    write_sweep(tmp_path / "t.yaml", {"a": []}, name="t", base=["length_control.think_budget=20"])
    with pytest.raises(SweepError, match="base: unknown key length_control.think_budget"):
        make_plan(load_spec(tmp_path / "t.yaml"), [], sweep_dir=tmp_path / "o")


def test_a_budget_too_short_to_score_is_said_before_the_runs(tmp_path, monkeypatch, capsys):
    """A run fits its sigmoid on the evaluations at or after scaling.min_step; with fewer than 4 its
    ceiling cannot be scored (3: the curve passes through them). The plan says so, naming the
    variants, before anything runs (a newcomer's 3-step sweep ran minutes for 'unfittable')."""
    assert points_past_cut(300, 15, 10) == 20 and points_past_cut(12, 5, 10) == 2  # 10 and the last
    assert points_past_cut(12, 1, 10) == 3 and points_past_cut(3, 1, 0) == 4
    write_sweep(
        tmp_path / "s.yaml",
        {"short": ["trainer.total_steps=12", "eval.every=1"], "long": ["trainer.total_steps=60"]},
        name="s",
    )
    tail = "a sigmoid needs 3 to be fitted and 4 to have an interval and be scored"
    plan = make_plan(load_spec(tmp_path / "s.yaml"), [], sweep_dir=tmp_path / "out")
    assert plan.warnings == [
        f"variant 'short': 3 evaluations a run at or after scaling.min_step=10 (trainer.total_steps=12, eval.every=1): {tail}"
    ]
    assert (
        make_plan(load_spec(tmp_path / "s.yaml"), ["scaling.min_step=9"], sweep_dir=tmp_path / "o").warnings
        == []
    )
    monkeypatch.chdir(tmp_path)
    assert main(["s.yaml", "--dry-run", "trainer.total_steps=3", "eval.every=1"]) == 0
    err = capsys.readouterr().err
    assert (
        f"note: every variant: 0 evaluations a run at or after scaling.min_step=10 (trainer.total_steps=3, eval.every=1): {tail}"
        in err
    )
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml")))
def test_every_shipped_sweep_composes_and_validates_every_run(name, tmp_path):
    """A shipped study whose runs would not start fails here, not after a user launched it."""
    plan = make_plan(load_spec(REPO / "sweeps" / f"{name}.yaml"), [], sweep_dir=tmp_path / "out")
    assert plan.runs and len(plan_lines(plan)) == len(plan.runs)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_loo_dry_run_through_sweep_py(tmp_path):
    """`python sweep.py --loo --dry-run`: sweeps/loo_ceiling.yaml's baseline, 8 variants each reverting
    one component and the A-mover (a thinking budget that admits the cut tier)."""
    res = run_cli(["--loo", "--dry-run"], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert listing(tmp_path) == []  # nothing written in the working directory
    spec = yaml.safe_load((REPO / "sweeps" / "loo_ceiling.yaml").read_text())
    base = " ".join(spec["base"])
    lines = [ln for ln in res.stdout.splitlines() if ln.split()[0].endswith("-seed0")]
    assert spec["seeds"] == [0, 1, 2] and len(res.stdout.splitlines()) == 3 * len(spec["variants"])
    assert [ln.split()[0].removesuffix("-seed0") for ln in lines] == list(spec["variants"])
    reverted = {
        "ppo_off_policy": "async_mode=ppo_off_policy",
        "dapo": "loss=dapo",
        "bf16_head": "precision=bf16",
        "sample_agg": "aggregation=sample",
        "prompt_norm": "norm=prompt",
        "no_zero_var_filter": "filter.zero_variance=false",
        "no_npr": "filter.no_positive_resampling=false",
        # sized to the task: the penalty's own settings, not base's interruption budget
        "length_penalty": "length_control=length_penalty length_control.max_new_tokens=28 "
        "length_control.l_max=28 length_control.l_cache=4",
        "long_budget": "length_control.think_budget_min=40 length_control.think_budget_max=48",
    }
    by_name = {ln.split()[0].removesuffix("-seed0"): ln.split(None, 1)[1] for ln in lines}
    assert by_name["scalerl"] == f"{base} seed=0"
    interruption_budget = [o for o in spec["base"] if o.startswith("length_control.think_budget")]
    assert len(interruption_budget) == 2
    for name, override in reverted.items():
        shared = base
        if name in ("length_penalty", "long_budget"):  # the variant's own budget replaces base's
            shared = " ".join(o for o in spec["base"] if o not in interruption_budget)
        if name == "length_penalty":
            assert (
                "note: variant 'length_penalty': the base's " + ", ".join(interruption_budget) in res.stderr
            )
        assert by_name[name].split("  (not run: ")[0] == f"{shared} {override} seed=0"
    import torch

    if not torch.cuda.is_available():  # the bf16 head would be emulated here: planned, not run
        assert by_name["bf16_head"].endswith("cannot act)") and "not run" not in by_name["dapo"]
        assert (
            "3 not run, since their component cannot act here (bf16_head; --run-all runs them)" in res.stderr
        )


@pytest.mark.parametrize(
    "content, expected",
    [
        (
            {"name": "bad", "variants": {"ok": [], "x": ["loss=bogus"]}},
            f"variant 'x': unknown option loss=bogus (available: {LOSS_OPTIONS})",
        ),
        ({"name": "bad", "variants": {"x": ["loss.eps_maxx=3"]}}, "variant 'x': unknown key loss.eps_maxx"),
        ({"name": "bad", "variants": {"x": ["+trainer.foo=3"]}}, "variant 'x': unknown key trainer.foo"),
        ({"name": "bad", "variants": {"x": ["lossx=cispo"]}}, "variant 'x': unknown group or key 'lossx'"),
        (
            {"name": "bad", "variants": {"x": ["optim.lr=1"]}},
            "variant 'x': unknown key optim.lr: there is no group 'optim'",
        ),
        (
            {"name": "bad", "variants": {"x": ["trainer.batch_size=30"]}},
            "variant 'x': invalid config value trainer.batch_size=30",
        ),
        (
            {"name": "bad", "variants": {"x": ["trainer.total_steps=many"]}},
            "variant 'x': bad value trainer.total_steps=many",
        ),
        (
            {"name": "bad", "base": ["async_mode=bogus"], "variants": {"x": []}},
            "base: unknown option async_mode=bogus",
        ),
        (  # the report's intervals need resamples in each tail (as the analysis CLI's --bootstrap)
            {"name": "bad", "base": ["scaling.bootstrap=5"], "variants": {"x": []}},
            "base: invalid config value scaling.bootstrap=5: must be 0 (no intervals) or at least 20",
        ),
        ({"name": "bad", "variants": {"x": ["loss"]}}, "variant 'x': malformed override 'loss'"),
        ({"name": "bad", "variants": {"x": {"loss": "dapo"}}}, "variant 'x': expected a list of overrides"),
        ({"name": "bad", "variants": ["loss=dapo"]}, "'variants' must be a non-empty mapping"),
        ({"name": "bad", "variant": {"x": []}}, "unknown key 'variant'"),
        ({"name": "bad", "baseline": "y", "variants": {"x": []}}, "baseline 'y' is not a variant"),
        ({"name": "bad", "variants": {"x": ["out_dir=/tmp/x"]}}, "variant 'x': out_dir is set by the sweep"),
        ("name: bad\nvariants: [a\n", "invalid YAML at line"),
        # a variant's folder would be the sweep folder's state file
        ({"name": "bad", "variants": {"sweep.json": []}}, "variant 'sweep.json': a variant name must be"),
        ({"name": "bad", "variants": {"Report": []}}, "variant 'Report': a variant name must be"),
        # YAML reads an unquoted off / ~ as false / null: the run would be named False / None
        (
            "name: bad\nvariants:\n  off: []\n",
            "variant name False: YAML reads this unquoted name as a boolean",
        ),
        ("name: bad\nvariants:\n  ~: []\n", "variant name None: YAML reads this unquoted name as a null"),
        ({"name": "bad", "variants": {"x": ["=dapo"]}}, "variant 'x': malformed override '=dapo'"),
        ({"name": "bad", "variants": {"x": ["~"]}}, "variant 'x': malformed override '~'"),
        ({"name": "bad", "description": False, "variants": {"x": []}}, "description must be a string"),
        (
            {"name": "bad", "variants": {"x": ["tracking=default"]}},
            "variant 'x': tracking is set by the sweep",
        ),
    ],
)
def test_bad_sweep_file_fails_before_launching(tmp_path, monkeypatch, capsys, content, expected):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "bad.yaml"
    f.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    assert main(["bad.yaml", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: bad.yaml: "), err[0]
    assert expected in err[0], err[0]
    assert listing(tmp_path) == ["bad.yaml"]  # nothing launched, nothing written


def test_bad_command_line_override(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_sweep(tmp_path / "s.yaml", {"x": []}, name="s")
    assert main(["s.yaml", "loss=nope"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: command line: unknown option loss=nope (available: {LOSS_OPTIONS})"
    )
    assert main(["s.yaml", "launcher.bogus=1"]) == 2
    assert "error: command line: unknown key launcher.bogus" in capsys.readouterr().err
    assert listing(tmp_path) == ["s.yaml"]


def test_command_line_mistakes_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, refused):
    """Mistakes with the sweep file, the flags and the tracking store: one line, exit 2, no
    traceback, nothing written (and no MLflow tables put into a database that is not a store)."""
    import sqlite3

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_sweep(tmp_path / "s.yaml", {"x": []}, name="s")
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "store").mkdir()
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    before = listing(tmp_path)

    refused(main, ["dir.yaml"], "error: dir.yaml: is a folder, not a sweep file")
    refused(
        main, ["s.yaml", "--dryrun"], "error: unrecognized arguments: --dryrun (see python sweep.py --help)"
    )
    refused(main, ["s.yaml", "=x"], "command line: malformed override '=x'")
    refused(main, ["s.yaml", "tracking=default"], "command line: tracking is set by the sweep")
    for uri, expected in (
        (f"sqlite:///{tmp_path / 'store'}", "is a folder; a sqlite store is a file"),
        (f"sqlite:///{tmp_path / 's.yaml'}", "s.yaml is not an SQLite database"),
        (f"sqlite:///{tmp_path / 'other.db'}", "other.db is an SQLite database but not an MLflow store"),
        ("sqlite://m.db", "a sqlite URI is sqlite:///relative/file.db"),
    ):
        refused(main, ["s.yaml", "--tracking-uri", uri], expected)
    with monkeypatch.context() as m:  # a file this user cannot read (root reads any: simulated)
        m.setattr(
            Path, "read_text", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
        )
        refused(main, ["s.yaml"], "error: s.yaml: cannot read the sweep file (Permission denied)")
    with monkeypatch.context() as m:  # a folder the preflight cannot foresee failing (/proc/x, a full disk)
        m.setattr(Path, "mkdir", lambda *a, **k: (_ for _ in ()).throw(OSError(30, "Read-only file system")))
        refused(main, ["s.yaml", "--out", "out"], "sweep folder (--out)=")
    assert listing(tmp_path) == before
    with sqlite3.connect(tmp_path / "other.db") as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["t"]
    # the sweep file after an override is still the sweep file
    assert main(["trainer.lr=0.002", "s.yaml", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == "x  trainer.lr=0.002"


@pytest.mark.slow
def test_runtime_failure_is_not_a_plan_error(tmp_path):
    """The failing variant of the real sweep below passes validation: it fails only in its job."""
    write_sweep(tmp_path / "s.yaml", {"broken": BROKEN}, name="s")
    plan = make_plan(load_spec(tmp_path / "s.yaml"), [], sweep_dir=tmp_path / "out")
    assert plan.runs[0].overrides == BROKEN


# ----------------------------------------------------------------------------- a real sweep
@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory, _cache_dir):
    root = tmp_path_factory.mktemp("sweep")
    f = write_sweep(
        root / "tiny.yaml",
        {"cispo": TINY_TASK, "dapo": ["loss=dapo", *TINY_TASK], "broken": BROKEN},
        name="tiny",
        base=TINY_BASE,
        baseline="cispo",
    )
    uri = f"sqlite:///{root / 'mlflow.db'}"
    args = [str(f), "--out", str(root / "out"), "--tracking-uri", uri, "launcher.max_parallel=3"]
    res = run_cli(args, cwd=root)
    return {"root": root, "file": f, "uri": uri, "out": root / "out", "args": args, "res": res}


def _signal_all(pids: list[int], signum: int) -> None:
    """``signum`` to each of ``pids`` that still runs."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(client, name="tiny"):
    exp = client.get_experiment_by_name(name)
    return client.search_runs([exp.experiment_id], max_results=100)


def _csv(path: Path) -> dict[str, dict]:
    with path.open() as fh:
        return {row["job"]: row for row in csv.DictReader(fh)}


def test_sweep_runs_are_children_of_a_parent_run_with_the_report(tiny_sweep):
    res = tiny_sweep["res"]
    assert res.returncode == 1, res.stderr[-3000:]  # 1: a variant failed, the others completed
    client = _client(tiny_sweep["uri"])
    runs = _runs(client)
    parents = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.info.run_name == "tiny"
    state = json.loads((tiny_sweep["out"] / "sweep.json").read_text())
    assert state["parent_run_id"] == parent.info.run_id
    children = {r.info.run_name: r for r in runs if r.info.run_id != parent.info.run_id}
    assert set(children) == {"cispo", "dapo"}  # "broken" failed before it reached MLflow
    for name, run in children.items():
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert (tags["sweep"], tags["variant"], tags["seed"]) == ("tiny", name, "0")
        assert run.info.status == "FINISHED"
        assert run.data.params["loss"] == name  # params: everything the training loop logs
        assert run.data.params["trainer.total_steps"] == "6"
        assert "trainer.total_steps=6" in tags["overrides"]
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/fits.csv", "report/fits.md", "report/scaling_curves.png", "report/linearised.png"} <= arts
    rows = _csv(tiny_sweep["out"] / "report" / "fits.csv")
    assert [rows[k]["status"] for k in ("cispo", "dapo", "broken")] == ["finished", "finished", "failed"]
    assert rows["cispo"]["baseline"] == "True"
    for name, run in children.items():
        m = run.data.metrics
        assert "fit/A" in m and "fit/B" in m and "fit/ok" in m
        assert int(rows[name]["n_evals"]) == 7  # step 0 + one evaluation per step
        if rows[name]["ok"] == "True":  # the fit written back is the report's fit
            assert m["fit/ok"] == 1.0
            # (rounded: A to 0.001, B to 3 significant figures)
            assert m["fit/A"] == round(float(rows[name]["A"]), 3)
            assert math.isclose(m["fit/B"], float(rows[name]["B"]), rel_tol=5e-3)
            assert m["fit/delta_A"] == round(float(rows[name]["delta_A"]), 3) + 0.0
        else:
            assert m["fit/ok"] == 0.0 and math.isnan(m["fit/A"])
    md = (tiny_sweep["out"] / "report" / "fits.md").read_text()
    assert md.startswith("# Sweep tiny: 3 runs") and "| run_name | loss |" in md
    assert "| status | A [90% CI] | B | C_mid | R0 | points |" in md
    assert md in res.stdout  # the table is printed too
    assert parent.data.metrics["sweep/runs_finished"] == 2 and parent.data.metrics["sweep/runs_failed"] == 1


def test_failed_variant_is_reported_with_its_log(tiny_sweep):
    res, out = tiny_sweep["res"], tiny_sweep["out"]
    status = json.loads((out / "status.json").read_text())
    log = Path(status["broken"]["log"])
    assert status["broken"]["status"] == "failed" and log.is_file() and log.parent == out / "logs"
    assert "DataFileError" in log.read_text()
    assert "nonexistent.jsonl': no such file" in status["broken"]["error"]
    assert "broken: FAILED: scalerl.task.jsonl.DataFileError: task.path='/nonexistent.jsonl'" in res.stderr
    assert f"log: {log}" in res.stderr
    row = _csv(out / "report" / "fits.csv")["broken"]
    assert row["status"] == "failed" and row["log"] == str(log)
    assert f"log: {log}" in (out / "report" / "fits.md").read_text()
    for ok in ("cispo", "dapo"):
        assert status[ok]["status"] == "finished"
        assert json.loads((out / ok / "summary.json").read_text())["steps"] == 6


def test_each_run_that_ends_says_how_far_the_sweep_is_and_how_long_the_rest_take(tiny_sweep):
    """Every run that ends says "k of 3 done"; once a run has finished and others remain, also the
    time left at the finished runs' pace (a failed run sets no pace); the last says no time."""
    ends = [ln for ln in tiny_sweep["res"].stderr.splitlines() if "of 3 done" in ln]
    assert [ln.split(" (")[-1].split(" of ")[0] for ln in ends] == ["1", "2", "3"], ends
    assert ends[-1].endswith("(3 of 3 done)"), ends
    for k, ln in enumerate(ends[:-1], 1):
        finished = sum(": finished in " in e for e in ends[:k])
        if finished:
            when = r"(about [0-9.]+ (s|min) left|the rest due now)"
            assert re.search(rf"\({k} of 3 done; {when} at the pace of the {finished} finished\)$", ln), ln
        else:
            assert ln.endswith(f"({k} of 3 done)"), ln


def test_rerun_skips_finished_variants_and_resumes_unfinished_ones(tiny_sweep, capsys):
    client = _client(tiny_sweep["uri"])
    before = {r.info.run_name: r.info.run_id for r in _runs(client)}

    assert main(tiny_sweep["args"]) == 1  # in-process: the same command line as `python sweep.py`
    err = capsys.readouterr().err
    for name in ("cispo", "dapo"):
        assert f"{name}: already finished (6 steps" in err
        assert f"{name}: submitted" not in err
    assert "broken: FAILED" in err  # not finished: launched again
    assert {r.info.run_name: r.info.run_id for r in _runs(client)} == before  # no new MLflow runs

    # a bigger budget: both runs continue from their checkpoints, in the same MLflow runs
    assert main([*tiny_sweep["args"], "trainer.total_steps=8"]) == 1
    err = capsys.readouterr().err
    assert "cispo: submitted" in err and "already finished" not in err
    after = {r.info.run_name: r for r in _runs(client)}
    assert {k: r.info.run_id for k, r in after.items()} == before
    for name in ("cispo", "dapo"):
        run = after[name]
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "progress/step")]
        assert sorted(steps) == list(range(0, 9))  # no duplicates, nothing missing
        evals = [m.step for m in client.get_metric_history(run.info.run_id, "val/pass_rate")]
        assert sorted(evals) == list(range(0, 9))
        assert json.loads((tiny_sweep["out"] / name / "summary.json").read_text())["steps"] == 8
        assert (
            "resumed"
            in (Path(json.loads((tiny_sweep["out"] / "status.json").read_text())[name]["log"])).read_text()
        )
    assert _csv(tiny_sweep["out"] / "report" / "fits.csv")["cispo"]["n_evals"] == "9"


@pytest.mark.slow
def test_a_relaunch_waits_for_the_job_a_killed_driver_left_running(tmp_path, _cache_dir):
    """The sweep's driver is killed (SIGKILL) while its local job trains: the job goes on; the same
    command again finds it running, waits for it instead of starting the run twice, and takes its
    result (finished, exit 0, one MLflow run). The job is held stopped (SIGSTOP) until the relaunch
    has said so: on a fast machine it could otherwise finish first. A run whose job finished while
    no driver watched it (its status still ``running``) is skipped as finished, and its status
    says so."""
    import signal
    import time

    f = write_sweep(
        tmp_path / "s.yaml", {"cispo": TINY_TASK}, name="s", base=[*TINY_BASE, "trainer.total_steps=40"]
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [str(f), "--out", str(tmp_path / "out"), "--tracking-uri", uri]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    t_first = time.time()
    driver = subprocess.Popen(
        [sys.executable, str(REPO / "sweep.py"), *args],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    ckpt = tmp_path / "out" / "cispo" / "checkpoint"
    deadline = time.time() + 300
    while not ckpt.exists() and time.time() < deadline and driver.poll() is None:
        time.sleep(0.5)
    assert ckpt.exists(), driver.stderr.read() if driver.poll() is not None else "no checkpoint in 300 s"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    status = json.loads((tmp_path / "out" / "status.json").read_text())["cispo"]
    assert status["status"] == "running" and _LocalOrphan.attach(tmp_path / "out" / "logs", status["job_id"])
    job = int(status["job_id"])
    waiting = f"cispo: still running from an earlier launch (job {job}); waiting for it"
    # stopped once its checkpoint's metrics are in the store (the step after it is printed), so
    # that it holds no write of the store that the relaunch would wait on
    out_log = Path(status["stdout"])
    while not any(f"step {n} reward" in out_log.read_text() for n in range(11, 20)):
        assert time.time() < deadline, "the job printed no step after its first checkpoint"
        time.sleep(0.05)
    # alive, and it cannot finish before the relaunch has looked: the job id is submitit's
    # controller, the run is its child, so the whole tree is stopped
    under = descendants(job)
    assert under, f"no process under submitit's controller {job}"
    tree = [job, *under]
    _signal_all(tree, signal.SIGSTOP)
    before_relaunch = time.time() - t_first
    seen: list[str] = []
    try:
        relaunch = subprocess.Popen(
            [sys.executable, str(REPO / "sweep.py"), *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in relaunch.stderr:  # until it says what it found (or ends)
            seen.append(line)
            if "cispo:" in line:
                break
    finally:
        _signal_all(tree, signal.SIGCONT)  # every one, even where one of them has ended
    _, rest = relaunch.communicate(timeout=420)
    stderr = "".join(seen) + rest
    assert relaunch.returncode == 0, stderr[-3000:]
    assert waiting in stderr, stderr[-3000:]
    assert "cispo: finished in" in stderr and "cispo: submitted" not in stderr, stderr[-3000:]
    # its time counts from the first launch's submission, not from the relaunch that waited for it
    took = float(re.search(r"cispo: finished in (\d+) s", stderr).group(1))
    assert took >= before_relaunch - 1, (took, before_relaunch)
    assert "(1 of 1 done)" in stderr
    status_file = tmp_path / "out" / "status.json"
    assert json.loads(status_file.read_text())["cispo"]["status"] == "finished"
    assert json.loads((tmp_path / "out" / "cispo" / "summary.json").read_text())["steps"] == 40
    assert [
        r.info.run_name for r in _runs(_client(uri), "s") if r.data.tags.get("sweep.role") != "parent"
    ] == ["cispo"]

    # the job finished while no driver watched it: the status it left says running
    entries = json.loads(status_file.read_text())
    entries["cispo"]["status"] = "running"
    status_file.write_text(json.dumps(entries))
    res = run_cli(args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "cispo: already finished (40 steps" in res.stderr and "cispo: submitted" not in res.stderr
    assert waiting not in res.stderr
    assert json.loads(status_file.read_text())["cispo"]["status"] == "finished"


def test_report_command_rewrites_the_report(tiny_sweep, capsys):
    report = tiny_sweep["out"] / "report" / "fits.md"
    report.unlink()
    assert main(["--report", str(tiny_sweep["file"]), "--out", str(tiny_sweep["out"])]) == 0
    out = capsys.readouterr()
    assert report.is_file() and report.read_text() in out.out
    assert "# Sweep tiny: 3 runs (2 finished, 1 failed)" in out.out
    assert main(["--report", "no_such_sweep", "--out", str(tiny_sweep["root"] / "nowhere")]) == 2
    assert "no sweep launched here" in capsys.readouterr().err


def test_report_command_with_its_store_gone_is_one_line(tiny_sweep, capsys, monkeypatch):
    """`--report` against a tracking store that is not there, or that answers only errors: one line
    naming the store, a non-zero exit, no traceback, and the report already written left as it was."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    args = ["--report", str(tiny_sweep["file"]), "--out", str(tiny_sweep["out"])]
    folder = tiny_sweep["out"] / "report"
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    port = free_port()
    assert main([*args, "--tracking-uri", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no tracking server answers at 127.0.0.1:{port}" in err[0], err
    with unavailable_server() as uri:
        assert main([*args, "--tracking-uri", uri]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: tiny: the report failed (the tracking store at {uri} failed: MlflowException: it answered HTTP 503)"
    ), err
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_report_flags_a_ceiling_the_data_does_not_settle():
    from scalerl.analysis import rows_to_markdown

    def row(name, a_hi):
        return {
            "run_name": name, "status": "finished", "ok": True, "baseline": name == "base",
            "A": 0.6, "A_lo": 0.5, "A_hi": a_hi, "B": 1.0, "C_mid": 1e12, "delta_A": 0.0,
            "B_fixed_A": 1.0, "pass_rate_start": 0.1, "pass_rate_final": 0.5,
        }  # fmt: skip

    md = rows_to_markdown([row("base", 0.7), row("open", 1.0)])
    base_line = next(line for line in md.splitlines() if line.startswith("| base "))
    open_line = next(line for line in md.splitlines() if line.startswith("| open "))
    assert "cannot rule out a ceiling of 1" in open_line
    assert "A unsettled" not in base_line


# ----------------------------------------------------------------------------- components that cannot act
def _skips(variants: dict, cli: list[str], tmp_path, **kw) -> dict[str, str]:
    write_sweep(tmp_path / "s.yaml", variants, name="s", baseline="base")
    plan = make_plan(load_spec(tmp_path / "s.yaml"), cli, sweep_dir=tmp_path / "out", **kw)
    return {r.variant: r.skip for r in plan.runs}


def test_a_variant_whose_component_cannot_act_where_it_would_run_is_planned_not_run(tmp_path):
    """A bf16 LM head on a CPU is emulated (fp32 math, rounded): the paper's mechanism cannot act,
    so the sweep does not spend a run on it, unless asked to (--run-all). Where its runs get a GPU
    (a SLURM job holding one), or the head is fp32, it runs; the baseline always runs."""
    variants = {"base": [], "bf16": ["precision=bf16"], "dapo": ["loss=dapo"]}
    cpu = _skips(variants, ["trainer.device=cpu"], tmp_path)
    assert cpu["base"] == cpu["dapo"] == "" and cpu["bf16"].startswith(
        "precision.head=bf16 would be emulated"
    )
    assert "cannot act" in cpu["bf16"]
    assert not any(_skips(variants, ["trainer.device=cpu"], tmp_path, run_all=True).values())
    on_slurm = ["launcher=slurm", "launcher.partition=debug"]
    assert _skips(variants, on_slurm, tmp_path)["bf16"]  # no GPU held by the job
    assert _skips(variants, [*on_slurm, "launcher.gpus_per_node=1"], tmp_path)["bf16"] == ""
    assert _skips(variants, ["trainer.device=cpu", "precision.impl=native"], tmp_path)["bf16"] == ""
    # the baseline itself is never skipped: it is what every variant is compared with
    assert _skips({"base": ["precision=bf16"], "x": []}, ["trainer.device=cpu"], tmp_path)["base"] == ""


def test_the_local_launcher_starts_the_runs_with_the_most_work_first(tmp_path):
    """A sweep's runs start longest first (by the tokens their configs process: a longer thinking
    budget more, no dynamic sampling and a shorter budget less), so that its last minutes run short
    runs side by side rather than a long one alone; runs of equal work keep the file's order. The
    order counted from the options planning read (as the launcher and the dry run count it) is the
    order composed again from each run's overrides."""
    variants = {
        "short": ["length_control.think_budget_min=10", "length_control.think_budget_max=12"],
        "base": [],
        "no_ds": ["filter.dynamic_sampling=false"],
        "long": ["length_control.think_budget_min=50", "length_control.think_budget_max=56"],
        "dapo": ["loss=dapo"],
    }
    write_sweep(tmp_path / "s.yaml", variants, name="s", baseline="base", seeds=[0, 1])
    plan = make_plan(load_spec(tmp_path / "s.yaml"), [], sweep_dir=tmp_path / "out")
    assert sorted(plan.work_options) == sorted(variants)
    order = [r.name for r in launch_order(plan.runs, plan.work_options)]
    want = ["long", "base", "dapo", "no_ds", "short"]
    assert order == [f"{v}-seed{s}" for v in want for s in (0, 1)], order
    assert [r.name for r in launch_order(plan.runs)] == order


def _ended(name: str, seconds: float, status: str = "finished") -> Outcome:
    return Outcome(name=name, status=status, job_id="1", log="", stdout="", seconds=seconds)


def test_the_time_left_follows_the_pace_of_the_finished_runs_of_each_variant():
    """A run lasts as long as its variant's finished seeds took on average, or, before one has, all
    finished runs' mean; one still going needs that less its time so far; the rest are scheduled
    as many at once as the launcher runs, in launch order."""
    variant = {"long-0": "long", "long-1": "long", "base-0": "base", "base-1": "base"}
    pace = Pace(variant, at_once=2, total=4)
    pace.record(_ended("long-0", 200.0))
    # long-1 needs 200 - 30 = 170 s more; base-0 and base-1 take the mean of all finished (200 s)
    assert pace.left_s({"long-1": 30.0}, ["base-0", "base-1"]) == pytest.approx(370.0)
    assert pace.line({"long-1": 30.0}, ["base-0", "base-1"]) == (
        "1 of 4 done; about 6 min left at the pace of the 1 finished"
    )
    pace.record(_ended("base-0", 100.0))
    # base-1 now takes base's own 100 s; long-1, past its expected time, needs none more
    assert pace.duration("base-1") == pytest.approx(100.0)
    assert pace.left_s({"long-1": 250.0}, ["base-1"]) == pytest.approx(100.0)
    # one at once runs the rest end to end: long-1's 170 s, then base-1's 100 s
    one = Pace(variant, 1, 4, took=dict(pace.took), ended=2)
    assert one.left_s({"long-1": 30.0}, ["base-1"]) == pytest.approx(270.0)


def test_a_failed_run_sets_no_pace_and_the_last_says_no_time():
    pace = Pace({"a": "a", "b": "b", "c": "c"}, at_once=2, total=4)
    pace.record(_ended("x", 3.0, status="failed"))
    assert pace.left_s({}, ["a"]) is None and pace.line({}, ["a"]) == "1 of 4 done"
    pace.record(_ended("a", 60.0))
    pace.record(_ended("b", 120.0))
    assert pace.duration("c") == pytest.approx(90.0)  # no seed of c finished: the mean of all
    assert pace.line({}, []) == "3 of 4 done"  # nothing left to run: no time said
    assert pace.line({"c": 1000.0}, []) == "3 of 4 done; the rest due now at the pace of the 2 finished"
    # SLURM: its queue decides when runs start, so the count alone
    assert Pace({}, 8, 4, timed=False, took={"a": 1.0}, ended=1).line({"b": 1.0}, []) == "1 of 4 done"


@pytest.mark.slow
def test_a_variant_not_run_is_reported_as_such(tmp_path, capsys):
    """The sweep's other runs finished (synthetic curves in a real MLflow store); the bf16 head,
    pinned to the CPU, is recorded as not run, has no MLflow run, and the report's verdict table
    says it cannot act here and was not run; the exit status is 0 (nothing failed)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    variants = {"base": [], "dapo": ["loss=dapo"], "bf16": ["precision=bf16", "trainer.device=cpu"]}
    sw = log_synthetic_sweep(tmp_path, uri, variants=variants)
    assert main([str(sw["file"]), "--out", str(sw["out"]), "--tracking-uri", uri]) == 0
    out = capsys.readouterr()
    assert "bf16-seed0: not run: precision.head=bf16 would be emulated" in out.err
    assert "2 not run, since their component cannot act here (bf16; --run-all runs them)" in out.err
    listed = next(line for line in out.err.splitlines() if line.startswith("[sweep] report: "))
    names = listed.split("/ (", 1)[1].split(") and ", 1)[0].split(", ")
    assert "forest.png" in names and "verdicts.csv" in names, listed  # the files written, each there
    assert all((sw["out"] / "report" / n).is_file() for n in names if "*" not in n), names
    status = json.loads((sw["out"] / "status.json").read_text())
    assert status["bf16-seed1"]["status"] == "not run" and "cannot act" in status["bf16-seed1"]["error"]
    names = {r.info.run_name for r in _runs(sw["client"], "syn")}
    assert not any(n.startswith("bf16") for n in names) and {"base-seed0", "dapo-seed1"} <= names
    md = (sw["out"] / "report" / "fits.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| bf16 | 0/0 |"))
    assert "cannot act here: precision.head=bf16 would be emulated" in row and row.endswith("(not run) |")
    assert _csv(sw["out"] / "report" / "fits.csv")["bf16-seed0"]["status"] == "not run"
    verdicts = list(csv.DictReader((sw["out"] / "report" / "verdicts.csv").open()))
    assert [v["variant"] for v in verdicts] == ["base", "dapo", "bf16"]
    # report.json's machine-readable verdict: "not run", no seeds, nothing estimated (null)
    doc = json.loads((sw["out"] / "report" / "report.json").read_text())
    bf16 = next(v for v in doc["variants"] if v["variant"] == "bf16")
    assert (
        bf16["verdict"] == "not run" and bf16["seeds"] == 0 and bf16["per_seed"] == [] and bf16["A"] is None
    )


# ----------------------------------------------------------------------------- one report pipeline
SYN_SWEEP = {  # variant -> (true curve, params the run logs); "broken" never reaches MLflow
    "base": ((0.15, 0.62, 1.9, 2.0e18), {"loss": "cispo", "precision": "fp32_head"}),
    "dapo": ((0.15, 0.55, 1.5, 2.5e18), {"loss": "dapo", "precision": "fp32_head"}),
    "bf16": ((0.15, 0.60, 2.4, 1.5e18), {"loss": "cispo", "precision": "bf16"}),
}


@pytest.fixture
def synthetic_sweep(tmp_path):
    """A sweep launched for real (plan, parent run, sweep.json) whose child runs are synthetic
    curves logged into a real sqlite MLflow store the way training runs log them, 2 seeds each,
    plus a planned variant that failed before reaching MLflow."""
    return log_synthetic_sweep(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")


def log_synthetic_sweep(
    tmp_path, uri: str, seeds=(0, 1), activity: dict | None = None, variants: dict | None = None
) -> dict:
    """The runs of :func:`synthetic_sweep` logged into the store at ``uri`` (``activity``: step
    metrics every run logs as well, e.g. ``{"data/prompts_retired": 0}``; ``variants``: the sweep
    file's, default every variant of :data:`SYN_SWEEP` and a broken one). Runs the plan marks not
    to be run (their component cannot act here) are not logged."""
    import time

    import numpy as np
    from mlflow.entities import Metric, Param, RunTag

    from scalerl.scaling.synthetic import TrueCurve, sample_run
    from scalerl.sweep.state import client_for, start_parent

    f = write_sweep(
        tmp_path / "syn.yaml",
        variants or {"base": [], "dapo": ["loss=dapo"], "bf16": ["precision=bf16"], "broken": BROKEN},
        name="syn",
        base=["trainer.total_steps=300", "scaling.bootstrap=40"],
        seeds=list(seeds),
        baseline="base",
    )
    sdir = tmp_path / "out"
    # the default variants stand for runs on a GPU (run_all: the bf16 head is logged as having run)
    plan = make_plan(load_spec(f), [], sweep_dir=sdir, tracking_uri=uri, run_all=variants is None)
    exp_id, parent = start_parent(plan)
    client = client_for(uri)
    rng = np.random.default_rng(0)
    ids = {}
    for run in plan.runs:
        if run.variant == "broken" or run.skip:
            continue
        truth, params = SYN_SWEEP[run.variant]
        c, y = sample_run(TrueCurve(*truth), rng, reach=6.0, trials=2048, n_points=30)
        tags = {"mlflow.parentRunId": parent, "sweep": "syn", "variant": run.variant, "seed": str(run.seed)}
        r = client.create_run(exp_id, run_name=run.name, tags=tags)
        ts = int(time.time() * 1000)
        ms = [Metric("val/pass_rate", float(v), ts, 10 * i) for i, v in enumerate(y)]
        ms += [Metric("compute/flops", float(v), ts, 10 * i) for i, v in enumerate(c)]
        ms += [Metric(k, float(v), ts, 10 * (len(c) - 1)) for k, v in (activity or {}).items()]
        ps = [Param(k, v) for k, v in {**params, "seed": str(run.seed), "out_dir": run.out_dir}.items()]
        client.log_batch(r.info.run_id, metrics=ms, params=ps, tags=[RunTag("mlflow.runName", run.name)])
        client.set_terminated(r.info.run_id)
        Path(run.out_dir).mkdir(parents=True)
        summary = {"steps": run.total_steps, "pass_rate_start": y[0], "pass_rate_final": y[-1]}
        (Path(run.out_dir) / "summary.json").write_text(json.dumps(summary))
        ids[run.name] = r.info.run_id
    return {"file": f, "uri": uri, "out": sdir, "ids": ids, "client": client, "parent": parent}


COMPARED = (
    "baseline",
    "ok",
    "A",
    "A_lo",
    "A_hi",
    "B",
    "C_mid",
    "delta_A",
    "delta_B",
    "B_fixed_A",
    "verdict",
)


@pytest.mark.slow
def test_sweep_report_and_analysis_cli_give_the_same_table(synthetic_sweep, capsys):
    """The same runs through `python sweep.py --report` and `python -m scalerl.analysis compare`
    (no --baseline: it takes the baseline the sweep declared): the same fits, and the same delta A
    and delta B against the same baseline variant, the mean over its two seeds."""
    from scalerl.analysis.__main__ import main as analysis_main

    sw = synthetic_sweep
    assert main(["--report", str(sw["file"]), "--out", str(sw["out"])]) == 0
    capsys.readouterr()
    sweep_list = list(csv.DictReader((sw["out"] / "report" / "fits.csv").open()))
    assert [r["job"] for r in sweep_list] == [
        f"{v}-seed{s}" for v in ("base", "dapo", "bf16", "broken") for s in (0, 1)
    ]
    sweep_rows = {r["run_id"]: r for r in sweep_list if r["run_id"]}
    rc = analysis_main(
        ["compare", "--tracking-uri", sw["uri"], "--experiment", "syn", "--out", str(sw["out"] / "cli"),
         "--bootstrap", "40"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "baseline: variant 'base' (2 runs, 2 fitted): given by sweep 'syn'" in out.err
    cli_rows = {r["run_id"]: r for r in csv.DictReader((sw["out"] / "cli" / "fits.csv").open())}

    assert set(cli_rows) == set(sw["ids"].values()) == set(sweep_rows)
    for rid, cli in cli_rows.items():
        assert {k: sweep_rows[rid][k] for k in COMPARED} == {k: cli[k] for k in COMPARED}, cli["run_name"]
    by_name = {r["run_name"]: r for r in cli_rows.values()}
    base_a = (float(by_name["base-seed0"]["A"]) + float(by_name["base-seed1"]["A"])) / 2
    base_b = (float(by_name["base-seed0"]["B"]) + float(by_name["base-seed1"]["B"])) / 2
    for r in by_name.values():
        assert r["baseline"] == str(r["run_name"].startswith("base-"))
        assert float(r["delta_A"]) == pytest.approx(float(r["A"]) - base_a, abs=1e-12)
        assert float(r["delta_B"]) == pytest.approx(float(r["B"]) - base_b, abs=1e-12)
    assert float(by_name["dapo-seed0"]["delta_A"]) < -0.03  # true A 0.55 against 0.62
    # the sweep's own rows: the failed variant listed (unfitted), the Markdown tables identical
    broken = sweep_list[-1]
    assert broken["status"] == "not started" and broken["ok"] == "False" and broken["variant"] == "broken"
    sweep_md = (sw["out"] / "report" / "fits.md").read_text()
    cli_md = (sw["out"] / "cli" / "fits.md").read_text()
    for name in by_name:
        line = next(ln for ln in sweep_md.splitlines() if ln.startswith(f"| {name} "))
        assert line in cli_md.splitlines(), line
    # the fit/* metrics written back are the table's
    m = sw["client"].get_run(sw["ids"]["dapo-seed1"]).data.metrics
    # (rounded to what the data resolves: 0.001 for pass rates, 0.01 for B)
    assert m["fit/delta_A"] == round(float(by_name["dapo-seed1"]["delta_A"]), 3)
    assert m["fit/delta_B"] == round(float(by_name["dapo-seed1"]["delta_B"]), 2)
    assert "fit/exceeds_margin" not in m
    # the verdicts: dapo's ceiling (0.55 against 0.62, two seeds) is called lower (in A, or, where two
    # seeds a side leave Welch's test on A too few df, in B at the baseline's A); the run table's
    # short tags and the parent run's description show it
    verdicts = {r["variant"]: r for r in csv.DictReader((sw["out"] / "report" / "verdicts.csv").open())}
    assert list(verdicts) == ["base", "dapo", "bf16"]
    assert verdicts["base"]["verdict"] == "baseline" and verdicts["dapo"]["label"] in ("A lower", "B lower")
    assert verdicts["dapo"]["verdict"].startswith(verdicts["dapo"]["label"])
    tags = sw["client"].get_run(sw["ids"]["dapo-seed1"]).data.tags
    assert tags["1 variant"] == "dapo" and tags["2 verdict"] == verdicts["dapo"]["verdict"]
    note = sw["client"].get_run(sw["parent"]).data.tags["mlflow.note.content"]
    assert note.startswith("## Verdicts per variant\n\n| variant | seeds | A [90% CI] |")
    assert (
        "| dapo | 2/2 | " in note
        and f"dapo: {verdicts['dapo']['label']}" in sw["client"].get_run(sw["parent"]).data.tags["2 verdict"]
    )
    # the figures of the verdicts are artifacts of the parent run
    arts = {a.path for a in sw["client"].list_artifacts(sw["parent"], "report")}
    assert {"report/variants.png", "report/forest.png", "report/calibration.png"} <= arts, arts
    assert not list((sw["out"] / "report").glob("*.error.txt"))
    # the machine-readable report beside fits.md, an artifact of the parent run too: its labels are
    # verdicts.csv's, its wall time the span of the finished runs in MLflow
    assert "report/report.json" in arts
    doc = json.loads((sw["out"] / "report" / "report.json").read_text())
    assert [v["variant"] for v in doc["variants"]] == list(verdicts)
    assert [v["verdict"] for v in doc["variants"]] == [verdicts[v]["label"] for v in verdicts]
    assert isinstance(doc["wall_s"], float) and 0 <= doc["wall_s"] < 3600

    # --baseline by run name: that run's variant, both seeds, the same numbers
    rc = analysis_main(
        ["fit", "--tracking-uri", sw["uri"], "--experiment", "syn", "--out", str(sw["out"] / "cli2"),
         "--bootstrap", "40", "--baseline", "base-seed1", "--no-write-back"]
    )  # fmt: skip
    assert rc == 0 and "baseline:" not in capsys.readouterr().err  # given: nothing to explain
    again = {r["run_id"]: r for r in csv.DictReader((sw["out"] / "cli2" / "fits.csv").open())}
    assert {k: r["delta_A"] for k, r in again.items()} == {k: r["delta_A"] for k, r in cli_rows.items()}


def test_a_sweep_killed_before_it_wrote_sweep_json_keeps_its_parent_run(tmp_path, new_store):
    """Killed after creating its MLflow parent run but before writing sweep.json (or before the
    parent's params): the next start finds that parent by its folder and completes it, instead of
    leaving it RUNNING beside a second parent."""
    from scalerl.sweep.state import SWEEP_FILE, client_for, start_parent

    uri = new_store(tmp_path)
    f = write_sweep(tmp_path / "s.yaml", {"base": [], "dapo": ["loss=dapo"]}, name="killed", baseline="base")
    plan = make_plan(load_spec(f), [], sweep_dir=tmp_path / "out", tracking_uri=uri)
    exp_id, first = start_parent(plan)
    client = client_for(uri)
    params = client.get_run(first).data.params
    assert params["variant.dapo"] == "loss=dapo"
    # what a start killed right after creating the parent leaves: the run, without params or sweep.json
    (plan.sweep_dir / SWEEP_FILE).unlink()
    client.delete_run(first)  # (stands for the earlier state: no parent yet)
    tags = client.get_run(first).data.tags
    left = client.create_run(
        exp_id, run_name="killed", tags={k: tags[k] for k in ("sweep.role", "sweep.folder")}
    )
    assert start_parent(plan) == (exp_id, left.info.run_id)
    again = client.get_run(left.info.run_id)
    assert again.info.status == "RUNNING" and again.data.params == params
    assert json.loads((plan.sweep_dir / SWEEP_FILE).read_text())["parent_run_id"] == left.info.run_id
    assert [r.info.run_id for r in client.search_runs([exp_id])] == [left.info.run_id]


def test_a_sweep_json_written_before_the_typed_state_still_loads(tmp_path):
    """``sweep.json`` is read once into a SweepState. A file the code before the typed state wrote
    (tests/data, from ``start_parent``) loads into the same values and writes back key for key in
    its order; a key this code does not know is kept; a run planned before ``skip`` existed was
    launched; a folder without a launch is one line."""
    from scalerl.scaling import FitProtocol
    from scalerl.sweep.plan import PlannedRun
    from scalerl.sweep.state import SWEEP_FILE, SweepState, load_state

    old = json.loads((REPO / "tests" / "data" / "sweep_json_before_typed_state.json").read_text())
    (tmp_path / SWEEP_FILE).write_text(json.dumps(old))
    state = load_state(tmp_path)
    assert isinstance(state, SweepState) and state.name == "typed-state" and state.baseline == "base"
    assert (
        state.seeds == [0, 1] and state.parent_run_id == old["parent_run_id"] and state.experiment_id == "1"
    )
    assert [r.name for r in state.runs] == ["base-seed0", "base-seed1", "dapo-seed0", "dapo-seed1"]
    assert all(isinstance(r, PlannedRun) and r.total_steps == 300 and r.skip == "" for r in state.runs)
    assert state.runs[2].variant == "dapo" and state.runs[2].overrides == old["runs"][2]["overrides"]
    assert FitProtocol.from_config(state.scaling).bootstrap == old["scaling"]["bootstrap"]
    assert state.to_dict() == old and list(state.to_dict()) == list(old)

    older = {k: v for k, v in old.items() if k != "sweep_dir"}
    older["runs"] = [{k: v for k, v in r.items() if k != "skip"} for r in old["runs"]]
    older["by_hand"] = "a note"
    again = SweepState.from_dict(older)
    assert again.sweep_dir == str(Path(old["runs"][0]["out_dir"]).parent)
    assert [r.skip for r in again.runs] == [""] * 4 and again.to_dict()["by_hand"] == "a note"
    with pytest.raises(SweepError, match="no sweep launched here"):
        load_state(tmp_path / "empty")
