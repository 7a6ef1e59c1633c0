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
