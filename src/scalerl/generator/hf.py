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
  and the following tokens are recorded with that version. ``stale_kv="keep"`` (the default) keeps
  the KV cache (stale), as in PipelineRL; ``"recompute"`` rebuilds it under the new weights: the
  rows still running are prefilled again over prompt + every token so far (one row per sample, into
  a fresh cache), and decoding continues from there, so the next tokens' log-probs are those of a
  fresh forward pass. Tokens already generated keep their versions and log-probs;
  :attr:`HFGenerator.stale_kv_recomputed_tokens` counts the positions prefilled again.
* Length control (ScaleRL interruptions): the rules of :mod:`scalerl.generator.length`, applied to
  every row at once (:meth:`HFGenerator._advance`).
* Finished rows leave the KV cache once they are half of it (a batch often waits on a few long
  samples); sampling still runs over all rows, so the random stream and the samples are unchanged.
* Emulated low-precision weights are rounded once per weight version, not at every decode step;
  a native low-precision body with fp32 master weights decodes over a static cache from its matrix
  weights cast once per batch and per in-flight update (:class:`~scalerl.generator.static_decode.LowPrecisionCopy`).
* The embedded model's architectures (GPT-2, Qwen2, Llama) on a CPU decode through
  :mod:`scalerl.generator.lean` (a forward over the weights on the slot cache, no per-layer module
  calls), batches as one session of the batch's size; ``lean=False`` (or another model, a native
  low-precision body, a GPU) keeps the transformers forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scalerl.config.groups.generator import STALE_KV, HFGeneratorOption
from scalerl.generator import static_decode
from scalerl.generator.base import GenerationSession, Generator
from scalerl.generator.length import LengthControl
from scalerl.generator.registry import register_generator
from scalerl.generator.sample import Sample
from scalerl.generator.staleness import measure_stale_kv
from scalerl.model.kv_cache import decoder, with_cache
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights


class HFGenerator(Generator):
    """Sample ``n`` completions per prompt from a transformers model, recording behaviour log-probs.

    Length control, per sequence: ``length_control`` (a
    :class:`~scalerl.generator.length.LengthControl`, or the ``length_control`` option it is built
    from with ``tokenizer``) and the rules in :mod:`scalerl.generator.length`. With interruption the
    phrase's tokens are forced in one per step (fed to the model, log-prob 0.0, version -1, mask 0).

    ``temperature <= 0`` means greedy decoding; the recorded log-probs are then those at
    temperature 1.

    The keyword defaults are the ``generator=hf`` option's (a generator built directly, as tests and
    benchmarks do, samples as one built from the default config).

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
        temperature: float = HFGeneratorOption.temperature,
        device: torch.device | str = "cpu",
        seed: int = 0,
        stale_kv_samples: int = HFGeneratorOption.stale_kv_samples,
        static_cache: bool = HFGeneratorOption.static_cache,
        stale_kv: str = HFGeneratorOption.stale_kv,
        lean: bool = True,
    ):
        self.device = torch.device(device)
        self.stale_kv_samples = int(stale_kv_samples)
        if stale_kv not in STALE_KV:
            raise ValueError(f"generator.stale_kv must be one of {', '.join(STALE_KV)}, got {stale_kv!r}")
        self.stale_kv = str(stale_kv)
        self.stale_kv_recomputed_tokens = 0  # positions prefilled again (stale_kv=recompute), all calls
        self.model = precision.prepare(model)
        self.tokenizer = tokenizer
        self.precision = precision
        self.temperature = float(temperature)

        self.lc = LengthControl.build(length_control, tokenizer)

        self.eos_id = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.eos_id if self.eos_id is not None else 0))
        # the phrase's tokens, indexed by each forcing row's position in it (a pad where none is)
        self._phrase = torch.tensor(self.lc.phrase_ids or [self.pad_id], dtype=torch.long, device=self.device)

        self.seed = seed
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(seed)
        self.version = 0
        # speed-ups, on by default (switches for benchmarks): finished rows leave the KV cache once
        # they are half of it and it holds at least this many; emulated low-precision weights are
        # rounded once per weight version
        self.compact_min_rows = _COMPACT_MIN_ROWS
        self.cache_rounded_weights = True
        # generator.static_cache: decode steps of one shape, replayed as a CUDA graph on a GPU
        self.static_cache = bool(static_cache)
        if self.static_cache and (why := static_decode.supported(self.model)) is not None:
            raise ValueError(f"generator.static_cache=true is not possible with this model: {why}")
        self._static: dict[int, static_decode.StaticDecoder] = {}
        # a native low-precision body with fp32 master weights: the static decoders read its matrix
        # weights cast once per batch and per in-flight update, not at every step (switch: benchmarks)
        self.cast_once = True
        self._low: static_decode.LowPrecisionCopy | None = None
        # generator.lean: the embedded model's architectures decode through a forward written over
        # their weights (scalerl.generator.lean) where it applies (CPU, fp32 or emulated body)
        self.lean = bool(lean)
        self._lean: Any = None

    def _lean_model(self):
        """The lean forward over this generator's model (one, its weights followed per version),
        or None where it does not apply."""
        from scalerl.generator import lean

        if not self.lean or self.static_cache or lean.unsupported(self.model, self.precision, self.device):
            return None
        if self._lean is None:
            self._lean = lean.LeanModel(self.model, self.precision)
        else:
            self._lean.sync()
        return self._lean

    # ------------------------------------------------------------------ Generator interface
    def join_weight_group(self, spec, rank: int, store=None) -> None:
        from scalerl.transport import WeightReceiver

        self._rx = WeightReceiver(spec, rank, self.device, store)
        self._rx.layout.check_matches(self.model)

    def receive_weights(self, version: int) -> None:
        from scalerl.transport import load_into

        load_into(self.model, self._rx.receive())
        self.version = int(version)

    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        if weights.module is not self.model:
            tensors = weights.tensors()
            with torch.no_grad():
                self.model.load_state_dict(tensors, strict=True)
        self.version = int(version)

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def _generate(
        self, prompts, prompt_ids, n, *, version, group_ids, weight_update, on_step
    ) -> list[list[Sample]]:
        was_training = self.model.training
        self.model.eval()
        try:
            if self._lean_model() is not None:
                # the lean forward runs over slots: one session sized for this batch draws what
                # the batch path draws (see _HFSession) and stamps the caller's version
                session = _HFSession(self, weight_update, on_step, len(prompt_ids) * n)
                session.version = int(version)
                session._add(list(prompts), prompt_ids, n, group_ids, None)
                try:
                    return session.drain()[0][1]
                finally:
                    session.pause()
                    session.cache.close()
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

    @property
    def continuous(self) -> bool:
        """Continuous generation runs on the slot cache, eagerly: with ``generator.static_cache``
        (decode steps replayed as CUDA graphs) the batch path stays the faster one until the slot
        cache has a captured step of its own (issue 54), so such a generator answers False."""
        return not self.static_cache

    def session(self, *, weight_update=None, on_step=None, rows: int | None = None) -> _HFSession:
        """Continuous generation over a :class:`~scalerl.generator.slots.SlotCache` of ``rows``
        slots (default: 64); see :class:`_HFSession`."""
        return _HFSession(self, weight_update, on_step, int(rows or 64))

    # ------------------------------------------------------------------ internals
    def _logprobs(self, input_ids, cache, attention_mask=None, position_ids=None) -> torch.Tensor:
        body = decoder(self.model)
        with self.precision.autocast(self.model):
            out = body(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **with_cache(body, cache),
            )
        return self._head_logprobs(out.last_hidden_state[:, -1])

    def _head_logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] log-probs from the last hidden state (the head in its precision)."""
        logits = self.precision.logits(self.model, hidden)
        temperature = self.temperature if self.temperature > 0 else 1.0
        return self.precision.log_softmax(logits, temperature)

    def _sample(self, logp: torch.Tensor) -> torch.Tensor:
        if self.temperature <= 0:
            return logp.argmax(-1)
        # Gumbel-max: argmax(log p - log E), E = -log U ~ Exp(1), U uniform: the exponential race,
        # its exponentials made from uniforms (torch's CPU generator draws those several times
        # faster than exponential_, which cost a tenth of a small model's decode step). A token of
        # probability 0 (log p = -inf) is never drawn
        u = torch.rand(logp.shape, dtype=torch.float32, generator=self.rng, device=logp.device)
        noise, logp = u.log_().neg_().log_(), logp.float()
        loop = _loops().gumbel_argmax() if logp.device.type == "cpu" else None
        if loop is None or not logp.is_contiguous():
            return (logp - noise).argmax(-1)
        tok = torch.empty(logp.shape[0], dtype=torch.long)
        loop(logp.numpy(), noise.numpy(), tok.numpy())  # the same indices, without the difference's tensor
        return tok

    def _decode(self, prompt_ids, n, version, weight_update, on_step, cached=None) -> dict[str, Any]:
        """Decode all ``len(prompt_ids) * n`` rows together, one token per step: take new weights,
        the next log-probs, sample, force phrase tokens and count budgets, record, drop finished rows
        from the KV cache."""
        B = len(prompt_ids) * n
        max_steps = self.lc.max_steps
        rs = self._row_state(B)
        feed = _Prefill.of(prompt_ids, n, max_steps, self.pad_id, self.device)
        cache = (
            self._static_decoder(B, feed.L + max_steps)
            if self.static_cache
            else _make_cache(feed.L + max_steps)
        )
        if self.static_cache and self._low is not None:
            self._low.refresh()  # the weights of this batch's version
        record = _Record()
        tok = torch.empty(0, dtype=torch.long, device=self.device)  # the tokens fed at the next step
        # rows still in the KV cache (None: all B). Finished rows are dropped from the cache once they
        # are half of it; the others' log-probs are scattered back into a [B, vocab] tensor, so the
        # sampling (and its random stream) is the same as without the compaction.
        rows = None
        for step in range(max_steps):
            new_version = self._take_new_weights(weight_update, cached)
            if new_version is not None and step > 0 and self.stale_kv == "recompute":
                version = new_version
                cache, rows, logp = self._recompute_cache(step, feed, cache, record, rs, n, B, max_steps)
            else:
                version = version if new_version is None else new_version
                logp = self._next_logprobs(step, feed, cache, tok, rows, n, B)
            tok = self._sample(logp)
            lp = logp.gather(1, tok[:, None]).squeeze(1).float()
            tok, sampled, active = self._advance(rs, tok)
            record.add(tok, torch.where(sampled, lp, 0.0), sampled, active, version)
            if on_step is not None:
                on_step()
            n_active = int((~rs.done).sum())
            if n_active == 0:
                break
            if not self.static_cache:  # a static cache keeps its shape: finished rows stay in it
                rows = self._compact(cache, rs.done, rows, n_active, B)
        return record.result(rs, B, self.device)

    def _row_state(self, B: int) -> _RowState:
        """Each row's budgets (drawn for interruption) and its state before the first token."""
        budget = self.lc.draw_budgets(B, self.rng, self.device)
        return _RowState.start(B, budget, self.lc.answer_limit, self.device)

    def _take_new_weights(self, weight_update, cached) -> int | None:
        """In-flight weights (PipelineRL): the version the next tokens carry when new weights came
        in, else None."""
        if weight_update is not None:
            new_version = weight_update()
            if new_version is not None:
                self.version = int(new_version)
                if cached is not None:
                    cached.refresh()  # the weights were replaced in place
                if self.static_cache and self._low is not None:
                    self._low.refresh()
                return self.version
        return None

    def _recompute_cache(
        self, step: int, feed: _Prefill, cache, record: _Record, rs: _RowState, n, B, max_steps
    ):
        """``stale_kv=recompute`` after new weights came in before ``step``: the KV cache rebuilt under
        them. The rows still running are prefilled again over their prompt and the ``step`` tokens
        recorded so far (one row per sample, into a fresh cache; a static cache is prefilled anew in
        place, every row). Returns (the cache, the rows in it, the [B, vocab] log-probs of the next
        token), as :meth:`_next_logprobs` would after feeding the last token."""
        prompts = feed.ids if n == 1 else feed.ids.repeat_interleave(n, 0)
        ids = torch.cat([prompts, torch.stack(record.toks, 1)], 1)  # [B, L + step]
        S = feed.L + step
        mask = None if feed.same_length else feed.mask_full[:, :S]
        if isinstance(cache, static_decode.StaticDecoder):
            pos = None if mask is None else (mask.cumsum(-1) - 1).clamp_min(0)
            self.stale_kv_recomputed_tokens += int(B * S if mask is None else mask.sum())
            return cache, None, cache.prefill(ids, mask, pos)
        keep = (~rs.done).nonzero().squeeze(1)  # finished rows are not prefilled again
        rows = None if keep.numel() == B else keep
        if rows is not None:
            ids = ids[rows]
            mask = None if mask is None else mask[rows]
        pos = None if mask is None else (mask.cumsum(-1) - 1).clamp_min(0)
        self.stale_kv_recomputed_tokens += int(ids.shape[0] * S if mask is None else mask.sum())
        cache = _make_cache(feed.L + max_steps)
        logp = self._logprobs(ids, cache, mask, pos)
        if not feed.same_length:
            feed.next_pos = feed.next_pos + 1  # the last token took its position, as in a decode step
        if rows is not None:
            full = logp.new_zeros((B, logp.shape[-1]))
            full[rows] = logp
            logp = full
        return cache, rows, logp

    def _next_logprobs(self, step: int, feed: _Prefill, cache, tok, rows, n: int, B: int) -> torch.Tensor:
        """[B, vocab] log-probs of the next token: the prefill (each prompt once, its cache then repeated
        for its n samples) at step 0, else the last tokens of the rows still in the cache."""
        if isinstance(cache, static_decode.StaticDecoder):
            if step > 0:
                return cache.step(tok)

            def per_row(t):  # the static cache has a row for each sample: each prompt n times
                return t if t is None or n == 1 else t.repeat_interleave(n, 0)

            return cache.prefill(per_row(feed.ids), per_row(feed.pmask), per_row(feed.prefill_pos))
        if step == 0:
            logp = self._logprobs(feed.ids, cache, feed.pmask, feed.prefill_pos)
            if n > 1:
                cache.batch_repeat_interleave(n)
                logp = logp.repeat_interleave(n, 0)
            return logp
        inp = tok[:, None] if rows is None else tok[rows, None]
        if feed.same_length:
            logp = self._logprobs(inp, cache)
        else:
            L = feed.L
            mask_now = feed.mask_full[:, : L + step] if rows is None else feed.mask_full[rows, : L + step]
            pos_now = feed.next_pos if rows is None else feed.next_pos[rows]
            logp = self._logprobs(inp, cache, mask_now, pos_now[:, None])
            feed.next_pos = feed.next_pos + 1
        if rows is not None:
            full = logp.new_zeros((B, logp.shape[-1]))
            full[rows] = logp
            logp = full
        return logp

    def _static_decoder(self, B: int, needed: int) -> static_decode.StaticDecoder:
        """The static decoder for ``B`` rows and ``needed`` positions: kept between calls (its CUDA
        graph is captured once), made anew when the batch or the length does not fit it. At most two
        are kept (the training batch's and the evaluation's shapes)."""
        dec = self._static.get(B)
        if dec is None or not dec.fits(B, needed):
            self._static.pop(B, None)
            if len(self._static) >= 2:
                self._static.clear()
            if self._low is None and self.cast_once:
                self._low = static_decode.low_precision_copy(self.model)
            dec = static_decode.StaticDecoder(
                self.model,
                self._head_logprobs,
                lambda: self.precision.autocast(self.model, cache_enabled=False),
                B,
                static_decode.capacity_for(needed),
                self.device,
                # emulated low precision rounds the weights into tensors made anew per version (and
                # freed after each call), which a captured graph would go on reading: no graph then
                graph=not _CachedWeights(self.model).active,
                low=self._low if self.cast_once else None,
            )
            self._static[B] = dec
        return dec

    def _advance(self, rs: _RowState, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every row's state: force the phrase's next token where a thinking budget ran
        out (interruption), count sampled/thinking/answer tokens, finish rows at eos or a limit
        (the rules of :mod:`scalerl.generator.length`, for every row at once).
        Returns (the tokens to record and feed, which rows sampled theirs, which rows were active).
        On a CPU with numba, one compiled loop over the rows does it (the same results: integer
        logic, tested against these ops)."""
        lc = self.lc
        loop = _loops().advance_rows() if tok.device.type == "cpu" else None
        if loop is not None:
            sampled, active = torch.empty_like(rs.done), torch.empty_like(rs.done)
            loop(
                *(x.numpy() for x in (tok, rs.done, rs.answering, rs.force_idx, rs.n_think, rs.budget)),
                *(x.numpy() for x in (rs.interrupted, rs.n_sampled, rs.n_answer, rs.eos_hit, rs.truncated)),
                self._phrase.numpy(),
                len(lc.phrase_ids),
                bool(lc.interrupts),
                -1 if self.eos_id is None else int(self.eos_id),
                -1 if lc.think_end_id is None else int(lc.think_end_id),
                self.pad_id,
                int(lc.max_new_tokens),
                int(rs.answer_budget),
                sampled.numpy(),
                active.numpy(),
            )
            return tok, sampled, active
        active = ~rs.done
        if lc.interrupts:
            start = active & ~rs.answering & (rs.force_idx < 0) & (rs.n_think >= rs.budget)
            rs.interrupted |= start
            rs.force_idx = torch.where(start, 0, rs.force_idx)
            forcing = rs.force_idx >= 0
            tok = torch.where(forcing, self._phrase[rs.force_idx.clamp_min(0)], tok)
            rs.force_idx = torch.where(forcing, rs.force_idx + 1, rs.force_idx)
            phrase_done = forcing & (rs.force_idx >= len(lc.phrase_ids))
            rs.force_idx = torch.where(phrase_done, -1, rs.force_idx)
            sampled = active & ~forcing
        else:
            phrase_done = torch.zeros_like(active)
            sampled = active
        eos_id = -1 if self.eos_id is None else int(self.eos_id)
        think_end_id = -1 if lc.think_end_id is None else int(lc.think_end_id)
        tok = torch.where(active, tok, self.pad_id)
        is_eos = sampled & (tok == eos_id)
        is_think_end = sampled & ~rs.answering & (tok == think_end_id)
        rs.n_sampled += sampled
        rs.n_think += sampled & ~rs.answering & ~is_think_end & ~is_eos
        rs.n_answer += sampled & rs.answering
        rs.answering |= is_think_end | phrase_done
        rs.eos_hit |= is_eos
        limit = (rs.n_sampled >= lc.max_new_tokens) | (rs.answering & (rs.n_answer >= rs.answer_budget))
        trunc = active & ~is_eos & limit
        rs.truncated |= trunc
        rs.done |= is_eos | trunc
        return tok, sampled, active

    def _compact(self, cache, done: torch.Tensor, rows, n_active: int, B: int):
        """Drop finished rows from the KV cache once they are half of it; returns the rows left in it."""
        in_cache = B if rows is None else int(rows.numel())
        if in_cache >= self.compact_min_rows and 2 * n_active <= in_cache:
            keep = (~done).nonzero().squeeze(1)  # ascending row ids, a subset of `rows`
            cache.batch_select_indices(keep if rows is None else torch.searchsorted(rows, keep))
            return keep
        return rows

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


def _loops():
    """:mod:`scalerl.generator.kernels`, imported where a CPU decode first needs it (numba with it),
    as the lean forward imports it: not when this module loads."""
    from scalerl.generator import kernels

    return kernels


@register_generator("hf", generator=HFGenerator)
def build_hf(options, length_control, model, tokenizer, precision, *, device, seed, placement) -> HFGenerator:
    """``generator=hf`` from its option (:class:`~scalerl.config.groups.generator.HFGeneratorOption`);
    the placement does not change how it samples."""
    return HFGenerator(
        model,
        tokenizer,
        precision,
        length_control,
        temperature=float(options.temperature),
        device=device,
        seed=seed,
        stale_kv_samples=int(options.stale_kv_samples),
        stale_kv=str(options.stale_kv),
        static_cache=bool(options.static_cache),
    )


@dataclass
class _Work:
    """A piece of work in a session: its prompts, and each finished row's sample fields."""

    tag: Any
    prompts: list
    prompt_ids: list[list[int]]
    n: int
    group_ids: list[int]
    rows: dict[int, dict[str, Any]]
    left: int


class _HFSession(GenerationSession):
    """Continuous generation with the HF generator: one row per sample in a slot of a
    :class:`~scalerl.generator.slots.SlotCache`, each at its own position.

    A step: take new weights (as :meth:`HFGenerator._decode` does; the rounded-weight cache of
    emulated precision refreshed, and with ``stale_kv=recompute`` every running row prefilled again
    over prompt + tokens so far); one decode token for the running rows; the prompts added since the
    last step prefilled into free slots (each prompt once, its keys copied into its ``n`` slots);
    then sampling, phrase forcing, budgets and finishing exactly as the batch path does
    (:meth:`HFGenerator._advance`, the same per-row state over all slots: a free slot is a finished
    row). Finished rows free their slots at once.

    Random stream: the exponential noise of a step is drawn for every slot (free ones too) and the
    thinking budgets at :meth:`add`, so a session of ``rows`` slots given one piece of work of
    ``rows`` samples draws exactly what :meth:`HFGenerator.generate` draws and samples the same
    tokens (up to floating-point ties: the slot path masks instead of padding). With more slots, or
    work joining later, the draws a row sees depend on its slot and step: the same distribution,
    other samples."""

    def __init__(self, gen: HFGenerator, weight_update, on_step, rows: int):
        from scalerl.generator.slots import SlotCache

        super().__init__(gen)
        self.weight_update, self.on_step = weight_update, on_step
        self.max_steps = gen.lc.max_steps
        model = gen.model
        body = decoder(model)
        self.lean = gen._lean_model()
        self.cache = SlotCache(
            body, rows, 64 + self.max_steps, gen.device, lambda: gen.precision.autocast(model), self.lean
        )
        self.answer_budget = gen.lc.answer_limit
        self._alloc_state(rows)
        self.work: dict[int, _Work] = {}
        self.slot_of: dict[int, tuple[int, int]] = {}  # slot -> (work key, row)
        self.pending: list[tuple[int, list[int]]] = []  # (work key, its slots) to prefill next step
        self._key = 0
        # the version stamped on tokens (HFGenerator.generate sets the caller's), and the
        # generator's version last seen: a change means new weights
        self.version = self._seen = gen.version
        self._cached: _CachedWeights | None = None
        self.steps = 0

    def _alloc_state(self, rows: int, old: _RowState | None = None) -> None:
        dev = self.gen.device
        budget = torch.zeros(rows, dtype=torch.long, device=dev)
        rs = _RowState.start(rows, budget, self.answer_budget, dev)
        rs.done[:] = True  # a free slot is a finished row
        buf = (rows, self.max_steps)
        tok = torch.zeros(buf, dtype=torch.long, device=dev)
        lp = torch.zeros(buf, dtype=torch.float32, device=dev)
        sampled = torch.zeros(buf, dtype=torch.bool, device=dev)
        ver = torch.full(buf, -1, dtype=torch.long, device=dev)
        t = torch.zeros(rows, dtype=torch.long, device=dev)
        last = torch.full((rows,), self.gen.pad_id, dtype=torch.long, device=dev)
        if old is not None:  # grown: the running rows keep their state
            k = old.done.shape[0]
            for name in rs.__dataclass_fields__:
                if name != "answer_budget":
                    getattr(rs, name)[:k] = getattr(old, name)
            for new, cur in zip((tok, lp, sampled, ver, t, last), self._buffers()):
                new[:k] = cur
        self.rs = rs
        self.tok_buf, self.lp_buf, self.sampled_buf, self.ver_buf, self.t, self.last = (
            tok,
            lp,
            sampled,
            ver,
            t,
            last,
        )

    def _buffers(self):
        return (self.tok_buf, self.lp_buf, self.sampled_buf, self.ver_buf, self.t, self.last)

    @property
    def running(self) -> int:
        return sum(w.left for w in self.work.values())

    def _add(self, prompts, prompt_ids, n, group_ids, tag) -> None:
        gen = self.gen
        k = len(prompts) * n
        budget = gen.lc.draw_budgets(k, gen.rng, gen.device)  # now, as HFGenerator._row_state draws them
        slots = self.cache.alloc(k)
        if self.cache.rows > self.rs.done.shape[0]:
            self._alloc_state(self.cache.rows, self.rs)
        self.cache.grow(capacity=max(len(x) for x in prompt_ids) + self.max_steps + 1)
        idx = torch.tensor(slots, dtype=torch.long, device=gen.device)
        rs = self.rs
        rs.budget[idx] = budget
        for f in (rs.done, rs.eos_hit, rs.truncated, rs.answering, rs.interrupted):
            f[idx] = False
        for f in (rs.n_sampled, rs.n_think, rs.n_answer, self.t):
            f[idx] = 0
        rs.force_idx[idx] = -1
        rs.done[idx] = True  # until its prefill, next step
        self._key += 1
        self.work[self._key] = _Work(tag, prompts, prompt_ids, n, group_ids, {}, k)
        for r, slot in enumerate(slots):
            self.slot_of[slot] = (self._key, r)
        self.pending.append((self._key, slots))

    def pause(self) -> None:
        """Drop the rounded-weight cache (emulated precision): while sequences run it is held
        between steps (rounding every weight at every step costs a share of a small model's step)
        and, as torch's cache is global, every other forward of the model then reads it too. So
        call this before the model is used otherwise while sequences run (the engine does before
        evaluation and fingerprints); an idle session drops it itself."""
        if self._cached is not None:
            self._cached.__exit__(None, None, None)
            self._cached = None

    @torch.no_grad()
    def step(self) -> list[tuple[Any, list[list[Sample]]]]:
        gen = self.gen
        if not self.running:
            return []
        if gen.model.training:
            gen.model.eval()
        if self._cached is None:
            self._cached = _CachedWeights(gen.model, enabled=gen.cache_rounded_weights).__enter__()
        gen._take_new_weights(self.weight_update, None)
        if gen.version != self._seen:  # in this step's poll, or between steps
            self.version = self._seen = gen.version
            self._cached.refresh()
            if self.lean is not None:
                self.lean.refresh()
            if gen.stale_kv == "recompute":
                self._recompute()
        elif self.lean is not None and self.steps == 0:
            # weights changed in place without a new version: a module shared with the trainer,
            # whose optimiser steps between generation calls; within a session they change only
            # with a version (in flight), so the check is made once, not at every decode step
            self.lean.sync()
        rs, S = self.rs, self.rs.done.shape[0]
        live = ~rs.done  # rows decoding (not the ones added since the last step)
        hi = self.cache.hi
        logp = None
        if bool(live.any()):
            hidden = self.cache.decode(self.last[:hi], live[:hi])
            lp_hi = gen._head_logprobs(hidden)
            logp = lp_hi.new_zeros((S, lp_hi.shape[-1]))
            logp[:hi] = lp_hi
        by_n: dict[int, tuple[list[int], list[list[int]]]] = {}  # one prefill per samples-per-prompt
        for key, slots in self.pending:
            w = self.work[key]
            part = by_n.setdefault(w.n, ([], []))
            part[0].extend(slots)
            part[1].extend(w.prompt_ids)
        self.pending = []
        for n, (slots, ids) in by_n.items():
            lp_new = gen._head_logprobs(self.cache.prefill(slots, ids, n, gen.pad_id))
            if logp is None:
                logp = lp_new.new_zeros((S, lp_new.shape[-1]))
            idx = torch.tensor(slots, dtype=torch.long, device=gen.device)
            logp[idx] = lp_new
            rs.done[idx] = False
        tok = gen._sample(logp)
        lp = logp.gather(1, tok[:, None]).squeeze(1).float()
        tok, sampled, active = gen._advance(rs, tok)
        ended = self._record(tok, lp, sampled, active)
        self.last = tok
        self.steps += 1
        done = self._finish(ended)
        if not self.running:  # idle: the rounded weights are not held past the last sequence
            self.pause()
        if self.on_step is not None:
            self.on_step()
        return done

    def _record(self, tok, lp, sampled, active) -> list[int]:
        """Each active row's token, its log-prob where sampled, whether sampled and its version, at the
        row's next column; returns the rows that finished at this step (on a CPU with numba one
        compiled loop: the same writes)."""
        done = self.rs.done
        loop = _loops().record_rows() if tok.device.type == "cpu" else None
        if loop is not None:
            finished = torch.empty(done.shape[0], dtype=torch.long)
            bufs = (self.tok_buf, self.lp_buf, self.sampled_buf, self.ver_buf, self.t, finished)
            n = loop(
                *(x.numpy() for x in (tok, lp, sampled, active, done)),
                int(self.version),
                *(x.numpy() for x in bufs),
            )
            return finished[:n].tolist()
        rows = torch.arange(done.shape[0], device=tok.device)
        at = self.t.clamp_max(self.max_steps - 1)
        self.tok_buf[rows, at] = torch.where(active, tok, self.tok_buf[rows, at])
        self.lp_buf[rows, at] = torch.where(active & sampled, lp, self.lp_buf[rows, at])
        self.sampled_buf[rows, at] = torch.where(active, sampled, self.sampled_buf[rows, at])
        self.ver_buf[rows, at] = torch.where(
            active, torch.where(sampled, self.version, -1), self.ver_buf[rows, at]
        )
        self.t += active.long()
        return (active & done).nonzero().squeeze(1).tolist()

    def _finish(self, slots: list[int]) -> list[tuple[Any, list[list[Sample]]]]:
        """The rows in ``slots`` finished: their fields kept, their slots freed; the work done."""
        if not slots:
            return []
        rs, out = self.rs, []
        # every finished row's fields read out at once (a few tensor ops a step, not a few a row)
        idx = torch.tensor(slots, dtype=torch.long, device=self.gen.device)
        sampled = self.sampled_buf[idx]
        cols = zip(
            self.t[idx].tolist(),
            self.tok_buf[idx].tolist(),
            torch.where(sampled, self.lp_buf[idx], 0.0).tolist(),
            sampled.long().tolist(),
            self.ver_buf[idx].tolist(),
            *(f[idx].tolist() for f in (rs.truncated, rs.interrupted, rs.n_think, rs.eos_hit)),
        )
        for slot, (n, tok, lp, mask, ver, truncated, interrupted, think, eos) in zip(slots, cols):
            key, r = self.slot_of.pop(slot)
            self.work[key].rows[r] = {
                "tokens": tok[:n],
                "logprobs": lp[:n],
                "mask": mask[:n],
                "versions": ver[:n],
                "truncated": bool(truncated),
                "interrupted": bool(interrupted),
                "think_tokens": int(think),
                "eos": bool(eos),
            }
            self.work[key].left -= 1
        self.cache.release(slots)
        for key in [k for k, w in self.work.items() if w.left == 0]:
            w = self.work.pop(key)
            out.append((w.tag, self._samples(w)))
        return out

    def _samples(self, w: _Work) -> list[list[Sample]]:
        rows = [w.rows[r] for r in range(len(w.prompts) * w.n)]
        result = {k: [row[k] for row in rows] for k in rows[0]}
        result["lengths"] = [len(row["tokens"]) for row in rows]
        groups = self.gen._to_samples(w.prompts, w.prompt_ids, w.group_ids, w.n, result)
        if self.weight_update is not None:
            g = self.gen
            left = self.stale_kv_left()  # up to stale_kv_samples sequences a weight version
            if left:
                self.stale_kv_spent(
                    measure_stale_kv(
                        g.model, g.precision, g.temperature, groups, g.version, left, lean=self.lean
                    )
                )
        return groups

    def _recompute(self) -> None:
        """``stale_kv=recompute``: every running row prefilled again under the new weights over its
        prompt and the tokens fed so far (the last sampled one is fed by the next decode, as usual)."""
        live = (~self.rs.done).nonzero().squeeze(1).tolist()
        seqs = []
        for slot in live:
            key, r = self.slot_of[slot]
            w = self.work[key]
            seqs.append(list(w.prompt_ids[r // w.n]) + self.tok_buf[slot, : int(self.t[slot]) - 1].tolist())
            self.gen.stale_kv_recomputed_tokens += len(seqs[-1]) + 1
        if live:
            self.cache.prefill(live, seqs, 1, self.gen.pad_id)


@dataclass
class _RowState:
    """Per-row decode state, [B] tensors: budgets, finished/eos/truncated/answering/interrupted, the
    tokens counted, the position inside a forced phrase (-1: none)."""

    budget: torch.Tensor
    answer_budget: int
    done: torch.Tensor
    eos_hit: torch.Tensor
    truncated: torch.Tensor
    answering: torch.Tensor
    interrupted: torch.Tensor
    n_sampled: torch.Tensor
    n_think: torch.Tensor
    n_answer: torch.Tensor
    force_idx: torch.Tensor

    @classmethod
    def start(cls, B: int, budget: torch.Tensor, answer_budget: int, dev) -> _RowState:
        zeros_b = torch.zeros(B, dtype=torch.bool, device=dev)
        n_sampled = torch.zeros(B, dtype=torch.long, device=dev)
        return cls(
            budget,
            answer_budget,
            *(zeros_b.clone() for _ in range(5)),
            n_sampled,
            torch.zeros_like(n_sampled),
            torch.zeros_like(n_sampled),
            torch.full((B,), -1, dtype=torch.long, device=dev),
        )


@dataclass
class _Prefill:
    """The prompts as the model is fed them: one row per distinct prompt; prompts of unequal length
    left-padded with a mask and positions, and the [B, L + max_steps] mask and next positions of the
    rows decoded from them."""

    ids: torch.Tensor
    L: int
    same_length: bool
    pmask: torch.Tensor | None = None
    prefill_pos: torch.Tensor | None = None
    mask_full: torch.Tensor | None = None
    next_pos: torch.Tensor | None = None

    @classmethod
    def of(cls, prompt_ids: list[list[int]], n: int, max_steps: int, pad_id: int, dev) -> _Prefill:
        lens = [len(ids) for ids in prompt_ids]
        P, L = len(prompt_ids), max(lens)
        if all(x == L for x in lens):
            return cls(torch.tensor(prompt_ids, dtype=torch.long, device=dev), L, True)
        ids = torch.full((P, L), pad_id, dtype=torch.long, device=dev)
        pmask = torch.zeros((P, L), dtype=torch.long, device=dev)
        for i, row in enumerate(prompt_ids):
            ids[i, L - len(row) :] = torch.tensor(row, dtype=torch.long, device=dev)
            pmask[i, L - len(row) :] = 1
        prefill_pos = (pmask.cumsum(-1) - 1).clamp_min(0)
        mask_full = torch.ones((P * n, L + max_steps), dtype=torch.long, device=dev)
        mask_full[:, :L] = pmask.repeat_interleave(n, 0)
        next_pos = torch.tensor(lens, dtype=torch.long, device=dev).repeat_interleave(n)
        return cls(ids, L, False, pmask, prefill_pos, mask_full, next_pos)


class _Record:
    """The tokens of every step, their log-probs, which were sampled, which rows were active, and the
    policy version of each step; :meth:`result` turns them into per-row lists."""

    def __init__(self):
        self.toks, self.lps, self.sampled, self.active, self.versions = [], [], [], [], []

    def add(self, tok, lp, sampled, active, version: int) -> None:
        self.toks.append(tok)
        self.lps.append(lp)
        self.sampled.append(sampled)
        self.active.append(active)
        self.versions.append(version)

    def result(self, rs: _RowState, B: int, dev) -> dict[str, Any]:
        sampled_m = torch.stack(self.sampled, 1)
        versions = torch.tensor(self.versions, dtype=torch.long, device=dev).expand(B, -1)
        return {
            "tokens": torch.stack(self.toks, 1).tolist(),
            "logprobs": torch.stack(self.lps, 1).tolist(),
            "mask": sampled_m.long().tolist(),
            "versions": torch.where(sampled_m, versions, -1).tolist(),
            "lengths": torch.stack(self.active, 1).sum(1).tolist(),
            "truncated": rs.truncated.tolist(),
            "interrupted": rs.interrupted.tolist(),
            "think_tokens": rs.n_think.tolist(),
            "eos": rs.eos_hit.tolist(),
        }


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
            # torch empties its cache only when the last cached() context ends: with another one
            # open (a continuous session beside an evaluation) the weights rounded before the
            # change would stay; they are stale for every holder, so emptied here
            cache = getattr(self._parametrize, "_cache", None)
            if isinstance(cache, dict):
                cache.clear()
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
