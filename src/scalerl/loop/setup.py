"""Building a run: its components (task, policy, trainer, generator, async mode, sampler, tracker,
checkpointer, state) from its resolved config, and the device and process checks that come first."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig

from scalerl import algo, layout
from scalerl.config import Config, typed
from scalerl.config.groups.trainer import TorchTrainerOption
from scalerl.generator import generator_class, make_generator
from scalerl.loop.accounting import devices_held
from scalerl.loop.components import Components
from scalerl.messages import RunError
from scalerl.model.build import build_policy, num_params
from scalerl.rollout.modes import MODES, Rollouts
from scalerl.rollout.prompts import make_sampler
from scalerl.scaling import FitProtocol
from scalerl.state import RunState
from scalerl.task import build_task
from scalerl.task.score import score_groups
from scalerl.tracking import Checkpointer, Tracker
from scalerl.trainer import make_trainer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from scalerl.generator import Generator
    from scalerl.model.precision import Precision
    from scalerl.rollout.modes import Placement
    from scalerl.rollout.pool import EnginePool
    from scalerl.rollout.prompts import MixedSampler, PromptSampler
    from scalerl.task.base import Task
    from scalerl.trainer import Trainer


def pick_device(trainer: TorchTrainerOption) -> torch.device:
    """The device the ``trainer`` option asks for (``auto``: CUDA when there is one)."""
    want = trainer.device
    if want == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        raise RunError("trainer.device=cuda but no CUDA device is available")
    return torch.device(want)


def _rank_device(trainer: TorchTrainerOption, world: int) -> torch.device:
    """This trainer rank's device: the ``trainer`` option's, and with several ranks on GPUs its own
    (``cuda:LOCAL_RANK``, made the current device); several ranks need trainer=deepspeed."""
    device = pick_device(trainer)
    if world > 1 and trainer.name != "deepspeed":
        raise RunError(
            f"{world} trainer processes need trainer=deepspeed (trainer=torch runs in one process)"
        )
    if device.type == "cuda" and world > 1:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise RunError(
                f"trainer.device=cuda: process LOCAL_RANK={local} needs a GPU of its own, and this node "
                f"has {torch.cuda.device_count()}; start at most that many processes per node, or use "
                "trainer.device=cpu"
            )
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    return device


def _generators(
    config: Config,
    mode: str,
    placement: Placement,
    trainer: Trainer,
    tokenizer: PreTrainedTokenizerBase,
    precision: Precision,
    device: torch.device,
    rank: int,
) -> tuple[EnginePool | None, Generator]:
    """(the engines of their own, pipeline_rl's; the generator this process evaluates with, and
    under sync/ppo rolls out with)."""
    engines = None
    if mode == "pipeline_rl":  # started by the first weights
        from scalerl.rollout.engine import EngineSpec
        from scalerl.rollout.pool import EnginePool

        engines = EnginePool(
            placement,
            tokenizer,
            generator=config.generator,
            precision=config.precision,
            bucket_mb=config.placement.bucket_mb,
            engine_spec=functools.partial(EngineSpec, config),  # the engines' setup reads the typed config
            trainer_device=device,
            seed=config.seed + 7919 * rank,
        )
    # a generator that samples from the trainer's module evaluates in this process, beside the
    # engines (no copy); any other (vLLM: an engine of its own) evaluates through the engines
    in_process = generator_class(config.generator.name).samples_from_trainer_module
    if engines is not None and (not in_process or config.placement.name == "split"):
        generator = engines  # evaluation too goes through the engines: no engine in this process
    else:  # over the trainer's module (no copy): sync/ppo rollouts, or evaluation beside the engines
        generator = make_generator(
            config.generator,
            config.length_control,
            trainer.module,
            tokenizer,
            precision,
            device,
            seed=config.seed + 7919 * rank,
            placement=config.placement,
        )
    return engines, generator


def _rollouts(
    config: Config,
    task: Task,
    sampler: PromptSampler | MixedSampler,
    generator: Generator,
    trainer: Trainer,
    state: RunState,
    prompts_per_step: int,
    placement: Placement,
    world: int,
    engines: EnginePool | None,
) -> Rollouts:
    """What the async mode draws each step's groups from: this rank's share of the batch, scored as
    the reward, length-control and task options say."""
    return Rollouts(
        async_mode=config.async_mode,
        filter=config.filter,
        generator_option=config.generator,
        task=task,
        score=functools.partial(
            score_groups,
            task,
            reward=config.reward,
            length_control=config.length_control,
            verifier_timeout_s=config.task.verifier_timeout_s,
        ),
        sampler=sampler,
        generator=generator,
        gathered=trainer.gathered,
        state=state,
        prompts_per_step=prompts_per_step,
        group_size=int(config.trainer.generations_per_prompt),
        total_steps=int(config.trainer.total_steps),
        batch_size=int(config.trainer.batch_size),
        placement=placement,
        world=world,
        engines=engines,
    )


def build(cfg: DictConfig, *, tracker: Tracker | None = None, config: Config | None = None) -> Components:
    """Build a run's components from its (resolved) config: read once into the typed options
    (:func:`scalerl.config.typed`; ``config``: read already, by :func:`scalerl.loop.run.train`), of
    which each part gets only its own."""
    opts = typed(cfg) if config is None else config
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = MODES[opts.async_mode.name]
    # this rank's plan (scalerl.layout): its share of the batch, its device (cuda:LOCAL_RANK,
    # within the trainer GPUs it was narrowed to before CUDA started), its threads from what the
    # process holds (SLURM's cpus_per_task, its CPU affinity), never the machine's core count
    layout_options = layout.LayoutOptions.of(opts)
    plan, me = layout.current(layout_options)
    layout.apply(me, plan)  # train() applied it; a direct build() (tests) here, before CUDA starts
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = _rank_device(opts.trainer, world)
    threads = int(opts.trainer.threads) or me.allotment
    placement = mode.place(layout_options, device, world, threads)
    task = build_task(opts.task)
    # the warm-start (on first use) has the process's whole share of the cores; a generator
    # process that takes some of them later does not run yet
    torch.set_num_threads(max(1, threads))
    model, tokenizer, precision = build_policy(
        opts.model, task, device, precision=opts.precision, task_option=opts.task, seed=opts.seed
    )
    torch.set_num_threads(max(1, placement.trainer_threads))
    n_params, n_params_all = num_params(model, exclude_embeddings=True), num_params(model)  # before ZeRO-3
    trainer = make_trainer(
        model,
        precision,
        trainer=opts.trainer,
        loss=opts.loss,
        aggregation=opts.aggregation,
        correction=opts.correction,
        temperature=opts.generator.temperature,
        device=device,
    )
    engines, generator = _generators(opts, mode.name, placement, trainer, tokenizer, precision, device, rank)
    pass_rates = algo.PassRateTracker(opts.filter.pass_rate_threshold, opts.filter.pass_rate_window)
    sampler = make_sampler(
        task,
        task.train_prompts(),
        seed=opts.seed,
        retired=pass_rates if opts.filter.no_positive_resampling else None,
        rank=0 if engines is not None else rank,  # pipeline_rl: rank 0 draws every rank's prompts
        world=1 if engines is not None else world,
    )
    state = RunState()
    rollouts = _rollouts(
        opts, task, sampler, generator, trainer, state, me.prompts, placement, world, engines
    )
    return Components(
        config=opts,
        cfg=cfg,
        out_dir=out_dir,
        task=task,
        val=task.val_prompts()[: opts.eval.num_prompts],
        tokenizer=tokenizer,
        precision=precision,
        trainer=trainer,
        generator=generator,
        source=mode(rollouts),
        sampler=sampler,
        pass_rates=pass_rates,
        tracker=tracker if tracker is not None else Tracker(opts.tracking, out_dir, enabled=rank == 0),
        ckpt=Checkpointer(out_dir),
        state=state,
        placement=placement,
        device=device,
        devices=devices_held(device, placement, world, generator_process=engines is not None),
        n_params=n_params,
        n_params_all=n_params_all,
        fit_protocol=FitProtocol.from_config(opts.scaling),
    )
