"""Numerical precision of the policy (paper Sec. 3.2, "FP32 precision at the LM head").

A :class:`Precision` says in which dtype the transformer body and the LM head (with its
log-softmax) compute. Generator and trainer use the same object, so ``fp32_head`` means the same
thing on both sides, as in the paper.

Two implementations of reduced precision:

* ``native``: the kernels run in bf16/fp16 (the default on CUDA). A model that is trained keeps
  fp32 master weights and runs its body under ``torch.autocast`` in the body dtype (mixed-precision
  training: AdamW updating bf16 weights would round away every update smaller than 2^-9 of a
  weight, most of them at the paper's learning rate of 5e-7); an inference-only copy (the pipeline
  generator's process) has its body's parameters cast to the body dtype.
* ``emulated``: parameters stay fp32 (master weights) and every linear / embedding / norm layer
  rounds its weight, input and output to the low-precision dtype, accumulating in fp32 like a
  tensor-core GEMM. CPUs without native bf16 (this project's CI machines) run native bf16 about
  10-16x slower than fp32; emulation reproduces bf16's rounding at fp32 speed. It is the default
  on CPU; ``precision.impl=native`` forces real bf16 tensors there.

  An emulated linear layer computes what ``torch.autocast``'s does (:class:`_LowPrecisionLinear`):
  input, weight and bias in the low-precision dtype, products accumulated in fp32, the output
  rounded once; in the backward the incoming gradient is rounded and so is each gradient GEMM's
  output. On a CPU with bf16 matrix instructions (AMX, AVX512-BF16) these GEMMs run as real bf16
  GEMMs (:func:`low_precision_kernels`), elsewhere as fp32 GEMMs over rounded values: the same
  numbers up to the order of the fp32 sums.
"""

from __future__ import annotations

import contextlib
import os
import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scalerl.config.groups.precision import DTYPE_NAMES, IMPLS  # noqa: F401  (IMPLS: declared with the option)
from scalerl.model.kv_cache import decoder

# each dtype name the precision options may use -> its torch dtype
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))

# Emulation's hooks, as models prepared from now on get them: a fresh embedding or norm output is
# rounded in place (the same values and gradients as rounding a copy, with less memory traffic).
# False: the plain hooks, kept so that tests can compare the two on one model. (A linear layer's
# input that is already a rounded output is never rounded again: rounding is idempotent.)
LEAN_EMULATION = True


class _RoundTo(torch.autograd.Function):
    """Round to a lower-precision dtype and back; straight-through gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # type: ignore[override]
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, None


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == x.dtype or not x.is_floating_point():
        return x
    return _RoundTo.apply(x, dtype)


# An emulated bf16 body's linear layers as real bf16 GEMMs: None chooses by the machine (a CPU with
# AMX or AVX512-BF16 instructions, :func:`low_precision_kernels`), True / False force them on / off
# (tests compare the two; both compute the same numbers up to the order of the fp32 sums)
LOW_PRECISION_KERNELS: bool | None = None


def low_precision_kernels(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """Whether an emulated linear layer in ``dtype`` on ``device`` runs as a real low-precision GEMM
    (fp32 accumulation, output rounded once): bf16 on a CPU that has bf16 matrix instructions and
    whose oneDNN may use them (:func:`onednn_allows_bf16`), where it is 2-4x the fp32 rate at the
    embedded model's shapes; otherwise fp32 GEMMs over rounded values."""
    if dtype != torch.bfloat16 or torch.device(device).type != "cpu":
        return False
    if LOW_PRECISION_KERNELS is not None:
        return LOW_PRECISION_KERNELS
    return _cpu_has_bf16_gemm()


# oneDNN's instruction-set caps (``ONEDNN_MAX_CPU_ISA``, formerly ``DNNL_MAX_CPU_ISA``) below its
# bf16 GEMM kernels: under one of them a bf16 GEMM falls back to a reference loop, far slower than
# an fp32 GEMM (benchmarks/results/2026-12-05_25b39c5_avx2-paths.md)
_ONEDNN_NO_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"})

AVX2_PATHS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "NUMBA_CPU_NAME": "haswell",
}
"""The environment under which a process on a newer CPU takes an AVX2 machine's code paths: each
library's own cap (torch's kernels, oneDNN's and MKL's GEMMs, numba's compiled loops), read when the
library loads, so it is set before the process starts (benchmarks/bench_isa.py, tests/test_kernels.py)."""


def onednn_allows_bf16() -> bool:
    """Whether oneDNN may use its bf16 instructions here: False where ``ONEDNN_MAX_CPU_ISA`` (or
    ``DNNL_MAX_CPU_ISA``) caps it below them (e.g. ``AVX2``, to reproduce an AVX2 machine's paths on a
    newer CPU); True where it is unset or names a bf16-capable or unknown set."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return cap.strip().upper() not in _ONEDNN_NO_BF16


def _cpu_has_bf16_gemm() -> bool:
    if not onednn_allows_bf16():
        return False
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def _round_inplace(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.copy_(x.to(dtype))


def lp_addmm(bias: torch.Tensor | None, x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype, kernels: bool):
    """``round(x @ w + bias)`` as fp32, for ``x`` [M, K], ``w`` [K, N] and ``bias`` [N] already in
    ``dtype`` (``kernels``: a real low-precision GEMM) or fp32 holding ``dtype``'s values (an fp32
    GEMM, its output rounded in place). Forward only: the emulated linear layer's arithmetic, which
    the lean decode uses too."""
    y = torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)
    return y.float() if kernels else _round_inplace(y, dtype)


class _LowPrecisionLinear(torch.autograd.Function):
    """A linear layer as ``torch.autocast`` computes it in a low-precision dtype: ``x`` [M, K],
    ``w`` [K, N] and ``bias`` [N] rounded, products accumulated in fp32, the output rounded once;
    the backward rounds the incoming gradient, and each gradient's GEMM output (input and weight;
    the bias's gradient is the rounded sum of the rounded gradient). Inputs and outputs are fp32
    (holding low-precision values); ``kernels``: the GEMMs run in the low-precision dtype (the
    machine's bf16 instructions), else in fp32 over rounded values: the same numbers up to the
    order of the fp32 sums."""

    @staticmethod
    def forward(ctx, x, w, bias, dtype, kernels, rounded=False, low=None, low_out=False):  # type: ignore[override]
        # rounded: ``x`` holds dtype's values already (a rounded layer output): not rounded again;
        # low: ``x`` in ``dtype`` (kept when it was rounded): not converted again; low_out: with
        # ``kernels``, the output is returned in ``dtype`` (the same values, not widened)
        ctx.x_dtype, ctx.low_out = x.dtype, bool(kernels and low_out)
        if kernels:
            xl, wl = (x.to(dtype) if low is None else low), w.to(dtype)
            bl = None if bias is None else bias.to(dtype)
        else:
            xl = x if rounded else x.to(dtype).float()
            wl = w.to(dtype).float()
            bl = None if bias is None else bias.to(dtype).float()
        ctx.save_for_backward(xl, wl)
        ctx.dtype, ctx.kernels, ctx.has_bias = dtype, kernels, bias is not None
        if ctx.low_out:
            return torch.mm(xl, wl) if bl is None else torch.addmm(bl, xl, wl)
        return lp_addmm(bl, xl, wl, dtype, kernels)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        xl, wl = ctx.saved_tensors
        dtype, kernels = ctx.dtype, ctx.kernels
        g = grad.to(dtype) if kernels else grad.to(dtype).float()

        def out(y: torch.Tensor) -> torch.Tensor:
            return y.float() if kernels else _round_inplace(y, dtype)

        gx = None
        if ctx.needs_input_grad[0]:  # in the input's dtype: a low-precision input takes it as it is
            gx = g @ wl.t() if kernels and ctx.x_dtype == dtype else out(g @ wl.t())
        gw = out(xl.t() @ g) if ctx.needs_input_grad[1] else None
        gb = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # the low-precision sum accumulates in fp32 and rounds once, as autocast's does
            gb = (g.sum(0) if kernels else g.sum(0).to(dtype)).float()
        return gx, gw, gb, None, None, None, None, None


def _emulated_linear_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward of an emulated linear layer (``nn.Linear`` or GPT-2's ``Conv1D``) in the
    low-precision dtype ``module._scalerl_lp_dtype``: :class:`_LowPrecisionLinear`."""
    dtype = module._scalerl_lp_dtype
    w = module.weight  # [out, in] for nn.Linear, [in, out] for Conv1D
    w = w.t() if isinstance(module, nn.Linear) else w
    kernels = low_precision_kernels(dtype, x.device)
    rounded = _is_rounded(x, dtype)
    low = _low_copy(x, dtype) if kernels and rounded else None
    x2 = x.reshape(-1, x.shape[-1])
    low = None if low is None else low.reshape(x2.shape)
    low_out = getattr(module, "_scalerl_lp_out", False)
    y = _LowPrecisionLinear.apply(x2, w, module.bias, dtype, kernels, rounded, low, low_out)
    y = y.view(*x.shape[:-1], y.shape[-1])
    y._scalerl_rounded = (dtype, y._version)
    return y


# per architecture, the linear layers whose output may stay in the low-precision dtype where their
# GEMMs run in it: every op that reads it computes the same there as over its fp32 copy. GPT-2's
# c_fc feeds GELU (torch computes a bf16 GELU, and its backward, in fp32 and rounds once: the
# emulation's round(gelu(x)), whose gradient the next layer rounds anyway); both c_proj feed a
# residual add (bf16 + fp32 is the fp32 sum; the add's backward rounds the gradient the layer's
# backward rounds). The query/key/value projection stays fp32: attention runs in fp32.
_LOW_OUTPUT = {"gpt2": ("mlp.c_fc", "mlp.c_proj", "attn.c_proj")}

# the layers whose forward returns a new tensor that no op of theirs saves for its backward: their
# output may be rounded in place (a module that returned a view of its input, or an output its
# backward reads, would not allow it)
_FRESH_OUTPUT = (nn.Linear, nn.Embedding, nn.LayerNorm)


def _rounded(x: torch.Tensor, dtype: torch.dtype, *, in_place: bool) -> torch.Tensor:
    """``x`` rounded to ``dtype`` (:func:`round_to`), marked as such (with its in-place version) so
    that a layer it goes into skips rounding it again: rounding is idempotent, so skipping gives
    the same values; a later in-place change of ``x`` changes its version and voids the mark."""
    if dtype == x.dtype or not x.is_floating_point():
        return x
    if in_place:
        # written into ``x`` where autograd does not see it: the straight-through gradient is the
        # identity, which is what autograd then passes back; an op that had saved ``x`` for its
        # backward would find its version changed and refuse (loudly). Through a Function with
        # mark_dirty the same would cost a CopySlices node per view (Conv1D's output is one).
        with torch.no_grad():
            low = x.to(dtype)
            x.copy_(low)
        out = x
        # the low-precision copy, for a linear layer that takes ``x`` next (its GEMMs then read it
        # instead of converting ``x`` again: one pass over the activation less)
        out._scalerl_low = (dtype, out._version, low)
    else:
        out = _RoundTo.apply(x, dtype)
    out._scalerl_rounded = (dtype, out._version)
    return out


def _is_rounded(x: torch.Tensor, dtype: torch.dtype) -> bool:
    return getattr(x, "_scalerl_rounded", None) == (dtype, x._version)


def _low_copy(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``x`` in ``dtype`` as :func:`_rounded` kept it, while ``x`` is unchanged since (None: none)."""
    kept = getattr(x, "_scalerl_low", None)
    if kept is None or kept[0] != dtype or kept[1] != x._version or kept[2].shape != x.shape:
        return None
    return kept[2]


class _RoundedWeight(nn.Module):
    """A parametrization: the layer sees its weight rounded to ``dtype``."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return round_to(w, self.dtype)


def _round_output_hook(dtype: torch.dtype, in_place: bool = False):
    def hook(module, args, output):
        if isinstance(output, torch.Tensor):
            return _rounded(output, dtype, in_place=in_place)
        return output

    return hook


@dataclass
class Precision:
    body: str = "fp32"
    head: str = "fp32"
    impl: str = "emulated"  # native | emulated (only matters for non-fp32 dtypes)

    @classmethod
    def for_device(cls, body: str, head: str, device: torch.device | str, impl: str = "auto") -> Precision:
        if impl == "auto":
            impl = "native" if torch.device(device).type == "cuda" else "emulated"
        return cls(body=body, head=head, impl=impl)

    @property
    def body_dtype(self) -> torch.dtype:
        return DTYPES[self.body]

    @property
    def head_dtype(self) -> torch.dtype:
        return DTYPES[self.head]

    def describe(self) -> dict[str, str]:
        """Effective dtypes, logged as run params."""

        def eff(name: str) -> str:
            if name == "fp32":
                return "fp32"
            return f"{name} ({'native' if self.impl == 'native' else 'emulated: fp32 math, rounded'})"

        return {"precision/body_dtype": eff(self.body), "precision/head_dtype": eff(self.head)}

    # ------------------------------------------------------------------ model preparation
    def prepare(self, model: nn.Module, *, master_weights: bool = True) -> nn.Module:
        """Make ``model`` (a transformers causal LM) compute its body in the body dtype.

        ``master_weights``: the model is trained (the trainer's, which the sync generator and the
        evaluation share); natively its parameters stay fp32 and its body runs under
        :meth:`autocast`. Without, an inference-only model's body is cast to the body dtype. The LM
        head's parameters stay fp32 unless cast for an inference-only ``head`` below fp32;
        :meth:`logits` computes the head in the head dtype. Idempotent: a model is prepared once.
        """
        if getattr(model, "_scalerl_precision", None) is not None:
            return model
        body = decoder(model)
        head = model.get_output_embeddings()
        cast = self.impl == "native" and not master_weights
        if self.body != "fp32":
            if self.impl != "native":
                self._emulate(body, self.body_dtype)
            elif master_weights:
                model._scalerl_autocast = self.body_dtype
            else:
                body.to(self.body_dtype)
        if self.head != "fp32" and cast:
            head.to(self.head_dtype)
        if getattr(model.config, "tie_word_embeddings", False) and self.body != self.head and cast:
            raise ValueError(
                "precision: a model with tied embeddings cannot hold body and head in different dtypes "
                "natively; use untied embeddings or precision.impl=emulated"
            )
        model._scalerl_precision = self
        return model

    @staticmethod
    def autocast(model: nn.Module, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
        """The context to run the body's forward in (not the head's: :meth:`logits` sets its dtype):
        ``torch.autocast`` in the body dtype for a native model with fp32 master weights
        (``cache_enabled=False`` inside a CUDA graph's capture: autocast's weight casts are then
        part of every replay)."""
        dtype = getattr(model, "_scalerl_autocast", None)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(next(model.parameters()).device.type, dtype=dtype, cache_enabled=cache_enabled)

    @staticmethod
    def _emulate(body: nn.Module, dtype: torch.dtype) -> None:
        from torch.nn.utils import parametrize
        from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

        linear = (nn.Linear, Conv1D)
        low_out = _LOW_OUTPUT.get(getattr(getattr(body, "config", None), "model_type", None), ())
        for name, module in body.named_modules():
            params = [n for n, _ in module.named_parameters(recurse=False)]
            if not params:
                continue
            if "weight" in params and isinstance(module, (*linear, nn.Embedding)):
                parametrize.register_parametrization(module, "weight", _RoundedWeight(dtype))
            if isinstance(module, linear):
                # autocast's linear layer (the bias rounded too; gradients rounded in the backward)
                module._scalerl_lp_dtype = dtype
                module._scalerl_lp_out = name.endswith(low_out) if low_out else False
                module.forward = types.MethodType(_emulated_linear_forward, module)
                continue
            fresh = isinstance(module, _FRESH_OUTPUT)
            module.register_forward_hook(_round_output_hook(dtype, in_place=fresh and LEAN_EMULATION))

    # ------------------------------------------------------------------ the head
    def logits(self, model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits in the head dtype (returned as that dtype, or fp32 when emulated)."""
        head = model.get_output_embeddings()
        if self.head == "fp32":
            return nn.functional.linear(hidden.float(), head.weight.float(), _maybe_float(head.bias))
        d = self.head_dtype
        if self.impl == "native":  # the head's weight is fp32 in a model with master weights
            bias = None if head.bias is None else head.bias.to(d)
            return nn.functional.linear(hidden.to(d), head.weight.to(d), bias)
        w = round_to(head.weight, d)
        return round_to(nn.functional.linear(round_to(hidden.float(), d), w, head.bias), d)

    def log_softmax(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Log-probabilities over the vocabulary, computed in the head dtype."""
        if temperature != 1.0:
            logits = logits / temperature
        if self.head == "fp32":
            return torch.log_softmax(logits.float(), dim=-1)
        if self.impl == "native":
            return torch.log_softmax(logits.to(self.head_dtype), dim=-1)
        return round_to(torch.log_softmax(logits.float(), dim=-1), self.head_dtype)


def has_rounded_weights(model: nn.Module) -> bool:
    """Whether ``model`` reads some weight through a parametrization (emulated low precision)."""
    from torch.nn.utils import parametrize

    return any(parametrize.is_parametrized(m) for m in model.modules())


@contextlib.contextmanager
def weights_rounded_once():
    """Inside: each parametrized (rounded) weight is computed once, at its first use, and every
    later use in the block reads that tensor (``torch.nn.utils.parametrize.cached``), which carries
    the same straight-through gradient back to the weight. For one micro-batch's forward passes
    (a trainer step's length buckets and shared prompts call the body several times): the same
    values and gradients, the weights rounded once instead of once per call.

    The cache is emptied on entry and on exit even where another ``cached()`` block is open (an
    HF generator session): an entry made before (under no_grad, or from weights an optimiser step
    has since changed) must not stand in for the weight here, and one made here must not outlive
    the weights it was rounded from."""
    from torch.nn.utils import parametrize

    def empty() -> None:
        cache = getattr(parametrize, "_cache", None)
        if isinstance(cache, dict):
            cache.clear()

    empty()
    try:
        with parametrize.cached():
            yield
    finally:
        empty()


def _maybe_float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _chosen_logprobs(precision, model, hidden, targets, temperature, with_entropy):
    """Log-prob of ``targets`` (fp32) and, with ``with_entropy``, the entropy (fp32, no gradient) of
    the head's distribution at every row of ``hidden`` [M, H]; the full [M, V] logits are temporaries."""
    logp_all = precision.log_softmax(precision.logits(model, hidden), temperature)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
    entropy = None
    if with_entropy:
        with torch.no_grad():
            lp = logp_all.float()
            entropy = -(lp.exp() * lp).sum(-1)
    return logp, entropy


def head_logprobs(
    precision,
    model: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each target token, entropy or None), both fp32 and shaped like ``targets``, from
    the body's last hidden states ``hidden`` [..., H] through the LM head under ``precision``.

    ``chunk_tokens`` > 0: the head and its log-softmax run over that many positions at a time, each
    chunk under activation checkpointing, so neither the forward nor the backward ever holds more
    than one chunk's [chunk, vocabulary] logits (the backward recomputes a chunk's logits from its
    hidden states, one matmul more per chunk). Memory then grows with the tokens of a micro-batch
    only through its [tokens, H] hidden states, not [tokens, vocabulary]. The same arithmetic per
    position as one pass over all of them (``chunk_tokens`` = 0). ``precision`` is a
    :class:`Precision` or an engine's adaptation of it (its ``logits`` and ``log_softmax`` are used)."""
    shape = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1)
    n = flat_t.shape[0]
    if chunk_tokens <= 0 or n <= chunk_tokens:
        logp, entropy = _chosen_logprobs(precision, model, flat_h, flat_t, temperature, with_entropy)
    else:
        recompute = torch.is_grad_enabled() and flat_h.requires_grad
        parts, ents = [], []
        for lo in range(0, n, chunk_tokens):
            args = (precision, model, flat_h[lo : lo + chunk_tokens], flat_t[lo : lo + chunk_tokens])
            if recompute:
                lp, ent = checkpoint(_chosen_logprobs, *args, temperature, with_entropy, use_reentrant=False)
            else:
                lp, ent = _chosen_logprobs(*args, temperature, with_entropy)
            parts.append(lp)
            ents.append(ent)
        logp = torch.cat(parts)
        entropy = torch.cat(ents) if with_entropy else None
    return logp.view(shape), (entropy.view(shape) if entropy is not None else None)
