"""Registries that make the algorithm library extensible.

A new loss is one function plus one YAML file::

    from scalerl.algo.registry import register_loss, positive

    @register_loss("my_loss", params={"beta": positive})
    def my_loss(logp, gen_logp, advantages, mask, group_ids, *, beta):
        return ...  # per-token loss [N, T]; aggregation is applied by policy_loss

and ``conf/loss/my_loss.yaml`` stating ``beta: ...`` (the config option ``loss=my_loss``, its fields
and checks are derived from this registration by :mod:`scalerl.config.groups.loss`).

Optionally pass ``clip_indicator=fn`` to ``register_loss``: ``fn(logp, gen_logp, advantages, mask,
**params) -> bool [N, T]`` marking the tokens where the loss's clip/truncation is active; it feeds the
``clip_fraction`` diagnostic of :func:`scalerl.algo.losses.loss_stats` (NaN when absent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# A parameter check returns None when the value is fine, else a phrase saying what is allowed.
ParamCheck = Callable[[object], "str | None"]


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive(v: object) -> str | None:
    return None if _is_number(v) and v > 0 else "a number > 0"


def unit_interval_open(v: object) -> str | None:
    return None if _is_number(v) and 0 < v < 1 else "a number in (0, 1)"


@dataclass(frozen=True)
class LossSpec:
    name: str
    fn: Callable
    params: dict[str, ParamCheck] = field(default_factory=dict)
    clip_indicator: Callable | None = None
    doc: str | None = None  # one line for --help (default: the first line of fn's docstring)


LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    params: dict[str, ParamCheck] | None = None,
    *,
    clip_indicator: Callable | None = None,
    doc: str | None = None,
) -> Callable[[Callable], Callable]:
    """Register a per-token loss function under ``name`` with its parameter checks.

    ``clip_indicator`` (optional) marks the tokens where the loss clips; see the module docstring.
    Without one, ``train/clip_fraction`` is logged as NaN: a loss that never clips passes one that
    is always False, so the metric reads 0.
    ``doc``: the option's one line in ``--help`` when one function is registered under several names,
    and only where ``conf/loss/<name>.yaml`` has no opening comment: ``--help`` shows the first
    sentence of that comment, so write it there.
    """

    def deco(fn: Callable) -> Callable:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = LossSpec(
            name=name, fn=fn, params=dict(params or {}), clip_indicator=clip_indicator, doc=doc
        )
        return fn

    return deco


def get_loss(name: str) -> LossSpec:
    """The registered :class:`LossSpec` for ``name``; ValueError listing the registered names if unknown."""
    try:
        return LOSSES[name]
    except KeyError:
        known = ", ".join(sorted(LOSSES)) or "(none registered)"
        raise ValueError(f"unknown loss {name!r}: registered losses are {known}") from None


def check_loss_params(name: str, params: dict[str, object]) -> list[tuple[str, object, str]]:
    """Problems with ``params`` for loss ``name``: a list of (key, value, what is allowed)."""
    if name not in LOSSES:
        return [("name", name, "one of " + ", ".join(sorted(LOSSES)))]
    problems = []
    for key, check in LOSSES[name].params.items():
        value = params.get(key)
        msg = check(value)
        if msg is not None:
            problems.append((key, value, msg))
    return problems
