"""What a trainer step needs from the machinery that holds the policy and its optimiser.

:class:`scalerl.trainer.Trainer` writes the step once (micro-batches, length buckets, shared
prompts, the loss, statistics, non-finite handling); an engine supplies only the parts that differ
between plain PyTorch and DeepSpeed: the module, the forward wrapper, ``zero_grad``, ``backward``,
the accumulation boundary, clip + optimiser step, collectives, whole weights (ZeRO-3) and its own
checkpoint. The optimiser is AdamW with a linear warm-up to a constant learning rate (paper Sec. 2:
constant LR after 100 warm-up steps), built by :func:`build_optimizer` for every engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from contextlib import AbstractContextManager

import torch
from torch import nn

from scalerl import distributed


def build_optimizer(params: Iterable[nn.Parameter], trainer):
    """(AdamW, its linear warm-up scheduler) from the ``trainer`` option (``TorchTrainerOption``)."""
    optimizer = torch.optim.AdamW(
        params,
        lr=trainer.lr,
        betas=tuple(trainer.betas),
        eps=trainer.adam_eps,
        weight_decay=trainer.weight_decay,
    )
    warm = max(0, trainer.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
    )
    return optimizer, scheduler


class Engine:
    """The base engine: one process (``world`` 1), collectives are identities, nothing to gather,
    no checkpoint of its own. Subclasses set ``module``, ``device``, ``optimizer``, ``scheduler``."""

    module: nn.Module  # the plain policy
    device: torch.device
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    world: int = 1
    rank: int = 0

    # ------------------------------------------------------------------ forward / backward / step
    def adapt_precision(self, precision):
        """The precision policy as this engine needs it applied (default: as it is)."""
        return precision

    def forward(self, fn, *args, **kwargs):
        """Run one trainer forward ``fn(*args, **kwargs)`` (over the policy) through the engine."""
        return fn(*args, **kwargs)

    def zero_grad(self) -> None:
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def set_accumulation_boundary(self, last: bool) -> None:
        """The next backward is (``last``) or is not the step's last micro-batch."""

    def clip_and_step(self, finite: bool) -> float:
        """Clip the accumulated gradient and take the optimiser and scheduler step; returns the
        gradient norm before clipping. ``finite=False`` (a non-finite loss on some rank), or a
        non-finite norm: no step, on every rank alike, and a non-finite return value."""
        raise NotImplementedError

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, values: list[float], op: str) -> list[float]:
        """``values`` combined element-wise over the ranks (``op``: sum, min or max)."""
        if self.world == 1:
            return [float(v) for v in values]
        return distributed.all_reduce(values, op)

    def gather_objects(self, obj) -> list:
        """``[obj of rank 0, obj of rank 1, ...]``."""
        if self.world == 1:
            return [obj]
        return distributed.gather_objects(obj)

    def gathered(self) -> AbstractContextManager:
        """Context in which every parameter of ``module`` is whole (collective where it gathers)."""
        return contextlib.nullcontext()

    def gather_params(self, params) -> AbstractContextManager:
        """Context in which ``params`` (some of ``module``'s) are whole (collective where it gathers)."""
        return contextlib.nullcontext()

    def local_weights(self) -> list[torch.Tensor]:
        """The parameter values this rank holds (all of them; a partitioning engine its shards)."""
        return [p.detach() for p in self.module.parameters()]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """What the run's main checkpoint (written by rank 0 alone) holds for this engine."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def save_checkpoint(self, path: str, tag: str, rank_state: dict | None = None) -> str | None:
        """Write this engine's own checkpoint ``path/tag`` with this rank's ``rank_state`` (collective);
        returns the tag written, or None where the whole state is in :meth:`state_dict`."""
        return None

    def load_checkpoint(self, path: str, tag: str) -> dict | None:
        """Load the checkpoint :meth:`save_checkpoint` wrote; returns this rank's ``rank_state``."""
        return None
