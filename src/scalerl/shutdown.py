"""How a process of ours ends: without the interpreter's last sweep over every object it holds.

A training process holds millions of objects that torch, transformers and MLflow made at import and
that live until the end. As it exits, Python clears its modules and runs a last garbage collection
over all of them, which costs seconds of every ``python train.py``, every study job and every test
that starts one (``benchmarks/results``). :func:`skip_final_collection` freezes them first
(``gc.freeze``): the collector no longer looks at them, and the process ends once its exit handlers
(multiprocessing's, MLflow's, logging's) have run.

What it gives up: unreachable reference cycles among those objects are left to the operating
system instead of being finalised. Python does not promise to finalise objects at exit either, and
nothing of ours relies on it: a run's metrics, checkpoints, summary and logs are written, flushed
and closed before the process returns from its entry point.
"""

from __future__ import annotations

import gc


def skip_final_collection() -> None:
    """Freeze every object the collector tracks now, so that the collection at this process's exit
    has nothing to walk. Call it last in an entry point (``main``, a job's call), not in a process
    that goes on working: a cycle among frozen objects that becomes garbage is never collected."""
    gc.freeze()
