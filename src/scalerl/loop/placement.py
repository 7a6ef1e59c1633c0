"""Placing pipeline_rl's generator engines: how many on this machine or on tasks of their own,
which GPUs each may see, which GPU each trainer rank takes, how weights reach them, and one clear
line when the request does not fit the job."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from scalerl.loop.errors import RunError


@dataclass
class Placement:
    """Where a mode's generation runs: threads of the trainer and of each engine, the engines'
    device, and for pipeline_rl the engines themselves (local processes, tasks of their own), the
    GPUs each may see and how weights reach them."""

    trainer_threads: int
    generator_threads: int
    generator_device: torch.device
    trainer_device: torch.device | None = None  # the trainer's device after placement (None: as asked)
    engines: int = 0  # local engine processes (pipeline_rl)
    remote_engines: int = 0  # engines on tasks of their own (placement.generator_tasks)
    engine_gpus: tuple[tuple[int, ...], ...] = ()  # physical GPUs of each local engine
    tensor_parallel_size: int = 1
    backend: str = "gloo"  # the weight-update group's: gloo, nccl, or shm
    host: str = "127.0.0.1"  # where the run's store listens (the launcher's MASTER_ADDR)
    port: int = 0
    main: bool = True  # this process hosts the engines (the trainer's rank 0)
    generator_gpus: int = 0  # GPUs the engines hold that no trainer rank uses (devices_held)


def _backend(cfg, trainer: torch.device, engines_on_own_gpus: bool) -> str:
    """``async_mode.transport``; ``auto``: NCCL from a GPU trainer to engines on GPUs of their own,
    else gloo (two processes on one GPU cannot pair over NCCL)."""
    name = str(cfg.async_mode.transport)
    if name != "auto":
        return name
    return "nccl" if trainer.type == "cuda" and engines_on_own_gpus else "gloo"


def engine_task(cfg) -> int | None:
    """This process's engine number when it is one of a multi-task job's generator tasks (the last
    ``placement.generator_tasks`` ranks), else None; a trainer's ``WORLD_SIZE`` then becomes the
    trainer ranks' alone (the tasks before them)."""
    tasks = int(cfg.placement.get("generator_tasks", 0) or 0)
    if not tasks:
        return None
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world <= tasks:
        raise RunError(
            f"placement.generator_tasks={tasks}: the job has {world} task(s); it needs at least {tasks + 1} "
            "(the trainer ranks first, then one task per engine)"
        )
    if rank >= world - tasks:
        return rank - (world - tasks)
    os.environ["WORLD_SIZE"] = str(world - tasks)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    os.environ["LOCAL_WORLD_SIZE"] = str(min(local_world, world - tasks))
    return None


def store_address(cfg) -> tuple[str, int]:
    """Where the trainer's rank 0 hosts the run's store: the launcher's ``MASTER_ADDR`` and
    ``placement.port`` (0: ``MASTER_PORT`` + 1), else this machine and any free port."""
    env = os.environ
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return env["MASTER_ADDR"], int(cfg.placement.port) or int(env["MASTER_PORT"]) + 1
    return "127.0.0.1", int(cfg.placement.port)


def place_engines(cfg, device: torch.device, world: int, threads: int) -> Placement:
    """The placement of a pipeline_rl run's engines, from ``cfg.placement`` and the launcher's
    environment (``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
    pl = cfg.placement
    env = os.environ
    rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    tp = int(pl.tensor_parallel_size)
    remote = int(pl.get("generator_tasks", 0) or 0)
    engines = 0 if remote else int(pl.engines)
    launched = "MASTER_ADDR" in env and "MASTER_PORT" in env
    if remote and not launched:
        raise RunError(
            f"placement.generator_tasks={remote} runs engines on tasks of a multi-task job: start it with "
            "launcher=slurm and launcher.tasks_per_node / launcher.nodes (or torchrun), which set "
            "MASTER_ADDR and MASTER_PORT"
        )
    host, port = store_address(cfg)
    common = dict(
        engines=engines,
        remote_engines=remote,
        tensor_parallel_size=tp,
        host=host,
        port=port,
        main=rank == 0,
    )
    if device.type != "cuda":
        # the engines on this machine take half of the cores, shared among them
        gen_total = max(1, threads // 2) if engines else 0
        per_engine = max(1, gen_total // max(1, engines))
        return Placement(
            max(1, threads - gen_total),
            per_engine,
            torch.device("cpu"),
            engine_gpus=((),) * engines,
            backend=_backend(cfg, device, False),
            **common,
        )
    count = torch.cuda.device_count()
    mine = device.index if device.index is not None else torch.cuda.current_device()
    if pl.name != "split":
        if tp > 1:
            raise RunError(
                f"placement.tensor_parallel_size={tp} with placement=colocated: an engine over {tp} GPUs "
                "needs GPUs of its own (placement=split)"
            )
        return Placement(
            threads,
            threads,
            torch.device("cuda"),
            engine_gpus=((mine,),) * engines,
            backend=_backend(cfg, device, False),
            **common,
        )
    need = engines * tp
    gens = [int(g) for g in pl.generator_devices] or list(range(count - need, count))
    if len(gens) != need or len(set(gens)) != need:
        raise RunError(
            f"placement.generator_devices={gens}: must be {need} distinct GPUs "
            f"(placement.engines={engines} x placement.tensor_parallel_size={tp})"
        )
    if any(g < 0 or g >= count for g in gens):
        raise RunError(f"placement.generator_devices={gens}: this node has GPUs 0-{count - 1}")
    trainer_gpus = [g for g in range(count) if g not in gens]
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    if local_world > len(trainer_gpus):
        raise RunError(
            f"placement=split: {local_world} trainer process(es) on this node and {len(trainer_gpus)} GPU(s) "
            f"left for them after placement.generator_devices={gens} (the node has {count})"
        )
    return Placement(
        threads,
        threads,
        torch.device("cuda"),
        trainer_device=torch.device("cuda", trainer_gpus[local]),
        engine_gpus=tuple(tuple(gens[e * tp : (e + 1) * tp]) for e in range(engines)),
        backend=_backend(cfg, device, True),
        generator_gpus=need if rank == 0 else 0,
        **common,
    )
