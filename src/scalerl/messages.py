"""One-line error messages: the base of user errors, and what a message quotes of the exception behind it."""

from __future__ import annotations

import argparse
import re


class UserError(ValueError):
    """A mistake in what the user gave (a config value, a data file): its message is one line, shown
    as it is (``error: <message>``, exit status 2)."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message (at most ``limit`` characters), or its type's name when
    it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def bind_failure(error: BaseException) -> tuple[str, bool]:
    """A socket torch.distributed could not listen on (its DistNetworkError): the reason torch gave,
    one line (``address already in use``), and whether another process holds the port."""
    text = str(error)
    return first_line(text.rsplit("message: ", 1)[-1]), "EADDRINUSE" in text or "already in use" in text


CONNECTION_FAULTS = ("Connection refused", "timed out", "Name or service not known", "Max retries exceeded")


def fault_reason(error: BaseException, *, detail: bool = False) -> str:
    """What went wrong talking to a server, short: MLflow wraps a refused connection in a paragraph
    (with the URI, which may hold credentials); this names the exception and the known cause only,
    or for another error its type (with ``detail``, and its message's first line: redact it)."""
    text = str(error)
    status = re.search(r"too many (\d{3}) error responses", text)  # urllib3's retries ran out
    if status:
        return f"{type(error).__name__}: it answered HTTP {status.group(1)}"
    for known in CONNECTION_FAULTS:
        if known in text:
            return f"{type(error).__name__}: {known}"
    return f"{type(error).__name__}: {first_line(error)}" if detail else type(error).__name__


class OneLineParser(argparse.ArgumentParser):
    """A command line's usage error is one line (not argparse's usage block), exit status 2 (the
    ``sweep.py`` and ``python -m scalerl.analysis`` parsers)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class RunError(RuntimeError):
    """A run that cannot continue; the message is for the user."""


def reader_gone() -> None:
    """Standard output's reader closed the pipe (``python train.py --cfg job | head``): the rest of
    the output goes nowhere, quietly, instead of a traceback and a second BrokenPipeError when
    Python flushes stdout at exit. Call it where the BrokenPipeError was caught; what was written
    to files stays written."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
