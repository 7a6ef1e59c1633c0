"""Locks between processes that name their holder: one run per output directory, one builder per
warm-start cache entry.

A lock is ``flock`` on a file that holds its holder's pid, host and start time (JSON). The kernel
releases it when its holder dies, however it dies; a holder that releases it empties the file, so a
file that still names a holder when the lock is taken was left by a process that died holding it
(reported as recovered).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("scalerl")


class LockBusy(RuntimeError):
    """The lock is held by another live process; the message is one line naming it."""


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("since", 0)))
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {since})"


def read_holder(path: Path) -> dict | None:
    """Who the lock file says holds it (None: nobody, or unreadable)."""
    try:
        text = Path(path).read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None


def out_dir_lock(out_dir: str | Path) -> tuple[Path, str]:
    """(lock file, what it locks) of a run's output directory: one process runs in it at a time."""
    return Path(out_dir) / ".lock", f"out_dir {out_dir}"


def busy(path: str | Path, what: str) -> str | None:
    """The one-line LockBusy message if another live process holds the lock ``path`` now, else None
    (also when the file does not exist: nothing is created). A probe: it holds nothing, so the
    answer can change at once; :func:`hold` decides."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return f"{what} is in use by {_describe(read_holder(Path(path)))}; lock file {path}"
    except OSError:  # a file system without locks: hold() says so
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextmanager
def hold(path: str | Path, what: str, *, wait: bool, every: float = 30.0):
    """Hold the lock ``path`` for the ``with`` block. ``what``: the locked thing, for messages.
    ``wait=False``: LockBusy at once if another process holds it. ``wait=True``: wait for it, saying
    what it waits for and for whom, and again every ``every`` seconds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        t0 = time.monotonic()
        said = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = read_holder(path)
                if not wait:
                    raise LockBusy(f"{what} is in use by {_describe(holder)}; lock file {path}") from None
                if said is None or time.monotonic() - said >= every:
                    waited = time.monotonic() - t0
                    log.warning(
                        "waiting for %s, held by %s (waited %.0f s so far); lock file %s",
                        what,
                        _describe(holder),
                        waited,
                        path,
                    )
                    said = time.monotonic()
                time.sleep(0.2)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                log.warning(
                    "cannot lock %s (%s on %s): nothing keeps a second process out", what, e.strerror, path
                )
                yield
                return
        left = read_holder(path)
        if left and left.get("pid") != os.getpid():
            log.warning(
                "recovered the lock on %s left by %s, which is no longer running", what, _describe(left)
            )
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
