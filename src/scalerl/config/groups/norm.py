"""``norm``: one option per advantage normalisation in :data:`scalerl.algo.NORMS` (no parameters)."""

from __future__ import annotations

from scalerl.algo.advantages import NORMS
from scalerl.config.options import make_option

for _name in NORMS:
    make_option(
        "norm", _name, doc=f"Advantage norm {_name!r} (scalerl.algo.compute_advantages).", module=__name__
    )
