"""The layout of a run: which process does what, on which node, with which devices, threads, ports
and share of each step's batch, computed before anything starts.

:func:`plan` is pure: from the run's :class:`LayoutOptions` (its trainer, generator, placement and
async-mode options) and a :class:`Launch` (what the launcher gives the
run: torchrun's processes on one node, a SLURM job's ``nodes x tasks_per_node`` tasks with their GPUs
and CPUs, or one plain process) it computes every rank's :class:`RankPlan` and every engine's
:class:`EnginePlan`, and refuses a layout that cannot work with one line (:class:`LayoutError`)
naming the settings and what would work. No process is started, no CUDA call made and no
environment variable read there; :func:`launch_from_env`, :func:`launch_from_launcher` and
:func:`apply` are the thin wrappers that read the environment and apply a rank's plan to it.

The rules, and why:

* Ranks are numbered node by node (SLURM's block distribution, torchrun's node ranks): rank r runs
  on node ``r // tasks_per_node`` as its local rank ``r % tasks_per_node``. With
  ``placement.generator_tasks=N`` the job's last N tasks are engines, one each; the others are the
  trainer ranks, so a node's trainer ranks are its first local ranks.
* GPUs are numbered as indices into what the job gives each node (its ``CUDA_VISIBLE_DEVICES``, or
  all of the node's). A node's trainer ranks take the GPUs its engines leave, in order, and each
  trainer process sees only those (``CUDA_VISIBLE_DEVICES`` set before CUDA starts), so that
  ``cuda:LOCAL_RANK``, the device DeepSpeed places the model on, is also the one the trainer sends its
  batches to. Engine tasks take ``tensor_parallel_size`` GPUs each from what their node's trainer
  ranks leave; engines the trainer's rank 0 starts itself take ``placement.generator_devices`` (or
  the node's last GPUs) of rank 0's node, and run on one node only (:func:`plan` says why).
* Threads come from what the process holds (SLURM's ``cpus_per_task``, else the process's CPU
  affinity shared by the node's tasks), never the machine's core count: a task that took every core
  of a shared node would oversubscribe it.
* Ports of a submitit job (SLURM or the local executor) come in even/odd pairs from the job id: the
  rendezvous (``MASTER_PORT``) on the even port, the run's store on the odd one above it, so the
  next job id of an array (the next pair) never lands on this job's store.
* Every trainer rank trains on ``batch_size / trainer ranks`` samples a step (whole groups).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from scalerl.config.groups.generator import generator_option_class
from scalerl.config.preflight import NODE_GPUS_VAR, listed_gpu_ids, node_gpu_ids
from scalerl.config.validate import ConfigError
from scalerl.messages import RunError

if TYPE_CHECKING:
    from scalerl.config.groups.async_mode import PipelineRLOptions, PPOOffPolicyOptions, SyncOptions
    from scalerl.config.groups.generator import GeneratorOption
    from scalerl.config.groups.launcher import Local, Slurm
    from scalerl.config.groups.placement import PlacementOption
    from scalerl.config.groups.trainer import TorchTrainerOption

# the rendezvous port of a submitit job: derived from the job id (the same in every task and after a
# requeue), below Linux's ephemeral ports (32768-60999) so that no outgoing connection holds it; the
# run's store listens on the port above it, so a job takes a pair of ports and consecutive job ids
# (the elements of a sweep's array) take consecutive pairs
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 12000
# what the environment of a trainer rank records about the job once its plan is applied, beside the
# job's own GPUs (NODE_GPUS_VAR): its task counts (before WORLD_SIZE / LOCAL_WORLD_SIZE became the
# trainer ranks')
JOB_TASKS_VAR = "SCALERL_JOB_TASKS"


class LayoutError(ConfigError, RunError):
    """A layout the job cannot run; one line naming the settings and what would work. A config error
    where the config is checked (exit 2), and a run error where a running process finds it."""

    def __init__(self, key: str, value: object, message: str):
        self.key, self.value, self.allowed = key, value, message
        ValueError.__init__(self, message)


def job_ports(job_id: int) -> tuple[int, int]:
    """(rendezvous port, store port) of submitit job ``job_id``: an even/odd pair, a pair per job id."""
    master = MASTER_PORT_BASE + 2 * (int(job_id) % (MASTER_PORT_SPAN // 2))
    return master, master + 1


@dataclass(frozen=True)
class LayoutOptions:
    """What a layout is planned from: the run's trainer, generator, placement and async-mode options
    (the typed options of :func:`scalerl.config.typed`; the layout reads nothing else of the config).
    Whoever holds the config picks them out of it with :meth:`of`."""

    trainer: TorchTrainerOption
    generator: GeneratorOption
    placement: PlacementOption
    async_mode: Union[SyncOptions, PPOOffPolicyOptions, PipelineRLOptions]

    @classmethod
    def of(cls, config) -> LayoutOptions:
        """The four options of ``config`` (the typed ``Config``, or a composed one: the CLI plans a
        layout before the config is complete enough to be typed)."""
        return cls(config.trainer, config.generator, config.placement, config.async_mode)

    @property
    def pipeline(self) -> bool:
        """Whether the run generates on engines of their own (async_mode=pipeline_rl)."""
        return self.async_mode.name == "pipeline_rl"


@dataclass(frozen=True)
class Launch:
    """What the launcher gives a run. ``kind``: ``process`` (``python train.py``), ``torchrun``,
    ``slurm`` or ``local`` (submitit's local executor: the tasks of a job on this machine)."""

    kind: str = "process"
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0  # GPUs the job gives each node (0: none, the run is on CPUs)
    cpus_per_task: int = 1  # cores each task holds
    master_port: int | None = None  # the rendezvous port (None: none, or not known before the job)
    job_id: int | None = None  # a submitit job's id (its ports); None before it is submitted

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node: int
    local_rank: int
    role: str  # "trainer" or "engine"
    trainer_rank: int | None  # its rank among the trainer ranks (the run's torch.distributed rank)
    engine: int | None  # the engine it serves (engine tasks)
    local_engines: tuple[int, ...]  # engines this process starts (the trainer's rank 0)
    visible: tuple[int, ...] | None  # its CUDA_VISIBLE_DEVICES, as node GPU indices; None on CPUs
    device: str  # what it computes on, within ``visible``
    allotment: int  # cores the process holds
    threads: int  # its own compute threads (the trainer's, or the engine's)
    engine_threads: int  # each local engine's threads (0: none)
    local_world_size: int  # trainer ranks on its node (LOCAL_WORLD_SIZE of a trainer)
    prompts: int  # its share of each step's batch: prompts ...
    samples: int  # ... and samples (prompts x generations_per_prompt)


@dataclass(frozen=True)
class EnginePlan:
    index: int
    node: int
    gpus: tuple[int, ...]  # node GPU indices it sees (() on CPUs)
    tensor_parallel_size: int
    group_ranks: tuple[int, ...]  # its workers' ranks in the weight-update group (1 + index x TP + shard)
    host: str  # "rank 0" (a process the trainer's rank 0 starts) or "task <rank>"
    memory: float | None = None  # vLLM's gpu_memory_utilization on its GPU (GPU vLLM engines)


@dataclass(frozen=True)
class Layout:
    launch: Launch
    ranks: tuple[RankPlan, ...]
    engines: tuple[EnginePlan, ...]
    trainers: int
    on_gpu: bool
    backend: str  # the weight-update group's (pipeline_rl)
    weight_world: int  # 1 + engines x TP (pipeline_rl), else 0
    master_port: int | None
    store_port: int | None  # None: rendezvous port + 1 once the job id is known; 0: any free port

    def rank(self, r: int) -> RankPlan:
        return self.ranks[r]

    def lines(self) -> list[str]:
        """The plan as a compact table (``python train.py ... --cfg job`` prints it)."""
        L = self.launch
        where = (
            f"{L.kind}: {L.nodes} node(s) x {L.tasks_per_node} task(s), "
            f"{L.gpus_per_node or 'no'} GPU(s) and {L.cpus_per_task} core(s) a task"
        )
        out = [f"# layout ({where}); {self.trainers} trainer rank(s); ports: {self.ports_text()}"]
        rows = [("rank", "node", "local", "role", "devices", "device", "threads", "batch share")]
        for p in self.ranks:
            role = f"trainer {p.trainer_rank}" if p.role == "trainer" else f"engine {p.engine}"
            if p.local_engines:
                role += f" + engines {','.join(map(str, p.local_engines))}"
            threads = str(p.threads) + (f" (+{p.engine_threads}/engine)" if p.engine_threads else "")
            share = f"{p.prompts}x{p.samples // max(1, p.prompts)}={p.samples}" if p.prompts else "-"
            vis = "cpu" if p.visible is None else ",".join(map(str, p.visible))
            rows.append((str(p.rank), str(p.node), str(p.local_rank), role, vis, p.device, threads, share))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out += ["# " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for e in self.engines:
            gpus = ",".join(map(str, e.gpus)) or "cpu"
            mem = f", gpu_memory_utilization {e.memory}" if e.memory is not None else ""
            out.append(
                f"# engine {e.index}: {e.host} on node {e.node}, GPUs {gpus}, TP {e.tensor_parallel_size}, "
                f"weight-group ranks {','.join(map(str, e.group_ranks))}{mem}"
            )
        if self.engines:
            out.append(f"# weight-update group: world {self.weight_world} over {self.backend}")
        return out

    def ports_text(self) -> str:
        if self.launch.kind in ("slurm", "local") and self.master_port is None:
            text = f"rendezvous {MASTER_PORT_BASE} + 2 x (job id mod {MASTER_PORT_SPAN // 2})"
            return text + (f", store {self.store_port}" if self.store_port else ", store that + 1")
        if self.master_port is None:
            return "no rendezvous (one process), store " + (
                str(self.store_port) if self.store_port else "any free port"
            )
        return f"rendezvous {self.master_port}, store {self.store_port}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _batch(trainer: TorchTrainerOption, trainers: int, launch: Launch, gen_tasks: int) -> tuple[int, int]:
    """(prompts, samples) of each trainer rank's share, or the one line saying what would divide."""
    B, G = int(trainer.batch_size), int(trainer.generations_per_prompt)
    unit = G * trainers
    if B % unit == 0:
        return B // unit, B // trainers
    prompts = B // G  # whole prompts: validate() checked B % G == 0
    counts = [d for d in _divisors(prompts) if d <= max(64, trainers)]
    lower, upper = (B // unit) * unit, (B // unit + 1) * unit
    sizes = " or ".join(str(s) for s in (lower, upper) if s > 0)
    tasks = (
        f"{launch.tasks} task(s) - placement.generator_tasks={gen_tasks}"
        if gen_tasks
        else f"{launch.tasks} task(s)"
    )
    other = ""
    if gen_tasks:  # the same job with another split of its tasks between trainers and engines
        fits = [g for g in range(1, launch.tasks) if prompts % (launch.tasks - g) == 0]
        if fits:
            g = min(fits, key=lambda g: (abs(g - gen_tasks), g))
            other = f", or placement.generator_tasks={g} (and placement.engines={g}: {launch.tasks - g} trainer ranks)"
    raise LayoutError(
        "trainer.batch_size",
        B,
        f"trainer.batch_size={B} with trainer.generations_per_prompt={G} does not split over {trainers} "
        f"trainer rank(s) ({tasks}): each rank trains on whole groups, so batch_size must be a multiple "
        f"of {G} x {trainers} = {unit}; use a trainer-rank count of {', '.join(map(str, counts))} "
        f"(divisors of {prompts} prompts), or trainer.batch_size={sizes}{other}",
    )


def _generator_tasks(pl: PlacementOption) -> int:
    """Tasks of the job that run an engine each: the option's ``generator_tasks`` where it has the
    field (placement=split), else none (colocated engines run beside the trainer)."""
    return int(getattr(pl, "generator_tasks", 0))


def plan(options: LayoutOptions, launch: Launch, *, threads: int | None = None) -> Layout:
    """Every rank's and every engine's plan for a run of ``options`` launched by ``launch``; a
    :class:`LayoutError` (one line) when it cannot work. ``threads``: the trainer process's thread
    budget when the caller has chosen it (else ``trainer.threads``, else the allotment). In steps:
    the tasks and trainer ranks, the devices, the threads, the ports, then the plans."""
    pl, tr = options.placement, options.trainer
    tasks, per_node = launch.tasks, int(launch.tasks_per_node)
    gen_tasks = _generator_tasks(pl)
    pipeline = options.pipeline
    n_engines = int(pl.engines) if pipeline else 0
    local_engines = 0 if gen_tasks else n_engines

    _check_tasks(launch, gen_tasks)
    trainers = tasks - gen_tasks  # (several need trainer=deepspeed: validate() and preflight say so)
    prompts, samples = _batch(tr, trainers, launch, gen_tasks)
    node_of = [r // per_node for r in range(tasks)]
    on_node = [sum(1 for r in range(trainers) if node_of[r] == n) for n in range(launch.nodes)]
    dev = _devices(options, launch, trainers, node_of, on_node, n_engines, local_engines)

    allot = max(1, int(launch.cpus_per_task))
    base = max(1, int(threads) if threads else (int(tr.threads) or allot))
    gen_total = max(1, base // 2) if local_engines else 0
    trainer_threads0 = max(1, base - gen_total) if local_engines else base
    engine_threads = max(1, gen_total // max(1, local_engines)) if local_engines else 0
    master, store = _ports(int(pl.port), launch)

    ranks: list[RankPlan] = []
    for r in range(tasks):
        n, local = node_of[r], r % per_node
        common = dict(rank=r, node=n, local_rank=local, allotment=allot, local_world_size=on_node[n])
        if r < trainers:
            hosts = tuple(range(local_engines)) if r == 0 else ()
            ranks.append(
                RankPlan(
                    **common,
                    role="trainer",
                    trainer_rank=r,
                    engine=None,
                    local_engines=hosts,
                    visible=tuple(dev.trainer_gpus[n]) if dev.on_gpu else None,
                    device=f"cuda:{local}" if dev.on_gpu else "cpu",
                    threads=trainer_threads0 if hosts else base,
                    engine_threads=engine_threads if hosts else 0,
                    prompts=prompts,
                    samples=samples,
                )
            )
        else:
            e = r - trainers
            ranks.append(
                RankPlan(
                    **common,
                    role="engine",
                    trainer_rank=None,
                    engine=e,
                    local_engines=(),
                    visible=dev.engine_gpus[e] if dev.on_gpu else None,
                    device="cuda:0" if dev.on_gpu else "cpu",
                    threads=max(1, int(tr.threads) or allot),
                    engine_threads=0,
                    prompts=0,
                    samples=0,
                )
            )

    tp = int(pl.tensor_parallel_size)
    engines = tuple(
        EnginePlan(
            index=e,
            node=dev.engine_node[e],
            gpus=dev.engine_gpus[e] if dev.on_gpu else (),
            tensor_parallel_size=tp,
            group_ranks=tuple(1 + e * tp + s for s in range(tp)),
            host="rank 0" if e < local_engines else f"task {trainers + e}",
            memory=generator_option_class(options.generator).gpu_memory_share(options.generator)
            if dev.on_gpu
            else None,
        )
        for e in range(n_engines)
    )
    transport = str(options.async_mode.transport) if pipeline else "gloo"
    own_gpus = dev.on_gpu and (pl.name == "split" or bool(gen_tasks))
    backend = ("nccl" if own_gpus else "gloo") if transport == "auto" else transport
    return Layout(
        launch=launch,
        ranks=tuple(ranks),
        engines=engines,
        trainers=trainers,
        on_gpu=dev.on_gpu,
        backend=backend,
        weight_world=1 + n_engines * tp if n_engines else 0,
        master_port=master,
        store_port=store,
    )


def _check_tasks(launch: Launch, gen_tasks: int) -> None:
    """Engine tasks need a multi-task job, and one task more than the engines (a trainer)."""
    if gen_tasks and launch.kind == "process":
        raise LayoutError(
            "placement.generator_tasks",
            gen_tasks,
            f"placement.generator_tasks={gen_tasks} runs engines on tasks of a multi-task job: start it with "
            "launcher=slurm and launcher.tasks_per_node / launcher.nodes (or torchrun), which set "
            "MASTER_ADDR and MASTER_PORT",
        )
    if gen_tasks and launch.tasks <= gen_tasks:
        raise LayoutError(
            "placement.generator_tasks",
            gen_tasks,
            f"placement.generator_tasks={gen_tasks}: the job has {launch.tasks} task(s); it needs at least "
            f"{gen_tasks + 1} (the trainer ranks first, then one task per engine)",
        )


@dataclass
class _Devices:
    """Which GPUs each node's trainer ranks and each engine see, and each engine's node."""

    on_gpu: bool
    trainer_gpus: list[list[int]]
    engine_gpus: list[tuple[int, ...]]
    engine_node: list[int]


def _devices(
    options: LayoutOptions,
    launch: Launch,
    trainers: int,
    node_of,
    on_node,
    n_engines: int,
    local_engines: int,
) -> _Devices:
    """The devices step of :func:`plan`: trainer ranks on their node's first GPUs; engines on GPUs
    of their own (placement=split), beside rank 0 (colocated) or on the GPUs an engine task's node
    leaves."""
    pl = options.placement
    gen_tasks = _generator_tasks(pl)
    device = str(options.trainer.device)
    gpus = int(launch.gpus_per_node)
    if device == "cuda" and gpus == 0:
        raise LayoutError(
            "trainer.device",
            device,
            f"trainer.device=cuda but the launch gives no GPUs ({launch.kind}): ask for them "
            "(launcher.gpus_per_node) or use trainer.device=auto/cpu",
        )
    dev = _Devices(
        on_gpu=device != "cpu" and gpus > 0,
        trainer_gpus=[list(range(on_node[n])) for n in range(launch.nodes)],
        engine_gpus=[() for _ in range(n_engines)],
        engine_node=[0] * n_engines,
    )
    # devices of the engines' own: an option that has the field (placement=split), else none
    gen_devices = [int(g) for g in getattr(pl, "generator_devices", [])]
    if gen_devices and gen_tasks:
        raise LayoutError(
            "placement.generator_devices",
            gen_devices,
            f"placement.generator_devices={gen_devices} with placement.generator_tasks={gen_tasks}: engine "
            "tasks take the GPUs their node's trainer ranks leave; leave generator_devices empty",
        )
    if not dev.on_gpu:
        if gen_tasks:
            dev.engine_node = [node_of[trainers + e] for e in range(gen_tasks)]
        return dev
    pipeline = options.pipeline
    if pipeline and pl.name == "split" and local_engines:
        _split_gpus(pl, launch, on_node, local_engines, gen_devices, dev)
    elif pipeline and local_engines:  # colocated: on rank 0's GPU, beside it
        _colocated_gpus(pl, options.generator, local_engines, dev)
    per_node = int(launch.tasks_per_node)
    for n in range(launch.nodes):
        if on_node[n] > gpus:
            raise LayoutError(
                "launcher.tasks_per_node",
                per_node,
                f"{on_node[n]} trainer ranks on node {n} and {gpus} GPU(s) a node: each trainer rank needs a "
                f"GPU of its own; start at most {gpus} trainer ranks a node, or use trainer.device=cpu",
            )
    if gen_tasks:
        _engine_task_gpus(pl, launch, trainers, node_of, on_node, gen_tasks, dev)
    return dev


def _split_gpus(
    pl: PlacementOption,
    launch: Launch,
    on_node,
    local_engines: int,
    gen_devices: list[int],
    dev: _Devices,
) -> None:
    """placement=split with engines started by rank 0: the engines' GPUs (``generator_devices``,
    else the node's last ones) and the trainer ranks' (those left)."""
    gpus, tp = int(launch.gpus_per_node), int(pl.tensor_parallel_size)
    if launch.nodes > 1:
        # only the trainer's rank 0 starts local engines; every other node would hold the same
        # GPUs idle (a job asks for the same tasks on every node). Engines on other nodes are
        # what generator_tasks is for: the same engine code, reached through the store.
        raise LayoutError(
            "placement.generator_devices",
            gen_devices or "[]",
            f"placement=split with placement.engines={local_engines} started by the trainer's rank 0 "
            f"on a job of {launch.nodes} nodes: only rank 0's node runs them, and every other node "
            "would hold the same GPUs idle; run the engines as tasks of the job instead "
            f"(placement.generator_tasks={local_engines}, the job's last tasks, each with "
            f"{tp} GPU(s) its node's trainer ranks leave)",
        )
    need = local_engines * tp
    if not gen_devices and need + on_node[0] > gpus:
        raise LayoutError(
            "placement.engines",
            local_engines,
            f"placement=split: placement.engines={local_engines} x placement.tensor_parallel_size={tp} "
            f"= {need} GPU(s) for the engines and {on_node[0]} trainer rank(s) on a node of {gpus} GPU(s): "
            f"start at most {max(0, gpus - need)} trainer rank(s) there, or give the engines fewer GPUs",
        )
    gens = gen_devices or list(range(gpus - need, gpus))
    if len(gens) != need or len(set(gens)) != need:
        raise LayoutError(
            "placement.generator_devices",
            gens,
            f"placement.generator_devices={gens}: must be {need} distinct GPUs "
            f"(placement.engines={local_engines} x placement.tensor_parallel_size={tp})",
        )
    if any(g < 0 or g >= gpus for g in gens):
        raise LayoutError(
            "placement.generator_devices",
            gens,
            f"placement.generator_devices={gens}: the node has GPUs 0-{gpus - 1}",
        )
    left = [g for g in range(gpus) if g not in gens]
    if on_node[0] > len(left):
        raise LayoutError(
            "placement.generator_devices",
            gens,
            f"placement=split: {on_node[0]} trainer rank(s) on the node and {len(left)} GPU(s) left for "
            f"them after placement.generator_devices={gens} (the node has {gpus}); start at most "
            f"{len(left)} trainer rank(s) there, or give the engines fewer GPUs",
        )
    dev.trainer_gpus[0] = left[: on_node[0]]
    for e in range(local_engines):
        dev.engine_gpus[e] = tuple(gens[e * tp : (e + 1) * tp])


def _colocated_gpus(
    pl: PlacementOption, generator: GeneratorOption, local_engines: int, dev: _Devices
) -> None:
    """placement=colocated: every engine on rank 0's GPU, beside the trainer (vLLM's memory share
    split over them)."""
    tp = int(pl.tensor_parallel_size)
    if tp > 1:
        raise LayoutError(
            "placement.tensor_parallel_size",
            tp,
            f"placement.tensor_parallel_size={tp} with placement=colocated: an engine over {tp} GPUs "
            "needs GPUs of its own (placement=split)",
        )
    dev.engine_gpus = [(0,)] * local_engines
    util = generator_option_class(generator).gpu_memory_share(generator)
    if util is not None:
        if local_engines * util >= 1.0:
            share = int(100 * util / local_engines) / 100
            raise LayoutError(
                "generator.gpu_memory_utilization",
                util,
                f"placement.engines={local_engines} x generator.gpu_memory_utilization={util} = "
                f"{local_engines * util:g} of rank 0's GPU: colocated pipeline_rl engines never sleep "
                "(they generate while the trainer trains on the same GPU), and vLLM takes that share "
                f"of it for each; use generator.gpu_memory_utilization={share} (the same share split "
                "over the engines), placement.engines=1, or placement=split",
            )


def _engine_task_gpus(
    pl: PlacementOption, launch: Launch, trainers: int, node_of, on_node, gen_tasks: int, dev: _Devices
) -> None:
    """Engine tasks (placement.generator_tasks): each takes the next ``tensor_parallel_size`` GPUs
    its node's trainer ranks (and earlier engine tasks there) leave."""
    gpus, tp = int(launch.gpus_per_node), int(pl.tensor_parallel_size)
    used = [on_node[n] for n in range(launch.nodes)]
    for e in range(gen_tasks):
        r = trainers + e
        n = node_of[r]
        block = tuple(range(used[n], used[n] + tp))
        if block[-1] >= gpus:
            here = [x for x in range(trainers, launch.tasks) if node_of[x] == n]
            first_engine_rank, k = here[0], len(here)
            raise LayoutError(
                "placement.generator_tasks",
                gen_tasks,
                f"placement.generator_tasks={gen_tasks} x placement.tensor_parallel_size={tp}: node {n} "
                f"runs {on_node[n]} trainer rank(s) and {k} engine task(s) (ranks {first_engine_rank}-"
                f"{first_engine_rank + k - 1}), {on_node[n]} + {k} x {tp} = {on_node[n] + k * tp} GPUs, "
                f"and the job gives it {gpus}: use fewer tasks a node (launcher.tasks_per_node), "
                "fewer engines, or a smaller tensor_parallel_size",
            )
        dev.engine_gpus[e] = block
        dev.engine_node[e] = n
        used[n] += tp


def _ports(explicit: int, launch: Launch) -> tuple[int | None, int | None]:
    """(the rendezvous port, the run's store port): a job's own pair under SLURM or a local
    launch, ``placement.port`` when set (refused inside the sweeps' rendezvous range or on the
    rendezvous port itself), else the port above the rendezvous."""
    master: int | None = launch.master_port
    if launch.kind in ("slurm", "local"):
        master = job_ports(launch.job_id)[0] if launch.job_id is not None else None
        if explicit and MASTER_PORT_BASE <= explicit < MASTER_PORT_BASE + MASTER_PORT_SPAN:
            raise LayoutError(
                "placement.port",
                explicit,
                f"placement.port={explicit} is in {MASTER_PORT_BASE}-{MASTER_PORT_BASE + MASTER_PORT_SPAN - 1}, "
                "where the jobs of a sweep rendezvous: leave it 0 (the port above the job's rendezvous) "
                "or take one outside that range",
            )
    if explicit and master is not None and explicit == master:
        raise LayoutError(
            "placement.port",
            explicit,
            f"placement.port={explicit} is the rendezvous port (MASTER_PORT): leave it 0 (MASTER_PORT + 1)",
        )
    if explicit:
        return master, explicit
    if master is not None:
        return master, master + 1
    return master, (None if launch.kind in ("slurm", "local") else 0)


# ----------------------------------------------------------------------------- the environment


def allotment(environ: Mapping[str, str], tasks_on_node: int) -> int:
    """Cores this process may use: SLURM's ``SLURM_CPUS_PER_TASK`` (within its affinity), else the
    process's CPU affinity shared by the node's ``tasks_on_node`` tasks."""
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        mine = os.cpu_count() or 1
    if environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, min(int(environ["SLURM_CPUS_PER_TASK"]), mine))
    return max(1, mine // max(1, tasks_on_node))


def _job_tasks(env: Mapping[str, str], gen_tasks: int, raw: bool) -> tuple[int, int]:
    """(tasks of the job, tasks a node) from the launcher's WORLD_SIZE / LOCAL_WORLD_SIZE, or, once
    :func:`apply` made them the trainer ranks' under ``placement.generator_tasks``, what it recorded
    (:data:`JOB_TASKS_VAR`; not with ``raw``: the launcher's variables as they are)."""
    saved = env.get(JOB_TASKS_VAR, "")
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if not raw and gen_tasks and saved.count(",") == 2:
        tasks, per_node, trainers = (int(x) for x in saved.split(","))
        if trainers == world and tasks - trainers == gen_tasks:
            return tasks, per_node
    per_node = int(env.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    return world, per_node


def launch_from_env(
    options: LayoutOptions,
    environ: Mapping[str, str] | None = None,
    *,
    raw: bool = False,
    gpu_ids: list[str] | None = None,
) -> Launch:
    """This process's :class:`Launch`, from its launcher's variables (torchrun's and a submitit task's
    RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_PORT, SLURM's CPUs) and the GPUs it is given
    (``gpu_ids``: the node's, as :func:`node_gpu_ids` reads them by default)."""
    env = os.environ if environ is None else environ
    gen_tasks = _generator_tasks(options.placement)
    tasks, per_node = _job_tasks(env, gen_tasks, raw)
    if tasks % per_node:
        per_node = tasks
    # a submitit task has exported its rendezvous already (scalerl.sweep.job): as torchrun's
    kind = "torchrun" if "WORLD_SIZE" in env or "MASTER_PORT" in env else "process"
    ids = node_gpu_ids(env) if gpu_ids is None else gpu_ids
    gpus = 0 if str(options.trainer.device) == "cpu" else len(ids)
    port = env.get("MASTER_PORT", "")
    return Launch(
        kind=kind,
        nodes=tasks // per_node,
        tasks_per_node=per_node,
        gpus_per_node=gpus,
        cpus_per_task=allotment(env, per_node),
        master_port=int(port) if port.isdigit() else None,
    )


def launch_from_launcher(
    launcher: Local | Slurm, trainer: TorchTrainerOption, environ: Mapping[str, str] | None = None
) -> Launch:
    """The :class:`Launch` a ``launcher`` option (the run's, or a sweep's) asks for: SLURM's
    ``nodes x tasks_per_node`` with ``gpus_per_node`` and ``cpus_per_task``; the local executor's
    tasks on this machine with its GPUs (none with ``trainer.device=cpu``) and cores."""
    env = os.environ if environ is None else environ
    per_node = int(launcher.tasks_per_node)
    if launcher.name == "slurm":
        gpus = int(launcher.gpus_per_node) or per_node * int(launcher.gpus_per_task)
        return Launch(
            kind="slurm",
            nodes=int(launcher.nodes),
            tasks_per_node=per_node,
            gpus_per_node=gpus,
            cpus_per_task=int(launcher.cpus_per_task),
        )
    gpus = 0 if str(trainer.device) == "cpu" else len(node_gpu_ids(env))
    return Launch(
        kind="local" if per_node > 1 else "process",
        nodes=1,
        tasks_per_node=per_node,
        gpus_per_node=gpus,
        cpus_per_task=allotment(env, per_node),
    )


def current(
    options: LayoutOptions,
    environ: Mapping[str, str] | None = None,
    *,
    threads: int | None = None,
    raw: bool = False,
    gpu_ids: list[str] | None = None,
) -> tuple[Layout, RankPlan]:
    """This process's layout and its own rank's plan (``RANK`` of the launcher, 0 alone). ``raw``:
    from the launcher's variables as they are (the process's start, before :func:`apply`)."""
    env = os.environ if environ is None else environ
    layout = plan(options, launch_from_env(options, env, raw=raw, gpu_ids=gpu_ids), threads=threads)
    rank = int(env.get("RANK", "0") or 0)
    if rank >= len(layout.ranks):
        raise LayoutError("RANK", rank, f"RANK={rank} (environment): the job has {len(layout.ranks)} task(s)")
    return layout, layout.ranks[rank]


def narrow_devices(
    me: RankPlan, environ: MutableMapping[str, str] | None = None, gpu_ids: list[str] | None = None
) -> None:
    """Before CUDA starts: a trainer rank on GPUs sees only its node's trainer GPUs, so that
    ``cuda:LOCAL_RANK`` (where DeepSpeed puts the model) is the device it computes on; the job's own
    list is kept in :data:`NODE_GPUS_VAR`, from which the engines it starts take their GPUs. Once
    only: a second call changes nothing."""
    env = os.environ if environ is None else environ
    if me.role != "trainer" or me.visible is None or NODE_GPUS_VAR in env:
        return
    ids = node_gpu_ids(env) if gpu_ids is None else gpu_ids
    env[NODE_GPUS_VAR] = ",".join(ids)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[i] for i in me.visible)


def apply(
    me: RankPlan,
    layout: Layout,
    environ: MutableMapping[str, str] | None = None,
    gpu_ids: list[str] | None = None,
) -> None:
    """Make this process the rank ``me`` plans (at its start, before CUDA starts): a trainer rank's
    devices (:func:`narrow_devices`), and under ``placement.generator_tasks`` its WORLD_SIZE /
    LOCAL_WORLD_SIZE the trainer ranks' (the job's counts kept in :data:`JOB_TASKS_VAR`)."""
    env = os.environ if environ is None else environ
    if me.role != "trainer":
        return
    narrow_devices(me, env, gpu_ids)
    if layout.trainers != layout.launch.tasks and "WORLD_SIZE" in env:
        L = layout.launch
        env[JOB_TASKS_VAR] = f"{L.tasks},{L.tasks_per_node},{layout.trainers}"
        env["WORLD_SIZE"] = str(layout.trainers)
        if "LOCAL_WORLD_SIZE" in env:
            env["LOCAL_WORLD_SIZE"] = str(me.local_world_size)


def physical_gpus(indices: tuple[int, ...], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` ids of node GPU ``indices`` (indices into the job's own list,
    which a trainer that narrowed its own visibility kept in :data:`NODE_GPUS_VAR`)."""
    env = os.environ if environ is None else environ
    ids = node_gpu_ids(env) if environ is None else listed_gpu_ids(env)
    if not ids:
        return tuple(str(i) for i in indices)
    if any(i >= len(ids) for i in indices):
        raise LayoutError(
            "placement",
            list(indices),
            f"GPUs {list(indices)} of a node whose job gives it {len(ids)} ({','.join(ids)})",
        )
    return tuple(ids[i] for i in indices)


__all__ = [
    "MASTER_PORT_BASE",
    "MASTER_PORT_SPAN",
    "EnginePlan",
    "Launch",
    "Layout",
    "LayoutError",
    "LayoutOptions",
    "RankPlan",
    "apply",
    "current",
    "job_ports",
    "launch_from_env",
    "launch_from_launcher",
    "narrow_devices",
    "node_gpu_ids",
    "physical_gpus",
    "plan",
]
