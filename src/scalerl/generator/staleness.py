"""What an in-flight weight update costs (PipelineRL keeps the KV cache of sequences in flight).

Tokens generated after an update come from the new weights reading keys and values the old weights
computed. :func:`measure_stale_kv` recomputes, for a few sequences that span an update, the
log-probs of those tokens under the new weights from scratch (a fresh prefill) and records how far
the generator's behaviour log-probs were from them: ``Sample.stale_kv_gap``, logged as
``gen/stale_kv_logprob_gap``. With the same engine and no update the gap is 0 up to rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scalerl.generator.sample import Sample
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


@torch.no_grad()
def measure_stale_kv(
    model: torch.nn.Module,
    precision: Precision,
    temperature: float,
    groups: Sequence[Sequence[Sample]],
    version: int,
    limit: int,
) -> int:
    """Set ``stale_kv_gap`` (mean |behaviour - fresh log-prob| over the tokens generated at
    ``version`` after an update) on up to ``limit`` samples; ``model`` holds ``version``'s weights.
    Returns how many were measured."""
    if limit <= 0:
        return 0
    measured = 0
    device = next(model.parameters()).device
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    t = temperature if temperature > 0 else 1.0
    was_training = model.training
    model.eval()
    try:
        for s in (s for g in groups for s in g):
            if measured >= limit:
                break
            start = spans_update(s, version)
            if start < 0:
                continue
            ids = torch.tensor([s.prompt_ids + s.completion_ids], dtype=torch.long, device=device)
            with precision.autocast(model):
                hidden = body(input_ids=ids).last_hidden_state[0]
            p = len(s.prompt_ids)
            logits = precision.logits(model, hidden[p - 1 : -1])
            fresh = precision.log_softmax(logits, t).float().gather(1, ids[0, p:, None]).squeeze(1)
            idx = [
                i for i in range(start, len(s.completion_ids)) if s.loss_mask[i] and s.versions[i] == version
            ]
            gen = torch.tensor([s.logprobs[i] for i in idx], dtype=torch.float32)
            s.stale_kv_gap = float((gen - fresh[idx].cpu()).abs().mean())
            measured += 1
    finally:
        model.train(was_training)
    return measured
