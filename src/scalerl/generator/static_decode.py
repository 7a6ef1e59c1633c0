"""Decode steps of fixed shape, replayed as a CUDA graph (``generator.static_cache``).

The HF generator's decode loop runs one forward pass per token: a few hundred kernels launched from
Python, each with little work for a small model, over a KV cache that grows. Here every decode step
has the same shapes: the KV cache is preallocated for ``capacity`` positions of ``B`` rows, each
step writes its keys and values at one position given by a device tensor, and attends over the
whole capacity under a key mask (positions not yet written are masked). A step is then captured
once as a CUDA graph and replayed: one launch for the whole step. Grouped KV heads are attended to
as they are, not repeated in memory (:func:`_install_gqa_sdpa`). The prompts' prefill runs eagerly
into the same cache, one row per sample (not once per prompt, as the default cache does).
``benchmarks/bench_static_decode.py`` measures it against the default cache.

Off a GPU the same steps run eagerly (no graph): the path the CPU tests compare with the default
cache. The graph reads the model's parameters where they are; weights replaced in place (the
trainer's optimizer, in-flight updates) are seen by the next replay, and parameters that moved
(another storage) make the generator capture again.

A model trained in native low precision keeps fp32 master weights and runs its body under
``torch.autocast``, which casts every matrix weight to the body dtype at every forward: inside a
captured step (where autocast's cache is off) that is every replay. :class:`LowPrecisionCopy` holds
the body's matrix weights already cast, refreshed once per batch and at each in-flight weight update
(:meth:`LowPrecisionCopy.refresh`); the decoder runs a body that reads them, under the same autocast.
Casting once or at every step rounds the same way, so the log-probs are the same bits.
"""

from __future__ import annotations

import copy
import threading
import warnings
from typing import Any

import torch

from scalerl.model.kv_cache import cached_hidden, decoder

_ROUND = 64  # capacities are rounded up to this many positions, so that most batches reuse a graph
_local = threading.local()  # .gqa: a static decoder's forward runs in this thread


def _install_gqa_sdpa() -> None:
    """transformers' ``sdpa`` attention repeats the KV heads in memory whenever a mask is given (a
    copy of a layer's whole cache at every step: the largest GPU cost of a static decode step for a
    model with few KV heads). While a static decoder runs its forward (this thread only), call torch's
    attention with ``enable_gqa`` instead; otherwise, and for models without grouped KV heads, the
    original function runs unchanged. Registered once, through transformers' ``AttentionInterface``."""
    from transformers import AttentionInterface

    orig = AttentionInterface._global_mapping.get("sdpa")
    if orig is None or getattr(orig, "_scalerl_gqa", False):
        return

    def sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if (
            getattr(_local, "gqa", False)
            and getattr(module, "num_key_value_groups", 1) > 1
            and not dropout
            and attention_mask is not None
        ):
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
            )
            return out.transpose(1, 2).contiguous(), None
        return orig(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )

    sdpa._scalerl_gqa = True
    AttentionInterface.register("sdpa", sdpa)


# torch's attention takes grouped KV heads itself (``enable_gqa``) from 2.5 on
_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def supported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot decode over a static cache here (None: it can)."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return "transformers before 4.56 has no cache layers"
    if getattr(DynamicCache(), "layer_class_to_replicate", None) is not DynamicLayer:
        return "this transformers version's DynamicCache takes no custom layers"
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("sdpa", None):
        return f"attention implementation {impl!r} (the static cache's boolean mask needs sdpa)"
    return None


def _matrix_modules(body: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``body`` whose weights autocast casts to the low dtype: linear layers
    (``nn.Linear``; GPT-2's ``Conv1D``, an ``addmm``). Norms and embeddings run in fp32 under
    autocast and are left as they are."""
    kinds: tuple[type, ...] = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        kinds += (Conv1D,)
    except ImportError:
        pass
    return [m for m in body.modules() if isinstance(m, kinds)]


class LowPrecisionCopy:
    """A decoder body whose matrix weights (and their biases) are held in ``dtype``, for a model
    whose fp32 master weights autocast would cast at every forward. The copy shares every other
    parameter and buffer's storage with ``body`` (norms, embeddings: no second fp32 copy) and is
    never trained; :meth:`refresh` casts the master weights into it in place (the tensors a captured
    graph reads stay where they are). Its matrix weights hold nothing until the first refresh, which
    its owner runs before every batch. ``refreshes`` counts the refreshes (tests)."""

    def __init__(self, body: torch.nn.Module, dtype: torch.dtype):
        mats = _matrix_modules(body)
        cast = {id(p) for m in mats for p in m.parameters(recurse=False)}
        memo: dict[int, Any] = {}
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for p in body.parameters():
            if id(p) in cast:
                low = torch.nn.Parameter(torch.empty_like(p, dtype=dtype), requires_grad=False)
                memo[id(p)] = low
                self.pairs.append((low, p))
            else:
                memo[id(p)] = p  # shared: the copy reads the master tensor
        for b in body.buffers():
            memo[id(b)] = b
        self.body = copy.deepcopy(body, memo)
        self.body.eval()
        self.refreshes = 0

    @torch.no_grad()
    def refresh(self) -> None:
        for low, master in self.pairs:
            low.copy_(master)
        self.refreshes += 1


def low_precision_copy(model: torch.nn.Module) -> LowPrecisionCopy | None:
    """The copy for ``model``'s body where its forward runs under autocast over fp32 master weights
    (:meth:`~scalerl.model.precision.Precision.prepare`); None elsewhere (fp32, emulated or an
    inference-only model already cast)."""
    dtype = getattr(model, "_scalerl_autocast", None)
    if dtype is None:
        return None
    body = decoder(model)
    return LowPrecisionCopy(body, dtype)


def capacity_for(needed: int) -> int:
    return -(-needed // _ROUND) * _ROUND


class StaticDecoder:
    """Prefill and decode ``B`` rows over a KV cache of ``capacity`` positions.

    ``prefill(ids, pmask, pos)`` feeds the prompts ([B, L], one row per sequence, left-padded with
    ``pmask``, positions ``pos``) and returns the [B, vocab] log-probs of the first token;
    ``step(tok)`` feeds one token per row at cache position ``L + i`` (``i``: the steps since the
    prefill), each row's position one past its last, and returns the next log-probs.
    ``logprobs_of(hidden)`` turns the last hidden state into log-probs (the generator's precision
    and temperature).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        logprobs_of,
        autocast,
        B: int,
        capacity: int,
        device,
        graph: bool,
        low: LowPrecisionCopy | None = None,
    ):
        self.model = model
        # the body the steps run: the low-precision copy where one is given (refreshed by its owner)
        self.body = low.body if low is not None else decoder(model)
        self.logprobs_of = logprobs_of
        self.autocast = autocast
        self.B, self.capacity = int(B), int(capacity)
        self.device = torch.device(device)
        self.graph_wanted = bool(graph) and self.device.type == "cuda"
        self.graph: Any = None
        self._ptrs: tuple[int, ...] = ()  # the parameters' storage the graph was captured with
        self._ptrs_now: tuple[int, ...] = ()
        if _GQA:
            _install_gqa_sdpa()
        dev = self.device
        self.write_at = torch.zeros(1, dtype=torch.long, device=dev)  # the cache position written next
        self.keymask = torch.zeros((self.B, self.capacity), dtype=torch.bool, device=dev)
        self.tok = torch.zeros((self.B, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((self.B, 1), dtype=torch.long, device=dev)
        self.cache = _static_cache(self.capacity, self.write_at)
        self.L = 0
        self.n_steps = 0
        self.out: torch.Tensor | None = None

    def fits(self, B: int, needed: int) -> bool:
        return B == self.B and needed <= self.capacity

    # ------------------------------------------------------------------ prefill and steps
    def prefill(
        self, ids: torch.Tensor, pmask: torch.Tensor | None, pos: torch.Tensor | None
    ) -> torch.Tensor:
        B, L = ids.shape
        if B != self.B or L >= self.capacity:
            raise ValueError(
                f"static decoder of {self.B} rows x {self.capacity} positions got prompts {B} x {L}"
            )
        self.L, self.n_steps = L, 0
        self.keymask.zero_()
        self.keymask[:, :L] = True if pmask is None else pmask.bool()
        if pos is None:
            pos = torch.arange(L, device=self.device).expand(B, L)
        # causal within the prompt, padding masked; each position also sees itself, so that a padded
        # position's state stays finite (a row that attends to nothing would be NaN, and NaN values
        # in the cache poison the masked sums of every later step)
        causal = torch.ones((L, self.capacity), dtype=torch.bool, device=self.device).tril()
        mask = (self.keymask[:, None, :] & causal[None]) | torch.eye(
            L, self.capacity, dtype=torch.bool, device=self.device
        )[None]
        self.write_at.zero_()
        if self.graph_wanted:  # where the parameters are now (weights change in place while decoding)
            self._ptrs_now = self._param_ptrs()
        hidden = self._forward(ids, mask[:, None], pos)
        self.pos.copy_(pos[:, -1:])
        return self.logprobs_of(hidden)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """The next log-probs after feeding ``tok`` ([B]) at the next position of every row."""
        at = self.L + self.n_steps
        if at >= self.capacity:
            raise ValueError(f"static decoder: position {at} is past its capacity {self.capacity}")
        self.n_steps += 1
        self.tok.copy_(tok[:, None])
        self.pos.add_(1)
        self.keymask[:, at] = True
        self.write_at.fill_(at)
        if not self.graph_wanted:
            return self._decode_fn()
        if self.graph is None or self._ptrs_now != self._ptrs:
            try:
                self._capture(self._ptrs_now)
            except Exception as e:  # a model whose forward cannot be captured: decode eagerly
                warnings.warn(
                    f"generator.static_cache: a decode step could not be captured as a CUDA graph "
                    f"({type(e).__name__}: {e}); decoding without a graph",
                    stacklevel=2,
                )
                self.graph_wanted, self.graph, self.out = False, None, None
                return self._decode_fn()
        self.graph.replay()
        return self.out

    # ------------------------------------------------------------------ internals
    def _forward(self, ids: torch.Tensor, mask4: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        _local.gqa = _GQA
        try:
            with self.autocast():
                hidden = cached_hidden(self.body, self.cache, ids, mask4, pos)
        finally:
            _local.gqa = False
        return hidden[:, -1]

    def _decode_fn(self) -> torch.Tensor:
        return self.logprobs_of(self._forward(self.tok, self.keymask[:, None, None, :], self.pos))

    def _param_ptrs(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def _capture(self, ptrs: tuple[int, ...]) -> None:
        """Capture one decode step (the current one: warming up and capturing rewrite the same cache
        position with the same values, so this step's result is unchanged)."""
        self.graph = self.out = None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy allocations, cuBLAS workspaces
                self._decode_fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out = self._decode_fn()
        self.graph, self._ptrs = graph, ptrs


def _static_cache(capacity: int, write_at: torch.Tensor):
    """A ``DynamicCache`` whose layers hold [B, heads, capacity, dim] buffers: each update writes its
    keys and values at positions ``write_at, write_at + 1, ...`` and returns the whole buffers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class _StaticLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                B, H, _, D = key_states.shape
                self.keys = key_states.new_zeros((B, H, capacity, D))
                self.values = value_states.new_zeros((B, H, capacity, value_states.shape[-1]))
            idx = write_at + torch.arange(key_states.shape[-2], device=write_at.device)
            self.keys.index_copy_(2, idx, key_states.to(self.keys.dtype))
            self.values.index_copy_(2, idx, value_states.to(self.values.dtype))
            return self.keys, self.values

    cache = DynamicCache()
    cache.layer_class_to_replicate = _StaticLayer
    return cache
