"""One training run, end to end: the recipe behind ``python train.py``, read top to bottom.

    setup    build the components (:mod:`~scalerl.loop.setup`), restore a checkpoint, start tracking
    train    next rollouts -> filters/advantages -> trainer step -> weights to the generator
             -> maybe evaluate (live scaling fit), checkpoint, log
    cleanup  close the async mode, mark the MLflow run, write the summary

What is not the loop lives in rooms named for it: checkpoints and resume in
:mod:`~scalerl.loop.checkpointing`, counts and compute in :mod:`~scalerl.loop.accounting`, the
run's summary in :mod:`~scalerl.loop.summary`, live fits in :mod:`scalerl.scaling.live`. Everything
a run counts is one :class:`~scalerl.state.RunState`, saved in every checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from scalerl.collector import long_lived
from scalerl.config import evaluates_at, typed
from scalerl.config.variants import group_variants
from scalerl.lock import hold, out_dir_lock
from scalerl.loop import health
from scalerl.loop.accounting import compute_metrics, count_step, device_hours, record_pass_rates
from scalerl.loop.batch import prepare_batch, step_statistics
from scalerl.loop.checkpointing import check_same_recipe, checkpoint, checkpoint_safe, restore
from scalerl.loop.components import Components
from scalerl.loop.evaluate import evaluate_run
from scalerl.loop.progress import Progress
from scalerl.loop.setup import build
from scalerl.loop.signals import Interrupted, StopSignals
from scalerl.loop.summary import (
    FIT_MIN_EVALS,
    MetricsUnflushed,
    finished_summary,
    print_summary,
    unflushed_message,
    write_summary,
)
from scalerl.messages import RunError, first_line
from scalerl.scaling import live
from scalerl.scaling.pass_at_k import evaluation_samples, metric_name
from scalerl.state import Clock
from scalerl.tracking import Tracker, run_params, tracking_uri
from scalerl.tracking.secrets import redact
from scalerl.tracking.tracker import RunNotInStore
from scalerl.trainer import NonFiniteError

log = logging.getLogger("scalerl")

__all__ = ["Components", "MetricsUnflushed", "Stopped", "build", "train", "train_step"]


class Stopped(RunError):
    """The run stopped at a step boundary on SIGINT/SIGTERM, with a checkpoint; the message says how
    to resume. ``signum``: the signal."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = int(signum)


def train(cfg: DictConfig, *, tracker: Tracker | None = None, components: Components | None = None) -> dict:
    """Run (or resume) the training run described by ``cfg``; returns its summary.

    ``tracker``: where metrics go (default: MLflow as configured, on rank 0). ``components``: the
    run's parts, already built by :func:`~scalerl.loop.setup.build` from the same ``cfg``.

    One process runs in an ``out_dir`` at a time (:class:`~scalerl.lock.LockBusy` otherwise). The
    first SIGINT/SIGTERM stops the run at the next step boundary with a checkpoint
    (:class:`Stopped`), a second one at once (:class:`~scalerl.loop.signals.Interrupted`); the MLflow
    run is then KILLED. A run that ends with metrics the tracking store did not take raises
    :class:`~scalerl.loop.summary.MetricsUnflushed` (they stay in its checkpoint; running it again
    writes them). A run that builds its own parts ends the torch.distributed its trainer started
    when it ends, normally or on error (:func:`_own_distributed`)."""
    _quiet_logging()
    OmegaConf.resolve(cfg)
    config = typed(cfg)  # the options, read once: what the parts get (scalerl.loop.setup.build)
    main = int(os.environ.get("RANK", "0")) == 0
    out_dir = Path(config.out_dir)
    with StopSignals() as stop, _out_dir_lock(out_dir, main):
        check_same_recipe(cfg)
        finished = finished_summary(out_dir, config.trainer.total_steps, config.tracking) if main else None
        if finished is not None:
            finished.setdefault("tracking_uri", redact(tracking_uri(config.tracking)))
            print_summary(finished)
            return finished
        if components is not None:  # the caller's, and so is any process group their trainer started
            return _recipe(components, stop)
        with _own_distributed():
            return _recipe(build(cfg, tracker=tracker, config=config), stop)


def _recipe(run: Components, stop: StopSignals) -> dict:
    """setup -> train -> cleanup, marking the MLflow run with how it ended."""
    # ---- setup (the components are built)
    start_tracking(run, restore(run))
    clock, status = Clock(run.state), "FAILED"
    c = run.config
    progress = Progress(c.progress, c.eval.every, c.trainer.total_steps, run.state.step, enabled=run.is_main)
    run.checkpointed = run.state.step
    try:
        # ---- train
        try:
            _train(run, stop, clock, progress)
            status = "FINISHED"
        # SystemExit: a host's own signal handling (submitit on preemption); Interrupted: a second signal
        except (Stopped, SystemExit, Interrupted):
            status = "KILLED"
            raise
        except NonFiniteError as e:
            raise _after_nonfinite(run, clock, e) from None
        # ---- cleanup
        finally:
            stop.graceful = False
            with stop.marking():  # a signal now waits until the run is marked
                try:
                    run.source.close()
                    progress.close()
                finally:
                    end_tracking(run, status)
    except Interrupted as e:  # in the loop, or while the stopped run closes: say where it stands
        e.detail = _interrupted_detail(run, e.signum)
        raise
    return _finish(run)


def _train(run: Components, stop: StopSignals, clock: Clock, progress: Progress) -> None:
    """The loop: every step trains; evaluations, the final fit and checkpoints at their cadences."""
    with long_lived():  # the parts built for the run stay out of the collector's walks
        _loop(run, stop, clock, progress)


def _loop(run: Components, stop: StopSignals, clock: Clock, progress: Progress) -> None:
    c, st, total = run.config, run.state, int(run.config.trainer.total_steps)
    hand_over_weights(run)
    if not st.evals:  # step 0, before any update
        log_step(run, 0, {**evaluation(run, clock, progress), **compute_metrics(run, clock)})
    stop.graceful = True
    while st.step < total:
        _, stats = train_step(run)
        last = st.step == total
        if evaluates_at(st.step, total, int(c.eval.every)):
            stats.update(evaluation(run, clock, progress))
        if last:  # logged with the last step, so that its flush is whole
            stats.update(final_fit(run))
        stats.update(compute_metrics(run, clock))
        log_step(run, st.step, stats)
        progress.update(st.step, stats, run.last_pass_rate)
        if st.step % c.checkpoint_every == 0 or last:
            checkpoint(run, clock)
        if _stop_agreed(run, stop.signum is not None) and not last:
            _stop_at_boundary(run, clock, stop.signum or signal.SIGTERM)
    stop.graceful = False


def train_step(run: Components) -> tuple[list[list], dict[str, float]]:
    """One optimiser step: the next groups from the async mode -> :func:`prepare_batch` -> the
    trainer's step -> the new weights to the generator. Returns (the groups, the step's statistics
    over all ranks)."""
    st, c = run.state, run.config
    groups = run.source.next_groups()
    record_pass_rates(run.pass_rates, groups)
    t0 = time.perf_counter()
    prepared = prepare_batch(
        groups,
        version=st.step,
        zero_variance=bool(c.filter.zero_variance),
        norm=c.norm.name,
        pad_id=run.tokenizer.pad_token_id,
        exclude_truncated=bool(c.filter.exclude_truncated),
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


# ---------------------------------------------------------------------- the steps of the loop
def hand_over_weights(run: Components) -> None:
    """The trainer's weights at ``state.step`` to the async mode (and so to every generator; a
    generator whose version does not follow stops the run), then the next steps' work to engines of
    their own (:meth:`~scalerl.rollout.modes.AsyncMode.feed`), before this process evaluates."""
    step = run.state.step
    run.source.load_weights(run.trainer.policy_weights(), step)
    if run.generator.version != step:
        raise RunError(
            f"{type(run.generator).__name__}.load_weights did not take the trainer's weights of step {step} "
            f"(its version is {run.generator.version}): it would generate from other weights than the trainer's"
        )
    run.source.feed()  # engines of their own generate the next steps' work while this process evaluates


def evaluation(run: Components, clock: Clock, progress: Progress) -> dict[str, float]:
    """Evaluate, record the point (compute, pass rate, each logged pass@k) and refit every
    ``scaling.refit_every`` evaluations."""
    c, st = run.config, run.state
    clock.tick()
    metrics = evaluate_run(run)
    clock.tick()
    if not metrics:  # not rank 0 (which evaluates)
        return {}
    point = {"step": st.step, "pass_rate": metrics["val/pass_rate"], "flops": st.flops}
    point["device_hours"] = device_hours(run)
    # the pass rate and every logged pass@k (val/pass_at_<k>): scaling.metric fits one of them (and
    # may name another on a resume, whose points are then all here)
    fittable = ["pass_rate", *(metric_name(k) for k in sorted(set(c.eval.pass_at_k)))]
    for m in fittable:
        if f"val/{m}" in metrics:
            point[m] = metrics[f"val/{m}"]
        for d in run.domains:  # task=multi: each domain's, fitted on its own
            if f"val/{m}/{d}" in metrics:  # (eval.num_prompts may leave a domain out)
                point[f"{m}/{d}"] = metrics[f"val/{m}/{d}"]
    st.evals.append(point)
    metrics.update(health.hacking_metrics(st.train_correct, st.evals))
    n_evals = len(st.evals)
    if n_evals >= FIT_MIN_EVALS and n_evals % c.scaling.refit_every == 0:
        metrics.update(
            live.evaluation_fits(st.evals, run.fit_protocol, domains=run.domains, **fall_trials(run))[0]
        )
    run.last_pass_rate = metrics["val/pass_rate"]
    key = run.fit_protocol.reward_key
    progress.write(
        f"step {st.step}/{c.trainer.total_steps}: val/pass_rate={metrics['val/pass_rate']:.3f}"
        + (f" {key}={metrics[key]:.3f}" if key != "val/pass_rate" and key in metrics else "")
        + live.progress_text(metrics)
    )
    return metrics


def eval_trials(run: Components, domain: str | None = None) -> float:
    """The samples behind one evaluation of the fitted metric
    (:func:`~scalerl.scaling.pass_at_k.evaluation_samples`); with ``domain`` (``task=multi``), of
    that domain's held-out prompts."""
    e = run.config.eval
    prompts = e.num_prompts if domain is None else sum(p.domain == domain for p in run.val)
    return evaluation_samples(prompts, e.samples_per_prompt, run.fit_protocol.metric)


def fall_trials(run: Components) -> dict:
    """The live fit's sample counts (:func:`eval_trials`): the whole curve's and each domain's."""
    return {"trials": eval_trials(run), "domain_trials": {d: eval_trials(run, d) for d in run.domains}}


def final_fit(run: Components) -> dict[str, float]:
    """The scaling fit over all evaluations, with the curves' figures as artifacts (rank 0, >= 4
    evaluations)."""
    if not (run.is_main and len(run.state.evals) >= FIT_MIN_EVALS):
        return {}
    metrics, figures = live.evaluation_fits(
        run.state.evals, run.fit_protocol, domains=run.domains, out_dir=run.out_dir, **fall_trials(run)
    )
    for png in figures:
        run.tracker.log_artifact_file(png)
    run.final_fit = metrics
    return metrics


def log_step(run: Components, step: int, metrics: dict[str, float]) -> None:
    run.tracker.log(step, metrics)
    run.tracker.log_step_done(step)


def _stop_at_boundary(run: Components, clock: Clock, signum: int) -> None:
    """A stop asked for: checkpoint this step (if not yet) and raise :class:`Stopped`."""
    if run.checkpointed != run.state.step:
        checkpoint(run, clock)
    raise Stopped(
        signum,
        f"stopped by {signal.Signals(signum).name} at step {run.state.step}/{run.config.trainer.total_steps}; "
        f"checkpoint in {run.ckpt.path}. Resume with the same command (out_dir={run.out_dir})",
    )


def _after_nonfinite(run: Components, clock: Clock, e: NonFiniteError) -> RunError:
    """Repeated non-finite steps: keep a checkpoint and show the steps that led here; a resume from an
    earlier checkpoint redoes them without logging them twice (``Tracker.logged_through``)."""
    checkpoint_safe(run, clock)
    if run.is_main:
        run.tracker.flush()
    where = f"the last good checkpoint is in {run.ckpt.path}" if run.ckpt.exists() else "no checkpoint"
    return RunError(f"{e}; {where}")


def _interrupted_detail(run: Components, signum: int) -> str:
    total = run.config.trainer.total_steps
    return f"interrupted by {signal.Signals(signum).name} at step {run.state.step}/{total}; " + (
        f"the last checkpoint (step {run.checkpointed}) is in {run.ckpt.path}. "
        f"Resume with the same command (out_dir={run.out_dir})"
        if run.ckpt.exists()
        else "no checkpoint yet: the same command starts it again"
    )


def _finish(run: Components) -> dict:
    """The summary of a run that ended (raises :class:`MetricsUnflushed` if the store lacks metrics)."""
    summary = write_summary(run)
    if run.is_main and (summary["metrics_unflushed"] or summary["artifacts_unsent"]):
        raise MetricsUnflushed(
            unflushed_message(
                summary["metrics_unflushed"],
                run.tracker.uri,
                run.ckpt.path,
                summary["artifacts_unsent"],
                run.tracker.outbox,
            )
        )
    if run.is_main:
        print_summary(summary)
    return summary


# ---------------------------------------------------------------------- tracking
LENGTH_TAG = "scalerl.total_steps"
"""The MLflow tag that holds the length (``trainer.total_steps``) the run last ran with."""


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
    try:
        # a new MLflow run's params: the flat config and each group's variant, then this run's own
        params = {**run_params(run.cfg, group_variants(run.cfg)), **extra}
        config_yaml = OmegaConf.to_yaml(run.cfg, resolve=True)
        run.tracker.start(resumed[0] if resumed else None, params, config_yaml=config_yaml)
        # MLflow keeps a param's first value: a resume that changed the run's length says it here
        run.tracker.set_tag(LENGTH_TAG, str(run.config.trainer.total_steps))
        if resumed:
            run.tracker.restore_pending(resumed[1])
    except RunNotInStore:  # the config names another store: one line, exit 2
        raise
    except Exception as e:  # a tracking server that stopped answering after the preflight reached it
        if run.tracker.run_id is not None:  # not left RUNNING (the next start finds it again)
            run.tracker.end("FAILED")
        raise RunError(
            f"could not {'resume' if resumed else 'start'} the MLflow run in {redact(run.tracker.uri)} "
            f"({type(e).__name__}: {first_line(e)}); nothing was trained: run the same command again "
            "once the tracking store answers"
        ) from None
    if resumed:
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


# ---------------------------------------------------------------------- processes and signals
@contextlib.contextmanager
def _out_dir_lock(out_dir: Path, main: bool):
    """One process runs in an out_dir at a time (rank 0 holds its lock)."""
    if not main:
        yield
        return
    with hold(*out_dir_lock(out_dir), wait=False):
        yield


@contextlib.contextmanager
def _own_distributed():
    """A run that builds its own trainer ends the torch.distributed its trainer starts (trainer=deepspeed:
    the default process group and every group made from it), however the run ends: destroyed, and
    gloo's worker threads settled, before the process may exit
    (:func:`~scalerl.trainer.deepspeed_engine.end_distributed`)."""
    import torch.distributed as dist

    started = not (dist.is_available() and dist.is_initialized())
    try:
        yield
    finally:
        if started:
            from scalerl.trainer.deepspeed_engine import end_distributed

            end_distributed()


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
