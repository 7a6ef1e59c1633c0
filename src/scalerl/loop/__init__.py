"""The training loop: async modes, rollouts -> filters -> advantages -> trainer -> tracking."""

from scalerl.messages import RunError

__all__ = ["RunError", "build", "train"]


def __getattr__(name: str):
    # imported on first use: the loop pulls in torch, transformers and the trainers (seconds), and
    # what checks a config before a run (scalerl.layout, through train.py's preflight, --cfg job,
    # a sweep's planning) needs none of it
    if name == "train":
        from scalerl.loop.run import train

        return train
    if name == "build":
        from scalerl.loop.setup import build

        return build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
