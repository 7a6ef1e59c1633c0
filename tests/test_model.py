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
