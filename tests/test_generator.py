"""The rollout generator: behaviour log-probs, length control, in-flight weight updates, seeding.

A tiny random Qwen2 model (GPT-2 too, for the log-prob checks), built by ``build_model`` as a run
builds it, with the char tokenizer. To make eos / ``</think>`` likely, certain or impossible, the LM
head gets a bias (the real model, with edited weights; no mocks).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

import pytest
import torch
from test_model import tiny_model_cfg
from torch.nn.utils import parametrize
from transformers import DynamicCache
from transformers.pytorch_utils import Conv1D

from scalerl.generator import HFGenerator, Sample, make_generator
from scalerl.model.build import build_model
from scalerl.model.kv_cache import with_cache
from scalerl.model.precision import Precision
from scalerl.model.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
THINK_END = TOK.convert_tokens_to_ids("</think>")
PHRASE = " up.</think>"
PHRASE_IDS = TOK(PHRASE, add_special_tokens=False)["input_ids"]


@dataclass
class Prompt:
    uid: int
    text: str


@dataclass
class LC:
    name: str = "none"
    max_new_tokens: int = 16
    think_budget_min: int = 0
    think_budget_max: int = 0
    answer_budget: int = 0
    phrase: str = ""


def make_model(
    seed: int = 0, bias: dict[int, float] | None = None, arch: str = "qwen2", **shape
) -> torch.nn.Module:
    """The model ``model.arch=arch`` builds (:func:`build_model`), at test size."""
    mcfg = tiny_model_cfg(arch, hidden_size=64, intermediate_size=128, max_position_embeddings=256, **shape)
    model = build_model(mcfg, len(TOK), seed=seed, pad_token_id=TOK.pad_token_id, eos_token_id=EOS).eval()
    if bias:
        b = torch.zeros(len(TOK))
        for token, value in bias.items():
            b[token] = value
        model.lm_head.bias = torch.nn.Parameter(b)
    return model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is faster than two on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SAME_LEN = [Prompt(0, "12+34="), Prompt(1, "56+78="), Prompt(2, "90+12=")]
VAR_LEN = [Prompt(0, "1+2="), Prompt(1, "123+4567="), Prompt(2, "45+6=")]


@torch.no_grad()
def full_logprobs(model, precision, prompt_ids, completion_ids, temperature=1.0) -> torch.Tensor:
    """Log-probs of the completion under one non-cached forward pass of prompt + completion."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with precision.autocast(model):
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]
    p = len(prompt_ids)
    logp = precision.log_softmax(
        precision.logits(model, hidden[p - 1 : p - 1 + len(completion_ids)]), temperature
    )
    return logp.gather(1, torch.tensor(completion_ids)[:, None]).squeeze(1)


def max_logprob_error(model, precision, groups, temperature=1.0) -> float:
    err = 0.0
    for s in (s for g in groups for s in g):
        ref = full_logprobs(model, precision, s.prompt_ids, s.completion_ids, temperature)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        got = torch.tensor(s.logprobs)
        assert torch.all(got[~mask] == 0.0)
        err = max(err, (got[mask] - ref[mask]).abs().max().item() if mask.any() else 0.0)
    return err


def flat(groups: list[list[Sample]]) -> list[Sample]:
    return [s for g in groups for s in g]


# ---------------------------------------------------------------------------- behaviour log-probs
@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_full_forward_fp32(temperature, arch):
    # the eos bias scaled with the temperature: the same eos odds at both, so that the seed gives
    # finished and truncated samples at both (at 0.7 a fixed 2.5 made truncation rare)
    model = make_model(bias={EOS: 2.5 * temperature}, arch=arch)
    prec = Precision()
    gen = HFGenerator(model, TOK, prec, LC(max_new_tokens=16), temperature=temperature, seed=1)
    groups = gen.generate(SAME_LEN, 4, version=7, group_ids=[10, 11, 12])
    assert [len(g) for g in groups] == [4, 4, 4]
    assert [g[0].group_id for g in groups] == [10, 11, 12]
    assert [g[0].prompt_uid for g in groups] == [0, 1, 2]
    assert max_logprob_error(model, prec, groups, temperature) < 1e-4
    samples = flat(groups)
    for s in samples:
        assert len(s.completion_ids) == len(s.logprobs) == len(s.versions) == len(s.loss_mask)
        assert s.versions == [7] * s.num_tokens and s.loss_mask == [1] * s.num_tokens
        assert EOS not in s.completion_ids[:-1]  # eos ends a sequence
        if s.truncated:
            assert s.num_tokens == 16 and s.completion_ids[-1] != EOS
        else:
            assert s.completion_ids[-1] == EOS
        assert s.text == TOK.decode([t for t in s.completion_ids if t != EOS], skip_special_tokens=False)
        assert all(lp < 0 for lp in s.logprobs)
    # the seed gives both kinds, with different lengths finishing in one batch
    assert any(s.truncated for s in samples) and any(not s.truncated for s in samples)
    assert len({s.num_tokens for s in samples}) > 2


def test_sampling_draws_each_token_at_its_probability_and_never_a_masked_one():
    """The generator's sampler (Gumbel-max over uniforms): over 40,000 draws of rows holding a
    peaked, a flat and a masked distribution (tokens at -inf), each token's frequency lies within 4.5
    standard errors of its probability (temperature applied before, in the log-probs), no token of
    probability 0 is ever drawn (the first and the last entries included), and temperature 0 takes
    the argmax."""
    gen = HFGenerator(make_model(arch="gpt2"), TOK, Precision(), LC(max_new_tokens=4), seed=5)
    g = torch.Generator().manual_seed(0)
    V, n = 40, 10_000
    logits = torch.stack([torch.randn(V, generator=g) * 3, torch.zeros(V), torch.randn(V, generator=g)])
    logits[2, :10] = logits[2, -5:] = float("-inf")
    logits[2, 20] = float("-inf")
    logp = torch.log_softmax(logits, -1).repeat(4, 1)
    draws = torch.stack([gen._sample(logp) for _ in range(n)])  # [n, 12]
    for row in range(3):
        got = torch.cat([draws[:, row + 3 * k] for k in range(4)])
        freq = torch.bincount(got, minlength=V).double() / got.numel()
        p = logp[row].double().exp()
        se = (p * (1 - p) / got.numel()).sqrt()
        assert ((freq - p).abs() <= 4.5 * se + 1e-12).all(), (row, (freq - p).abs().max())
        assert (freq[p == 0] == 0).all()
    gen.temperature = 0.0
    assert torch.equal(gen._sample(logp), logp.argmax(-1))


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("head", ["bf16", "fp32"])
def test_bf16_emulated_logprobs_close(head, arch):
    model = make_model(bias={EOS: 2.5}, arch=arch)
    prec = Precision(body="bf16", head=head, impl="emulated")
    gen = HFGenerator(model, TOK, prec, LC(max_new_tokens=16), seed=1)
    groups = gen.generate(SAME_LEN, 4, version=0)
    assert max_logprob_error(model, prec, groups) < 0.05
    # every linear layer of the body rounds its weights (GPT-2's are transformers' Conv1D)
    linears = [m for m in model.get_decoder().modules() if isinstance(m, (torch.nn.Linear, Conv1D))]
    assert len(linears) >= 8 and all(parametrize.is_parametrized(m, "weight") for m in linears)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_native_bf16_master_weights_and_inference_copy(arch):
    """precision.impl=native (the CUDA default; real bf16 kernels, here on the CPU). A trained model
    keeps fp32 master weights and runs its body under autocast; an inference-only copy (the pipeline
    generator process's) holds bf16 weights. Both decode with log-probs that a full forward
    reproduces, and they compute the same function up to bf16 rounding."""
    prec = Precision(body="bf16", head="fp32", impl="native")
    master = prec.prepare(make_model(bias={EOS: 2.5}, arch=arch))
    copy_ = prec.prepare(make_model(bias={EOS: 2.5}, arch=arch), master_weights=False)
    assert {p.dtype for p in master.parameters()} == {torch.float32}
    assert {p.dtype for p in copy_.get_decoder().parameters()} == {torch.bfloat16}
    assert copy_.lm_head.weight.dtype == torch.float32  # the fp32 head
    for model in (master, copy_):
        groups = HFGenerator(model, TOK, prec, LC(max_new_tokens=12), seed=1).generate(SAME_LEN, 3, version=0)
        assert max_logprob_error(model, prec, groups) < 0.05
    s = flat(groups)[0]
    a = full_logprobs(master, prec, s.prompt_ids, s.completion_ids)
    b = full_logprobs(copy_, prec, s.prompt_ids, s.completion_ids)
    fp32 = full_logprobs(make_model(bias={EOS: 2.5}, arch=arch), Precision(), s.prompt_ids, s.completion_ids)
    assert (a - b).abs().max() < 0.05
    assert (a - fp32).abs().max() > 1e-5  # the master-weight model really computed in bf16


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_left_padded_prompts_match_unbatched_forward(arch):
    """Variable-length prompts (left padding + mask + position_ids) give each row the log-probs
    of its own unpadded sequence, including forced tokens fed through the padded batch."""
    model = make_model(bias={EOS: 1.5, THINK_END: -30.0}, arch=arch)
    prec = Precision()
    lc = LC("interruption", 40, 3, 6, answer_budget=5, phrase=PHRASE)
    gen = HFGenerator(model, TOK, prec, lc, seed=2)
    groups = gen.generate(VAR_LEN, 3, version=0)
    assert [len(g[0].prompt_ids) for g in groups] == [4, 9, 5]
    assert all(s.prompt_ids == TOK(p.text)["input_ids"] for p, g in zip(VAR_LEN, groups) for s in g)
    assert max_logprob_error(model, prec, groups) < 1e-4
    assert any(s.interrupted for s in flat(groups))


# ---------------------------------------------------------------------------- length control
def test_interruption_forces_phrase_at_budget():
    model = make_model(bias={THINK_END: -30.0, EOS: 1.0})
    prec = Precision()
    lc = LC("interruption", 64, think_budget_min=3, think_budget_max=6, answer_budget=4, phrase=PHRASE)
    gen = HFGenerator(model, TOK, prec, lc, seed=3)
    groups = gen.generate(SAME_LEN, 8, version=5)
    samples = flat(groups)
    k = len(PHRASE_IDS)
    assert PHRASE_IDS[-1] == THINK_END
    for s in samples:
        b = s.think_tokens
        if not s.interrupted:  # eos while thinking, before the budget
            assert s.completion_ids[-1] == EOS and not s.truncated and s.num_tokens <= 6
            continue
        assert 3 <= b <= 6
        assert s.completion_ids[b : b + k] == PHRASE_IDS
        assert s.loss_mask == [1] * b + [0] * k + [1] * (s.num_tokens - b - k)
        assert s.versions[b : b + k] == [-1] * k and s.logprobs[b : b + k] == [0.0] * k
        assert set(s.versions[:b] + s.versions[b + k :]) <= {5}
        assert THINK_END not in s.completion_ids[:b] and EOS not in s.completion_ids[:b]
        answer = s.completion_ids[b + k :]
        assert len(answer) <= 4
        assert s.truncated == (not answer or answer[-1] != EOS)
        if s.truncated:
            assert len(answer) == 4
        assert PHRASE in s.text
    interrupted = [s for s in samples if s.interrupted]
    assert len(interrupted) > len(samples) // 2
    assert len({s.think_tokens for s in interrupted}) >= 3  # budgets are drawn per sequence
    assert any(not s.truncated for s in interrupted) and any(s.truncated for s in interrupted)
    # the answer is conditioned on the forced phrase (forced tokens went through the KV cache)
    assert max_logprob_error(model, prec, groups) < 1e-4
    assert min(s.min_version for s in samples) == 5 and max(s.max_version for s in samples) == 5


def test_natural_think_end_then_answer_budget():
    model = make_model(bias={THINK_END: 30.0, EOS: -30.0})
    lc = LC("interruption", 64, think_budget_min=3, think_budget_max=6, answer_budget=4, phrase=PHRASE)
    groups = HFGenerator(model, TOK, Precision(), lc, seed=0).generate(SAME_LEN, 2, version=0)
    for s in flat(groups):
        # </think> is certain at the first step, and after it only ordinary answer tokens (its bias
        # does not matter once answering: at most answer_budget tokens)
        assert s.completion_ids[0] == THINK_END and s.think_tokens == 0 and not s.interrupted
        assert s.num_tokens == 1 + 4 and s.truncated and s.loss_mask == [1] * 5
        assert s.text.startswith("</think>")


def test_interruption_respects_max_new_tokens():
    model = make_model(bias={THINK_END: -30.0, EOS: -30.0})
    # budget 5, then the phrase, then only 2 of the 4 answer tokens fit into max_new_tokens=7
    lc = LC("interruption", 7, think_budget_min=5, think_budget_max=5, answer_budget=4, phrase=PHRASE)
    for s in flat(HFGenerator(model, TOK, Precision(), lc).generate(SAME_LEN, 2, version=0)):
        assert s.interrupted and s.truncated and s.think_tokens == 5
        assert sum(s.loss_mask) == 7 and s.num_tokens == 7 + len(PHRASE_IDS)
    # budget above max_new_tokens: never interrupted, plain truncation
    lc = LC("interruption", 4, think_budget_min=5, think_budget_max=6, answer_budget=4, phrase=PHRASE)
    for s in flat(HFGenerator(model, TOK, Precision(), lc).generate(SAME_LEN, 2, version=0)):
        assert not s.interrupted and s.truncated and s.num_tokens == 4 and s.think_tokens == 4


@pytest.mark.parametrize("name", ["none", "length_penalty"])
def test_truncation_at_max_new_tokens(name):
    model = make_model(bias={EOS: -30.0})
    steps = []
    gen = HFGenerator(model, TOK, Precision(), LC(name, max_new_tokens=9), seed=0)
    groups = gen.generate(VAR_LEN, 2, version=1, on_step=lambda: steps.append(1))
    assert len(steps) == 9
    for s in flat(groups):
        assert s.truncated and not s.interrupted and s.num_tokens == 9 and EOS not in s.completion_ids
        assert s.versions == [1] * 9 and s.loss_mask == [1] * 9


def test_eos_ends_sequence_and_stops_early():
    model = make_model(bias={EOS: 30.0})
    steps = []
    gen = HFGenerator(model, TOK, Precision(), LC("none", max_new_tokens=20))
    groups = gen.generate(SAME_LEN, 3, version=0, on_step=lambda: steps.append(1))
    assert len(steps) == 1  # all rows finished at the first step
    for s in flat(groups):
        assert s.completion_ids == [EOS] and s.text == "" and not s.truncated and s.think_tokens == 0


# ---------------------------------------------------------------------------- in-flight updates
def test_inflight_weight_update_keeps_stale_cache():
    model = make_model(seed=0, bias={EOS: -30.0})
    old = copy.deepcopy(model)
    new = make_model(seed=1, bias={EOS: -30.0})
    prec = Precision()
    calls = []

    def weight_update():
        calls.append(1)
        if len(calls) == 4:  # before the 4th token: the trainer pushed version 4
            model.load_state_dict(new.state_dict())
            return 4
        return None

    gen = HFGenerator(model, TOK, prec, LC("none", max_new_tokens=10), seed=0)
    samples = flat(gen.generate(SAME_LEN, 2, version=3, weight_update=weight_update))
    assert len(calls) == 10
    for s in samples:
        assert s.versions == [3, 3, 3] + [4] * 7
        assert s.min_version == 3 and s.max_version == 4 and s.num_tokens == 10
        got = torch.tensor(s.logprobs)
        # tokens 0-2: the old policy
        ref_old = full_logprobs(old, prec, s.prompt_ids, s.completion_ids)
        assert torch.allclose(got[:3], ref_old[:3], atol=1e-4)
        # tokens 3..: the new weights on top of the cache the old weights built (prompt + t0 + t1)
        c = s.completion_ids
        with torch.no_grad():
            cache = DynamicCache()
            old_body, new_body = old.get_decoder(), new.get_decoder()
            old_body(
                input_ids=torch.tensor([s.prompt_ids + c[:2]]), use_cache=True, **with_cache(old_body, cache)
            )
            h = new_body(input_ids=torch.tensor([c[2:-1]]), use_cache=True, **with_cache(new_body, cache))
            logp = prec.log_softmax(prec.logits(new, h.last_hidden_state[0]))
        ref_stale = logp.gather(1, torch.tensor(c[3:])[:, None]).squeeze(1)
        assert torch.allclose(got[3:], ref_stale, atol=1e-4)
        # ... which is not what the new policy computes from scratch: the cache was kept
        ref_new = full_logprobs(new, prec, s.prompt_ids, c)
        assert (got[3:] - ref_new[3:]).abs().max() > 1e-3


def _update_at(model, new, at: int, version: int, calls: list):
    """A ``weight_update`` that copies ``new``'s weights into ``model`` in place before the
    ``at``-th decode step (as the trainer's weights arrive) and returns ``version`` then."""

    def weight_update():
        calls.append(1)
        if len(calls) == at:
            src = dict(new.named_parameters())
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(src[name.replace("parametrizations.weight.original", "weight")])
            return version
        return None

    return weight_update


@pytest.mark.parametrize(
    "prompts,static,mode",
    [
        (SAME_LEN, False, "none"),
        (VAR_LEN, False, "none"),
        (VAR_LEN, True, "none"),
        (VAR_LEN, False, "interruption"),
    ],
    ids=["same-len", "var-len", "var-len-static", "interruption"],
)
def test_stale_kv_recompute_gives_a_fresh_forwards_logprobs_after_an_inflight_update(prompts, static, mode):
    """generator.stale_kv=recompute: after an in-flight update the running rows are prefilled again
    under the new weights, so the tokens sampled from then on carry exactly the log-probs of a fresh
    forward pass of the new weights (gen/stale_kv_logprob_gap ~0); the tokens before keep the old
    weights' log-probs and version. With keep, the same update leaves a gap."""
    eos_bias = 1.0 if mode == "interruption" else -30.0  # rows finish at different steps (compaction)
    lc = (
        LC("interruption", 14, 2, 9, answer_budget=3, phrase=PHRASE)
        if mode == "interruption"
        else LC("none", max_new_tokens=10)
    )
    old = make_model(seed=0, bias={EOS: eos_bias})
    new = make_model(seed=1, bias={EOS: eos_bias})
    prec = Precision()
    gaps = {}
    for stale_kv in ("keep", "recompute"):
        model = copy.deepcopy(old)
        calls = []
        gen = HFGenerator(
            model, TOK, prec, lc, seed=0, static_cache=static, stale_kv=stale_kv, stale_kv_samples=100
        )
        gen.compact_min_rows = 2  # finished rows leave the cache early: recompute must follow them
        samples = flat(gen.generate(prompts, 3, version=3, weight_update=_update_at(model, new, 4, 4, calls)))
        assert gen.version == 4
        assert (gen.stale_kv_recomputed_tokens > 0) == (stale_kv == "recompute")
        gaps[stale_kv] = [s.stale_kv_gap for s in samples if s.stale_kv_gap is not None]
        assert gaps[stale_kv], [s.versions for s in samples]
        if stale_kv == "keep":
            continue
        for s in samples:
            sampled = [i for i, m in enumerate(s.loss_mask) if m]
            assert all(s.versions[i] == (3 if i < 3 else 4) for i in sampled)
            got = torch.tensor(s.logprobs)
            ref_old = full_logprobs(old, prec, s.prompt_ids, s.completion_ids)
            ref_new = full_logprobs(new, prec, s.prompt_ids, s.completion_ids)
            before = [i for i in sampled if i < 3]
            after = [i for i in sampled if i >= 3]
            assert torch.allclose(got[before], ref_old[before], atol=1e-4)
            assert torch.allclose(got[after], ref_new[after], atol=1e-4), (
                (got[after] - ref_new[after]).abs().max()
            )
    assert max(gaps["recompute"]) < 1e-4
    assert min(gaps["keep"]) > 1e-3  # the new weights read the old weights' keys and values


def test_stale_kv_recompute_samples_what_a_fresh_start_from_the_same_state_samples():
    """Greedy decoding: recompute after an update before step k continues exactly as a generation
    whose prompt is prompt + the k tokens so far, run under the new weights from the start."""
    old = make_model(seed=0, bias={EOS: -30.0})
    new = make_model(seed=1, bias={EOS: -30.0})
    model = copy.deepcopy(old)
    gen = HFGenerator(
        model, TOK, Precision(), LC("none", max_new_tokens=8), temperature=0.0, stale_kv="recompute"
    )
    (s,) = flat(gen.generate(SAME_LEN[:1], 1, version=0, weight_update=_update_at(model, new, 4, 1, [])))
    fresh = HFGenerator(new, TOK, Precision(), LC("none", max_new_tokens=5), temperature=0.0)
    prompt = SAME_LEN[0].text + TOK.decode(s.completion_ids[:3])
    (f,) = flat(fresh.generate([Prompt(0, prompt)], 1, version=1))
    assert f.prompt_ids == s.prompt_ids + s.completion_ids[:3]
    assert f.completion_ids == s.completion_ids[3:]
    assert max(abs(a - b) for a, b in zip(f.logprobs, s.logprobs[3:])) < 1e-4


@pytest.mark.parametrize("static", [False, True])
def test_stale_kv_keep_and_recompute_are_identical_without_an_update(static):
    """Without an update the switch changes nothing: keep (the default) and recompute sample the
    same tokens with the same log-probs, bit for bit, from the same seed."""
    model = make_model(bias={EOS: 2.0})
    lc = LC("interruption", 24, 3, 8, answer_budget=4, phrase=PHRASE)
    runs = []
    for kw in ({}, {"stale_kv": "keep"}, {"stale_kv": "recompute"}):
        gen = HFGenerator(model, TOK, Precision(), lc, seed=0, static_cache=static, **kw)
        out = flat(gen.generate(VAR_LEN, 3, version=0, weight_update=lambda: None))
        runs.append([(s.completion_ids, s.logprobs, s.versions) for s in out])
        assert gen.stale_kv_recomputed_tokens == 0
    assert runs[0] == runs[1] == runs[2]


def test_stale_kv_from_the_config_and_its_check():
    from scalerl.config import compose

    assert compose([]).generator.stale_kv == "keep"
    cfg = _cfg("hf")
    cfg.generator.stale_kv = "recompute"
    assert _made(cfg, make_model()).stale_kv == "recompute"
    with pytest.raises(Exception, match="stale_kv"):
        compose(["generator.stale_kv=drop"])
    with pytest.raises(ValueError, match="stale_kv must be one of keep, recompute"):
        HFGenerator(make_model(), TOK, Precision(), LC(), stale_kv="drop")


# ---------------------------------------------------------------------------- seeding
def test_seeded_determinism():
    model = make_model(bias={EOS: 2.0})
    lc = LC("interruption", 24, 3, 8, answer_budget=4, phrase=PHRASE)

    def run(seed, gen=None):
        gen = gen or HFGenerator(model, TOK, Precision(), lc, seed=seed)
        return [(s.completion_ids, s.logprobs) for s in flat(gen.generate(VAR_LEN, 3, version=0))]

    assert run(0) == run(0)
    assert run(0) != run(1)
    gen = HFGenerator(model, TOK, Precision(), lc, seed=0)
    assert run(0, gen) != run(0, gen)  # the generator's stream moves on between calls


def test_greedy_temperature_zero():
    model = make_model()
    lc = LC("none", max_new_tokens=6)
    a = flat(
        HFGenerator(model, TOK, Precision(), lc, temperature=0.0, seed=0).generate(SAME_LEN, 2, version=0)
    )
    b = flat(
        HFGenerator(model, TOK, Precision(), lc, temperature=0.0, seed=9).generate(SAME_LEN, 2, version=0)
    )
    assert [s.completion_ids for s in a] == [s.completion_ids for s in b]
    assert a[0].completion_ids == a[1].completion_ids


# ---------------------------------------------------------------------------- factory
def _cfg(name: str):
    """The composed config of ``generator=name`` (every field of its option, and the placement's),
    with interruption at test size."""
    from scalerl.config import compose

    lc = [
        f"length_control.{k}={v}"
        for k, v in dict(think_budget_min=4, think_budget_max=8, answer_budget=4).items()
    ]
    cfg = compose(
        [f"generator={name}", "length_control=interruption", "length_control.max_new_tokens=32", *lc]
    )
    cfg.length_control.phrase = PHRASE  # (its space and markup would need quoting in an override)
    return cfg


def _made(cfg, model, *args):
    """:func:`make_generator` over ``model`` from the typed options of the composed ``cfg``: its
    generator option, its length control and its placement (what the run's setup hands it)."""
    from scalerl.config import typed

    o = typed(cfg)
    return make_generator(
        o.generator, o.length_control, model, TOK, Precision(), *args, placement=o.placement
    )


def test_make_generator():
    model = make_model()
    gen = _made(_cfg("hf"), model, "cpu", 0)
    assert isinstance(gen, HFGenerator) and list(gen.lc.phrase_ids) == PHRASE_IDS
    assert len(flat(gen.generate(SAME_LEN[:1], 2, version=0))) == 2


def test_make_generator_vllm_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without vLLM: import fails
    cfg = _cfg("vllm")
    with pytest.raises(RuntimeError, match=r"launch/install_vllm_cpu.sh.*pip install -e \"\.\[vllm\]\""):
        _made(cfg, make_model(), "cpu", 0)


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.5])
@pytest.mark.parametrize("spread", [1.0, 4.0])
def test_tempered_logprob_from_the_top_k_untempered_is_within_its_bound(temperature, spread):
    """The stale-KV gap of a vLLM engine re-scores through its untempered top-K prompt log-probs:
    the tempered log-prob rebuilt from them is within the stated bound of the exact one (every
    token's), exact at T = 1, and the bound is small below T = 1 where the distribution is peaked
    (above 1 the tail the K tokens leave out weighs more)."""
    from scalerl.generator.staleness import tempered_logprob

    g = torch.Generator().manual_seed(int(temperature * 10 + spread))
    vocab, k = 2000, 64
    for _ in range(20):
        logits = torch.randn(vocab, generator=g, dtype=torch.float64) * spread
        raw = torch.log_softmax(logits, -1)
        exact = torch.log_softmax(logits / temperature, -1)
        top = torch.topk(raw, k).indices.tolist()
        for token in (top[0], top[k // 2], int(torch.argmin(raw))):  # likely, middling, outside the K
            known = {t: float(raw[t]) for t in top}
            known[token] = float(raw[token])  # vLLM adds the scored token to its top K
            value, bound = tempered_logprob(float(raw[token]), known, temperature, vocab, k)
            assert abs(value - float(exact[token])) <= bound + 1e-9, (value, float(exact[token]), bound)
            if temperature == 1.0:
                assert bound == 0.0
            elif temperature < 1.0 and spread == 4.0:  # peaked: the 64 known tokens hold the mass
                assert bound < 0.01, bound


# ---------------------------------------------------------------------------- static cache
def _static_vs_dynamic(model, prec, lc, calls, **kw):
    """Samples from the default cache and from ``static_cache=true``, same seed, over ``calls``
    (a list of prompt lists, generated one after another by the same generator)."""
    out = []
    for static in (False, True):
        gen = HFGenerator(model, TOK, prec, lc, seed=3, static_cache=static, **kw)
        out.append([flat(gen.generate(prompts, 3, version=0)) for prompts in calls])
    return out


@pytest.mark.parametrize("arch", ["qwen2", "qwen2-gqa", "gpt2"])
@pytest.mark.parametrize("mode", ["none", "interruption"])
def test_static_cache_samples_what_the_default_cache_samples(arch, mode, monkeypatch):
    """generator.static_cache (one shape a step, a CUDA graph on a GPU; eager here) decodes the same
    tokens with the same log-probs, over prompts of equal and unequal lengths, calls that reuse its
    buffers, and a later call with longer prompts that needs a larger one. With grouped KV heads
    (2 KV heads for 4) its attention takes them as they are (``enable_gqa``), not repeated."""
    gqa = arch == "qwen2-gqa"
    model = make_model(
        bias={EOS: 1.5, THINK_END: -30.0},
        arch="qwen2" if gqa else arch,
        **({"num_kv_heads": 2} if gqa else {}),
    )
    sdpa, grouped = torch.nn.functional.scaled_dot_product_attention, []

    def spy(*args, **kw):
        grouped.append(
            bool(kw.get("enable_gqa")) and kw.get("attn_mask") is not None
        )  # transformers' own: not both
        return sdpa(*args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    prec = Precision()
    lc = (
        LC(max_new_tokens=16)
        if mode == "none"
        else LC("interruption", 40, 3, 6, answer_budget=5, phrase=PHRASE)
    )
    longer = [Prompt(0, "1234567+89012345="), Prompt(1, "9+9="), Prompt(2, "77+1=")]
    dyn, sta = _static_vs_dynamic(model, prec, lc, [SAME_LEN, VAR_LEN, VAR_LEN, longer])
    for a, b in zip(dyn, sta):
        assert [s.completion_ids for s in a] == [s.completion_ids for s in b]
        assert [s.loss_mask for s in a] == [s.loss_mask for s in b]
        assert [(s.truncated, s.interrupted) for s in a] == [(s.truncated, s.interrupted) for s in b]
        err = max(abs(x - y) for s, t in zip(a, b) for x, y in zip(s.logprobs, t.logprobs))
        assert err < 1e-5
    assert max_logprob_error(model, prec, [sta[3]]) < 1e-4  # teacher-forced: right, not just equal
    if mode == "interruption":
        assert any(s.interrupted for call in sta for s in call)
    assert any(grouped) == gqa
    assert len({s.num_tokens for call in sta for s in call}) > 2  # rows of many lengths in one batch


def test_static_cache_with_emulated_bf16_and_inflight_updates():
    """The emulated bf16 body (rounded weights cached per version) and an in-flight weight update:
    the static cache keeps the stale KV cache exactly as the default one does."""
    model = make_model(seed=0, bias={EOS: -30.0})
    new = make_model(seed=1, bias={EOS: -30.0})
    prec = Precision(body="bf16", head="fp32")
    runs = []
    for static in (False, True):
        m = copy.deepcopy(model)
        calls = []

        def weight_update(m=m, calls=calls):
            calls.append(1)
            if len(calls) == 4:  # in place, as the trainer's weights arrive (the body is parametrized)
                src = dict(new.named_parameters())
                with torch.no_grad():
                    for name, p in m.named_parameters():
                        p.copy_(src[name.replace("parametrizations.weight.original", "weight")])
                return 4
            return None

        gen = HFGenerator(m, TOK, prec, LC("none", max_new_tokens=10), seed=0, static_cache=static)
        runs.append(flat(gen.generate(VAR_LEN, 2, version=3, weight_update=weight_update)))
    for a, b in zip(*runs):
        assert a.versions == b.versions == [3, 3, 3] + [4] * 7
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_static_cache_casts_native_bf16_weights_once_per_batch_and_update(arch):
    """A native bf16 body with fp32 master weights (autocast): the static decoder reads its matrix
    weights from a copy cast once per batch and at each in-flight update, and samples the same
    tokens with the same log-probs, bit for bit, as casting at every step, across an in-flight
    update and a change of the weights between batches (the trainer's step). The master weights
    stay fp32 and the copy shares the norms and embeddings."""
    model = make_model(seed=0, bias={EOS: -30.0}, arch=arch)
    news = [make_model(seed=s, bias={EOS: -30.0}, arch=arch) for s in (1, 2)]
    prec = Precision(body="bf16", head="fp32", impl="native")

    def load(m, src):  # in place, as the trainer's weights arrive
        with torch.no_grad():
            for (_, p), (_, q) in zip(m.named_parameters(), src.named_parameters(), strict=True):
                p.copy_(q)

    runs, gens = [], []
    for cast_once in (False, True):
        m = copy.deepcopy(model)
        calls = []

        def weight_update(m=m, calls=calls):
            calls.append(1)
            if len(calls) == 4:
                load(m, news[0])
                return 4
            return None

        gen = HFGenerator(m, TOK, prec, LC("none", max_new_tokens=10), seed=0, static_cache=True)
        gen.cast_once = cast_once
        first = flat(gen.generate(VAR_LEN, 2, version=3, weight_update=weight_update))
        load(m, news[1])
        second = flat(gen.generate(VAR_LEN, 2, version=5))
        runs.append((first, second))
        gens.append(gen)
    (a1, a2), (b1, b2) = runs
    for a, b in zip(a1 + a2, b1 + b2, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == b.logprobs
        assert a.versions == b.versions
    assert a1[0].versions == [3, 3, 3] + [4] * 7
    assert [s.completion_ids for s in a1] != [s.completion_ids for s in a2]  # the weights changed
    low = gens[1]._low
    assert gens[0]._low is None and low is not None
    assert low.refreshes == 3  # batch 1, its in-flight update, batch 2: not one per step
    m = gens[1].model
    assert all(p.dtype == torch.float32 and p.requires_grad for p in m.parameters())
    assert low.pairs and all(c.dtype == torch.bfloat16 for c, _ in low.pairs)
    shared = {id(p) for p in low.body.parameters()} & {id(p) for p in m.parameters()}
    body = m.get_decoder()
    assert {id(p) for p in body.parameters()} - {id(master) for _, master in low.pairs} == shared
    assert all(torch.equal(c, master.to(torch.bfloat16)) for c, master in low.pairs)


def test_static_cache_from_the_config_and_its_limits():
    cfg = _cfg("hf")
    cfg.generator.static_cache = True
    gen = _made(cfg, make_model())
    assert gen.static_cache
    model = make_model()
    model.config._attn_implementation = "eager"
    with pytest.raises(
        ValueError,
        match="static_cache=true is not possible with this model: attention implementation 'eager'",
    ):
        HFGenerator(model, TOK, Precision(), LC(), static_cache=True)


def _spanning_sample(g: torch.Generator, p_len: int, c_len: int, switch: int) -> Sample:
    """A sample of random tokens (drawn from ``g``) whose first ``switch`` completion tokens came
    from version 1 and the rest from version 2 (an update inside it)."""
    ids = torch.randint(3, 40, (p_len + c_len,), generator=g).tolist()
    return Sample(
        prompt_uid=0,
        group_id=0,
        prompt_ids=ids[:p_len],
        completion_ids=ids[p_len:],
        logprobs=(-torch.rand(c_len, generator=g)).tolist(),
        versions=[1 if i < switch else 2 for i in range(c_len)],
        loss_mask=[1] * c_len,
        text="",
        truncated=False,
        interrupted=False,
        think_tokens=c_len,
    )


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_stale_kv_gap_of_sequences_measured_together_is_each_ones_alone(arch):
    """measure_stale_kv runs the chosen sequences of different lengths in one right-padded forward;
    each gap is the one a forward of that sequence alone gives (the padding after a sequence never
    reaches it), and samples without tokens after the update are skipped."""
    from scalerl.generator.staleness import measure_stale_kv

    model = make_model(seed=2, arch=arch)
    prec = Precision(body="bf16", head="fp32", impl="emulated")
    prec.prepare(model)
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 9, 3), (7, 4, 10), (3, 12, 6), (6, 6, 2)]  # the second has no version-2 token
    together = [_spanning_sample(g, *s) for s in shapes]
    alone = copy.deepcopy(together)
    assert measure_stale_kv(model, prec, 0.7, [together], 2, limit=10) == 3
    for s in alone:
        measure_stale_kv(model, prec, 0.7, [[s]], 2, limit=1)
    assert together[1].stale_kv_gap is None and alone[1].stale_kv_gap is None
    for a, b in zip(together, alone):
        if b.stale_kv_gap is not None:
            assert a.stale_kv_gap == pytest.approx(b.stale_kv_gap, abs=1e-6)
    assert measure_stale_kv(model, prec, 0.7, [together], 2, limit=2) == 2


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
@pytest.mark.parametrize("body", ["fp32", "bf16"])
def test_stale_kv_gap_through_the_lean_forward_is_the_transformers_ones(arch, body):
    """An engine on the lean decode measures the stale-KV gap through the lean forward (one right-
    padded forward over the weights, no cache): the gaps equal those of the transformers forward."""
    from scalerl.generator.lean import LeanModel
    from scalerl.generator.staleness import measure_stale_kv

    model = make_model(seed=3, arch=arch)
    prec = Precision(body=body, head="fp32", impl="emulated")
    prec.prepare(model)
    g = torch.Generator().manual_seed(1)
    samples = [_spanning_sample(g, *s) for s in [(5, 9, 3), (3, 14, 6), (8, 5, 1), (4, 11, 9)]]
    by_lean = copy.deepcopy(samples)
    lean = LeanModel(model, prec)
    assert measure_stale_kv(model, prec, 0.7, [samples], 2, limit=10) == 4
    assert measure_stale_kv(model, prec, 0.7, [by_lean], 2, limit=10, lean=lean) == 4
    for a, b in zip(samples, by_lean):
        assert b.stale_kv_gap == pytest.approx(a.stale_kv_gap, abs=1e-5)
    # new weights in place: the lean forward takes them before measuring
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    again, again_lean = copy.deepcopy(samples), copy.deepcopy(samples)
    measure_stale_kv(model, prec, 0.7, [again], 2, limit=10)
    measure_stale_kv(model, prec, 0.7, [again_lean], 2, limit=10, lean=lean)
    assert any(abs(a.stale_kv_gap - b.stale_kv_gap) > 1e-4 for a, b in zip(samples, again))
    for a, b in zip(again, again_lean):
        assert b.stale_kv_gap == pytest.approx(a.stale_kv_gap, abs=1e-5)
