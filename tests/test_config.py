"""The recipe as config groups: composition, Hydra's CLI, and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scalerl.config import GROUPS, ConfigError, compose, conf_dir

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {g: sorted(p.stem for p in (Path(conf_dir()) / g).glob("*.yaml")) for g in GROUPS}

# what the ScaleRL recipe is (paper Sec. 4)
DEFAULTS = {
    "loss": "cispo",
    "async_mode": "pipeline_rl",
    "precision": "fp32_head",
    "aggregation": "prompt",
    "norm": "batch",
    "filter": "scalerl",
    "length_control": "interruption",
}


def train_py(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_defaults_are_the_scalerl_recipe():
    cfg = compose([])
    for group, option in DEFAULTS.items():
        assert cfg[group].name == option
    assert cfg.async_mode.max_lag == 8
    assert cfg.loss.eps_max == 5.0
    assert cfg.precision.body == "bf16" and cfg.precision.head == "fp32"
    assert cfg.filter.zero_variance and cfg.filter.no_positive_resampling
    assert cfg.filter.pass_rate_threshold == 0.9


def test_paper_hyperparameters_in_option_files():
    assert compose(["loss=dapo"]).loss.eps_high == 0.26
    assert compose(["loss=grpo"]).loss.eps_low == compose(["loss=grpo"]).loss.eps_high == 0.2
    assert compose(["loss=gspo"]).loss.eps_high == pytest.approx(5e-3)
    assert compose(["async_mode=ppo_off_policy"]).async_mode.minibatches == 8
    assert compose(["precision=bf16"]).precision.head == "bf16"
    lp = compose(["length_control=length_penalty"]).length_control
    assert lp.l_max > lp.l_cache > 0
    paper = compose(["+experiment=paper_scale", "trainer.device=cpu"])
    assert paper.trainer.batch_size == 768 and paper.trainer.generations_per_prompt == 16
    assert paper.length_control.think_budget_min == 10240 and paper.length_control.answer_budget == 2048


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in OPTIONS[g]])
def test_every_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if group == "model" and option == "hf":
        overrides.append("model.name_or_path=/some/local/model")
    if group == "task" and option == "jsonl":
        overrides.append("task.path=data.jsonl")
    cfg = compose(overrides)
    assert cfg[group].name == option


def test_every_group_has_options():
    for g in GROUPS:
        assert OPTIONS[g], f"conf/{g}/ has no options"


def test_cfg_job_prints_each_group_under_its_name(tmp_path):
    r = train_py("--cfg", "job", "loss=cispo", "precision=fp32_head", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for g in GROUPS:
        assert f"\n{g}:\n" in "\n" + r.stdout, g
    assert "name: cispo" in r.stdout
    assert list(tmp_path.iterdir()) == []  # printing the recipe writes nothing


def test_help_lists_groups_and_options(tmp_path):
    r = train_py("--help", cwd=tmp_path)
    assert r.returncode == 0
    assert "ScaleRL" in r.stdout
    for g in GROUPS:
        assert f"{g}:" in r.stdout
        for o in OPTIONS[g]:
            assert o in r.stdout


def test_unknown_option_names_it_and_the_choices(tmp_path):
    r = train_py("loss=bogus", cwd=tmp_path)
    assert r.returncode != 0
    assert "bogus" in r.stderr
    for o in OPTIONS["loss"]:
        assert o in r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_key_is_an_error(tmp_path):
    r = train_py("loss.eps_maxx=3", cwd=tmp_path)
    assert r.returncode != 0
    assert "eps_maxx" in r.stderr
    with pytest.raises(Exception, match="eps_maxx"):
        compose(["trainer.lr=1", "loss.eps_maxx=3"])


BAD_VALUES = [
    ("loss.eps_max=-1", "loss.eps_max", "> 0"),
    ("loss=dapo loss.eps_low=1.5", "loss.eps_low", "(0, 1)"),
    ("async_mode.max_lag=0", "async_mode.max_lag", ">= 1"),
    ("async_mode=ppo_off_policy async_mode.minibatches=0", "async_mode.minibatches", ">= 1"),
    ("trainer.batch_size=30", "trainer.batch_size", "multiple of trainer.generations_per_prompt"),
    ("precision.body=fp8", "precision.body", "one of fp32, bf16, fp16"),
    ("precision.head=int4", "precision.head", "one of fp32, bf16, fp16"),
    ("trainer.generations_per_prompt=1 trainer.batch_size=8", "trainer.generations_per_prompt", ">= 2"),
    ("length_control.think_budget_min=50 length_control.think_budget_max=40", "think_budget_max", ">="),
    ("filter.pass_rate_threshold=1.5", "filter.pass_rate_threshold", "(0, 1]"),
    ("trainer.zero_stage=4", "trainer.zero_stage", "0, 1, 2, 3"),
    ("trainer.lr=-0.1", "trainer.lr", "> 0"),
    ("scaling.compute_axis=tokens", "scaling.compute_axis", "flops, device_hours"),
    ("task.warmstart_slip_prob=1.5", "task.warmstart_slip_prob", "[0, 1]"),
    ("model.arch=gpt3", "model.arch", "one of gpt2, qwen2, llama"),
    ("model.arch=gpt2 model.num_kv_heads=2", "model.num_kv_heads", "equal to num_heads (4)"),
]


@pytest.mark.parametrize("overrides,key,allowed", BAD_VALUES)
def test_bad_value_gives_one_line_error(overrides, key, allowed):
    with pytest.raises(ConfigError) as e:
        compose(overrides.split())
    msg = str(e.value)
    assert key in msg and allowed in msg and "\n" not in msg


@pytest.mark.parametrize("overrides,key,allowed", BAD_VALUES[:5])
def test_bad_value_cli_exits_before_building_anything(overrides, key, allowed, tmp_path):
    r = train_py(*overrides.split(), f"out_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert key in lines[0] and allowed in lines[0]
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder, no MLflow db, no warm-start


def test_wrong_type_is_an_error():
    with pytest.raises(Exception, match="trainer.lr"):
        compose(["trainer.lr=fast"])
