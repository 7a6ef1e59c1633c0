"""Atomic checkpoints: model, optimiser, RNG states, data position, pass-rate history, MLflow run id."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """``<out_dir>/checkpoint/last.pt``, written to a temporary file and renamed into place."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir) / "checkpoint"
        self.path = self.dir / "last.pt"

    def exists(self) -> bool:
        return self.path.is_file()

    def save(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        torch.save(state, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def load(self) -> dict:
        return torch.load(self.path, map_location="cpu", weights_only=False)
