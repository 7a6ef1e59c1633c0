"""``async_mode``: how generation and training interleave (paper Sec. 3.1)."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.config.groups._checks import at_least, positive, problems
from scalerl.config.options import Option, register_option


@register_option("async_mode", "sync")
@dataclass
class Sync(Option):
    """Generate one batch with the current weights, take one optimiser step, repeat."""

    name: str = "sync"


@register_option("async_mode", "ppo_off_policy")
@dataclass
class PPOOffPolicy(Option):
    """Generate `minibatches` batches with the current weights, then take one optimiser step on each."""

    name: str = "ppo_off_policy"
    minibatches: int = 8  # optimiser steps per generation round

    def check(self):
        return problems(at_least("minibatches", self.minibatches, 1))


@register_option("async_mode", "pipeline_rl")
@dataclass
class PipelineRL(Option):
    """Generator and trainer run concurrently; new weights reach the generator in flight."""

    name: str = "pipeline_rl"
    max_lag: int = 8  # the trainer waits while its batch holds a policy older than step - max_lag
    # how many groups the generator may hold finished and unconsumed, in batches
    max_buffered_batches: float = 1.0

    def check(self):
        return problems(
            at_least("max_lag", self.max_lag, 1), positive("max_buffered_batches", self.max_buffered_batches)
        )
