"""An emulated low-precision linear layer computes what ``torch.autocast``'s bf16 linear computes.

Input, weight and bias rounded to bf16, products accumulated in fp32, the output rounded once; the
backward rounds the incoming gradient and each gradient GEMM's output. Two implementations: real
bf16 GEMMs (the machine's bf16 instructions where it has them; torch runs them on any CPU, slower)
and fp32 GEMMs over rounded values. They give the same numbers up to the order of the fp32 sums."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

import scalerl.model.precision as precision_module
from scalerl.model.precision import Precision, low_precision_kernels

BF16 = torch.bfloat16


def r(t: torch.Tensor) -> torch.Tensor:
    return t.to(BF16).float()


def _layer(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        layer = nn.Linear(96, 80)
    else:
        layer = Conv1D(80, 96)  # GPT-2's: weight [in, out]
        nn.init.normal_(layer.weight, std=0.1)
    nn.init.normal_(layer.bias, std=0.5)  # a bias with more bits than bf16 holds
    return layer


def _weight_kn(layer: nn.Module) -> torch.Tensor:
    return layer.weight.t() if isinstance(layer, nn.Linear) else layer.weight


def _run(layer: nn.Module, kernels: bool, monkeypatch, x: torch.Tensor, g: torch.Tensor):
    """(output, input gradient, weight gradient, bias gradient) of the emulated layer."""
    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", kernels)
    m = copy.deepcopy(layer)
    Precision(body="bf16", head="fp32", impl="emulated")._emulate(m, BF16)
    x = x.clone().requires_grad_(True)
    y = m(x)
    y.backward(g)
    w = m.parametrizations.weight.original
    return y.detach(), x.grad, w.grad, m.bias.grad


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 steps apart two tensors of bf16 values are, element by element."""
    ai, bi = a.to(BF16).view(torch.int16).int(), b.to(BF16).view(torch.int16).int()
    return (ai - bi).abs()


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_an_emulated_linear_layer_is_autocasts_bf16_linear(kind, monkeypatch):
    """The real-bf16-GEMM path equals ``torch.autocast``'s linear bit for bit (output, input and
    weight gradients); the fp32 path equals the formula computed in fp32 bit for bit; and the two
    paths differ only where the order of fp32 sums moves a rounding: by one bf16 step at most, in
    under 1% of the values."""
    layer = _layer(kind)
    torch.manual_seed(1)
    x, g = torch.randn(3, 50, 96), torch.randn(3, 50, 80)
    kern = _run(layer, True, monkeypatch, x, g)
    emu = _run(layer, False, monkeypatch, x, g)

    # autocast's bf16 linear over the same fp32 weights
    w = _weight_kn(layer).detach().clone().requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True)
    xa = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=BF16):
        ya = F.linear(xa, w.t(), b)
    ya.backward(g.to(BF16))
    assert ya.dtype == BF16
    assert torch.equal(kern[0], ya.float())
    assert torch.equal(kern[1], xa.grad)
    assert torch.equal(kern[2], w.grad if kind == "conv1d" else w.grad.t())

    # the formula, in fp32 over rounded values
    wk = r(_weight_kn(layer).detach())
    x2, g2 = r(x.reshape(-1, 96)), r(g.reshape(-1, 80))
    want_y = r(torch.addmm(r(layer.bias.detach()), x2, wk)).view(3, 50, 80)
    want_gx = r(g2 @ wk.t()).view(3, 50, 96)
    want_gw = r(x2.t() @ g2)
    want_gb = r(g2.sum(0))
    assert torch.equal(emu[0], want_y)
    assert torch.equal(emu[1], want_gx)
    assert torch.equal(emu[2], want_gw if kind == "conv1d" else want_gw.t())
    assert torch.equal(emu[3], want_gb)
    # the bias is rounded too: a layer that kept it in fp32 would differ in many outputs
    kept = r(torch.addmm(layer.bias.detach(), x2, wk)).view(3, 50, 80)
    assert (kept != want_y).float().mean() > 0.05

    for a, e in zip(kern, emu, strict=True):
        apart = _ulps_apart(a, e)
        assert int(apart.max()) <= 1
        assert float((apart > 0).float().mean()) < 0.01


def test_the_machine_chooses_the_bf16_gemms_only_for_bf16_on_a_cpu_that_has_them(monkeypatch):
    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", None)
    has = precision_module._cpu_has_bf16_gemm()
    flags = [
        getattr(torch.cpu, n, lambda: False)()
        for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    ]
    assert has == (any(flags) and precision_module.onednn_allows_bf16())
    assert low_precision_kernels(BF16, "cpu") == has
    assert not low_precision_kernels(torch.float16, "cpu")  # fp16: fp32 GEMMs over rounded values
    assert not low_precision_kernels(BF16, "meta")
    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", True)
    assert low_precision_kernels(BF16, "cpu") and not low_precision_kernels(torch.float16, "cpu")


@pytest.mark.parametrize(
    "env, cap, allowed",
    [
        ("ONEDNN_MAX_CPU_ISA", "AVX2", False),
        ("ONEDNN_MAX_CPU_ISA", "avx512_core", False),  # AVX-512 without its bf16 instructions
        ("DNNL_MAX_CPU_ISA", "AVX2_VNNI", False),  # the older name of the same cap
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", True),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX", True),
        ("ONEDNN_MAX_CPU_ISA", "ALL", True),
        ("ONEDNN_MAX_CPU_ISA", "", True),  # unset: oneDNN uses what the CPU has
    ],
)
def test_oneDNN_capped_below_its_bf16_kernels_keeps_the_fp32_gemms(monkeypatch, env, cap, allowed):
    """Where ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below its bf16 instructions (how a newer CPU runs an
    AVX2 machine's paths), a bf16 GEMM is a slow reference loop: the emulated layers keep fp32
    GEMMs over rounded values, whatever the CPU has."""
    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", None)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(env, cap)
    flags = any(
        getattr(torch.cpu, n, lambda: False)()
        for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )
    assert precision_module.onednn_allows_bf16() is allowed
    assert low_precision_kernels(BF16, "cpu") == (flags and allowed)


def test_a_layer_reads_the_bf16_copy_its_rounded_input_kept_with_the_same_bits(monkeypatch):
    """A layer norm's rounded output keeps its bf16 copy, and the linear layer after it reads that
    copy instead of converting again (one pass over the activation less a layer); a GPT-2 body's
    loss and every parameter gradient are bit for bit those of converting again, and the kept copy
    was used by both linear layers after a norm in every block."""
    from test_generator import make_model

    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", True)
    base = make_model(arch="gpt2")
    ids = torch.randint(0, base.config.vocab_size, (6, 20), generator=torch.Generator().manual_seed(0))
    used = []
    real = precision_module._low_copy

    def counted(x, dtype):
        out = real(x, dtype)
        used.append(out is not None)
        return out

    results = []
    for keep in (True, False):
        model = copy.deepcopy(base).train()
        Precision(body="bf16", head="fp32", impl="emulated").prepare(model)
        used.clear()
        monkeypatch.setattr(precision_module, "_low_copy", counted if keep else (lambda x, dtype: None))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        if keep:
            assert sum(used) >= 2 * model.config.n_layer, used
    (la, ga), (lb, gb) = results
    assert torch.equal(la, lb)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[n], gb[n]) for n in ga)


def test_gpt2_layers_whose_output_stays_bf16_give_the_same_loss_and_gradients(monkeypatch):
    """Where the linear layers run as bf16 GEMMs, GPT-2's MLP projections and attention output
    projection return their output as bf16 (GELU and the residual adds read it as they read its
    fp32 copy). A GPT-2 body's loss and every parameter gradient are bit for bit those of widening
    every output to fp32, over two optimiser steps; the layers named do return bf16, the query/key/
    value projection fp32."""
    from test_generator import make_model

    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", True)
    base = make_model(arch="gpt2")
    ids = torch.randint(0, base.config.vocab_size, (6, 20), generator=torch.Generator().manual_seed(0))
    results = []
    for low in (True, False):
        monkeypatch.setattr(precision_module, "_LOW_OUTPUT", precision_module._LOW_OUTPUT if low else {})
        model = copy.deepcopy(base).train()
        Precision(body="bf16", head="fp32", impl="emulated").prepare(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        seen = {}
        hooks = [
            m.register_forward_hook(lambda m, a, y, n=n, seen=seen: seen.setdefault(n, y.dtype) and None)
            for n, m in model.transformer.h[0].named_modules()
            if n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
        ]
        steps = []
        for _ in range(2):
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            steps.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
            opt.step()
        for h in hooks:
            h.remove()
        want = BF16 if low else torch.float32
        assert seen == {
            "attn.c_attn": torch.float32,
            "attn.c_proj": want,
            "mlp.c_fc": want,
            "mlp.c_proj": want,
        }
        results.append(steps)
    for (la, ga), (lb, gb) in zip(*results, strict=True):
        assert torch.equal(la, lb)
        assert all(torch.equal(ga[n], gb[n]) for n in ga), [n for n in ga if not torch.equal(ga[n], gb[n])]
