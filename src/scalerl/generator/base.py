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


class Generator(abc.ABC):
    """Samples groups of completions from the policy at version :attr:`version`."""

    version: int = 0  # the policy version of the weights this generator holds

    @abc.abstractmethod
    def generate(
        self,
        prompts: Sequence[Any],
        n: int,
        *,
        version: int,
        group_ids: list[int] | None = None,
        weight_update: Callable[[], int | None] | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt, groups in prompt order, their tokens stamped ``version``.

        ``weight_update``: called between decode steps; when it returns a version, newer weights
        have been put into the generator's model in place, and later tokens carry that version."""

    @abc.abstractmethod
    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        """Generate from ``weights`` from now on, as policy ``version`` (sets :attr:`version`)."""

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
