"""Sweeps end to end: plans, sweep-file errors, and a tiny real sweep through submitit's local
executor into a real MLflow sqlite store (parent + child runs, report, fit/* metrics, a failing
variant with its log, re-runs that skip finished variants and resume unfinished ones)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalerl.sweep import load_spec, make_plan, plan_lines
from scalerl.sweep.cli import main

REPO = Path(__file__).resolve().parents[1]

# A real run of a few seconds: tiny model (warm-start cached once per session), 2-digit addition,
# one evaluation per step so the sigmoid fit has points, synchronous (deterministic) updates.
TINY_BASE = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "model.warmstart_steps=300",
    "model.warmstart_batch_size=32",
    "task.min_digits=2",
    "task.max_digits=2",
    "task.warmstart_max_digits=2",
    "task.num_val=16",
    "task.num_train=256",
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
    assert out.out.splitlines() == [
        "base_recipe-seed0  trainer.total_steps=5 trainer.lr=0.001 seed=0",
        "base_recipe-seed1  trainer.total_steps=5 trainer.lr=0.001 seed=1",
        "dapo-seed0         trainer.total_steps=5 loss=dapo loss.eps_high=0.28 trainer.lr=0.001 seed=0",
        "dapo-seed1         trainer.total_steps=5 loss=dapo loss.eps_high=0.28 trainer.lr=0.001 seed=1",
        "bf16-seed0         trainer.total_steps=5 precision=bf16 trainer.lr=0.001 seed=0",
        "bf16-seed1         trainer.total_steps=5 precision=bf16 trainer.lr=0.001 seed=1",
    ]
    assert "nothing launched or written" in out.err and "up to 2 at once" in out.err
    assert listing(tmp_path) == before  # no sweep folder, no mlflow.db, no outputs/


def test_cli_override_replaces_the_variants_value(tmp_path):
    write_sweep(tmp_path / "s.yaml", {"a": ["loss=dapo", "trainer.lr=0.01"]}, name="s")
    plan = make_plan(load_spec(tmp_path / "s.yaml"), ["trainer.lr=0.002"], sweep_dir=tmp_path / "out")
    assert plan_lines(plan) == ["a  loss=dapo trainer.lr=0.002"]
    assert plan.runs[0].out_dir == str(tmp_path / "out" / "a") and not (tmp_path / "out").exists()


def test_loo_dry_run_through_sweep_py(tmp_path):
    """`python sweep.py --loo --dry-run`: the baseline and 8 variants each reverting one component."""
    res = run_cli(["--loo", "--dry-run"], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert listing(tmp_path) == []  # nothing written in the working directory
    spec = yaml.safe_load((REPO / "sweeps" / "loo.yaml").read_text())
    base = " ".join(spec["base"])
    lines = res.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == list(spec["variants"])
    reverted = {
        "ppo_off_policy": "async_mode=ppo_off_policy",
        "dapo": "loss=dapo",
        "bf16_head": "precision=bf16",
        "sample_agg": "aggregation=sample",
        "prompt_norm": "norm=prompt",
        "no_zero_var_filter": "filter.zero_variance=false",
        "no_npr": "filter.no_positive_resampling=false",
        "length_penalty": "length_control=length_penalty",
    }
    by_name = {ln.split()[0]: ln.split(None, 1)[1] for ln in lines}
    assert by_name["scalerl"] == f"{base} seed=0"
    for name, override in reverted.items():
        assert by_name[name] == f"{base} {override} seed=0"


@pytest.mark.parametrize(
    "content, expected",
    [
        (
            {"name": "bad", "variants": {"ok": [], "x": ["loss=bogus"]}},
            "variant 'x': unknown option loss=bogus (available: cispo, dapo, grpo, gspo)",
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
        ({"name": "bad", "variants": {"x": ["loss"]}}, "variant 'x': malformed override 'loss'"),
        ({"name": "bad", "variants": {"x": {"loss": "dapo"}}}, "variant 'x': expected a list of overrides"),
        ({"name": "bad", "variants": ["loss=dapo"]}, "'variants' must be a non-empty mapping"),
        ({"name": "bad", "variant": {"x": []}}, "unknown key 'variant'"),
        ({"name": "bad", "baseline": "y", "variants": {"x": []}}, "baseline 'y' is not a variant"),
        ({"name": "bad", "variants": {"x": ["out_dir=/tmp/x"]}}, "variant 'x': out_dir is set by the sweep"),
        ("name: bad\nvariants: [a\n", "invalid YAML at line"),
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
        "error: command line: unknown option loss=nope (available: cispo, dapo, grpo, gspo)"
    )
    assert main(["s.yaml", "launcher.bogus=1"]) == 2
    assert "error: command line: unknown key launcher.bogus" in capsys.readouterr().err
    assert listing(tmp_path) == ["s.yaml"]


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
        {"cispo": [], "dapo": ["loss=dapo"], "broken": BROKEN},
        name="tiny",
        base=TINY_BASE,
        baseline="cispo",
    )
    uri = f"sqlite:///{root / 'mlflow.db'}"
    args = [str(f), "--out", str(root / "out"), "--tracking-uri", uri, "launcher.max_parallel=3"]
    res = run_cli(args, cwd=root)
    return {"root": root, "file": f, "uri": uri, "out": root / "out", "args": args, "res": res}


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
            assert math.isclose(m["fit/A"], float(rows[name]["A"]), rel_tol=1e-9)
            assert math.isclose(m["fit/B"], float(rows[name]["B"]), rel_tol=1e-9)
            assert math.isclose(m["fit/delta_A"], float(rows[name]["delta_A"]), abs_tol=1e-12)
        else:
            assert m["fit/ok"] == 0.0 and math.isnan(m["fit/A"])
    md = (tiny_sweep["out"] / "report" / "fits.md").read_text()
    assert "| variant | status | A [90% CI] | B | C_mid | ΔA vs baseline |" in md
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


def test_report_command_rewrites_the_report(tiny_sweep, capsys):
    report = tiny_sweep["out"] / "report" / "fits.md"
    report.unlink()
    assert main(["--report", str(tiny_sweep["file"]), "--out", str(tiny_sweep["out"])]) == 0
    out = capsys.readouterr()
    assert report.is_file() and report.read_text() in out.out
    assert "# Sweep tiny: 3 runs (2 finished, 1 failed)" in out.out
    assert main(["--report", "no_such_sweep", "--out", str(tiny_sweep["root"] / "nowhere")]) == 2
    assert "no sweep launched here" in capsys.readouterr().err


def test_report_flags_a_ceiling_the_data_does_not_settle():
    from scalerl.sweep.report import render_markdown

    def row(job, a_hi):
        return {
            "job": job, "seed": 0, "status": "finished", "ok": True, "baseline": job == "base",
            "A": 0.6, "A_lo": 0.5, "A_hi": a_hi, "B": 1.0, "C_mid": 1e12, "delta_A": 0.0,
            "exceeds_margin": False, "B_fixed_A": 1.0, "pass_rate_start": 0.1, "pass_rate_final": 0.5,
        }  # fmt: skip

    state = {"name": "s", "parent_run_id": "p", "tracking_uri": "sqlite:///x.db", "baseline": "base"}
    md = render_markdown(state, [row("base", 0.7), row("open", 1.0)], None, multi_seed=False)
    base_line = next(line for line in md.splitlines() if line.startswith("| base "))
    open_line = next(line for line in md.splitlines() if line.startswith("| open "))
    assert "cannot rule out a ceiling of 1" in open_line
    assert "A unsettled" not in base_line
