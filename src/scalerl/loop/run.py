"""One training run, end to end: the explicit loop behind ``python train.py``.

    task -> policy (+ warm-start) -> generator (rollouts) -> rewards, filters, advantages
         -> trainer (loss, optimiser step) -> tracking (MLflow), checkpoints, scaling fits

Async modes (paper Sec. 3.1):

* ``sync``: generate a batch with the current weights, one optimiser step, repeat.
* ``ppo_off_policy`` (k): generate k batches with the current weights, then k optimiser steps.
* ``pipeline_rl`` (k): a generator process streams groups while the trainer trains; new weights
  reach the generator in flight after every step; the trainer waits when it would be more than
  k versions ahead of the oldest policy that produced data it has still to train on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from scalerl import algo
from scalerl.loop import collective
from scalerl.loop.data import PromptSampler
from scalerl.model.build import load_policy, num_params
from scalerl.model.precision import Precision
from scalerl.task import build_task, safe_score
from scalerl.tracking import Checkpointer, Tracker, rng_state, set_rng_state
from scalerl.trainer import NonFiniteError, collate, make_trainer

log = logging.getLogger("scalerl")


class RunError(RuntimeError):
    """A run that cannot continue; the message is for the user."""


# ---------------------------------------------------------------------- building blocks
def pick_device(cfg) -> torch.device:
    want = cfg.trainer.device
    if want == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        raise RunError("trainer.device=cuda but no CUDA device is available")
    return torch.device(want)


def build_policy(cfg, task, device: torch.device, *, trained: bool = True):
    """(model, tokenizer, precision): the policy on ``device``, prepared for the precision setting;
    ``trained=False`` for an inference-only copy (no fp32 master weights under native bf16)."""
    model, tokenizer, _ = load_policy(cfg, task)
    precision = Precision.for_device(cfg.precision.body, cfg.precision.head, device, impl=cfg.precision.impl)
    model.to(device)
    precision.prepare(model, master_weights=trained)
    return model, tokenizer, precision


def score_groups(task, prompts, groups, cfg) -> int:
    """Set ``reward`` (with the length penalty, if configured) and ``correct`` on every sample.
    Returns how many verifier calls failed (raised or timed out; those score 0)."""
    errors = 0
    lc = cfg.length_control
    for prompt, group in zip(prompts, groups):
        for s in group:
            r, err = safe_score(task, prompt, s.text, cfg.task.verifier_timeout_s)
            errors += err is not None
            s.correct = r
            s.reward = r
        if lc.name == "length_penalty":
            lengths = torch.tensor([float(s.num_sampled) for s in group])
            correct = torch.tensor([s.correct for s in group])
            pen = algo.length_penalty(lengths, correct, lc.l_max, lc.l_cache)
            for s, p in zip(group, pen.tolist()):
                s.reward = s.correct + p
    return errors


def set_threads(n: int) -> None:
    torch.set_num_threads(max(1, n))


# ---------------------------------------------------------------------- the run
class Run:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.out_dir = Path(cfg.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.mode = cfg.async_mode.name
        # max policy lag (pipeline_rl) or minibatches per generation (ppo_off_policy)
        self.k = int(cfg.async_mode.get("max_lag", cfg.async_mode.get("minibatches", 1)))
        self.G = int(cfg.trainer.generations_per_prompt)
        self.total_steps = int(cfg.trainer.total_steps)
        self.device = pick_device(cfg)
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.mode == "pipeline_rl" and self.world > 1:
            raise RunError(
                "async_mode=pipeline_rl runs one trainer process (the generator is a process of its own); "
                "for several trainer processes use async_mode=sync or async_mode=ppo_off_policy"
            )
        if self.world > 1 and cfg.trainer.name != "deepspeed":
            raise RunError(
                f"{self.world} trainer processes need trainer=deepspeed (trainer=torch runs in one process)"
            )
        if int(cfg.trainer.batch_size) % (self.G * self.world):
            raise RunError(
                f"trainer.batch_size={cfg.trainer.batch_size} must be a multiple of trainer.generations_per_prompt x "
                f"processes = {self.G} x {self.world}: each process generates and trains on its share of the batch"
            )
        self.P = int(cfg.trainer.batch_size) // (self.G * self.world)  # prompts per step on this rank
        if self.device.type == "cuda" and self.world > 1:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local >= torch.cuda.device_count():
                raise RunError(
                    f"trainer.device=cuda: process LOCAL_RANK={local} needs a GPU of its own, and this node "
                    f"has {torch.cuda.device_count()}; start at most that many processes per node, or use "
                    "trainer.device=cpu"
                )
            self.device = torch.device("cuda", local)
            torch.cuda.set_device(self.device)
        self.is_main = self.rank == 0
        cores = os.cpu_count() or 1
        threads = total_threads = cfg.trainer.threads or max(1, cores // max(1, self.world))
        if self.mode == "pipeline_rl" and self.device.type == "cpu":
            self.gen_threads = max(1, threads // 2)
            threads = max(1, threads - self.gen_threads)
        else:
            self.gen_threads = threads
        # the pipeline generator decodes on a GPU of its own where there is one (then it counts as a
        # device); on a CPU it shares the machine's cores, on one GPU the trainer's GPU
        self.gen_device = self.device
        if self.mode == "pipeline_rl":
            from scalerl.loop import pipeline

            pipeline.prestart()  # the generator process's imports overlap with the model build below
            self.gen_device = pipeline.generator_device(self.device)
        self.task = build_task(cfg)
        self.val = self.task.val_prompts()[: cfg.eval.num_prompts]
        # the warm-start (on first use) has the process's whole share of the cores; the pipeline
        # generator, which takes half of them later, does not run yet
        set_threads(total_threads)
        self.model, self.tokenizer, self.precision = build_policy(cfg, self.task, self.device)
        set_threads(threads)
        self.n_params = num_params(self.model, exclude_embeddings=True)
        self.n_params_all = num_params(self.model)  # counted before ZeRO-3 partitions the parameters
        self.trainer = make_trainer(
            cfg, self.model, self.precision, temperature=cfg.generator.temperature, device=self.device
        )
        from scalerl.generator import make_generator

        # generator over the trainer's own weights: rollouts in sync/ppo modes, evaluation in all
        self.generator = make_generator(
            cfg,
            self.trainer.module,
            self.tokenizer,
            self.precision,
            self.device,
            seed=cfg.seed + 7919 * self.rank,
        )
        self.tracker_tr = algo.PassRateTracker(cfg.filter.pass_rate_threshold)
        self.sampler = PromptSampler(
            self.task.train_prompts(),
            seed=cfg.seed,
            retired=self.tracker_tr if cfg.filter.no_positive_resampling else None,
            rank=self.rank,
            world=self.world,
        )
        self.tracker = Tracker(cfg, self.out_dir, enabled=self.is_main)
        self.ckpt = Checkpointer(self.out_dir)

        # counters (all part of the checkpoint)
        self.step = 0
        self.flops = 0.0
        self.elapsed = 0.0  # wall seconds of this run, summed over resumes
        self.gen_busy = 0.0
        self.train_busy = 0.0
        self.gen_tokens = 0
        self.evals: list[dict] = []  # {"step", "pass_rate", "flops", "device_hours"}
        self.step0_solved: dict[int, float] = {}
        self.next_group_id = 0
        self.zero_variance_dropped = 0
        self.stale_dropped = 0
        self.verifier_errors = 0
        self.devices = max(1, self.world) + (
            1 if self.gen_device.type == "cuda" and self.gen_device != self.device else 0
        )

    # ------------------------------------------------------------------ compute
    @property
    def device_hours(self) -> float:
        return self.elapsed * self.devices / 3600.0

    def _tick(self) -> None:
        now = time.perf_counter()
        self.elapsed += now - self._last_tick
        self._last_tick = now

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict:
        return {
            "step": self.step,
            "trainer": self.trainer.state_dict(),
            "rng": rng_state(),
            "sampler": self.sampler.state_dict(),
            "pass_rate_tracker": self.tracker_tr.state_dict(),
            "run_id": self.tracker.run_id,
            "pending_metrics": self.tracker.pending_state(),
            "counters": {
                "flops": self.flops,
                "elapsed": self.elapsed,
                "gen_busy": self.gen_busy,
                "train_busy": self.train_busy,
                "gen_tokens": self.gen_tokens,
                "next_group_id": self.next_group_id,
                "zero_variance_dropped": self.zero_variance_dropped,
                "stale_dropped": self.stale_dropped,
                "verifier_errors": self.verifier_errors,
            },
            "evals": self.evals,
            "step0_solved": self.step0_solved,
            "generator_rng": _gen_rng(self.generator),
        }

    def checkpoint(self) -> None:
        self._tick()
        tag = None
        if hasattr(self.trainer, "save_engine_checkpoint"):
            # collective: every rank writes its shard of the engine, and its own RNG streams
            tag = f"step_{self.step:08d}"
            own = {"rng": rng_state(), "generator_rng": _gen_rng(self.generator)}
            self.trainer.save_engine_checkpoint(
                str(self.out_dir / "checkpoint" / "engine"), tag=tag, rank_state=own
            )
        if self.is_main:
            self.ckpt.save({**self.state(), "engine_tag": tag})
            self.tracker.flush()

    def restore(self) -> bool:
        if not self.ckpt.exists():
            return False
        st = self.ckpt.load()
        self.trainer.load_state_dict(st["trainer"])
        own = None
        if hasattr(self.trainer, "load_engine_checkpoint"):
            tag = st.get("engine_tag") or "last"
            own = self.trainer.load_engine_checkpoint(str(self.out_dir / "checkpoint" / "engine"), tag=tag)
        set_rng_state(st["rng"])
        self.sampler.load_state_dict(st["sampler"])
        self.tracker_tr.load_state_dict(st["pass_rate_tracker"])
        c = st["counters"]
        self.flops, self.elapsed = c["flops"], c["elapsed"]
        self.gen_busy, self.train_busy, self.gen_tokens = c["gen_busy"], c["train_busy"], c["gen_tokens"]
        self.next_group_id = c["next_group_id"]
        self.zero_variance_dropped, self.stale_dropped = c["zero_variance_dropped"], c["stale_dropped"]
        self.verifier_errors = c["verifier_errors"]
        self.evals = st["evals"]
        self.step0_solved = {int(k): v for k, v in st["step0_solved"].items()}
        self.step = st["step"]
        _set_gen_rng(self.generator, st.get("generator_rng"))
        if own:  # this rank's own RNG streams (the main checkpoint holds rank 0's)
            set_rng_state(own["rng"])
            _set_gen_rng(self.generator, own.get("generator_rng"))
        self._resume_run_id = st["run_id"]
        self._resume_pending = st["pending_metrics"]
        return True

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out pass rate: mean over K samples per prompt at the training temperature."""
        K = int(self.cfg.eval.samples_per_prompt)
        model = self.trainer.module
        model.eval()
        ctx = self.trainer.gathered() if hasattr(self.trainer, "gathered") else _null()
        if not self.is_main:  # several trainer processes: rank 0 evaluates; under ZeRO-3 the
            with ctx:  # gather is collective, so every rank enters it
                pass
            return {}
        # evaluation draws its own seeded samples and leaves the training stream untouched
        rng = _gen_rng(self.generator)
        if rng is not None:
            self.generator.rng.manual_seed(self.cfg.seed * 1_000_003 + self.step)
        with ctx:
            groups = []
            # as many rows per decode as a training batch: a decode step costs little more for
            # 128 rows than for 32 (measured 9.6k vs 4.1k tokens/s on one CPU thread)
            bs = max(1, int(self.cfg.trainer.batch_size) // K)
            for i in range(0, len(self.val), bs):
                groups.extend(self.generator.generate(self.val[i : i + bs], K, version=self.step))
        _set_gen_rng(self.generator, rng)
        self.verifier_errors += score_groups(self.task, self.val, groups, self.cfg)
        per_prompt = {p.uid: sum(s.correct for s in g) / K for p, g in zip(self.val, groups)}
        by_diff: dict[int, list[float]] = defaultdict(list)
        for p in self.val:
            by_diff[p.difficulty].append(per_prompt[p.uid])
        out = {"val/pass_rate": sum(per_prompt.values()) / len(per_prompt)}
        for d, v in sorted(by_diff.items()):
            if len(by_diff) > 1:
                out[f"val/pass_rate_d{d}"] = sum(v) / len(v)
        if self.step == 0 and not self.step0_solved:
            self.step0_solved = per_prompt
        unsolved = [u for u, r in self.step0_solved.items() if r == 0]
        if unsolved:
            out["val/pass_rate_unsolved_at_start"] = sum(per_prompt.get(u, 0.0) for u in unsolved) / len(
                unsolved
            )
        out["val/truncation_rate"] = _mean(s.truncated for g in groups for s in g)
        out["val/response_length"] = _mean(s.num_tokens for g in groups for s in g)
        if self.cfg.eval.log_samples and self.is_main:
            lines = []
            for p, g in zip(self.val, groups):
                for s in g:
                    if len(lines) >= self.cfg.eval.log_samples:
                        break
                    lines.append(
                        json.dumps(
                            {
                                "prompt": p.text,
                                "output": s.text,
                                "answer": p.answer,
                                "reward": s.reward,
                                "versions": sorted(set(s.versions) - {-1}),
                                "interrupted": s.interrupted,
                                "truncated": s.truncated,
                            }
                        )
                    )
            self.tracker.log_artifact_text(f"samples/step_{self.step:06d}.jsonl", "\n".join(lines) + "\n")
        return out

    def eval_metrics(self) -> dict[str, float]:
        """Evaluate, record the point (compute, pass rate) and refit every M evaluations."""
        self._tick()
        metrics = self.evaluate()
        self._tick()
        if not metrics:  # not rank 0 (which evaluates)
            return {}
        self.evals.append(
            {
                "step": self.step,
                "pass_rate": metrics["val/pass_rate"],
                "flops": self.flops,
                "device_hours": self.device_hours,
            }
        )
        n_evals = len(self.evals)
        if n_evals >= 4 and n_evals % self.cfg.scaling.refit_every == 0:
            metrics.update(self.fit_metrics())
        self.last_pass_rate = metrics["val/pass_rate"]
        fit_a = metrics.get("fit/A", float("nan"))
        self.progress.write(
            f"step {self.step}/{self.total_steps}: val/pass_rate={metrics['val/pass_rate']:.3f}"
            + (f" fit/A={fit_a:.3f}" if fit_a == fit_a else "")
        )
        return metrics

    def fit_metrics(self, final: bool = False) -> dict[str, float]:
        try:
            from scalerl.scaling import live
        except ImportError:  # pragma: no cover
            return {}
        axis = self.cfg.scaling.compute_axis
        compute = [e[axis] for e in self.evals]
        reward = [e["pass_rate"] for e in self.evals]
        s = self.cfg.scaling
        try:
            if final:
                png = self.out_dir / "scaling_curve.png"
                _, metrics = live.final_report(
                    compute,
                    reward,
                    out_png=str(png),
                    extrapolate=s.extrapolate,
                    method=s.method,
                    min_compute_frac=s.min_compute_frac,
                    bootstrap=s.bootstrap,
                )
                if png.is_file():
                    self.tracker.log_artifact_file(png)
            else:
                _, metrics = live.fit_metrics(
                    compute,
                    reward,
                    method=s.method,
                    min_compute_frac=s.min_compute_frac,
                    bootstrap=s.bootstrap,
                )
        except Exception as e:  # a fit must never kill a run
            log.warning("scaling fit failed: %s", e)
            return {}
        return metrics

    def compute_metrics(self) -> dict[str, float]:
        wall = max(self.elapsed, 1e-9)
        return {
            "compute/flops": self.flops,
            "compute/device_hours": self.device_hours,
            "perf/generator_busy": min(1.0, self.gen_busy / wall),
            "perf/trainer_busy": min(1.0, self.train_busy / wall),
            "perf/tokens_per_s": self.gen_tokens / wall,
            "data/prompts_retired": float(len(self.tracker_tr)),
            "data/zero_variance_dropped": float(self.zero_variance_dropped),
            "data/stale_dropped": float(self.stale_dropped),
            "data/verifier_errors": float(self.verifier_errors),
            **self.device_memory_metrics(),
        }

    def device_memory_metrics(self) -> dict[str, float]:
        """The trainer's peak GPU memory so far (torch's allocator; the pipeline generator's process is
        not counted): what decides whether a bigger batch or model fits."""
        if self.device.type != "cuda":
            return {}
        return {"perf/gpu_mem_peak_gb": torch.cuda.max_memory_allocated(self.device) / 2**30}

    # ------------------------------------------------------------------ one optimiser step
    def train_on(self, groups: list[list]) -> None:
        """Filters, advantages and one optimiser step on ``groups`` (P groups of G samples)."""
        cfg = self.cfg
        samples = [s for g in groups for s in g]
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        gids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
        # no-positive-resampling history (paper Sec. 3.2), of every rank's groups
        history = [([s.prompt_uid for s in g], [float(s.correct) for s in g]) for g in groups]
        for part in collective.gather_objects(history):
            for uids, correct in part:
                self.tracker_tr.update(uids, correct)
        stats = {
            "train/reward": float(rewards.mean()),
            "train/correct": _mean(s.correct for s in samples),
            "train/truncation_rate": _mean(s.truncated for s in samples),
            "train/interruption_rate": _mean(s.interrupted for s in samples),
            "train/response_length": _mean(s.num_tokens for s in samples),
            "train/think_length": _mean(s.think_tokens for s in samples),
        }
        keep_groups = groups
        dropped = 0
        if cfg.filter.zero_variance:
            keep = algo.zero_variance_mask(rewards, gids)
            kept_idx = sorted({int(i) for i in gids[keep].tolist()})
            dropped = len(groups) - len(kept_idx)
            stats["data/zero_variance_dropped_step"] = float(dropped)
            keep_groups = [groups[i] for i in kept_idx]
        # policy lag of the tokens trained on (paper Sec. 3.1)
        lags = [self.step - v for g in groups for s in g for v in s.versions if v >= 0]
        all_versions = {v for g in groups for s in g for v in s.versions if v >= 0}
        stats["train/policy_lag_mean"] = _mean(lags) if lags else 0.0
        stats["train/policy_lag_max"] = float(max(lags)) if lags else 0.0
        stats["train/versions_in_batch"] = float(len(all_versions))
        stats["train/groups_trained"] = float(len(keep_groups))
        t0 = time.perf_counter()
        # several trainer processes: every rank takes part in the (collective) step if any has groups
        if collective.global_sum(len(keep_groups)):
            flat = [s for g in keep_groups for s in g]
            r = torch.tensor([s.reward for s in flat], dtype=torch.float32)
            gi = torch.tensor([i for i, g in enumerate(keep_groups) for _ in g], dtype=torch.long)
            adv = collective.global_advantages(r, gi, cfg.norm.name)  # norm=batch: std over all ranks
            batch = collate(keep_groups, adv, self.tokenizer.pad_token_id) if keep_groups else None
            stats.update(self.trainer.step(batch))
            trained_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in flat)
        else:  # every group was filtered out: nothing to train on this step
            nan = float("nan")
            for key in (
                "loss",
                "grad_norm",
                "entropy",
                "gen_train_logprob_diff",
                "is_ratio_mean",
                "is_ratio_max",
                "clip_fraction",
            ):
                stats[f"train/{key}"] = nan
            stats["train/step_skipped"] = 1.0
            trained_tokens = 0
        self.train_busy += time.perf_counter() - t0
        gen_tok = sum(len(s.prompt_ids) * 0 + len(s.completion_ids) for s in samples)
        # statistics and counters of all ranks' groups (rank 0 logs them)
        counts = {"dropped": dropped, "gen_tokens": gen_tok, "trained_tokens": trained_tokens}
        stats, counts = collective.reduce_step(stats, counts, samples=len(samples), lags=len(lags))
        self.zero_variance_dropped += int(counts["dropped"])
        self.gen_tokens += int(counts["gen_tokens"]) - gen_tok  # other ranks' (own: counted at generation)
        gen_tok, trained_tokens = counts["gen_tokens"], counts["trained_tokens"]
        self.flops += 2.0 * self.n_params * gen_tok + 6.0 * self.n_params * trained_tokens
        self.step += 1
        if self.step % self.cfg.eval.every == 0 or self.step == self.total_steps:
            stats.update(self.eval_metrics())
        self._tick()
        stats.update(self.compute_metrics())  # one value per step, shared by train and val metrics
        self.tracker.log(self.step, stats)
        self.tracker.log_step_done(self.step)
        self.progress.update(self.step, stats, getattr(self, "last_pass_rate", float("nan")))
        if self.step % self.cfg.checkpoint_every == 0 or self.step == self.total_steps:
            self.checkpoint()

    def new_group_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_group_id, self.next_group_id + n))
        self.next_group_id += n
        return ids

    # ------------------------------------------------------------------ async modes
    def run_sync_or_ppo(self) -> None:
        k = 1 if self.mode == "sync" else self.k
        while self.step < self.total_steps:
            n_batches = min(k, self.total_steps - self.step)
            prompts = self.sampler.next(self.P * n_batches)
            t0 = time.perf_counter()
            self.trainer.module.eval()
            ctx = self.trainer.gathered() if hasattr(self.trainer, "gathered") else _null()
            with ctx:
                groups = self.generator.generate(
                    prompts, self.G, version=self.step, group_ids=self.new_group_ids(len(prompts))
                )
            self.verifier_errors += score_groups(self.task, prompts, groups, self.cfg)
            self.gen_busy += time.perf_counter() - t0
            self.gen_tokens += sum(len(s.completion_ids) for g in groups for s in g)
            for j in range(n_batches):
                self.train_on(groups[j * self.P : (j + 1) * self.P])

    def start_generator(self):
        """Start the pipeline_rl generator process (it loads in the background)."""
        from scalerl.loop.pipeline import PipelineGenerator

        return PipelineGenerator(
            self.cfg, self.trainer.weights_for_generator(), self.step, self.gen_threads, self.gen_device
        )

    def run_pipeline(self, gen) -> None:
        gen.wait_ready()
        self._tick()
        busy0 = gen.busy_seconds
        buffer: list[list] = []  # finished groups, FIFO
        outstanding: dict[int, tuple[int, int]] = {}  # work id -> (version when assigned, n groups)
        work_id = 0
        chunk = max(1, int(self.cfg.generator.chunk_prompts))
        capacity = int(math.ceil(self.P * (1 + float(self.cfg.async_mode.max_buffered_batches))))
        while self.step < self.total_steps:
            # keep the generator fed, up to the capacity
            while len(buffer) + sum(n for _, n in outstanding.values()) + chunk <= capacity:
                prompts = self.sampler.next(chunk)
                gen.submit(work_id, prompts, self.new_group_ids(len(prompts)))
                outstanding[work_id] = (self.step, len(prompts))
                work_id += 1
            # the trainer at version `step` may train only on data at most k versions old:
            # wait for outstanding work begun before that, drop buffered data older than that
            oldest_ok = self.step - self.k
            while any(v < oldest_ok for v, _ in outstanding.values()) or len(buffer) < self.P:
                wid, groups, errors = gen.receive()
                outstanding.pop(wid, None)
                self.verifier_errors += errors
                self.gen_tokens += sum(len(s.completion_ids) for g in groups for s in g)
                buffer.extend(groups)
                fresh = [g for g in buffer if min(s.min_version for s in g if s.num_sampled) >= oldest_ok]
                self.stale_dropped += len(buffer) - len(fresh)
                buffer = fresh
            batch, buffer = buffer[: self.P], buffer[self.P :]
            self.gen_busy = self._gen_busy0 + gen.busy_seconds - busy0
            self.train_on(batch)
            gen.publish(self.trainer.weights_for_generator(), self.step)

    # ------------------------------------------------------------------ main
    def run(self) -> dict:
        cfg = self.cfg
        resumed = self.restore()
        extra = {
            **self.precision.describe(),
            "model/params_non_embedding": str(self.n_params),
            "model/params": str(self.n_params_all),
            "compute/devices": str(self.devices),
            "device": str(self.device),
        }
        if self.is_main:
            self.tracker.start(getattr(self, "_resume_run_id", None), extra)
            if resumed:
                self.tracker.restore_pending(self._resume_pending)
                log.info(
                    "resumed %s at step %d (MLflow run %s)", self.out_dir, self.step, self.tracker.run_id
                )
        self._gen_busy0 = self.gen_busy
        self._last_tick = time.perf_counter()
        self.progress = Progress(cfg, self.total_steps, self.step, enabled=self.is_main)
        status = "FAILED"
        gen = None
        try:
            if self.mode == "pipeline_rl" and self.step < self.total_steps:
                gen = self.start_generator()  # loads while step 0 is evaluated
            if not self.evals:  # step 0, before any update
                self.tracker.log(0, {**self.eval_metrics(), **self.compute_metrics()})
                self.tracker.log_step_done(0)
            if gen is not None:
                self.run_pipeline(gen)
            else:
                self.run_sync_or_ppo()
            if self.is_main and len(self.evals) >= 4:
                final = self.fit_metrics(final=True)
                if final:
                    self.tracker.log(self.step, final)
            self.checkpoint()
            status = "FINISHED"
        except NonFiniteError as e:
            self.checkpoint_safe()
            raise RunError(f"{e}; the last good checkpoint is in {self.ckpt.path}") from None
        finally:
            if gen is not None:
                gen.close()
            self.progress.close()
            if self.is_main:
                # Only what a checkpoint covers reaches MLflow: a run stopped between checkpoints
                # (preempted, interrupted, crashed) redoes those steps when it resumes, so writing
                # them now would duplicate them. A finished run flushed at its last checkpoint.
                if status == "FINISHED":
                    self.tracker.flush()
                if status == "FINISHED" or not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                    self.tracker.end(status)
        summary = {
            "run_id": self.tracker.run_id,
            "out_dir": str(self.out_dir),
            "steps": self.step,
            "evals": self.evals,
            "pass_rate_start": self.evals[0]["pass_rate"] if self.evals else None,
            "pass_rate_final": self.evals[-1]["pass_rate"] if self.evals else None,
            "wall_seconds": self.elapsed,
            "metrics_unflushed": len(self.tracker.pending),
        }
        if self.is_main:
            tmp = self.out_dir / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=1))
            os.replace(tmp, self.out_dir / "summary.json")
        return summary

    def checkpoint_safe(self) -> None:
        """After repeated non-finite steps the weights were never updated with them: keep a checkpoint."""
        try:
            self.checkpoint()
        except Exception as e:  # pragma: no cover
            log.warning("could not write a checkpoint: %s", e)


class Progress:
    """A tqdm bar on an interactive terminal, plain log lines otherwise."""

    def __init__(self, cfg, total: int, initial: int, enabled: bool = True):
        mode = cfg.progress
        self.enabled = enabled
        self.bar = None
        if enabled and (mode == "bar" or (mode == "auto" and sys.stderr.isatty())):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="scalerl", unit="step", dynamic_ncols=True)
        self.every = max(1, int(cfg.eval.every))

    def update(self, step: int, stats: dict, pass_rate: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                reward=f"{stats.get('train/reward', float('nan')):.3f}",
                pass_rate=f"{pass_rate:.3f}",
                tok_s=f"{stats.get('perf/tokens_per_s', 0):.0f}",
            )
        elif step % self.every == 0:
            print(
                f"[scalerl] step {step} reward={stats.get('train/reward', float('nan')):.3f} "
                f"tokens/s={stats.get('perf/tokens_per_s', 0):.0f}",
                flush=True,
            )

    def write(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"[scalerl] {msg}")
        else:
            print(f"[scalerl] {msg}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _gen_rng(gen):
    rng = getattr(gen, "rng", None)
    return rng.get_state() if rng is not None else None


def _set_gen_rng(gen, state) -> None:
    if state is not None and getattr(gen, "rng", None) is not None:
        gen.rng.set_state(state)


def _mean(xs) -> float:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else 0.0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def train(cfg: DictConfig) -> dict:
    """Run (or resume) the training run described by ``cfg``; returns a summary."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    OmegaConf.resolve(cfg)
    done = Path(cfg.out_dir) / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        if summary.get("steps", 0) >= cfg.trainer.total_steps:
            log.info("run in %s already finished (%d steps); nothing to do", cfg.out_dir, summary["steps"])
            return summary
    return Run(cfg).run()
