"""What the training loop needs from a generator, declared: sampling, taking new weights, and its
random state for checkpoints.

After every optimiser step the loop calls :meth:`Generator.load_weights` with the trainer's
:class:`~scalerl.model.weights.PolicyWeights` and the new version, then checks that
:attr:`Generator.version` follows; a generator that ignores new weights stops the run.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from scalerl.generator.sample import Sample
from scalerl.model.weights import PolicyWeights


def encode_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """The prompt's token ids: its own ``prompt_ids`` when it has them, else its text tokenized."""
    ids = getattr(prompt, "prompt_ids", None)
    if ids is None:
        ids = tokenizer(prompt.text)["input_ids"]
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError(f"prompt {getattr(prompt, 'uid', '?')} tokenizes to nothing")
    return ids


def digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """SHA-256 of each tensor's bytes, by name."""
    import hashlib

    out = {}
    for k, v in tensors.items():
        data = v.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[k] = hashlib.sha256(data).hexdigest()
    return out


class Generator(abc.ABC):
    """Samples groups of completions from the policy at version :attr:`version`.

    :meth:`generate` checks its inputs and tokenizes the prompts once for every engine, then calls
    the engine's own :meth:`_generate`."""

    version: int = 0  # the policy version of the weights this generator holds
    tokenizer: Any  # the policy's tokenizer (prompts without their own ``prompt_ids`` are encoded with it)

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
        """``n`` samples for each prompt (objects with ``.uid`` and ``.text``, or ``.prompt_ids``),
        groups in prompt order, their tokens stamped ``version``; ``group_ids``: one id per prompt
        (default 0, 1, ...).

        ``weight_update``: called between decode steps; when it returns a version, newer weights
        have been put into the generator's model in place, and later tokens carry that version.
        ``on_step``: called after every decode step."""
        if not prompts:
            return []
        prompt_ids, group_ids = self._checked(prompts, n, group_ids)
        return self._generate(
            prompts,
            prompt_ids,
            n,
            version=version,
            group_ids=group_ids,
            weight_update=weight_update,
            on_step=on_step,
        )

    def _checked(self, prompts, n: int, group_ids) -> tuple[list[list[int]], list[int]]:
        """(the prompts' token ids, one group id per prompt), inputs checked (one line each)."""
        if n < 1:
            raise ValueError(f"n={n}: the samples per prompt must be >= 1")
        group_ids = list(range(len(prompts))) if group_ids is None else list(group_ids)
        if len(group_ids) != len(prompts):
            raise ValueError(
                f"group_ids has {len(group_ids)} ids for {len(prompts)} prompts: it must have one per prompt"
            )
        return [encode_prompt(self.tokenizer, p) for p in prompts], group_ids

    # continuous generation (optional): a generator that can take new sequences while others run
    continuous: bool = False

    def session(
        self,
        *,
        weight_update: Callable[[], int | None] | None = None,
        on_step: Callable[[], None] | None = None,
        rows: int | None = None,
    ) -> GenerationSession:
        """A :class:`GenerationSession` over this generator (only where :attr:`continuous`):
        ``weight_update`` and ``on_step`` as in :meth:`generate`; ``rows``: the sequences it is
        sized for (it takes more when asked, at some cost)."""
        raise NotImplementedError(f"{type(self).__name__} has no continuous generation")

    @abc.abstractmethod
    def _generate(
        self,
        prompts: Sequence[Any],
        prompt_ids: list[list[int]],
        n: int,
        *,
        version: int,
        group_ids: list[int],
        weight_update: Callable[[], int | None] | None,
        on_step: Callable[[], None] | None,
    ) -> list[list[Sample]]:
        """The engine's sampling, on checked inputs: ``prompt_ids`` are the prompts' token ids (none
        empty), ``n >= 1``, one group id per prompt (:meth:`generate` says what each argument means)."""

    @abc.abstractmethod
    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        """Generate from ``weights`` from now on, as policy ``version`` (sets :attr:`version`)."""

    # a generator over the trainer's own module needs its parameters whole (ZeRO-3) while sampling
    samples_from_trainer_module: bool = True
    # the names of the weights it receives: checkpoint names (vLLM) or the model's state_dict names
    checkpoint_names: bool = False
    # what a run's estimate adds about this generator's timing (it times transformers' decode path)
    estimate_note: str = ""

    # What the run asks of a generator's class before one exists (scalerl.generator.registry.
    # generator_class): the defaults are the hf generator's answers, so a generator that declares
    # nothing is treated as that one is.
    @classmethod
    def default_running(cls, options: Any, batch_size: int) -> int:
        """The sequences a continuous engine keeps running when ``generator.max_running`` is 0:
        one training batch of samples (``batch_size``; a decode step over the transformers model
        costs about the same for 32 rows as for 128 on a CPU)."""
        return int(batch_size)

    @classmethod
    def engine_options(cls, options: Any) -> Any:
        """The options a pipeline_rl engine process builds it with: ``options`` unchanged here. An
        engine of its own generates all the time, so a generator with a sleep mode (freeing the GPU
        while the trainer steps) turns it off here."""
        return options

    def join_weight_group(self, spec: Any, rank: int, store: Any = None) -> None:
        """Join the run's weight-update group (:mod:`scalerl.transport`) as ``rank``: from now
        on :meth:`receive_weights` takes each update the trainer broadcasts."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive weights from another process")

    def receive_weights(self, version: int) -> None:
        """Take the update the trainer announced as ``version`` (collective with the trainer and
        every other receiver), then generate from it."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive weights from another process")

    def fingerprint(self) -> dict[str, str]:
        """SHA-256 of every weight this generator samples with (its own names), to show that it
        holds exactly the weights it was given."""
        return digests(self.model.state_dict())

    # the sampling stream; a generator whose sampling draws from elsewhere overrides the three
    # methods below
    rng: torch.Generator

    def rng_state(self) -> torch.Tensor:
        """The sampling stream's state (saved in checkpoints)."""
        return self.rng.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state from :meth:`rng_state`."""
        self.rng.set_state(state)

    def manual_seed(self, seed: int) -> None:
        """Restart the sampling stream from ``seed``."""
        self.rng.manual_seed(seed)


class GenerationSession(abc.ABC):
    """Continuous generation: sequences join while others run (a slot freed by a finished sequence
    is taken by the next), and each piece of work comes back as soon as all its sequences finished.

    ``add(prompts, n, group_ids=..., tag=...)`` queues ``n`` samples of each prompt as one piece of
    work named ``tag``; they start at the next :meth:`step`. :meth:`step` takes new weights first
    (``weight_update``, exactly as :meth:`Generator.generate` polls it), then generates one token
    for every running sequence and returns ``[(tag, groups)]`` for each piece of work whose
    sequences have all finished (groups in prompt order, the :class:`~scalerl.generator.sample.Sample`
    contract of :meth:`Generator.generate`). Every token carries the version of the generator's
    weights at the step that produced it, also when the weights were changed outside :meth:`step`
    (the session compares :attr:`Generator.version` at every step).

    Not reproducible against :meth:`Generator.generate`'s random stream in general: which random
    numbers a sequence draws depends on what else runs beside it (see each generator's notes)."""

    # True where another generate() on the same generator would step this session's sequences too
    # (vLLM: one engine): the caller drains the session first
    exclusive: bool = False
    # True where the generator itself runs at most its own number of sequences and queues the rest
    # (vLLM's scheduler, max_num_seqs): work may be added while any room is left, and waits there
    queues: bool = False

    def __init__(self, gen: Generator):
        self.gen = gen
        self._stale_measured = (gen.version, 0)  # (weight version, sequences re-scored at it)

    def stale_kv_left(self) -> int:
        """How many more sequences the stale-KV gap (``gen/stale_kv_logprob_gap``) may re-score at
        the generator's present weight version: ``stale_kv_samples`` a version, over every piece of
        work the session finishes at it (a continuous engine finishes many a version, and re-scoring
        a few of each would cost a share of its time)."""
        version, done = self._stale_measured
        spent = done if version == self.gen.version else 0
        return max(0, int(getattr(self.gen, "stale_kv_samples", 0)) - spent)

    def stale_kv_spent(self, n: int) -> None:
        """``n`` more sequences re-scored (or sent to be) at the present weight version."""
        version, done = self._stale_measured
        v = self.gen.version
        self._stale_measured = (v, (done if version == v else 0) + int(n))

    @property
    @abc.abstractmethod
    def running(self) -> int:
        """Sequences added and not yet finished (queued for their first step included)."""

    def add(
        self, prompts: Sequence[Any], n: int, *, group_ids: list[int] | None = None, tag: Any = None
    ) -> None:
        """Queue ``n`` samples of each prompt as one piece of work ``tag`` (inputs checked as
        :meth:`Generator.generate` checks them)."""
        if not prompts:
            raise ValueError("a piece of work needs at least one prompt")
        prompt_ids, group_ids = self.gen._checked(prompts, n, group_ids)
        self._add(list(prompts), prompt_ids, n, group_ids, tag)

    @abc.abstractmethod
    def _add(self, prompts, prompt_ids: list[list[int]], n: int, group_ids: list[int], tag: Any) -> None:
        """:meth:`add` on checked inputs."""

    @abc.abstractmethod
    def step(self) -> list[tuple[Any, list[list[Sample]]]]:
        """One decode step of every running sequence; the pieces of work it finished."""

    def pause(self) -> None:  # noqa: B027 - most sessions hold nothing between steps
        """Before the generator is used otherwise between steps (evaluation, new weights)."""

    def drain(self) -> list[tuple[Any, list[list[Sample]]]]:
        """Step until nothing runs; every piece of work finished meanwhile."""
        done = []
        while self.running:
            done.extend(self.step())
        return done
