"""Credentials never leave the process: a password inside a URI is masked wherever a value is
logged (MLflow params, the config artifact, ``run_info.json``, console lines)."""

from __future__ import annotations

import re

# scheme://user:password@host  ->  scheme://user:***@host (also a token given as the user alone)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")
MASK = "***"


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it masked."""

    def mask(m: re.Match) -> str:
        user, sep, _ = m.group("userinfo").partition(":")
        return f"{m.group('scheme')}{user}:{MASK}@" if sep else f"{m.group('scheme')}{MASK}@"

    return _USERINFO.sub(mask, text)


def redact_tree(obj):
    """A copy of a nested dict/list with every string redacted."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_tree(v) for v in obj)
    return obj
