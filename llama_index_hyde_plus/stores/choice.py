"""How a store is chosen, in one place: `store_kind` reads the flags (``--store``,
``--uri``, a folder), `make_store` turns a kind into its class (`store_classes`, the
one list of implementations), and `vector_store_kind` tells which store a LlamaIndex
retriever searches. `open_store` and `store_for` are the two ways callers name one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Store
from .faiss import FaissStore
from .milvus import MilvusStore

STORE_KINDS: tuple[str, ...] = ("faiss", "milvus")
"""The ``--store`` choices."""


def store_kind(
    store: str | None,
    uri: str | None,
    *,
    path: Path | None = None,
    path_flag: str | None = None,
) -> str:
    """The one decision of which store the flags name: ``--store``, else Milvus when a
    ``--uri`` is given, else FAISS; a `ValueError` naming the flags when they disagree.
    With ``path_flag`` (``--out``, ``--index``), ``path`` must be given for FAISS and
    left out for Milvus."""
    kind = store or ("milvus" if uri else "faiss")
    if kind not in STORE_KINDS:
        raise ValueError(f"--store must be one of {', '.join(STORE_KINDS)}, not {kind!r}")
    if kind == "milvus" and not uri:
        raise ValueError("--store milvus needs --uri (a Milvus Lite file path or a URL)")
    if kind == "faiss" and uri:
        raise ValueError("--uri is for the Milvus store; drop --store faiss or --uri")
    if path_flag is not None and kind == "faiss" and path is None:
        raise ValueError(f"{path_flag} is needed for the FAISS store")
    if path_flag is not None and kind == "milvus" and path is not None:
        raise ValueError(f"{path_flag} is for the FAISS store; Milvus takes --uri")
    return kind


def make_store(
    kind: str,
    *,
    path: Path | None = None,
    uri: str | None = None,
    collection: str | None = None,
    token: str = "",
) -> Store:
    """The store of ``kind`` (from `store_kind`): the FAISS folder ``path``, or the
    Milvus ``collection`` at ``uri``."""
    return store_classes()[kind].at(path=path, uri=uri, collection=collection, token=token)


def store_classes() -> dict[str, type[Store]]:
    """Every store by kind (`STORE_KINDS`, in order): the one list of implementations."""
    classes: dict[str, type[Store]] = {cls.kind: cls for cls in (FaissStore, MilvusStore)}
    assert tuple(classes) == STORE_KINDS
    return classes


_KIND_OF_CLASS: dict[type, str | None] = {}


def vector_store_kind(vector_store: Any) -> str | None:
    """Which store a LlamaIndex vector store belongs to (``faiss``, ``milvus``), by its
    class or a base class's name (no store package is imported); None for others."""
    cls = type(vector_store)
    if cls not in _KIND_OF_CLASS:  # once per class: a search path asks this
        names = {c.__name__ for c in cls.__mro__}
        kinds = (k for k, s in store_classes().items() if s.vector_store_class in names)
        _KIND_OF_CLASS[cls] = next(kinds, None)
    return _KIND_OF_CLASS[cls]


def open_store(
    *,
    index: Path | None = None,
    uri: str | None = None,
    collection: str | None = None,
    token: str = "",
) -> Store:
    """The store a search names: a FAISS ``index`` folder or a Milvus ``uri`` (exactly
    one; a `ValueError` otherwise)."""
    if (index is None) == (uri is None):
        raise ValueError("give exactly one of --index (FAISS) and --uri (Milvus)")
    kind = store_kind(None, uri)
    return make_store(kind, path=index, uri=uri, collection=collection, token=token)


def store_for(
    kind: str,
    name: str,
    *,
    root: Path,
    uri: str | None = None,
    token: str = "",
) -> Store:
    """A store of ``kind`` for the corpus called ``name``: a FAISS folder under
    ``root/indexes``, or collection ``name`` at Milvus ``uri`` (needed for milvus)."""
    kind = store_kind(kind, uri if kind == "milvus" else None)
    path = root / "indexes" / name
    return make_store(kind, path=path, uri=uri, collection=name, token=token)
