"""Length control read once (:class:`scalerl.generator.length.LengthControl`): the token ids and
budgets both generators take from one ``length_control`` option and the tokenizer, its one-line
errors, and the limits the vLLM generator's requests and the HF generator's steps share.

How completions end under each rule is checked on real decoding in ``tests/test_generator.py``
(HF) and ``tests/test_vllm.py`` (vLLM, slow); this file checks the object they both read it from.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_generator import PHRASE, SAME_LEN, THINK_END, TOK, flat, make_model

from scalerl.config import ConfigError, compose
from scalerl.generator import HFGenerator, LengthControl
from scalerl.model.precision import Precision


def test_length_control_from_the_composed_config():
    """The default recipe's interruption: the phrase tokenized once, ``</think>``'s id, the
    budgets; max_steps leaves room for the phrase, the answer limit is the answer budget."""
    cfg = compose([]).length_control
    lc = LengthControl.build(cfg, TOK)
    assert lc.interrupts and lc.name == "interruption"
    assert lc.phrase_ids == tuple(TOK(cfg.phrase, add_special_tokens=False)["input_ids"])
    assert lc.think_end_id == THINK_END
    assert (lc.think_budget_min, lc.think_budget_max, lc.answer_budget) == (40, 48, 8)
    assert lc.max_steps == cfg.max_new_tokens + len(lc.phrase_ids)
    # the longest completion: 48 thinking, the phrase, 8 answer tokens (the cap of 64 not reached)
    assert lc.longest == 48 + len(lc.phrase_ids) + 8 < lc.max_steps
    assert lc.answer_limit == 8
    assert LengthControl.build(lc, TOK) is lc  # built once, passed on as it is


@pytest.mark.parametrize("name", ["none", "length_penalty"])
def test_length_control_without_interruption_has_no_phrase_and_no_answer_limit(name):
    lc = LengthControl.build(compose([f"length_control={name}"]).length_control, TOK)
    assert not lc.interrupts and lc.phrase_ids == () and lc.max_steps == lc.max_new_tokens == 64
    assert lc.answer_limit > lc.max_steps  # only max_new_tokens ends a completion
    assert lc.longest == lc.max_steps
    assert lc.think_end_id == THINK_END  # thinking tokens are still counted up to </think>


def _lc(**kw):
    fields = dict(
        name="interruption",
        max_new_tokens=16,
        think_budget_min=2,
        think_budget_max=4,
        answer_budget=3,
        phrase=PHRASE,
    )
    return SimpleNamespace(**{**fields, **kw})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(name="soon"),
            "invalid config value length_control.name='soon': must be one of none, interruption, length_penalty",
        ),
        (
            dict(max_new_tokens=0),
            "invalid config value length_control.max_new_tokens=0: must be an integer >= 1",
        ),
        (
            dict(think_budget_min=-1),
            "invalid config value length_control.think_budget_min=-1: must be an integer >= 0",
        ),
        (
            dict(think_budget_max=1),
            "invalid config value length_control.think_budget_max=1: must be >= think_budget_min (2)",
        ),
        (
            dict(answer_budget=-1),
            "invalid config value length_control.answer_budget=-1: must be an integer >= 0",
        ),
        (
            dict(phrase=""),
            "invalid config value length_control.phrase='': must be text of at least one token "
            "(interruption forces it in at the thinking budget)",
        ),
    ],
)
def test_length_control_bad_settings_are_one_line_each(kw, message):
    """A setting the generators cannot run with: one line naming it, its value and what is allowed,
    from either generator (both build their LengthControl here)."""
    with pytest.raises(ConfigError) as err:
        LengthControl.build(_lc(**kw), TOK)
    assert str(err.value) == message
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        HFGenerator(make_model(), TOK, Precision(), _lc(**kw))


def test_length_control_reads_only_its_option_fields():
    """``none`` has no budgets or phrase: nothing of interruption's is read (an object without them
    builds), and a phrase that would be refused under interruption is not looked at."""
    lc = LengthControl.build(SimpleNamespace(name="none", max_new_tokens=5), TOK)
    assert (lc.max_new_tokens, lc.phrase_ids, lc.answer_budget) == (5, (), 0)


def test_length_control_draws_budgets_only_when_interrupting():
    """Budgets come from the generator's stream, uniformly in [min, max], as ``torch.randint``
    draws them (so a checkpointed stream gives the same budgets); without interruption the stream
    is not touched and the budget is out of reach."""
    lc = LengthControl.build(_lc(), TOK)
    rng = torch.Generator().manual_seed(7)
    ref = torch.randint(2, 5, (200,), generator=torch.Generator().manual_seed(7))
    got = lc.draw_budgets(200, rng)
    assert torch.equal(got, ref) and set(got.tolist()) == {2, 3, 4}
    none = LengthControl.build(_lc(name="none"), TOK)
    state = rng.get_state()
    budgets = none.draw_budgets(3, rng)
    assert torch.equal(rng.get_state(), state)
    assert budgets.tolist() == [none.max_steps + 1] * 3


def test_length_control_request_limits():
    """The vLLM generator's phases: thinking takes at most the budget and never past
    max_new_tokens, stopping at eos or </think>; the answer takes answer_budget tokens, fewer when
    max_new_tokens is nearer (none left: truncated)."""
    lc = LengthControl.build(_lc(max_new_tokens=10, answer_budget=3), TOK)
    assert lc.think_stop([TOK.eos_token_id]) == [TOK.eos_token_id, THINK_END]
    assert [lc.thinking_tokens(b) for b in (0, 4, 12)] == [0, 4, 10]
    assert [lc.answer_tokens(s) for s in (2, 8, 10)] == [3, 2, 0]


def test_both_paths_of_the_hf_generator_read_one_length_control():
    """The batch path and a continuous session of one piece of work draw the same budgets from the
    LengthControl they share, so they force the phrase at the same places (the session's docstring
    promises the same samples for a session sized to the batch)."""
    model = make_model(bias={TOK.eos_token_id: -30.0, THINK_END: -30.0})  # every sample reaches its budget
    lc = LengthControl.build(_lc(max_new_tokens=12, think_budget_min=2, think_budget_max=6), TOK)
    batch = HFGenerator(model, TOK, Precision(), lc, seed=4, lean=False)  # the batch decode
    assert batch.lc is lc
    got_batch = flat(batch.generate(SAME_LEN, 2, version=0))
    cont = HFGenerator(model, TOK, Precision(), lc, seed=4)
    session = cont.session(rows=len(SAME_LEN) * 2)
    session.add(SAME_LEN, 2)
    ((_, groups),) = session.drain()
    got_session = flat(groups)
    assert len(got_batch) == len(got_session) == 6
    for a, b in zip(got_batch, got_session):
        assert a.interrupted and b.interrupted
        assert a.loss_mask.index(0) == b.loss_mask.index(0)  # the phrase at the same drawn budget
        at = a.loss_mask.index(0)
        assert 2 <= at <= 6 and a.completion_ids[at : at + len(lc.phrase_ids)] == list(lc.phrase_ids)
        assert len(a.completion_ids) <= lc.longest and len(b.completion_ids) <= lc.longest
