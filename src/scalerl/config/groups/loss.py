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
from scalerl.config.options import OPTIONS, Option, make_option

# parameter checks whose values are numbers; other parameters are typed Any
_FLOAT_CHECKS = (registry.positive, registry.unit_interval_open)


@dataclasses.dataclass
class LossOption(Option):
    """A policy loss (paper Sec. 3.2); its fields are the loss function's keyword parameters."""

    name: str = MISSING

    def check(self):
        params = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return registry.check_loss_params(self.name, params)


def register_losses() -> None:
    """Register an option for every loss in the algo registry that has none yet: its fields are the
    loss's parameters (required; numbers where the registry's check says so)."""
    known = OPTIONS.get("loss", {})
    for name, spec in registry.LOSSES.items():
        if name in known:
            continue
        fields = [
            (key, float if check in _FLOAT_CHECKS else Any, dataclasses.field(default=MISSING))
            for key, check in spec.params.items()
        ]
        doc = spec.doc or (spec.fn.__doc__ or f"The {name} loss.").strip().splitlines()[0]
        make_option("loss", name, fields, base=LossOption, doc=doc, module=__name__)


register_losses()
