"""``launcher``: where a sweep's runs execute (submitit executors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from scalerl.config.checks import at_least, problems
from scalerl.config.options import Option, register_option


@register_option("launcher", "local")
@dataclass
class Local(Option):
    """Variants run as subprocesses on this machine."""

    name: str = "local"
    max_parallel: int = 0  # variants at once; 0 = sized to the machine (cores / 2, at least 1)
    timeout_min: int = 120
    max_requeue: int = 3

    def check(self):
        return problems(
            at_least("max_parallel", self.max_parallel, 0, ""),
            at_least("timeout_min", self.timeout_min, 1),
            at_least("max_requeue", self.max_requeue, 0, ""),
        )


@register_option("launcher", "slurm")
@dataclass
class Slurm(Option):
    """SLURM job arrays through submitit."""

    name: str = "slurm"
    partition: Optional[str] = None
    gpus_per_node: int = 0
    cpus_per_task: int = 2
    mem_gb: int = 8
    timeout_min: int = 60
    array_parallelism: int = 16
    max_requeue: int = 3
    additional_parameters: dict[str, Any] = field(default_factory=dict)

    def check(self):
        return problems(
            at_least("gpus_per_node", self.gpus_per_node, 0, ""),
            at_least("cpus_per_task", self.cpus_per_task, 1),
            at_least("mem_gb", self.mem_gb, 1),
            at_least("timeout_min", self.timeout_min, 1),
            at_least("array_parallelism", self.array_parallelism, 1),
            at_least("max_requeue", self.max_requeue, 0, ""),
        )
