"""The trainer's lean step (issue 54 item 1) computes what the plain one did.

The lean step changes how the emulated bf16 body is evaluated, not what it computes: a fresh layer
output is rounded in place, a layer input that is already a rounded output is not rounded again,
and a micro-batch's forward passes read each rounded weight once
(:func:`scalerl.model.precision.weights_rounded_once`). Each of these gives the same floats, so
the tolerance between the two paths is zero: gradients, log-probs and weights after a step are
compared exactly, and so are a sync run's first steps under each."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from test_trainer import grouped_batch, trainer_opts

import scalerl.model.precision as precision_module
from scalerl.config import compose
from scalerl.loop import build
from scalerl.loop.run import train_step
from scalerl.model.build import build_model
from scalerl.model.precision import Precision
from scalerl.trainer import make_trainer

CPU = torch.device("cpu")
VOCAB = 40


def default_shape_model():
    """A model of the embedded default's shape (conf/model/tiny.yaml), randomly initialised."""
    cfg = compose([]).model
    return build_model(cfg, VOCAB, seed=0, pad_token_id=0, eos_token_id=1)


def prepared_trainer(model, *, lean: bool, monkeypatch):
    """A trainer over a copy of ``model`` prepared for a bf16 body / fp32 head (emulated), with the
    lean hooks and weight cache (``lean``) or the plain ones."""
    monkeypatch.setattr(precision_module, "LEAN_EMULATION", lean)
    m = copy.deepcopy(model)
    precision = Precision.for_device("bf16", "fp32", "cpu", impl="emulated")
    precision.prepare(m)
    opts = trainer_opts(True)
    opts["trainer"].logits_chunk_tokens = 17  # several chunks, each recomputed in the backward
    tr = make_trainer(m, precision, **opts, temperature=0.7, device=CPU)
    tr.engine.round_weights_once = lean
    tr.bucket_overhead_tokens = 1  # rows split into length buckets: several passes a micro-batch
    return tr


def micro_batch_gradients(tr, batch):
    """(log-probs, entropy, loss, gradients) of one micro-batch as :meth:`Trainer.step` computes
    them: its length buckets and shared prompts, the loss, the backward."""
    tr.module.train()
    passes = tr.passes(batch)
    assert len(passes) > 1  # several body calls: the weight cache is read more than once
    shared = tr._agree([passes])[0]
    logp, entropy, _ = tr.engine.forward(tr._micro_batch_logprobs, passes, shared, True)
    totals = {"tokens": float(batch.mask.sum()), "sequences": float(batch.num_sequences), "groups": 3.0}
    loss = tr._scaled_loss(batch, logp, totals)
    tr.engine.zero_grad()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in tr.module.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, loss.detach(), grads


def test_trainer_speed_lean_step_has_the_plain_steps_gradients(monkeypatch):
    """Same batch, same weights: the lean and the plain paths give bit-identical log-probs, loss
    and gradients (the tolerance is zero), and the same weights after two optimiser steps."""
    model = default_shape_model()
    batch = grouped_batch(seed=3, length=30)
    plain = prepared_trainer(model, lean=False, monkeypatch=monkeypatch)
    lean = prepared_trainer(model, lean=True, monkeypatch=monkeypatch)
    a, b = micro_batch_gradients(plain, batch), micro_batch_gradients(lean, batch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert a[3].keys() == b[3].keys() and len(a[3]) == len(list(model.parameters()))
    for k in a[3]:
        assert torch.equal(a[3][k], b[3][k]), (k, float((a[3][k] - b[3][k]).abs().max()))
    for tr in (plain, lean):
        tr.step(batch)
        tr.step(grouped_batch(seed=4, length=30))
    for (k, p), q in zip(plain.module.named_parameters(), lean.module.parameters(), strict=True):
        assert torch.equal(p, q), k


def test_trainer_speed_a_linear_layer_does_not_round_a_rounded_input_again(monkeypatch):
    """An emulated linear layer (its fp32-GEMM path) skips rounding an input that a norm's rounded
    output already is (the GPT-2 attention's and MLP's first matmuls), and rounds nothing else
    less: fewer rounding ops than with that check off, the same output."""
    calls = {"n": 0}
    real = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if args and args[0] is torch.bfloat16:
            calls["n"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", False)
    model = default_shape_model()
    ids = torch.randint(2, VOCAB, (4, 12))
    m = copy.deepcopy(model)
    Precision.for_device("bf16", "fp32", "cpu", impl="emulated").prepare(m)
    out, counts = {}, {}
    for skip in (False, True):
        if not skip:
            monkeypatch.setattr(precision_module, "_is_rounded", lambda x, dtype: False)
        calls["n"] = 0
        monkeypatch.setattr(torch.Tensor, "to", counting_to)
        with torch.no_grad():
            out[skip] = m.get_decoder()(input_ids=ids).last_hidden_state
        monkeypatch.undo()
        monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", False)
        counts[skip] = calls["n"]
    assert torch.equal(out[False], out[True])
    layers = model.config.n_layer
    # per layer, c_attn's and c_fc's inputs are ln_1's and ln_2's rounded outputs
    assert counts[False] - counts[True] == 2 * layers, counts


def first_sync_steps(tmp_path, *, lean: bool, monkeypatch, steps: int = 3) -> list[dict]:
    """The metrics of the embedded default's first ``steps`` steps in async_mode=sync (seed 0, one
    thread), with the lean step or the plain one (both kept selectable in-process)."""
    monkeypatch.setattr(precision_module, "LEAN_EMULATION", lean)  # read when the model is prepared
    cfg = compose(
        [
            "async_mode=sync",
            "seed=0",
            "trainer.threads=1",
            "progress=log",
            f"out_dir={tmp_path / f'run-{lean}'}",
            f"tracking.uri=sqlite:///{tmp_path / f'mlflow-{lean}.db'}",
        ]
    )
    OmegaConf.resolve(cfg)
    run = build(cfg)
    run.trainer.engine.round_weights_once = lean
    try:
        return [train_step(run)[1] for _ in range(steps)]
    finally:
        run.tracker.end()


METRICS = (
    "train/loss",
    "train/grad_norm",
    "train/entropy",
    "train/gen_train_logprob_diff",
    "train/is_ratio_mean",
    "train/correct",
    "train/reward",
    "train/response_length",
)


@pytest.mark.slow
def test_trainer_speed_sync_run_first_steps_match_the_plain_steps(tmp_path, monkeypatch):
    """The default recipe's model, task and batch in async_mode=sync: the first three steps' metrics
    (loss, gradient norm, log-prob statistics, pass rates) with the lean step equal the plain step's,
    run in the same process on the same machine. Tolerance zero: the lean step evaluates the same
    floats (on an AMD EPYC both also reproduced, bit for bit, what the commit before the change,
    4cf35f8, logged; benchmarks/results/2026-12-01_c6421b0_trainer-speed.md)."""
    plain = first_sync_steps(tmp_path, lean=False, monkeypatch=monkeypatch)
    lean = first_sync_steps(tmp_path, lean=True, monkeypatch=monkeypatch)
    for step, (want, have) in enumerate(zip(plain, lean, strict=True), start=1):
        for k in METRICS:
            assert have[k] == want[k], (step, k, have[k], want[k])
