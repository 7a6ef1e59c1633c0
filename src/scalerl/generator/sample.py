"""One generated sequence with everything the trainer needs (behaviour log-probs, versions, mask)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass
class Sample:
    """One generated sequence.

    ``completion_ids``, ``logprobs``, ``versions`` and ``loss_mask`` are aligned token by token.
    Forced tokens (the interruption phrase) have log-prob 0.0, version -1 and mask 0. They are fixed
    once the sample is made: :attr:`num_sampled` and :attr:`min_version` are computed once (the
    async modes ask them of every buffered group, again at every group that arrives).
    """

    prompt_uid: int  # Prompt.uid
    group_id: int  # caller-supplied id of the group (n samples of one prompt)
    prompt_ids: list[int]
    completion_ids: list[int]  # generated + forced tokens in order, no padding; ends with eos if finished
    logprobs: list[float]  # behaviour log-prob of each completion token (0.0 for forced tokens)
    versions: list[int]  # policy version that produced each token (-1 for forced tokens)
    loss_mask: list[int]  # 1 for sampled tokens, 0 for forced tokens
    text: str  # decoded completion (special tokens kept, final eos stripped)
    truncated: bool  # stopped by a length limit without eos
    interrupted: bool  # the interruption phrase was forced in
    think_tokens: int  # sampled tokens before </think> (or before the forced phrase)
    reward: float = 0.0  # filled later by the loop
    # mean |behaviour - fresh log-prob| of the tokens generated after an in-flight update, for the
    # few samples the generator measured (scalerl.generator.staleness); None: not measured
    stale_kv_gap: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)

    @cached_property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def finished(self) -> bool:
        """Ended by eos (not by a length limit)."""
        return not self.truncated

    @cached_property
    def min_version(self) -> int:
        """Oldest policy version among the sampled tokens (-1 if none was sampled)."""
        vs = [v for v in self.versions if v >= 0]
        return min(vs) if vs else -1

    @property
    def max_version(self) -> int:
        """Newest policy version among the sampled tokens (-1 if none was sampled)."""
        return max(self.versions, default=-1)
