"""The optional-extras check the tests use (tests/extras.py): every extra it knows is declared in
pyproject.toml, and an unknown one is refused in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from extras import EXTRAS, missing


def test_every_extra_the_tests_check_is_declared():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    declared = set(re.findall(r"^([A-Za-z0-9_-]+) = \[", section, re.M))
    assert set(EXTRAS) <= declared, declared


def test_an_unknown_extra_is_refused_and_a_missing_one_says_how_to_install_it(monkeypatch):
    with pytest.raises(ValueError, match=r"^needs_extra\('gpu'\): unknown extra; known: real, "):
        missing("gpu")
    monkeypatch.setitem(EXTRAS, "real", "no_such_module_scalerl")
    assert missing("real") == (
        "needs the real extra (no_such_module_scalerl is not installed: pip install -e '.[real]')"
    )
