"""What a sweep job runs: one training run, in-process, resumable.

``TrainJob`` is a :class:`submitit.helpers.Checkpointable`: when SLURM (or the local executor)
signals a time limit or a preemption, submitit calls :meth:`TrainJob.checkpoint`, which resubmits
the same call; the requeued job composes the same config and ``train`` resumes from the run's
own checkpoint in its ``out_dir`` (same MLflow run, no duplicate metrics).

A job of several tasks (``launcher.nodes`` x ``launcher.tasks_per_node``) runs ``TrainJob`` in
every task; :func:`export_task_env` makes each task one rank of the run, as ``torchrun`` would.
Rank 0 tracks (MLflow, summary.json) and its result is the run's; on a preemption submitit's
handler checkpoints and requeues from rank 0 only, and SLURM requeues the whole job.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import submitit

from scalerl.collector import uncollected_imports
from scalerl.layout import MASTER_PORT_BASE, MASTER_PORT_SPAN, job_ports
from scalerl.tracking.tracker import sqlite_file

# the job's rendezvous port and, above it, its store's (scalerl.layout.job_ports): a pair per job
# id, the same in every task and after a requeue; the next job id of an array takes the next pair
__all__ = [
    "MASTER_PORT_BASE",
    "MASTER_PORT_SPAN",
    "TrainJob",
    "export_task_env",
    "finished_elsewhere",
    "job_ports",
    "task_env",
]


def _int(environ: Mapping[str, str], key: str) -> int:
    try:
        return int(environ[key])
    except KeyError:
        raise RuntimeError(f"{key} is not set: not inside a task of a submitit job") from None
    except ValueError:
        raise RuntimeError(f"{key}={environ[key]!r} is not an integer") from None


def task_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables of this task of a submitit job, from the job's environment
    (``environ``: ``os.environ`` inside a task); ``{}`` for a job of one task.

    SLURM (``SUBMITIT_EXECUTOR=slurm``, or ``SLURM_PROCID`` set): RANK = SLURM_PROCID, WORLD_SIZE =
    SLURM_NTASKS, LOCAL_RANK = SLURM_LOCALID, LOCAL_WORLD_SIZE = SLURM_NTASKS / SLURM_JOB_NUM_NODES
    (the launcher asks for the same tasks on every node), MASTER_ADDR = the first host of
    SLURM_JOB_NODELIST (where rank 0 runs). The local executor (``SUBMITIT_EXECUTOR=local``): its
    SUBMITIT_LOCAL_* variables, MASTER_ADDR = 127.0.0.1. MASTER_PORT: the even port of the job id's
    pair (:func:`~scalerl.layout.job_ports`: ``MASTER_PORT_BASE + 2 x (job id mod
    MASTER_PORT_SPAN / 2)``; the run's store takes the odd one above it), the same in every task and
    after a requeue (a port the job's environment sets is not used: the sweep's own environment
    reaches every job of it)."""
    executor = _executor(environ)
    if executor == "slurm":
        world, rank, local = (_int(environ, k) for k in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"))
        nodes = _int(environ, "SLURM_JOB_NUM_NODES") if "SLURM_JOB_NUM_NODES" in environ else 1
        if world <= 1:
            return {}
        from submitit.slurm.slurm import _parse_node_list

        hosts = _parse_node_list(environ.get("SLURM_JOB_NODELIST", ""))
        if not hosts:
            raise RuntimeError("SLURM_JOB_NODELIST is not set: the first node's host is rank 0's address")
        addr, job_id = hosts[0], _int(environ, "SLURM_JOB_ID")
    elif executor == "local":
        world, rank, local = (
            _int(environ, k)
            for k in ("SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID")
        )
        if world <= 1:
            return {}
        nodes, addr, job_id = 1, "127.0.0.1", _int(environ, "SUBMITIT_LOCAL_JOB_ID")
    else:
        return {}  # not a submitit task (train.py, torchrun): nothing to set
    if world % nodes:
        raise RuntimeError(f"{world} tasks on {nodes} nodes: every node must run as many tasks")
    per_node = world // nodes
    node = environ.get("SLURM_NODEID") if executor == "slurm" else None
    if (node is not None and int(node) != rank // per_node) or local != rank % per_node:
        raise RuntimeError(
            f"task {rank} of {world} runs on node {node} as local task {local}; the run's layout "
            f"puts rank r on node r // {per_node} as local task r % {per_node} (SLURM's block "
            "distribution): do not ask for another (--distribution, SLURM_DISTRIBUTION)"
        )
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(per_node),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(job_ports(job_id)[0]),
    }


def export_task_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Make this task of a submitit job one rank of the run: set :func:`task_env`'s variables in
    ``environ`` (default ``os.environ``), replacing any there, and return them (``{}``, nothing
    set, for a job of one task or outside a job; a job of one task drops the torch.distributed
    variables its environment inherited, :data:`DIST_VARS`). The run then starts as under torchrun: the loop
    reads RANK / WORLD_SIZE / LOCAL_RANK, and trainer=deepspeed initialises torch.distributed from
    MASTER_ADDR / MASTER_PORT (gloo on CPU, NCCL on GPUs)."""
    target = os.environ if environ is None else environ
    env = task_env(target)
    if not env and _executor(target):  # one task: what the sweep's own environment passed on is stale
        for key in DIST_VARS:
            target.pop(key, None)
    target.update(env)
    return env


# torch.distributed's variables: a job of one task drops those its environment inherited (a
# MASTER_ADDR exported where the sweep was launched sent its local engines to that host)
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _executor(environ: Mapping[str, str]) -> str:
    """The submitit executor whose job task ``environ`` is (``slurm``, ``local``), or ``""``: not a
    task of a job (train.py, torchrun)."""
    return environ.get("SUBMITIT_EXECUTOR") or ("slurm" if "SLURM_PROCID" in environ else "")


def _drop_stale_result() -> None:
    """A task removes the result file of an earlier attempt of its job: a rank other than 0 that
    died with rank 0 at a preemption (rank 0 requeues and exits; a collective of the others then
    fails) left an error there, which would stand for the task's outcome until this attempt writes
    its own."""
    try:
        submitit.JobEnvironment().paths.result_pickle.unlink(missing_ok=True)
    except Exception:  # not inside a submitit job (a direct call)
        pass


def finished_elsewhere(out_dir: str, total_steps: int, env: Mapping[str, str]) -> bool:
    """Whether this task, a rank other than 0, has nothing to do: the run in ``out_dir`` has
    finished its ``total_steps`` (a job requeued after its last step). Rank 0 then returns the run's
    summary without starting torch.distributed, so this rank must not wait for it there."""
    if not env or env.get("RANK") == "0":
        return False
    import json

    try:
        summary = json.loads((Path(out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return int(summary.get("steps", 0)) >= int(total_steps)


def check_store_here(uri: str) -> None:
    """A sweep's job logs into the store its driver made (the parent run is there): a sqlite file
    this node does not see is a folder the nodes do not share, and creating one here would split
    the sweep's runs over the nodes' disks, unseen until its report. Refused in one line."""
    db = sqlite_file(uri)
    if db is not None and not db.is_file():
        raise RuntimeError(
            f"tracking.uri={uri}: the sweep's MLflow store is not on this node ({socket.gethostname()}); "
            "its jobs log into the store the sweep made: put it in a folder every node shares "
            "(--tracking-uri sqlite:////shared/...), or use an MLflow server (--tracking-uri http://...)"
        )


class TrainJob(submitit.helpers.Checkpointable):
    """``TrainJob()(overrides, settings, seed, cores)`` -> the training summary (a dict). ``cores``:
    the CPUs this job's processes are held to (a local run beside others,
    :func:`~scalerl.sweep.launch.core_slots`), set before anything starts, so the run's engine
    processes inherit it; None leaves the affinity as it is."""

    def __call__(self, overrides: list[str], settings: dict, seed: int | None = None, cores=None) -> dict:
        if cores:
            os.sched_setaffinity(0, set(cores))
            print(f"[sweep] held to cores {','.join(map(str, sorted(cores)))}", flush=True)
        from scalerl.config.settings import build_config

        with uncollected_imports():  # torch, transformers: millions of objects the collector need not walk
            from scalerl.loop import train
            from scalerl.rollout import server
            from scalerl.rollout.engine import engine_role

            server.import_preloaded()

        env = export_task_env()
        _drop_stale_result()
        restarts = os.environ.get("SLURM_RESTART_COUNT")
        if restarts and restarts != "0":
            print(
                f"[sweep] requeued job (restart {restarts}): resuming from {settings['out_dir']}", flush=True
            )
        if env:
            print(
                f"[sweep] task: rank {env['RANK']} of {env['WORLD_SIZE']} (local {env['LOCAL_RANK']} of "
                f"{env['LOCAL_WORLD_SIZE']}), rendezvous {env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                flush=True,
            )
        cfg = build_config(list(overrides), dict(settings), seed)
        check_store_here(str(cfg.tracking.uri))
        if finished_elsewhere(cfg.out_dir, cfg.trainer.total_steps, env):
            return {}  # rank 0's result is the run's
        if server.local_engines(
            cfg.async_mode, cfg.placement
        ):  # the engines' fork server, forked from this job: no imports anew
            server.fork_here()
        return engine_role(cfg) or train(cfg)

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        # Nothing to save here: the run checkpoints itself every `checkpoint_every` steps and
        # resumes from its out_dir. Requeue the very same call.
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
