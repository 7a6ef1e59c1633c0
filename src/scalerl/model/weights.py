"""What a trainer hands a generator after an optimiser step: its policy's weights, by reference.

A generator that samples from the trainer's own module (the HF generator in the trainer's
process) only needs to know that ``module`` is its model; one that holds a copy (another process,
vLLM) materialises the weights, whole (:meth:`PolicyWeights.tensors`) or a few at a time
(:meth:`PolicyWeights.source`: under ZeRO-3 only those parameters are gathered, a collective, so
every rank must take part).

Two namings: ``state_dict`` names (what another copy of the same HF model loads) and checkpoint
names (:func:`checkpoint_names`: a weight behind a parametrization (emulated low precision) as the
layer computes with it, rounded; a tied LM head once), what vLLM loads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import nn


def _no_gather(params: Iterable[nn.Parameter]) -> AbstractContextManager:
    return contextlib.nullcontext()


def checkpoint_names(module: nn.Module) -> dict[str, tuple[str, str]]:
    """checkpoint name -> (owner module, attribute) for every weight of ``module``."""
    out: dict[str, tuple[str, str]] = {}
    for name in module.state_dict():
        if ".parametrizations." in name:
            if not name.endswith(".original"):
                continue
            owner, _, rest = name.partition(".parametrizations.")
            out[f"{owner}.{rest[: -len('.original')]}"] = (owner, rest[: -len(".original")])
        else:
            owner, _, attr = name.rpartition(".")
            out[name] = (owner, attr)
    if getattr(getattr(module, "config", None), "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)  # vLLM ties it to the input embedding itself
    return out


def _tensor(module: nn.Module, owner: str, attr: str) -> torch.Tensor:
    return getattr(module.get_submodule(owner) if owner else module, attr)


def checkpoint_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight under its checkpoint name, as the layer computes with it (parameters whole)."""
    return {k: _tensor(module, o, a).detach() for k, (o, a) in checkpoint_names(module).items()}


@dataclass
class PolicyWeights:
    module: nn.Module  # the trainer's live policy
    # context in which every parameter of ``module`` is whole (ZeRO-3 gathers them); collective
    gathered: Callable[[], AbstractContextManager] = field(default=contextlib.nullcontext)
    # context in which the given parameters are whole (ZeRO-3 gathers just those); collective
    gather: Callable[[Iterable[nn.Parameter]], AbstractContextManager] = field(default=_no_gather)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight of the policy, as CPU copies (``state_dict`` names)."""
        with self.gathered(), torch.no_grad():
            return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    def names(self, checkpoint: bool) -> list[str]:
        """The names of what :meth:`source` gives: checkpoint names or ``state_dict`` names."""
        return list(checkpoint_names(self.module) if checkpoint else self.module.state_dict())

    def source(
        self, checkpoint: bool
    ) -> Callable[[list[str]], AbstractContextManager[dict[str, torch.Tensor]]]:
        """names -> a context giving those tensors, only their parameters gathered while inside."""
        ck = checkpoint_names(self.module) if checkpoint else None
        params = dict(self.module.named_parameters())

        @contextlib.contextmanager
        def bucket(names: list[str]):
            if ck is not None:
                where = [ck[n] for n in names]
                owned = [
                    p
                    for o, a in where
                    for k, p in params.items()
                    if k == (f"{o}.{a}" if o else a) or k.startswith(f"{o}.parametrizations.{a}.")
                ]
            else:
                owned = [params[n] for n in names if n in params]
            with self.gather(owned), torch.no_grad():
                if ck is not None:
                    yield {n: _tensor(self.module, o, a).detach() for n, (o, a) in zip(names, where)}
                else:
                    state = self.module.state_dict()
                    yield {n: state[n].detach() for n in names}

        return bucket
