"""One training run, end to end: the loop behind ``python train.py``.

    task -> policy (+ warm-start) -> trainer, generator -> async mode (rollouts, rewards)
         -> prepare_batch (filters, advantages) -> trainer step -> new weights to the generator
         -> evaluation, live scaling fit, MLflow logging, checkpoints

Components are built once (:func:`build`); :func:`train` is the loop. Everything a run counts is
one :class:`~scalerl.loop.state.RunState`, saved in every checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from scalerl import algo
from scalerl.config import ConfigError
from scalerl.generator import Generator, make_generator
from scalerl.lock import hold
from scalerl.loop import collective, health
from scalerl.loop.batch import prepare_batch, step_statistics
from scalerl.loop.data import MixedSampler, PromptSampler, make_sampler
from scalerl.loop.errors import RunError
from scalerl.loop.evaluate import evaluate
from scalerl.loop.modes import MODES, AsyncMode, Placement, Rollouts
from scalerl.loop.progress import Progress
from scalerl.loop.signals import Interrupted, StopSignals
from scalerl.loop.state import Clock, RunState
from scalerl.model.build import build_policy, num_params
from scalerl.task import build_task
from scalerl.tracking import Checkpointer, Tracker, rng_state, set_rng_state, tracking_uri
from scalerl.tracking.secrets import redact
from scalerl.tracking.tracker import flatten
from scalerl.trainer import NonFiniteError, make_trainer

log = logging.getLogger("scalerl")
FIT_LEVEL = 0.9  # the confidence level of the scaling fit's intervals


class Stopped(RunError):
    """The run stopped at a step boundary on SIGINT/SIGTERM, with a checkpoint; the message says how
    to resume. ``signum``: the signal."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = int(signum)


class MetricsUnflushed(RunError):
    """The run ended, but the tracking store did not take all its metrics: they are kept in the
    checkpoint, and running the same command again writes them."""


def _unflushed_message(n: int, uri: str, ckpt) -> str:
    return (
        f"the run ended, but {n} metric values could not be written to the tracking store {redact(uri)}; "
        f"they are kept in {ckpt}: run the same command again to write them"
    )


@dataclass
class Components:
    """Everything a run is built from (once, by :func:`build`)."""

    cfg: DictConfig
    out_dir: Path
    task: Any
    val: list  # validation prompts
    tokenizer: Any
    precision: Any
    trainer: Any
    generator: Generator  # in this process, over the trainer's module: evaluation (and sync/ppo rollouts)
    source: AsyncMode  # the groups of each optimiser step
    sampler: PromptSampler | MixedSampler
    pass_rates: algo.PassRateTracker  # no-positive-resampling history
    tracker: Tracker
    ckpt: Checkpointer
    state: RunState
    placement: Placement
    device: torch.device
    devices: int  # devices the run holds (for compute/device_hours)
    n_params: int  # without embeddings (the N of the FLOPs)
    n_params_all: int
    last_pass_rate: float = float("nan")
    final_fit: dict | None = None  # the final scaling fit's metrics, once made

    @property
    def is_main(self) -> bool:
        return self.trainer.rank == 0


# ---------------------------------------------------------------------- the loop
def train(cfg: DictConfig, *, tracker: Tracker | None = None, components: Components | None = None) -> dict:
    """Run (or resume) the training run described by ``cfg``; returns its summary.

    ``tracker``: where metrics go (default: MLflow as configured, on rank 0). ``components``: the
    run's parts, already built by :func:`build` from the same ``cfg``.

    One process runs in an ``out_dir`` at a time (:class:`~scalerl.lock.LockBusy` otherwise). The
    first SIGINT/SIGTERM stops the run at the next step boundary with a checkpoint
    (:class:`Stopped`), a second one at once (:class:`~scalerl.loop.signals.Interrupted`); the MLflow
    run is then KILLED. A run that ends with metrics the tracking store did not take raises
    :class:`MetricsUnflushed` (they stay in its checkpoint; running it again writes them)."""
    _quiet_logging()
    OmegaConf.resolve(cfg)
    main = int(os.environ.get("RANK", "0")) == 0
    with StopSignals() as stop, _out_dir_lock(cfg, main):
        check_same_recipe(cfg)
        finished = _finished_summary(cfg) if main else None
        if finished is not None:
            finished.setdefault("tracking_uri", redact(tracking_uri(cfg)))
            print_summary(finished)
            return finished
        run = components if components is not None else build(cfg, tracker=tracker)
        return _run_loop(run, stop)


def _run_loop(run: Components, stop: StopSignals) -> dict:
    cfg = run.cfg
    st, total = run.state, int(cfg.trainer.total_steps)
    start_tracking(run, restore(run))
    clock = Clock(st)
    progress = Progress(cfg, total, st.step, enabled=run.is_main)
    status = "FAILED"
    checkpointed = st.step
    try:
        hand_over_weights(run)
        if not st.evals:  # step 0, before any update
            log_step(run, 0, {**evaluation(run, clock, progress), **compute_metrics(run, clock)})
        stop.graceful = True
        while st.step < total:
            _, stats = train_step(run)
            if st.step % cfg.eval.every == 0 or st.step == total:
                stats.update(evaluation(run, clock, progress))
            if st.step == total:  # logged with the last step, so that its flush is whole
                stats.update(final_fit(run))
            stats.update(compute_metrics(run, clock))
            log_step(run, st.step, stats)
            progress.update(st.step, stats, run.last_pass_rate)
            if st.step % cfg.checkpoint_every == 0 or st.step == total:
                checkpoint(run, clock)
                checkpointed = st.step
            if _stop_agreed(run, stop.signum is not None) and st.step < total:
                if checkpointed != st.step:
                    checkpoint(run, clock)
                status = "KILLED"
                name = signal.Signals(stop.signum or signal.SIGTERM).name
                raise Stopped(
                    stop.signum or signal.SIGTERM,
                    f"stopped by {name} at step {st.step}/{total}; checkpoint in {run.ckpt.path}. "
                    f"Resume with the same command (out_dir={run.out_dir})",
                )
        stop.graceful = False
        status = "FINISHED"
    except NonFiniteError as e:
        checkpoint_safe(run, clock)
        if run.is_main:  # the steps that led here are shown; a resume from an earlier checkpoint
            run.tracker.flush()  # redoes them without logging them twice (Tracker.logged_through)
        where = f"the last good checkpoint is in {run.ckpt.path}" if run.ckpt.exists() else "no checkpoint"
        raise RunError(f"{e}; {where}") from None
    except SystemExit:  # a host's own signal handling ends the process (submitit on preemption)
        status = "KILLED"
        raise
    except Interrupted as e:
        status = "KILLED"
        e.detail = f"interrupted by {signal.Signals(e.signum).name} at step {st.step}/{total}; " + (
            f"the last checkpoint (step {checkpointed}) is in {run.ckpt.path}. "
            f"Resume with the same command (out_dir={run.out_dir})"
            if run.ckpt.exists()
            else "no checkpoint yet: the same command starts it again"
        )
        raise
    finally:
        stop.graceful = False
        run.source.close()
        progress.close()
        end_tracking(run, status)
    summary = write_summary(run)
    if run.is_main and summary["metrics_unflushed"]:
        raise MetricsUnflushed(
            _unflushed_message(summary["metrics_unflushed"], run.tracker.uri, run.ckpt.path)
        )
    if run.is_main:
        print_summary(summary)
    return summary


def train_step(run: Components) -> tuple[list[list], dict[str, float]]:
    """One optimiser step: the next groups from the async mode -> :func:`prepare_batch` -> the
    trainer's step -> the new weights to the generator. Returns (the groups, the step's statistics
    over all ranks)."""
    st, cfg = run.state, run.cfg
    groups = run.source.next_groups()
    record_pass_rates(run.pass_rates, groups)
    t0 = time.perf_counter()
    prepared = prepare_batch(
        groups,
        version=st.step,
        zero_variance=bool(cfg.filter.zero_variance),
        norm=cfg.norm.name,
        pad_id=run.tokenizer.pad_token_id,
        exclude_truncated=bool(cfg.filter.exclude_truncated),
    )
    trainer_stats = run.trainer.step(prepared.batch) if prepared.train else {}
    st.train_busy += time.perf_counter() - t0
    prepared.stats.update(health.outcome_shares(groups, getattr(run.task, "verifier_kinds", ())))
    stats, counts = step_statistics(prepared, trainer_stats)
    count_step(run, prepared.counts, counts)
    st.train_correct.append(stats["train/correct"])
    st.step += 1
    hand_over_weights(run)
    return groups, stats


# ---------------------------------------------------------------------- building
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
    G = int(cfg.trainer.generations_per_prompt)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(cfg)
    if world > 1 and cfg.trainer.name != "deepspeed":
        raise RunError(
            f"{world} trainer processes need trainer=deepspeed (trainer=torch runs in one process)"
        )
    if int(cfg.trainer.batch_size) % (G * world):
        raise RunError(
            f"trainer.batch_size={cfg.trainer.batch_size} must be a multiple of trainer.generations_per_prompt x "
            f"processes = {G} x {world}: each process generates and trains on its share of the batch"
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
    threads = cfg.trainer.threads or max(1, (os.cpu_count() or 1) // max(1, world))
    placement = mode.place(cfg, device, world, threads)
    task = build_task(cfg)
    # the warm-start (on first use) has the process's whole share of the cores; a generator
    # process that takes some of them later does not run yet
    torch.set_num_threads(max(1, threads))
    model, tokenizer, precision = build_policy(cfg, task, device)
    torch.set_num_threads(max(1, placement.trainer_threads))
    n_params, n_params_all = num_params(model, exclude_embeddings=True), num_params(model)  # before ZeRO-3
    trainer = make_trainer(cfg, model, precision, temperature=cfg.generator.temperature, device=device)
    generator = make_generator(cfg, trainer.module, tokenizer, precision, device, seed=cfg.seed + 7919 * rank)
    pass_rates = algo.PassRateTracker(cfg.filter.pass_rate_threshold, cfg.filter.pass_rate_window)
    sampler = make_sampler(
        task,
        task.train_prompts(),
        seed=cfg.seed,
        retired=pass_rates if cfg.filter.no_positive_resampling else None,
        rank=rank,
        world=world,
    )
    state = RunState()
    rollouts = Rollouts(
        cfg=cfg,
        task=task,
        sampler=sampler,
        generator=generator,
        gathered=trainer.gathered,
        state=state,
        prompts_per_step=int(cfg.trainer.batch_size) // (G * world),
        group_size=G,
        total_steps=int(cfg.trainer.total_steps),
        placement=placement,
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
        devices=devices_held(device, placement, world, generator_process=mode.name == "pipeline_rl"),
        n_params=n_params,
        n_params_all=n_params_all,
    )


# ---------------------------------------------------------------------- the steps of the loop
def hand_over_weights(run: Components) -> None:
    """The trainer's weights at ``state.step`` to the async mode (and so to every generator); a
    generator whose version does not follow stops the run."""
    step = run.state.step
    run.source.load_weights(run.trainer.policy_weights(), step)
    if run.generator.version != step:
        raise RunError(
            f"{type(run.generator).__name__}.load_weights did not take the trainer's weights of step {step} "
            f"(its version is {run.generator.version}): it would generate from other weights than the trainer's"
        )


def record_pass_rates(pass_rates: algo.PassRateTracker, groups: list[list]) -> None:
    """No-positive-resampling history (paper Sec. 3.2), of every rank's groups (collective)."""
    history = [([s.prompt_uid for s in g], [float(s.correct) for s in g]) for g in groups]
    for part in collective.gather_objects(history):
        for uids, correct in part:
            pass_rates.update(uids, correct)


def count_step(run: Components, own: dict, counts: dict) -> None:
    """Add one step's counts (summed over ranks) to the run state."""
    st = run.state
    st.zero_variance_dropped += int(counts["dropped"])
    for key, n in counts.items():
        if key.startswith("lag/"):
            lag = int(key[len("lag/") :])
            st.lag_tokens[lag] = st.lag_tokens.get(lag, 0) + int(n)
    st.gen_tokens += int(counts["gen_tokens"]) - int(own["gen_tokens"])  # other ranks' (own: at generation)
    st.flops += 2.0 * run.n_params * counts["gen_tokens"] + 6.0 * run.n_params * counts["trained_tokens"]


def evaluation(run: Components, clock: Clock, progress: Progress) -> dict[str, float]:
    """Evaluate, record the point (compute, pass rate) and refit every ``scaling.refit_every``
    evaluations."""
    cfg, st = run.cfg, run.state
    clock.tick()
    metrics = evaluate(
        cfg, run.task, run.val, run.generator, run.trainer.gathered, st, run.tracker, main=run.is_main
    )
    clock.tick()
    if not metrics:  # not rank 0 (which evaluates)
        return {}
    point = {"step": st.step, "pass_rate": metrics["val/pass_rate"], "flops": st.flops}
    point["device_hours"] = device_hours(run)
    for d in domains(run):  # task=multi: each domain's pass rate, fitted on its own
        if f"val/pass_rate/{d}" in metrics:  # (eval.num_prompts may leave a domain out)
            point[f"pass_rate/{d}"] = metrics[f"val/pass_rate/{d}"]
    st.evals.append(point)
    metrics.update(health.hacking_metrics(st.train_correct, st.evals))
    n_evals = len(st.evals)
    if n_evals >= 4 and n_evals % cfg.scaling.refit_every == 0:
        metrics.update(fit_metrics(run))
    run.last_pass_rate = metrics["val/pass_rate"]
    fit_a = metrics.get("fit/A", float("nan"))
    progress.write(
        f"step {st.step}/{cfg.trainer.total_steps}: val/pass_rate={metrics['val/pass_rate']:.3f}"
        + (f" fit/A={fit_a:.3f}" if fit_a == fit_a else "")
    )
    return metrics


def domains(run: Components) -> list[str]:
    """The domains of a ``task=multi`` run (none otherwise)."""
    return list(getattr(run.task, "domains", ()))


def fit_metrics(run: Components, final: bool = False) -> dict[str, float]:
    """The live scaling fit over the evaluations so far (``final``: with the curve's figure): of the
    pass rate (``fit/*``) and, for ``task=multi``, of each domain's (``fit/<domain>/*``, as the
    paper's Fig. 11 fits math and code apart)."""
    metrics = _fit(run, "pass_rate", "fit/", "scaling_curve.png", final)
    for d in domains(run):
        metrics.update(_fit(run, f"pass_rate/{d}", f"fit/{d}/", f"scaling_curve_{d}.png", final))
    return metrics


def _fit(run: Components, key: str, prefix: str, png_name: str, final: bool) -> dict[str, float]:
    from scalerl.scaling import live

    s = run.cfg.scaling
    evals = [e for e in run.state.evals if key in e]
    if len(evals) < 4:
        return {}
    compute = [e[s.compute_axis] for e in evals]
    reward = [e[key] for e in evals]
    protocol = dict(
        steps=[e["step"] for e in evals],
        min_step=s.min_step,
        min_compute=s.min_compute,
        method=s.method,
        bootstrap=s.bootstrap,
        level=FIT_LEVEL,
        grid=live.grid_options(s),
        prefix=prefix,
    )
    try:
        if final:
            png = run.out_dir / png_name
            _, metrics = live.final_report(
                compute, reward, out_png=str(png), extrapolate=s.extrapolate, **protocol
            )
            if png.is_file():
                run.tracker.log_artifact_file(png)
        else:
            _, metrics = live.fit_metrics(compute, reward, **protocol)
    except Exception as e:  # a fit must never kill a run
        log.warning("scaling fit failed: %s", e)
        return {}
    return metrics


def final_fit(run: Components) -> dict[str, float]:
    """The scaling fit over all evaluations, with the curve's figure (rank 0, >= 4 evaluations)."""
    if run.is_main and len(run.state.evals) >= 4:
        run.final_fit = fit_metrics(run, final=True)
        return run.final_fit
    return {}


def devices_held(device: torch.device, placement: Placement, world: int, *, generator_process: bool) -> int:
    """The devices a run holds, for ``compute/device_hours`` (wall clock x devices, idle time
    included, as the paper's GPU-hours). On GPU: the trainer processes' GPUs plus the pipeline
    generator's own GPU. On CPU a device is one CPU thread: each trainer process's threads plus a
    generator process's own threads (``generator_process``), so device-hours are core-hours."""
    gen = placement.generator_device
    if device.type == "cuda":
        return max(1, world) + (1 if gen.type == "cuda" and gen != device else 0)
    own = placement.generator_threads if generator_process and gen.type == "cpu" else 0
    return max(1, world) * (max(1, placement.trainer_threads) + own) + (
        1 if generator_process and gen.type == "cuda" else 0
    )


def device_hours(run: Components) -> float:
    return run.state.elapsed * run.devices / 3600.0


def compute_metrics(run: Components, clock: Clock) -> dict[str, float]:
    """Compute, throughput and counters: one value per step, shared by train and val metrics."""
    st = run.state
    wall = max(clock.tick(), 1e-9)
    out = {
        "compute/flops": st.flops,
        "compute/device_hours": device_hours(run),
        "perf/generator_busy": min(1.0, st.gen_busy / wall),
        "perf/trainer_busy": min(1.0, st.train_busy / wall),
        "perf/tokens_per_s": st.gen_tokens / wall,
        # prompts whose pass rate reached the threshold; retired (never drawn again) only under NPR
        "data/prompts_at_threshold": float(len(run.pass_rates)),
        "data/prompts_retired": float(len(run.pass_rates)) if run.cfg.filter.no_positive_resampling else 0.0,
        "data/epochs": float(run.sampler.epochs),  # passes over the train split so far (fractional)
        "data/zero_variance_dropped": float(st.zero_variance_dropped),
        "data/stale_dropped": float(st.stale_dropped),
        **{f"async/lag_{k}": v for k, v in st.lag_summary().items()},  # over the run's trained tokens
        "data/verifier_errors": float(st.verifier_errors),
    }
    # failed programs per kind (task=code): every kind the task can count, from the first step
    for kind in sorted(set(getattr(run.task, "verifier_kinds", ())) | set(st.verifier_kinds)):
        out[f"data/verifier_{kind}"] = float(st.verifier_kinds.get(kind, 0))
    if run.device.type == "cuda":  # the trainer's peak GPU memory (the pipeline generator's is not counted)
        out["perf/gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(run.device) / 2**30
    return out


def log_step(run: Components, step: int, metrics: dict[str, float]) -> None:
    run.tracker.log(step, metrics)
    run.tracker.log_step_done(step)


# ---------------------------------------------------------------------- checkpoints and tracking
def _engine_dir(run: Components) -> str:
    return str(run.out_dir / "checkpoint" / "engine")


# what may differ when a run is resumed: its length, cadences, threads, where it logs, runs or caches
RESUMABLE_CHANGES = (
    "trainer.total_steps",
    "trainer.threads",
    "checkpoint_every",
    "progress",
    "out_dir",
    "eval.log_samples",
    "model.cache_dir",
    "tracking.",
    "launcher.",
    "scaling.",
)


def recipe(cfg) -> dict[str, str]:
    """The resolved config, flat, without what may change on resume: what a resumed run must match."""
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))
    return {k: redact(v) for k, v in flat.items() if not k.startswith(RESUMABLE_CHANGES)}


def _recipe_path(out_dir) -> Path:
    return Path(out_dir) / "checkpoint" / "recipe.json"


def check_same_recipe(cfg) -> None:
    """A run resumed in ``cfg.out_dir`` must have the recipe it started with: ConfigError (one line)
    naming the first key that differs, else the new recipe would train under the old run's params."""
    path = _recipe_path(cfg.out_dir)
    if not path.is_file():
        return
    before, now = json.loads(path.read_text()), recipe(cfg)
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            raise ConfigError(
                key,
                now.get(key, "(unset)"),
                f"{before.get(key, '(unset)')!r} as in the run being resumed (when resuming, only "
                f"{', '.join(k.rstrip('.') for k in RESUMABLE_CHANGES)} may change: start a new recipe "
                "in another out_dir)",
                where=f"out_dir {cfg.out_dir}",
            )


def checkpoint(run: Components, clock: Clock) -> None:
    """Every rank writes its part of the trainer's engine (if it has one; collective); rank 0 the
    run checkpoint, then sends the metrics it covers to MLflow."""
    clock.tick()
    st = run.state
    if not run.trainer.weights_finite():  # the last good checkpoint stays the last one
        kept = (
            f"the last good checkpoint is kept in {run.ckpt.path}" if run.ckpt.exists() else "no checkpoint"
        )
        raise RunError(f"the weights are no longer finite at step {st.step} (trainer.lr too high?); {kept}")
    own = {"rng": rng_state(), "generator_rng": run.generator.rng_state()}  # this rank's own streams
    tag = run.trainer.save_engine_checkpoint(_engine_dir(run), tag=f"step_{st.step:08d}", rank_state=own)
    if run.is_main:
        run.ckpt.save(
            {
                "step": st.step,
                "state": st.state_dict(),
                "trainer": run.trainer.state_dict(),
                "rng": rng_state(),
                "generator_rng": run.generator.rng_state(),
                "sampler": run.sampler.state_dict(),
                "pass_rate_tracker": run.pass_rates.state_dict(),
                "run_id": run.tracker.run_id,
                "pending_metrics": run.tracker.pending_state(),
                "engine_tag": tag,
            }
        )
        if not _recipe_path(run.out_dir).is_file():
            _write_json(_recipe_path(run.out_dir), recipe(run.cfg))
        run.tracker.flush()


def checkpoint_safe(run: Components, clock: Clock) -> None:
    """After repeated non-finite steps the weights were never updated with them: keep a checkpoint
    (unless the weights themselves are no longer finite: then the last good one stays)."""
    try:
        checkpoint(run, clock)
    except Exception as e:
        log.warning("could not write a checkpoint: %s", e)


def restore(run: Components) -> tuple[str, list] | None:
    """Load the run checkpoint if there is one; returns (MLflow run id, metrics pending at it)."""
    if not run.ckpt.exists():
        return None
    ck = run.ckpt.load()
    run.trainer.load_state_dict(ck["trainer"])
    own = run.trainer.load_engine_checkpoint(_engine_dir(run), tag=ck["engine_tag"])
    set_rng_state(ck["rng"])
    run.sampler.load_state_dict(ck["sampler"])
    run.pass_rates.load_state_dict(ck["pass_rate_tracker"])
    run.state.load_state_dict(ck["state"])
    run.generator.set_rng_state(ck["generator_rng"])
    if own:  # this rank's own RNG streams (the run checkpoint holds rank 0's)
        set_rng_state(own["rng"])
        run.generator.set_rng_state(own["generator_rng"])
    return ck["run_id"], ck["pending_metrics"]


def start_tracking(run: Components, resumed: tuple[str, list] | None) -> None:
    if not run.is_main:
        return
    extra = {
        **run.precision.describe(),
        "model/params_non_embedding": str(run.n_params),
        "model/params": str(run.n_params_all),
        "compute/devices": str(run.devices),
        "device": str(run.device),
    }
    run.tracker.start(resumed[0] if resumed else None, extra)
    if resumed:
        run.tracker.restore_pending(resumed[1])
        log.info("resumed %s at step %d (MLflow run %s)", run.out_dir, run.state.step, run.tracker.run_id)


def end_tracking(run: Components, status: str) -> None:
    """Mark the MLflow run FINISHED, FAILED or KILLED. Only what a checkpoint covers reaches MLflow:
    a run stopped between checkpoints (preempted, interrupted, crashed) redoes those steps when it
    resumes, so writing them now would duplicate them; a finished run writes what its last
    checkpoint holds and the tracking store does not have yet."""
    if not run.is_main:
        return
    if status == "FINISHED" and not run.tracker.flush():
        return  # not FINISHED while metrics are missing: the rerun that writes them marks it
    run.tracker.end(status)


def write_summary(run: Components) -> dict:
    st = run.state
    summary = {
        "run_id": run.tracker.run_id,
        "out_dir": str(run.out_dir),
        "steps": st.step,
        "evals": st.evals,
        "pass_rate_start": st.evals[0]["pass_rate"] if st.evals else None,
        "pass_rate_final": st.evals[-1]["pass_rate"] if st.evals else None,
        "wall_seconds": st.elapsed,
        "metrics_unflushed": len(run.tracker.pending),
        "mlflow_status": run.tracker.status,
        "tracking_uri": redact(run.tracker.uri),
        "fit": run.final_fit or {},
        "fit_level": FIT_LEVEL,
    }
    if run.is_main:
        _write_json(run.out_dir / "summary.json", summary)
    return summary


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def summary_lines(summary: dict) -> list[str]:
    """The lines a finished run ends with: pass rate, fit, where its outputs and MLflow run are."""
    wall = summary["wall_seconds"]
    took = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.1f} min"
    lines = [f"done: {summary['steps']} steps in {took}"]
    if summary.get("pass_rate_start") is not None:
        lines.append(
            f"held-out pass rate: {summary['pass_rate_start']:.3f} -> {summary['pass_rate_final']:.3f}"
        )
    fit = summary.get("fit") or {}
    if fit.get("fit/ok") == 1.0:

        def est(name: str) -> str:
            v, lo, hi = (fit.get(f"fit/{name}{s}", math.nan) for s in ("", "_lo", "_hi"))
            return f"{name} = {v:.3g}" + ("" if math.isnan(lo) else f" [{lo:.3g}, {hi:.3g}]")

        level = summary.get("fit_level", FIT_LEVEL)
        lines.append(f"scaling fit: {est('A')}, {est('B')} " + fit_caveat(fit, level))
    lines.append(f"outputs: {summary['out_dir']}")
    uri = summary.get("tracking_uri", "")
    if uri.startswith("sqlite:///") and not uri[len("sqlite:///") :].startswith("/"):
        uri = f"sqlite:///{Path(uri[len('sqlite:///') :]).resolve()}"  # opens from any directory
    lines.append(f"MLflow run {summary['run_id']} in {uri}")
    if uri and not uri.startswith(("http://", "https://", "databricks")):
        lines.append(f"open it: mlflow ui --backend-store-uri {uri}")
    elif uri:
        lines.append(f"open it: {uri}")
    return lines


def fit_caveat(fit: dict, level: float) -> str:
    """What a run's fitted A and B can be read as: with their intervals, or why they have none and
    whether the ceiling sits at its bound (then these points do not determine it)."""
    n = int(fit.get("fit/n_points", 0) or 0)
    a, lo = fit.get("fit/A", math.nan), fit.get("fit/A_lo", math.nan)
    if math.isnan(lo):
        notes = [f"no intervals: {n} points after the early cut leave none to estimate them"]
    else:
        notes = [f"{level:.0%} intervals"]
    if a >= 0.999:
        notes.append("A at its bound 1: these points do not determine the ceiling")
    return "(" + "; ".join(notes) + ")"


def print_summary(summary: dict) -> None:
    for line in summary_lines(summary):
        print(f"[scalerl] {line}", flush=True)


@contextlib.contextmanager
def _out_dir_lock(cfg, main: bool):
    """One process runs in an out_dir at a time (rank 0 holds its lock)."""
    if not main:
        yield
        return
    out_dir = Path(cfg.out_dir)
    with hold(out_dir / ".lock", f"out_dir {out_dir}", wait=False):
        yield


def _stop_agreed(run: Components, local: bool) -> bool:
    """Whether any rank was asked to stop (collective with several processes)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    on = run.device if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1.0 if local else 0.0], device=on)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _quiet_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _finished_summary(cfg) -> dict | None:
    """The summary of the finished run in ``cfg.out_dir``, or None if it has not finished. Metrics its
    checkpoint holds that the tracking store lacks are written first, and its MLflow run is marked
    FINISHED (the store was unreachable when it ended)."""
    out_dir = Path(cfg.out_dir)
    done = out_dir / "summary.json"
    if not done.is_file():
        return None
    summary = json.loads(done.read_text())
    if summary.get("steps", 0) < cfg.trainer.total_steps:
        return None
    if summary.get("metrics_unflushed", 0) or summary.get("mlflow_status") != "FINISHED":
        ck = Checkpointer(out_dir)
        if ck.exists():
            state = ck.load()
            run_id, pending = state["run_id"], state["pending_metrics"]
        else:  # nothing kept to write: only the run's status to set
            run_id, pending = summary["run_id"], []
        tracker = Tracker(cfg, out_dir)
        try:
            written = tracker.catch_up(run_id, pending)
        except Exception as e:
            raise MetricsUnflushed(
                _unflushed_message(len(pending), tracker.uri, ck.path) + f" ({type(e).__name__})"
            ) from None
        if tracker.pending or tracker.status != "FINISHED":
            raise MetricsUnflushed(_unflushed_message(len(tracker.pending), tracker.uri, ck.path))
        summary.update(metrics_unflushed=0, mlflow_status=tracker.status, tracking_uri=redact(tracker.uri))
        _write_json(done, summary)
        log.info(
            "wrote %d metric values the tracking store lacked; MLflow run %s is FINISHED",
            written,
            summary["run_id"],
        )
    log.info("run in %s already finished (%d steps); nothing to do", cfg.out_dir, summary["steps"])
    return summary
