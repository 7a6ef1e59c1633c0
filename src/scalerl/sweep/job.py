"""What a sweep job runs: one training run, in-process, resumable.

``TrainJob`` is a :class:`submitit.helpers.Checkpointable`: when SLURM (or the local executor)
signals a time limit or a preemption, submitit calls :meth:`TrainJob.checkpoint`, which resubmits
the same call; the requeued job composes the same config and ``train`` resumes from the run's
own checkpoint in its ``out_dir`` (same MLflow run, no duplicate metrics).
"""

from __future__ import annotations

import os

import submitit


class TrainJob(submitit.helpers.Checkpointable):
    """``TrainJob()(overrides, settings, seed)`` -> the training summary (a dict)."""

    def __call__(self, overrides: list[str], settings: dict, seed: int | None = None) -> dict:
        from scalerl.loop import train
        from scalerl.sweep.plan import build_config

        restarts = os.environ.get("SLURM_RESTART_COUNT")
        if restarts and restarts != "0":
            print(
                f"[sweep] requeued job (restart {restarts}): resuming from {settings['out_dir']}", flush=True
            )
        cfg = build_config(list(overrides), dict(settings), seed)
        return train(cfg)

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        # Nothing to save here: the run checkpoints itself every `checkpoint_every` steps and
        # resumes from its out_dir. Requeue the very same call.
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
