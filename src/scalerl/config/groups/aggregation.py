"""``aggregation``: one option per loss aggregation in :data:`scalerl.algo.AGGREGATIONS` (no parameters)."""

from __future__ import annotations

from scalerl.algo.aggregation import AGGREGATIONS
from scalerl.config.options import make_option

for _name in AGGREGATIONS:
    make_option(
        "aggregation", _name, doc=f"Loss aggregation {_name!r} (scalerl.algo.aggregate).", module=__name__
    )
