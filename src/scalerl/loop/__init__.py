"""The training loop: async modes, rollouts -> filters -> advantages -> trainer -> tracking."""

from scalerl.loop.errors import RunError
from scalerl.loop.run import train
from scalerl.loop.setup import build

__all__ = ["RunError", "build", "train"]
