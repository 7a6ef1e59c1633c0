"""``async_mode``: where each optimiser step's groups come from (the modes: :mod:`scalerl.rollout.modes`)."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.config.checks import at_least, one_of, positive, problems
from scalerl.config.options import Option, register_option

# how weights reach a pipeline_rl generator process (scalerl.transport implements each)
TRANSPORTS = ("auto", "gloo", "nccl", "shm")


@register_option("async_mode", "sync")
@dataclass
class SyncOptions(Option):
    """Generate one batch with the current weights, take one optimiser step, repeat."""

    name: str = "sync"


@register_option("async_mode", "ppo_off_policy")
@dataclass
class PPOOffPolicyOptions(Option):
    """Generate `minibatches` batches with the current weights, then take one optimiser step on each."""

    name: str = "ppo_off_policy"
    minibatches: int = 8  # optimiser steps per generation round

    def check(self):
        return problems(at_least("minibatches", self.minibatches, 1))


@register_option("async_mode", "pipeline_rl")
@dataclass
class PipelineRLOptions(Option):
    """Generator and trainer run concurrently; new weights reach the generator in flight."""

    name: str = "pipeline_rl"
    # the trainer waits while its batch holds a policy older than step - max_lag (the paper's k; 4
    # and 8 performed the same there)
    max_lag: int = 8
    # how far ahead of the trainer the generator may run (work given to it and groups it finished,
    # not yet trained on), in batches; more than max_lag only makes stale groups, and `${.max_lag}`
    # lets a generator faster than the trainer fill the lag allowed. 2 keeps the lag near 1 with
    # k = 8 as the bound: the embedded default stays steady past its budget that way (measured:
    # benchmarks/results/README.md, "The default's regime")
    max_buffered_batches: float = 2.0
    # how weights reach the engines: auto (NCCL from a GPU trainer to engines on GPUs of their own,
    # else gloo), gloo, nccl, or shm (shared memory, HF engines on this machine)
    transport: str = "auto"

    def check(self):
        return problems(
            at_least("max_lag", self.max_lag, 1),
            positive("max_buffered_batches", self.max_buffered_batches),
            one_of("transport", self.transport, TRANSPORTS),
        )
