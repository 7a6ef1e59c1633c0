"""Tests of scalerl.algo: advantages, losses, aggregation, filters, length penalty, registry.

Reference values are computed independently of the code under test: a plain-Python (no torch)
transcription of the paper's formulas (``_ref_*`` below) produced the literal table ``EXPECTED``,
and the test checks both the library and the reference against that table. A new loss: its
parameters in ``PARAMS``, its branch in ``_ref_token_losses``, then its ``EXPECTED`` rows from
``_ref_aggregate(_ref_token_losses(name, _ref_adv(norm)), agg)`` for every aggregation and norm.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import scalerl.algo as algo
from scalerl.algo import (
    LOSSES,
    PassRateTracker,
    aggregate,
    compute_advantages,
    length_penalty,
    policy_loss,
    register_loss,
    zero_variance_mask,
)
from scalerl.algo.aggregation import aggregation_totals, aggregation_weight
from scalerl.algo.losses import loss_stats
from scalerl.algo.registry import check_loss_params

FAST = settings(max_examples=40, deadline=None)

# --------------------------------------------------------------------------------- the fixed batch
# 5 sequences, T=4, two prompts with non-contiguous, unsorted ids: prompt 7 = {0, 2}, prompt 3 = {1, 3, 4}.
GROUPS = [7, 3, 7, 3, 3]
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0]
LENGTHS = [4, 2, 3, 1, 2]
# log-ratios logp - gen_logp on the generated tokens (rho: 1.65 and 1.57 exceed eps_max=1.5 for
# CISPO; 0.74 and 1.65 / 1.22 trigger the DAPO / GRPO clips).
DELTA = [
    [0.0, 0.5, -0.5, 0.1],
    [0.3, -0.3, 0.0, 0.0],
    [0.45, -0.05, 0.0, 0.0],
    [-0.4, 0.0, 0.0, 0.0],
    [0.2, 0.05, 0.0, 0.0],
]
GEN = [[-(0.5 + 0.1 * (i + t)) for t in range(4)] for i in range(5)]
# padding holds an arbitrary value (-3.0) that must not matter
LOGP = [[GEN[i][t] + DELTA[i][t] if t < LENGTHS[i] else -3.0 for t in range(4)] for i in range(5)]
PARAMS = {
    "cispo": {"eps_max": 1.5},
    "dapo": {"eps_low": 0.2, "eps_high": 0.28},
    "grpo": {"eps_low": 0.2, "eps_high": 0.2},
    "gspo": {"eps_low": 0.1, "eps_high": 0.1},
}

EXPECTED = {
    ("cispo", "token", "batch"): 0.026934867046292554,
    ("cispo", "token", "prompt"): 0.027256732437053104,
    ("cispo", "token", "none"): 0.013010803800745313,
    ("cispo", "sample", "batch"): 0.048370264117776895,
    ("cispo", "sample", "prompt"): 0.051465255169099035,
    ("cispo", "sample", "none"): 0.0233651057250439,
    ("cispo", "prompt", "batch"): 0.030313415994905085,
    ("cispo", "prompt", "prompt"): 0.030767756419894265,
    ("cispo", "prompt", "none"): 0.01464280136828714,
    ("dapo", "token", "batch"): 0.03729128201296472,
    ("dapo", "token", "prompt"): 0.04059895668463639,
    ("dapo", "token", "none"): 0.01801343785789099,
    ("dapo", "sample", "batch"): 0.08364744130261541,
    ("dapo", "sample", "prompt"): 0.08358692424697925,
    ("dapo", "sample", "none"): 0.04040563650647353,
    ("dapo", "prompt", "batch"): 0.0587132808911721,
    ("dapo", "prompt", "prompt"): 0.062209005835259394,
    ("dapo", "prompt", "none"): 0.028361267826574867,
    ("grpo", "token", "batch"): 0.04542269629620038,
    ("grpo", "token", "prompt"): 0.048526776961919926,
    ("grpo", "token", "none"): 0.02194129225122904,
    ("grpo", "sample", "batch"): 0.08926475365785487,
    ("grpo", "sample", "prompt"): 0.08910031657970355,
    ("grpo", "sample", "none"): 0.0431190617784792,
    ("grpo", "prompt", "batch"): 0.06610504386840158,
    ("grpo", "prompt", "prompt"): 0.0694366804537048,
    ("grpo", "prompt", "none"): 0.03193183595572339,
    ("gspo", "token", "batch"): 0.006879242643230328,
    ("gspo", "token", "prompt"): 0.010452996793768451,
    ("gspo", "token", "none"): 0.003322996774959406,
    ("gspo", "sample", "batch"): 0.05598538471469914,
    ("gspo", "sample", "prompt"): 0.05594467301439869,
    ("gspo", "sample", "none"): 0.02704356605808672,
    ("gspo", "prompt", "batch"): 0.028169396993771578,
    ("gspo", "prompt", "prompt"): 0.031782644723297816,
    ("gspo", "prompt", "none"): 0.01360713965438768,
}


def _ref_adv(norm: str, eps: float = 1e-6) -> list[float]:
    members: dict[int, list[int]] = {}
    for i, g in enumerate(GROUPS):
        members.setdefault(g, []).append(i)
    adv, gstd = [0.0] * len(REWARDS), {}
    for g, idx in members.items():
        mu = sum(REWARDS[i] for i in idx) / len(idx)
        gstd[g] = math.sqrt(sum((REWARDS[i] - mu) ** 2 for i in idx) / len(idx))
        for i in idx:
            adv[i] = REWARDS[i] - mu
    if norm == "batch":
        m = sum(adv) / len(adv)
        s = math.sqrt(sum((a - m) ** 2 for a in adv) / len(adv))
        adv = [a / (s + eps) for a in adv]
    elif norm == "prompt":
        adv = [a / (gstd[GROUPS[i]] + eps) for i, a in enumerate(adv)]
    return adv


def _clip(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def _ref_token_losses(name: str, adv: list[float]) -> list[list[float]]:
    p = PARAMS[name]
    out = []
    for i, length in enumerate(LENGTHS):
        s = math.exp(sum(DELTA[i][:length]) / length)  # GSPO sequence ratio (geometric mean)
        row = []
        for t in range(length):
            rho, a = math.exp(LOGP[i][t] - GEN[i][t]), adv[i]
            if name == "cispo":
                row.append(-min(rho, p["eps_max"]) * a * LOGP[i][t])
            elif name in ("dapo", "grpo"):
                row.append(-min(rho * a, _clip(rho, 1 - p["eps_low"], 1 + p["eps_high"]) * a))
            elif name == "gspo":
                row.append(-min(s * a, _clip(s, 1 - p["eps_low"], 1 + p["eps_high"]) * a))
            else:
                raise NotImplementedError(f"no reference for loss {name!r}: add its branch here")
        out.append(row)
    return out


def _ref_aggregate(rows: list[list[float]], mode: str) -> float:
    if mode == "token":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "sample":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    per_group: dict[int, tuple[float, int]] = {}
    for i, r in enumerate(rows):
        num, den = per_group.get(GROUPS[i], (0.0, 0))
        per_group[GROUPS[i]] = (num + sum(r), den + len(r))
    return sum(n / d for n, d in per_group.values()) / len(per_group)


def _batch(dtype=torch.float64):
    logp = torch.tensor(LOGP, dtype=dtype, requires_grad=True)
    gen = torch.tensor(GEN, dtype=dtype)
    mask = torch.tensor([[t < n for t in range(4)] for n in LENGTHS])
    return logp, gen, mask, torch.tensor(GROUPS), torch.tensor(REWARDS, dtype=dtype)


# ------------------------------------------------------------------------------------ advantages


def test_advantages_hand_values():
    r, g = torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS)
    none = [0.5, -2 / 3, -0.5, 1 / 3, 1 / 3]  # r - mean: prompt 7 mean 1/2, prompt 3 mean 2/3
    assert compute_advantages(r, g, "none").tolist() == pytest.approx(none, abs=1e-12)
    # prompt std: prompt 7 -> 0.5, prompt 3 -> sqrt(2/9)
    s3 = math.sqrt(2 / 9)
    prompt = [0.5 / 0.5, (-2 / 3) / s3, -0.5 / 0.5, (1 / 3) / s3, (1 / 3) / s3]
    assert compute_advantages(r, g, "prompt").tolist() == pytest.approx(prompt, rel=1e-5)
    sb = math.sqrt(sum(a * a for a in none) / 5)
    assert compute_advantages(r, g, "batch").tolist() == pytest.approx([a / sb for a in none], rel=1e-5)
    for norm in ("batch", "prompt", "none"):
        assert compute_advantages(r, g, norm).tolist() == pytest.approx(_ref_adv(norm), rel=1e-12)


def test_advantages_zero_variance_gives_zero_not_nan():
    r, g = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])
    for norm in ("batch", "prompt", "none"):
        out = compute_advantages(r, g, norm)
        assert torch.isfinite(out).all() and out.abs().max() == 0


def test_advantages_int_rewards_and_empty():
    out = compute_advantages(torch.tensor([1, 0]), torch.tensor([5, 5]), "none")
    assert out.dtype.is_floating_point and out.tolist() == [0.5, -0.5]
    assert compute_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), "batch").numel() == 0


def test_advantages_unknown_norm():
    with pytest.raises(ValueError, match=r"'group'.*batch, prompt, none"):
        compute_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), "group")


_rewards_groups = st.integers(1, 24).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-5, 5, allow_nan=False), min_size=n, max_size=n),
        st.lists(st.integers(-3, 40), min_size=n, max_size=n),
    )
)


@FAST
@given(_rewards_groups)
def test_advantages_sum_to_zero_within_groups(data):
    r, g = torch.tensor(data[0], dtype=torch.float64), torch.tensor(data[1])
    for norm in ("none", "prompt"):
        adv = compute_advantages(r, g, norm)
        for gid in set(data[1]):
            assert abs(adv[g == gid].sum().item()) < 1e-6 * max(1.0, adv.abs().max().item())


@FAST
@given(_rewards_groups)
@example(([0.0, 0.0, 0.015625], [0, 0, 0]))  # small spread: max |adv| is sqrt(2), the std still 1
def test_batch_norm_has_unit_std(data):
    r, g = torch.tensor(data[0], dtype=torch.float64), torch.tensor(data[1])
    raw = compute_advantages(r, g, "none")
    adv = compute_advantages(r, g, "batch")
    s = raw.std(correction=0).item()
    assert torch.isfinite(adv).all()
    # std / (std + eps): 1 for any real spread, below 1 (0 for none) where eps dominates
    assert adv.std(correction=0).item() == pytest.approx(s / (s + 1e-6), rel=1e-9, abs=1e-12)
    if s > 1e-2:
        assert adv.std(correction=0).item() == pytest.approx(1.0, rel=1e-3)


@FAST
@given(_rewards_groups)
def test_prompt_norm_has_unit_std_per_group(data):
    r, g = torch.tensor(data[0], dtype=torch.float64), torch.tensor(data[1])
    adv = compute_advantages(r, g, "prompt")
    for gid in set(data[1]):
        sel = g == gid
        if r[sel].std(correction=0) > 1e-2:
            assert adv[sel].std(correction=0).item() == pytest.approx(1.0, rel=1e-3)


# ----------------------------------------------------------------------- loss x aggregation x norm


def test_reference_matches_table():
    """The plain-Python reference reproduces the literal table (guards the table itself)."""
    for (name, agg, norm), value in EXPECTED.items():
        assert _ref_aggregate(_ref_token_losses(name, _ref_adv(norm)), agg) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("norm", ["batch", "prompt", "none"])
@pytest.mark.parametrize("agg", ["token", "sample", "prompt"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_policy_loss_reference_values(name, agg, norm):
    logp, gen, mask, g, r = _batch()
    adv = compute_advantages(r, g, norm)
    loss = policy_loss(name, logp, gen, adv, mask, g, agg, **PARAMS[name])
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(EXPECTED[(name, agg, norm)], rel=1e-9, abs=1e-12)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[~mask] == 0).all()  # padding gets no gradient


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.float64, torch.long])
def test_mask_dtype_does_not_matter(mask_dtype):
    logp, gen, mask, g, r = _batch()
    adv = compute_advantages(r, g, "batch")
    loss = policy_loss("cispo", logp, gen, adv, mask.to(mask_dtype), g, "prompt", eps_max=1.5)
    assert loss.item() == pytest.approx(EXPECTED[("cispo", "prompt", "batch")], rel=1e-9)


def test_float32_close_to_reference():
    logp, gen, mask, g, r = _batch(torch.float32)
    adv = compute_advantages(r, g, "batch")
    loss = policy_loss("dapo", logp, gen, adv, mask, g, "token", **PARAMS["dapo"])
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(EXPECTED[("dapo", "token", "batch")], rel=1e-5)


# ------------------------------------------------------------------------------ gradient properties


def _one_token(log_ratio: float, adv: float, gen_logp: float = -1.0):
    logp = torch.tensor([[gen_logp + log_ratio]], dtype=torch.float64, requires_grad=True)
    gen = torch.tensor([[gen_logp]], dtype=torch.float64)
    return logp, gen, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1), torch.tensor([0])


@pytest.mark.parametrize("adv", [1.0, -0.7])
def test_cispo_clipped_token_keeps_gradient(adv):
    logp, gen, a, mask, g = _one_token(math.log(3.0), adv)  # rho = 3 > eps_max = 2
    loss = policy_loss("cispo", logp, gen, a, mask, g, "token", eps_max=2.0)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-2.0 * adv)  # -eps_max * A, not zero
    assert loss.item() == pytest.approx(-2.0 * adv * logp.item())
    # unclipped token: gradient -rho * A
    logp, gen, a, mask, g = _one_token(math.log(1.5), adv)
    policy_loss("cispo", logp, gen, a, mask, g, "token", eps_max=2.0).backward()
    assert logp.grad.item() == pytest.approx(-1.5 * adv)


@pytest.mark.parametrize("name", ["dapo", "grpo"])
def test_ppo_clipped_tokens_have_zero_gradient(name):
    # token 0: A>0, rho=1.5 > 1+eps_high (clipped); token 1: A<0, rho=0.5 < 1-eps_low (clipped);
    # token 2: A>0, rho=0.5 (unclipped, grad -rho*A); token 3: A<0, rho=1.5 (unclipped: PPO keeps it).
    log_ratio = torch.tensor([[math.log(1.5)], [math.log(0.5)], [math.log(0.5)], [math.log(1.5)]])
    gen = torch.full((4, 1), -1.0, dtype=torch.float64)
    logp = (gen + log_ratio.double()).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    mask, g = torch.ones(4, 1), torch.arange(4)
    loss = policy_loss(name, logp, gen, adv, mask, g, "token", eps_low=0.2, eps_high=0.28)
    loss.backward()
    grad = logp.grad[:, 0].tolist()
    assert grad[0] == 0.0 and grad[1] == 0.0
    assert grad[2] == pytest.approx(-0.5 * 1.0 / 4)  # d(-rho*A)/dlogp = -rho*A, /4 tokens
    assert grad[3] == pytest.approx(-1.5 * -1.0 / 4)
    # value: -(1.28*1) - (0.8*-1) - (0.5*1) - (1.5*-1), averaged over 4 tokens
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 0.5 + 1.5) / 4)
    stats = loss_stats(name, logp, gen, adv, mask, eps_low=0.2, eps_high=0.28)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    assert stats["is_ratio_mean"] == pytest.approx(1.0)
    assert stats["is_ratio_max"] == pytest.approx(1.5)


def test_gspo_value_is_sequence_level_on_every_token_and_gradient_per_token():
    # sequence 0: log-ratios (0.3, -0.1, 0.1) -> s = exp(0.1); unclipped with eps_high=0.2
    # sequence 1: log-ratios (0.4, 0.2) -> s = exp(0.3) > 1.2 with A > 0 -> clipped, zero grad
    delta = torch.tensor([[0.3, -0.1, 0.1], [0.4, 0.2, 0.0]], dtype=torch.float64)
    gen = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], dtype=torch.float64)
    logp = (gen + delta).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([0.8, 0.5], dtype=torch.float64)
    tok = LOSSES["gspo"].fn(logp, gen, adv, mask, torch.tensor([0, 1]), eps_low=0.2, eps_high=0.2)
    s0 = math.exp(0.1)  # sequence 1: exp(0.3) = 1.35 is clipped to 1.2
    assert tok[0].tolist() == pytest.approx([-s0 * 0.8] * 3)
    assert tok[1, :2].tolist() == pytest.approx([-1.2 * 0.5] * 2)
    loss = policy_loss(
        "gspo", logp, gen, adv, mask, torch.tensor([0, 1]), "sample", eps_low=0.2, eps_high=0.2
    )
    assert loss.item() == pytest.approx((-s0 * 0.8 - 1.2 * 0.5) / 2)
    loss.backward()
    # sample aggregation: d/dlogp_t = -s_i * A_i / |y_i| / N on each token of an unclipped sequence
    assert logp.grad[0].tolist() == pytest.approx([-s0 * 0.8 / 3 / 2] * 3)
    assert logp.grad[1].tolist() == [0.0, 0.0, 0.0]
    stats = loss_stats("gspo", logp, gen, adv, mask, eps_low=0.2, eps_high=0.2)
    assert stats["clip_fraction"] == pytest.approx(2 / 5)  # 2 of the 5 masked tokens


def test_cispo_loss_stats():
    logp, gen, mask, g, r = _batch()
    adv = compute_advantages(r, g, "batch")
    stats = loss_stats("cispo", logp, gen, adv, mask, eps_max=1.5)
    rhos = [math.exp(DELTA[i][t]) for i in range(5) for t in range(LENGTHS[i])]
    assert stats["is_ratio_mean"] == pytest.approx(sum(rhos) / len(rhos))
    assert stats["is_ratio_max"] == pytest.approx(math.exp(0.5))
    assert stats["clip_fraction"] == pytest.approx(2 / 12)  # exp(0.5), exp(0.45) > 1.5
    assert all(isinstance(v, float) for v in stats.values())


# --------------------------------------------------------------------------------------- aggregation


def test_prompt_aggregation_weighs_prompts_equally():
    # prompt 0: one 1-token sequence with loss 1; prompt 1: two 50-token sequences with loss 3
    loss = torch.zeros(3, 50)
    mask = torch.zeros(3, 50)
    loss[0, 0], mask[0, 0] = 1.0, 1.0
    loss[1:, :] = 3.0
    mask[1:, :] = 1.0
    g = torch.tensor([0, 1, 1])
    assert aggregate(loss, mask, g, "prompt").item() == pytest.approx((1.0 + 3.0) / 2)
    assert aggregate(loss, mask, g, "sample").item() == pytest.approx((1.0 + 3.0 + 3.0) / 3)
    assert aggregate(loss, mask, g, "token").item() == pytest.approx((1.0 + 300.0) / 101)
    # lengthening prompt 1's sequences does not change its weight under prompt aggregation
    mask[1:, 25:] = 0.0
    assert aggregate(loss, mask, g, "prompt").item() == pytest.approx(2.0)


def test_empty_sequences_and_groups_are_left_out():
    loss = torch.tensor([[2.0, 4.0], [7.0, 7.0], [5.0, 0.0]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])
    assert aggregate(loss, mask, torch.tensor([0, 1, 0]), "sample").item() == pytest.approx((3.0 + 5.0) / 2)
    # group 1 is all empty -> excluded from the prompt mean
    assert aggregate(loss, mask, torch.tensor([0, 1, 0]), "prompt").item() == pytest.approx(11.0 / 3)
    assert aggregate(loss, mask, torch.tensor([0, 1, 0]), "token").item() == pytest.approx(11.0 / 3)


@pytest.mark.parametrize("agg", ["token", "sample", "prompt"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_empty_batch_is_zero_and_backward_works(name, agg):
    logp = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    gen = torch.randn(3, 4, dtype=torch.float64)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    loss = policy_loss(
        name,
        logp,
        gen,
        torch.ones(3, dtype=torch.float64),
        mask,
        torch.tensor([0, 0, 1]),
        agg,
        **PARAMS[name],
    )
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert (logp.grad == 0).all()
    assert loss_stats(name, logp, gen, torch.ones(3), mask, **PARAMS[name]) == {
        "is_ratio_mean": 1.0,
        "is_ratio_max": 1.0,
        "clip_fraction": 0.0,
    }


def test_zero_rows_batch():
    logp = torch.zeros(0, 4, requires_grad=True)
    loss = policy_loss(
        "cispo",
        logp,
        torch.zeros(0, 4),
        torch.zeros(0),
        torch.zeros(0, 4),
        torch.zeros(0, dtype=torch.long),
        "prompt",
        eps_max=5.0,
    )
    assert loss.item() == 0.0
    loss.backward()


@pytest.mark.parametrize("name", list(PARAMS))
def test_infinite_padding_does_not_leak(name):
    logp, gen, mask, g, r = _batch()
    with torch.no_grad():
        logp[~mask] = -math.inf
    gen = gen.clone()
    gen[~mask] = math.nan
    adv = compute_advantages(r, g, "batch")
    loss = policy_loss(name, logp, gen, adv, mask, g, "prompt", **PARAMS[name])
    assert loss.item() == pytest.approx(EXPECTED[(name, "prompt", "batch")], rel=1e-9)
    loss.backward()
    assert torch.isfinite(logp.grad).all()


_agg_case = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.floats(-3, 3, allow_nan=False), min_size=5, max_size=5), min_size=n, max_size=n),
        st.lists(st.integers(0, 5), min_size=n, max_size=n),  # lengths (0 = empty sequence)
        st.lists(st.integers(0, 3), min_size=n, max_size=n),  # group ids
        st.permutations(list(range(n))),
    )
)


@FAST
@given(_agg_case)
def test_aggregation_invariant_to_permuting_sequences(case):
    values, lengths, groups, perm = case
    loss = torch.tensor(values, dtype=torch.float64)
    mask = torch.tensor([[t < n for t in range(5)] for n in lengths])
    g = torch.tensor(groups)
    p = torch.tensor(perm)
    for mode in ("token", "sample", "prompt"):
        a = aggregate(loss, mask, g, mode).item()
        b = aggregate(loss[p], mask[p], g[p], mode).item()
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)


@FAST
@given(_agg_case, st.integers(1, 4))
def test_micro_batch_weights_sum_to_batch_loss(case, num_micro):
    values, lengths, groups, _ = case
    loss = torch.tensor(values, dtype=torch.float64)
    mask = torch.tensor([[t < n for t in range(5)] for n in lengths])
    g = torch.tensor(groups)
    total = aggregation_totals(mask, g)
    # split on group boundaries: assign whole groups to micro-batches
    uniq = sorted(set(groups))
    for mode in ("token", "sample", "prompt"):
        whole = aggregate(loss, mask, g, mode).item()
        acc = 0.0
        for k in range(num_micro):
            sel = torch.tensor([uniq.index(x) % num_micro == k for x in groups])
            if not sel.any():
                continue
            w = aggregation_weight(mode, mask[sel], g[sel], total)
            acc += w * aggregate(loss[sel], mask[sel], g[sel], mode).item()
        assert acc == pytest.approx(whole, rel=1e-9, abs=1e-12)


def test_aggregation_totals_and_weight_values():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    g = torch.tensor([4, 9, 4])
    assert aggregation_totals(mask, g) == {"tokens": 3.0, "sequences": 2.0, "groups": 1.0}
    total = {"tokens": 6, "sequences": 4, "groups": 2}
    assert aggregation_weight("token", mask, g, total) == 0.5
    assert aggregation_weight("sample", mask, g, total) == 0.5
    assert aggregation_weight("prompt", mask, g, total) == 0.5
    assert aggregation_weight("token", mask, g, {"tokens": 0, "sequences": 0, "groups": 0}) == 0.0
    with pytest.raises(ValueError, match="token, sample, prompt"):
        aggregation_weight("batch", mask, g, total)


def test_unknown_aggregation():
    with pytest.raises(ValueError, match=r"'seq'.*token, sample, prompt"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1, dtype=torch.long), "seq")


# ------------------------------------------------------------------------------------------ filters


def test_zero_variance_mask():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5000001])
    g = torch.tensor([10, 10, 2, 2, 5, 5, 0, 0])
    assert zero_variance_mask(r, g).tolist() == [False, False, True, True, False, False, True, True]
    # a single-sample group has zero variance
    assert zero_variance_mask(torch.tensor([1.0]), torch.tensor([3])).tolist() == [False]
    assert zero_variance_mask(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0


@FAST
@given(_rewards_groups)
def test_zero_variance_mask_matches_python(data):
    r, g = torch.tensor(data[0], dtype=torch.float64), torch.tensor(data[1])
    keep = zero_variance_mask(r, g).tolist()
    for i, gid in enumerate(data[1]):
        vals = {data[0][j] for j, h in enumerate(data[1]) if h == gid}
        assert keep[i] == (len(vals) > 1)


def test_pass_rate_tracker_retirement():
    t = PassRateTracker()
    assert t.threshold == 0.9 and len(t) == 0
    t.update([1, 1, 1, 1, 2, 2], [True, True, True, True, True, False])
    assert t.retired(1) and not t.retired(2) and len(t) == 1
    assert t.pass_rate(2) == 0.5 and t.pass_rate(99) is None
    # 9 successes of 10 reaches exactly 0.9 -> retired
    t.update(torch.tensor([3] * 10), torch.tensor([1.0] * 9 + [0.0]))
    assert t.retired(3) and t.retired_uids() == {1, 3}
    # failures after retirement never un-retire
    t.update([1] * 20, [0] * 20)
    assert t.retired(1) and t.pass_rate(1) == pytest.approx(4 / 24)
    assert 1 in t and 2 not in t


def test_pass_rate_tracker_state_round_trip():
    t = PassRateTracker(threshold=0.75)
    t.update([5, 5, 5, 5, 8, 8], [1, 1, 1, 0, 0, 1])
    state = json.loads(json.dumps(t.state_dict()))
    u = PassRateTracker()
    u.load_state_dict(state)
    assert u.threshold == 0.75 and u.retired_uids() == {5} and u.pass_rate(8) == 0.5
    assert u.state_dict() == t.state_dict()
    u.update([8, 8], [1, 1])  # 2/2 in this epoch -> retired
    assert u.retired(8) and not t.retired(8)
    assert u.pass_rate(8) == 0.75  # the history was carried over


def test_pass_rate_window_last_epoch_or_all_epochs():
    """A prompt solved 4/8 in its first epoch and 8/8 in the next: retired after the second epoch
    with the per-epoch rate, kept with the cumulative one (12/16 = 0.75) until 4 perfect epochs."""
    last, every = PassRateTracker(), PassRateTracker(window="all_epochs")
    for t in (last, every):
        t.update([7] * 8, [1] * 4 + [0] * 4)
        t.update([7] * 8, [1] * 8)
    assert last.retired(7) and not every.retired(7)
    for epoch in range(3):
        every.update([7] * 8, [1] * 8)
        assert every.retired(7) == (epoch == 2)  # (4 + 8 * 4) / 40 = 0.9
    # a checkpoint keeps the window; one from before the choice was cumulative
    state = every.state_dict()
    restored = PassRateTracker()
    restored.load_state_dict(state)
    assert restored.window == "all_epochs"
    old = {k: v for k, v in last.state_dict().items() if k != "window"}
    restored.load_state_dict(old)
    assert restored.window == "all_epochs"
    with pytest.raises(ValueError, match="window must be one of last_epoch, all_epochs"):
        PassRateTracker(window="epoch")


def test_pass_rate_tracker_rejects_bad_input():
    with pytest.raises(ValueError, match="threshold"):
        PassRateTracker(threshold=0.0)
    t = PassRateTracker()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        t.update([1], [-1.0])
    with pytest.raises(ValueError, match="2 prompt uids but 1"):
        t.update([1, 2], [1.0])


# ---------------------------------------------------------------------------------- length penalty


def test_length_penalty_boundaries():
    lengths = torch.tensor([0, 11999, 12000, 13000, 13500, 14000, 20000, 13000])
    correct = torch.tensor([True, True, True, True, True, True, True, False])
    out = length_penalty(lengths, correct, l_max=14000, l_cache=2000).tolist()
    assert out == pytest.approx([0.0, 0.0, 0.0, -0.5, -0.75, -1.0, -1.0, 0.0])
    # numeric correctness flags (1/0 and +1/-1)
    out = length_penalty(torch.tensor([14000, 14000, 14000]), torch.tensor([1.0, 0.0, -1.0]), 14000, 2000)
    assert out.tolist() == [-1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="l_cache"):
        length_penalty(lengths, correct, 14000, 0)


# ------------------------------------------------------------------------------------------ registry


def test_builtin_losses_registered():
    # a new loss needs its PARAMS entry, its branch in _ref_token_losses and its EXPECTED values
    # (from the reference): the parametrized reference tests then check it against them
    assert set(LOSSES) == set(PARAMS)
    assert set(algo.__all__) >= {
        "compute_advantages",
        "policy_loss",
        "zero_variance_mask",
        "aggregate",
        "length_penalty",
        "PassRateTracker",
        "LOSSES",
        "register_loss",
    }


def test_check_loss_params_rejects_negative_eps_max():
    assert check_loss_params("cispo", {"eps_max": 5.0}) == []
    assert check_loss_params("cispo", {"eps_max": -1.0}) == [("eps_max", -1.0, "a number > 0")]
    assert check_loss_params("dapo", {"eps_low": 1.2, "eps_high": 0.28}) == [
        ("eps_low", 1.2, "a number in (0, 1)")
    ]
    with pytest.raises(ValueError, match=r"cispo\.eps_max=-1\.0: must be a number > 0"):
        policy_loss(
            "cispo",
            *_one_token(0.0, 1.0)[:2],
            torch.ones(1),
            torch.ones(1, 1),
            torch.tensor([0]),
            "token",
            eps_max=-1.0,
        )


def test_unknown_loss_lists_registered_names():
    with pytest.raises(ValueError, match=f"registered losses are {', '.join(sorted(LOSSES))}$"):
        policy_loss(
            "ppo",
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1),
            torch.ones(1, 1),
            torch.tensor([0]),
            "token",
        )
    assert check_loss_params("ppo", {})[0][0] == "name"


def test_policy_loss_param_handling():
    args = (*_one_token(0.0, 1.0)[:2], torch.ones(1), torch.ones(1, 1), torch.tensor([0]), "token")
    # a whole LossConfig can be splatted: None-valued keys of other losses and `name` are ignored
    policy_loss("cispo", *args, name="cispo", eps_max=5.0, eps_low=None, eps_high=None)
    with pytest.raises(ValueError, match="disagrees"):
        policy_loss("cispo", *args, name="dapo", eps_max=5.0)
    with pytest.raises(ValueError, match="unexpected parameter"):
        policy_loss("cispo", *args, eps_max=5.0, eps_low=0.2)
    with pytest.raises(ValueError, match="eps_max=None"):
        policy_loss("cispo", *args)


@pytest.fixture
def scratch_loss():
    yield "scratch_reinforce"
    LOSSES.pop("scratch_reinforce", None)


def test_new_registered_loss_works_through_policy_loss(scratch_loss):
    @register_loss(scratch_loss, params={"scale": algo.registry.positive})
    def reinforce(logp, gen_logp, advantages, mask, group_ids, *, scale):
        return -scale * advantages.unsqueeze(1) * logp

    with pytest.raises(ValueError, match="already registered"):
        register_loss(scratch_loss)(reinforce)
    logp, gen, mask, g, r = _batch()
    adv = compute_advantages(r, g, "none")
    loss = policy_loss(scratch_loss, logp, gen, adv, mask, g, "token", scale=2.0)
    expected = sum(-2.0 * adv[i].item() * LOGP[i][t] for i in range(5) for t in range(LENGTHS[i])) / 12
    assert loss.item() == pytest.approx(expected)
    assert check_loss_params(scratch_loss, {"scale": -1}) == [("scale", -1, "a number > 0")]
    stats = loss_stats(scratch_loss, logp, gen, adv, mask, scale=2.0)
    assert math.isnan(stats["clip_fraction"])  # no clip_indicator registered


def test_dapo_and_grpo_are_one_function_with_their_own_help_lines():
    """dapo and grpo share their surrogate: one function registered under both names, each with its
    own line in --help and the same numbers for the same clip."""
    from scalerl.config import options

    assert LOSSES["dapo"].fn is LOSSES["grpo"].fn
    assert options("loss")["dapo"].__doc__.startswith("DAPO per-token loss")
    assert options("loss")["grpo"].__doc__.startswith("GRPO per-token loss")
    g = torch.Generator().manual_seed(5)
    logp, gen = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    adv, mask = torch.randn(3, generator=g), torch.ones(3, 6)
    args = (logp, gen, adv, mask, torch.tensor([0, 0, 1]))
    assert torch.equal(
        LOSSES["dapo"].fn(*args, eps_low=0.2, eps_high=0.28),
        LOSSES["grpo"].fn(*args, eps_low=0.2, eps_high=0.28),
    )
