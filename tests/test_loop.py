"""Short real training runs (seconds each) asserting what the loop does, not only that it ran."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from procs import descendants, running

from scalerl import algo
from scalerl.config import GROUPS, compose, options, typed
from scalerl.config.groups.model import ARCHS
from scalerl.generator import GENERATORS, HFGenerator, Sample
from scalerl.loop import RunError, build, train
from scalerl.loop.batch import prepare_batch
from scalerl.loop.run import hand_over_weights, train_step
from scalerl.rollout.prompts import PromptSampler
from scalerl.task import build_task

ROOT = Path(__file__).resolve().parents[1]

INTERFACE_METRICS = [
    "val/pass_rate",
    "train/reward",
    "train/truncation_rate",
    "train/entropy",
    "train/response_length",
    "train/is_ratio_mean",
    "train/is_ratio_max",
    "train/clip_fraction",
    "train/gen_train_logprob_diff",
    "mismatch/k3_token",
    "mismatch/chi2_seq",
    "mismatch/ess_token",
    "mismatch/truncated_tokens",
    "train/policy_lag_mean",
    "train/policy_lag_max",
    "perf/tokens_per_s",
    "perf/generator_busy",
    "perf/trainer_busy",
    "compute/device_hours",
    "compute/flops",
    "data/zero_variance_dropped",
    "data/prompts_retired",
    "data/zero_variance_groups_step",  # what the report's "inactive" check reads
    "data/epochs",
]


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    c = MlflowClient(uri)
    return sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))


def uri_of(overrides: list[str]) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.startswith("tracking.uri="))


def make_run(overrides: list[str]):
    """(config, the run's components built from it): a real run that has not started."""
    cfg = compose(overrides)
    from omegaconf import OmegaConf

    OmegaConf.resolve(cfg)
    return cfg, build(cfg)


# ---------------------------------------------------------------------- the default recipe
def test_default_recipe_trains_and_logs_the_interface(tiny_overrides, capsys):
    """pipeline_rl + CISPO + fp32 head + interruptions...: every interface metric, params, artifacts,
    and the lines the run ends with."""
    summary = train(compose(tiny_overrides))
    printed = capsys.readouterr().out.splitlines()
    end = printed[-6:]
    assert end[0] == "[scalerl] done: 4 steps in " + end[0].split(" in ")[1]
    start, final = summary["pass_rate_start"], summary["pass_rate_final"]
    assert end[1] == f"[scalerl] held-out pass rate: {start:.3f} -> {final:.3f}"
    # 3 evaluations (steps 0, 2, 4): too few to fit, and it says so
    assert end[2] == (
        "[scalerl] no scaling fit: 3 held-out evaluations, a fit needs 4 (a larger "
        "trainer.total_steps or a smaller eval.every)"
    )
    assert end[3] == f"[scalerl] outputs: {summary['out_dir']}"
    assert end[4] == f"[scalerl] MLflow run {summary['run_id']} in {uri_of(tiny_overrides)}"
    assert end[5] == f"[scalerl] open it: mlflow ui --backend-store-uri {uri_of(tiny_overrides)}"
    uri = uri_of(tiny_overrides)
    c = MlflowClient(uri)
    run = c.get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    for key in INTERFACE_METRICS:
        assert key in run.data.metrics, key
    steps = [s for s, _ in history(uri, summary["run_id"], "train/reward")]
    assert steps == [1, 2, 3, 4]
    assert [s for s, _ in history(uri, summary["run_id"], "val/pass_rate")] == [0, 2, 4]
    # compute grows monotonically, FLOPs ~ 2N per generated + 6N per trained token
    flops = [v for _, v in history(uri, summary["run_id"], "compute/flops")]
    assert all(b > a for a, b in zip(flops, flops[1:]))
    p = run.data.params
    for group, option in {
        "loss": "cispo",
        "async_mode": "pipeline_rl",
        "precision": "fp32_head",
        "aggregation": "prompt",
        "norm": "batch",
        "length_control": "interruption",
    }.items():
        assert p[group] == option
    assert float(p["trainer.lr"]) == compose([]).trainer.lr  # the flat resolved config
    assert p["precision/body_dtype"].startswith("bf16") and p["precision/head_dtype"] == "fp32"
    assert run.data.tags["git_commit"] is not None and run.data.tags["host"]
    arts = {a.path for a in c.list_artifacts(summary["run_id"])}
    assert "config.yaml" in arts and "samples" in arts
    samples = c.list_artifacts(summary["run_id"], "samples")
    assert [a.path for a in samples] == [f"samples/step_{s:06d}.jsonl" for s in (0, 2, 4)]
    assert (Path(summary["out_dir"]) / "checkpoint" / "last.pt").is_file()


# ---------------------------------------------------------------------- every option of every group
SYNC = ["async_mode=sync"]
# every registered option of every group trains here, with these extra overrides, except those
# trained elsewhere (said where)
OPTION_EXTRAS = {
    "async_mode=ppo_off_policy": ["async_mode.minibatches=2"],
    "async_mode=pipeline_rl": ["async_mode.max_lag=2"],
    "placement=split": ["async_mode=pipeline_rl", "async_mode.max_lag=2"],  # engines of their own
}
TRAINED_ELSEWHERE = {
    "model=hf": "test_a_saved_model_loads_by_path_on_the_same_code_path",
    "task=jsonl": "test_jsonl_task_trains_with_math_verify",
    "task=code": "tests/test_code_task.py (inside task=multi)",
    "task=multi": "tests/test_code_task.py",
    "model=smollm2": "tests/test_real.py::test_smollm2_trains_one_step_on_gsm_offline_with_forced_interruptions",
    "task=gsm": "tests/test_real.py::test_smollm2_trains_one_step_on_gsm_offline_with_forced_interruptions",
    "task=champ": "tests/test_real.py::test_smollm2_trains_one_step_on_champ_offline",
    "trainer=deepspeed": "tests/test_deepspeed.py",
    "generator=vllm": "tests/test_vllm.py",
    "launcher=local": "a sweep setting: tests/test_sweep.py",
    "launcher=slurm": "a sweep setting: tests/test_sweep_slurm.py",
}
OPTION_RUNS = {
    **{
        f"{g}={o}": OPTION_EXTRAS.get(f"{g}={o}", [])
        for g in GROUPS
        for o in options(g)
        if f"{g}={o}" not in TRAINED_ELSEWHERE
    },
    **{f"model.arch={a}": [] for a in ARCHS},
}


@pytest.mark.parametrize("option", list(OPTION_RUNS))
def test_every_option_trains(option, tiny_overrides):
    overrides = [*tiny_overrides, *SYNC, option, *OPTION_RUNS[option]]
    summary = train(compose(overrides))
    uri = uri_of(overrides)
    run = MlflowClient(uri).get_run(summary["run_id"])
    key, value = option.split("=")
    assert run.data.params[key].split("(")[0] == value  # the variant: name(fields differing from its YAML)
    assert summary["steps"] == 4 and len(summary["evals"]) == 3
    lag = [v for _, v in history(uri, summary["run_id"], "train/policy_lag_max")]
    if option.startswith("async_mode=ppo_off_policy"):
        assert lag == [0.0, 1.0, 0.0, 1.0]  # 2 minibatches per generation
    elif option.startswith("async_mode=sync"):
        assert lag == [0.0] * 4
    if option == "filter=none":
        assert run.data.metrics["data/zero_variance_dropped"] == 0
    if option.startswith("correction="):  # the gap and what the correction did, every step
        for k in ("k3_token", "k3_seq", "chi2_token", "chi2_seq", "ess_token", "ess_seq"):
            assert len(history(uri, summary["run_id"], f"mismatch/{k}")) == 4, k
        for k in ("truncated_tokens", "truncated_sequences", "masked_tokens", "masked_sequences"):
            assert 0 <= run.data.metrics[f"mismatch/{k}"] <= 1, k
    if option == "length_control=length_penalty":
        rewards = [v for _, v in history(uri, summary["run_id"], "train/reward")]
        correct = [v for _, v in history(uri, summary["run_id"], "train/correct")]
        assert all(r <= c + 1e-9 for r, c in zip(rewards, correct))
    if option == "reward=plus_minus_one":  # +1/-1 rewards; train/correct stays the fraction correct
        rewards = [v for _, v in history(uri, summary["run_id"], "train/reward")]
        correct = [v for _, v in history(uri, summary["run_id"], "train/correct")]
        assert rewards == pytest.approx([2 * c - 1 for c in correct]) and all(0 <= c <= 1 for c in correct)
    if option == "length_control=none":
        assert run.data.metrics["train/interruption_rate"] == 0
    if option == "precision=bf16":
        assert run.data.params["precision/head_dtype"].startswith("bf16")
    if option == "precision=fp32":
        assert run.data.params["precision/body_dtype"] == "fp32"


# ---------------------------------------------------------------------- pipeline_rl
# a generator slower than the trainer, so that every weight update lands while sequences run (what
# mixes versions in a batch): a piece of 2 prompts (8 rows) is more than the engine's 4 running rows,
# so it starts only once the engine is empty, one piece at a time. The tiny model's chunk of 8 prompts
# ran whole, between two updates, whenever the trainer's step outlasted it
GENERATOR_BOUND = ("generator.chunk_prompts=2", "generator.max_running=4")


def test_pipeline_mixes_policy_versions_within_the_lag(tiny_overrides):
    k = 2
    overrides = [
        *tiny_overrides,
        "async_mode=pipeline_rl",
        f"async_mode.max_lag={k}",
        "trainer.total_steps=8",
        "eval.every=4",
        *GENERATOR_BOUND,
        "filter.zero_variance=false",
    ]
    summary = train(compose(overrides))
    uri = uri_of(overrides)
    versions = [v for _, v in history(uri, summary["run_id"], "train/versions_in_batch")]
    lags = [v for _, v in history(uri, summary["run_id"], "train/policy_lag_max")]
    assert len(lags) == 8
    assert max(versions) > 1, "no batch held tokens from more than one policy version"
    assert max(lags) <= k
    # the run's lag distribution: its maximum is the steps', its percentile and mean below it
    run_lag = {q: history(uri, summary["run_id"], f"async/lag_{q}")[-1][1] for q in ("mean", "p90", "max")}
    assert run_lag["max"] == max(lags)
    assert 0 < run_lag["mean"] <= run_lag["p90"] <= run_lag["max"]
    busy = MlflowClient(uri).get_run(summary["run_id"]).data.metrics
    assert 0 < busy["perf/generator_busy"] <= 1 and 0 < busy["perf/trainer_busy"] <= 1


@pytest.mark.parametrize("stale_kv", ["keep", "recompute"])
def test_pipeline_stale_kv_switch_reaches_the_generator_process(tiny_overrides, stale_kv):
    """generator.stale_kv in a pipeline_rl run: its generator process keeps the KV cache of the
    sequences in flight at an update (a measurable gen/stale_kv_logprob_gap), or rebuilds it under
    the new weights (the gap is rounding). In fp32: the generator's own forward (the lean decode
    path) and the gap's reference forward (transformers') sum in different orders, which under the
    emulated bf16 body can land a value on the other side of a bf16 rounding step (gaps of 1e-6 to
    1e-5 where nothing is stale); in fp32 it stays under 1e-6."""
    overrides = [
        *tiny_overrides,
        "precision=fp32",
        "async_mode=pipeline_rl",
        "async_mode.max_lag=2",
        "trainer.total_steps=6",
        "eval.every=100",
        "checkpoint_every=100",
        *GENERATOR_BOUND,
        "filter.zero_variance=false",
        f"generator.stale_kv={stale_kv}",
    ]
    summary = train(compose(overrides))
    gaps = [v for _, v in history(uri_of(overrides), summary["run_id"], "gen/stale_kv_logprob_gap")]
    assert gaps, "no sequence spanned an in-flight update"
    # keep: the new weights over the old ones' keys and values (6e-5 .. 1.2e-3 seen on the tiny run in
    # bf16); recompute: rounding of the lean forward against one sequence's transformers forward
    if stale_kv == "recompute":
        assert max(gaps) < 1e-6, gaps
    else:
        assert max(gaps) > 1e-5, gaps


@pytest.mark.parametrize("k", [2, 4])
def test_pipeline_generator_runs_ahead_until_the_lag_reaches_k(tiny_overrides, k, monkeypatch):
    """The generator may run max_lag batches ahead (max_buffered_batches set to max_lag), so the
    trained data reach k versions old: PipelineRL-k and PipelineRL-1 differ. It would stay at 1 if
    the generator only ever held one batch beyond the trainer's."""
    from scalerl.rollout.modes import PipelineRL

    take = PipelineRL.next_groups

    def slow_trainer(self):
        # a trainer slower than the generator, whatever the machine's load: before each step it
        # waits until the generator has finished all the work it was given (up to k batches ahead)
        if self._busy0 is not None:
            while self.outstanding:
                self.receive_one(self.r.state.step - self.max_lag)
        return take(self)

    monkeypatch.setattr(PipelineRL, "next_groups", slow_trainer)
    overrides = [
        *tiny_overrides,
        "async_mode=pipeline_rl",
        f"async_mode.max_lag={k}",
        f"async_mode.max_buffered_batches={k}",  # the default (2) would cap the lag at 2
        f"trainer.total_steps={2 * k + 2}",
        "eval.every=100",
        "filter.zero_variance=false",
    ]
    summary = train(compose(overrides))
    uri = uri_of(overrides)
    lags = [v for _, v in history(uri, summary["run_id"], "train/policy_lag_max")]
    assert max(lags) == k, lags
    assert history(uri, summary["run_id"], "async/lag_max")[-1][1] == k
    assert history(uri, summary["run_id"], "data/stale_dropped")[-1][1] == 0  # no work wasted


def test_pipeline_engines_hold_the_next_steps_work_while_the_trainer_evaluates(tiny_overrides):
    """Once a step's weights are handed over (before the evaluation or checkpoint that may follow),
    the engines hold the mode's whole capacity of work, assigned at that step: they generate while
    this process evaluates. Before, the batch a step took left a hole of that size until the next
    step began, and the engine (the default run's bottleneck) waited out every evaluation."""
    overrides = [*tiny_overrides, "async_mode=pipeline_rl", "trainer.total_steps=8", "eval.every=100"]
    cfg, run = make_run(overrides)
    src = run.source
    try:

        def ahead() -> int:
            return len(src.buffer) + sum(n for _, n in src.outstanding.values())

        hand_over_weights(run)  # the first weights: the step-0 evaluation comes next
        assert ahead() == src.capacity
        assert {v for v, _ in src.outstanding.values()} == {0}
        for step in (1, 2):
            train_step(run)
            assert ahead() == src.capacity, (step, ahead(), src.capacity)
            # the work given after this step is assigned at its version, as the next step would
            assert max(v for v, _ in src.outstanding.values()) == step
    finally:
        src.close()


@pytest.mark.slow
def test_generator_process_is_forked_with_its_imports_done():
    """pipeline_rl's generator process comes from a fork server that imported torch, transformers
    and scalerl while the trainer was still building (a spawned process would import them anew)."""
    from scalerl.rollout import server

    server.prestart()
    ctx = server.process_context()
    assert ctx.get_start_method() == "forkserver"
    check = "import sys; sys.exit(0 if {'transformers', 'scalerl.task.score'} <= set(sys.modules) else 3)"
    proc = ctx.Process(target=exec, args=(check,))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, "the forked process had to import transformers and scalerl itself"


# ---------------------------------------------------------------------- filters
def test_native_bf16_updates_fp32_master_weights(tiny_overrides):
    """precision.impl=native (the CUDA default, here on the CPU): bf16 kernels, fp32 master weights.
    At lr 1e-6 every update is far below what a bf16 weight can hold (its spacing near 0.02 is 1.2e-4):
    on bf16 parameters AdamW's steps would round away; on the fp32 masters they land."""
    over = [
        *tiny_overrides,
        "async_mode=sync",
        "precision.impl=native",
        "trainer.lr=1e-6",
        "trainer.warmup_steps=0",
        "trainer.total_steps=2",
        "model.warmstart_steps=150",
        "task.min_digits=1",
        "task.max_digits=1",
        "task.warmstart_max_digits=1",
    ]
    cfg, run = make_run(over)
    start = {k: v.clone() for k, v in run.trainer.module.state_dict().items()}
    summary = train(cfg, components=run)
    assert summary["steps"] == 2
    end = run.trainer.module.state_dict()
    assert all(v.dtype == torch.float32 for v in end.values() if v.is_floating_point())
    moved = [k for k in end if end[k].is_floating_point() and not torch.equal(end[k], start[k])]
    assert moved, "no weight moved"
    step = max(float((end[k] - start[k]).abs().max()) for k in moved)
    assert 0 < step < 1e-5


def sample(uid: int, group: int, reward: float, n_tokens: int = 3, version: int = 0) -> Sample:
    return Sample(
        prompt_uid=uid,
        group_id=group,
        prompt_ids=[1, 2],
        completion_ids=[3] * n_tokens,
        logprobs=[-0.5] * n_tokens,
        versions=[version] * n_tokens,
        loss_mask=[1] * n_tokens,
        text="",
        truncated=False,
        interrupted=False,
        think_tokens=0,
        reward=reward,
    )


def test_zero_variance_groups_never_reach_the_batch():
    rewards = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1], [0.5, 0.5, 0.5, 0.5]]
    groups = [[sample(g, g, r) for r in rs] for g, rs in enumerate(rewards)]
    for s_ in (s_ for g in groups for s_ in g):
        s_.correct = s_.reward
    prepared = prepare_batch(groups, version=0, zero_variance=True, norm="batch", pad_id=0)
    assert prepared.train and prepared.stats["data/zero_variance_dropped_step"] == 3
    assert prepared.counts["dropped"] == 3 and prepared.stats["train/groups_trained"] == 2
    batch = prepared.batch
    assert batch.num_groups == 2 and batch.num_sequences == 8
    for g in range(batch.num_groups):  # each trained group has a non-zero advantage
        assert batch.advantages[batch.group_ids == g].abs().max() > 0
    # without the filter every group is trained on, the zero-variance ones with advantage 0
    kept = prepare_batch(groups, version=0, zero_variance=False, norm="batch", pad_id=0)
    assert kept.batch.num_groups == 5 and "data/zero_variance_dropped_step" not in kept.stats
    # ... and the zero-variance groups are still counted (the report's "was the filter active")
    assert kept.stats["data/zero_variance_groups_step"] == 3
    # every group filtered out: no batch, the step is skipped and says so
    none = prepare_batch([groups[0], groups[2]], version=0, zero_variance=True, norm="batch", pad_id=0)
    assert not none.train and none.batch is None and none.stats["train/step_skipped"] == 1.0


@pytest.mark.parametrize(
    "mode",
    [
        ["async_mode=sync"],
        ["async_mode=ppo_off_policy", "async_mode.minibatches=2"],
        ["async_mode.max_lag=2"],
    ],
    ids=["sync", "ppo_off_policy", "pipeline_rl"],
)
def test_dynamic_sampling_fills_the_batch_with_groups_that_carry_signal(tiny_overrides, mode):
    """filter.dynamic_sampling: the zero-variance groups a step drops are replaced by groups of more
    prompts, so the step trains on batch_size / G groups that carry signal (sync: the last top-up's
    surplus too), unless it has generated max_gen_batches batches' worth; the dropped groups are
    still scored, counted and seen by no-positive-resampling. The warm-started model solves most
    1-2 digit sums, so many groups are solved G of G."""
    P, limit = 8, 3  # tiny_overrides: batch 32, G 4
    base = [o for o in tiny_overrides if not o.startswith("filter.dynamic_sampling=")]
    overrides = [*base, *mode, "filter.dynamic_sampling=true", f"filter.max_gen_batches={limit}"]
    cfg, run = make_run([*overrides, "trainer.total_steps=6", "eval.every=100"])
    dropped = 0
    try:
        hand_over_weights(run)  # as train() does first: pipeline_rl's engines start with them
        for _ in range(6):
            groups, stats = train_step(run)
            useful = [g for g in groups if len({s.reward for s in g}) > 1]
            zero = len(groups) - len(useful)
            assert stats["train/groups_trained"] == len(useful)
            assert stats["data/zero_variance_dropped_step"] == zero
            batches = (
                2 if "async_mode=ppo_off_policy" in mode else 1
            )  # generated for both minibatches at once
            assert len(groups) <= limit * P * batches
            if len(groups) < limit * P:  # the limit not reached: the batch is full
                assert len(useful) >= P, (len(groups), len(useful))
                if mode == ["async_mode.max_lag=2"]:  # pipeline_rl takes exactly P from its stream
                    assert len(useful) == P
            for g in groups:  # every group, the dropped ones too, is seen by no-positive-resampling
                solved = sum(s.correct for s in g) / len(g) >= 0.9
                assert run.pass_rates.retired(g[0].prompt_uid) == solved
            dropped += zero
    finally:
        run.source.close()
    assert dropped > 0, "the test needs zero-variance groups to replace"


def test_truncated_samples_can_leave_the_loss():
    rewards = [[1, 0, 0, 0], [1, 1, 0, 1], [0, 0]]
    groups = [[sample(g, g, r) for r in rs] for g, rs in enumerate(rewards)]
    for s_ in (s_ for g in groups for s_ in g):
        s_.correct = s_.reward
    groups[0][0].truncated = True  # its group is left with rewards 0, 0, 0: zero variance
    groups[1][2].truncated = True  # its group is left with 1, 1, 1
    groups[2][0].truncated = groups[2][1].truncated = True  # its group is left empty
    out = prepare_batch(
        groups, version=0, zero_variance=False, norm="batch", pad_id=0, exclude_truncated=True
    )
    assert out.stats["data/truncated_excluded_step"] == 4
    assert out.batch.num_sequences == 6 and out.batch.num_groups == 2
    assert out.stats["data/zero_variance_groups_step"] == 2
    # the step's statistics still describe every generated sample
    assert out.stats["train/truncation_rate"] == pytest.approx(4 / 10)
    both = prepare_batch(
        groups, version=0, zero_variance=True, norm="batch", pad_id=0, exclude_truncated=True
    )
    assert not both.train and both.stats["data/zero_variance_dropped_step"] == 2
    # off (the default): truncated samples are trained on
    off = prepare_batch(groups, version=0, zero_variance=False, norm="batch", pad_id=0)
    assert off.batch.num_sequences == 10 and "data/truncated_excluded_step" not in off.stats


def test_policy_lag_statistics_of_a_batch():
    groups = [
        [sample(0, 0, 1.0, version=3), sample(0, 0, 0.0, version=5)],
        [sample(1, 1, 1.0, version=5)] * 2,
    ]
    for s_ in (s_ for g in groups for s_ in g):
        s_.correct = s_.reward
    prepared = prepare_batch(groups, version=6, zero_variance=True, norm="batch", pad_id=0)
    st = prepared.stats
    assert st["train/policy_lag_max"] == 3.0 and st["train/versions_in_batch"] == 2.0
    assert st["train/policy_lag_mean"] == pytest.approx((3 * 3 + 9 * 1) / 12)
    assert st["train/policy_lag_p90"] == 3.0  # 3 of 12 tokens at lag 3: above the 90th percentile's 1
    # tokens per lag (every group's, the zero-variance ones included): the run's lag distribution
    assert {k: v for k, v in prepared.counts.items() if k.startswith("lag/")} == {"lag/3": 3.0, "lag/1": 9.0}
    from scalerl.state import RunState

    run = RunState(lag_tokens={1: 9, 3: 3})
    assert run.lag_summary() == {"mean": pytest.approx(1.5), "p90": 3.0, "max": 3.0}
    run.lag_tokens = {0: 95, 8: 5}
    assert run.lag_summary() == {"mean": pytest.approx(0.4), "p90": 0.0, "max": 8.0}
    assert RunState().lag_summary() == {"mean": 0.0, "p90": 0.0, "max": 0.0}


def test_zero_variance_counter_adds_up_the_steps(tiny_overrides):
    """The run's data/zero_variance_dropped is the sum of the groups dropped at each step."""
    summary = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=3"]))
    uri = uri_of(tiny_overrides)
    per_step = [v for _, v in history(uri, summary["run_id"], "data/zero_variance_dropped_step")]
    total = history(uri, summary["run_id"], "data/zero_variance_dropped")
    assert len(per_step) == 3 and sum(per_step) > 0, "the test needs some zero-variance groups"
    assert total[-1] == (3, sum(per_step))


def test_retired_prompts_are_never_sampled_again():
    cfg = compose(["task.num_train=16"])
    prompts = build_task(typed(cfg).task).train_prompts()
    rates = algo.PassRateTracker(0.5)
    sampler = PromptSampler(prompts, seed=0, retired=rates)
    for step in range(12):
        batch = sampler.next(4)
        retired_then = set(rates.retired_uids())
        assert not ({p.uid for p in batch} & retired_then), step
        # every other prompt is solved each time it is seen: those retire
        for p in batch:
            rates.update([p.uid] * 4, [float(p.uid % 2 == 0)] * 4)
    retired = set(rates.retired_uids())
    assert retired and retired == {p.uid for p in prompts if p.uid % 2 == 0}
    # the sampler's position is part of the checkpoint: a restored one continues identically
    again = PromptSampler(prompts, seed=0, retired=rates)
    again.load_state_dict(sampler.state_dict())
    assert [p.uid for p in again.next(5)] == [p.uid for p in sampler.next(5)]
    # every prompt retired: the run stops with the user's error (one line from the CLI), saying what to change
    rates.update([p.uid for p in prompts for _ in range(4)], [1.0] * (4 * len(prompts)))
    with pytest.raises(
        RunError, match=r"every one of the 16 training prompts is retired.*raise task\.num_train"
    ):
        sampler.next(1)


def test_no_positive_resampling_retires_prompts_in_a_short_run(tiny_overrides):
    """A train set of 16 prompts, 8 per step: 4 epochs in 8 steps. Prompts whose group is solved
    4/4 retire (the warm-started model solves most 1-2 digit sums) and no later step trains on them."""
    overrides = [*tiny_overrides, *SYNC, "task.num_train=16", "trainer.total_steps=8", "eval.every=100"]
    cfg, run = make_run(overrides)
    retired_before: set[int] = set()
    for _ in range(8):
        groups, _ = train_step(run)
        uids = {g[0].prompt_uid for g in groups}
        assert not uids & retired_before, "a retired prompt was drawn again"
        for g in groups:
            solved = sum(s.correct for s in g) / len(g) >= 0.9
            assert run.pass_rates.retired(g[0].prompt_uid) == solved  # retired the epoch it is solved
        retired_before = run.pass_rates.retired_uids()
    assert 0 < len(retired_before) < 16
    assert run.sampler.epoch >= 2  # the retired prompts were skipped in later epochs
    run.source.close()


def test_without_no_positive_resampling_no_prompt_is_counted_as_retired(tiny_overrides):
    """filter.no_positive_resampling=false: solved prompts are counted as reaching the threshold but
    not as retired (they are drawn again), so a report cannot read them as the filter acting."""
    overrides = [
        *tiny_overrides,
        *SYNC,
        "filter.no_positive_resampling=false",
        "task.num_train=16",
        "trainer.total_steps=8",
        "eval.every=100",
    ]
    summary = train(compose(overrides))
    uri = uri_of(overrides)
    assert history(uri, summary["run_id"], "data/prompts_at_threshold")[-1][1] > 0
    assert {v for _, v in history(uri, summary["run_id"], "data/prompts_retired")} == {0.0}


def test_interruption_inserts_the_phrase_and_respects_budgets(tiny_overrides):
    """The run's own generator (the warm-started model, the configured length control)."""
    cfg, run = make_run(
        [
            *tiny_overrides,
            *SYNC,
            "length_control.think_budget_min=6",
            "length_control.think_budget_max=10",
            "length_control.answer_budget=3",
        ]
    )
    groups = run.generator.generate(run.sampler.next(8), 4, version=0)
    samples = [s for g in groups for s in g]
    phrase_ids = run.tokenizer(cfg.length_control.phrase, add_special_tokens=False).input_ids
    interrupted = [s for s in samples if s.interrupted]
    assert interrupted, "a 6-10 token budget must interrupt the ~36-token scratchpad"
    for s in interrupted:
        assert 6 <= s.think_tokens <= 10
        i = s.loss_mask.index(0)
        assert s.completion_ids[i : i + len(phrase_ids)] == phrase_ids
        assert s.versions[i : i + len(phrase_ids)] == [-1] * len(phrase_ids)
        answer = s.completion_ids[i + len(phrase_ids) :]
        assert len(answer) <= 3
        assert cfg.length_control.phrase in s.text


@pytest.mark.parametrize(
    "batch_prompts, budget, sizes", [(0, None, [8]), (0, 1, [4, 4]), (8, None, [8]), (3, None, [3, 3, 2])]
)
def test_evaluation_decodes_as_many_prompts_together_as_eval_batch_prompts(
    tiny_overrides, batch_prompts, budget, sizes, monkeypatch
):
    """8 held-out prompts x K=2 through the run's own generator: 0 = as many as the KV budget allows
    (all 8 for a tiny model), at least a training batch's rows (batch_size 8 / K = 4 prompts a
    decode, where the budget holds fewer); else eval.batch_prompts prompts a decode."""
    import scalerl.config.schema as schema_module
    from scalerl.loop.evaluate import evaluate_run

    if budget is not None:
        monkeypatch.setattr(schema_module, "EVAL_KV_BUDGET_BYTES", budget)

    cfg, run = make_run(
        [
            *tiny_overrides,
            *SYNC,
            "trainer.batch_size=8",
            "eval.samples_per_prompt=2",
            f"eval.batch_prompts={batch_prompts}",
        ]
    )
    seen = []
    generate = run.generator.generate

    def counted(prompts, k, version):
        seen.append(len(prompts))
        return generate(prompts, k, version=version)

    run.generator.generate = counted
    out = evaluate_run(run)
    assert seen == sizes
    assert 0.0 <= out["val/pass_rate"] <= 1.0


def test_a_second_signal_while_a_stopped_run_closes_still_names_its_checkpoint(tiny_overrides):
    """The first Ctrl-C stops the run at the next step boundary with a checkpoint; a second one that
    lands while the run is closing (its engines, progress and MLflow run) stops it at once and still
    says at which step and where the checkpoint is. Real signals, sent at those two moments."""
    from scalerl.loop.signals import Interrupted

    cfg, run = make_run([*tiny_overrides, *SYNC, "trainer.total_steps=6", "checkpoint_every=2"])
    next_groups, close = run.source.next_groups, run.source.close

    def first_signal_during_step_4():
        if run.state.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return next_groups()

    def second_signal_while_closing():
        os.kill(os.getpid(), signal.SIGINT)
        close()

    run.source.next_groups = first_signal_during_step_4
    run.source.close = second_signal_while_closing
    with pytest.raises(Interrupted) as e:
        train(cfg, components=run)
    assert e.value.detail.startswith("interrupted by SIGINT at step 4/6; the last checkpoint (step 4) is in ")


def test_a_signal_during_a_checkpoints_flush_names_that_checkpoint(tiny_overrides):
    """A checkpoint is written, then the metrics it covers are sent to MLflow: a signal that stops
    the run at once during that flush (CI saw one land there) names the checkpoint just written, the
    one a resume starts from, not the one before it."""
    from scalerl.loop.signals import Interrupted

    cfg, run = make_run([*tiny_overrides, *SYNC, "trainer.total_steps=6", "checkpoint_every=2"])
    flush = run.tracker.flush

    def stopped_at_step_4():
        if run.state.step == 4:
            raise Interrupted(signal.SIGINT)
        flush()

    run.tracker.flush = stopped_at_step_4
    with pytest.raises(Interrupted) as e:
        train(cfg, components=run)
    assert e.value.detail.startswith("interrupted by SIGINT at step 4/6; the last checkpoint (step 4) is in ")
    assert torch.load(run.ckpt.path, weights_only=True)["step"] == 4


class IgnoresWeights(HFGenerator):
    """A generator that keeps sampling from the weights it was built with."""

    def load_weights(self, weights, version):
        pass


def test_a_generator_that_ignores_new_weights_stops_the_run(tiny_overrides, monkeypatch):
    """generator=hf implemented by a class that ignores new weights: the run stops at the first
    step, naming it, instead of generating from stale weights."""

    def build_ignoring(options, length_control, model, tokenizer, precision, *, device, seed, placement):
        return IgnoresWeights(
            model,
            tokenizer,
            precision,
            length_control,
            temperature=options.temperature,
            device=device,
            seed=seed,
        )

    monkeypatch.setitem(GENERATORS, "hf", build_ignoring)  # generator=hf's factory builds it
    with pytest.raises(
        RunError, match=r"IgnoresWeights\.load_weights did not take the trainer's weights of step 1"
    ):
        train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=2"]))


# ---------------------------------------------------------------------- reliability
@pytest.mark.slow
def test_resume_after_sigkill_continues_the_same_run_without_gaps(tmp_path, mlflow_uri):
    out = tmp_path / "run"
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        *[
            o
            for o in __import__("conftest").TINY
            if not o.startswith(("trainer.total_steps", "checkpoint_every"))
        ],
        "async_mode=sync",
        "trainer.total_steps=14",
        "checkpoint_every=3",
        f"out_dir={out}",
        f"tracking.uri={mlflow_uri}",
        "tracking.experiment=resume",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    import torch

    deadline = time.time() + 240
    ckpt = out / "checkpoint" / "last.pt"
    while time.time() < deadline:
        if ckpt.is_file() and torch.load(ckpt, weights_only=False)["step"] >= 6:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("no checkpoint at step >= 6: " + (proc.stdout.read() if proc.stdout else ""))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = json.loads((out / "run_info.json").read_text())["run_id"]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed" in r.stdout + r.stderr
    assert "recovered the lock on out_dir" in r.stdout + r.stderr  # the killed run's
    assert json.loads((out / "run_info.json").read_text())["run_id"] == run_id
    c = MlflowClient(mlflow_uri)
    exp = c.get_experiment_by_name("resume")
    assert len(c.search_runs([exp.experiment_id])) == 1
    for key in ("train/reward", "compute/flops", "progress/step"):
        steps = [s for s, _ in history(mlflow_uri, run_id, key)]
        expected = list(range(1, 15)) if key == "train/reward" else list(range(0, 15))
        assert steps == expected, (key, steps)
    assert [s for s, _ in history(mlflow_uri, run_id, "val/pass_rate")] == [0, 2, 4, 6, 8, 10, 12, 14]
    # each step's train/correct is in the checkpoint: the reward-hacking flag has every evaluation
    assert [s for s, _ in history(mlflow_uri, run_id, "health/reward_without_heldout_gain")] == list(
        range(2, 15, 2)
    )
    assert c.get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_sigkilled_pipeline_run_leaves_no_process_behind(tmp_path, mlflow_uri):
    """`kill -9` of a pipeline_rl run's own process (not its group): the generator process, the
    fork server and multiprocessing's helpers all end by themselves."""
    out = tmp_path / "run"
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        *[o for o in __import__("conftest").TINY if not o.startswith("trainer.total_steps")],
        "async_mode=pipeline_rl",
        "trainer.total_steps=10000",
        f"out_dir={out}",
        f"tracking.uri={mlflow_uri}",
        "tracking.experiment=orphans",
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.time() + 240
        while not (out / "checkpoint" / "last.pt").is_file():  # steps are running: the generator is up
            assert proc.poll() is None and time.time() < deadline, "the run did not reach a checkpoint"
            time.sleep(0.2)
        helpers = descendants(proc.pid)
        assert len(helpers) >= 2, helpers  # at least the fork server and the generator process
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 60
        while any(running(p) for p in helpers) and time.time() < deadline:
            time.sleep(0.5)
        left = [p for p in helpers if running(p)]
        assert not left, f"processes left behind: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_finished_run_is_not_run_again(tiny_overrides):
    cfg = compose([*tiny_overrides, *SYNC, "trainer.total_steps=2"])
    first = train(cfg)
    again = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=2"]))
    assert again["run_id"] == first["run_id"] and again["steps"] == 2


def test_nonfinite_steps_are_skipped_then_stop_the_run(tiny_overrides):
    cfg, run = make_run(
        [
            *tiny_overrides,
            *SYNC,
            "trainer.total_steps=10",
            "trainer.max_nonfinite_steps=3",
            "filter.zero_variance=false",
            "checkpoint_every=10",
        ]
    )
    with torch.no_grad():
        for p in run.trainer.module.parameters():
            p.fill_(float("nan"))  # a model whose every loss is non-finite
    with pytest.raises(RunError, match="3 consecutive optimiser steps had a non-finite.*; no checkpoint"):
        train(cfg, components=run)
    uri = uri_of(tiny_overrides)
    skipped = [v for _, v in history(uri, run.tracker.run_id, "train/step_skipped")]
    assert skipped[:2] == [1.0, 1.0]
    assert not run.ckpt.exists()  # its weights were never finite: nothing to resume from
    assert MlflowClient(uri).get_run(run.tracker.run_id).info.status == "FAILED"


def test_a_verifier_that_raises_scores_zero_and_is_counted(tiny_overrides):
    cfg, run = make_run([*tiny_overrides, *SYNC, "trainer.total_steps=2"])
    calls = {"n": 0}
    score = run.task.score

    def flaky(prompt, completion):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise ValueError("verifier crashed")
        return score(prompt, completion)

    run.task.score = flaky  # the run's task object, with a verifier that fails every third call
    summary = train(cfg, components=run)
    assert summary["steps"] == 2
    metrics = MlflowClient(uri_of(tiny_overrides)).get_run(summary["run_id"]).data.metrics
    assert metrics["data/verifier_errors"] == calls["n"] // 3


def test_verifier_timeout_scores_zero():
    from scalerl.task import Prompt, safe_score

    class Slow:
        def score(self, prompt, completion):
            time.sleep(5)
            return 1.0

    t0 = time.time()
    r, err = safe_score(Slow(), Prompt(0, "x", "y"), "z", timeout_s=0.3)
    assert (r, err) == (0.0, "timeout") and time.time() - t0 < 2


@pytest.mark.slow
def test_malformed_data_file_is_one_line_error(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": 3}\n')
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "task=jsonl",
            f"task.path={data}",
            f"out_dir={tmp_path / 'run'}",
            f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
            "model.warmstart_steps=0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(data) in lines[0] and "line 2: no 'answer' key" in lines[0], r.stderr
    assert not (tmp_path / "m.db").exists()


def test_jsonl_task_trains_with_math_verify(tiny_overrides, tmp_path):
    data = tmp_path / "math.jsonl"
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(40)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    summary = train(
        compose(
            [
                *(o for o in tiny_overrides if not o.startswith("task.")),  # keys of task=addition
                *SYNC,
                "task=jsonl",
                f"task.path={data}",
                "task.val_fraction=0.2",
                "model.warmstart_steps=0",
                "trainer.total_steps=2",
            ]
        )
    )
    assert summary["steps"] == 2
    from scalerl.task import JsonlTask

    t = JsonlTask(str(data), val_fraction=0.2)
    assert len(t.val_prompts()) == 8 and len(t.train_prompts()) == 32
    p = t.val_prompts()[0]
    assert t.score(p, f"thinking</think>{p.answer}") == 1.0
    assert t.score(p, "thinking</think>-1") == 0.0


def test_a_saved_model_loads_by_path_on_the_same_code_path(tiny_overrides, tmp_path):
    """model=hf model.name_or_path=<dir>: from_pretrained for model and tokenizer, then the same loop."""
    from scalerl.model import load_policy
    from scalerl.task import build_task

    config = typed(compose([*tiny_overrides, *SYNC]))
    model, tok, _ = load_policy(
        config.model, build_task(config.task), task_option=config.task, seed=config.seed
    )
    saved = tmp_path / "saved-model"
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    summary = train(
        compose(
            [
                *(o for o in tiny_overrides if not o.startswith("model.")),  # keys of model=tiny
                *SYNC,
                "model=hf",
                f"model.name_or_path={saved}",
                "trainer.total_steps=2",
            ]
        )
    )
    assert summary["steps"] == 2
    run = MlflowClient(uri_of(tiny_overrides)).get_run(summary["run_id"])
    assert run.data.params["model.name_or_path"] == str(saved)
    # the warm-started weights were loaded, not a fresh init: same pass rate at step 0 as the source model
    src = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=2", f"out_dir={tmp_path / 'src'}"]))
    assert summary["evals"][0]["pass_rate"] == src["evals"][0]["pass_rate"]


# ---------------------------------------------------------------------- run state and async modes
def test_run_state_round_trips_through_a_checkpoint(tmp_path):
    from scalerl.state import RunState

    st = RunState(step=7, flops=1.5e9, gen_tokens=123, zero_variance_dropped=4, stale_dropped=2)
    st.evals.append({"step": 4, "pass_rate": 0.5, "flops": 1e9, "device_hours": 0.01})
    st.step0_solved = {3: 0.0, 11: 0.5}
    st.lag_tokens = {0: 10, 2: 4}
    assert st.new_group_ids(3) == [0, 1, 2] and st.next_group_id == 3
    torch.save({"state": st.state_dict()}, tmp_path / "ck.pt")
    back = RunState()
    back.load_state_dict(torch.load(tmp_path / "ck.pt", weights_only=False)["state"])
    assert back == st
    # a checkpoint written before a counter existed resumes with it at its default
    old = {k: v for k, v in st.state_dict().items() if k != "lag_tokens"}
    back = RunState()
    back.load_state_dict(old)
    assert back.lag_tokens == {} and back.step == 7


def test_every_async_mode_option_has_its_class():
    from scalerl.rollout.modes import MODES

    options = {p.stem for p in (ROOT / "conf" / "async_mode").glob("*.yaml")}
    assert set(MODES) == options
    assert all(MODES[name].name == name for name in MODES)


def test_rerunning_a_finished_run_the_store_did_not_mark_finished_marks_it(tiny_overrides):
    """The store was unreachable when the run ended (summary.json says so, MLflow says RUNNING): the
    same command marks it FINISHED, writes nothing twice and trains nothing."""
    first = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=2"]))
    uri = uri_of(tiny_overrides)
    c = MlflowClient(uri)
    c.update_run(first["run_id"], status="RUNNING")
    done = Path(first["out_dir"]) / "summary.json"
    done.write_text(json.dumps({**json.loads(done.read_text()), "mlflow_status": "UNKNOWN"}))
    again = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=2"]))
    assert again["run_id"] == first["run_id"] and again["mlflow_status"] == "FINISHED"
    assert c.get_run(first["run_id"]).info.status == "FINISHED"
    assert [s for s, _ in history(uri, first["run_id"], "progress/step")] == [0, 1, 2]


def test_a_truncated_latest_checkpoint_resumes_from_the_one_before_without_gaps(tiny_overrides):
    """The latest checkpoint is cut short (a crash while the disk filled): the run resumes from the one
    before it, redoes the steps in between without logging them twice, and goes on."""
    from scalerl.tracking import Checkpointer

    out = Path(dict(o.split("=", 1) for o in tiny_overrides)["out_dir"])
    first = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=4"]))  # checkpoints at 2 and 4
    last = Checkpointer(out).path
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3])
    summary = train(compose([*tiny_overrides, *SYNC, "trainer.total_steps=6"]))
    assert summary["run_id"] == first["run_id"] and summary["steps"] == 6
    uri = uri_of(tiny_overrides)
    assert [s for s, _ in history(uri, summary["run_id"], "train/reward")] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in history(uri, summary["run_id"], "val/pass_rate")] == [0, 2, 4, 6]


def _group_at(version: int, gid: int) -> list:
    from scalerl.generator.sample import Sample

    return [Sample(gid, gid, [1], [2, 3], [-0.5, -0.5], [version, version + 1], [1, 1], "", False, False, 2)]


def test_pipeline_trains_on_the_oldest_buffered_groups_first():
    """A continuous engine sends pieces back as they finish, out of the order they were given: the
    trainer takes the groups of the oldest weights first (in arrival order among equals), so a late
    piece of an early step is trained on within its lag bound instead of waiting behind newer groups
    until it is too old (dropped unused: data/stale_dropped)."""
    from scalerl.rollout.modes import PipelineRL

    mode = PipelineRL.__new__(PipelineRL)  # the buffer logic alone: no engines
    mode.P, mode.dynamic_sampling = 2, False
    mode.buffer = [_group_at(3, 0), _group_at(1, 1), _group_at(2, 2), _group_at(1, 3)]
    batch, rest = mode._take()
    assert [g[0].group_id for g in batch] == [1, 3]
    assert [g[0].group_id for g in rest] == [2, 0]


def test_the_evaluations_decode_batch_follows_the_kv_cache_its_rows_need():
    """eval.batch_prompts=0: the embedded model's 128 held-out prompts x 6 decode at once (its cache
    is small), a SmolLM2-135M-shaped model's as a training batch's rows (16 prompts x 8: 360 MiB a
    row at its whole context); a set value is taken as it is; the wall-time estimate counts the
    same batches for the embedded model."""
    from transformers import GPT2Config, LlamaConfig

    from scalerl.config import compose, typed
    from scalerl.estimate import _tiny_kv_bytes_per_row
    from scalerl.model.kv_cache import kv_bytes_per_row

    cfg = typed(compose([]))
    m = cfg.model

    def decode_prompts(batch_prompts, batch_size, K, n_val, row_bytes):
        ev = dataclasses.replace(cfg.eval, batch_prompts=batch_prompts, samples_per_prompt=K)
        return ev.decode_prompts(batch_size, n_val, row_bytes)

    tiny = GPT2Config(
        n_embd=m.hidden_size, n_layer=m.num_layers, n_head=m.num_heads, n_positions=m.max_position_embeddings
    )
    assert kv_bytes_per_row(tiny) == _tiny_kv_bytes_per_row(m) == 2 * 4 * 3 * 4 * 32 * 128
    assert decode_prompts(0, 128, 6, 128, kv_bytes_per_row(tiny)) == 128
    smol = LlamaConfig(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
    )
    assert kv_bytes_per_row(smol) == 2 * 4 * 30 * 3 * 64 * 8192
    assert decode_prompts(0, 128, 8, 500, kv_bytes_per_row(smol)) == 16
    assert decode_prompts(0, 128, 8, 500, None) == 16  # a config without the fields
    assert kv_bytes_per_row(object()) is None
    assert decode_prompts(5, 128, 6, 128, kv_bytes_per_row(tiny)) == 5


def test_the_async_modes_signal_test_is_the_zero_variance_filters_on_float32_rewards():
    """carries_signal (what dynamic sampling asks of every buffered group) keeps a group exactly
    where algo.zero_variance_mask over its float32 rewards does: rewards equal as floats, equal only
    in float32 (1 and 1 + 1e-9), and different; with exclude_truncated, a truncated sample's reward
    left out."""
    from scalerl.rollout.modes import carries_signal

    def group(rewards, truncated=()):
        return [
            Sample(0, 0, [1], [2], [0.0], [0], [1], "", i in truncated, False, 1, reward=r)
            for i, r in enumerate(rewards)
        ]

    cases = [
        ([1.0, 1.0, 1.0], ()),
        ([1.0, 1.0 + 1e-9, 1.0], ()),
        ([0.0, 1.0, 1.0], ()),
        ([0.25, 0.25 + 1e-3], ()),
        ([0.0, 1.0, 1.0], (0,)),
        ([0.0, 1.0, 0.0], (1,)),
    ]
    for rewards, truncated in cases:
        for exclude in (False, True):
            g = group(rewards, truncated)
            kept = [s.reward for s in g if not (exclude and s.truncated)]
            mask = algo.zero_variance_mask(
                torch.tensor(kept, dtype=torch.float32), torch.zeros(len(kept), dtype=torch.long)
            )
            assert carries_signal(g, exclude) == bool(mask.any()), (rewards, truncated, exclude)


def test_pipeline_engines_get_whole_chunks_as_pieces_come_back(tiny_overrides):
    """As a piece of work comes back, the room it frees is refilled in whole chunks
    (generator.chunk_prompts) while other work is out: a refill cut to the room left at each return
    shrinks the pieces to a prompt or two, each a prefill, a message and a scoring of its own. Only
    the run's last work (what it still needs) may be smaller; a step's hand-over still gives the
    engines the whole capacity (test_pipeline_engines_hold_the_next_steps_work_while_the_trainer_evaluates)."""
    # dynamic sampling: a piece's groups that carry no signal free their room as it comes back
    # (this tiny model's groups mostly do not)
    overrides = [
        *tiny_overrides, "async_mode=pipeline_rl", "filter.dynamic_sampling=true", "trainer.total_steps=8",
        "eval.every=100",
    ]  # fmt: skip
    cfg, run = make_run(overrides)
    src, pool = run.source, run.source.pool
    submit, receive_one, inside = pool.submit, src.receive_one, []
    pieces = []  # (prompts, the most a refill may give: a chunk, or what the run still needs)

    def record(work_id, prompts, group_ids, version=None):
        if inside and src.outstanding:
            ahead = sum(map(src.signal, src.buffer)) + sum(n for _, n in src.outstanding.values())
            needed = (int(cfg.trainer.total_steps) - run.state.step) * src.P
            pieces.append((len(prompts), min(src.chunk, needed - ahead)))
        return submit(work_id, prompts, group_ids, version=version)

    def returned(oldest_ok):
        inside.append(True)
        try:
            return receive_one(oldest_ok)
        finally:
            inside.pop()

    pool.submit, src.receive_one = record, returned
    try:
        hand_over_weights(run)
        for _ in range(6):
            train_step(run)
    finally:
        src.close()
    assert len(pieces) >= 4, pieces  # refills happened as pieces came back
    assert all(n == most for n, most in pieces), pieces
    assert src.chunk > 1 and max(n for n, _ in pieces) == src.chunk
