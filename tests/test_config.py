"""The recipe as config groups: composition, Hydra's CLI, and one-line errors for bad input."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scalerl.config import GROUPS, ConfigError, compose, conf_dir, group_variants, option_of, options
from scalerl.config.options import option_fields

# what the one-line error lists: every registered loss, so a new one needs no edit here
LOSS_OPTIONS = ", ".join(sorted(options("loss")))

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {g: list(options(g)) for g in GROUPS}
# what a required field needs to compose and validate
REQUIRED = {"model=hf": ["model.name_or_path=/some/local/model"], "task=jsonl": ["task.path=data.jsonl"]}

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
    # k = 8 is the bound; the generator runs at most 2 batches ahead (the measured stable default)
    assert cfg.async_mode.max_lag == 8 and cfg.async_mode.max_buffered_batches == 2
    assert cfg.loss.eps_max == 5.0
    assert cfg.precision.body == "bf16" and cfg.precision.head == "fp32"
    assert cfg.filter.zero_variance and cfg.filter.no_positive_resampling
    assert cfg.filter.pass_rate_threshold == 0.9 and cfg.filter.pass_rate_window == "last_epoch"
    # the measured stable default: lr 1e-4, AdamW beta2 0.95, the batch kept full (dynamic sampling)
    assert cfg.trainer.lr == 1e-4 and list(cfg.trainer.betas) == [0.9, 0.95]
    assert cfg.filter.dynamic_sampling and cfg.filter.max_gen_batches == 4
    # a finite training set that outlasts twice the budget: runs drew 1-1.3 batches' worth of prompts
    # a step early, up to the 4 allowed late; 3 a step on average over 600 steps is more than measured
    per_step = cfg.trainer.batch_size // cfg.trainer.generations_per_prompt
    assert 2 * cfg.trainer.total_steps * per_step * 3 < cfg.task.num_train


# the paper's Sec. 2 baseline and the recipes Fig. 2 compares, as experiments: {name: the groups they set}
RECIPES = {
    "baseline": {
        "loss": "dapo",
        "async_mode": "ppo_off_policy",
        "precision": "bf16",
        "aggregation": "sample",
        "norm": "prompt",
        "filter": "none",
        "length_control": "interruption",
    },
    "deepseek_grpo": {
        "loss": "grpo",
        "async_mode": "ppo_off_policy",
        "precision": "bf16",
        "aggregation": "sample",
        "norm": "prompt",
        "filter": "none",
        "length_control": "none",
    },
    "qwen25_dapo": {
        "loss": "dapo(eps_high=0.28)",
        "async_mode": "ppo_off_policy",
        "precision": "bf16",
        "aggregation": "token",
        "norm": "prompt",
        "filter": "scalerl(no_positive_resampling=false, max_gen_batches=3)",
        "length_control": "length_penalty",
    },
    "magistral": {  # Magistral streams generations with in-flight weight updates: PipelineRL-k
        "loss": "dapo(eps_high=0.28)",
        "async_mode": "pipeline_rl",
        "precision": "bf16",
        "aggregation": "token",
        "norm": "batch",
        "filter": "scalerl(no_positive_resampling=false, dynamic_sampling=false)",
        "length_control": "length_penalty",
    },
    "minimax_m1": {
        "loss": "cispo",
        "async_mode": "ppo_off_policy",
        "precision": "fp32_head",
        "aggregation": "token",
        "norm": "prompt",
        "filter": "none",
        "length_control": "none",
    },
}


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("real", [["model=smollm2", "task=gsm"], ["model=hf", "task=jsonl"]])
def test_recipe_experiments_compose_with_a_model_and_a_task(name, real):
    overrides = [f"+experiment={name}", *real, *REQUIRED.get(real[0], []), *REQUIRED.get(real[1], [])]
    cfg = compose(overrides)  # validates
    variants = group_variants(cfg)
    for group, variant in {**RECIPES[name], "reward": "plus_minus_one"}.items():
        assert variants[group] == variant, (name, group)
    assert cfg.model.name == real[0].split("=")[1] and cfg.task.name == real[1].split("=")[1]
    # a value on the command line still wins over the experiment's
    assert compose([*overrides, "loss=gspo"]).loss.name == "gspo"


def test_recipe_experiments_are_all_tested():
    files = sorted(p.stem for p in (Path(conf_dir()) / "experiment").glob("*.yaml"))
    assert files == sorted([*RECIPES, "paper_scale"])


def test_paper_hyperparameters_in_option_files():
    assert compose(["loss=dapo"]).loss.eps_high == 0.26
    assert compose(["loss=grpo"]).loss.eps_low == compose(["loss=grpo"]).loss.eps_high == 0.2
    assert compose(["loss=gspo"]).loss.eps_high == pytest.approx(5e-3)
    assert compose(["async_mode=ppo_off_policy"]).async_mode.minibatches == 8
    assert compose(["precision=bf16"]).precision.head == "bf16"
    lp = compose(["length_control=length_penalty"]).length_control
    assert lp.l_max > lp.l_cache > 0
    # as its header says: with a real model and data (the embedded task has 128 prompts of 10 characters)
    paper = compose(
        ["+experiment=paper_scale", "trainer.device=cpu", "model=hf", "task=jsonl"]
        + [*REQUIRED["model=hf"], *REQUIRED["task=jsonl"]]
    )
    assert paper.trainer.batch_size == 768 and paper.trainer.generations_per_prompt == 16
    assert paper.length_control.think_budget_min == 10240 and paper.length_control.answer_budget == 2048
    # a run long enough for the paper's fit: its evaluations every 100 steps past a cut at 1k steps
    assert paper.trainer.total_steps == 10000 and paper.scaling.min_step == 1000 and paper.eval.every == 100


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in OPTIONS[g]])
def test_every_option_composes_validates_and_round_trips(group, option):
    cls = options(group)[option]
    cfg = compose([f"{group}={option}", *REQUIRED.get(f"{group}={option}", [])])  # validates
    node = cfg[group]
    assert node.name == option and OmegaConf.get_type(node) is cls
    # exactly the option's fields, no other option's
    assert list(node.keys()) == [f.name for f in dataclasses.fields(cls)]
    obj = option_of(cfg, group)
    assert isinstance(obj, cls) and list(obj.check()) == []
    assert OmegaConf.to_container(OmegaConf.structured(obj), resolve=True) == OmegaConf.to_container(
        node, resolve=True
    )
    # the composed values are the dataclass's defaults (the YAML holds only values that differ: an
    # interpolation that resolves to the default, or a field without a default)
    for f in option_fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is not dataclasses.MISSING and default != "???":
            stated = OmegaConf.to_container(node, resolve=False)[f.name]
            if (
                isinstance(stated, str) and stated.startswith("${") and stated != default
            ):  # follows another field
                stated = OmegaConf.to_container(node, resolve=True)[f.name]
            assert stated == default, (group, option, f.name)
    # its own defaults: no fields listed (a required field's value is)
    required = ", ".join(o.split(".", 1)[1] for o in REQUIRED.get(f"{group}={option}", []))
    assert group_variants(cfg)[group] == (f"{option}({required})" if required else option)


def test_registered_options_are_the_yaml_files():
    for g in GROUPS:
        assert OPTIONS[g], f"group {g} has no options"
        files = sorted(p.stem for p in (Path(conf_dir()) / g).glob("*.yaml"))
        assert files == sorted(OPTIONS[g]), g


def test_the_factories_cover_every_option():
    """The groups whose options the code builds by name: a YAML option without its class would be
    refused only when a run builds it."""
    from scalerl.algo.advantages import NORMS
    from scalerl.generator import GENERATORS
    from scalerl.model.build import POLICY_LOADERS
    from scalerl.rollout.modes import MODES
    from scalerl.task import TASKS
    from scalerl.trainer import ENGINES

    for group, factory in [
        ("task", TASKS),
        ("model", POLICY_LOADERS),
        ("generator", GENERATORS),
        ("trainer", ENGINES),
        ("async_mode", MODES),
        ("norm", NORMS),
    ]:
        assert set(factory) == set(OPTIONS[group]), group


def test_a_registered_loss_becomes_an_option_with_its_checks():
    from scalerl.algo import registry
    from scalerl.config.groups.loss import register_losses
    from scalerl.config.options import OPTIONS as REGISTRY

    @registry.register_loss("test_only_loss", params={"beta": registry.positive})
    def _loss(logp, gen_logp, advantages, mask, group_ids, *, beta):
        return -advantages.unsqueeze(1) * logp * beta

    try:
        register_losses()
        cls = options("loss")["test_only_loss"]
        assert [f.name for f in option_fields(cls)] == ["beta"]
        assert list(cls(beta=0.5).check()) == []
        assert list(cls(beta=-1.0).check()) == [("beta", -1.0, "a number > 0")]
    finally:
        registry.LOSSES.pop("test_only_loss", None)
        REGISTRY["loss"].pop("test_only_loss", None)


def test_an_option_registered_after_a_compose_is_stored_for_the_next_one():
    """register_configs stores the schemas again only when the options changed: a later option (a
    loss registered by a plugin) still reaches Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from scalerl.config.options import OPTIONS as REGISTRY
    from scalerl.config.options import SCHEMA_ROOT, Option, register_option
    from scalerl.config.schema import register_configs

    compose([])
    loss_repo = ConfigStore.instance().repo[SCHEMA_ROOT]["loss"]
    assert "cispo.yaml" in loss_repo and "later_loss.yaml" not in loss_repo

    @register_option("loss", "later_loss")
    @dataclasses.dataclass
    class LaterLoss(Option):
        name: str = "later_loss"

    try:
        register_configs()
        assert (
            OmegaConf.get_type(ConfigStore.instance().repo[SCHEMA_ROOT]["loss"]["later_loss.yaml"].node)
            is LaterLoss
        )
    finally:
        REGISTRY["loss"].pop("later_loss", None)
        ConfigStore.instance().repo[SCHEMA_ROOT]["loss"].pop("later_loss.yaml", None)


def test_variant_params_name_the_fields_that_differ_from_the_option_yaml():
    v = group_variants(compose(["loss=dapo", "length_control=length_penalty", "filter.zero_variance=false"]))
    assert v["filter"] == "scalerl(zero_variance=false)"
    assert v["loss"] == "dapo" and v["length_control"] == "length_penalty"
    v = group_variants(compose(["async_mode=ppo_off_policy", "async_mode.minibatches=2", "trainer.lr=3e-4"]))
    assert v["async_mode"] == "ppo_off_policy(minibatches=2)"
    assert v["trainer"] == "torch(lr=0.0003)"
    v = group_variants(compose(["length_control.phrase='ok, stop</think>'"]))
    assert v["length_control"] == "interruption(phrase='ok, stop</think>')"
    # a field that follows another (max_buffered_batches: ${.max_lag}) differs only when set itself
    assert group_variants(compose(["async_mode.max_lag=2"]))["async_mode"] == "pipeline_rl(max_lag=2)"
    v = group_variants(compose(["async_mode.max_lag=2", "async_mode.max_buffered_batches=1"]))
    assert v["async_mode"] == "pipeline_rl(max_lag=2, max_buffered_batches=1.0)"


@pytest.mark.slow
def test_cfg_job_read_by_a_reader_that_stops_early_ends_quietly(tmp_path):
    """``python train.py --cfg job | head -1`` ended in a BrokenPipeError traceback, exit 1."""
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--cfg", "job"],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    reader.stdin.close()
    reader.wait()
    assert (r.returncode, r.stderr) == (0, "")


def test_cfg_job_prints_each_group_under_its_name(tmp_path):
    r = train_py("--cfg", "job", "loss=cispo", "precision=fp32_head", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for g in GROUPS:
        assert f"\n{g}:\n" in "\n" + r.stdout, g
    assert "name: cispo" in r.stdout
    assert list(tmp_path.iterdir()) == []  # printing the recipe writes nothing


@pytest.mark.slow
def test_help_lists_groups_options_and_their_fields(tmp_path):
    r = train_py("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ScaleRL" in r.stdout
    for g in GROUPS:
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"{g}: "))
        assert sorted(o.rstrip("*") for o in line[len(g) + 2 :].split(", ")) == sorted(OPTIONS[g])
    assert "loss: cispo*, dapo" in r.stdout  # the default is marked
    assert "    max_lag=8, max_buffered_batches=2" in r.stdout  # async_mode=pipeline_rl's fields
    assert "    minibatches=8" in r.stdout
    assert "    name_or_path=(required)" in r.stdout  # model=hf
    assert "    eps_max=5.0" in r.stdout  # a loss's values come from its YAML


@pytest.mark.slow
def test_help_is_hydras_help_and_a_bad_override_one_line(tmp_path):
    """train.py prints the help itself (Hydra's listing of every group's options, unused by the
    template, took most of the time): the text must be what Hydra's own app help prints."""
    args = ["loss=dapo", "trainer.lr=3e-4", "hydra.help.header=a header", "--help"]
    ours = train_py(*args, cwd=tmp_path)
    hydras = subprocess.run(  # Hydra's app help: its decorated main, past train.py's own handling
        [
            sys.executable,
            "-c",
            "import sys; from scalerl.cli import _main; sys.argv[0] = 'train.py'; _main()",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert ours.returncode == hydras.returncode == 0, (ours.stderr, hydras.stderr)
    assert ours.stdout == hydras.stdout
    assert ours.stdout.startswith("a header\n") and "\n  name: dapo\n" in ours.stdout
    assert "lr: 0.0003" in ours.stdout
    bad = train_py("loss=bogus", "--help", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"error: unknown option loss=bogus (available: {LOSS_OPTIONS})"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,expected",
    [
        (["loss=bogus"], f"error: unknown option loss=bogus (available: {LOSS_OPTIONS})"),
        (["loss.eps_maxx=3"], "error: unknown key loss.eps_maxx (keys of loss=cispo: eps_max)"),
        (
            ["loss=dapo", "loss.eps_max=3"],
            "error: unknown key loss.eps_max (keys of loss=dapo: eps_low, eps_high)",
        ),
        (["trainer.lr=fast"], "error: bad value trainer.lr=fast: must be a number"),
        (["trainer.lr"], "error: malformed override 'trainer.lr': an override is key=value"),
        # an override Hydra's message does not quote is found and named, with how to quote its value
        (
            ["loss=dapo", "task.path=data (1).jsonl"],
            "error: malformed override 'task.path=data (1).jsonl': mismatched input '.' expecting <EOF>; "
            "a value with spaces, parentheses, brackets, quotes or commas is quoted whole: "
            "task.path='data (1).jsonl'",
        ),
        (
            ["tracking.experiment=bob's runs"],
            'error: malformed override "tracking.experiment=bob\'s runs": a character the override grammar '
            "does not take there; a value with spaces, parentheses, brackets, quotes or commas is quoted "
            'whole: tracking.experiment="bob\'s runs"',
        ),
        (
            ["loss=dapo,cispo"],
            "error: bad value loss=dapo,cispo: a comma makes it several values: write loss=[dapo,cispo] for "
            "a list, loss='dapo,cispo' for text with a comma, or run one job per value "
            "(python train.py -m loss=dapo,cispo)",
        ),
    ],
)
def test_unknown_options_keys_and_bad_types_are_one_line_from_train_py(args, expected, tmp_path):
    r = train_py(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_key_is_an_error():
    with pytest.raises(Exception, match="eps_maxx"):
        compose(["trainer.lr=1", "loss.eps_maxx=3"])


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["loss=cispo", "loss.eps_high=0.3"], "eps_high"),  # another loss's key
        (["async_mode=sync", "async_mode.max_lag=2"], "max_lag"),
        (["trainer=torch", "trainer.zero_stage=1"], "zero_stage"),  # deepspeed only
        (["length_control=none", "length_control.l_max=10"], "l_max"),
        (["model=hf", "model.name_or_path=/m", "model.hidden_size=8"], "hidden_size"),
    ],
)
def test_a_key_of_another_option_is_an_error(overrides, key):
    with pytest.raises(Exception, match=key):
        compose(overrides)


@pytest.mark.slow
def test_appended_unknown_key_is_a_one_line_error(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown key trainer\.lrr=1 \(keys of trainer=torch: total_steps, "
    ):
        compose(["+trainer.lrr=1"])
    with pytest.raises(ConfigError, match=r"unknown key lrr=1 \(keys of the config: "):
        compose(["+lrr=1"])
    compose(["+tracking.tags.team=rl"])  # a free mapping takes new keys
    r = train_py("+trainer.lrr=1", f"out_dir={tmp_path / 'run'}", cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "trainer.lrr" in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "overrides,key",
    [(["model=hf"], "model.name_or_path"), (["task=jsonl"], "task.path")],
)
def test_a_required_field_left_unset_is_one_clear_error(overrides, key):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert str(e.value) == f"invalid config value {key}='???': must be set (required by {overrides[0]})"


BAD_VALUES = [
    ("loss.eps_max=-1", "loss.eps_max", "> 0"),
    ("loss=dapo loss.eps_low=1.5", "loss.eps_low", "(0, 1)"),
    ("async_mode.max_lag=0", "async_mode.max_lag", ">= 1"),
    ("async_mode=ppo_off_policy async_mode.minibatches=0", "async_mode.minibatches", ">= 1"),
    ("async_mode.max_buffered_batches=0", "async_mode.max_buffered_batches", "> 0"),
    ("trainer.batch_size=30", "trainer.batch_size", "multiple of trainer.generations_per_prompt"),
    ("trainer.batch_size=0", "trainer.batch_size", "a positive multiple of trainer.generations_per_prompt"),
    (
        "eval.num_prompts=1024",
        "eval.num_prompts",
        "<= task.num_val (128), the validation prompts task=addition draws",
    ),
    ("precision.body=fp8", "precision.body", "one of fp32, bf16, fp16"),
    ("precision.head=int4", "precision.head", "one of fp32, bf16, fp16"),
    ("trainer.generations_per_prompt=1 trainer.batch_size=8", "trainer.generations_per_prompt", ">= 2"),
    ("length_control.think_budget_min=50 length_control.think_budget_max=40", "think_budget_max", ">="),
    ("filter.pass_rate_threshold=1.5", "filter.pass_rate_threshold", "(0, 1]"),
    ("filter.pass_rate_window=epoch", "filter.pass_rate_window", "one of last_epoch, all_epochs"),
    ("trainer=deepspeed trainer.zero_stage=4", "trainer.zero_stage", "0, 1, 2, 3"),
    ("trainer.lr=-0.1", "trainer.lr", "> 0"),
    ("scaling.compute_axis=tokens", "scaling.compute_axis", "device_hours, flops"),
    ("scaling.bootstrap=5", "scaling.bootstrap", "0 (no intervals) or at least 20"),
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


@pytest.mark.slow
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
    with pytest.raises(Exception, match="async_mode.max_lag"):
        compose(["async_mode.max_lag=1.5"])
    with pytest.raises(Exception, match="filter.zero_variance"):
        compose(["filter.zero_variance=maybe"])


def test_the_warm_start_learns_the_configured_interruption_phrase():
    """The embedded warm-start's interrupted examples use length_control.phrase when there is one,
    so a changed phrase is one the base model has seen (and its warm-start is cached apart)."""
    assert compose(['length_control.phrase=" stop.</think>"']).task.warmstart_phrase == " stop.</think>"
    default = compose([]).task.warmstart_phrase
    assert default == compose([]).length_control.phrase
    assert compose(["length_control=length_penalty"]).task.warmstart_phrase == default


def test_every_resumable_change_names_a_key_of_the_config():
    """RESUMABLE_CHANGES (what may change when a run resumes) names keys and groups that exist."""
    from omegaconf import OmegaConf

    from scalerl.config.schema import RESUMABLE_CHANGES
    from scalerl.tracking.tracker import flatten

    keys = set(flatten(OmegaConf.to_container(compose(["out_dir=/tmp/x"]), resolve=False)))
    for entry in RESUMABLE_CHANGES:
        assert any(k == entry or (entry.endswith(".") and k.startswith(entry)) for k in keys), entry


def test_the_recipe_groups_are_the_first_config_groups():
    from scalerl.analysis.experiment import RECIPE_GROUPS as analysed
    from scalerl.config.options import RECIPE_GROUPS

    assert analysed is RECIPE_GROUPS and GROUPS[: len(RECIPE_GROUPS)] == RECIPE_GROUPS


def _documented_train_commands() -> list[tuple[str, list[str]]]:
    """Every `python train.py ...` line of the README's and docs/' shell blocks, its backslash
    continuations joined, as (where, overrides)."""
    import re
    import shlex

    repo = Path(__file__).resolve().parents[1]
    found = []
    for path in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
            for command in block.replace("\\\n", " ").splitlines():
                words = shlex.split(command, comments=True)
                if words[:2] == ["python", "train.py"]:
                    found.append((f"{path.name}: {command.strip()[:60]}", words[2:]))
    return found


@pytest.mark.parametrize(
    "where,overrides", _documented_train_commands(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_documented_train_command_composes_and_validates(where, overrides):
    """A command a user copies from the README or docs/ starts: its overrides compose and pass the
    config checks (a renamed or removed option fails here, not on the user's machine)."""
    from scalerl.cli import MULTIRUN_FLAGS, _multirun_jobs, _without_flag_values

    kept = _without_flag_values(overrides)  # Hydra's flags and the values they take

    for job in _multirun_jobs(kept) if set(overrides) & MULTIRUN_FLAGS else [kept]:
        assert compose(job).trainer.total_steps > 0, where


def test_the_documented_commands_are_found():
    wheres = [w for w, _ in _documented_train_commands()]
    assert any(w.startswith("README.md") for w in wheres) and any(
        w.startswith("real-model.md") for w in wheres
    )
