"""Which prompts a step trains on: seeded epochs over the train split, skipping retired prompts."""

from __future__ import annotations

import random

from scalerl.messages import RunError
from scalerl.task.base import Prompt


class PromptSampler:
    """Shuffled epochs (seeded per epoch); prompts retired by no-positive-resampling are skipped
    from the moment they retire (paper Sec. 3.2). Its position is part of the checkpoint."""

    def __init__(self, prompts: list[Prompt], seed: int, retired=None, *, rank: int = 0, world: int = 1):
        if not prompts:
            raise ValueError("the task has no training prompts")
        self.prompts = prompts
        self.seed = seed
        self.retired = retired  # object with retired(uid) -> bool, or None
        self.rank, self.world = rank, world
        self.epoch = 0
        self.pos = 0
        self._order = self._perm(0)

    def _perm(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order[self.rank :: self.world]

    def next(self, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        skipped_in_a_row = 0
        while len(out) < n:
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._perm(self.epoch)
            p = self.prompts[self._order[self.pos]]
            self.pos += 1
            if self.retired is not None and self.retired.retired(p.uid):
                skipped_in_a_row += 1
                if skipped_in_a_row > 2 * len(self.prompts):
                    raise RunError(
                        f"every one of the {len(self.prompts)} training prompts is retired (no-positive-resampling): "
                        "nothing left to train on; raise task.num_train, or set filter.no_positive_resampling=false"
                    )
                continue
            skipped_in_a_row = 0
            out.append(p)
        return out

    @property
    def epochs(self) -> float:
        """Passes over this rank's share of the train split so far (fractional): below 1, no prompt
        was drawn twice, so no-positive-resampling had nothing to skip."""
        return self.epoch + self.pos / max(1, len(self._order))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._perm(self.epoch)


class MixedSampler:
    """``task=multi``: each domain's prompts drawn by a :class:`PromptSampler` of its own (seeded per
    domain), interleaved so that every run of consecutive draws holds each domain's share (``mix``)
    to within one prompt: the next draw comes from the domain furthest behind its share. A
    training batch of P prompts so has ``round(share * P)`` of each domain (exactly, up to one)."""

    def __init__(
        self,
        prompts: list[Prompt],
        mix: dict[str, float],
        seed: int,
        retired=None,
        *,
        rank: int = 0,
        world: int = 1,
    ):
        self.domains = list(mix)
        self.mix = dict(mix)
        by_domain = {d: [p for p in prompts if p.domain == d] for d in self.domains}
        empty = [d for d, ps in by_domain.items() if not ps]
        if empty:
            raise ValueError(f"domain(s) {', '.join(empty)} of the task have no training prompts")
        self.samplers = {
            d: PromptSampler(by_domain[d], seed * 7919 + i, retired, rank=rank, world=world)
            for i, d in enumerate(self.domains)
        }
        self.drawn = dict.fromkeys(self.domains, 0)

    def next(self, n: int) -> list[Prompt]:
        out = []
        for _ in range(n):
            total = sum(self.drawn.values()) + 1
            d = max(self.domains, key=lambda k: self.mix[k] * total - self.drawn[k])
            self.drawn[d] += 1
            out.extend(self.samplers[d].next(1))
        return out

    @property
    def epochs(self) -> float:
        """The most passes any domain has made over its prompts (no-positive-resampling acts once
        one domain draws a prompt again)."""
        return max(s.epochs for s in self.samplers.values())

    def state_dict(self) -> dict:
        return {"drawn": dict(self.drawn), "domains": {d: s.state_dict() for d, s in self.samplers.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = {d: int(state["drawn"][d]) for d in self.domains}
        for d, s in self.samplers.items():
            s.load_state_dict(state["domains"][d])


def make_sampler(task, prompts: list[Prompt], seed: int, retired=None, *, rank: int = 0, world: int = 1):
    """The sampler of the task's training prompts: mixed by domain for ``task=multi``."""
    mix = getattr(task, "mix", None)
    if mix:
        return MixedSampler(prompts, mix, seed, retired, rank=rank, world=world)
    return PromptSampler(prompts, seed, retired, rank=rank, world=world)
