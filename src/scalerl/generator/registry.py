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

What the rest of the run decides about a generator (whether it samples from the trainer's module,
the names its weights travel under, how many sequences an engine keeps running, the options an
engine process builds it with) it asks of the generator's class, never of its name: the attributes
and class methods of :class:`~scalerl.generator.base.Generator`, whose defaults are the ``hf``
generator's. Where the decision comes before any generator exists (the trainer's side of the
engines, the setup), :func:`generator_class` answers from the option's name: the class registered
with the factory (``@register_generator("mine", generator=MyGenerator)``, or the factory itself when
it is the class), else the base class, so a generator that declares nothing is treated as ``hf`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalerl.config.validate import ConfigError
from scalerl.generator.base import Generator

# options, length_control, model, tokenizer, precision, *, device, seed, placement -> Generator
GeneratorFactory = Callable[..., Generator]

GENERATORS: dict[str, GeneratorFactory] = {}
# name -> the class its factory builds, where known (the capabilities are read from it)
_CLASSES: dict[str, type[Generator]] = {}


def register_generator(
    name: str, *, generator: type[Generator] | None = None
) -> Callable[[GeneratorFactory], GeneratorFactory]:
    """Register the decorated factory as generator ``name`` (see the module docstring for its
    arguments). ``generator``: the class it builds, whose attributes say what the run may ask of
    it (:func:`generator_class`); a factory that is itself a Generator class needs none. A name is
    registered once."""

    def deco(factory: GeneratorFactory) -> GeneratorFactory:
        if name in GENERATORS:
            raise ValueError(f"generator {name!r} is already registered")
        GENERATORS[name] = factory
        cls = generator
        if cls is None and isinstance(factory, type) and issubclass(factory, Generator):
            cls = factory
        if cls is not None:
            _CLASSES[name] = cls
        return factory

    return deco


def unregister_generator(name: str) -> None:
    """Forget generator ``name`` (tests that register one of their own)."""
    GENERATORS.pop(name, None)
    _CLASSES.pop(name, None)


def generator_class(name: Any) -> type[Generator]:
    """The class whose attributes answer for generator ``name`` before one is built: the class
    registered with its factory, else :class:`~scalerl.generator.base.Generator` itself (the
    ``hf`` generator's answers: samples from the trainer's module, state-dict names, no sleep
    mode, one training batch of sequences per engine). An unregistered name is the one-line
    :class:`~scalerl.config.validate.ConfigError` of :func:`get_generator`."""
    get_generator(name)
    return _CLASSES.get(str(name), Generator)


def get_generator(name: Any) -> GeneratorFactory:
    """The factory registered as ``name``; a one-line :class:`~scalerl.config.validate.ConfigError`
    listing the registered generators if there is none."""
    try:
        return GENERATORS[str(name)]
    except KeyError:
        known = ", ".join(sorted(GENERATORS)) or "(none registered)"
        raise ConfigError("generator.name", str(name), f"a registered generator: {known}") from None
