"""A slot-based KV cache: ``rows`` slots of ``capacity`` positions, each slot its own sequence.

The batched KV cache of :mod:`scalerl.generator.hf` (and the static one of
:mod:`scalerl.generator.static_decode`) keeps every row at the same position: rows start together
and the batch ends with its longest. Here each slot has its own length, so a sequence can start in
a free slot while the others keep decoding, and a finished one frees its slot at once (continuous
generation, :class:`~scalerl.generator.base.GenerationSession`).

The interface, meant to be reused by a fused decode path (a hand-written attention over the same
buffers):

* :meth:`SlotCache.alloc` / :meth:`SlotCache.release`: take and give back slots (lowest first, so
  the occupied slots stay packed at the front and a decode step runs over ``[0, hi)`` only);
* :meth:`SlotCache.prefill`: write prompts into slots (one forward over the distinct prompts,
  right-padded; each prompt's keys and values copied into its ``n`` slots), their last hidden state;
* :meth:`SlotCache.decode`: one token for every slot below :attr:`SlotCache.hi`, written at that
  slot's own position and attending over its own positions only (a key mask per slot, over the
  positions up to the longest slot's, not the whole capacity); free slots are fed too (their
  writes land at their position 0 and are overwritten when the slot is taken).

Buffers are ``[rows, kv heads, capacity, head dim]`` per layer, allocated at the first forward and
grown (copied) when more slots or positions are asked for. The layers plug into a transformers
``DynamicCache`` (``layer_class_to_replicate``), so the model's own attention runs over them.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from scalerl.generator.lean import first_of_run, store_prompts
from scalerl.model.kv_cache import cached_hidden


class _Control:
    """What the next forward writes: ``("decode", hi, pos)`` or ``("prefill", dst, n)``."""

    def __init__(self, rows: int, capacity: int):
        self.rows, self.capacity = rows, capacity
        self.mode: tuple = ()


def _slot_cache(ctl: _Control):
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class _SlotLayer(DynamicLayer):
        kbuf: torch.Tensor | None = None
        vbuf: torch.Tensor | None = None

        def _fit(self, key_states, value_states) -> None:
            k = self.kbuf
            if k is not None and k.shape[0] >= ctl.rows and k.shape[2] >= ctl.capacity:
                return
            H, D, Dv = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
            kbuf = key_states.new_zeros((ctl.rows, H, ctl.capacity, D))
            vbuf = value_states.new_zeros((ctl.rows, H, ctl.capacity, Dv))
            if k is not None:  # grown: the old contents keep their slots and positions
                kbuf[: k.shape[0], :, : k.shape[2]] = k
                vbuf[: k.shape[0], :, : k.shape[2]] = self.vbuf
            self.kbuf, self.vbuf = kbuf, vbuf

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self._fit(key_states, value_states)
            kind = ctl.mode[0]
            if kind == "decode":
                _, hi, pos, span = ctl.mode
                rows = torch.arange(hi, device=pos.device)
                self.kbuf[rows, :, pos] = key_states[:, :, 0].to(self.kbuf.dtype)
                self.vbuf[rows, :, pos] = value_states[:, :, 0].to(self.vbuf.dtype)
                # only the positions some slot holds: attention costs the longest row, not capacity
                self.keys, self.values = self.kbuf[:hi, :, :span], self.vbuf[:hi, :, :span]
                return self.keys, self.values
            _, dst, n = ctl.mode  # prefill: attention within the prompts, then copied into the slots
            first = first_of_run(dst)
            store_prompts(self.kbuf, dst, first, key_states, n)
            store_prompts(self.vbuf, dst, first, value_states, n)
            self.keys, self.values = key_states, value_states
            return key_states, value_states

    cache = DynamicCache()
    cache.layer_class_to_replicate = _SlotLayer
    return cache


class SlotCache:
    """``rows`` slots of ``capacity`` positions over ``body`` (a transformers decoder); forwards run
    under ``autocast()`` (the generator's precision)."""

    def __init__(self, body: torch.nn.Module, rows: int, capacity: int, device, autocast=None, lean=None):
        self.body = body
        # a :class:`~scalerl.generator.lean.LeanModel`: the forwards run over its tensors and the
        # buffers below (per layer keys and values), not through ``body``'s modules
        self.lean = lean
        self._kv: list | None = None
        self.device = torch.device(device)
        self.autocast = autocast or nullcontext
        self.ctl = _Control(int(rows), int(capacity))
        self.cache = _slot_cache(self.ctl)
        self.length = torch.zeros(int(rows), dtype=torch.long, device=self.device)  # positions held
        self.used = torch.zeros(int(rows), dtype=torch.bool, device=self.device)
        self._free = list(range(int(rows)))

    @property
    def rows(self) -> int:
        return self.ctl.rows

    @property
    def capacity(self) -> int:
        return self.ctl.capacity

    @property
    def hi(self) -> int:
        """One past the highest slot in use (0: none)."""
        idx = self.used.nonzero()
        return int(idx[-1]) + 1 if idx.numel() else 0

    # ------------------------------------------------------------------ slots
    def grow(self, rows: int | None = None, capacity: int | None = None) -> None:
        """At least ``rows`` slots and ``capacity`` positions (the buffers follow at the next forward)."""
        rows = max(self.rows, int(rows or 0))
        if rows > self.rows:
            extra = rows - self.rows
            self._free = sorted(self._free + list(range(self.rows, rows)))
            self.length = torch.cat([self.length, self.length.new_zeros(extra)])
            self.used = torch.cat([self.used, self.used.new_zeros(extra)])
            self.ctl.rows = rows
        self.ctl.capacity = max(self.capacity, int(capacity or 0))

    def alloc(self, k: int) -> list[int]:
        """``k`` free slots (the lowest ones; more slots are made when too few are free)."""
        if k > len(self._free):
            self.grow(rows=self.rows + k - len(self._free))
        got, self._free = self._free[:k], self._free[k:]
        idx = torch.tensor(got, dtype=torch.long, device=self.device)
        self.used[idx] = True
        self.length[idx] = 0
        return got

    def release(self, slots: list[int]) -> None:
        if not slots:
            return
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.used[idx] = False
        self.length[idx] = 0
        self._free = sorted(self._free + list(slots))

    # ------------------------------------------------------------------ forwards
    def prefill(self, slots: list[int], ids: list[list[int]], n: int = 1, pad_id: int = 0) -> torch.Tensor:
        """Write ``ids`` (one list per distinct prompt; prompt ``i`` into ``slots[i*n:(i+1)*n]``) and
        return the hidden state after each prompt's last token, ``[len(ids) * n, hidden]``."""
        lens = [len(x) for x in ids]
        L = max(lens)
        self.grow(capacity=L + 1)
        dev = self.device
        inp = torch.full((len(ids), L), pad_id, dtype=torch.long, device=dev)
        for i, x in enumerate(ids):  # right-padded: each prompt at positions 0..len-1 of its slots
            inp[i, : len(x)] = torch.tensor(x, dtype=torch.long, device=dev)
        lens_t = torch.tensor(lens, dtype=torch.long, device=dev)
        keys = torch.arange(L, device=dev)
        # causal, and padded keys hidden; a padded query still sees the prompt (never nothing: NaN)
        mask = (keys[None, :] <= keys[:, None])[None] & (keys[None, None, :] < lens_t[:, None, None])
        pos = keys[None].expand(len(ids), L)
        dst = torch.tensor(slots, dtype=torch.long, device=dev)
        if self.lean is not None:
            hidden = self.lean.prefill(self._lean_kv(), inp, pos, mask[:, None], dst, int(n))
        else:
            self.ctl.mode = ("prefill", dst, int(n))
            hidden = self._forward(inp, mask[:, None], pos)
        last = hidden[torch.arange(len(ids), device=dev), lens_t - 1]
        self.length[dst] = lens_t if n == 1 else lens_t.repeat_interleave(n)
        return last if n == 1 else last.repeat_interleave(n, 0)

    def decode(self, tok: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed ``tok`` ([hi]) to the slots below :attr:`hi`, each at its own next position; the
        lengths of the ``live`` slots ([hi] bool: those decoding) advance. Returns ``[hi, hidden]``."""
        hi = tok.shape[0]
        pos = self.length[:hi]
        span = int(pos.max()) + 1 if hi else 1
        if span > self.capacity:
            self.grow(capacity=span)
        keymask = torch.arange(span, device=self.device)[None, :] <= pos[:, None]
        if self.lean is not None:
            hidden = self.lean.decode(self._lean_kv(), tok, pos, span, keymask[:, None, None, :])
            self.length[:hi] += live.long()
            return hidden
        self.ctl.mode = ("decode", hi, pos, span)
        hidden = self._forward(tok[:, None], keymask[:, None, None, :], pos[:, None])
        self.length[:hi] += live.long()
        return hidden[:, -1]

    def close(self) -> None:
        """The session is done with its slots: the lean forward's buffers go back to it for the
        next session (:meth:`~scalerl.generator.lean.LeanModel.give_back`)."""
        if self.lean is not None and self._kv is not None:
            self.lean.give_back(self._kv)
        self._kv = None

    def _lean_kv(self) -> list:
        """The lean forward's buffers, at the current rows and capacity (grown, contents kept)."""
        self._kv = self.lean.buffers(self.rows, self.capacity, self._kv)
        return self._kv

    def _forward(self, ids: torch.Tensor, mask4: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            hidden = cached_hidden(self.body, self.cache, ids, mask4, pos)
        self.ctl.mode = ()
        return hidden

    def state(self) -> dict[str, Any]:
        """Sizes, for tests and benchmarks."""
        return {"rows": self.rows, "capacity": self.capacity, "used": int(self.used.sum())}
