"""The off-policy correction group (``correction``) against an independent reference.

Every option's behaviour weights, the tokens it truncates or masks, the loss and its gradient, and
the mismatch diagnostics are recomputed here in plain Python (``math``, lists; no torch op of the
code under test) on small hand-made tensors, as ``tests/test_algo.py`` does for the losses. Where
verl's rollout correction has a formula the reference follows it (token-level truncated weights
``exp(min(log w, log C))``; rejection outside ``[lower, upper]``); at sequence level scalerl takes the
*mean* log-ratio where verl's ``sequence`` mode takes the sum (its ``geometric`` mode is the mean):
the issue asks that length not explode a sequence's weight (TRL #5814).
"""

from __future__ import annotations

import math

import pytest
import torch

from scalerl import algo
from scalerl.algo.correction import Correction, behaviour_weights, mismatch_stats

# two prompts x two generations, five positions; the first sequence is two tokens shorter
TRAIN = [
    [-1.20, -0.70, -2.10, -0.30, -1.00],
    [-0.40, -1.50, -0.90, -0.20, -2.40],
    [-2.00, -0.10, -0.60, -1.30, -0.80],
    [-0.90, -0.90, -1.70, -0.50, -0.20],
]
GEN = [
    [-1.00, -1.60, -1.40, -0.30, -9.00],  # its last two positions are padding
    [-0.45, -0.20, -0.95, -1.10, -2.30],
    [-2.90, -0.15, -0.10, -1.25, -0.80],
    [-0.85, -1.95, -1.60, -0.55, -0.10],
]
MASK = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
ADV = [0.7, -0.4, 1.3, -0.9]
GROUPS = [0, 0, 1, 1]

OPTIONS = [
    Correction("decoupled", "token"),
    Correction("decoupled", "sequence"),
    Correction("tis", "token", threshold=2.0),
    Correction("tis", "token", threshold=1.2),
    Correction("tis", "sequence", threshold=1.1),
    Correction("mis", "token", threshold=2.0),
    Correction("mis", "token", threshold=1.5, lower=0.5),
    Correction("mis", "sequence", threshold=1.1, lower=0.9),
]


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------- the reference
def ref_weights(c: Correction) -> tuple[list[list[float]], list[list[bool]], list[list[bool]]]:
    """(weights, truncated, masked) per position, in plain Python."""
    out_w, out_t, out_m = [], [], []
    for tr, ge, mk in zip(TRAIN, GEN, MASK):
        logs = [a - b for a, b, m in zip(tr, ge, mk) if m]
        if c.level == "sequence":
            mean = sum(logs) / len(logs)
            logs = [mean] * len(logs)
        row_w, row_t, row_m, k = [], [], [], 0
        for m in mk:
            if not m:
                row_w.append(0.0), row_t.append(False), row_m.append(False)
                continue
            lw = logs[k]
            k += 1
            w = math.exp(lw)
            trunc = masked = False
            if c.name == "tis":  # verl: exp(clamp(log_ratio, max=log(threshold)))
                trunc = lw > math.log(c.threshold)
                w = math.exp(min(lw, math.log(c.threshold)))
            elif c.name == "mis":  # verl's rejection sampling: outside [lower, upper] -> weight 0
                masked = not (c.lower <= w <= c.threshold)
                w = 0.0 if masked else w
            row_w.append(w), row_t.append(trunc), row_m.append(masked)
        out_w.append(row_w), out_t.append(row_t), out_m.append(row_m)
    return out_w, out_t, out_m


def ref_token_values(loss: str, c: Correction, eps: dict) -> tuple[list[list[float]], list[list[float]]]:
    """(per-token loss, its derivative w.r.t. the trainer's log-prob) on masked positions."""
    vals, grads = [], []
    w, _, _ = ref_weights(c) if c.name != "none" else (None, None, None)
    for i, (tr, ge, mk) in enumerate(zip(TRAIN, GEN, MASK)):
        rv, rg = [], []
        for t, (lp, gl, m) in enumerate(zip(tr, ge, mk)):
            if not m:
                rv.append(0.0), rg.append(0.0)
                continue
            a = ADV[i]
            if c.name != "none":  # ratio against the proximal policy: 1 in value, unclipped
                ww = w[i][t]
                v = -ww * a * lp if loss == "cispo" else -ww * a
                rv.append(v), rg.append(-ww * a)
                continue
            rho = math.exp(lp - gl)
            if loss == "cispo":
                cw = min(rho, eps["eps_max"])
                rv.append(-cw * a * lp), rg.append(-cw * a)
            else:  # dapo
                lo, hi = 1 - eps["eps_low"], 1 + eps["eps_high"]
                un, cl = rho * a, min(max(rho, lo), hi) * a
                rv.append(-min(un, cl))
                rg.append(-rho * a if un <= cl else 0.0)
        vals.append(rv), grads.append(rg)
    return vals, grads


def ref_aggregate(values, mode: str) -> float:
    rows = [[v for v, m in zip(r, mk) if m] for r, mk in zip(values, MASK)]
    if mode == "token":
        flat = [v for r in rows for v in r]
        return sum(flat) / len(flat)
    if mode == "sample":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    groups = {}
    for g, r in zip(GROUPS, rows):
        groups.setdefault(g, []).extend(r)
    return sum(sum(v) / len(v) for v in groups.values()) / len(groups)


# ---------------------------------------------------------------------- weights and shares
@pytest.mark.parametrize("c", OPTIONS, ids=lambda c: f"{c.name}-{c.level}-{c.threshold}-{c.lower}")
def test_weights_truncation_and_masks_match_the_reference(c):
    w, trunc, masked = behaviour_weights(_t(TRAIN), _t(GEN), _t(MASK), c)
    rw, rt, rm = ref_weights(c)
    assert torch.allclose(w, _t(rw), atol=1e-12, rtol=1e-12)
    assert trunc.tolist() == rt and masked.tolist() == rm


def test_the_cases_act():
    """The table's thresholds do truncate and mask (a reference that never acted would prove nothing)."""
    assert any(map(any, ref_weights(Correction("tis", "token", threshold=1.2))[1]))
    assert any(map(any, ref_weights(Correction("tis", "sequence", threshold=1.1))[1]))
    assert any(map(any, ref_weights(Correction("mis", "token", threshold=1.5, lower=0.5))[2]))
    assert any(map(any, ref_weights(Correction("mis", "sequence", threshold=1.1, lower=0.9))[2]))


def test_a_sequence_weight_is_the_geometric_mean_so_length_does_not_explode_it():
    """A 1000-token sequence whose every token has ratio 1.01: its weight is 1.01, not 1.01**1000."""
    lp = torch.full((1, 1000), -1.0, dtype=torch.float64)
    w, _, _ = behaviour_weights(
        lp, lp - math.log(1.01), torch.ones(1, 1000), Correction("decoupled", "sequence")
    )
    assert torch.allclose(w, torch.full_like(w, 1.01))


# ---------------------------------------------------------------------- the loss and its gradient
@pytest.mark.parametrize("aggregation", ["token", "sample", "prompt"])
@pytest.mark.parametrize("c", [Correction(), *OPTIONS], ids=lambda c: f"{c.name}-{c.level}-{c.threshold}")
@pytest.mark.parametrize(
    "loss,eps", [("cispo", {"eps_max": 1.3}), ("dapo", {"eps_low": 0.2, "eps_high": 0.28})]
)
def test_loss_and_gradient_match_the_reference(loss, eps, c, aggregation):
    logp = _t(TRAIN).requires_grad_()
    value = algo.policy_loss(
        loss, logp, _t(GEN), _t(ADV), _t(MASK), torch.tensor(GROUPS), aggregation, correction=c, **eps
    )
    value.backward()
    vals, grads = ref_token_values(loss, c, eps)
    assert math.isclose(float(value.detach()), ref_aggregate(vals, aggregation), rel_tol=1e-10, abs_tol=1e-12)
    # the gradient: the aggregation's weight of each token times its derivative
    for i in range(len(TRAIN)):
        for t in range(len(TRAIN[0])):
            onehot = [[1.0 if (r, s) == (i, t) else 0.0 for s in range(5)] for r in range(4)]
            want = ref_aggregate(
                [[g * o for g, o in zip(gr, orow)] for gr, orow in zip(grads, onehot)], aggregation
            )
            assert math.isclose(float(logp.grad[i, t]), want, rel_tol=1e-9, abs_tol=1e-12), (i, t)


@pytest.mark.parametrize("loss", ["cispo", "dapo", "grpo", "gspo"])
def test_none_is_todays_loss_bit_for_bit(loss):
    params = {"eps_max": 5.0} if loss == "cispo" else {"eps_low": 0.2, "eps_high": 0.28}
    args = (_t(TRAIN), _t(GEN), _t(ADV), _t(MASK), torch.tensor(GROUPS), "prompt")
    assert torch.equal(
        algo.policy_loss(loss, *args, **params),
        algo.policy_loss(loss, *args, correction=Correction(), **params),
    )


def test_under_cispo_decoupled_is_the_recipe_while_the_ratio_stays_below_eps_max():
    """CISPO already weights each token by sg(min(rho, eps_max)): against the proximal policy with the
    whole behaviour weight it is the same loss and gradient wherever rho <= eps_max, and differs where
    a token's ratio is above it (the sweep files leave decoupled out for that reason)."""
    args = (_t(GEN), _t(ADV), _t(MASK), torch.tensor(GROUPS), "prompt")
    grads = {}
    for eps_max in (5.0, 1.3):  # every ratio here is below 5; some are above 1.3
        for c in (Correction(), Correction("decoupled")):
            logp = _t(TRAIN).requires_grad_()
            algo.policy_loss("cispo", logp, *args, correction=c, eps_max=eps_max).backward()
            grads[eps_max, c.name] = logp.grad
    assert torch.allclose(grads[5.0, "none"], grads[5.0, "decoupled"], atol=1e-12)
    assert not torch.allclose(grads[1.3, "none"], grads[1.3, "decoupled"], atol=1e-6)


@pytest.mark.parametrize("loss", ["grpo", "gspo"])
def test_decoupled_clip_does_not_fire_and_the_weight_corrects(loss):
    """Against the proximal policy the loss's ratio is 1: no token is clipped (``clip_fraction`` 0),
    whatever the generator's gap; against the generator (none) the same batch is clipped."""
    eps = {"eps_low": 0.01, "eps_high": 0.01}
    args = (_t(TRAIN), _t(GEN), _t(ADV), _t(MASK))
    assert (
        algo.loss_stats(loss, *args, correction=Correction("tis", threshold=2.0), **eps)["clip_fraction"] == 0
    )
    assert algo.loss_stats(loss, *args, **eps)["clip_fraction"] > 0


# ---------------------------------------------------------------------- diagnostics
def ref_mismatch(c: Correction) -> dict[str, float]:
    tok_l, seq_l = [], []
    for tr, ge, mk in zip(TRAIN, GEN, MASK):
        logs = [a - b for a, b, m in zip(tr, ge, mk) if m]
        tok_l += logs
        seq_l.append(sum(logs) / len(logs))
    out = {}
    for level, ls in (("token", tok_l), ("seq", seq_l)):
        out[f"k3_{level}"] = sum(math.exp(x) - 1 - x for x in ls) / len(ls)
        out[f"chi2_{level}"] = sum(math.exp(2 * x) for x in ls) / len(ls) - 1
    # the weights the loss used (none: the raw token ratio); a sequence's: its tokens' mean
    if c.name == "none":
        w = [
            [math.exp(a - b) if m else 0.0 for a, b, m in zip(tr, ge, mk)]
            for tr, ge, mk in zip(TRAIN, GEN, MASK)
        ]
        trunc = masked = [[False] * 5] * 4
    else:
        w, trunc, masked = ref_weights(c)
    w_tok = [x for r, mk in zip(w, MASK) for x, m in zip(r, mk) if m]
    w_seq = [sum(x for x, m in zip(r, mk) if m) / sum(mk) for r, mk in zip(w, MASK)]
    for level, ws in (("token", w_tok), ("seq", w_seq)):
        out[f"ess_{level}"] = sum(ws) ** 2 / (len(ws) * sum(x * x for x in ws))
    n_tok = sum(map(sum, MASK))
    out["truncated_tokens"] = sum(t for r, mk in zip(trunc, MASK) for t, m in zip(r, mk) if m) / n_tok
    out["masked_tokens"] = sum(t for r, mk in zip(masked, MASK) for t, m in zip(r, mk) if m) / n_tok
    out["truncated_sequences"] = sum(any(r) for r in trunc) / 4
    out["masked_sequences"] = sum(any(r) for r in masked) / 4
    return out


@pytest.mark.parametrize("c", [Correction(), *OPTIONS], ids=lambda c: f"{c.name}-{c.level}-{c.threshold}")
def test_mismatch_diagnostics_match_the_reference(c):
    got = mismatch_stats(_t(TRAIN), _t(GEN), _t(MASK), c)
    want = ref_mismatch(c)
    assert set(got) == set(want)
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-9, abs_tol=1e-12), (k, got[k], v)


def test_diagnostics_add_up_over_micro_batches():
    c = Correction("mis", "token", threshold=1.5, lower=0.5)
    whole = mismatch_stats(_t(TRAIN), _t(GEN), _t(MASK), c)
    parts = [algo.mismatch_sums(_t(TRAIN)[s], _t(GEN)[s], _t(MASK)[s], c) for s in (slice(0, 1), slice(1, 4))]
    summed = {k: parts[0][k] + parts[1][k] for k in parts[0]}
    for k, v in algo.finish_mismatch(summed).items():
        assert math.isclose(v, whole[k], rel_tol=1e-12, abs_tol=1e-12), k


def test_no_gap_means_no_divergence_and_full_ess():
    got = mismatch_stats(_t(TRAIN), _t(TRAIN), _t(MASK))
    assert got["k3_token"] == got["chi2_token"] == got["k3_seq"] == 0.0
    assert math.isclose(got["ess_token"], 1.0) and math.isclose(got["ess_seq"], 1.0)


# ---------------------------------------------------------------------- the config group
@pytest.mark.parametrize(
    "overrides,want",
    [
        ([], Correction()),
        (["correction=decoupled"], Correction("decoupled")),
        (
            ["correction=tis", "correction.level=sequence", "correction.threshold=1.5"],
            Correction("tis", "sequence", 1.5),
        ),
        (["correction=mis", "correction.lower=0.5"], Correction("mis", "token", 2.0, 0.5)),
    ],
)
def test_the_group_composes_into_the_trainer_s_correction(overrides, want):
    from scalerl.config import compose, typed

    # the option's view, as the trainer takes it (scalerl.trainer.Trainer)
    assert typed(compose(overrides)).correction.correction() == want


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["correction=tis", "correction.threshold=0"], "correction.threshold=0"),
        (["correction=mis", "correction.lower=3"], "correction.lower=3"),
        (
            ["correction=decoupled", "correction.level=word"],
            "correction.level='word': must be one of token, sequence",
        ),
    ],
)
def test_a_bad_correction_setting_is_one_line(overrides, message):
    from scalerl.config import compose

    with pytest.raises(Exception) as e:
        compose(overrides)
    text = str(e.value)
    assert message in text and "\n" not in text.strip(), text
