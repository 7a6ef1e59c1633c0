"""Async modes (paper Sec. 3.1): where each optimiser step's groups come from, and how new weights
reach the policy that generates them. Each mode owns its staleness rule and its parameters
(the ``async_mode`` option):

* ``sync``: generate one batch with the current weights, one optimiser step, repeat.
* ``ppo_off_policy`` (``minibatches``): generate that many batches with the current weights, then
  one optimiser step on each in turn; the last is ``minibatches - 1`` versions old.
* ``pipeline_rl`` (``max_lag``, ``max_buffered_batches``): generator engines in processes of their
  own (:mod:`scalerl.rollout.engine`, placed by the ``placement`` option) stream groups while the trainer
  trains; new weights reach them in flight after every step; the trainer waits when it would be
  more than ``max_lag`` versions ahead of the oldest policy that produced data it has still to
  train on, and drops buffered groups older than that. The engines may run up to
  ``max_buffered_batches`` batches ahead of the trainer (the default 2 keeps the lag near 1; at
  ``max_lag`` a faster generator fills the whole lag allowed, as in PipelineRL-k). With several
  trainer ranks, rank 0 receives every rank's groups and hands each its share.

A mode reports what its generation cost into the run state: ``gen_busy``, ``gen_tokens`` (this
rank's), ``stale_dropped``, ``verifier_errors``, ``next_group_id``.
"""

from __future__ import annotations

import abc
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Union

import numpy as np
import torch

from scalerl import distributed, layout
from scalerl.config.groups.async_mode import PipelineRLOptions, PPOOffPolicyOptions, SyncOptions
from scalerl.config.groups.filter import FilterOption
from scalerl.config.groups.generator import GeneratorOption
from scalerl.generator import Generator, Sample
from scalerl.model.weights import PolicyWeights
from scalerl.rollout.placement import Placement, place_engines
from scalerl.rollout.prompts import PromptSampler
from scalerl.state import RunState
from scalerl.task.base import Task

if TYPE_CHECKING:
    from scalerl.rollout.pool import EnginePool


def carries_signal(group: list[Sample], exclude_truncated: bool = False) -> bool:
    """Whether ``group`` (scored) survives the zero-variance filter: the rewards of its samples
    (those not cut off at the token budget, with ``exclude_truncated``) are not all equal. The same
    test as :func:`algo.zero_variance_mask` on the float32 rewards :func:`prepare_batch` builds
    (exact equality), without a tensor per group: the async modes ask it of every buffered group."""
    kept = [s.reward for s in group if not (exclude_truncated and s.truncated)]
    if not kept or all(r == kept[0] for r in kept):  # equal floats stay equal in float32
        return False
    return len({float(np.float32(r)) for r in kept}) > 1


@dataclass
class Rollouts:
    """What a mode generates with: built once by the loop. Of the run's options a mode reads its
    own (``async_mode``), the ``filter`` option and, for pipeline_rl's engines, the ``generator``
    option (its ``chunk_prompts``, ``continuous`` and concurrency) and the trainer's ``batch_size``."""

    async_mode: Union[SyncOptions, PPOOffPolicyOptions, PipelineRLOptions]
    filter: FilterOption
    generator_option: GeneratorOption
    task: Task
    # (prompts, groups) -> the verifier's counts; sets each sample's correct and reward
    # (scalerl.task.score.score_groups over the task with the run's reward, length control and
    # verifier time limit)
    score: Callable[[list, list], Counter[str]]
    sampler: PromptSampler
    generator: Generator  # in this process, over the trainer's module (rollouts, evaluation)
    gathered: Callable[[], AbstractContextManager]  # the trainer's whole-weights context (ZeRO-3)
    state: RunState
    prompts_per_step: int  # this rank's groups per optimiser step
    group_size: int  # samples per prompt
    total_steps: int
    batch_size: int  # trainer.batch_size: samples per optimiser step, every rank's together
    placement: Placement
    world: int = 1  # trainer processes
    engines: EnginePool | None = None  # pipeline_rl: the engine pool


class AsyncMode(abc.ABC):
    name: ClassVar[str]

    def __init__(self, rollouts: Rollouts):
        self.r = rollouts
        f = rollouts.filter
        # filter.dynamic_sampling: zero-variance groups are replaced by groups of more prompts (it
        # acts only with the zero-variance filter, which drops them)
        self.dynamic_sampling = bool(f.dynamic_sampling) and bool(f.zero_variance)
        self._exclude_truncated = bool(f.exclude_truncated)

    @classmethod
    def place(
        cls, options: layout.LayoutOptions, device: torch.device, world: int, threads: int
    ) -> Placement:
        """Called before the model is built: the generator shares the trainer's threads and device."""
        return Placement(threads, threads, device)

    @abc.abstractmethod
    def next_groups(self) -> list[list[Sample]]:
        """This rank's scored groups for the next optimiser step."""

    @abc.abstractmethod
    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        """The trainer's weights after optimiser step ``version``: generate from them from now on."""

    def close(self) -> None:  # noqa: B027 - most modes start nothing
        """Stop whatever the mode started."""

    def feed(self) -> None:  # noqa: B027 - a mode that generates when asked has nothing to start early
        """The trainer's new weights are announced and it turns to other work (evaluating,
        checkpointing, logging) before it asks for the next step's groups: start now what that
        step would start, so that generators of their own keep generating meanwhile."""

    def signal(self, group: list[Sample]) -> bool:
        """Whether ``group`` survives the zero-variance filter (always, without dynamic sampling)."""
        return not self.dynamic_sampling or carries_signal(group, self._exclude_truncated)


class PPOOffPolicy(AsyncMode):
    name = "ppo_off_policy"

    def __init__(self, rollouts: Rollouts, minibatches: int | None = None):
        super().__init__(rollouts)
        self.minibatches = int(rollouts.async_mode.minibatches if minibatches is None else minibatches)
        self.queue: list[list[list[Sample]]] = []  # generated, not yet trained on

    def next_groups(self) -> list[list[Sample]]:
        if not self.queue:
            self._generate(min(self.minibatches, self.r.total_steps - self.r.state.step))
        return self.queue.pop(0)

    def _generate(self, n_batches: int) -> None:
        """``n_batches`` batches of groups from the current weights. With dynamic sampling, groups
        of more prompts until ``P * n_batches`` of them carry signal or the generated groups reach
        ``max_gen_batches`` times that; each batch then holds ``P`` such groups (the last any
        surplus), and the first also the zero-variance groups, which the filter drops."""
        P = self.r.prompts_per_step
        want = P * n_batches
        groups = self._rollout(want)
        if not self.dynamic_sampling:
            self.queue = [groups[j * P : (j + 1) * P] for j in range(n_batches)]
            return
        limit = int(self.r.filter.max_gen_batches) * want
        useful: list[list[Sample]] = []
        dropped: list[list[Sample]] = []
        generated = 0
        while True:
            for g in groups:
                (useful if self.signal(g) else dropped).append(g)
            generated += len(groups)
            if len(useful) >= want or generated >= limit:
                break
            # about as many prompts as the missing groups need at the share that carried signal so far
            rate = max(len(useful) / generated, 1 / 8)
            groups = self._rollout(min(limit - generated, P, math.ceil((want - len(useful)) / rate)))
        self.queue = [useful[j * P : (j + 1) * P] for j in range(n_batches - 1)]
        self.queue.append(useful[(n_batches - 1) * P :])
        self.queue[0] = dropped + self.queue[0]

    def _rollout(self, n: int) -> list[list[Sample]]:
        """Scored groups of ``n`` new prompts from the current weights."""
        r, st = self.r, self.r.state
        prompts = r.sampler.next(n)
        t0 = time.perf_counter()
        with r.gathered() if r.generator.samples_from_trainer_module else contextlib.nullcontext():
            groups = r.generator.generate(
                prompts, r.group_size, version=st.step, group_ids=st.new_group_ids(len(prompts))
            )
        st.count_verifier(r.score(prompts, groups))
        st.gen_busy += time.perf_counter() - t0
        st.gen_tokens += sum(len(s.completion_ids) for g in groups for s in g)
        return groups

    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        self.r.generator.load_weights(weights, version)


class Sync(PPOOffPolicy):
    name = "sync"

    def __init__(self, rollouts: Rollouts):
        super().__init__(rollouts, minibatches=1)


class PipelineRL(AsyncMode):
    name = "pipeline_rl"

    def __init__(self, rollouts: Rollouts):
        super().__init__(rollouts)
        mode, g = rollouts.async_mode, rollouts.generator_option
        self.max_lag = int(mode.max_lag)
        self.world = max(1, int(rollouts.world))
        self.P = rollouts.prompts_per_step * self.world  # every rank's groups come through rank 0
        self.capacity = int(math.ceil(self.P * (1 + float(mode.max_buffered_batches))))
        self.chunk = max(1, int(g.chunk_prompts))
        self.pool = rollouts.engines  # the engines (scalerl.rollout.pool.EnginePool)
        if bool(g.continuous) and self.pool is not None:
            full = self.full_capacity(
                g, rollouts.batch_size, rollouts.group_size, self.pool.engines, self.P, self.max_lag
            )
            self.capacity = max(self.capacity, full)
        self.buffer: list[list[Sample]] = []  # finished groups, FIFO
        self.outstanding: dict[int, tuple[int, int]] = {}  # work id -> (version when assigned, groups)
        self.work_id = 0
        self._busy0: tuple[float, float] | None = None  # (run state's, engines') busy seconds at start

    @staticmethod
    def full_capacity(
        generator: GeneratorOption, batch_size: int, group_size: int, engines: int, P: int, max_lag: int
    ) -> int:
        """The groups to keep ahead (buffered or outstanding) so that continuous engines stay full:
        each engine's concurrency in prompts, plus a chunk to start as sequences finish; never more
        than the staleness bound allows, (1 + max_lag) batches (work given at step s is trained on
        by step s + max_lag at the latest). ``max_buffered_batches`` asks for less only where it
        would leave the engines short, so it is raised to this. ``generator``: the generator option;
        ``batch_size`` and ``group_size``: the trainer's batch (samples) and samples per prompt."""
        from scalerl.rollout.engine import engine_concurrency

        G = max(1, int(group_size))
        per_engine = -(-engine_concurrency(generator, batch_size) // G) + max(1, int(generator.chunk_prompts))
        return min(engines * per_engine, P * (1 + max_lag))

    @classmethod
    def place(
        cls, options: layout.LayoutOptions, device: torch.device, world: int, threads: int
    ) -> Placement:
        from scalerl.rollout import server

        server.prestart()  # the engine processes' imports overlap with the model build (train.py, a sweep's job: forked already)
        return place_engines(options, device, world, threads)

    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        """To every engine (the pool broadcasts them; under ZeRO-3 every rank gathers each bucket
        with it); an in-process generator used for evaluation shares the trainer's module."""
        if self.r.generator is not self.pool:
            self.r.generator.load_weights(weights, version)
        self.pool.load_weights(weights, version)

    def next_groups(self) -> list[list[Sample]]:
        """This rank's groups: rank 0 receives every rank's from the engines and scatters them."""
        if not self.pool.placement.main:
            return distributed.scatter_objects(None)
        st, pool = self.r.state, self.pool
        if self._busy0 is None:
            pool.wait_ready()
            # the engines are this run's (their busy seconds count from 0): what they generated
            # for work fed before this first step (feed, during the first evaluation) counts too
            self._busy0 = (st.gen_busy, 0.0)
        self._feed()
        # the trainer at version `step` may train only on data at most max_lag versions old: wait
        # for outstanding work given at that version or before (this step is its last chance: a
        # step later it would arrive too old and be dropped, its generation wasted), drop buffered
        # data older than that; the oldest buffered groups are trained on first (_take)
        oldest_ok = st.step - self.max_lag
        while any(v <= oldest_ok for v, _ in self.outstanding.values()) or self._short():
            self.receive_one(oldest_ok)
        batch, self.buffer = self._take()
        st.gen_busy = self._busy0[0] + pool.busy_seconds - self._busy0[1]
        if self.world > 1:
            n = self.r.prompts_per_step
            useful = [g for g in batch if self.signal(g)]  # every group, without dynamic sampling
            shares = [useful[i * n : (i + 1) * n] for i in range(self.world)]
            shares[0] = [g for g in batch if not self.signal(g)] + shares[0]
            return distributed.scatter_objects(shares)
        return batch

    def feed(self) -> None:
        """Top the engines' work up to the capacity now (rank 0), not when the next step starts:
        the work is assigned at the same step (the trainer's version does not change in between),
        so the same prompts go out at the same version and the staleness bound is unchanged; the
        engines just do not wait out the evaluation or the checkpoint without work."""
        if self.pool.placement.main:
            self._feed()

    def _limit(self) -> int:
        """The most groups one step takes from the buffer."""
        return self.P * (int(self.r.filter.max_gen_batches) if self.dynamic_sampling else 1)

    def _short(self) -> bool:
        """Whether the buffer lacks the next step's groups: ``P`` of them (with dynamic sampling,
        ``P`` that carry signal, unless the step's share of the buffer is already at its limit)."""
        if not self.dynamic_sampling:
            return len(self.buffer) < self.P
        return sum(map(self.signal, self.buffer)) < self.P and len(self.buffer) < self._limit()

    def _take(self) -> tuple[list[list[Sample]], list[list[Sample]]]:
        """(the next step's groups, what stays buffered): the first ``P`` groups, oldest weights
        first (work finishes out of order on a continuous engine: a late piece of an early step,
        taken in arrival order, could wait past its lag bound behind newer groups); with dynamic
        sampling, groups from the front until ``P`` of them carry signal or the limit is reached."""
        self.buffer.sort(key=_oldest_version)  # stable: arrival order among equals
        useful, n = 0, 0
        while n < min(len(self.buffer), self._limit()) and useful < self.P:
            useful += self.signal(self.buffer[n])
            n += 1
        return self.buffer[:n], self.buffer[n:]

    def receive_one(self, oldest_ok: int) -> None:
        """Wait for one piece of finished work; keep its groups, drop buffered groups older than
        ``oldest_ok``, and give the engines work to replace them."""
        st = self.r.state
        wid, groups, errors = self.pool.receive()
        self.outstanding.pop(wid, None)
        st.count_verifier(errors)
        st.gen_tokens += sum(len(s.completion_ids) for g in groups for s in g)
        self.buffer.extend(groups)
        fresh = [g for g in self.buffer if _oldest_version(g) >= oldest_ok]
        st.stale_dropped += len(self.buffer) - len(fresh)
        self.buffer = fresh
        # replaces what was dropped (else nothing might be left to wait for), in whole chunks while
        # other work is out: a piece back frees the room of one. Cut to the room left at every
        # return, the pieces shrink to a prompt or two where most groups carry no signal (dynamic
        # sampling's plateau), each a prefill, a message and a scoring of its own
        self._feed(whole=True)

    def _feed(self, whole: bool = False) -> None:
        """Give the engines work up to the capacity, and no more than the run's last step needs.
        Work given at step s is generated from weights of version >= s and, with the capacity at
        (1 + max_lag) batches, trained on by step s + max_lag at the latest: within the lag.
        ``whole``: no piece smaller than a chunk while work is outstanding (except the run's last)."""
        r, st, P = self.r, self.r.state, self.P
        needed = (r.total_steps - st.step) * P
        while True:
            # with dynamic sampling, buffered zero-variance groups count for nothing: the filter drops them
            ahead = sum(map(self.signal, self.buffer)) + sum(n for _, n in self.outstanding.values())
            # a chunk larger than the room left is cut to it: nothing outstanding and too little
            # room for a whole chunk would otherwise leave the trainer waiting for nothing
            n = min(self.chunk, needed - ahead, self.capacity - ahead)
            if n <= 0 or (whole and self.outstanding and n < min(self.chunk, needed - ahead)):
                return
            prompts = r.sampler.next(n)
            self.pool.submit(self.work_id, prompts, st.new_group_ids(len(prompts)), version=st.step)
            self.outstanding[self.work_id] = (st.step, len(prompts))
            self.work_id += 1

    def close(self) -> None:
        self.pool.close()


def _oldest_version(group: list[Sample]) -> int:
    """The oldest weight version any sampled token of ``group`` came from."""
    return min(s.min_version for s in group if s.num_sampled)


MODES: dict[str, type[AsyncMode]] = {m.name: m for m in (Sync, PPOOffPolicy, PipelineRL)}
