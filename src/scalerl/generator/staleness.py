"""What an in-flight weight update costs (PipelineRL keeps the KV cache of sequences in flight).

Tokens generated after an update come from the new weights reading keys and values the old weights
computed. :func:`measure_stale_kv` recomputes, for a few sequences that span an update, the
log-probs of those tokens under the new weights from scratch (a fresh prefill) and records how far
the generator's behaviour log-probs were from them: ``Sample.stale_kv_gap``, logged as
``gen/stale_kv_logprob_gap``. With the same engine and no update the gap is 0 up to rounding; so
it is with ``generator.stale_kv=recompute``, which rebuilds the cache of the running sequences under
the new weights at every update (the ablation of keeping it).

An engine whose weights live in its workers re-scores through its own prompt log-probs, which are
untempered and only the K most likely tokens' at each position: :func:`tempered_logprob` turns them
into the tempered log-prob the sampler reported, with a bound on the error from the tokens outside K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from scalerl.generator.sample import Sample
from scalerl.model.kv_cache import decoder
from scalerl.model.precision import Precision


def spans_update(sample: Sample, version: int) -> int:
    """Index of the first token generated at ``version`` after tokens of an older version; -1 if
    ``sample`` has no such tokens (no update inside it, or its newest tokens are not ``version``'s)."""
    older = False
    for i, (v, m) in enumerate(zip(sample.versions, sample.loss_mask)):
        if not m:
            continue
        if v == version and older:
            return i
        older = older or v < version
    return -1


def tempered_logprob(
    token: float, known: Mapping[int, float], temperature: float, vocab: int, top_k: int
) -> tuple[float, float]:
    """``log softmax(logits / temperature)`` of a token, from untempered log-probs: ``token``'s and
    ``known`` (the ``top_k`` most likely tokens' at that position, and the token's, which vLLM adds
    when it is not among them) in a vocabulary of ``vocab``. Returns the estimate and a bound on
    its error.

    With ``r`` the untempered log-probs, the tempered one is ``r_x / T - log sum_i exp(r_i / T)``.
    The sum over the known tokens is exact; each unknown token has ``r_i <= m``, the smallest known
    top-K one, and the unknown ones hold ``q = 1 - sum_known exp(r_i)`` of the mass, so their share is at
    most ``exp(m (1/T - 1)) q`` for T < 1 (``exp(r/T) = exp(r) exp(r)^(1/T - 1)``) and at most
    ``n^(1 - 1/T) q^(1/T)`` for T > 1 (Hölder over the ``n`` unknown tokens; and at most
    ``n exp(m / T)``). The estimate takes the middle of the interval; at T = 1 it is exact."""
    if temperature == 1.0:
        return float(token), 0.0
    t = float(temperature)
    values = list(known.values())
    if not values:
        raise ValueError("tempered_logprob needs at least one known log-prob")
    m = sorted(values, reverse=True)[min(int(top_k), len(values)) - 1]
    scaled = [v / t for v in values]
    top = max(scaled)
    lse = top + math.log(sum(math.exp(v - top) for v in scaled))
    rest_mass = 1.0 - sum(math.exp(v) for v in values)
    unknown = int(vocab) - len(values)
    width = 0.0
    if unknown > 0 and rest_mass > 0.0:
        if t < 1.0:
            log_rest = m * (1.0 / t - 1.0) + math.log(rest_mass)
        else:  # and never more than every unknown token at the known minimum
            log_rest = min(
                (1.0 - 1.0 / t) * math.log(unknown) + math.log(rest_mass) / t, math.log(unknown) + m / t
            )
        x = log_rest - lse
        width = x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))
    return float(token) / t - (lse + width / 2), width / 2


@torch.no_grad()
def measure_stale_kv(
    model: torch.nn.Module,
    precision: Precision,
    temperature: float,
    groups: Sequence[Sequence[Sample]],
    version: int,
    limit: int,
    lean=None,
) -> int:
    """Set ``stale_kv_gap`` (mean |behaviour - fresh log-prob| over the tokens generated at
    ``version`` after an update) on up to ``limit`` samples; ``model`` holds ``version``'s weights.
    ``lean``: the generator's :class:`~scalerl.generator.lean.LeanModel` over ``model``, which then
    runs the body's forward (the same numbers as the transformers forward, at a fraction of its
    cost). Returns how many were measured."""
    if limit <= 0:
        return 0
    chosen = []  # (sample, index of its first token after the update)
    for s in (s for g in groups for s in g):
        if len(chosen) >= limit:
            break
        start = spans_update(s, version)
        if start >= 0:
            chosen.append((s, start))
    if not chosen:
        return 0
    device = next(model.parameters()).device
    body = decoder(model)
    t = temperature if temperature > 0 else 1.0
    seqs = [s.prompt_ids + s.completion_ids for s, _ in chosen]
    L = max(len(x) for x in seqs)
    # one forward over the chosen sequences, right-padded (a causal model's real positions never
    # see the padding after them): the same log-probs as one forward each, in one call
    ids = torch.zeros((len(seqs), L), dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), L), dtype=torch.long, device=device)
    for i, x in enumerate(seqs):
        ids[i, : len(x)] = torch.tensor(x, dtype=torch.long, device=device)
        mask[i, : len(x)] = 1
    was_training = model.training
    if was_training:  # (a module tree walk each way: an engine's model is in eval already)
        model.eval()
    try:
        if lean is not None:
            hidden = lean.hidden_states(ids, [len(x) for x in seqs])
        else:
            with precision.autocast(model):
                hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
        for row, (s, start) in enumerate(chosen):
            p, n = len(s.prompt_ids), len(seqs[row])
            logits = precision.logits(model, hidden[row, p - 1 : n - 1])
            target = ids[row, p:n, None]
            fresh = precision.log_softmax(logits, t).float().gather(1, target).squeeze(1)
            idx = [
                i for i in range(start, len(s.completion_ids)) if s.loss_mask[i] and s.versions[i] == version
            ]
            gen = torch.tensor([s.logprobs[i] for i in idx], dtype=torch.float32)
            s.stale_kv_gap = float((gen - fresh[idx].cpu()).abs().mean())
    finally:
        if was_training:
            model.train()
    return len(chosen)
