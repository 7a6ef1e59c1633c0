"""How our processes start and end around the objects their imports make.

torch, transformers and MLflow make a few million objects at import, and they live as long as the
process. Python's cyclic collector walks all of them at each full collection: about a dozen while
those imports run, then several more while the interpreter shuts down, clearing module after
module. That costs seconds of every ``python train.py``, every study and every test that starts one
(``benchmarks/results``). Two helpers keep the collector off them:

* :func:`uncollected_imports`: an entry point's heavy imports run with the collector paused, and
  what they made is then frozen (``gc.freeze``), so that the collections of the run itself walk only
  what the run makes. A process that ends the ordinary way unfreezes them first (an exit handler),
  so that its shutdown is the one Python always made: some extension modules (triton's) report the
  objects a shutdown did not free as leaks.
* :func:`long_lived`: a training loop runs with the run's built parts frozen too (its model, its
  task's prompts, what its setup imported), where the entry point froze its imports.
* :func:`end_process`: how ``train.py`` and ``sweep.py`` end: what an ordinary exit does that
  matters (wait for the threads that are not daemons, run the exit handlers: multiprocessing's,
  MLflow's, logging's, then flush the standard streams), without the interpreter's finalisation.
  Nothing of ours relies on finalisation, which Python does not promise either: a run's metrics,
  checkpoints, summary and logs are written and closed before its entry point returns.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn


@contextmanager
def uncollected_imports() -> Iterator[None]:
    """Run the body (a process's heavy imports) with the cyclic collector paused, then freeze every
    object it tracks and resume it. For a process's own entry point (or a fork server's preload),
    not for a library call inside someone else's process (it would freeze their objects too)."""
    global _entry_froze
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        _entry_froze = True
        _unfreeze_at_exit()
        if was:
            gc.enable()


_entry_froze = False  # this process's entry point froze its imports (uncollected_imports)


@contextmanager
def long_lived() -> Iterator[None]:
    """Run the body (a training loop) with every object alive now frozen as well: a run's built parts
    (its model, its task's prompts, the modules its setup imported) live as long as the loop, and the
    full collections a long loop makes would otherwise walk them each time. Unfrozen after, so that a
    process that runs one run after another (Hydra's multirun) collects a finished run's parts. Only
    where this process's entry point froze its imports (:func:`uncollected_imports`); elsewhere (a
    library call in someone else's process: a test, a notebook) a no-op, as freezing and
    unfreezing would reach their objects too."""
    if not _entry_froze:
        yield
        return
    gc.collect()  # the setup's garbage is not frozen with the parts
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@functools.cache
def _unfreeze_at_exit() -> None:
    """Once a process: unfreeze last of the exit handlers (they run in reverse order)."""
    atexit.register(gc.unfreeze)


def end_at_exit() -> None:
    """Make this process's ordinary exit end it without the interpreter's finalisation: an exit
    handler registered now, and so run before those registered earlier, flushes the standard
    streams and leaves (``os._exit``) with status 0. For a server process whose own end nobody
    reads and that holds nothing to finalise (the engines' fork server): it then leaves no
    finalisation running in a pipe its parent's caller is reading to its end."""
    atexit.register(_leave)


def _leave() -> None:
    _flush_std()
    os._exit(0)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left
            pass


def run_as_program(entry: Callable[[], int | None]) -> NoReturn:
    """Run ``entry`` (an entry point's body), then end the process with its status (what it
    returns, None as 0, or the status of the ``SystemExit`` it raises) by :func:`end_process`. Any
    other exception ends the process the ordinary way, with its traceback."""
    try:
        status = entry()
    except SystemExit as e:
        end_process(_exit_status(e))
    end_process(status or 0)


def _exit_status(exc: SystemExit) -> int:
    """The status an ordinary exit by ``exc`` would end the process with (printing a message that is
    not a number to stderr, as Python does)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def end_process(status: int) -> NoReturn:
    """End this process with ``status`` now: wait for its threads that are not daemons, run its exit
    handlers and flush stdout and stderr, as an ordinary exit would, then leave without the
    interpreter's finalisation (``os._exit``). The last call of an entry point that runs as its own
    program, never inside another process (pytest's, a job's)."""
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    _flush_std()
    os._exit(status)
