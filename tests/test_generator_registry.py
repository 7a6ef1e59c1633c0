"""Generators registered like losses (:mod:`scalerl.generator.registry`): the built-ins register
themselves, :func:`~scalerl.generator.make_generator` looks the name up, an unknown name is one line
listing the registered ones, and a user's own generator plugs in as README's "Your own generator"
says: an option dataclass, its YAML, and a factory registered under its name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hydra.core.config_store import ConfigStore
from test_generator import SAME_LEN, TOK

from scalerl.config import ConfigError, compose, schema, typed
from scalerl.config.checks import at_least, problems
from scalerl.config.groups.generator import GeneratorOption
from scalerl.config.options import OPTIONS, options, register_option, schema_path
from scalerl.generator import GENERATORS, Generator, LengthControl, Sample, make_generator, register_generator
from scalerl.generator.registry import generator_class, get_generator, unregister_generator
from scalerl.model.precision import Precision


def test_the_built_in_generators_register_themselves():
    from scalerl.generator.hf import build_hf
    from scalerl.generator.vllm_gen import build_vllm

    assert get_generator("hf") is build_hf and get_generator("vllm") is build_vllm
    assert set(GENERATORS) == set(options("generator"))


def test_an_unknown_generator_name_is_one_line_listing_the_registered_ones():
    cfg = compose([])
    cfg.generator.name = "nope"  # a config no compose lets through (generator=nope has no YAML)
    with pytest.raises(ConfigError) as err:
        make_generator(cfg.generator, cfg.length_control, torch.nn.Linear(2, 2), TOK, Precision())
    assert (
        str(err.value)
        == "invalid config value generator.name='nope': must be a registered generator: hf, vllm"
    )


def test_a_generator_name_is_registered_once():
    with pytest.raises(ValueError, match="generator 'hf' is already registered"):
        register_generator("hf")(lambda *a, **k: None)
    assert GENERATORS["hf"].__name__ == "build_hf"


# ---------------------------------------------------------------------------- a user's own generator
@dataclass
class EchoOption(GeneratorOption):
    """Completions that repeat the prompt's last token."""

    name: str = "test_echo"
    repeat: int = 3  # tokens per completion (at most length_control.max_new_tokens)

    def check(self):
        return super().check() + problems(at_least("repeat", self.repeat, 1))


class EchoGenerator(Generator):
    """The smallest generator with the declared interface (:class:`scalerl.generator.base.Generator`):
    ``_generate`` and ``load_weights``; its length limit comes from the LengthControl it is given."""

    def __init__(self, model, tokenizer, length_control: LengthControl, *, repeat: int, seed: int):
        self.model, self.tokenizer, self.lc, self.repeat = model, tokenizer, length_control, repeat
        self.rng = torch.Generator().manual_seed(seed)

    def _generate(self, prompts, prompt_ids, n, *, version, group_ids, weight_update, on_step):
        k = min(self.repeat, self.lc.max_new_tokens)
        groups = []
        for prompt, ids, gid in zip(prompts, prompt_ids, group_ids):
            completion = [ids[-1]] * k
            sample = dict(
                prompt_uid=prompt.uid,
                group_id=gid,
                prompt_ids=list(ids),
                completion_ids=completion,
                logprobs=[0.0] * k,
                versions=[version] * k,
                loss_mask=[1] * k,
                text=self.tokenizer.decode(completion),
                truncated=self.repeat > self.lc.max_new_tokens,
                interrupted=False,
                think_tokens=0,
            )
            groups.append([Sample(**sample) for _ in range(n)])
        return groups

    def load_weights(self, weights, version: int) -> None:
        self.version = int(version)


@pytest.fixture
def echo_registered():
    """``generator=test_echo`` as a user adds it: the option registered, what its YAML
    (``conf/generator/test_echo.yaml``) would say stored in Hydra's ConfigStore (a test does not write
    into conf/), and the factory registered; all removed afterwards."""
    register_option("generator", "test_echo")(EchoOption)
    yaml = {"defaults": [schema_path("generator", "test_echo"), "_self_"], "repeat": 5}
    store = ConfigStore.instance()
    store.store(group="generator", name="test_echo", node=yaml)

    @register_generator("test_echo")
    def build_echo(options, length_control, model, tokenizer, precision, *, device, seed, placement):
        return EchoGenerator(model, tokenizer, length_control, repeat=options.repeat, seed=seed)

    try:
        yield build_echo
    finally:
        unregister_generator("test_echo")
        OPTIONS["generator"].pop("test_echo", None)
        store.repo["generator"].pop("test_echo.yaml", None)
        store.repo.get("scalerl_schema", {}).get("generator", {}).pop("test_echo.yaml", None)
        schema._stored = ()  # the schemas stored again at the next compose (another test registers it)


def test_a_user_generator_registered_by_name_runs_through_make_generator(echo_registered):
    """Composed as ``generator=test_echo`` (its YAML's value, then an override), validated, built by
    make_generator with its own option and one LengthControl, and sampled through the base class's
    checks (group ids, the prompts tokenized)."""
    cfg = compose(["generator=test_echo", "length_control=none", "length_control.max_new_tokens=4"])
    assert cfg.generator.repeat == 5 and cfg.generator.temperature == 1.0  # the YAML, the dataclass
    o = typed(cfg)
    gen = make_generator(
        o.generator, o.length_control, torch.nn.Linear(2, 2), TOK, Precision(), "cpu", seed=3
    )
    assert isinstance(gen, EchoGenerator)
    assert gen.lc == LengthControl.build(cfg.length_control, TOK)
    groups = gen.generate(SAME_LEN[:2], 2, version=7, group_ids=[10, 11])
    assert [[s.group_id for s in g] for g in groups] == [[10, 10], [11, 11]]
    last = TOK(SAME_LEN[0].text)["input_ids"][-1]
    assert groups[0][0].completion_ids == [last] * 4 and groups[0][0].truncated  # 5 cut at 4
    assert groups[0][0].versions == [7] * 4
    # its option's fields are typed and checked as any other option's
    with pytest.raises(Exception, match="generator.repeat=many"):
        compose(["generator=test_echo", "generator.repeat=many"])
    with pytest.raises(
        ConfigError, match=r"^invalid config value generator.repeat=0: must be an integer >= 1$"
    ):
        compose(["generator=test_echo", "generator.repeat=0"])
    o = typed(compose(["generator=test_echo", "generator.repeat=2", "length_control=none"]))
    assert (
        make_generator(o.generator, o.length_control, torch.nn.Linear(2, 2), TOK, Precision())
        .generate(SAME_LEN[:1], 1, version=0)[0][0]
        .completion_ids
        == [last] * 2
    )


# ---------------------------------------------------------------------------- what the run asks of it
def _decisions(option) -> dict:
    """What the run decides about a generator from its option, before one is built: the setup
    (evaluate in the trainer's process beside the engines), the engine process (its policy copy's
    device, the options it builds with), the pool (checkpoint names), an engine's concurrency, the
    estimate's note, and the config's and the layout's checks (tensor parallelism, shared-memory
    weights, the GPU share a colocated engine reserves)."""
    from scalerl.config.groups.generator import generator_option_class
    from scalerl.rollout.engine import engine_concurrency

    cls, caps = generator_class(option.name), generator_option_class(option)
    return dict(
        samples_from_trainer_module=cls.samples_from_trainer_module,
        checkpoint_names=cls.checkpoint_names,
        estimate_note=cls.estimate_note,
        running=engine_concurrency(option, 48),
        engine_options_unchanged=cls.engine_options(option) == option,
        tensor_parallel=caps.tensor_parallel,
        shared_memory_weights=caps.shared_memory_weights,
        gpu_memory_share=caps.gpu_memory_share(option),
    )


HF_LIKE = dict(
    samples_from_trainer_module=True,
    checkpoint_names=False,
    estimate_note="",
    running=48,  # one training batch of samples
    engine_options_unchanged=True,
    tensor_parallel=False,
    shared_memory_weights=True,
    gpu_memory_share=None,
)


def test_a_user_generator_gets_the_hf_generators_answers_unless_it_says_otherwise(echo_registered):
    """No decision branches on a generator's name: a generator registered by a function that names
    no class, with an option that declares nothing, is treated as hf is; vLLM's answers come from its
    classes; a class registered with the factory (or as the factory) gives its own."""
    from scalerl.config.groups.generator import HFGeneratorOption, VLLMGeneratorOption
    from scalerl.generator.hf import HFGenerator
    from scalerl.generator.vllm_gen import VLLMGenerator
    from scalerl.layout import Launch, LayoutOptions, plan
    from scalerl.rollout.engine import engine_concurrency

    assert generator_class("test_echo") is Generator
    assert generator_class("hf") is HFGenerator and generator_class("vllm") is VLLMGenerator
    echo, vllm = EchoOption(), VLLMGeneratorOption()
    assert _decisions(echo) == _decisions(HFGeneratorOption()) == HF_LIKE
    assert _decisions(vllm) == dict(
        samples_from_trainer_module=False,
        checkpoint_names=True,
        estimate_note="vLLM's generation timed as transformers' path; its engine start is not counted",
        running=256,  # max_num_seqs
        engine_options_unchanged=False,  # no sleep mode in an engine process
        tensor_parallel=True,
        shared_memory_weights=False,
        gpu_memory_share=0.5,
    )
    assert generator_class("vllm").engine_options(vllm).sleep_while_training is False
    assert engine_concurrency(EchoOption(max_running=5), 48) == 5  # generator.max_running first

    # the config's checks and the layout ask the same: tensor parallelism is refused as for hf,
    # shared-memory weights allowed, and two colocated engines reserve no GPU share (vLLM's 0.5 each
    # would take the whole GPU: refused)
    with pytest.raises(ConfigError, match=r"1 with generator=test_echo \(tensor parallelism is vLLM's\)"):
        compose(
            [
                "generator=test_echo",
                "async_mode=pipeline_rl",
                "placement=split",
                "placement.tensor_parallel_size=2",
            ]
        )
    compose(["generator=test_echo", "async_mode=pipeline_rl", "async_mode.transport=shm"])
    o = typed(compose(["generator=test_echo", "async_mode=pipeline_rl", "placement.engines=2"]))
    lay = plan(LayoutOptions.of(o), Launch("process", gpus_per_node=1))
    assert [e.memory for e in lay.engines] == [None, None]

    class Own(EchoGenerator):
        samples_from_trainer_module = False
        checkpoint_names = True

        @classmethod
        def default_running(cls, options, batch_size):
            return 7

    def build_own(options, length_control, model, tokenizer, precision, *, device, seed, placement):
        return Own(model, tokenizer, length_control, repeat=1, seed=seed)

    register_generator("test_echo_own", generator=Own)(build_own)
    register_generator("test_echo_cls")(Own)  # a factory that is the class itself
    try:
        for name in ("test_echo_own", "test_echo_cls"):
            assert generator_class(name) is Own
            own = dict(HF_LIKE, samples_from_trainer_module=False, checkpoint_names=True, running=7)
            cls = generator_class(name)
            assert {
                "samples_from_trainer_module": cls.samples_from_trainer_module,
                "checkpoint_names": cls.checkpoint_names,
                "running": engine_concurrency(EchoOption(name=name), 48),
                "engine_options_unchanged": cls.engine_options(echo) == echo,
            } == {
                k: own[k]
                for k in (
                    "samples_from_trainer_module",
                    "checkpoint_names",
                    "running",
                    "engine_options_unchanged",
                )
            }
    finally:
        unregister_generator("test_echo_own")
        unregister_generator("test_echo_cls")
    with pytest.raises(ConfigError, match="generator.name='test_echo_own'"):
        generator_class("test_echo_own")
