"""Placing pipeline_rl's generator engines: how many on this machine or on tasks of their own,
which GPUs each may see, which threads the trainer keeps and how weights reach the engines. The
numbers come from the run's layout (:mod:`scalerl.layout`), which also refuses, in one line, a
request that does not fit the job."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from scalerl import layout
from scalerl.config.groups.placement import PlacementOption
from scalerl.transport import DEFAULT_TIMEOUT_S


@dataclass
class Placement:
    """Where a mode's generation runs: threads of the trainer and of each engine, the engines'
    device, and for pipeline_rl the engines themselves (local processes, tasks of their own), the
    GPUs each may see and how weights reach them."""

    trainer_threads: int
    generator_threads: int
    generator_device: torch.device
    engines: int = 0  # local engine processes (pipeline_rl)
    remote_engines: int = 0  # engines on tasks of their own (placement.generator_tasks)
    # each local engine's GPUs as CUDA_VISIBLE_DEVICES names them (from the job's own list, not the
    # trainer's narrowed one): what the engine process sets before CUDA starts
    engine_gpus: tuple[tuple[int | str, ...], ...] = ()
    tensor_parallel_size: int = 1
    backend: str = "gloo"  # the weight-update group's: gloo, nccl, or shm
    host: str = "127.0.0.1"  # where the run's store listens (the launcher's MASTER_ADDR)
    port: int = 0
    main: bool = True  # this process hosts the engines (the trainer's rank 0)
    generator_gpus: int = 0  # GPUs the engines hold that no trainer rank uses (devices_held)
    # what the engines on tasks of their own hold (devices_held): their GPUs on GPUs, else their
    # threads (the trainer's rank 0 counts them; 0 on the other ranks)
    remote_devices: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S  # how long the store and the weight-update group wait to meet


def engine_task(options: layout.LayoutOptions) -> int | None:
    """This process's engine number when it is one of a multi-task job's generator tasks (the last
    ``placement.generator_tasks`` ranks) in the layout of ``options``, else None. A trainer rank's plan is then applied
    (:func:`scalerl.layout.apply`): its ``WORLD_SIZE`` becomes the trainer ranks' alone and its
    ``LOCAL_WORLD_SIZE`` the trainer ranks of its node; a trainer on GPUs sees only its node's
    trainer GPUs (``cuda:LOCAL_RANK`` is its device)."""
    plan, me = layout.current(options, raw=True)
    layout.apply(me, plan)
    return me.engine


def store_address(placement: PlacementOption) -> tuple[str, int]:
    """Where the trainer's rank 0 hosts the run's store: the launcher's ``MASTER_ADDR`` and the
    ``placement`` option's ``port`` (0: ``MASTER_PORT`` + 1, the odd port of the job's pair), else this machine
    and any free port."""
    env = os.environ
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return env["MASTER_ADDR"], int(placement.port) or int(env["MASTER_PORT"]) + 1
    return "127.0.0.1", int(placement.port)


def place_engines(options: layout.LayoutOptions, device: torch.device, world: int, threads: int) -> Placement:
    """The placement of a pipeline_rl run's engines, from this rank's layout (``options``: the run's
    trainer, generator, placement and async-mode options, and the launcher's environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``, the GPUs and cores the job gives). ``threads``: the process's thread budget."""
    plan, me = layout.current(options, threads=threads)
    pl = options.placement
    host, port = store_address(pl)
    local = sum(1 for e in plan.engines if e.host == "rank 0")
    gpu = device.type == "cuda" and plan.on_gpu
    engine_gpus = tuple(
        layout.physical_gpus(e.gpus) if gpu else () for e in plan.engines if e.host == "rank 0"
    )
    own = sum(len(g) for g in engine_gpus) if pl.name == "split" else 0
    tasks = [r for r in plan.ranks if r.role == "engine"]
    remote = sum(len(r.visible or ()) if gpu else r.threads for r in tasks)
    return Placement(
        me.threads,
        me.engine_threads or me.threads,
        torch.device("cuda") if gpu else torch.device("cpu"),
        engines=local,
        remote_engines=len(plan.engines) - local,
        engine_gpus=tuple(tuple(_id(g) for g in gs) for gs in engine_gpus),
        tensor_parallel_size=int(pl.tensor_parallel_size),
        backend=plan.backend,
        host=host,
        port=port,
        main=me.rank == 0,
        generator_gpus=own if me.rank == 0 else 0,
        remote_devices=remote if me.rank == 0 else 0,
        timeout_s=float(pl.timeout_s),
    )


def _id(gpu: str) -> int | str:
    """A CUDA_VISIBLE_DEVICES id: an index as a number, a UUID (``GPU-...``, ``MIG-...``) as it is."""
    return int(gpu) if gpu.isdigit() else gpu
