"""Tracking (MLflow) and checkpoints."""

from scalerl.tracking.checkpoint import (
    Checkpointer,
    CheckpointError,
    UnsafeCheckpointError,
    load_safe,
    rng_state,
    save_atomic,
    set_rng_state,
)
from scalerl.tracking.tracker import SENTINEL, Tracker, run_params, tracking_uri

__all__ = [
    "SENTINEL",
    "CheckpointError",
    "Checkpointer",
    "UnsafeCheckpointError",
    "load_safe",
    "save_atomic",
    "Tracker",
    "rng_state",
    "run_params",
    "set_rng_state",
    "tracking_uri",
]
