"""Checkpoints and resume: the recipe a resumed run must keep (all but ``RESUMABLE_CHANGES``),
writing a checkpoint (every rank's engine part, rank 0's run state), and restoring one."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scalerl.config import ConfigError
from scalerl.config.schema import (
    RESUMABLE_CHANGES,
    length_file,
    recipe,
    recipe_change,
    recipe_file,
    run_length,
)
from scalerl.messages import RunError, first_line
from scalerl.state import Clock
from scalerl.storage import write_json
from scalerl.tracking import rng_state, set_rng_state

if TYPE_CHECKING:
    from scalerl.loop.components import Components

log = logging.getLogger("scalerl")


def engine_dir(run: Components) -> str:
    """Where each rank writes its part of the trainer's engine (DeepSpeed's ZeRO state)."""
    return str(run.out_dir / "checkpoint" / "engine")


def check_same_recipe(cfg) -> None:
    """A run resumed in ``cfg.out_dir`` must have the recipe it started with: ConfigError (one line)
    naming the first key that differs, else the new recipe would train under the old run's params."""
    change = recipe_change(cfg)
    if change is not None:
        key, then, now = change
        raise ConfigError(
            key,
            now,
            f"{then!r} as in the run being resumed (when resuming, only "
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
    try:
        _write(run)
    except OSError as e:  # a full or read-only out_dir: the checkpoint before this one stays the last
        kept = f"the last checkpoint is kept in {run.ckpt.path}" if run.ckpt.exists() else "no checkpoint yet"
        raise RunError(
            f"could not write the checkpoint of step {st.step}: {e.strerror or first_line(e)} "
            f"({e.filename or run.ckpt.dir}); {kept}; run the same command again once it can be written"
        ) from None
    run.checkpointed = st.step  # before the flush: a signal that stops it at once names this one
    if run.is_main:
        run.tracker.flush()


def _write(run: Components) -> None:
    st = run.state
    own = {"rng": rng_state(), "generator_rng": run.generator.rng_state()}  # this rank's own streams
    tag = run.trainer.save_engine_checkpoint(engine_dir(run), tag=f"step_{st.step:08d}", rank_state=own)
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
        if not recipe_file(run.out_dir).is_file():
            write_json(recipe_file(run.out_dir), recipe(run.cfg))
        if run_length(run.out_dir) != (total := int(run.config.trainer.total_steps)):
            write_json(length_file(run.out_dir), {"total_steps": total})


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
    own = run.trainer.load_engine_checkpoint(engine_dir(run), tag=ck["engine_tag"])
    set_rng_state(ck["rng"])
    run.sampler.load_state_dict(ck["sampler"])
    run.pass_rates.load_state_dict(ck["pass_rate_tracker"])
    run.state.load_state_dict(ck["state"])
    run.generator.set_rng_state(ck["generator_rng"])
    if own:  # this rank's own RNG streams (the run checkpoint holds rank 0's)
        set_rng_state(own["rng"])
        run.generator.set_rng_state(own["generator_rng"])
    return ck["run_id"], ck["pending_metrics"]
