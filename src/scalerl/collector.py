"""How our processes use Python's garbage collector around the objects their imports make.

torch, transformers and MLflow make a few million objects at import, and they live as long as the
process. The cyclic collector walks all of them at each of its full collections: about a dozen
while those imports run, and one more over all of them as the interpreter exits. Together that
costs seconds of every ``python train.py``, every study job, every engine and every test that
starts one (``benchmarks/results``). Two helpers keep the collector off them:

* :func:`uncollected_imports`: the heavy imports of an entry point run with the collector paused,
  and what they made is then frozen (``gc.freeze``), so that the collections of the run itself
  walk only what the run makes.
* :func:`skip_final_collection`: the last thing an entry point does; its process then ends as soon
  as its exit handlers (multiprocessing's, MLflow's, logging's) have run.

What they give up: a reference cycle among frozen objects that becomes garbage is never collected,
and cycles left at exit are left to the operating system instead of being finalised. Imports make
few cycles that die, Python does not promise to finalise objects at exit, and nothing of ours relies
on it: a run's metrics, checkpoints, summary and logs are written, flushed and closed before its
entry point returns.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def uncollected_imports() -> Iterator[None]:
    """Run the body (a process's heavy imports) with the cyclic collector paused, then freeze every
    object it tracks and resume it. Use it once, early, in a process that then runs long: it is
    not for a library call inside someone else's process (it would freeze their objects too)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def skip_final_collection() -> None:
    """Freeze every object the collector tracks now, so that the collection at this process's exit
    has nothing to walk. Call it last in an entry point (``main``, a job's call), not in a process
    that goes on working: a cycle among frozen objects that becomes garbage is never collected."""
    gc.freeze()
