"""The trainer's forward: a group's shared prompt goes through the model once (``trainer.share_prompts``)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from parts import options, trainer_options
from test_model import tiny_model_cfg

from scalerl.model.build import build_model
from scalerl.model.precision import Precision
from scalerl.trainer import TrainBatch, make_trainer

VOCAB = 40
CPU = torch.device("cpu")


def grouped_batch(seed: int = 0, groups: int = 3, per: int = 4, prompt_lens=(5, 7, 6), length: int = 22):
    """``groups`` prompts of unequal lengths, each shared by its ``per`` rows, then completions of
    unequal lengths, right-padded with 0; behaviour log-probs are random."""
    g = torch.Generator().manual_seed(seed)
    n = groups * per
    ids = torch.zeros(n, length, dtype=torch.long)
    mask = torch.zeros(n, length - 1)
    for gi in range(groups):
        p = prompt_lens[gi]
        prompt = torch.randint(2, VOCAB, (p,), generator=g)
        for j in range(per):
            r = gi * per + j
            c = int(torch.randint(2, length - p + 1, (1,), generator=g))
            ids[r, :p] = prompt
            ids[r, p : p + c] = torch.randint(2, VOCAB, (c,), generator=g)
            mask[r, p - 1 : p - 1 + c] = 1.0
    return TrainBatch(
        input_ids=ids,
        mask=mask,
        gen_logp=-torch.rand(n, length - 1, generator=g) * mask,
        versions=torch.zeros(n, length - 1, dtype=torch.long),
        advantages=torch.randn(n, generator=g),
        group_ids=torch.arange(groups).repeat_interleave(per),
        start=min(prompt_lens) - 1,
    )


def trainer_opts(share: bool) -> dict:
    """The trainer's options of the recipe (composed and typed: every field is the schema's, as a run
    has it) with the trainer these tests step: lr 1e-3 from the first step, no weight decay or
    clipping, G = 4."""
    return copy.deepcopy(trainer_options(_trainer_config(share)))


@functools.lru_cache(maxsize=2)
def _trainer_config(share: bool):
    return options(
        [
            "trainer.lr=1e-3",
            "trainer.weight_decay=0.0",
            "trainer.warmup_steps=0",
            "trainer.grad_clip=0.0",
            "trainer.generations_per_prompt=4",
            f"trainer.share_prompts={str(share).lower()}",
            "loss.eps_max=4.0",
        ]
    )


def positions_through(body: torch.nn.Module) -> list[int]:
    """A list that records how many token positions each call of ``body`` is given."""
    seen: list[int] = []
    body.register_forward_pre_hook(lambda m, args, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True)
    return seen


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "llama"])
@pytest.mark.parametrize("body", ["fp32", "bf16"])
def test_shared_prompts_give_the_same_logprobs_and_gradients_from_fewer_positions(arch, body):
    torch.manual_seed(0)
    model = build_model(tiny_model_cfg(arch), VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device(body, "fp32", "cpu", impl="emulated")
    precision.prepare(model)
    batch = grouped_batch()
    out = {}
    for share in (False, True):
        tr = make_trainer(copy.deepcopy(model), precision, **trainer_opts(share), temperature=1.0, device=CPU)
        seen = positions_through(tr.module.get_decoder())
        logp, entropy = tr.token_logprobs(batch, with_entropy=True)
        (logp * batch.mask[:, batch.start :] * batch.advantages[:, None]).sum().backward()
        grads = {k: p.grad.clone() for k, p in tr.module.named_parameters() if p.grad is not None}
        out[share] = (logp.detach(), entropy, grads, seen)

    n, length = batch.input_ids.shape
    s = batch.start
    # one pass over every row, against each group's first s positions once and the rest per row
    assert out[False][3] == [n * (length - 1)]
    assert out[True][3] == [3 * s, n * (length - 1 - s)]
    assert torch.allclose(out[True][0], out[False][0], atol=2e-5), (out[True][0] - out[False][0]).abs().max()
    assert torch.allclose(out[True][1], out[False][1], atol=2e-5)
    g0, g1 = out[False][2], out[True][2]
    assert g0.keys() == g1.keys() and len(g0) > 0
    # a bf16 body rounds each linear layer's gradients to bf16 (as autocast does): sums taken in
    # another order move some of those roundings, one bf16 step each: within 2^-8 in norm
    tol = 1e-4 if body == "fp32" else 2**-8
    total = torch.stack([g.norm() for g in g0.values()]).norm()
    for k in g0:
        # a key projection's bias has no gradient in exact arithmetic (softmax does not see a shift
        # that every key shares): what it gets is rounding, measured against the whole gradient
        scale = total if k.endswith("k_proj.bias") else g0[k].norm()
        err = float((g1[k] - g0[k]).norm() / scale.clamp_min(1e-12))
        assert err < tol, (k, err)


def test_rows_with_different_prompts_take_one_pass():
    """Nothing to share (every row's prefix differs): the plain pass, once."""
    model = build_model(tiny_model_cfg("gpt2"), VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("fp32", "fp32", "cpu")
    batch = grouped_batch(groups=4, per=1, prompt_lens=(5, 7, 6, 5))
    tr = make_trainer(model, precision, **trainer_opts(True), temperature=1.0, device=CPU)
    seen = positions_through(tr.module.get_decoder())
    tr.token_logprobs(batch)
    assert seen == [batch.input_ids.numel() - batch.input_ids.shape[0]]


def test_a_step_with_shared_prompts_lands_on_the_same_weights():
    """A whole optimiser step (loss, length buckets, AdamW) with and without sharing."""
    model = build_model(tiny_model_cfg("gpt2"), VOCAB, seed=1, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("fp32", "fp32", "cpu")
    batch = grouped_batch(seed=1)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    after, stats = {}, {}
    for share in (False, True):
        tr = make_trainer(copy.deepcopy(model), precision, **trainer_opts(share), temperature=1.0, device=CPU)
        stats[share] = tr.step(batch)
        after[share] = tr.module.state_dict()
    assert stats[True]["train/step_skipped"] == 0.0
    assert stats[True]["train/loss"] == pytest.approx(stats[False]["train/loss"], rel=1e-5, abs=1e-7)
    moved = max(float((after[False][k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4
    diff = max(float((after[True][k] - after[False][k]).abs().max()) for k in start)
    # Adam's first step is about lr x sign(gradient): a wrong gradient moves weights by the step size
    # (1e-3); rounding differences only move the few whose gradient is near Adam's eps
    assert diff < 1e-5, diff


def test_a_step_leaves_no_gradient_behind():
    """The gradients are freed with the step, not at the next one: the generation in between (on one
    process, the HF generator's KV cache) does not sit beside a model's worth of them."""
    model = build_model(tiny_model_cfg("qwen2"), VOCAB, seed=1, pad_token_id=0, eos_token_id=1)
    tr = make_trainer(
        model, Precision.for_device("fp32", "fp32", "cpu"), **trainer_opts(False), temperature=1.0, device=CPU
    )
    start = {k: v.clone() for k, v in tr.module.state_dict().items()}
    assert tr.step(grouped_batch(seed=1))["train/step_skipped"] == 0.0
    assert max(float((tr.module.state_dict()[k] - start[k]).abs().max()) for k in start) > 1e-4
    assert [n for n, p in tr.module.named_parameters() if p.grad is not None] == []


def test_a_model_that_returns_no_cache_is_a_clear_error():
    """Gradient checkpointing turns the KV cache off in training: sharing says what to do instead."""
    model = build_model(tiny_model_cfg("gpt2"), VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    # transformers 5 renamed it (the old name warns); 4.x has only the old one
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    tr = make_trainer(
        model.train(),
        Precision.for_device("fp32", "fp32", "cpu"),
        **trainer_opts(True),
        temperature=1.0,
        device=CPU,
    )
    with pytest.raises(RuntimeError, match="set trainer.share_prompts=false"):
        tr.token_logprobs(grouped_batch())


def test_merge_stats_combines_ranks_by_kind():
    """The one cross-rank statistics merge (trainer step and loop): sums, maxima, weighted means, keys
    only some ranks have; one rank's statistics come back as they are."""
    from scalerl.distributed import merge_stats

    parts = [
        {"n": 2.0, "ratio_max": 1.5, "mean": 1.0, "lag": 4.0},
        {"n": 3.0, "ratio_max": 1.2, "mean": 4.0, "lag": 0.0, "only_here_max": 7.0},
    ]
    weights = [{"mean": 1.0, "lag": 3.0}, {"mean": 3.0, "lag": 0.0}]
    got = merge_stats(parts, weights=weights, summed={"n"}, maxed={"lag_peak"})
    assert got == {"n": 5.0, "ratio_max": 1.5, "mean": (1.0 + 12.0) / 4, "lag": 4.0, "only_here_max": 7.0}
    assert merge_stats(parts, summed={"n"})["mean"] == 2.5  # unweighted: the plain mean
    assert merge_stats([{"x": 0.1}, {"x": 0.3}], weights=[{"x": 0.0}, {"x": 0.0}]) == {"x": 0.0}
    one = {"mean": 0.1 + 0.2, "n": 3.0}
    assert merge_stats([one], weights=[{"mean": 3.0}], summed={"n"}) == one
