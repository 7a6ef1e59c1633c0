"""One registry per config axis: every option of a group is a dataclass registered under its name.

    @register_option("async_mode", "pipeline_rl")
    @dataclass
    class PipelineRL(Option):
        name: str = "pipeline_rl"
        max_lag: int = 8

        def check(self):  # (key, value, what is allowed) for each bad value
            if self.max_lag < 1:
                yield "max_lag", self.max_lag, "an integer >= 1"

The dataclass is the option's schema: its fields are the only keys ``conf/<group>/<name>.yaml``
and the command line may set for that option (Hydra rejects others and wrongly typed values), its
defaults are the one home of the option's defaults (the YAML holds only values that differ from
them: ``tests/test_defaults_home.py``), and ``check`` holds its value checks.
Validation, ``--help``, the option-matrix tests and the MLflow group params all enumerate
:func:`options`. Groups whose options the code builds by name keep a factory in step with it (a
task's class in ``scalerl.task.TASKS``, ``POLICY_LOADERS``, ``GENERATORS``, ``ENGINES``, ``MODES``,
``NORMS``; checked by ``tests/test_config.py``); ``conf/README.md`` says what a new option needs.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterable

# The recipe's groups: the paper's design axes, which runs of one experiment compare.
RECIPE_GROUPS: tuple[str, ...] = (
    "loss",
    "correction",
    "async_mode",
    "precision",
    "aggregation",
    "norm",
    "filter",
    "length_control",
    "reward",
)
# The config groups, in the order they are shown; each has a module registering its options.
GROUPS: tuple[str, ...] = (
    *RECIPE_GROUPS,
    "model",
    "task",
    "generator",
    "trainer",
    "placement",
    "launcher",
)

# the module whose import registers each group's options (each registers its own on import)
PROVIDERS: dict[str, str] = {g: f"scalerl.config.groups.{g}" for g in GROUPS}

# Where the option schemas live in Hydra's ConfigStore: ``<SCHEMA_ROOT>/<group>/<name>``; each
# option's YAML lists ``/<SCHEMA_ROOT>/<group>/<name>@_here_`` first in its defaults.
SCHEMA_ROOT = "scalerl_schema"

OPTIONS: dict[str, dict[str, type]] = {}


class Option:
    """Base of every option dataclass: ``check`` yields (key, value, what is allowed) per bad value."""

    def check(self) -> Iterable[tuple[str, object, str]]:
        return ()


def register_option(group: str, name: str):
    """Register the decorated dataclass as option ``name`` of config group ``group``."""

    def deco(cls: type) -> type:
        fields = getattr(cls, "__dataclass_fields__", None)
        if fields is None or "name" not in fields or not issubclass(cls, Option):
            raise TypeError(
                f"option {group}={name}: {cls.__name__} must be a dataclass deriving from Option with a `name` field"
            )
        if fields["name"].default != name:
            raise TypeError(f"option {group}={name}: {cls.__name__}.name must default to {name!r}")
        known = OPTIONS.setdefault(group, {})
        if name in known and known[name] is not cls:
            raise ValueError(f"option {group}={name} is already registered ({known[name].__name__})")
        known[name] = cls
        return cls

    return deco


def make_option(group: str, name: str, fields=(), *, base: type = Option, doc: str = "", module: str) -> type:
    """Build and register the dataclass of option ``group=name`` from ``fields`` (``make_dataclass``
    triples), for options derived from another registry (losses, norms, aggregations). The class
    becomes an attribute of ``module`` so that configs typed by it pickle."""
    cls_name = "".join(p.title() for p in f"{name}_{group}".split("_"))
    cls = dataclasses.make_dataclass(
        cls_name,
        [("name", str, dataclasses.field(default=name)), *fields],
        bases=(base,),
        namespace={"__doc__": doc},
    )
    cls.__module__ = module
    setattr(sys.modules[module], cls_name, cls)
    return register_option(group, name)(cls)


def load_providers() -> None:
    for mod in PROVIDERS.values():
        importlib.import_module(mod)


def options(group: str) -> dict[str, type]:
    """The registered options of ``group``: {name: dataclass}, in registration order."""
    load_providers()
    if group not in OPTIONS:
        raise KeyError(f"no config group {group!r}: known groups are {', '.join(sorted(OPTIONS))}")
    return dict(OPTIONS[group])


def option_class(group: str, name: str) -> type:
    """The dataclass of option ``group=name``; KeyError naming the registered options if unknown."""
    known = options(group)
    if name not in known:
        raise KeyError(f"unknown option {group}={name} (available: {', '.join(known)})")
    return known[name]


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The option's own fields (``name`` excluded), in declaration order."""
    return [f for f in dataclasses.fields(cls) if f.name != "name"]


def schema_path(group: str, name: str) -> str:
    """The ConfigStore path of the option's schema, as its YAML names it in ``defaults``."""
    return f"/{SCHEMA_ROOT}/{group}/{name}@_here_"
