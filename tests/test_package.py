"""The package's layering: no import cycle (imports inside functions included), and
production code never imports the test doubles."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "llama_index_hyde_plus"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_production_module_imports_the_test_doubles() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "testing.py":
            continue
        text = path.read_text()
        assert "testing import" not in text and "import testing" not in text, path


def _all_imports(path: Path, modules: set[str]) -> set[str]:
    """Every module of the package that ``path`` imports anywhere: at module level, in
    functions and under TYPE_CHECKING (a function's import runs when it is called, so a
    cycle through it is a cycle), relative imports resolved. ``from P import name`` is
    an edge to the module ``P.name`` when there is one, else to ``P`` (the name is then
    defined in ``P``, its ``__init__`` for a package); the parents a submodule import
    loads first are not edges (an ``__init__`` runs once and, here, imports lazily)."""
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (`_all_imports`), itself excluded."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    names = set(paths)
    return {name: _all_imports(path, names) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path that closes it (``[a, b, a]``), else None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        state[start] = 1
        path, stack = [start], [iter(sorted(graph.get(start, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_find_cycle_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"b"}}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None


def test_all_imports_count_function_level_and_relative_imports(tmp_path: Path) -> None:
    module = PACKAGE / "stores" / "base.py"
    names = set(import_graph())
    found = _all_imports(module, names)
    # base.py imports models inside a function, and nodes only under TYPE_CHECKING
    assert "llama_index_hyde_plus.models" in found
    assert "llama_index_hyde_plus._checks" in found


def test_no_import_cycle_even_through_imports_in_functions() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


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
    """The ``plan.<name>`` functions ``function`` calls directly."""
    return {
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "plan"
    }


def _functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method defined in ``path``, by name."""
    return {
        n.name: n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def test_sync_and_async_search_run_the_one_written_search() -> None:
    search = PACKAGE / "search"
    methods = _functions(search / "retriever.py")
    for name in ("search", "asearch"):  # both hand the same generator to a loop
        called = {ast.unparse(n.func) for n in ast.walk(methods[name]) if isinstance(n, ast.Call)}
        assert "steps.search" in called, name
        assert not _plan_calls(methods[name]), name  # deciding is the steps' work
    written = _functions(search / "steps.py")
    decided = set().union(*(_plan_calls(f) for f in written.values()))
    assert {"question_first", "overlaps", "context_for", "wants_gate", "gate_verdict"} <= decided
    assert "plan" in decided  # the one decision function
    text = (search / "steps.py").read_text()
    assert not any(isinstance(f, ast.AsyncFunctionDef) for f in written.values())
    for io in ("await ", "asyncio", "threading", "concurrent", "run_within", "WORKERS", "door."):
        assert io not in text, io  # a step yields its I/O; only the loops carry it out


def _hands_off_to_a_loop(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` is an entry point: a docstring and a few lines that hand a
    step to a loop (``<loop>.run(...)``), or call the method that does."""
    calls = {ast.unparse(n.func) for n in ast.walk(function) if isinstance(n, ast.Call)}
    hands_off = any(c.endswith(".run") or c.startswith("self.") for c in calls)
    return len(function.body) <= 6 and hands_off


def test_no_search_step_has_a_hand_written_async_twin() -> None:
    for module in ("retriever.py", "steps.py", "plan.py", "vectors.py", "requests.py"):
        functions = _functions(PACKAGE / "search" / module)
        for name, function in functions.items():
            twin = name.replace("a", "", 1)
            if name.startswith(("a", "_a")) and twin in functions:
                assert _hands_off_to_a_loop(function), (module, name)
                assert _hands_off_to_a_loop(functions[twin]), (module, twin)


def test_both_loops_carry_out_every_request_a_step_can_make() -> None:
    import dataclasses

    from llama_index_hyde_plus.search import loops, requests

    defined = {
        kind
        for kind in vars(requests).values()
        if isinstance(kind, type)
        and dataclasses.is_dataclass(kind)
        and kind.__module__ == requests.__name__
    }
    assert defined == set(requests.REQUESTS)
    assert set(loops._BLOCKING) == defined
    assert set(loops._ASYNC) == defined


def test_the_retriever_names_no_transform() -> None:
    text = (PACKAGE / "search" / "retriever.py").read_text() + (
        PACKAGE / "search" / "plan.py"
    ).read_text()
    for name in ("HyDE", "Rocchio", "MultiQuery", "StepBack", "Decompose", "Rewrite"):
        assert f"import {name}" not in text and f" {name}(" not in text, name


#: What the ``cli``, ``server`` and ``eval`` extras bring, none of which the library needs.
APP_DEPENDENCIES = ("typer", "rich", "starlette", "uvicorn", "rcp", "ir_measures", "matplotlib")
#: The application layers: the command, the server, the evaluation, and the modules
#: only they use (the entry point, the terminal's folding of labels, which needs rich).
APP_MODULES = ("cli", "server", "evaluation", "_entry", "_folding")
#: The layers above the library, none of which ``import llama_index_hyde_plus`` loads.
APP_LAYERS = ("cli", "server", "evaluation", "local")

_BASE_INSTALL = f"""
import importlib, pkgutil, sys
BLOCKED = {APP_DEPENDENCIES!r}
for blocked in BLOCKED:  # as if not installed: an import of it fails, find_spec says None
    sys.modules[blocked] = None
import llama_index_hyde_plus as pkg
apps = sorted(
    m for m in sys.modules
    if m.startswith("llama_index_hyde_plus.") and m.split(".")[1] in {APP_LAYERS!r}
)
assert not apps, ("import llama_index_hyde_plus imported", apps)
for name in pkg.__all__:
    getattr(pkg, name)
for info in pkgutil.walk_packages(pkg.__path__, "llama_index_hyde_plus."):
    if info.name.split(".")[1] not in {APP_MODULES!r}:
        importlib.import_module(info.name)
from llama_index_hyde_plus import HyDE, TransformRetriever
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever
retriever = TransformRetriever(
    StaticRetriever({{"q3": "Renewals slipped."}}, default=["q3"]),
    HyDE(ScriptedLLM(replies=["Renewals slipped last quarter."])),
    embed_model=DeterministicEmbedding(),
)
found = retriever.search("Why did revenue drop?")
assert found.transform.hypothetical == ("Renewals slipped last quarter.",), found.transform
assert [n.node.node_id for n in found.nodes] == ["q3"], found.nodes
apps = sorted({{m.split(".")[0] for m, mod in sys.modules.items() if mod is not None}} & set(BLOCKED))
assert not apps, apps
print("library-only import ok")
"""


def test_the_library_works_without_the_cli_server_and_eval_extras() -> None:
    """A base install (no ``cli``, ``server`` or ``eval`` extra) imports every library
    module and searches; any import of those extras' packages fails the run."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _BASE_INSTALL], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "library-only import ok" in done.stdout


def test_the_base_install_lists_no_application_dependency() -> None:
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0] for d in project["dependencies"]}
    pypi = {"typer", "rich", "starlette", "uvicorn", "rcp-protocol", "ir-measures", "matplotlib"}
    assert not names & pypi, names & pypi
    extras = project["optional-dependencies"]
    assert {"typer>=0.12", "rich>=13"} <= set(extras["cli"])
    assert "llama-index-hyde-plus[cli]" in extras["local"]  # the README's demo command


def test_the_command_without_the_cli_extra_names_it() -> None:
    import subprocess
    import sys

    script = _BASE_INSTALL.split("import llama_index_hyde_plus as pkg")[0] + (
        "from llama_index_hyde_plus._entry import main\nsys.argv = ['hyde-plus', '--help']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 2
    assert "needs the 'cli' extra" in done.stderr
    assert 'pip install "llama-index-hyde-plus[cli]"' in done.stderr
