"""A lean forward for the embedded model's decode: the transformer written over its weight tensors.

The HF generator's time on the embedded model (a few layers of width 128) goes to transformers'
module Python per token, not to arithmetic: every layer call, every hook of the bf16 emulation,
the cache's update and the attention dispatch cost more than the matmuls they wrap. Here one
decode step (or one prefill) is a flat sequence of tensor ops over the model's weights, reading
and writing the :class:`~scalerl.generator.slots.SlotCache` buffers: a prefill's attention is
torch's ``scaled_dot_product_attention``; a decode step's is a compiled loop over each slot's own
positions (:mod:`scalerl.generator.kernels`, with the emulation's rounding and GELU), or, where
the loops do not run (no numba, several torch threads), two batched matmuls under a key mask.

Numerics: the same as the transformers forward under :class:`~scalerl.model.precision.Precision`,
op for op. The emulated low-precision body (``impl=emulated``) rounds every linear / embedding
weight to the body dtype, every linear's input and every linear / embedding / norm output; here the
weights are rounded once per weight version (:meth:`LeanModel.sync`: a copy made when a weight
changes, found by the tensors' in-place version counters, or forced by :meth:`LeanModel.refresh`
when the generator takes a new version), and the activations are rounded exactly where the
hooks round them (an input that is already a rounded output is not rounded twice: rounding is
idempotent). Norm weights are not rounded (the emulation does not round them). The LM head is not
part of this: the generator's :meth:`Precision.logits` computes it as before.

Architectures: GPT-2 (the embedded default) and the Qwen2 / Llama family (RMSNorm, rotary
positions, grouped-query attention, gated SiLU MLP). :func:`unsupported` says why another model
(or a native low-precision body, or a GPU, where the static-cache path runs) keeps the
transformers forward.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from scalerl.generator import kernels
from scalerl.model.kv_cache import decoder
from scalerl.model.precision import low_precision_kernels, lp_addmm

_ARCHS = ("gpt2", "qwen2", "llama")


def unsupported(model: torch.nn.Module, precision, device) -> str | None:
    """Why the lean forward cannot stand in for ``model``'s (None: it can)."""
    cfg = getattr(model, "config", None)
    arch = getattr(cfg, "model_type", None)
    if arch not in _ARCHS:
        return f"architecture {arch!r} (the lean forward knows {', '.join(_ARCHS)})"
    if torch.device(device).type != "cpu":
        return "not on a CPU (a GPU runs the static-cache path)"
    if precision.body != "fp32" and precision.impl != "emulated":
        return f"precision.impl={precision.impl} (native low-precision tensors)"
    if arch == "gpt2":
        if cfg.activation_function != "gelu" or cfg.add_cross_attention:
            return f"gpt2 with activation {cfg.activation_function!r} or cross-attention"
        if cfg.scale_attn_by_inverse_layer_idx or cfg.reorder_and_upcast_attn or not cfg.scale_attn_weights:
            return "gpt2 with non-default attention scaling"
    else:
        if getattr(cfg, "hidden_act", "silu") != "silu":
            return f"{arch} with activation {cfg.hidden_act!r}"
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
            return f"{arch} with sliding-window attention"
        if getattr(cfg, "mlp_bias", False) or (arch == "llama" and getattr(cfg, "attention_bias", False)):
            return f"{arch} with biases the lean forward does not read"
    return None


class LeanModel:
    """The body of ``model`` (a transformers causal LM prepared by ``precision``) as tensors, and
    its forward over slot buffers (:meth:`prefill`, :meth:`decode`)."""

    # the compiled loops (scalerl.generator.kernels): None uses them where they run (numba
    # importable, a CPU, one torch thread: the loops are single-threaded); False keeps torch's ops,
    # True uses them on any thread count (benchmarks and tests set it per instance or class)
    use_kernel: bool | None = None

    def __init__(self, model: torch.nn.Module, precision):
        self.model = model
        self.arch = model.config.model_type
        self.body = decoder(model)
        emulated = precision.body != "fp32" and precision.impl == "emulated"
        self.dtype = precision.body_dtype if emulated else None  # None: no rounding
        cfg = model.config
        if self.arch == "gpt2":
            self.heads = self.kv_heads = cfg.n_head
            self.eps = cfg.layer_norm_epsilon
        else:
            self.heads = cfg.num_attention_heads
            self.kv_heads = cfg.num_key_value_heads
            self.eps = cfg.rms_norm_eps
        self.head_dim = cfg.hidden_size // self.heads
        self.layers = len(self.body.h if self.arch == "gpt2" else self.body.layers)
        # where each parameter lives (module, attribute): the modules do not change, what they hold
        # may (a parameter replaced by a new tensor), so the key reads the attributes each time
        # without walking the module tree at every decode step
        self._slots = [self._owner(name) for name, _ in self.body.named_parameters()]
        self._key: tuple | None = None
        # the loops a forward uses (chosen at its start, :meth:`_choose`): in-place bf16 rounding and
        # the fused round-GELU-round of the emulated body (None: torch's conversions and GELU)
        self._round = self._gelu = None
        self.refreshes = 0  # weight copies made (tests: one per weight version)
        # the buffers of the last session that ended (:meth:`give_back`), for the next one to take
        self._spare: list | None = None
        self.sync()

    # ------------------------------------------------------------------ weights
    def _owner(self, name: str) -> tuple[torch.nn.Module, str]:
        path, _, attr = name.rpartition(".")
        return (self.body.get_submodule(path) if path else self.body), attr

    def _weight_key(self) -> tuple:
        # the parameters looked up each time: one replaced by a new tensor is seen too
        return tuple((id(p), p._version, p.data_ptr()) for p in (getattr(m, attr) for m, attr in self._slots))

    def sync(self) -> None:
        """Take the body's weights again if any changed in place since the last copy."""
        key = self._weight_key()
        if key != self._key:
            self._take(key)

    def refresh(self) -> None:
        """Take the body's weights again (the generator took a new version)."""
        self._take(self._weight_key())

    @torch.no_grad()
    def _take(self, key: tuple) -> None:
        def w(module) -> torch.Tensor:  # what the layer computes with: rounded under emulation
            if parametrize.is_parametrized(module, "weight"):
                # computed from the stored weight, not read through parametrize's cache (which may
                # hold the previous version's rounding while a session runs)
                return module.parametrizations.weight().detach()
            return module.weight.detach()

        def b(module) -> torch.Tensor | None:
            return None if module.bias is None else module.bias.detach()

        # a linear layer's (weight [in, out], bias) as :func:`lp_addmm` takes them: under emulation
        # in the body dtype where the GEMMs run in it, else fp32 holding its values (the bias rounded
        # too, as the emulated layer rounds it); without emulation the fp32 weights
        d = self.dtype
        self._kernels = d is not None and low_precision_kernels(d, next(self.body.parameters()).device)

        def lin(weight: torch.Tensor, bias: torch.Tensor | None, *, rows_out: bool) -> _Linear:
            weight = weight.t() if rows_out else weight  # nn.Linear holds [out, in]
            if d is None:
                return _Linear(weight, bias)
            if self._kernels:
                weight = weight.to(d)
                return _Linear(weight, None if bias is None else bias.to(d), _packed(weight))
            return _Linear(weight, None if bias is None else bias.to(d).float())

        body = self.body
        if self.arch == "gpt2":
            self.embed = (w(body.wte), w(body.wpe))
            self.blocks = [
                (
                    (w(blk.ln_1), b(blk.ln_1)),
                    lin(w(blk.attn.c_attn), b(blk.attn.c_attn), rows_out=False),
                    lin(w(blk.attn.c_proj), b(blk.attn.c_proj), rows_out=False),
                    (w(blk.ln_2), b(blk.ln_2)),
                    lin(w(blk.mlp.c_fc), b(blk.mlp.c_fc), rows_out=False),
                    lin(w(blk.mlp.c_proj), b(blk.mlp.c_proj), rows_out=False),
                )
                for blk in body.h
            ]
            self.final = (w(body.ln_f), b(body.ln_f))
        else:
            self.embed = (w(body.embed_tokens),)
            self.blocks = []
            for lyr in body.layers:
                at, mlp = lyr.self_attn, lyr.mlp
                # q, k and v in one matmul: rows of the three weights stacked (the same products)
                wqkv = torch.cat([w(at.q_proj), w(at.k_proj), w(at.v_proj)])
                bqkv = None
                if at.q_proj.bias is not None:
                    bqkv = torch.cat([b(at.q_proj), b(at.k_proj), b(at.v_proj)])
                self.blocks.append(
                    (
                        w(lyr.input_layernorm),
                        lin(wqkv, bqkv, rows_out=True),
                        lin(w(at.o_proj), b(at.o_proj), rows_out=True),
                        w(lyr.post_attention_layernorm),
                        lin(torch.cat([w(mlp.gate_proj), w(mlp.up_proj)]), None, rows_out=True),
                        lin(w(mlp.down_proj), None, rows_out=True),
                    )
                )
            self.final = (w(body.norm),)
        self._key = key
        self.refreshes += 1

    # ------------------------------------------------------------------ pieces
    def _r(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to the body dtype (emulation; unchanged without). In place where the compiled
        rounding applies: every caller passes a fresh result or one it no longer reads unrounded."""
        d = self.dtype
        if d is None:
            return x
        if self._round is not None and kernels.usable(x):
            return self._round(x)
        return x.to(d).to(x.dtype)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # as the Qwen2 / Llama RMSNorm computes it (fp32 throughout here)
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.eps))

    def _embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        if self.arch == "gpt2":
            wte, wpe = self.embed
            return F.embedding(ids, wte) + F.embedding(pos, wpe), None
        h = F.embedding(ids, self.embed[0])
        cos, sin = self.body.rotary_emb(h, pos)  # the model's own: its scaling and dtype rules
        return h, (cos.unsqueeze(1), sin.unsqueeze(1))

    def _qkv(self, blk, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values [B, heads, T, head dim] of normed ``x`` [B, T, hidden]."""
        B, T, _ = x.shape
        D = self.head_dim
        qkv = self._linear(blk[1], x.reshape(B * T, -1)).view(B, T, -1)
        if self.arch == "gpt2":
            q, k, v = qkv.split(self.heads * D, dim=2)
        else:
            nq, nk = self.heads * D, self.kv_heads * D
            q, k, v = qkv.split((nq, nk, nk), dim=2)
        q = q.view(B, T, -1, D).transpose(1, 2)
        k = k.view(B, T, -1, D).transpose(1, 2)
        v = v.view(B, T, -1, D).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _out(self, blk, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The rest of a block after attention: output projection, residual, MLP, residual."""
        B, T, _ = h.shape
        r = self._r
        att = r(att.transpose(1, 2).reshape(B * T, -1))  # the projection's input rounded
        h = h + self._linear(blk[2], att).view(B, T, -1)
        if self.arch == "gpt2":
            lw, lb = blk[3]
            x = r(F.layer_norm(h, (h.shape[-1],), lw, lb, self.eps)).view(B * T, -1)
            x = self._linear(blk[4], x)  # rounded as its layer rounds it
            x = self._gelu(x) if self._gelu is not None else r(F.gelu(x))
            return h + self._linear(blk[5], x).view(B, T, -1)
        x = r(self._rms(h, blk[3])).view(B * T, -1)
        # gate and up: one GEMM, each output rounded as its layer rounds it
        gate, up = self._linear(blk[4], x).chunk(2, dim=-1)
        x = r(F.silu(gate) * up)
        return h + self._linear(blk[5], x).view(B, T, -1)

    def _linear(self, wb: _Linear, x: torch.Tensor) -> torch.Tensor:
        """A linear layer over ``x`` [rows, in] (an input the emulation has already rounded), as the
        emulated layer computes it (:func:`~scalerl.model.precision.lp_addmm`), or in fp32."""
        if self.dtype is None:
            return _mm(wb, x)
        if wb.packed is not None:
            return _mm(wb, x.to(self.dtype)).float()
        return lp_addmm(wb.bias, x.to(self.dtype) if self._kernels else x, wb.w, self.dtype, self._kernels)

    def _norm_in(self, blk, h: torch.Tensor) -> torch.Tensor:
        if self.arch == "gpt2":
            lw, lb = blk[0]
            return self._r(F.layer_norm(h, (h.shape[-1],), lw, lb, self.eps))
        return self._r(self._rms(h, blk[0]))

    def _final(self, h: torch.Tensor) -> torch.Tensor:
        if self.arch == "gpt2":
            lw, lb = self.final
            return self._r(F.layer_norm(h, (h.shape[-1],), lw, lb, self.eps))
        return self._r(self._rms(h, self.final[0]))

    def _attend(self, q, k, v, mask) -> torch.Tensor:
        gqa = self.kv_heads != self.heads
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def _kernels_apply(self) -> bool:
        if self.use_kernel is False or self.embed[0].device.type != "cpu":
            return False
        return self.use_kernel is True or torch.get_num_threads() == 1

    def fused_attention(self):
        """The compiled decode attention this forward uses now (None: the torch ops)."""
        return kernels.attention() if self._kernels_apply() else None

    def _choose(self) -> None:
        """The compiled rounding and GELU for the next forward (bf16 emulation only)."""
        on = self._kernels_apply() and self.dtype == torch.bfloat16
        self._round = kernels.round_bf16() if on else None
        self._gelu = kernels.gelu_bf16() if on and self.arch == "gpt2" else None

    # ------------------------------------------------------------------ forwards over slots
    def buffers(self, rows: int, capacity: int, old: list | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(keys, values)`` of at least ``[rows, kv heads, capacity, head dim]`` (of
        :meth:`kv_dtype`), the contents of ``old`` kept at their slots and positions (converted where
        the dtype changed). A new session (``old`` None) takes
        the buffers an ended session gave back where they are large enough: an evaluation's session
        is a few hundred MB of cache, whose fresh pages cost 0.1-0.8 s at every evaluation. Their
        old contents are finite values of earlier forwards (or zeros), which the torch ops' masked
        attention may read and the loops never do."""

        dtype = self.kv_dtype()

        def fits(kv: list | None) -> bool:
            return (
                bool(kv)
                and kv[0][0].shape[0] >= rows
                and kv[0][0].shape[2] >= capacity
                and kv[0][0].dtype == dtype
            )

        if old is None and fits(self._spare):
            old, self._spare = self._spare, None
        if fits(old):
            return old
        dev = self.embed[0].device
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        out = []
        for i in range(self.layers):
            k, v = torch.zeros(shape, dtype=dtype, device=dev), torch.zeros(shape, dtype=dtype, device=dev)
            if old:
                ok, ov = old[i]
                k[: ok.shape[0], :, : ok.shape[2]] = ok
                v[: ok.shape[0], :, : ok.shape[2]] = ov
            out.append((k, v))
        return out

    def kv_dtype(self) -> torch.dtype:
        """What the slot buffers hold keys and values as: bf16 where the decode runs in bf16 storage
        (:meth:`_in_bf16`, at head dim 32, the vector loops'), whose keys and values are bf16 values
        already, so the cache holds them exactly in half the bytes the attention loop reads; else
        fp32. Decided when :meth:`buffers` is called, as the forwards decide their path."""
        self._choose()
        held = self._in_bf16() and self.head_dim == 32 and kernels.attention_bf16_held() is not None
        return torch.bfloat16 if held else torch.float32

    def give_back(self, kv: list | None) -> None:
        """A session ended: keep its buffers for the next session (:meth:`buffers`), the larger of
        them and any kept before (one set is held at a time)."""
        if kv and (not self._spare or kv[0][0].numel() > self._spare[0][0].numel()):
            self._spare = kv

    @torch.no_grad()
    def hidden_states(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The last hidden states [P, L, hidden] of right-padded sequences ``ids`` [P, L], each real
        for its first ``lengths[p]`` positions: one forward from scratch, no cache (what a fresh
        prefill computes; the padding after a sequence never reaches it). The weights are taken
        again first if they changed."""
        self.sync()
        self._choose()
        P, L = ids.shape
        at = torch.arange(L, device=ids.device)
        valid = at[None, :] < torch.tensor(lengths, device=ids.device)[:, None]  # [P, L] real keys
        mask = (torch.ones(L, L, dtype=torch.bool, device=ids.device).tril()[None] & valid[:, None, :])[
            :, None
        ]
        h, rope = self._embed(ids, at.expand(P, L))
        for blk in self.blocks:
            q, k, v = self._qkv(blk, self._norm_in(blk, h), rope)
            h = self._out(blk, h, self._attend(q, k, v, mask))
        return self._final(h)

    @torch.no_grad()
    def prefill(self, kv, ids, pos, mask, dst, n: int) -> torch.Tensor:
        """Prompts ``ids`` [P, L] at positions ``pos`` with ``mask`` [P, 1, L, L] (bool); each
        prompt's keys and values written into its ``n`` slots of ``dst``. The last hidden states
        [P, L, hidden]."""
        self._choose()
        h, rope = self._embed(ids, pos)
        first = first_of_run(dst)
        for blk, (kb, vb) in zip(self.blocks, kv, strict=True):
            q, k, v = self._qkv(blk, self._norm_in(blk, h), rope)
            store_prompts(kb, dst, first, k, n)
            store_prompts(vb, dst, first, v, n)
            h = self._out(blk, h, self._attend(q, k, v, mask))
        return self._final(h)

    @torch.no_grad()
    def decode(self, kv, tok, pos, span: int, keymask) -> torch.Tensor:
        """One token per slot below ``hi`` = len(``tok``), each at its position ``pos`` [hi],
        attending over the first ``span`` positions under ``keymask`` [hi, 1, 1, span]. The
        hidden states [hi, hidden]."""
        hi = tok.shape[0]
        self._choose()
        fused = self.fused_attention()
        if fused is not None:
            # the loops index the buffers unchecked: the slots and positions must lie inside them
            top, low = (int(pos.max()), int(pos.min())) if hi else (0, 0)
            if hi > kv[0][0].shape[0] or top >= kv[0][0].shape[2] or low < 0:
                raise ValueError(
                    f"decode of {hi} slots to position {top} over buffers {tuple(kv[0][0].shape)}"
                )
            if self._in_bf16():
                return self._decode_bf16(kv, tok, pos)
            return self._decode_loops(kv, tok, pos, fused)
        h, rope = self._embed(tok[:, None], pos[:, None])
        H, G, D = self.heads, self.heads // self.kv_heads, self.head_dim
        rows = torch.arange(hi, device=tok.device)
        # one query per slot: attention as two batched matmuls under an additive key mask (torch's
        # fused CPU kernel is built for long queries and costs several times more here)
        bias = torch.zeros(keymask.shape, device=tok.device).masked_fill_(~keymask, float("-inf"))
        bias = bias.view(hi, 1, 1, span).expand(hi, self.kv_heads, G, span).reshape(-1, G, span)
        for blk, (kb, vb) in zip(self.blocks, kv, strict=True):
            q, k, v = self._qkv(blk, self._norm_in(blk, h), rope)
            kb[rows, :, pos] = k[:, :, 0]
            vb[rows, :, pos] = v[:, :, 0]
            keys = kb[:hi, :, :span].reshape(-1, span, D)  # [hi * kv heads, span, D]
            vals = vb[:hi, :, :span].reshape(-1, span, D)
            scores = torch.baddbmm(bias, q.reshape(-1, G, D), keys.transpose(1, 2), alpha=D**-0.5)
            att = torch.bmm(torch.softmax(scores, dim=-1), vals).view(hi, H, 1, D)
            h = self._out(blk, h, att)
        return self._final(h)[:, -1]

    def _decode_loops(self, kv, tok, pos, fused) -> torch.Tensor:
        """:meth:`decode` with the compiled attention (``fused``: scalerl.generator.kernels), which
        writes each slot's key and value and attends over keys 0..pos of that slot (``keymask``)."""
        hi = tok.shape[0]
        h, rope = self._embed(tok[:, None], pos[:, None])
        H, D = self.heads, self.head_dim
        p, scale = pos.numpy(), np.float32(D**-0.5)
        for blk, (kb, vb) in zip(self.blocks, kv, strict=True):
            q, k, v = self._qkv(blk, self._norm_in(blk, h), rope)
            att = torch.empty(hi, H, D)
            fused(
                *(t[:, :, 0].contiguous().numpy() for t in (q, k, v)),
                kb.numpy(),
                vb.numpy(),
                p,
                att.numpy(),
                scale,
            )
            h = self._out(blk, h, att.view(hi, H, 1, D))
        return self._final(h)[:, -1]

    def _in_bf16(self) -> bool:
        """Whether a decode step keeps its activations in bf16 storage between the linear layers
        (:meth:`_decode_bf16`): GPT-2 with its linear layers as bf16 GEMMs and the loops on."""
        return (
            self.arch == "gpt2"
            and self.dtype == torch.bfloat16
            and self._kernels
            and self._gelu is not None
            and kernels.attention_bf16() is not None
        )

    def _decode_bf16(self, kv, tok, pos) -> torch.Tensor:
        """:meth:`_decode_loops` for GPT-2 where the linear layers are bf16 GEMMs: every value the
        emulation rounds before a linear layer is held as bf16 (a layer norm's output converted once,
        the attention output rounded by its loop, the MLP's GELU applied over bf16 storage), and a
        GEMM's bf16 output is read as it is, so no fp32 copy is made, rounded and converted back
        between them. The residual stream stays fp32. The same numbers as :meth:`_decode_loops`
        (tested bit for bit), with about half the tensor ops a layer."""
        wte, wpe = self.embed
        h = F.embedding(tok, wte) + F.embedding(pos, wpe)  # [hi, hidden] fp32
        gelu, bf16 = kernels.gelu_bf16_storage(), self.dtype
        held = kv[0][0].dtype == torch.bfloat16  # the cache as bf16 (kv_dtype), or fp32
        attend = kernels.attention_bf16_held() if held else kernels.attention_bf16()
        store = kernels.bits16 if held else torch.Tensor.numpy
        p, scale, width = pos.numpy(), np.float32(self.head_dim**-0.5), (h.shape[-1],)
        att = torch.empty(h.shape, dtype=bf16)  # each layer's attention output, read before the next's
        for ((lw, lb), qkv_wb, out_wb, (lw2, lb2), fc_wb, proj_wb), (kb, vb) in zip(
            self.blocks, kv, strict=True
        ):
            qkv = _mm(qkv_wb, F.layer_norm(h, width, lw, lb, self.eps).to(bf16))
            attend(kernels.bits16(qkv), store(kb), store(vb), p, kernels.bits16(att), scale)
            h.add_(_mm(out_wb, att))  # fp32 += bf16 in place (h is this call's own tensor): the same sums
            x = gelu(_mm(fc_wb, F.layer_norm(h, width, lw2, lb2, self.eps).to(bf16)))
            h.add_(_mm(proj_wb, x))
        lw, lb = self.final
        return self._r(F.layer_norm(h, width, lw, lb, self.eps))


def first_of_run(dst: torch.Tensor) -> int | None:
    """The first of the slots ``dst`` where they are consecutive and ascending (a prefill's usual
    slots: taken from the lowest free ones), else None."""
    n = dst.shape[0]
    if n == 0:
        return None
    first = int(dst[0])
    if n > 1 and not torch.equal(dst, torch.arange(first, first + n, device=dst.device)):
        return None
    return first


def store_prompts(buf: torch.Tensor, dst: torch.Tensor, first: int | None, x: torch.Tensor, n: int) -> None:
    """Prompt ``p``'s keys or values ``x[p]`` [heads, L, head dim] into ``buf`` [slots, heads,
    capacity, head dim] at positions 0..L-1 of its ``n`` slots ``dst[p*n:(p+1)*n]`` (values of
    another dtype rounded as ``.to`` rounds them; a bf16 decode's keys and values are bf16 values,
    which a bf16 cache takes exactly). Consecutive slots (``first``, :func:`first_of_run`) take one
    strided copy broadcast over the ``n``, without the indexed write's gather of ``x`` repeated
    (which the others take); the same values either way. The lean decode's prefill and the slot
    cache's transformers layers (:mod:`scalerl.generator.slots`) both store through it."""
    L = x.shape[2]
    if first is not None:
        rows = buf[first : first + dst.shape[0]]
        rows.unflatten(0, (x.shape[0], n))[:, :, :, :L].copy_(x[:, None])
    else:
        buf[dst, :, :L] = (x if n == 1 else x.repeat_interleave(n, 0)).to(buf.dtype)


class _Linear(NamedTuple):
    """A linear layer as the lean forward holds it: ``w`` [in, out], ``bias`` [out] or None, and
    where its GEMMs run in bf16, ``w`` packed in oneDNN's layout (:func:`_packed`)."""

    w: torch.Tensor
    bias: torch.Tensor | None
    packed: torch.Tensor | None = None


def _mm(wb: _Linear, x: torch.Tensor) -> torch.Tensor:
    """``x @ w + bias`` in the tensors' dtype: through the packed weight where there is one."""
    if wb.packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, wb.packed, wb.bias, "none", [], "")
    return torch.mm(x, wb.w) if wb.bias is None else torch.addmm(wb.bias, x, wb.w)


def _packed(w: torch.Tensor) -> torch.Tensor | None:
    """``w`` [in, out] (bf16, a CPU) packed once for oneDNN's linear, or None where the packed GEMM
    is not :func:`_packed_gemm_exact` here. A small GEMM through ``addmm`` re-lays the weight out at
    every call; packed at each weight version it costs about a quarter less at decode shapes
    (``benchmarks/results``), with the same kernel and so the same bits."""
    if not _packed_gemm_exact():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), _PACK_ROWS)


_PACK_ROWS = 128  # the batch the packing is laid out for (any batch runs; a decode step's rows)


@functools.cache
def _packed_gemm_exact() -> bool:
    """Whether this torch has oneDNN's packed linear and it gives ``addmm``'s bits, on a probe of
    the decode's shapes (checked once a process: a torch without the private ops, or whose packed
    kernel differs, keeps ``addmm``)."""
    try:
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*s, generator=g).to(torch.bfloat16) for s in ((37, 128), (128, 384), (384,)))
        packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), _PACK_ROWS)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        return torch.equal(got, torch.addmm(b, x, w))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
