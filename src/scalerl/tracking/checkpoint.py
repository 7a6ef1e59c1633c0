"""Checkpoints that hold no code and survive faults.

``<out_dir>/checkpoint/last.pt`` holds model, optimiser, RNG states, data position, pass-rate
history and the MLflow run id: tensors and plain Python values only (numbers, strings, lists,
tuples, dicts), loaded with ``torch.load(weights_only=True)``, so a crafted file cannot run code
when a run resumes. Each save goes to a temporary file that is fsynced and renamed into place; the
checkpoint it replaces is kept as ``previous.pt`` until then. A latest checkpoint that is
truncated, corrupt or not a checkpoint is reported in one line and the previous one is used.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import numpy as np
import torch

from scalerl.storage import CheckpointError, UnsafeCheckpointError, load_safe, save_atomic

log = logging.getLogger("scalerl")


def rng_state() -> dict:
    """Every RNG stream of this process, as tensors and plain values (safe to load)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
            pos,
            has_gauss,
            cached,
        ),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """``<out_dir>/checkpoint/last.pt`` (and the one before it, ``previous.pt``)."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir) / "checkpoint"
        self.path = self.dir / "last.pt"
        self.previous = self.dir / "previous.pt"
        self.latest_unusable = False  # load() resumed from previous.pt: the next save must keep it

    def exists(self) -> bool:
        return self.path.is_file() or self.previous.is_file()

    def save(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(f".{self.path.name}.tmp*"):  # a run killed while it saved left it
            stale.unlink(missing_ok=True)
        if self.path.is_file() and not self.latest_unusable:
            # a hard link keeps the current checkpoint as `previous` until the new one is in place
            self.previous.unlink(missing_ok=True)
            os.link(self.path, self.previous)
        save_atomic(state, self.path)
        self.latest_unusable = False

    def load(self) -> dict:
        """The newest usable checkpoint: ``last.pt``, or ``previous.pt`` (with a warning) when the
        latest is truncated or corrupt. CheckpointError when there is none to resume from. A refused
        (code-carrying) latest checkpoint is never skipped: that is an error."""
        if not self.path.is_file():
            if self.previous.is_file():  # killed between unlinking the old and renaming the new
                return load_safe(self.previous)
            raise CheckpointError(f"no checkpoint in {self.dir}")
        try:
            return load_safe(self.path)
        except UnsafeCheckpointError:
            raise
        except CheckpointError as e:
            if not self.previous.is_file():
                raise
            log.warning("%s; resuming from the one before it, %s", e, self.previous)
            state = load_safe(self.previous)
            self.latest_unusable = True
            return state
