"""What a one-line error message quotes of the exception behind it."""

from __future__ import annotations


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message (at most ``limit`` characters), or its type's name when
    it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
