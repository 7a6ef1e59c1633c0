"""scalerl: predictable RL training of LLMs (the ScaleRL recipe, scaling-curve fits, sweeps)."""

__version__ = "0.1.0"
