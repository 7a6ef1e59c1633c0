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
        if n < 1:
            raise ValueError(f"n={n}: the samples per prompt must be >= 1")
        group_ids = list(range(len(prompts))) if group_ids is None else list(group_ids)
        if len(group_ids) != len(prompts):
            raise ValueError(
                f"group_ids has {len(group_ids)} ids for {len(prompts)} prompts: it must have one per prompt"
            )
        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        return self._generate(
            prompts,
            prompt_ids,
            n,
            version=version,
            group_ids=group_ids,
            weight_update=weight_update,
            on_step=on_step,
        )

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
