"""Building a run: its components (task, policy, trainer, generator, async mode, sampler, tracker,
checkpointer, state) from its resolved config, and the device and process checks that come first."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig

from scalerl import algo, layout
from scalerl.generator import make_generator
from scalerl.loop.accounting import devices_held
from scalerl.loop.components import Components
from scalerl.messages import RunError
from scalerl.model.build import build_policy, num_params
from scalerl.rollout.modes import MODES, Rollouts
from scalerl.rollout.prompts import make_sampler
from scalerl.scaling import FitProtocol
from scalerl.state import RunState
from scalerl.task import build_task
from scalerl.tracking import Checkpointer, Tracker
from scalerl.trainer import make_trainer


def pick_device(cfg) -> torch.device:
    want = cfg.trainer.device
    if want == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        raise RunError("trainer.device=cuda but no CUDA device is available")
    return torch.device(want)


def build(cfg: DictConfig, *, tracker: Tracker | None = None) -> Components:
    """Build a run's components from its (resolved) config."""
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = MODES[cfg.async_mode.name]
    # this rank's plan (scalerl.layout): its share of the batch, its device (cuda:LOCAL_RANK,
    # within the trainer GPUs it was narrowed to before CUDA started), its threads from what the
    # process holds (SLURM's cpus_per_task, its CPU affinity), never the machine's core count
    plan, me = layout.current(cfg)
    layout.apply(me, plan)  # train() applied it; a direct build() (tests) here, before CUDA starts
    G = int(cfg.trainer.generations_per_prompt)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(cfg)
    if world > 1 and cfg.trainer.name != "deepspeed":
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
    threads = int(cfg.trainer.threads) or me.allotment
    placement = mode.place(cfg, device, world, threads)
    task = build_task(cfg)
    # the warm-start (on first use) has the process's whole share of the cores; a generator
    # process that takes some of them later does not run yet
    torch.set_num_threads(max(1, threads))
    model, tokenizer, precision = build_policy(cfg, task, device)
    torch.set_num_threads(max(1, placement.trainer_threads))
    n_params, n_params_all = num_params(model, exclude_embeddings=True), num_params(model)  # before ZeRO-3
    trainer = make_trainer(cfg, model, precision, temperature=cfg.generator.temperature, device=device)
    engines = None
    if mode.name == "pipeline_rl":  # started by the first weights
        from scalerl.rollout.pool import EnginePool

        engines = EnginePool(cfg, placement, tokenizer, trainer_device=device, seed=cfg.seed + 7919 * rank)
    if engines is not None and (cfg.generator.name != "hf" or cfg.placement.name == "split"):
        generator = engines  # evaluation too goes through the engines: no engine in this process
    else:  # over the trainer's module (no copy): sync/ppo rollouts, or evaluation beside the engines
        generator = make_generator(
            cfg, trainer.module, tokenizer, precision, device, seed=cfg.seed + 7919 * rank
        )
    pass_rates = algo.PassRateTracker(cfg.filter.pass_rate_threshold, cfg.filter.pass_rate_window)
    sampler = make_sampler(
        task,
        task.train_prompts(),
        seed=cfg.seed,
        retired=pass_rates if cfg.filter.no_positive_resampling else None,
        rank=0 if engines is not None else rank,  # pipeline_rl: rank 0 draws every rank's prompts
        world=1 if engines is not None else world,
    )
    state = RunState()
    rollouts = Rollouts(
        cfg=cfg,
        task=task,
        sampler=sampler,
        generator=generator,
        gathered=trainer.gathered,
        state=state,
        prompts_per_step=me.prompts,
        group_size=G,
        total_steps=int(cfg.trainer.total_steps),
        placement=placement,
        world=world,
        engines=engines,
    )
    return Components(
        cfg=cfg,
        out_dir=out_dir,
        task=task,
        val=task.val_prompts()[: cfg.eval.num_prompts],
        tokenizer=tokenizer,
        precision=precision,
        trainer=trainer,
        generator=generator,
        source=mode(rollouts),
        sampler=sampler,
        pass_rates=pass_rates,
        tracker=tracker if tracker is not None else Tracker(cfg, out_dir, enabled=rank == 0),
        ckpt=Checkpointer(out_dir),
        state=state,
        placement=placement,
        device=device,
        devices=devices_held(device, placement, world, generator_process=engines is not None),
        n_params=n_params,
        n_params_all=n_params_all,
        fit_protocol=FitProtocol.from_config(cfg.scaling),
    )
