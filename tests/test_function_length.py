"""No function in src/scalerl is over 100 lines (issue 58): a longer one is split into named steps,
so a reader meets a recipe of steps, each short enough to hold in mind. Read with ``ast``, no
import: counted from the ``def`` line to the last line of its body, decorators aside."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "scalerl"
MAX_LINES = 100


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` of every function or method under ``root`` longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_the_function_length_check_counts_a_long_function(tmp_path):
    """The check itself: a 101-line function (a nested one too) is found, a 100-line one is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(99))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        f"def ok():\n{body}\n\nclass C:\n    def long(self):\n        def inner():\n"
        + "".join(f"            y{i} = {i}\n" for i in range(100))
    )
    assert long_functions(tmp_path / "pkg") == [
        "pkg/m.py:104 long (102 lines)",
        "pkg/m.py:105 inner (101 lines)",
    ]


def test_no_function_in_src_is_over_100_lines():
    found = long_functions(SRC)
    assert not found, "functions over 100 lines (split them into named steps):\n" + "\n".join(found)
