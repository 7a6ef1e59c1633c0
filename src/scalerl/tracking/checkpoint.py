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
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("scalerl")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message is one line for the user."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding objects other than tensors and plain values: refused, never skipped."""


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


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, fsync, rename into place (the temporary
    file is removed when the save fails, e.g. on a full disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(obj, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself reaches the disk
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - directories cannot be fsynced on some systems
        pass


def load_safe(path: Path) -> dict:
    """A checkpoint file's contents, loaded without running any code; CheckpointError (one line)
    if it is unreadable, truncated, not a checkpoint, or holds objects other than tensors and plain
    values."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsafeCheckpointError(
            f"checkpoint {path} holds objects other than tensors and plain values, refused "
            f"(loading it could run code): {first[:200]}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {first[:200]}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is not a scalerl checkpoint (a {type(state).__name__})")
    return state


class Checkpointer:
    """``<out_dir>/checkpoint/last.pt`` (and the one before it, ``previous.pt``)."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir) / "checkpoint"
        self.path = self.dir / "last.pt"
        self.previous = self.dir / "previous.pt"

    def exists(self) -> bool:
        return self.path.is_file() or self.previous.is_file()

    def save(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            # a hard link keeps the current checkpoint as `previous` until the new one is in place
            self.previous.unlink(missing_ok=True)
            os.link(self.path, self.previous)
        save_atomic(state, self.path)

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
            return load_safe(self.previous)
