"""Sweeps: many training runs from one YAML file, launched with submitit (locally or on SLURM),
tracked as one MLflow experiment (a parent run + a child run per variant) and compared by the
fitted scaling-curve parameters A and B.

``python sweep.py --loo`` (see :mod:`scalerl.sweep.cli` and ``sweeps/README.md``).
"""

from scalerl.config.settings import build_config  # what every job runs (config composition)
from scalerl.sweep.plan import Plan, PlannedRun, make_plan, plan_lines
from scalerl.sweep.spec import SweepError, SweepSpec, load_spec, parse_spec

__all__ = [
    "Plan",
    "PlannedRun",
    "SweepError",
    "SweepSpec",
    "build_config",
    "load_spec",
    "make_plan",
    "parse_spec",
    "plan_lines",
]
