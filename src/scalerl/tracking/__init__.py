"""Tracking (MLflow) and checkpoints."""

from scalerl.tracking.checkpoint import Checkpointer, rng_state, set_rng_state
from scalerl.tracking.tracker import SENTINEL, Tracker, run_params, tracking_uri

__all__ = ["SENTINEL", "Checkpointer", "Tracker", "rng_state", "run_params", "set_rng_state", "tracking_uri"]
