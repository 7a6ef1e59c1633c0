"""Small value checks shared by the option dataclasses: each returns (key, value, allowed) or None."""

from __future__ import annotations

import math
from collections.abc import Iterable


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def one_of(key: str, value: object, choices: Iterable[str]):
    choices = tuple(choices)
    if value not in choices:
        return key, value, "one of " + ", ".join(choices)
    return None


def at_least(key: str, value: object, low: float, prefix: str = "an integer "):
    """``value >= low``; the message reads ``<prefix>>= <low>``."""
    if not _num(value) or value < low:
        return key, value, f"{prefix}>= {low}"
    return None


def in_range(key: str, value: object, low: int, high: int):
    """An integer in ``low..high`` (both included)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return key, value, f"an integer in {low}..{high}"
    return None


# torch takes seeds below 2**64 and the run derives others from a seed by multiplying it by about
# a million: seeds of 32 bits (numpy's range) stay in range
MAX_SEED = 2**32 - 1


def seed(key: str, value: object):
    """A seed torch takes, and every seed the run derives from it."""
    return in_range(key, value, 0, MAX_SEED)


def positive(key: str, value: object):
    if not _num(value) or value <= 0:
        return key, value, "> 0"
    return None


def in_unit(key: str, value: object, *, low_open: bool = False, high_open: bool = False):
    ok = _num(value) and (0 < value if low_open else 0 <= value) and (value < 1 if high_open else value <= 1)
    if not ok:
        return key, value, f"a number in {'(' if low_open else '['}0, 1{')' if high_open else ']'}"
    return None


def non_finite(value: object, key: str = ""):
    """The first float inside ``value`` (a dataclass, mapping, list or number) that is inf or nan, as
    (key, value, allowed), else None. Every number a config sets must be finite."""
    import dataclasses

    if isinstance(value, float):
        return None if math.isfinite(value) else (key, value, "a finite number")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        if any(non_finite(v) is not None for v in value):
            return key, list(value), "finite numbers"
        return None
    else:
        return None
    for k, v in items:
        r = non_finite(v, f"{key}.{k}" if key else str(k))
        if r is not None:
            return r
    return None


def no_warmstart_examples(steps: object, task_name: str):
    """``model.warmstart_steps`` > 0 for ``model=tiny`` on a task with no worked examples to warm-start
    it on (a data file): (key, value, allowed). Said by the run's preflight and by the model loader."""
    return (
        "model.warmstart_steps",
        steps,
        f"0 with task={task_name} and model=tiny: the task has no worked examples to warm-start it on "
        "(0: it starts from random weights); for real data a pretrained model, model=hf or model=smollm2",
    )


def problems(*results) -> Iterable[tuple[str, object, str]]:
    """The non-None results, in order."""
    return [r for r in results if r is not None]
