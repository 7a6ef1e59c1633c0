"""The training loop: async modes, rollouts -> filters -> advantages -> trainer -> tracking."""

from scalerl.loop.run import Run, RunError, train

__all__ = ["Run", "RunError", "train"]
