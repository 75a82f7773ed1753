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
from typing import Any, NamedTuple

import pytest

from llama_index_hyde_plus import __version__
from llama_index_hyde_plus.cli import _early as early
from llama_index_hyde_plus.cli import _names as names
from llama_index_hyde_plus.cli import app, models_app

#: Runs each ``hyde-plus ARGS`` of a batch as the console script does, in a process
#: forked from one fresh interpreter that has imported only the modules named as
#: preloaded, and writes the exit code, the output and the top-level packages loaded.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    preload, cases, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    for name in preload:
        __import__(name)
    with open(os.path.join(out, "preloaded.json"), "w") as f:
        json.dump(sorted({name.split(".")[0] for name in sys.modules}), f)
    for i, (args, cwd) in enumerate(cases):
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)
            continue
        os.chdir(cwd)
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(os.path.join(out, f"{i}.{stream}"), os.O_WRONLY | os.O_CREAT), fd)
        from llama_index_hyde_plus._entry import main
        sys.argv = ["hyde-plus", *args]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()
        sys.stderr.flush()
        loaded = sorted({name.split(".")[0] for name in sys.modules})
        with open(os.path.join(out, f"{i}.json"), "w") as f:
            json.dump({"code": code, "modules": loaded}, f)
        os._exit(0)
    """
)

#: Never imported before a command has checked its arguments.
HEAVY = {"llama_index", "faiss", "numpy"}
#: Nor by ``--help`` and ``--version``, which print no styled text and coerce no value
#: (typer 0.29 coerces through pydantic, about half of a ``--help``'s time).
HEAVY_OR_RICH = HEAVY | {"rich", "pydantic"}


class Ran(NamedTuple):
    """One ``hyde-plus ARGS`` of a batch."""

    code: int
    out: str
    err: str
    loaded: set[str]


def _run_all(
    cases: list[tuple[list[str], Path]], preload: list[str], out: Path
) -> tuple[list[Ran], set[str]]:
    """Each ``(ARGS, cwd)`` of ``cases`` run as ``hyde-plus ARGS`` in ``cwd`` (the
    package comes from the install, not the cwd), in processes forked from one fresh
    interpreter that imported ``preload`` first; with the top-level packages that
    interpreter had loaded before any command ran."""
    env = {k: v for k, v in os.environ.items() if k != "HYDE_PLUS_TOKEN"} | {"COLUMNS": "200"}
    batch = json.dumps([[args, str(cwd)] for args, cwd in cases])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(preload), batch, str(out)],
        capture_output=True,
        text=True,
        cwd=out,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    preloaded = set(json.loads((out / "preloaded.json").read_text()))
    ran = []
    for i in range(len(cases)):
        report = out / f"{i}.json"
        err = (out / f"{i}.stderr").read_text()
        assert report.exists(), err
        probe = json.loads(report.read_text())
        stdout = (out / f"{i}.stdout").read_text()
        ran.append(Ran(probe["code"], stdout, err, set(probe["modules"])))
    return ran, preloaded


def _command_paths() -> list[list[str]]:
    """Every command and command group, as typed: ``["serve"]``, ``["models", "pull"]``."""
    paths = [[c.name or c.callback.__name__] for c in app.registered_commands if c.callback]
    for group in app.registered_groups:
        assert group.name is not None
        paths.append([group.name])
        paths += [[group.name, c.name or ""] for c in models_app.registered_commands]
    return paths


HELPS = [["--version"], *([*command, "--help"] for command in [[], *_command_paths()])]


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every ``--help`` and ``--version``, by its arguments, run in one batch forked
    from an interpreter that loaded only the entry point and the command line's
    module (neither loads anything heavy or rich)."""
    out = tmp_path_factory.mktemp("helps")
    preload = ["llama_index_hyde_plus._entry", "llama_index_hyde_plus.cli"]
    ran, preloaded = _run_all([(args, out) for args in HELPS], preload, out)
    assert not preloaded & HEAVY_OR_RICH, preloaded & HEAVY_OR_RICH
    return {" ".join(args): one for args, one in zip(HELPS, ran, strict=True)}


def test_the_version_imports_nothing_heavy(helps: dict[str, Ran]) -> None:
    code, out, _, loaded = helps["--version"]
    assert (code, out.strip()) == (0, f"hyde-plus {__version__}")
    assert not loaded & HEAVY_OR_RICH, loaded & HEAVY_OR_RICH


@pytest.mark.parametrize("command", [[], *_command_paths()], ids=" ".join)
def test_every_help_imports_nothing_heavy(helps: dict[str, Ran], command: list[str]) -> None:
    code, out, err, loaded = helps[" ".join([*command, "--help"])]
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


#: What every argument error loads anyway (typer's value coercion through pydantic and
#: rich's error panel): preloaded once for the whole batch, as none of it is heavy.
ERROR_PRELOAD = [
    "llama_index_hyde_plus._entry",
    "llama_index_hyde_plus.cli",
    "typer._adapters",
    "rich.console",
    "rich.logging",
]


@pytest.fixture(scope="module")
def argument_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Ran, Path]]:
    """Every case of `ERRORS`, by its arguments: what it gave and the folder it ran in
    (its ``HERE``, beside its ``MISSING``), all in one batch."""
    cases = []
    for args, _ in ERRORS:
        here = tmp_path_factory.mktemp("args")
        places = {"MISSING": str(here / "missing"), "HERE": str(here), "OUT": "out"}
        places["MISSING.gguf"] = str(here / "missing.gguf")
        cases.append(([places.get(a, a) for a in args], here))
    ran, preloaded = _run_all(cases, ERROR_PRELOAD, tmp_path_factory.mktemp("errors"))
    assert not preloaded & HEAVY, preloaded & HEAVY
    return {
        " ".join(args): (one, here)
        for (args, _), one, (_, here) in zip(ERRORS, ran, cases, strict=True)
    }


@pytest.mark.parametrize(("args", "message"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_an_argument_error_is_answered_before_llama_index_loads(
    argument_errors: dict[str, tuple[Ran, Path]], args: list[str], message: str
) -> None:
    (code, _, err, loaded), here = argument_errors[" ".join(args)]
    assert code == 2 and message in err, err
    assert not loaded & HEAVY, loaded & HEAVY
    assert not (here / "missing").exists() and not (here / "out").exists()


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
    from llama_index_hyde_plus import Rocchio, TransformRetriever
    from llama_index_hyde_plus.evaluation.beir import load_beir
    from llama_index_hyde_plus.models import MissingExtraError, require_extra
    from llama_index_hyde_plus.readers import read_folder
    from llama_index_hyde_plus.stores import open_store
    from llama_index_hyde_plus.stores.faiss import read_meta
    from llama_index_hyde_plus.testing import StaticRetriever
    from llama_index_hyde_plus.transforms.config import load_config

    missing, folder = tmp_path / "missing", tmp_path
    retriever = StaticRetriever({"a": "text"})
    pairs: list[tuple[Callable[[], Any], Callable[[], Any]]] = [
        (lambda: early.store_address(None, None), lambda: open_store()),
        (lambda: early.store_address(folder, "x"), lambda: open_store(index=folder, uri="x")),
        (lambda: early.store_address(missing, None), lambda: read_meta(missing)),
        (lambda: early.documents_folder(missing), lambda: read_folder(missing)),
        (lambda: early.config_file(missing), lambda: load_config(missing)),
        (lambda: early.config_file(folder), lambda: load_config(folder)),
        (lambda: early.dataset_folder(missing), lambda: load_beir(missing)),
        (
            lambda: early.question(" \n"),
            lambda: TransformRetriever(retriever, Rocchio()).search(" "),
        ),
        (lambda: early.question("a\ud800"), lambda: Rocchio().transform("a\ud800")),
    ]
    for light, heavy in pairs:
        assert _outcome(light)[0] == "error"
        assert _outcome(light) == _outcome(heavy)
    with pytest.raises(MissingExtraError) as raised:
        require_extra("eval", ("no_such_module_here",), "hyde-plus eval")
    with pytest.raises(ValueError) as early_raised:
        early.extra("eval", ("no_such_module_here",), "hyde-plus eval")
    assert str(early_raised.value) == str(raised.value)


def test_a_missing_extra_says_how_to_add_it_installed_and_in_a_clone() -> None:
    from llama_index_hyde_plus.models import MissingExtraError, require_extra

    with pytest.raises(MissingExtraError) as raised:
        require_extra("eval", ("no_such_module_here",), "hyde-plus eval")
    said = str(raised.value)
    assert said.startswith("hyde-plus eval needs the 'eval' extra")
    assert 'pip install "llama-index-hyde-plus[eval]"' in said  # installed
    assert "uv run --frozen --extra local --extra eval hyde-plus ..." in said  # the README's clone
    with pytest.raises(ValueError) as local:
        early.extra("local", ("no_such_module_here",), "--llm local")
    assert "(uv run --frozen --extra local hyde-plus ...)" in str(local.value)  # named once


def test_every_command_sets_up_logging_before_anything_else() -> None:
    """Each command, not the group (whose callback runs before a command's ``--help``),
    sets up logging: a library that logs on import must find our quiet handler in place."""
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
