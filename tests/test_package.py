"""The package's layering: no import cycle at module load, and production code never
imports the test doubles."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "llama_index_hyde_plus"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports when it is loaded (imports inside
    functions and under TYPE_CHECKING run later or never, so they cannot cycle)."""
    tree = ast.parse(path.read_text())
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE.name))
    return found


def test_no_production_module_imports_the_test_doubles() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "testing.py":
            continue
        text = path.read_text()
        assert "testing import" not in text and "import testing" not in text, path


def test_no_import_cycle_when_modules_load() -> None:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {
        name: {m for m in _top_level_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    # a package's __init__ importing its own children is not a cycle of concern
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [])


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


def _plan_calls(function: ast.AST) -> set[str]:
    """The ``plan.<name>`` functions ``function`` calls, directly or through a method
    of the same class it calls as ``self.<name>``."""
    return {
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "plan"
    }


def test_sync_and_async_search_execute_the_same_plan() -> None:
    tree = ast.parse((PACKAGE / "retriever.py").read_text())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TransformRetriever"
    )
    methods = {
        n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    planned = _plan_calls(methods["_planned"])
    assert "plan" in planned  # the one decision function
    sync = _plan_calls(methods["search"])
    asynchronous = _plan_calls(methods["asearch"])
    assert sync == asynchronous, (sync, asynchronous)
    assert {"question_first", "context_for", "wants_gate", "gate_verdict"} <= sync
    for name in ("search", "asearch"):
        called = {
            n.func.attr
            for n in ast.walk(methods[name])
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        assert "_planned" in called, name


def test_the_retriever_names_no_transform() -> None:
    text = (PACKAGE / "retriever.py").read_text() + (PACKAGE / "plan.py").read_text()
    for name in ("HyDE", "Rocchio", "MultiQuery", "StepBack", "Decompose", "Rewrite"):
        assert f"import {name}" not in text and f" {name}(" not in text, name
