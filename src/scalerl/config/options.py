"""One registry per config axis: every option of a group is a dataclass registered under its name.

    @register_option("async_mode", "pipeline_rl")
    @dataclass
    class PipelineRLOptions(Option):
        name: str = "pipeline_rl"
        max_lag: int = 8

        def check(self):  # (key, value, what is allowed) for each bad value
            if self.max_lag < 1:
                yield "max_lag", self.max_lag, "an integer >= 1"

Validation, factories, ``--help``, the option-matrix tests and the MLflow group params all
enumerate :func:`options`; nothing else lists a group's options.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

OPTIONS: dict[str, dict[str, type]] = {}


class Option:
    """Base of every option dataclass: ``check`` yields (key, value, what is allowed) per bad value."""

    def check(self) -> Iterable[tuple[str, object, str]]:
        return ()


# modules whose import registers options (each registers its own on import)
PROVIDERS: list[str] = []


def register_option(group: str, name: str):
    """Register the decorated dataclass as option ``name`` of config group ``group``."""

    def deco(cls: type) -> type:
        fields = getattr(cls, "__dataclass_fields__", None)
        if fields is None or "name" not in fields or not issubclass(cls, Option):
            raise TypeError(
                f"option {group}={name}: {cls.__name__} must be a dataclass deriving from Option with a `name` field"
            )
        known = OPTIONS.setdefault(group, {})
        if name in known and known[name] is not cls:
            raise ValueError(f"option {group}={name} is already registered ({known[name].__name__})")
        known[name] = cls
        return cls

    return deco


def load_providers() -> None:
    for mod in PROVIDERS:
        importlib.import_module(mod)


def options(group: str) -> dict[str, type]:
    """The registered options of ``group``: {name: dataclass}."""
    load_providers()
    if group not in OPTIONS:
        raise KeyError(f"no config group {group!r}: known groups are {', '.join(sorted(OPTIONS))}")
    return dict(OPTIONS[group])
