"""Argument checks that need no library, run before a command imports LlamaIndex.

Each raises the `ValueError` the library's own check raises later (a store, the
readers, the config and BEIR loaders keep theirs, for callers from Python), so an
error reads the same either way; ``tests/test_cli_fast.py`` compares the two.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from .._checks import check_folder, validate_query
from .._extras import install_hint
from .._model_spec import check_server_options, read_llm_spec
from ._console import fail
from ._options import LlmFlags


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """Turn a `ValueError` of these checks into one ``error:`` line and exit code 2."""
    try:
        yield
    except ValueError as exc:
        raise fail(str(exc)) from None


def question(text: str, top_k: int = 1) -> None:
    """As the search (`validate_query`): a question with text, valid Unicode; and at
    least one result to show (``--top-k``)."""
    validate_query(text)
    if top_k < 1:
        raise ValueError(f"--top-k must be at least 1, not {top_k}")


def store_address(index: Path | None, uri: str | None) -> None:
    """As `stores.open_store`: exactly one of ``--index`` and ``--uri``; an ``--index``
    folder that exists (`stores.faiss.read_meta`)."""
    if (index is None) == (uri is None):
        raise ValueError("give exactly one of --index (FAISS) and --uri (Milvus)")
    if index is not None and not index.exists():
        raise ValueError(
            f"index {index} does not exist; build one with `hyde-plus index DIR --out {index}`"
        )


def documents_folder(folder: Path) -> None:
    """As `readers.read_folder`: ``DIR`` is a folder."""
    check_folder(folder, "DIR")


def config_file(path: Path | None) -> None:
    """As `transforms.config.load_config`: a ``--config`` that is a file."""
    if path is None:
        return
    p = path.expanduser()
    if p.is_dir():
        raise ValueError(f"--config must be a file, not a folder: {p}")
    if not p.is_file():
        raise ValueError(f"config file not found: {p}")


def dataset_folder(folder: Path | None) -> None:
    """As `evaluation.beir.load_beir`: a ``--dataset`` folder that exists."""
    if folder is not None and not folder.expanduser().is_dir():
        raise ValueError(f"dataset folder not found: {folder.expanduser()}")


def extra(extra: str, modules: tuple[str, ...], what: str) -> None:
    """As `models.require_extra`, without importing the modules: each is installed."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"{what} needs the '{extra}' extra ({module} is not installed): "
                f"{install_hint(extra)}"
            )


def llm_choice(spec: str, *, oracle: bool = False, flags: LlmFlags | None = None) -> None:
    """As `models.resolve_llm`: ``--llm`` names a model (`_model_spec.read_llm_spec`: a
    GGUF file that exists, a server address with a host...), or ``scripted[:DELAY_MS]``,
    or with ``oracle`` (eval, tune) the stand-in ``oracle:P[:N]``; ``--llm-model`` and
    ``--llm-key`` (``flags``) only with a server (`_model_spec.check_server_options`)."""
    head = spec.strip().lower().partition(":")[0]
    if not (head == "scripted" or (oracle and head == "oracle")):
        read_llm_spec(spec)
    if flags is not None:
        check_server_options(spec, flags.model, flags.key)
