"""Batched sampling over a transformers causal LM with a KV cache.

All ``len(prompts) * n`` sequences are decoded together, one token per step. Per-row state
(finished, thinking / answering, budgets, the position inside a forced phrase) lives in tensors, so
a step costs one forward pass plus a fixed number of batched tensor ops whatever the batch size.

* Behaviour log-probs come from :class:`~scalerl.model.precision.Precision` (``logits`` and
  ``log_softmax`` of the last hidden state), the same functions the trainer uses, so generator and
  trainer agree on what ``pi_gen`` means (FP32 LM head or not).
* Prompts of equal token length (the embedded task) are fed without an attention mask (the mask
  costs a lot on CPU); otherwise they are left-padded, with an attention mask and explicit
  ``position_ids`` so that every row sees the positions it would see alone.
* Each prompt is prefilled once and its KV cache repeated for its ``n`` samples.
* In-flight weight updates (PipelineRL): ``weight_update()`` is called before the forward pass that
  produces each new token; when it returns a version the caller has replaced the weights in place,
  and the following tokens are recorded with that version. The KV cache is kept (stale), as in
  PipelineRL.
* Length control (ScaleRL interruptions): see :class:`HFGenerator`.
* Finished rows leave the KV cache once they are half of it (a batch often waits on a few long
  samples); sampling still runs over all rows, so the random stream and the samples are unchanged.
* Emulated low-precision weights are rounded once per weight version, not at every decode step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from scalerl.config.options import options
from scalerl.generator.base import Generator, encode_prompt
from scalerl.generator.sample import Sample
from scalerl.generator.staleness import measure_stale_kv
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights


def _field(cfg: Any, name: str, default: Any) -> Any:
    value = getattr(cfg, name, default)
    return default if value is None else value


class HFGenerator(Generator):
    """Sample ``n`` completions per prompt from a transformers model, recording behaviour log-probs.

    Length control, per sequence (``length_control.name``):

    * ``none`` / ``length_penalty``: sample until eos or ``max_new_tokens`` sampled tokens
      (``truncated`` if no eos). The length penalty itself is a reward term applied by the loop.
    * ``interruption``: each sequence draws a thinking budget ``b`` uniformly in
      ``[think_budget_min, think_budget_max]``. If ``</think>`` was not sampled within ``b`` tokens,
      the tokens of ``phrase`` are forced in one per step (fed to the model, log-prob 0.0,
      version -1, mask 0; ``interrupted``). After ``</think>`` (sampled, or the end of the phrase) at
      most ``answer_budget`` more tokens are sampled (eos included); no eos by then: ``truncated``.
      ``max_new_tokens`` caps the sampled tokens overall.

    ``temperature <= 0`` means greedy decoding; the recorded log-probs are then those at
    temperature 1.

    Weights: a generator built over the trainer's own module samples from it directly
    (:meth:`load_weights` then records the version only); one built over a model of its own copies
    the new weights into it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        precision: Precision,
        length_control: Any,
        *,
        temperature: float = 1.0,
        device: torch.device | str = "cpu",
        seed: int = 0,
        stale_kv_samples: int = 4,
    ):
        self.device = torch.device(device)
        self.stale_kv_samples = int(stale_kv_samples)
        self.model = precision.prepare(model)
        self.tokenizer = tokenizer
        self.precision = precision
        self.temperature = float(temperature)

        lc = length_control
        self.mode = str(_field(lc, "name", "none"))
        if self.mode not in options("length_control"):
            known = ", ".join(options("length_control"))
            raise ValueError(f"length_control.name must be one of {known}, got {self.mode!r}")
        self.max_new_tokens = int(_field(lc, "max_new_tokens", 64))
        if self.max_new_tokens < 1:
            raise ValueError("length_control.max_new_tokens must be >= 1")
        self.think_budget_min = int(_field(lc, "think_budget_min", 0))
        self.think_budget_max = int(_field(lc, "think_budget_max", 0))
        self.answer_budget = int(_field(lc, "answer_budget", 0))
        self.phrase = str(_field(lc, "phrase", ""))

        self.eos_id = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.eos_id if self.eos_id is not None else 0))
        self.think_end_id = _single_token_id(tokenizer, "</think>")

        self.phrase_ids: list[int] = []
        if self.mode == "interruption":
            if not 0 <= self.think_budget_min <= self.think_budget_max:
                raise ValueError("interruption needs 0 <= think_budget_min <= think_budget_max")
            if self.answer_budget < 0:
                raise ValueError("interruption needs answer_budget >= 0")
            self.phrase_ids = list(tokenizer(self.phrase, add_special_tokens=False)["input_ids"])
            if not self.phrase_ids:
                raise ValueError("length_control.phrase is empty: interruption needs a phrase to force in")
        self._phrase = torch.tensor(self.phrase_ids or [self.pad_id], dtype=torch.long, device=self.device)

        self.seed = seed
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(seed)
        self.version = 0
        # speed-ups, on by default (switches for benchmarks): finished rows leave the KV cache once
        # they are half of it and it holds at least this many; emulated low-precision weights are
        # rounded once per weight version
        self.compact_min_rows = _COMPACT_MIN_ROWS
        self.cache_rounded_weights = True

    # ------------------------------------------------------------------ Generator interface
    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        if weights.module is not self.model:
            tensors = weights.tensors()
            with torch.no_grad():
                self.model.load_state_dict(tensors, strict=True)
        self.version = int(version)

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Any],
        n: int,
        *,
        version: int,
        group_ids: list[int] | None = None,
        weight_update: Callable[[], int | None] | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt (objects with ``.uid`` and ``.text``); groups in prompt order."""
        if not prompts:
            return []
        if n < 1:
            raise ValueError("n must be >= 1")
        if group_ids is None:
            group_ids = list(range(len(prompts)))
        if len(group_ids) != len(prompts):
            raise ValueError("group_ids must have one id per prompt")
        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]

        was_training = self.model.training
        self.model.eval()
        try:
            with _CachedWeights(self.model, enabled=self.cache_rounded_weights) as cached:
                out = self._decode(prompt_ids, n, version, weight_update, on_step, cached)
        finally:
            self.model.train(was_training)
        groups = self._to_samples(prompts, prompt_ids, group_ids, n, out)
        if weight_update is not None:
            measure_stale_kv(
                self.model, self.precision, self.temperature, groups, self.version, self.stale_kv_samples
            )
        return groups

    # ------------------------------------------------------------------ internals
    def _logprobs(self, input_ids, cache, attention_mask=None, position_ids=None) -> torch.Tensor:
        body = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        with self.precision.autocast(self.model):
            out = body(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
        logits = self.precision.logits(self.model, out.last_hidden_state[:, -1])
        temperature = self.temperature if self.temperature > 0 else 1.0
        return self.precision.log_softmax(logits, temperature)

    def _sample(self, logp: torch.Tensor) -> torch.Tensor:
        if self.temperature <= 0:
            return logp.argmax(-1)
        # exponential race (= Gumbel-max): argmax(log p - log E), E ~ Exp(1), samples from p
        e = torch.empty(logp.shape, dtype=torch.float32, device=logp.device).exponential_(generator=self.rng)
        return (logp.float() - e.log()).argmax(-1)

    def _decode(self, prompt_ids, n, version, weight_update, on_step, cached=None) -> dict[str, Any]:
        dev = self.device
        P, B = len(prompt_ids), len(prompt_ids) * n
        lens = [len(ids) for ids in prompt_ids]
        L = max(lens)
        interrupt = self.mode == "interruption"
        n_phrase = len(self.phrase_ids)
        max_steps = self.max_new_tokens + (n_phrase if interrupt else 0)

        # ---- per-row state
        if interrupt:
            budget = torch.randint(
                self.think_budget_min, self.think_budget_max + 1, (B,), generator=self.rng, device=dev
            )
            answer_budget = self.answer_budget
        else:
            budget = torch.full((B,), max_steps + 1, dtype=torch.long, device=dev)
            answer_budget = max_steps + 1
        zeros_b = torch.zeros(B, dtype=torch.bool, device=dev)
        done, eos_hit, truncated, answering, interrupted = (zeros_b.clone() for _ in range(5))
        n_sampled = torch.zeros(B, dtype=torch.long, device=dev)
        n_think = torch.zeros_like(n_sampled)
        n_answer = torch.zeros_like(n_sampled)
        force_idx = torch.full((B,), -1, dtype=torch.long, device=dev)
        eos_id = -1 if self.eos_id is None else int(self.eos_id)
        think_end_id = -1 if self.think_end_id is None else int(self.think_end_id)

        # ---- prefill each distinct prompt once, then repeat its cache for its n samples
        cache = _make_cache(L + max_steps)
        same_length = all(x == L for x in lens)
        if same_length:
            ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
            pmask = prefill_pos = mask_full = next_pos = None
        else:
            ids = torch.full((P, L), self.pad_id, dtype=torch.long, device=dev)
            pmask = torch.zeros((P, L), dtype=torch.long, device=dev)
            for i, row in enumerate(prompt_ids):
                ids[i, L - len(row) :] = torch.tensor(row, dtype=torch.long, device=dev)
                pmask[i, L - len(row) :] = 1
            prefill_pos = (pmask.cumsum(-1) - 1).clamp_min(0)
            mask_full = torch.ones((B, L + max_steps), dtype=torch.long, device=dev)
            mask_full[:, :L] = pmask.repeat_interleave(n, 0)
            next_pos = torch.tensor(lens, dtype=torch.long, device=dev).repeat_interleave(n)

        toks, lps, sampled_steps, active_steps, step_versions = [], [], [], [], []
        tok = torch.empty(0, dtype=torch.long, device=dev)  # the tokens fed at the next step
        # rows still in the KV cache (None: all B). Finished rows are dropped from the cache once they
        # are half of it; the others' log-probs are scattered back into a [B, vocab] tensor, so the
        # sampling (and its random stream) is the same as without the compaction.
        rows = None
        for step in range(max_steps):
            if weight_update is not None:
                new_version = weight_update()
                if new_version is not None:
                    version = self.version = int(new_version)
                    if cached is not None:
                        cached.refresh()  # the weights were replaced in place
            if step == 0:
                logp = self._logprobs(ids, cache, pmask, prefill_pos)
                if n > 1:
                    cache.batch_repeat_interleave(n)
                    logp = logp.repeat_interleave(n, 0)
            else:
                inp = tok[:, None] if rows is None else tok[rows, None]
                if same_length:
                    logp = self._logprobs(inp, cache)
                else:
                    mask_now = mask_full[:, : L + step] if rows is None else mask_full[rows, : L + step]
                    pos_now = next_pos if rows is None else next_pos[rows]
                    logp = self._logprobs(inp, cache, mask_now, pos_now[:, None])
                    next_pos = next_pos + 1
                if rows is not None:
                    full = logp.new_zeros((B, logp.shape[-1]))
                    full[rows] = logp
                    logp = full

            tok = self._sample(logp)
            lp = logp.gather(1, tok[:, None]).squeeze(1).float()
            active = ~done

            if interrupt:
                start = active & ~answering & (force_idx < 0) & (n_think >= budget)
                interrupted |= start
                force_idx = torch.where(start, 0, force_idx)
                forcing = force_idx >= 0
                tok = torch.where(forcing, self._phrase[force_idx.clamp_min(0)], tok)
                force_idx = torch.where(forcing, force_idx + 1, force_idx)
                phrase_done = forcing & (force_idx >= n_phrase)
                force_idx = torch.where(phrase_done, -1, force_idx)
                sampled = active & ~forcing
            else:
                phrase_done = zeros_b
                sampled = active

            tok = torch.where(active, tok, self.pad_id)
            is_eos = sampled & (tok == eos_id)
            is_think_end = sampled & ~answering & (tok == think_end_id)
            n_sampled += sampled
            n_think += sampled & ~answering & ~is_think_end & ~is_eos
            n_answer += sampled & answering
            answering |= is_think_end | phrase_done
            eos_hit |= is_eos
            limit = (n_sampled >= self.max_new_tokens) | (answering & (n_answer >= answer_budget))
            trunc = active & ~is_eos & limit
            truncated |= trunc
            done |= is_eos | trunc

            toks.append(tok)
            lps.append(torch.where(sampled, lp, 0.0))
            sampled_steps.append(sampled)
            active_steps.append(active)
            step_versions.append(version)
            if on_step is not None:
                on_step()
            n_active = int((~done).sum())
            if n_active == 0:
                break
            in_cache = B if rows is None else int(rows.numel())
            if in_cache >= self.compact_min_rows and 2 * n_active <= in_cache:
                keep = (~done).nonzero().squeeze(1)  # ascending row ids, a subset of `rows`
                cache.batch_select_indices(keep if rows is None else torch.searchsorted(rows, keep))
                rows = keep

        sampled_m = torch.stack(sampled_steps, 1)
        versions = torch.tensor(step_versions, dtype=torch.long, device=dev).expand(B, -1)
        return {
            "tokens": torch.stack(toks, 1).tolist(),
            "logprobs": torch.stack(lps, 1).tolist(),
            "mask": sampled_m.long().tolist(),
            "versions": torch.where(sampled_m, versions, -1).tolist(),
            "lengths": torch.stack(active_steps, 1).sum(1).tolist(),
            "truncated": truncated.tolist(),
            "interrupted": interrupted.tolist(),
            "think_tokens": n_think.tolist(),
            "eos": eos_hit.tolist(),
        }

    def _to_samples(self, prompts, prompt_ids, group_ids, n, out) -> list[list[Sample]]:
        rows = []
        for r, length in enumerate(out["lengths"]):
            ids = out["tokens"][r][:length]
            rows.append((r, length, ids, ids[:-1] if out["eos"][r] else ids))
        texts = self.tokenizer.batch_decode(
            [row[3] for row in rows], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        groups: list[list[Sample]] = [[] for _ in prompts]
        for (r, length, ids, _), text in zip(rows, texts):
            p = r // n
            groups[p].append(
                Sample(
                    prompt_uid=prompts[p].uid,
                    group_id=group_ids[p],
                    prompt_ids=list(prompt_ids[p]),
                    completion_ids=ids,
                    logprobs=out["logprobs"][r][:length],
                    versions=out["versions"][r][:length],
                    loss_mask=out["mask"][r][:length],
                    text=text,
                    truncated=bool(out["truncated"][r]),
                    interrupted=bool(out["interrupted"][r]),
                    think_tokens=int(out["think_tokens"][r]),
                )
            )
        return groups


class _CachedWeights:
    """Emulated low precision (:class:`~scalerl.model.precision.Precision`, ``impl=emulated``) puts
    the layer weights behind parametrizations that round them at every access: every decode step
    would round every weight again. Inside this context each rounded weight is computed once
    (``torch.nn.utils.parametrize.cached``); :meth:`refresh` drops them after the weights change."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True):
        from torch.nn.utils import parametrize

        self._parametrize = parametrize
        self.active = enabled and any(parametrize.is_parametrized(m) for m in model.modules())
        self._ctx = None

    def __enter__(self):
        if self.active:
            self._ctx = self._parametrize.cached()
            self._ctx.__enter__()
        return self

    def refresh(self) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = self._parametrize.cached()
            self._ctx.__enter__()

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None
        return False


_COMPACT_MIN_ROWS = 8  # below this many rows in the cache, dropping finished ones saves nothing


def _make_cache(capacity: int):
    """A ``DynamicCache`` whose layers write into a preallocated buffer of ``capacity`` positions.

    transformers' ``DynamicLayer`` concatenates the whole cache at every step (quadratic copying;
    about half of a CPU decode step for the small models). Here ``keys``/``values`` are views into a
    buffer that new states are written into; any method that replaces ``keys`` (repeat, select,
    crop) is followed by a copy into a fresh buffer at the next update. Falls back to a plain
    ``DynamicCache`` on transformers versions without cache layers.
    """
    from transformers import DynamicCache

    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers < 4.56
        return DynamicCache()

    class _BufferedLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n0 = self.get_seq_length()
            n1 = n0 + key_states.shape[-2]
            kbuf = getattr(self, "_kbuf", None)
            if (
                kbuf is None
                or self.keys is not self._kview
                or kbuf.shape[0] != key_states.shape[0]
                or n1 > kbuf.shape[-2]
            ):
                shape = (*key_states.shape[:-2], max(capacity, n1), key_states.shape[-1])
                kbuf = key_states.new_empty(shape)
                vbuf = value_states.new_empty((*shape[:-1], value_states.shape[-1]))
                if n0:
                    kbuf[..., :n0, :] = self.keys
                    vbuf[..., :n0, :] = self.values
                self._kbuf, self._vbuf = kbuf, vbuf
            self._kbuf[..., n0:n1, :] = key_states
            self._vbuf[..., n0:n1, :] = value_states
            self.keys, self.values = self._kbuf[..., :n1, :], self._vbuf[..., :n1, :]
            self._kview = self.keys
            return self.keys, self.values

    cache = DynamicCache()
    if getattr(cache, "layer_class_to_replicate", None) is not DynamicLayer or cache.layers:
        return cache
    cache.layer_class_to_replicate = _BufferedLayer
    return cache


def _single_token_id(tokenizer: Any, token: str) -> int | None:
    """Id of ``token`` if the tokenizer has it as one token, else None."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else None
