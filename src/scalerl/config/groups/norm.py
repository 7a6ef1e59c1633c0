"""``norm``: one option per advantage normalisation in :data:`scalerl.algo.NORMS` (no parameters)."""

from __future__ import annotations

import dataclasses

from scalerl.algo.advantages import NORMS, compute_advantages
from scalerl.config.options import Option, register_option

for _name in NORMS:
    register_option("norm", _name)(
        dataclasses.make_dataclass(
            f"{_name.title()}Norm",
            [("name", str, dataclasses.field(default=_name))],
            bases=(Option,),
            namespace={
                "__doc__": f"Advantage norm {_name!r}: see {compute_advantages.__module__}.compute_advantages."
            },
        )
    )
