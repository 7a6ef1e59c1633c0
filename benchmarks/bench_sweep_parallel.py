"""Runs at once in a local sweep: the throughput of N identical runs one at a time against N at once.

A local sweep runs ``launcher.max_parallel`` runs at once (0: one a core per task), each with its
share of the cores as ``trainer.threads``. This measures, on this machine, what that choice costs:
the same ``train.py`` runs (the leave-one-out study's settings by default, seeds 0..N-1, in fresh
folders sharing one warm cache) started all at once with one share each, then one after another
with all the cores each (what ``max_parallel=1`` gives), ``--rounds`` times, the order alternating
(``--first-round 1`` starts with one at a time).

    python benchmarks/bench_sweep_parallel.py                       # 2 runs of 100 steps
    python benchmarks/bench_sweep_parallel.py --runs 2 -- trainer.total_steps=300
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path

import common

from scalerl.config.errors import override_key
from scalerl.sweep import load_spec
from scalerl.sweep.launch import local_threads

ROOT = common.ROOT
# the leave-one-out study's run settings (sweeps/loo.yaml's base), 100 steps
LOO = [
    *(o for o in load_spec(ROOT / "sweeps" / "loo.yaml").base if override_key(o) != "trainer.total_steps"),
    "trainer.total_steps=100",
    "progress=log",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--first-round", type=int, default=0)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SCALERL_CACHE"] = str(Path(tmp) / "cache")
        # the shipped base model into the cache, so no timed run pays for it
        warm = Path(tmp) / "warm"
        warm.mkdir()
        common.wait_train(
            [common.start_train(warm, 0, [*LOO, *a.overrides, "trainer.total_steps=1", "eval.every=1000"])]
        )
        for r in range(a.first_round, a.first_round + a.rounds):
            for how in common.in_turn(("at once", "one at a time"), r):
                folder = Path(tmp) / f"{r}-{how.replace(' ', '-')}"
                folder.mkdir()
                t0 = time.time()
                if how == "at once":  # each run the share of the cores the local launcher gives it
                    share = local_threads(
                        {"max_parallel": a.runs, "nodes": 1, "tasks_per_node": 1}, a.overrides
                    )
                    common.wait_train(
                        [common.start_train(folder, s, [*LOO, *a.overrides, *share]) for s in range(a.runs)]
                    )
                else:
                    for s in range(a.runs):
                        common.wait_train(
                            [common.start_train(folder, s, [*LOO, *a.overrides, "trainer.threads=0"])]
                        )
                wall = time.time() - t0
                rows.append({"round": r, "how": how, "runs": a.runs, "wall_s": round(wall, 1)})
                print(json.dumps(rows[-1]), flush=True)
    print(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "cpu": common.cpu_model(),
                "cores": cores,
                "commit": common.commit(),
                "load_after": common.loadavg(),
                "settings": LOO + a.overrides,
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
