"""The engines' fork server: the multiprocessing context local engine processes start from, and its
early start. Light to import (the standard library only), so that ``train.py`` can start the
server before its own heavy imports (:func:`prestart`).

``forkserver`` where the platform has it: the server imports torch, transformers and scalerl
(:mod:`scalerl.rollout.preload`) on a core of its own while the trainer imports and builds its
model, and each engine process is then forked from it, its imports done. The server is a fresh
single-threaded process (no OpenMP pool, no CUDA context), which is what makes forking from it
safe, and lets each engine choose its GPUs before CUDA starts. Elsewhere: ``spawn``.
"""

from __future__ import annotations

import multiprocessing as mp

# imported once, by the fork server, before the engine processes are forked from it
PRELOAD = ["scalerl.rollout.preload"]


def process_context():
    """The multiprocessing context of local engine processes (the same object torch.multiprocessing
    gives: torch registers its tensor reductions on import, in every process that imports it)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def prestart() -> None:
    """Start the fork server now (a no-op once it runs), so that its imports overlap with the
    caller's."""
    ctx = process_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()
