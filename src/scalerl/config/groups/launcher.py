"""``launcher``: where a sweep's runs execute (submitit executors).

A run is one job of ``nodes x tasks_per_node`` tasks (processes). With one task the run is one
process, as ``python train.py``. With several, each task is one rank of the run, as under
``torchrun`` (``scalerl.sweep.job.export_task_env`` sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the job), so several tasks need
``trainer=deepspeed``."""

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
    max_parallel: int = 0  # variants at once; 0 = sized to the machine (a core per task, at least 1)
    timeout_min: int = 120
    max_requeue: int = 3
    nodes: int = 1  # this machine only: always 1
    # processes per run (ranks of one run, as torchrun --nproc_per_node); > 1 needs trainer=deepspeed
    tasks_per_node: int = 1
    # with two or more runs at once, each run's processes held to its own share of the cores
    # (Linux sched_setaffinity), given all of them once no run waits for a share; off by default:
    # a gain in plateau pairs, not yet measured on a whole study (benchmarks/results)
    pin_cores: bool = False

    def check(self):
        return problems(
            at_least("max_parallel", self.max_parallel, 0, ""),
            at_least("timeout_min", self.timeout_min, 1),
            at_least("max_requeue", self.max_requeue, 0, ""),
            (
                (
                    "nodes",
                    self.nodes,
                    "1 (launcher=local runs on this machine; use launcher=slurm for several nodes)",
                )
                if self.nodes != 1
                else None
            ),
            at_least("tasks_per_node", self.tasks_per_node, 1),
        )


@register_option("launcher", "slurm")
@dataclass
class Slurm(Option):
    """SLURM job arrays through submitit; a run is one job of ``nodes x tasks_per_node`` tasks."""

    name: str = "slurm"
    partition: Optional[str] = None
    nodes: int = 1
    tasks_per_node: int = 1  # processes (ranks) per node; > 1 needs trainer=deepspeed
    # GPUs held on each node, seen by every task of the node (task k uses cuda:LOCAL_RANK)
    gpus_per_node: int = 0
    # or per task: the node holds tasks_per_node x gpus_per_task (set one of the two)
    gpus_per_task: int = 0
    cpus_per_task: int = 2
    mem_gb: int = 8  # per node
    timeout_min: int = 60
    array_parallelism: int = 16
    max_requeue: int = 3
    additional_parameters: dict[str, Any] = field(default_factory=dict)

    def node_gpus(self) -> int:
        """GPUs requested on each node (``--gpus-per-node``)."""
        return self.gpus_per_node or self.tasks_per_node * self.gpus_per_task

    def check(self):
        return problems(
            ("partition", self.partition, "a partition name, or null for the cluster's default")
            if self.partition is not None and not self.partition.strip()
            else None,
            at_least("nodes", self.nodes, 1),
            at_least("tasks_per_node", self.tasks_per_node, 1),
            at_least("gpus_per_node", self.gpus_per_node, 0, ""),
            at_least("gpus_per_task", self.gpus_per_task, 0, ""),
            (
                (
                    "gpus_per_task",
                    self.gpus_per_task,
                    f"0 when launcher.gpus_per_node is set ({self.gpus_per_node}): set one of the two "
                    "(gpus_per_node = tasks_per_node x gpus_per_task)",
                )
                if self.gpus_per_task > 0 and self.gpus_per_node > 0
                else None
            ),
            at_least("cpus_per_task", self.cpus_per_task, 1),
            at_least("mem_gb", self.mem_gb, 1),
            at_least("timeout_min", self.timeout_min, 1),
            at_least("array_parallelism", self.array_parallelism, 1),
            at_least("max_requeue", self.max_requeue, 0, ""),
        )
