"""The plain PyTorch engine: one process, the policy's own backward, a torch AdamW step."""

from __future__ import annotations

import math

import torch
from torch import nn

from scalerl.config.groups.trainer import TorchTrainerOption
from scalerl.model.precision import has_rounded_weights, weights_rounded_once
from scalerl.trainer.engine import Engine, build_optimizer


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, model: nn.Module, trainer: TorchTrainerOption, device: torch.device):
        self.module = model
        self.device = device
        self.grad_clip = float(trainer.grad_clip)
        self.optimizer, self.scheduler = build_optimizer(model.parameters(), trainer)
        # emulated low precision rounds each weight at every read: a micro-batch's forward passes
        # (length buckets, shared prompts) read it once per body call; rounded once per forward here
        self.round_weights_once = True

    def forward(self, fn, *args, **kwargs):
        if self.round_weights_once and has_rounded_weights(self.module):
            with weights_rounded_once():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_and_step(self, finite: bool) -> float:
        if not finite:
            return float("nan")
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            norm = (
                torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
                if params
                else torch.zeros(())
            )
        norm = float(norm)
        if not math.isfinite(norm):
            return norm
        self.optimizer.step()
        self.scheduler.step()
        return norm

    def state_dict(self) -> dict:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
