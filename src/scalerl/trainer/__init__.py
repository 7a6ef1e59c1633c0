"""Trainers: recompute log-probs under the precision policy, apply the loss, step the optimiser.

One :class:`Trainer` step over an engine from :data:`ENGINES` (``trainer.name``)."""

from __future__ import annotations

from scalerl.config.groups.correction import CorrectionOption
from scalerl.config.groups.loss import LossOption
from scalerl.config.groups.trainer import TorchTrainerOption
from scalerl.config.options import Option
from scalerl.trainer.batch import TrainBatch, collate
from scalerl.trainer.deepspeed_engine import DeepSpeedEngine
from scalerl.trainer.engine import Engine, build_optimizer
from scalerl.trainer.torch_engine import TorchEngine
from scalerl.trainer.trainer import NonFiniteError, Trainer

# trainer.name -> the engine (DeepSpeed itself is imported when its engine is built)
ENGINES: dict[str, type[Engine]] = {"torch": TorchEngine, "deepspeed": DeepSpeedEngine}


def make_trainer(
    model,
    precision,
    *,
    trainer: TorchTrainerOption,
    loss: LossOption,
    aggregation: Option,
    correction: CorrectionOption,
    temperature: float,
    device,
) -> Trainer:
    """The run's trainer over ``model``: the engine ``trainer.name`` names, built from the ``trainer``
    option, and the step's ``loss``, ``aggregation`` and ``correction`` options (each the chosen
    option's dataclass, ``scalerl.config.groups``)."""
    name = trainer.name
    if name not in ENGINES:
        raise ValueError(f"trainer.name={name!r}: one of {', '.join(sorted(ENGINES))}")
    engine = ENGINES[name](model, trainer, device)
    return Trainer(
        engine,
        precision,
        trainer=trainer,
        loss=loss,
        aggregation=aggregation,
        correction=correction,
        temperature=temperature,
    )


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
