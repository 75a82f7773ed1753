"""How a store is chosen, in one place: `STORES` lists them, `kind_at` maps a folder
or a URI to a kind, `store_kind` reads the flags (``--store``, ``--uri``, a folder),
`make_store` turns a kind into its class, and `vector_store_kind` tells which store a
LlamaIndex retriever searches. `open_store` and `store_for` are how callers name one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Store
from .faiss import FaissStore
from .milvus import MilvusStore

STORES: tuple[type[Store], ...] = (FaissStore, MilvusStore)
"""Every store, the default first for each address (a folder: FAISS; a URI: Milvus).
A new store is a module with its class plus one entry here (CONTRIBUTING.md)."""

STORE_KINDS: tuple[str, ...] = tuple(cls.kind for cls in STORES)
"""The ``--store`` choices."""


def store_classes() -> dict[str, type[Store]]:
    """Every store class by its kind, in `STORES` order."""
    return {cls.kind: cls for cls in STORES}


def kind_at(path: Path | None = None, uri: str | None = None) -> str:
    """The one map from a location to a store kind: a ``uri`` is the first store kept
    at a URI (Milvus); a ``path`` the first folder store that `recognises` it, else the
    first folder store (FAISS, whose errors then name what is missing)."""
    address = "uri" if uri is not None else "folder"
    candidates = [cls for cls in STORES if cls.address == address]
    if path is not None:
        known = next((cls for cls in candidates if cls.recognises(path)), None)
        if known is not None:
            return known.kind
    return candidates[0].kind


def _titles(address: str) -> str:
    return " or ".join(cls.title for cls in STORES if cls.address == address)


def store_kind(
    store: str | None,
    uri: str | None,
    *,
    path: Path | None = None,
    path_flag: str | None = None,
) -> str:
    """The store the flags name: ``--store``, else what `kind_at` makes of the
    location; a `ValueError` naming the flags when they disagree. With ``path_flag``
    (``--out``, ``--index``), ``path`` must be given for a folder store and left out
    for a URI store."""
    classes = store_classes()
    kind = store or kind_at(path, uri)
    if kind not in classes:
        raise ValueError(f"--store must be one of {', '.join(STORE_KINDS)}, not {kind!r}")
    cls = classes[kind]
    if cls.address == "uri" and not uri:
        raise ValueError(f"--store {kind} needs --uri ({cls.address_help})")
    if cls.address == "folder" and uri:
        raise ValueError(f"--uri is for the {_titles('uri')} store; drop --store {kind} or --uri")
    if path_flag is not None and cls.address == "folder" and path is None:
        raise ValueError(f"{path_flag} is needed for the {cls.title} store")
    if path_flag is not None and cls.address == "uri" and path is not None:
        raise ValueError(
            f"{path_flag} is for the {_titles('folder')} store; {cls.title} takes --uri"
        )
    return kind


def make_store(
    kind: str,
    *,
    path: Path | None = None,
    uri: str | None = None,
    collection: str | None = None,
    token: str = "",
) -> Store:
    """The store of ``kind`` (from `store_kind`): the folder ``path``, or the
    ``collection`` at ``uri``."""
    return store_classes()[kind].at(path=path, uri=uri, collection=collection, token=token)


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
    kind = kind_at(index, uri)
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
    path = root / "indexes" / name
    cls = store_classes().get(kind)
    kind = store_kind(kind, uri if cls is not None and cls.address == "uri" else None)
    return make_store(kind, path=path, uri=uri, collection=name, token=token)
