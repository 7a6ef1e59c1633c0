"""The generators a run can choose (``generator=<name>``), registered like losses.

A generator is a class implementing :class:`~scalerl.generator.base.Generator` plus a factory
registered under its name::

    from scalerl.generator.registry import register_generator

    @register_generator("mine")
    def build_mine(options, length_control, model, tokenizer, precision, *, device, seed, placement):
        return MyGenerator(model, tokenizer, precision, length_control, temperature=options.temperature, ...)

The factory receives ``options`` (the ``generator`` option: the composed config's ``generator``
node, with the fields of the option's dataclass), ``length_control`` (one
:class:`~scalerl.generator.length.LengthControl`, built once from the ``length_control`` option and
the tokenizer), the policy ``model`` it samples from, its ``tokenizer`` and
:class:`~scalerl.model.precision.Precision`, and as keywords the torch ``device``, the ``seed`` of
its random stream and the ``placement`` option (where engines run: ``bucket_mb``,
``tensor_parallel_size``, ``name``). :func:`scalerl.generator.make_generator` looks the name up.
The config side of ``generator=mine`` is an option dataclass deriving from
:class:`scalerl.config.groups.generator.GeneratorOption` registered with
``@register_option("generator", "mine")`` and ``conf/generator/mine.yaml`` (README, "Your own
generator").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalerl.config.validate import ConfigError
from scalerl.generator.base import Generator

# options, length_control, model, tokenizer, precision, *, device, seed, placement -> Generator
GeneratorFactory = Callable[..., Generator]

GENERATORS: dict[str, GeneratorFactory] = {}


def register_generator(name: str) -> Callable[[GeneratorFactory], GeneratorFactory]:
    """Register the decorated factory as generator ``name`` (see the module docstring for its
    arguments). A name is registered once."""

    def deco(factory: GeneratorFactory) -> GeneratorFactory:
        if name in GENERATORS:
            raise ValueError(f"generator {name!r} is already registered")
        GENERATORS[name] = factory
        return factory

    return deco


def get_generator(name: Any) -> GeneratorFactory:
    """The factory registered as ``name``; a one-line :class:`~scalerl.config.validate.ConfigError`
    listing the registered generators if there is none."""
    try:
        return GENERATORS[str(name)]
    except KeyError:
        known = ", ".join(sorted(GENERATORS)) or "(none registered)"
        raise ConfigError("generator.name", str(name), f"a registered generator: {known}") from None
