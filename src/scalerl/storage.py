"""Files that hold no code: tensors and plain Python values (numbers, strings, lists, tuples, dicts),
written atomically and loaded with ``torch.load(weights_only=True)``, so a crafted file cannot run
code when it is loaded."""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch

from scalerl.messages import first_line


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message is one line for the user."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding objects other than tensors and plain values: refused, never skipped."""


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, fsync, rename into place (the temporary
    file is removed when the save fails, e.g. on a full disk: OSError ENOSPC)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:  # a file object: the disk's own errors reach Python as OSError
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        # torch's zip writer raises "unexpected pos ..." as it closes over what stopped the write:
        # the disk's error, or a signal that stops the run at once (which must reach the caller as
        # itself, e.g. to exit 130)
        if isinstance(e, RuntimeError) and isinstance(e.__context__, OSError | KeyboardInterrupt):
            raise e.__context__ from None
        raise
    _fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as :func:`save_atomic` writes a checkpoint: a temporary file beside
    it, fsynced, renamed into place, the rename fsynced. A crash or a power loss leaves the old file
    or the new one, never an empty or half-written one; a full disk raises OSError and leaves the
    old file (the temporary one removed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as JSON in ``path``, atomically and durably (:func:`write_text_atomic`); a value JSON
    has no type for (a path, a date) is written as its text."""
    write_text_atomic(path, json.dumps(obj, indent=1, default=str))


def _fsync_dir(folder: Path) -> None:
    """A rename in ``folder`` reaches the disk."""
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - directories cannot be fsynced on some systems
        pass


def load_safe(path: Path) -> dict:
    """A checkpoint file's contents, loaded without running any code; CheckpointError (one line)
    if it is unreadable, truncated, not a checkpoint, or holds objects other than tensors and plain
    values."""
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol: refused below in one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"(?:Unsupported global|Unsupported operand)[^\n.]*", str(e))
        what = f" ({found.group(0).strip()})" if found else ""
        raise UnsafeCheckpointError(
            f"checkpoint {path} holds objects other than tensors and plain values{what}: refused, since "
            "loading it could run code"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        raise _corrupt(path, e) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is not a scalerl checkpoint (a {type(state).__name__})")
    return state


def check_no_code(path: Path, allowed: frozenset[str] = frozenset()) -> None:
    """Refuse (UnsafeCheckpointError) a ``torch.save`` file that a library will load with
    ``weights_only=False``: every global its pickle names must be one ``weights_only`` loading allows,
    or in ``allowed`` (plain data classes of that library). Reads the pickle, not the tensors."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as e:  # not a torch.save zip file, or truncated
        raise _corrupt(path, e) from None
    unsafe = sorted(set(names) - allowed)
    if unsafe:
        raise UnsafeCheckpointError(
            f"checkpoint {path} names {', '.join(unsafe[:3])}, not tensors and plain values: refused, "
            "since loading it could run code"
        )


def _corrupt(path: Path, e: BaseException) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} is truncated or corrupt: {first_line(e)}")
