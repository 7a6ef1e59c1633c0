"""One-line error messages: the base of user errors, and what a message quotes of the exception behind it."""

from __future__ import annotations

import argparse


class UserError(ValueError):
    """A mistake in what the user gave (a config value, a data file): its message is one line, shown
    as it is (``error: <message>``, exit status 2)."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message (at most ``limit`` characters), or its type's name when
    it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


class OneLineParser(argparse.ArgumentParser):
    """A command line's usage error is one line (not argparse's usage block), exit status 2 (the
    ``sweep.py`` and ``python -m scalerl.analysis`` parsers)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
