"""``placement``: which devices (and, in a multi-task job, which tasks) generate and which train.

* ``colocated``: generation shares the trainer's devices: in the trainer's process (sync,
  ppo_off_policy) or in ``engines`` generator processes beside it (pipeline_rl; on a CPU they share
  the generator's half of the threads).
* ``split``: generation has devices of its own (pipeline_rl): ``engines`` engines of
  ``tensor_parallel_size`` GPUs each on ``generator_devices`` of every node (the trainer's ranks take
  the others), or on tasks of their own: the last ``generator_tasks`` tasks of a SLURM/torchrun job.

Each generator process sees only its own GPUs (``CUDA_VISIBLE_DEVICES``, set before CUDA starts);
the trainer sends every update to all engines' workers through one weight-update group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl.config.checks import at_least, in_range, positive, problems
from scalerl.config.options import Option, register_option

MAX_TIMEOUT_S = 1e7  # about 116 days


@dataclass
class PlacementOption(Option):
    name: str = ""
    engines: int = 1  # generator engines (pipeline_rl: one process each)
    tensor_parallel_size: int = 1  # devices per engine (generator=vllm)
    # the store through which engines meet the trainer: 0 = MASTER_PORT + 1 under a launcher, else any free
    port: int = 0
    bucket_mb: float = 256.0  # weights are broadcast in buckets of at most this size
    # seconds an engine waits for the trainer's store, and the trainer for every engine to build its
    # model and join the weight-update group (raise it where loading a large model takes longer)
    timeout_s: float = 600.0

    def check(self):
        return problems(
            at_least("engines", self.engines, 1),
            # the store's and the weight-update group's timeout too: a timedelta takes no more
            ("timeout_s", self.timeout_s, f"a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]")
            if not 0 < self.timeout_s <= MAX_TIMEOUT_S
            else None,
            at_least("tensor_parallel_size", self.tensor_parallel_size, 1),
            in_range("port", self.port, 0, 65535),
            positive("bucket_mb", self.bucket_mb),
        )


@register_option("placement", "colocated")
@dataclass
class Colocated(PlacementOption):
    """Generation on the trainer's devices (vLLM sleeping while the trainer steps on a GPU)."""

    name: str = "colocated"


@register_option("placement", "split")
@dataclass
class Split(PlacementOption):
    """Generation on devices of its own, streaming to the trainer (async_mode=pipeline_rl)."""

    name: str = "split"
    # GPUs of each node for the engines (indices); empty: the node's last engines x tensor_parallel_size
    generator_devices: list[int] = field(default_factory=list)
    # tasks of a multi-task job that run an engine each instead of a trainer rank (the job's last ones)
    generator_tasks: int = 0

    def check(self):
        return super().check() + problems(
            at_least("generator_tasks", self.generator_tasks, 0, ""),
            *(at_least("generator_devices", d, 0, "GPU indices ") for d in self.generator_devices),
        )
