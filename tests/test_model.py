"""Building the embedded model: architectures, the parameter count behind the FLOPs axis."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from scalerl.model.build import build_model, num_params


def tiny_model_cfg(arch: str, **sizes):
    """A ``model`` config for :func:`build_model` (tests' sizes; ``sizes`` overrides them)."""
    cfg = dict(
        arch=arch,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        tie_word_embeddings=False,
    )
    return OmegaConf.create({**cfg, **sizes})


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "llama"])
def test_non_embedding_params_count_only_multiplied_weights(arch):
    model = build_model(tiny_model_cfg(arch), 50, seed=0, pad_token_id=0, eos_token_id=1)
    tables = 50 * 32 + (40 * 32 if arch == "gpt2" else 0)  # token (+ GPT-2's position) embeddings
    assert num_params(model) - num_params(model, exclude_embeddings=True) == tables
    assert num_params(model, exclude_embeddings=True) > 32 * 50  # the untied LM head is counted


def test_gpt2_has_no_dropout_so_trainer_and_generator_agree():
    model = build_model(tiny_model_cfg("gpt2"), 50, seed=0, pad_token_id=0, eos_token_id=1).train()
    ids = torch.randint(2, 50, (3, 12))
    a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.equal(a, b)  # train mode, two passes: identical


def test_same_seed_same_weights():
    one = build_model(tiny_model_cfg("gpt2"), 50, seed=3, pad_token_id=0, eos_token_id=1).state_dict()
    two = build_model(tiny_model_cfg("gpt2"), 50, seed=3, pad_token_id=0, eos_token_id=1).state_dict()
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_the_warm_start_logs_its_progress_when_its_output_is_not_a_terminal(monkeypatch, caplog):
    """A run whose output is a log file sees the warm-start move: a line every PROGRESS_EVERY_S."""
    import logging

    from scalerl.model import build
    from scalerl.model.tokenizer import build_char_tokenizer
    from scalerl.task import AdditionTask

    monkeypatch.setattr(build, "PROGRESS_EVERY_S", 0.0)
    tok = build_char_tokenizer()
    cfg = tiny_model_cfg("gpt2", max_position_embeddings=128)
    model = build_model(cfg, len(tok), seed=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    mcfg = OmegaConf.create({"warmstart_lr": 1e-3, "warmstart_steps": 3, "warmstart_batch_size": 2})
    with caplog.at_level(logging.INFO, logger="scalerl.model.build"):
        info = build.warmstart(model, tok, AdditionTask(), mcfg, seed=0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-start: step")]
    assert [line.split(",")[0] for line in lines] == ["warm-start: step 1/3", "warm-start: step 2/3"]
    assert info["warmstart_steps"] == 3


def test_a_long_call_that_reports_nothing_is_said_to_be_still_working(caplog):
    import logging
    import time

    from scalerl.model.build import still_working

    with (
        caplog.at_level(logging.INFO, logger="scalerl.model.build"),
        still_working("converting x", every_s=0.05),
    ):
        time.sleep(0.3)
    beats = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("converting x: still working")
    ]
    assert len(beats) >= 2
    n = len(caplog.records)
    time.sleep(0.15)
    assert len(caplog.records) == n  # stopped with the block


def _completion_loss(model, tokenizer, task, n: int = 64) -> float:
    """Mean cross-entropy of the model on the completion tokens of ``n`` warm-start examples."""
    import random

    from scalerl.model.build import completion_loss, example_batch

    with torch.no_grad():
        return float(
            completion_loss(model, *example_batch(tokenizer, task.warmstart_examples(n, random.Random(1))))
        )


def test_the_default_base_model_ships_with_the_package(tmp_path, caplog):
    """The embedded default's warm-started base model is in the package, named by its warm-start key
    (after a change of the default model or task settings, `python -m scalerl.ship` makes it
    again): a run of the default on an empty cache takes it without training, and it is trained for
    the task; any other settings warm-start as before."""
    import logging

    from scalerl.config import compose, typed
    from scalerl.model.build import SHIPPED_BASE, _warmstart_key, load_tiny
    from scalerl.ship import shipped_keys, shipped_settings
    from scalerl.task import build_task

    def tiny(config):
        """load_tiny as load_policy calls it, for ``config``'s model and task."""
        return load_tiny(config.model, build_task(config.task), task_option=config.task, seed=config.seed)

    cfg = typed(compose([f"model.cache_dir={tmp_path}"]))
    key = _warmstart_key(cfg.model, cfg.task)
    shipped = sorted(p.name for p in SHIPPED_BASE.iterdir())
    expected = sorted({f"warmstart-{k}" for k in shipped_keys().values()})
    assert shipped == expected, f"{shipped}: not the default's and the study's; run python -m scalerl.ship"
    assert f"warmstart-{key}" in shipped
    # the leave-one-out study (sweeps/loo.yaml: 2-digit sums) starts from its own shipped base too
    study = typed(compose([*shipped_settings()["loo study"], f"model.cache_dir={tmp_path / 'study'}"]))
    assert _warmstart_key(study.model, study.task) != key
    with caplog.at_level(logging.INFO, logger="scalerl.model.build"):
        tiny(study)
    assert "shipped" in caplog.text and "training" not in caplog.text, caplog.text
    caplog.clear()
    task = build_task(cfg.task)
    with caplog.at_level(logging.INFO, logger="scalerl.model.build"):
        model, tokenizer, info = load_tiny(cfg.model, task, task_option=cfg.task, seed=cfg.seed)
    assert "shipped" in caplog.text and "training" not in caplog.text, caplog.text
    assert info["warmstart_steps"] == cfg.model.warmstart_steps
    assert (tmp_path / f"warmstart-{key}" / "model.safetensors").is_file()  # cached as its own warm-start
    untrained = build_model(
        cfg.model,
        len(tokenizer),
        seed=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    assert _completion_loss(model, tokenizer, task) < 0.3 < 2.0 < _completion_loss(untrained, tokenizer, task)

    caplog.clear()
    other = typed(compose([f"model.cache_dir={tmp_path}", "model.hidden_size=32", "model.warmstart_steps=2"]))
    with caplog.at_level(logging.INFO, logger="scalerl.model.build"):
        tiny(other)
    assert "training 2 supervised steps" in caplog.text and "shipped" not in caplog.text


# warm-start keys as the untyped config made them before the config was read into typed options
# (issue 58): the shipped bases' folders are named by the first three, every user's cache by all
WARMSTART_KEYS = {
    "default": ([], "e333dc09da4d70fd"),
    "loo study": (None, "e3063a463d1e8518"),
    "loo_ceiling study": (None, "e90640dfb4be3462"),
    "multi": (["task=multi"], "0631039e92d61d86"),
    "code": (["task=code"], "46c7fc9dc6f2841a"),
    "qwen2": (["model.arch=qwen2", "model.num_kv_heads=2"], "357ac8c4a24fa48e"),
    "jsonl": (["task=jsonl", "task.path=x.jsonl"], "857afd0ebe85cabd"),
    "own width": (["task.operand_width=own"], "66300d817455637d"),
    "gsm": (["task=gsm"], "e203d264184631a6"),
}


@pytest.mark.parametrize("name", list(WARMSTART_KEYS))
def test_the_warmstart_key_of_the_same_settings_keeps_its_value(name):
    """The warm-start key is a hash of the model and task options' settings (their dataclasses):
    the same settings give the key they gave when it hashed the untyped config, so the shipped bases
    (``scalerl/model/base/warmstart-<key>``) and the bases in users' caches are still found. A
    setting it leaves out (the cache folder, the validation split) does not move it."""
    from scalerl.config import compose, typed
    from scalerl.model.build import SHIPPED_BASE, _warmstart_key
    from scalerl.ship import shipped_settings

    overrides, want = WARMSTART_KEYS[name]
    if overrides is None:  # a study's base: its sweep file's settings
        overrides = shipped_settings()[name]
    config = typed(compose(overrides))
    assert _warmstart_key(config.model, config.task) == want
    if name in shipped_settings():
        assert (SHIPPED_BASE / f"warmstart-{want}" / "meta.json").is_file()
    moved = typed(compose([*overrides, "model.cache_dir=/elsewhere", "task.verifier_timeout_s=9"]))
    assert _warmstart_key(moved.model, moved.task) == want


def test_building_and_sampling_the_model_imports_no_scikit_learn_or_scipy():
    """transformers' generation imports scikit-learn (with SciPy, pandas, pyarrow) and its losses
    SciPy whenever they are installed, for features scalerl does not use: scalerl's processes import
    transformers without them (``scalerl.model.hf_imports``), the checks stay true for everyone else,
    and a fit still imports SciPy when it runs."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("scikit-learn is not installed (MLflow brings it): nothing to keep out")
    code = (
        "import sys, torch\n"
        "from scalerl.model.build import build_model\n"
        "from tests.test_model import tiny_model_cfg\n"
        "m = build_model(tiny_model_cfg('gpt2'), 50, seed=0, pad_token_id=0, eos_token_id=1)\n"
        "out = m.generate(torch.tensor([[2, 3]]), max_new_tokens=3, do_sample=True, pad_token_id=0)\n"
        "assert out.shape == (1, 5), out.shape\n"
        "import transformers.utils as u\n"
        "print('sklearn' in sys.modules, 'scipy' in sys.modules, u.is_sklearn_available(), u.is_scipy_available())\n"
        "from scalerl.scaling.sigmoid import fit_sigmoid\n"
        "f = fit_sigmoid([1, 2, 4, 8, 16, 32], [0.1, 0.2, 0.4, 0.6, 0.7, 0.72], bootstrap=0)\n"
        "print('scipy' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "True", "True", "True"], out.stdout
