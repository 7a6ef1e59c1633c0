"""Trainers: recompute log-probs under the precision policy, apply the loss, step the optimiser."""

from __future__ import annotations

from scalerl.trainer.batch import TrainBatch, collate
from scalerl.trainer.torch_trainer import NonFiniteError, TorchTrainer


def make_trainer(cfg, model, precision, *, temperature: float, device):
    if cfg.trainer.name == "deepspeed":
        from scalerl.trainer.deepspeed_trainer import DeepSpeedTrainer

        return DeepSpeedTrainer(model, precision, cfg, temperature=temperature, device=device)
    return TorchTrainer(model, precision, cfg, temperature=temperature, device=device)


__all__ = ["NonFiniteError", "TorchTrainer", "TrainBatch", "collate", "make_trainer"]
