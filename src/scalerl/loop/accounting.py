"""What a run counts: each step's counts into the run state (tokens, FLOPs, policy lag, dropped
groups), the pass-rate history, the devices it holds and its device-hours, and the compute, throughput
and data metrics logged with every step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from scalerl import algo
from scalerl.loop import collective
from scalerl.loop.modes import Placement
from scalerl.loop.state import Clock

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
    st.gen_tokens += int(counts["gen_tokens"]) - int(own["gen_tokens"])  # other ranks' (own: at generation)
    st.flops += 2.0 * run.n_params * counts["gen_tokens"] + 6.0 * run.n_params * counts["trained_tokens"]


def devices_held(device: torch.device, placement: Placement, world: int, *, generator_process: bool) -> int:
    """The devices a run holds, for ``compute/device_hours`` (wall clock x devices, idle time
    included, as the paper's GPU-hours). On GPU: the trainer processes' GPUs plus the pipeline
    generator's own GPU. On CPU a device is one CPU thread: each trainer process's threads plus a
    generator process's own threads (``generator_process``), so device-hours are core-hours."""
    gen = placement.generator_device
    if device.type == "cuda":  # each trainer rank's GPU, plus the GPUs the engines have to themselves
        return max(1, world) + int(placement.generator_gpus)
    own = (
        placement.generator_threads * max(1, placement.engines)
        if generator_process and gen.type == "cpu"
        else 0
    )
    return max(1, world) * max(1, placement.trainer_threads) + own


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
