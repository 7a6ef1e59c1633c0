"""The engines' fork server: the multiprocessing context local engine processes start from, and its
start. Light to import (the standard library only).

``forkserver`` where the platform has it: each engine process is forked from the server, its imports
(torch, transformers, scalerl: :data:`PRELOADED`) done. The server is a process that has done
nothing but import (no OpenMP pool, no CUDA context, no thread of Python's but its own), which is
what makes forking from it safe, and lets each engine choose its GPUs before CUDA starts.
Elsewhere: ``spawn``. It is started in one of two ways:

* :func:`fork_here`: an entry point (``train.py``, a sweep's job) whose own imports are done forks
  the server from itself, so the server imports nothing. Those imports are seconds of CPU that a
  server started anew repeats in every run (every run of a study, every run a test starts).
* :func:`prestart`: multiprocessing's own way, a new interpreter that imports the preload on
  another core while the caller goes on; where a fork would not be safe, and in a process that is
  not an entry point (a test's, a notebook's).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import threading

# imported once, by the fork server, before the engine processes are forked from it
PRELOAD = ["scalerl.rollout.preload"]
# what the preload imports: the generator, the model builder and the tasks, with torch and
# transformers under them
PRELOADED = (
    "scalerl.generator",
    "scalerl.generator.hf",
    "scalerl.model.build",
    "scalerl.task",
    "scalerl.task.score",
)


def process_context():
    """The multiprocessing context of local engine processes (the same object torch.multiprocessing
    gives: torch registers its tensor reductions on import, in every process that imports it)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def local_engines(async_mode, placement) -> bool:
    """Whether a run with these ``async_mode`` and ``placement`` options (composed or typed) starts
    engine processes on its own machine: a pipeline_rl run, unless its engines are tasks of its job
    (``placement.generator_tasks``: a generator task serves as an engine itself and forks none)."""
    return async_mode.name == "pipeline_rl" and int(getattr(placement, "generator_tasks", 0) or 0) == 0


def prestart() -> None:
    """Start the fork server now as a new interpreter (a no-op once it runs), so that its imports
    overlap with the caller's."""
    ctx = process_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def import_preloaded() -> None:
    """Import what the fork server preloads, in this process (an entry point, inside its
    :func:`~scalerl.collector.uncollected_imports`), before :func:`fork_here`."""
    for name in PRELOADED:
        importlib.import_module(name)


def fork_here() -> bool:
    """Start the fork server as a fork of this process (a no-op once it runs): for an entry point
    that has imported :data:`PRELOADED` (:func:`import_preloaded`) and done nothing else yet. The
    server then runs multiprocessing's own server code in a process that is as a new one would be
    after the same imports: every descriptor but the standard streams and the server's own let go
    of (an ``out_dir`` lock, a store, the pipe a new server would not hold), the signal handlers and
    the logging set up since start-up back to an interpreter's defaults. Where a fork is not safe (a
    thread of Python's besides this one, CUDA started) or cannot be done, :func:`prestart` instead.
    Returns whether this call forked the server."""
    ctx = process_context()
    if ctx.get_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver, util

    if not _safe_to_fork():
        prestart()
        return False
    spawnv_passfds = util.spawnv_passfds
    forked: list[int] = []

    def fork_server(path, args, passfds):  # called by ensure_running as it starts a server
        code = args[args.index("-c") + 1] if "-c" in args[:-1] else ""
        if "multiprocessing.forkserver" not in code:  # the resource tracker, or a command not known here
            return spawnv_passfds(path, args, passfds)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            util.spawnv_passfds = spawnv_passfds  # the server and its engines start others as usual
            _serve(code, passfds)  # never returns
        forked.append(pid)
        return pid

    util.spawnv_passfds = fork_server
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = spawnv_passfds
    return bool(forked)


def _safe_to_fork() -> bool:
    """On Linux (whose ``/proc/self/fd`` lists the descriptors the server must let go of), no thread
    of Python's but this one (a native library's own, like the BLAS pool that importing numpy
    starts, is what a new server has too), and CUDA not started."""
    if not sys.platform.startswith("linux") or threading.active_count() != 1:
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def _serve(code: str, passfds) -> None:
    """In the forked server: become what ``python -c code`` with ``passfds`` would start as, then run
    ``code`` (multiprocessing's server loop, until every process that uses it has ended) and leave
    without the interpreter's finalisation, as the preload's server does."""
    status = 0
    try:
        _as_new_process({0, 1, 2, *map(int, passfds)})
        exec(code, {"__name__": "__main__"})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 0
    except BaseException:  # noqa: BLE001 - reported, then the server ends
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def _as_new_process(keep: set[int]) -> None:
    """What a new interpreter started by exec would not have: descriptors other than ``keep`` (each
    pointed at /dev/null rather than closed, so that a Python object still holding its number never
    closes another's), Python's signal handlers (exec resets a caught signal; SIGINT gets Python's
    own), a wakeup descriptor, logging's handlers and level, and a locked server state."""
    import gc
    import logging
    import signal
    from multiprocessing import forkserver

    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd != null:
            try:
                os.fstat(fd)
            except OSError:
                continue  # the listing's own, closed already
            os.dup2(null, fd, inheritable=False)
    os.close(null)
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    forkserver._forkserver._lock = threading.Lock()  # held by ensure_running in the process forked
    gc.freeze()  # what the engines inherit, their collections need not walk
