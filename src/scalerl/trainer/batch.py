"""Turn groups of generated samples into the tensors the loss needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainBatch:
    """One optimiser step's data; token tensors are aligned to *targets* (position t predicts t+1)."""

    input_ids: torch.Tensor  # [N, L] prompt + completion, right-padded
    mask: torch.Tensor  # [N, L-1] float, 1 where the target is a sampled completion token
    gen_logp: torch.Tensor  # [N, L-1] behaviour log-probs (0 elsewhere)
    versions: torch.Tensor  # [N, L-1] long, policy version per target token (-1 elsewhere)
    advantages: torch.Tensor  # [N]
    group_ids: torch.Tensor  # [N] long, 0..G-1
    start: int  # first target position that can be a completion token (min prompt length - 1)

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.max().item()) + 1 if self.group_ids.numel() else 0

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum().item())

    def slice_groups(self, lo: int, hi: int) -> TrainBatch:
        """The sub-batch of groups [lo, hi) (group ids are contiguous, in order)."""
        rows = (self.group_ids >= lo) & (self.group_ids < hi)
        return TrainBatch(
            input_ids=self.input_ids[rows],
            mask=self.mask[rows],
            gen_logp=self.gen_logp[rows],
            versions=self.versions[rows],
            advantages=self.advantages[rows],
            group_ids=self.group_ids[rows] - lo,
            start=self.start,
        )

    def to(self, device) -> TrainBatch:
        return TrainBatch(
            input_ids=self.input_ids.to(device),
            mask=self.mask.to(device),
            gen_logp=self.gen_logp.to(device),
            versions=self.versions.to(device),
            advantages=self.advantages.to(device),
            group_ids=self.group_ids.to(device),
            start=self.start,
        )


def collate(groups: list[list], advantages: torch.Tensor, pad_id: int) -> TrainBatch:
    """Pack ``groups`` (lists of generator ``Sample``) with per-sample ``advantages`` (flat, in order)."""
    samples = [s for g in groups for s in g]
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    L = max(lengths)
    n = len(samples)
    ids = torch.full((n, L), pad_id, dtype=torch.long)
    mask = torch.zeros((n, L - 1))
    gen_logp = torch.zeros((n, L - 1))
    versions = torch.full((n, L - 1), -1, dtype=torch.long)
    group_ids = torch.empty(n, dtype=torch.long)
    row = 0
    for gi, g in enumerate(groups):
        for s in g:
            p, c = len(s.prompt_ids), len(s.completion_ids)
            ids[row, :p] = torch.tensor(s.prompt_ids)
            if c:
                ids[row, p : p + c] = torch.tensor(s.completion_ids)
                # target position t predicts token t+1: completion token j sits at target p-1+j
                mask[row, p - 1 : p - 1 + c] = torch.tensor(s.loss_mask, dtype=torch.float32)
                gen_logp[row, p - 1 : p - 1 + c] = torch.tensor(s.logprobs, dtype=torch.float32)
                versions[row, p - 1 : p - 1 + c] = torch.tensor(s.versions, dtype=torch.long)
            group_ids[row] = gi
            row += 1
    start = min(len(s.prompt_ids) for s in samples) - 1
    return TrainBatch(ids, mask, gen_logp, versions, advantages.float(), group_ids, start)
