"""The lean decode path (scalerl.generator.lean): the embedded model's forward written over its
weights, against the transformers forward it stands in for.

Each check runs the same generator twice over the same model and seed: ``lean=True`` (the
default where it applies) and ``lean=False`` (today's path: the batch decode over transformers'
modules, or the slot cache through them for sessions). Tolerance: 1e-5 on every per-token log-prob
(fp32 arithmetic in both; the emulated bf16 body rounds at the same places in both, so a rounding
difference would show as ~1e-2, far above it), and the sampled tokens identical.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_generator import LC, PHRASE, SAME_LEN, VAR_LEN, Prompt, _update_at, flat, full_logprobs, make_model

import scalerl.model.precision as precision_module
from scalerl.generator import HFGenerator
from scalerl.generator.lean import LeanModel, unsupported
from scalerl.model.precision import Precision
from scalerl.model.tokenizer import build_char_tokenizer
from scalerl.model.weights import PolicyWeights

TOK = build_char_tokenizer()
TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _gen(model, prec, lean: bool, lc=None, **kw) -> HFGenerator:
    return HFGenerator(model, TOK, prec, lc or LC(max_new_tokens=24), seed=3, lean=lean, **kw)


def _diffs(a, b) -> torch.Tensor:
    """Tokens, masks, versions equal; every token's log-prob difference."""
    out = []
    for x, y in zip(flat(a), flat(b), strict=True):
        assert x.completion_ids == y.completion_ids
        assert x.loss_mask == y.loss_mask and x.versions == y.versions
        assert (x.truncated, x.interrupted) == (y.truncated, y.interrupted)
        out.append((torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs())
    return torch.cat(out)


def _close(a, b, body: str) -> None:
    """The stated tolerance. fp32: every log-prob within 1e-5. Emulated bf16: the lean decode's
    attention sums in another order than torch's fused kernel (1e-7 apart in fp32), which now and
    then moves a value across a bf16 rounding boundary downstream (and a key written from it keeps
    the difference for the rest of its row): at most a quarter of the tokens off by more than 1e-5,
    none by more than 5e-3 (one bf16 step of a logit); activations not rounded move almost every
    token (test_lean_decode_bf16_check_sees_a_missing_rounding: 98% of them)."""
    d = _diffs(a, b)
    if body == "fp32":
        assert d.max() <= TOL, d.max()
    else:
        assert d.max() <= 5e-3 and (d > TOL).float().mean() <= 0.25, (d.max(), (d > TOL).float().mean())


INTERRUPT = LC(
    name="interruption",
    max_new_tokens=30,
    think_budget_min=3,
    think_budget_max=10,
    answer_budget=4,
    phrase=PHRASE,
)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "llama"])
@pytest.mark.parametrize("body,head", [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16")])
@pytest.mark.parametrize("lc", [None, INTERRUPT], ids=["none", "interruption"])
@pytest.mark.parametrize("loops", [True, False], ids=["loops", "torch-ops"])
def test_lean_decode_matches_transformers_logprobs_and_samples(arch, body, head, lc, loops, monkeypatch):
    """Batch generation (sync mode, evaluation): the lean path samples the same tokens as today's
    transformers path with the same seed and records the same log-probs (within 1e-5), for the fp32
    and the emulated-bf16 body, with and without an fp32 head, with interruption length control;
    in fp32 the log-probs are those of one full forward of prompt + completion. Both ways of
    running the lean forward: its compiled loops (scalerl.generator.kernels, the default on one
    thread) and torch's ops."""
    monkeypatch.setattr(LeanModel, "use_kernel", None if loops else False)
    model = make_model(arch=arch, num_kv_heads=2 if arch != "gpt2" else 4)
    prec = Precision(body=body, head=head, impl="emulated")
    lean, ref = _gen(model, prec, True, lc), _gen(model, prec, False, lc)
    for prompts in (SAME_LEN, VAR_LEN):
        a = lean.generate(prompts, 3, version=5)
        assert lean._lean is not None and ref._lean is None  # each ran the path it names
        assert (lean._lean.fused_attention() is not None) == loops
        assert (lean._lean._round is not None) == (loops and body == "bf16")
        b = ref.generate(prompts, 3, version=5)
        _close(a, b, body)
        assert {v for s in flat(a) for v in s.versions} <= {5, -1}
        if lc is not None:
            assert any(s.interrupted for s in flat(a))
        # fp32: also one full forward's (under bf16 a full forward and a cached decode round
        # differently in their own right, lean or not: test_generator's bf16 check covers that)
        for s in flat(a)[:3] if body == "fp32" else []:
            want = full_logprobs(model, prec, s.prompt_ids, s.completion_ids)
            mask = torch.tensor(s.loss_mask, dtype=torch.bool)
            assert (torch.tensor(s.logprobs)[mask] - want[mask]).abs().max() <= 1e-4


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_lean_decode_session_matches_the_slot_cache_through_transformers(arch):
    """Continuous sessions (the default pipeline_rl engine): work joining as other work runs, on
    the lean path and on the slot cache through transformers' modules: the same tokens and
    log-probs (within 1e-5) under the emulated bf16 body."""
    model = make_model(arch=arch)
    prec = Precision(body="bf16", head="fp32", impl="emulated")
    got = []
    for lean in (True, False):  # lean: its compiled loops (one thread)
        gen = _gen(model, prec, lean)
        sess = gen.session(rows=4)
        assert (sess.lean is not None) == lean
        sess.add(SAME_LEN[:2], 2, tag="a")
        out = sess.step() + sess.step() + sess.step()
        sess.add(VAR_LEN, 2, tag="b")
        out += sess.drain()
        got.append(dict(out))
    for tag in ("a", "b"):
        _close(got[0][tag], got[1][tag], "bf16")


@pytest.mark.parametrize("loops", [True, False], ids=["loops", "torch-ops"])
def test_a_batch_reuses_the_last_batchs_cache_and_samples_what_fresh_buffers_give(loops, monkeypatch):
    """A batch (an evaluation) gives its KV buffers back when it ends and the next batch of the
    generator takes them instead of allocating new ones (an evaluation's cache is a few hundred MB);
    their stale contents change nothing: the same tokens and log-probs, bit for bit, as a fresh
    generator's, with the loops (which read only written positions) and with torch's masked ops."""
    monkeypatch.setattr(LeanModel, "use_kernel", None if loops else False)
    model = make_model(arch="gpt2")
    prec = Precision(body="bf16", head="fp32", impl="emulated")
    gen = _gen(model, prec, True)
    gen.generate(VAR_LEN, 3, version=0)
    kv = gen._lean._spare
    assert kv is not None
    gen.manual_seed(7)
    again = gen.generate(SAME_LEN, 2, version=0)
    assert gen._lean._spare is kv  # taken, used and given back: no new buffers
    fresh = _gen(model, prec, True)
    fresh.manual_seed(7)
    want = fresh.generate(SAME_LEN, 2, version=0)
    assert fresh._lean._spare is not kv
    assert [s.completion_ids for s in flat(again)] == [s.completion_ids for s in flat(want)]
    assert [s.logprobs for s in flat(again)] == [s.logprobs for s in flat(want)]


@pytest.mark.parametrize("stale_kv", ["keep", "recompute"])
@pytest.mark.parametrize("body", ["bf16", "fp32"])
def test_lean_decode_inflight_update_uses_the_new_weights_rounding(stale_kv, body):
    """pipeline_rl: new weights copied into the model in place mid-generation. The lean path takes
    their (rounded) copy at that step: its tokens and log-probs are those of today's path under the
    same update (within 1e-5), the tokens after the update differ from a run without it, and with
    ``stale_kv=recompute`` (fp32) the log-probs after it are a fresh forward's of the new weights.
    Same-length prompts: today's batch path left-pads others, which moves bf16 rounding ties."""
    model = make_model(arch="gpt2")
    new = make_model(seed=1, arch="gpt2")
    prec = Precision(body=body, head="fp32", impl="emulated")
    new_ref = Precision(body=body, head="fp32", impl="emulated").prepare(copy.deepcopy(new))
    runs = []
    for lean in (True, False, None):  # None: lean, no update
        m = copy.deepcopy(model)
        gen = _gen(m, prec, lean is not False, stale_kv=stale_kv)
        upd = _update_at(m, new, 5, 1, []) if lean is not None else (lambda: None)
        runs.append(gen.generate(SAME_LEN, 2, version=0, weight_update=upd))
        if lean:
            assert gen._lean.refreshes >= 2  # the first copy, then the update's
    _close(runs[0], runs[1], body)
    after = [(s.completion_ids, s.versions) for s in flat(runs[0]) if 1 in s.versions]
    assert after
    assert [s.completion_ids for s in flat(runs[0])] != [s.completion_ids for s in flat(runs[2])]
    if stale_kv == "recompute" and body == "fp32":  # (bf16: a full forward rounds otherwise, see above)
        for s in flat(runs[0]):
            v1 = torch.tensor([v == 1 for v in s.versions])
            if v1.any():
                want = full_logprobs(new_ref, prec, s.prompt_ids, s.completion_ids)
                assert (torch.tensor(s.logprobs)[v1] - want[v1]).abs().max() <= 1e-4


def test_lean_decode_follows_weights_changed_in_place_without_a_new_version():
    """Sync mode samples from the trainer's own module: the optimizer changes its weights in place
    and load_weights only records the version. The lean copy follows the weights (their in-place
    version counters), so a generation after a change samples from the changed weights."""
    model = make_model(arch="gpt2")
    prec = Precision(body="bf16", head="fp32", impl="emulated")
    gen = _gen(model, prec, True)
    gen.generate(SAME_LEN, 2, version=0)
    n0 = gen._lean.refreshes
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    gen.load_weights(PolicyWeights(model), 1)
    ref = _gen(model, prec, False)
    gen.rng.manual_seed(11)
    ref.rng.manual_seed(11)
    _close(gen.generate(SAME_LEN, 2, version=1), ref.generate(SAME_LEN, 2, version=1), "bf16")
    assert gen._lean.refreshes == n0 + 1  # once for the changed weights, not per step


def test_lean_weights_follow_a_parameter_replaced_by_a_new_tensor():
    """The weight check reads each parameter where it lives, so a parameter replaced by a new tensor
    (not changed in place) is taken at the next sync, an unchanged body is not copied again, and the
    copy holds the new values (a plain weight and a rounded one)."""
    model = make_model(arch="gpt2")
    prec = Precision(body="bf16", head="fp32", impl="emulated")
    prec.prepare(model)
    lean = LeanModel(model, prec)
    n0 = lean.refreshes
    lean.sync()
    assert lean.refreshes == n0  # nothing changed
    blk = model.transformer.h[0]
    blk.ln_1.weight = torch.nn.Parameter(torch.full_like(blk.ln_1.weight, 0.5))
    lean.sync()
    assert lean.refreshes == n0 + 1
    assert torch.equal(lean.blocks[0][0][0], torch.full_like(blk.ln_1.weight, 0.5))
    orig = blk.attn.c_attn.parametrizations.weight
    orig.original = torch.nn.Parameter(torch.full_like(orig.original, 1.0 + 2.0**-12))  # rounds to 1
    lean.sync()
    assert lean.refreshes == n0 + 2
    assert torch.equal(lean.blocks[0][1][0], torch.ones_like(orig.original))


def test_lean_decode_bf16_check_sees_a_missing_rounding(monkeypatch):
    """The bf16 tolerance above is tight enough to see the emulation done wrong: a lean forward
    that skips the activations' rounding (weights still rounded, its GEMMs in fp32) fails it."""
    model = make_model(arch="gpt2")
    prec = Precision(body="bf16", head="fp32", impl="emulated")
    lean, ref = _gen(model, prec, True), _gen(model, prec, False)
    monkeypatch.setattr(precision_module, "LOW_PRECISION_KERNELS", False)  # weights held in fp32
    lean._lean = LeanModel(lean.model, prec)
    lean._lean.dtype = None  # no activation rounding
    with pytest.raises(AssertionError):
        _close(lean.generate(SAME_LEN, 3, version=0), ref.generate(SAME_LEN, 3, version=0), "bf16")


def test_lean_decode_applies_where_it_can_and_says_why_not():
    """Chosen by itself for the embedded model on a CPU (fp32 or emulated body); a native bf16 body
    keeps the transformers path, with the reason."""
    model = make_model(arch="gpt2")
    assert unsupported(model, Precision(body="bf16", impl="emulated"), "cpu") is None
    why = unsupported(model, Precision(body="bf16", impl="native"), "cpu")
    assert why and "native" in why
    assert "GPU" in unsupported(model, Precision(), "cuda")
    gen = HFGenerator(model, TOK, Precision(body="bf16", impl="emulated"), LC(max_new_tokens=4))
    gen.generate([Prompt(0, "1+2=")], 2, version=0)
    assert isinstance(gen._lean, LeanModel)
    native = HFGenerator(
        make_model(arch="gpt2"), TOK, Precision(body="bf16", impl="native"), LC(max_new_tokens=4)
    )
    native.generate([Prompt(0, "1+2=")], 2, version=0)
    assert native._lean is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2])
def test_prompts_stored_into_consecutive_or_scattered_slots_alike(dtype, n):
    """A prefill's keys or values into its slots (lean.store_prompts): consecutive slots (one
    strided copy broadcast over each prompt's n) and scattered ones (an indexed write) both leave
    the buffer exactly as the indexed write of each prompt repeated n times does: the prompt at
    positions 0..L-1 of its slots, every other slot and position untouched."""
    from scalerl.generator.lean import first_of_run, store_prompts

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 5, 4, generator=g).to(torch.bfloat16).float()  # 3 prompts of bf16 values
    runs = 0
    for dst in (
        torch.arange(4, 4 + 3 * n),
        torch.tensor([7, 1, 2, 9, 5, 3])[: 3 * n],
        torch.arange(3 * n).flip(0),
    ):
        buf = torch.randn(12, 2, 8, 4, generator=g).to(dtype)
        want = buf.clone()
        want[dst, :, :5] = x.repeat_interleave(n, 0).to(dtype)
        first = first_of_run(dst)
        assert (first is not None) == bool((dst[1:] - dst[:-1] == 1).all())
        runs += first is not None
        store_prompts(buf, dst, first, x, n)
        assert torch.equal(buf, want)
    assert runs == 1 and first_of_run(torch.tensor([6])) == 6
    assert first_of_run(torch.tensor([], dtype=torch.long)) is None
