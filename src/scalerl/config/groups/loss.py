"""``loss``: one option per loss registered in :data:`scalerl.algo.registry.LOSSES`.

Each option's dataclass is derived from the loss's registration: its fields are the loss's
parameters (required: their values are in ``conf/loss/<name>.yaml``) and its checks are the
registry's parameter checks. A new loss is a function registered with
:func:`scalerl.algo.registry.register_loss` plus ``conf/loss/<name>.yaml``; nothing here changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import MISSING

import scalerl.algo  # noqa: F401  (registers the built-in losses)
from scalerl.algo import registry
from scalerl.config.options import OPTIONS, Option, register_option

# parameter checks whose values are numbers; other parameters are typed Any
_FLOAT_CHECKS = (registry.positive, registry.unit_interval_open)


@dataclasses.dataclass
class LossOption(Option):
    """A policy loss (paper Sec. 3.2); its fields are the loss function's keyword parameters."""

    name: str = MISSING

    def check(self):
        params = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return registry.check_loss_params(self.name, params)


def loss_option(spec: registry.LossSpec) -> type:
    """The option dataclass of a registered loss."""
    fields = [("name", str, dataclasses.field(default=spec.name))]
    for key, check in spec.params.items():
        fields.append((key, float if check in _FLOAT_CHECKS else Any, dataclasses.field(default=MISSING)))
    doc = (spec.fn.__doc__ or f"The {spec.name} loss.").strip().splitlines()[0]
    cls = dataclasses.make_dataclass(
        f"{spec.name.title().replace('_', '')}Loss", fields, bases=(LossOption,), namespace={"__doc__": doc}
    )
    cls.__module__ = __name__
    return cls


def register_losses() -> None:
    """Register an option for every loss in the algo registry that has none yet."""
    known = OPTIONS.get("loss", {})
    for name, spec in registry.LOSSES.items():
        if name not in known:
            register_option("loss", name)(loss_option(spec))


register_losses()
