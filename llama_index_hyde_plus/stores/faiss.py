"""`FaissStore`: a FAISS index folder on disk (dense search, the embedded default).

An index folder holds LlamaIndex's storage files, the FAISS index, and
``hyde_plus.json`` recording how it was embedded, so a query embeds the same way; its
layout, and how a build replaces one without losing anything, is `faiss_folder`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode

from ..chunking import Chunking
from .base import BuildSettings, Store
from .faiss_folder import (
    CACHE_FILE,
    INGESTION_CHUNKS,
    INGESTION_DOCSTORE,
    META_FILE,
    check_index_target,
    write_index,
)
from .ingestion import (
    Previous,
    build_steps,
    cache_bytes,
    check_recorded,
    ingest,
    read_cache,
    recorded,
)
from .nodes import (
    EmbeddingMismatchError,
    IndexInfo,
    ProgressFn,
    TotalFn,
    check_batch_size,
    check_embedding_model,
    dimension_error,
    embedding_model_name,
)

logger = logging.getLogger(__name__)


def read_meta(path: Path) -> dict[str, Any]:
    """The metadata of the index at ``path`` (a `ValueError` naming the file if it is
    missing or unreadable)."""
    meta_path = path / META_FILE
    if not path.exists():
        raise ValueError(
            f"index {path} does not exist; build one with `hyde-plus index DIR --out {path}`"
        )
    if not meta_path.is_file():
        hint = " (a Milvus Lite database? open it with --uri)" if path.suffix == ".db" else ""
        raise ValueError(
            f"{path} is not a hyde-plus index (no {META_FILE}){hint}; build one with "
            "`hyde-plus index DIR --out PATH`"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{meta_path} is corrupt ({exc}); {rebuild_hint(path)}") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path} is corrupt (not a JSON object); {rebuild_hint(path)}")
    return dict(meta)


def rebuild_hint(path: Path) -> str:
    """The advice an error about a damaged or unreadable index at ``path`` ends with.

    Args:
        path: the index folder.
    """
    return f"rebuild it with `hyde-plus index DIR --out {path}`"


def data_folder(path: Path, meta: dict[str, Any]) -> Path:
    """The data folder ``meta`` names inside the index at ``path``. Only a plain child
    name is followed: none (a first build interrupted before its switch), ``..``, a
    path, or a link leading out of the index is a `ValueError`."""
    name: object = meta.get("data")
    if name is None:
        raise ValueError(
            f"the index at {path} is incomplete (its first build was interrupted); "
            f"{rebuild_hint(path)}"
        )
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\x00")
        and Path(name).name == name
    )
    if plain and isinstance(name, str):
        data = path / name
        if not data.is_symlink() or data.resolve().parent == path.resolve():
            return data
    raise ValueError(
        f"{path / META_FILE}: 'data' must name a folder inside the index, not {name!r:.80}; "
        f"{rebuild_hint(path)}"
    )


def build_faiss_index(
    documents: Sequence[Document],
    embed_model: BaseEmbedding,
    out: Path,
    *,
    embed_spec: str,
    max_length: int,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
    chunking: Chunking | None = None,
    total: TotalFn | None = None,
) -> IndexInfo:
    """Embed ``documents`` (one node each, or chunks with ``chunking``) into a FAISS
    inner-product index at ``out``. A rebuild of an index made with the same model and
    chunking embeds only the documents that are new or changed, and drops the chunks of
    those that are gone (`ingestion`); the index is still written as a whole new build."""
    import faiss
    from llama_index.vector_stores.faiss import FaissVectorStore

    out = check_index_target(out)
    check_batch_size(batch_size)
    start = time.perf_counter()
    steps, chunk_meta = build_steps(
        embed_model, chunking, max_length, batch_size=batch_size, progress=progress, total=total
    )
    identity = steps[1].identity
    done = ingest(documents, steps, previous_build(out, identity), read_cache(out / CACHE_FILE))
    if not done.nodes:
        raise ValueError("no documents to index")
    dim = len(done.nodes[0].embedding or [])
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(dim))
    storage = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex(done.nodes, storage_context=storage, embed_model=embed_model)
    seconds = time.perf_counter() - start

    info = IndexInfo(
        str(out), len(documents), dim, embed_spec, max_length, seconds, len(done.nodes),
        done.embedded, done.reused, done.unchanged,
    )  # fmt: skip
    meta = {
        "format": 2,
        "documents": info.documents,
        "chunks": info.chunks,
        "chunking": chunk_meta,
        "dim": dim,
        "embed": embed_spec,
        "embed_model": embedding_model_name(embed_model),
        "max_length": max_length,
        "build_seconds": round(seconds, 3),
        "fingerprint": identity,
        "embedded": done.embedded,
        "reused": done.reused,
    }
    cache = cache_bytes(done.cache, identity) if done.embedded else None
    write_index(
        out, index.storage_context, meta, docstore=done.docstore,
        chunks=recorded(done.nodes), cache=cache, unchanged=done.unchanged,
    )  # fmt: skip
    return info


def previous_build(out: Path, identity: str) -> Previous | None:
    """The build in use at ``out`` as the pipeline's starting point, when it was made
    with the `fingerprint` ``identity`` and recorded its docstore; else None (the build
    embeds everything). The chunks it recorded writing are checked (`Previous`). A
    damaged previous build is None too, with a warning: it is replaced whole."""
    from llama_index.core.storage.docstore import SimpleDocumentStore

    if not (out / META_FILE).is_file():
        return None
    try:
        meta = read_meta(out)
        if meta.get("fingerprint") != identity:
            return None
        data = data_folder(out, meta)
        if not (data / INGESTION_DOCSTORE).is_file():
            return None
        docstore = SimpleDocumentStore.from_persist_path(str(data / INGESTION_DOCSTORE))
        listed = data / INGESTION_CHUNKS  # an index of an older version has none
        chunks = None
        if listed.is_file():
            chunks = check_recorded(json.loads(listed.read_text(encoding="utf-8")))
        return Previous(identity, docstore, stored_chunks(data), chunks)
    except Exception as exc:  # damaged: the build starts over, which repairs it
        logger.warning("embedding everything again: the index at %s is unreadable (%s)", out, exc)
        return None


def stored_chunks(data: Path) -> list[BaseNode]:
    """The chunks of the data folder ``data`` with the vectors its FAISS index holds
    (read back by position: a flat index keeps them exactly)."""
    import faiss
    from llama_index.core.storage.docstore import SimpleDocumentStore
    from llama_index.core.storage.index_store import SimpleIndexStore

    vectors = faiss.read_index(str(data / "default__vector_store.json"))
    structs = SimpleIndexStore.from_persist_dir(str(data)).index_structs()
    nodes_dict: dict[str, str] = getattr(structs[0], "nodes_dict", {})
    if len(structs) != 1 or len(nodes_dict) != vectors.ntotal:
        raise ValueError("the vector store and the index disagree")
    docstore = SimpleDocumentStore.from_persist_dir(str(data))
    matrix = vectors.reconstruct_n(0, vectors.ntotal)
    nodes = []
    for position, node_id in nodes_dict.items():
        node = docstore.get_node(node_id)
        node.embedding = [float(x) for x in matrix[int(position)]]
        nodes.append(node)
    return nodes


def _checked_faiss_store(faiss_index: Any, where: str) -> Any:
    """A `FaissVectorStore` whose queries check the embedding dimension first (FAISS
    itself aborts with a bare assertion)."""
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryResult
    from llama_index.vector_stores.faiss import FaissVectorStore

    class CheckedFaissVectorStore(FaissVectorStore):
        searches_in_process: ClassVar[bool] = True  # FAISS in this process, as its base

        def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
            got = len(query.query_embedding or [])
            if got != faiss_index.d:
                raise dimension_error(where, int(faiss_index.d), got)
            return super().query(query, **kwargs)

    return CheckedFaissVectorStore(faiss_index=faiss_index)  # type: ignore[call-arg]


ModelCheck = Callable[[str, dict[str, Any], BaseEmbedding], None]
"""Checks an embedding model against an index's metadata (``where``, ``meta``, model)."""


def load_faiss_index(
    path: Path, embed_model: BaseEmbedding, *, check: ModelCheck = check_embedding_model
) -> VectorStoreIndex:
    """Load an index written by `build_faiss_index`.

    A `ValueError` names what is wrong (a missing or truncated file, a corrupt
    metadata file, another embedding model than the one it was built with, as
    ``check`` decides)."""
    import faiss

    path = path.expanduser()
    meta = read_meta(path)
    check(f"the index at {path}", meta, embed_model)
    data = data_folder(path, meta)
    vectors = data / "default__vector_store.json"
    for required in ("docstore.json", "index_store.json", vectors.name):
        if not (data / required).is_file():
            raise ValueError(f"the index at {path} has no {data / required}; {rebuild_hint(path)}")
    try:
        faiss_index = faiss.read_index(str(vectors))
    except RuntimeError as exc:
        raise ValueError(
            f"the vector store {vectors} is unreadable (truncated or corrupt); {rebuild_hint(path)}"
        ) from exc
    store = _checked_faiss_store(faiss_index, f"the index at {path}")
    try:
        storage = StorageContext.from_defaults(vector_store=store, persist_dir=str(data))
        index = load_index_from_storage(storage, embed_model=embed_model)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"the index files in {data} are unreadable ({exc}); {rebuild_hint(path)}"
        ) from exc
    assert isinstance(index, VectorStoreIndex)
    if faiss_index.ntotal != len(index.index_struct.nodes_dict):
        raise ValueError(
            f"the vector store {vectors} holds {faiss_index.ntotal} vectors but the index "
            f"lists {len(index.index_struct.nodes_dict)} documents; {rebuild_hint(path)}"
        )
    _check_docstore(index, data / "docstore.json", path)
    return index


def _check_docstore(index: VectorStoreIndex, docstore: Path, path: Path) -> None:
    """A `ValueError` when the document store lacks a node the index lists (a
    ``docstore.json`` emptied to ``{}`` or ``[]`` loads, then fails every search)."""
    ids = list(index.index_struct.nodes_dict.values())
    try:
        missing = sum(not index.docstore.document_exists(node_id) for node_id in ids)
    except Exception as exc:  # a docstore.json of the wrong shape fails inside LlamaIndex
        raise ValueError(
            f"the document store {docstore} is unreadable ({type(exc).__name__}); "
            f"{rebuild_hint(path)}"
        ) from exc
    if missing:
        raise ValueError(
            f"the document store {docstore} lacks {missing} of the {len(ids)} documents the "
            f"index lists; {rebuild_hint(path)}"
        )


def load_index(
    path: Path | str, embed: str | None = None, *, embed_model: BaseEmbedding | None = None
) -> VectorStoreIndex:
    """The FAISS index folder ``path`` (as `hyde-plus index` writes it) as a LlamaIndex
    ``VectorStoreIndex``, with the embedding model recorded at indexing (or ``embed``,
    a model spec such as ``openai:text-embedding-3-small``), so queries embed alike.

    ``embed_model`` is a model object to query with instead of a spec. It is checked
    as the CLI checks a spec (`check_embedding_model`): another recorded name or
    another dimension is a `ValueError` naming ``embed_model``; a model with no name
    of its own (LlamaIndex's ``"unknown"``) is accepted, with a warning, when its
    vectors have the index's dimension (one probe embedding tells)."""
    store = FaissStore(path)
    if embed_model is None:
        return store.load(store.embedding_model(embed))
    if embed is not None:
        raise ValueError("give load_index embed (a model spec) or embed_model, not both")
    if not isinstance(embed_model, BaseEmbedding):
        raise TypeError(
            f"embed_model must be a LlamaIndex BaseEmbedding, not {type(embed_model).__name__}"
        )
    try:
        return load_faiss_index(store.path, embed_model, check=_check_given_model)
    except EmbeddingMismatchError as exc:
        raise EmbeddingMismatchError(f"load_index(embed_model=...): {exc}") from None


def _check_given_model(where: str, meta: dict[str, Any], embed_model: BaseEmbedding) -> None:
    """`check_embedding_model`, except that a model with no name of its own passes
    (with a warning) when a probe embedding has the recorded dimension."""
    if getattr(embed_model, "model_name", None) not in (None, "", "unknown"):
        check_embedding_model(where, meta, embed_model)
        return
    dim = meta.get("dim")
    got = len(embed_model.get_query_embedding("dimension check"))
    if isinstance(dim, int) and got != dim:
        raise dimension_error(where, dim, got)
    logger.warning(
        "%s was embedded with %r; embed_model (%s) has no name to compare, only its "
        "dimension (%d) matches: make sure it is the same model",
        where,
        meta.get("embed_model") or meta.get("embed"),
        type(embed_model).__name__,
        got,
    )


class FaissStore(Store):
    """The index folder ``path`` (``hyde_plus.json`` plus LlamaIndex storage files)."""

    kind: ClassVar[str] = "faiss"
    modes: ClassVar[tuple[str, ...]] = ("dense",)
    search: ClassVar[str] = "dense"
    title: ClassVar[str] = "FAISS"
    address: ClassVar[str] = "folder"
    address_help: ClassVar[str] = "an index folder"
    vector_store_class: ClassVar[str] = "FaissVectorStore"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser()

    @classmethod
    def at(
        cls, *, path: Path | None, uri: str | None, collection: str | None, token: str
    ) -> FaissStore:
        assert path is not None, "a FAISS store is a folder"
        return cls(path)

    @classmethod
    def recognises(cls, path: Path) -> bool:
        return (Path(path).expanduser() / META_FILE).is_file()

    @property
    def location(self) -> str:
        return str(self.path)

    def check_target(self, docs: Path | None = None) -> None:
        check_index_target(self.path, docs)

    def _build(
        self, documents: Sequence[Document], embed_model: BaseEmbedding, settings: BuildSettings
    ) -> IndexInfo:
        return build_faiss_index(documents, embed_model, self.path, **settings.as_kwargs())

    def meta(self) -> dict[str, Any] | None:
        return read_meta(self.path) if (self.path / META_FILE).is_file() else None

    def embedding_model(self, embed: str | None = None) -> BaseEmbedding:
        read_meta(self.path)  # a missing or damaged index is named before any model loads
        return super().embedding_model(embed)

    def load(self, embed_model: BaseEmbedding) -> VectorStoreIndex:
        return load_faiss_index(self.path, embed_model)

    def retriever(self, index: VectorStoreIndex, top_k: int) -> BaseRetriever:
        return index.as_retriever(similarity_top_k=top_k)

    def writer(self, index: VectorStoreIndex, embed_model: BaseEmbedding) -> Any:
        """Never: a FAISS folder is served read-only. LlamaIndex's FAISS store cannot
        delete (or so replace) a vector, so every ``index/add`` or ``index/delete``
        would rewrite the whole folder; a Milvus index upserts in place."""
        raise ValueError(
            "a FAISS index is served read-only (LlamaIndex's FAISS store cannot delete or "
            "replace a vector); to serve --writable, build a Milvus index: "
            "`hyde-plus index DIR --store milvus --uri PATH.db`"
        )
