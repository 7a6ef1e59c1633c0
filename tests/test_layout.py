"""The package's shape: data flows one way, so no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import scalerl

ROOT = Path(scalerl.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the scalerl modules it imports anywhere in its body (lazy imports included)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in targets:
                # the longest prefix that is a scalerl module
                parts = t.split(".")
                while parts and ".".join(parts) not in modules:
                    parts.pop()
                if parts and ".".join(parts) != name:
                    deps.add(".".join(parts))
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle_in_the_package():
    # a package's __init__ re-exporting its modules is not a cycle of concerns: only edges between
    # modules that are not a package and its own children count
    graph = {
        m: {d for d in deps if not (d.startswith(m + ".") or m.startswith(d + "."))}
        for m, deps in import_graph().items()
    }
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_subprocess_goes_through_a_shell():
    """User strings (overrides, paths, URIs) reach subprocesses as argument lists, never a shell."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            shell = any(
                k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                for k in node.keywords
            )
            f = node.func
            named = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "os"
            if shell or (named and f.attr in ("system", "popen")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


# The package's layers, lowest first: a subpackage imports (anywhere, lazy imports included) only from
# its own layer's leaves below it, never upwards. config holds the options and their checks, and
# knows no task, model or tracking store; tracking (MLflow, checkpoints) and scaling (the sigmoid
# fits) know no config; the layout plans a run's processes from its config; the rollout side (async
# modes, engines), the trainer and the wall-time estimate of a run know nothing of each other; the
# loop puts the pieces together; analysis reads what runs logged; sweeps and the CLI sit on top.
LAYERS = [
    # leaves: pure tensor functions, helpers, the run's counters
    {"messages", "lock", "distributed", "transport", "algo", "state", "collector"},
    {"storage"},
    {"tracking", "scaling"},
    {"config"},
    {"task", "model", "layout"},
    {"generator"},
    {"trainer", "rollout", "estimate"},
    {"loop"},
    {"analysis"},
    {"sweep", "cli", "ship"},  # what users run: studies, the CLI, shipping warm-started bases
]


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``module -> imported`` for each import of a subpackage from its own layer or one above it."""
    layer = {pkg: i for i, pkgs in enumerate(LAYERS) for pkg in pkgs}
    bad = []
    for module, deps in graph.items():
        pkg = _package(module)
        for dep in deps:
            other = _package(dep)
            if other not in (pkg, "scalerl") and layer[other] >= layer[pkg]:
                bad.append(f"{module} -> {dep}")
    return sorted(bad)


def test_every_subpackage_has_a_layer():
    packages = {_package(m) for m in import_graph()} - {"scalerl"}
    assert packages == set().union(*LAYERS)


def test_no_subpackage_imports_from_its_layer_or_above():
    bad = upward_imports(import_graph())
    assert not bad, "upward imports: " + "; ".join(bad)


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"scalerl.tracking.tracker": {"scalerl.config"}}) == [
        "scalerl.tracking.tracker -> scalerl.config"
    ]
    assert upward_imports({"scalerl.loop.run": {"scalerl.config", "scalerl.state"}}) == []
