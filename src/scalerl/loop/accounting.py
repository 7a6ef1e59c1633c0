"""What a run counts: each step's counts into the run state (tokens, FLOPs, policy lag, dropped
groups), the pass-rate history, the devices it holds and its device-hours, and the compute, throughput
and data metrics logged with every step."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from scalerl import algo
from scalerl.loop import collective
from scalerl.rollout.modes import Placement
from scalerl.state import Clock

if TYPE_CHECKING:
    from scalerl.loop.components import Components


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
    if (
        getattr(getattr(run, "source", None), "pool", None) is None
    ):  # pipeline_rl: rank 0 counted every rank's on arrival
        st.gen_tokens += int(counts["gen_tokens"]) - int(
            own["gen_tokens"]
        )  # other ranks' (own: at generation)
    st.flops += 2.0 * run.n_params * counts["gen_tokens"] + 6.0 * run.n_params * counts["trained_tokens"]


def _slurm_counts(value: str) -> int:
    """The sum of a SLURM per-node count list: ``"8"``, ``"8(x2)"``, ``"4(x2),2"``, ``"gpu:8"``."""
    total = 0
    for part in filter(None, value.split(",")):
        n, _, rep = part.partition("(x")
        total += int(n.rsplit(":", 1)[-1]) * int(rep.rstrip(")") or 1)
    return total


def job_gpus(environ: Mapping[str, str]) -> int:
    """The GPUs a SLURM job holds on all its nodes (0 outside SLURM or without GPUs): per node
    SLURM_GPUS_ON_NODE, else the ids in SLURM_JOB_GPUS, else SLURM_GPUS_PER_NODE, times
    SLURM_JOB_NUM_NODES (the launcher asks for the same on every node)."""
    try:
        nodes = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
        if environ.get("SLURM_GPUS_ON_NODE"):
            per_node = int(environ["SLURM_GPUS_ON_NODE"])
        elif environ.get("SLURM_JOB_GPUS"):
            per_node = len([g for g in environ["SLURM_JOB_GPUS"].split(",") if g.strip()])
        elif environ.get("SLURM_GPUS_PER_NODE"):
            per_node = _slurm_counts(environ["SLURM_GPUS_PER_NODE"])
        else:
            return 0
    except ValueError:
        return 0
    return nodes * per_node


def job_cpus(environ: Mapping[str, str]) -> int:
    """The CPUs a SLURM job holds on all its nodes (0 outside SLURM): SLURM_JOB_CPUS_PER_NODE
    (``"2"``, ``"4(x2)"``: what was allocated, which may round a request up to whole cores)."""
    try:
        return _slurm_counts(environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
    except ValueError:
        return 0


def devices_held(
    device: torch.device,
    placement: Placement,
    world: int,
    *,
    generator_process: bool,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The devices a run holds, for ``compute/device_hours`` (wall clock x devices, idle time
    included, as the paper's GPU-hours).

    * GPU trainer: one GPU per trainer process (``world``), plus the GPUs the pipeline_rl engines
      have to themselves (``placement=split``: ``placement.generator_gpus``; colocated engines share
      the trainer's GPU, so a one-GPU run counts 1).
    * CPU trainer: a device is one CPU thread: each trainer process's threads plus every local
      engine's own threads (``generator_process``); so device-hours are core-hours.
    * Either way the engines on tasks of their own (``placement.generator_tasks``) add what they
      hold: their GPUs, or their threads (``placement.remote_devices``).
    * Inside a SLURM job (``environ``, default ``os.environ``): at least what the job holds, on all
      its nodes: its GPUs (:func:`job_gpus`) on GPU, its CPUs (:func:`job_cpus`) on CPU; a reserved
      device that the run leaves idle is paid for all the same (a one-process run of a job with
      ``launcher.gpus_per_node=8`` counts 8)."""
    env = os.environ if environ is None else environ
    gen = placement.generator_device
    if device.type == "cuda":  # each trainer rank's GPU, plus the GPUs the engines have to themselves
        return max(max(1, world) + int(placement.generator_gpus) + placement.remote_devices, job_gpus(env))
    own = (
        placement.generator_threads * max(1, placement.engines)
        if generator_process and gen.type == "cpu"
        else 0
    )
    own += placement.remote_devices
    return max(max(1, world) * max(1, placement.trainer_threads) + own, job_cpus(env))


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
        "data/prompts_retired": float(len(run.pass_rates))
        if run.config.filter.no_positive_resampling
        else 0.0,
        "data/epochs": float(run.sampler.epochs),  # passes over the train split so far (fractional)
        "data/zero_variance_dropped": float(st.zero_variance_dropped),
        "data/stale_dropped": float(st.stale_dropped),
        **{f"async/lag_{k}": v for k, v in st.lag_summary().items()},  # over the run's trained tokens
        "data/verifier_errors": float(st.verifier_errors),
    }
    # failed programs per kind (task=code): every kind the task can count, from the first step
    for kind in sorted(set(getattr(run.task, "verifier_kinds", ())) | set(st.verifier_kinds)):
        out[f"data/verifier_{kind}"] = float(st.verifier_kinds.get(kind, 0))
    engines = getattr(run.source, "pool", None)
    if engines is not None and engines.updates:  # pipeline_rl: what handing over the weights costs
        out["perf/weight_update_s"] = engines.weight_seconds / engines.updates
    if run.device.type == "cuda":  # the trainer's peak GPU memory (the pipeline generator's is not counted)
        out["perf/gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(run.device) / 2**30
    return out
