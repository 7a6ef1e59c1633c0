"""Trainers: recompute log-probs under the precision policy, apply the loss, step the optimiser.

One :class:`Trainer` step over an engine from :data:`ENGINES` (``trainer.name``)."""

from __future__ import annotations

from scalerl.trainer.batch import TrainBatch, collate
from scalerl.trainer.deepspeed_engine import DeepSpeedEngine
from scalerl.trainer.engine import Engine, build_optimizer
from scalerl.trainer.torch_engine import TorchEngine
from scalerl.trainer.trainer import NonFiniteError, Trainer

# trainer.name -> the engine (DeepSpeed itself is imported when its engine is built)
ENGINES: dict[str, type[Engine]] = {"torch": TorchEngine, "deepspeed": DeepSpeedEngine}


def make_trainer(cfg, model, precision, *, temperature: float, device) -> Trainer:
    name = cfg.trainer.name
    if name not in ENGINES:
        raise ValueError(f"trainer.name={name!r}: one of {', '.join(sorted(ENGINES))}")
    engine = ENGINES[name](model, cfg.trainer, device)
    return Trainer(engine, precision, cfg, temperature=temperature)


__all__ = [
    "ENGINES",
    "DeepSpeedEngine",
    "Engine",
    "NonFiniteError",
    "TorchEngine",
    "TrainBatch",
    "Trainer",
    "build_optimizer",
    "collate",
    "make_trainer",
]
