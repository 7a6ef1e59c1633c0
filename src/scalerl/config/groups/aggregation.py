"""``aggregation``: one option per loss aggregation in :data:`scalerl.algo.AGGREGATIONS` (no parameters)."""

from __future__ import annotations

import dataclasses

from scalerl.algo.aggregation import AGGREGATIONS, aggregate
from scalerl.config.options import Option, register_option

for _name in AGGREGATIONS:
    register_option("aggregation", _name)(
        dataclasses.make_dataclass(
            f"{_name.title()}Aggregation",
            [("name", str, dataclasses.field(default=_name))],
            bases=(Option,),
            namespace={"__doc__": f"Loss aggregation {_name!r}: see {aggregate.__module__}.aggregate."},
        )
    )
