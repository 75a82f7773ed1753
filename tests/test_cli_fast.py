"""The command line answers ``--version``, ``--help`` and argument errors before it
imports LlamaIndex, FAISS or numpy (seconds on a small machine), and its light copies
of names and messages agree with the modules that import them."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llama_index_hyde_plus import __version__
from llama_index_hyde_plus.cli import _early as early
from llama_index_hyde_plus.cli import _names as names
from llama_index_hyde_plus.cli import app, models_app

#: Runs ``hyde-plus ARGS`` as the console script does, in this fresh process, then
#: prints the exit code and the top-level packages it imported as JSON on stderr.
PROBE = textwrap.dedent(
    """
    import json, sys
    from llama_index_hyde_plus._entry import main
    sys.argv = ["hyde-plus", *sys.argv[1:]]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    loaded = sorted({name.split(".")[0] for name in sys.modules})
    print("\\nPROBE " + json.dumps({"code": code, "modules": loaded}), file=sys.stderr)
    """
)

#: Never imported before a command has checked its arguments.
HEAVY = {"llama_index", "faiss", "numpy"}
#: Nor by ``--help`` and ``--version``, which print no styled text and coerce no value
#: (typer 0.29 coerces through pydantic, about half of a ``--help``'s time).
HEAVY_OR_RICH = HEAVY | {"rich", "pydantic"}


def _run(args: list[str], cwd: Path) -> tuple[int, str, str, set[str]]:
    """``(exit code, stdout, stderr, top-level packages imported)`` of ``hyde-plus ARGS``
    in a fresh process (in ``cwd``: the package comes from the install, not the cwd)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDE_PLUS_TOKEN"} | {"COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )
    stderr, _, probe = done.stderr.rpartition("\nPROBE ")
    assert probe, done.stderr
    report = json.loads(probe)
    return report["code"], done.stdout, stderr, set(report["modules"])


def _command_paths() -> list[list[str]]:
    """Every command and command group, as typed: ``["serve"]``, ``["models", "pull"]``."""
    paths = [[c.name or c.callback.__name__] for c in app.registered_commands if c.callback]
    for group in app.registered_groups:
        assert group.name is not None
        paths.append([group.name])
        paths += [[group.name, c.name or ""] for c in models_app.registered_commands]
    return paths


def test_the_version_imports_nothing_heavy(tmp_path: Path) -> None:
    code, out, _, loaded = _run(["--version"], tmp_path)
    assert (code, out.strip()) == (0, f"hyde-plus {__version__}")
    assert not loaded & HEAVY_OR_RICH, loaded & HEAVY_OR_RICH


@pytest.mark.parametrize("command", [[], *_command_paths()], ids=" ".join)
def test_every_help_imports_nothing_heavy(tmp_path: Path, command: list[str]) -> None:
    code, out, err, loaded = _run([*command, "--help"], tmp_path)
    assert code == 0 and "Usage" in out, err
    assert not loaded & HEAVY_OR_RICH, loaded & HEAVY_OR_RICH


def test_the_help_lists_every_command() -> None:
    typed = {" ".join(path) for path in _command_paths()}
    assert {"index", "query", "transform", "eval", "tune", "serve", "demo"} <= typed
    assert {"models", "models pull", "models list"} <= typed


ERRORS: list[tuple[list[str], str]] = [
    (["serve", "--http", "0", "--token", ""], "the token is empty"),
    (["serve", "--stdio", "--token", ""], "the token is empty"),
    (["serve", "--stdio", "--timeout", "0"], "--timeout must be > 0 seconds"),
    (["serve", "--stdio", "--max-inflight", "x"], "Invalid value for '--max-inflight'"),
    (["serve", "--stdio", "--index", "MISSING"], "does not exist; build one with"),
    (["serve", "--stdio", "--config", "MISSING"], "config file not found"),
    (["query", "q", "--index", "MISSING"], "does not exist; build one with"),
    (["query", "q"], "give exactly one of --index (FAISS) and --uri (Milvus)"),
    (["query", "q", "--index", "HERE", "-t", "hdye"], "did you mean 'hyde'?"),
    (["query", "q", "--index", "HERE", "-k", "0"], "--top-k must be at least 1, not 0"),
    (["query", "q", "--index", "HERE", "-k", "two"], "Invalid value for '--top-k'"),
    (["query", "q", "--index", "HERE", "--config", "MISSING"], "config file not found"),
    (["transform", "q", "-m", "magic"], "--method must be one of"),
    (["transform", "q", "-n", "1.5"], "Invalid value for '--num-queries'"),
    (["index", "MISSING", "--out", "OUT"], "DIR does not exist"),
    (["tune", "--dataset", "HERE", "-t", "hdye"], "did you mean 'hyde'?"),
    (["tune", "--dataset", "HERE", "--tolerance", "100"], "--tolerance must be between"),
    (["tune", "--dataset", "MISSING"], "dataset folder not found"),
    (["eval", "--dataset", "MISSING"], "dataset folder not found"),
    (["eval", "--dataset", "HERE", "--config", "MISSING"], "config file not found"),
    (["eval", "--dataset", "HERE", "--top-k", "ten"], "Invalid value for '--top-k'"),
    (["eval", "--dataset", "HERE", "--llm", "MISSING.gguf"], "GGUF file not found"),
    (["tune", "--dataset", "HERE", "--llm", "http://:80/v1"], "not a server address"),
    (["query", "q", "--index", "HERE", "--llm", "claude"], "unknown model choice 'claude'"),
    (["transform", "q", "--llm", "local:x"], "give your own model as --llm PATH.gguf"),
    (["serve", "--stdio", "--llm", "MISSING.gguf"], "GGUF file not found"),
]


@pytest.mark.parametrize(("args", "message"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_an_argument_error_is_answered_before_llama_index_loads(
    tmp_path: Path, args: list[str], message: str
) -> None:
    places = {"MISSING": str(tmp_path / "missing"), "HERE": str(tmp_path), "OUT": "out"}
    places["MISSING.gguf"] = str(tmp_path / "missing.gguf")
    code, _, err, loaded = _run([places.get(a, a) for a in args], tmp_path)
    assert code == 2 and message in err, err
    assert not loaded & HEAVY, loaded & HEAVY
    assert not (tmp_path / "missing").exists() and not (tmp_path / "out").exists()


def test_the_light_names_are_the_registry_s_the_stores_and_the_defaults() -> None:
    from llama_index_hyde_plus import chunking, stores
    from llama_index_hyde_plus.calls import timeouts
    from llama_index_hyde_plus.transforms import registry

    assert names.TRANSFORMS == registry.TRANSFORMS
    assert names.METHODS == registry.METHODS
    assert names.STORE_KINDS == stores.STORE_KINDS
    assert names.DEFAULT_CHUNK_SIZE == chunking.DEFAULT_CHUNK_SIZE
    assert names.DEFAULT_CHUNK_OVERLAP == chunking.DEFAULT_CHUNK_OVERLAP
    assert names.TIMEOUT_POLICY == timeouts.POLICY
    from typing import get_args

    from llama_index_hyde_plus.server import rcp

    assert get_args(rcp.Sessionless) == names.SESSIONLESS


def _outcome(function: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "value", str(function())
    except ValueError as exc:
        return "error", str(exc)


@pytest.mark.parametrize(
    "spelling",
    [*names.TRANSFORMS, "HyDE", " Multi_Query ", "multiquery", "StepBack", "hdye", "zzz", ""],
)
def test_a_transform_name_is_read_as_the_registry_reads_it(spelling: str) -> None:
    from llama_index_hyde_plus.transforms.registry import transform_class

    light = _outcome(lambda: names.transform_name(spelling))
    assert light == _outcome(lambda: transform_class(spelling).method)


def test_the_early_checks_give_the_library_s_messages(tmp_path: Path) -> None:
    from llama_index_hyde_plus.evaluation.beir import load_beir
    from llama_index_hyde_plus.models import MissingExtraError, require_extra
    from llama_index_hyde_plus.readers import read_folder
    from llama_index_hyde_plus.stores import open_store
    from llama_index_hyde_plus.stores.faiss import read_meta
    from llama_index_hyde_plus.transforms.config import load_config

    missing, folder = tmp_path / "missing", tmp_path
    pairs: list[tuple[Callable[[], Any], Callable[[], Any]]] = [
        (lambda: early.store_address(None, None), lambda: open_store()),
        (lambda: early.store_address(folder, "x"), lambda: open_store(index=folder, uri="x")),
        (lambda: early.store_address(missing, None), lambda: read_meta(missing)),
        (lambda: early.documents_folder(missing), lambda: read_folder(missing)),
        (lambda: early.config_file(missing), lambda: load_config(missing)),
        (lambda: early.config_file(folder), lambda: load_config(folder)),
        (lambda: early.dataset_folder(missing), lambda: load_beir(missing)),
    ]
    for light, heavy in pairs:
        assert _outcome(light)[0] == "error"
        assert _outcome(light) == _outcome(heavy)
    with pytest.raises(MissingExtraError) as raised:
        require_extra("eval", ("no_such_module_here",), "hyde-plus eval")
    with pytest.raises(ValueError) as early_raised:
        early.extra("eval", ("no_such_module_here",), "hyde-plus eval")
    assert str(early_raised.value) == str(raised.value)


def test_every_command_sets_up_logging_before_anything_else() -> None:
    """The group no longer does (its callback runs before a command's ``--help``): a
    library that logs on import must find our quiet handler in place."""
    commands = [*app.registered_commands, *models_app.registered_commands]
    assert len(commands) >= 9
    for command in commands:
        assert command.callback is not None
        tree = ast.parse(textwrap.dedent(inspect.getsource(command.callback)))
        function = tree.body[0]
        assert isinstance(function, ast.FunctionDef)
        body = function.body
        docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        first = body[1] if docstring else body[0]
        assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call), command
        assert getattr(first.value.func, "id", None) == "setup_logging", command.callback
