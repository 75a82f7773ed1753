"""Build, persist and load a FAISS index on disk (the embedded default store).

An index folder holds LlamaIndex's storage files, the FAISS index, and
``hyde_plus.json`` recording how it was embedded, so a query embeds the same way.
``hyde_plus.json`` also names the data folder inside the index (``data-<id>``): a
build writes a new data folder and switches the metadata file to it with one atomic
rename, so an interrupted build never leaves a half-written index and never loses the
previous one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, MetadataMode, TextNode

from .chunking import Chunking, Tokenizer, split_documents, tokenizer_for
from .index_folder import check_index_target, data_folder, read_meta, rebuild_hint, write_index

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
TotalFn = Callable[[int], None]
"""Told the number of texts to embed (chunks or documents) before any progress."""


@dataclass(frozen=True)
class IndexInfo:
    """What a build wrote: where (an index folder, or a Milvus URI and collection),
    how many documents (and ``chunks``, the nodes they were split into: as many as the
    documents without chunking), the vector size, the embedding and how long it took."""

    location: str
    documents: int
    dim: int
    embed: str
    max_length: int
    seconds: float
    chunks: int = 0

    def __post_init__(self) -> None:
        if not self.chunks:
            object.__setattr__(self, "chunks", self.documents)

    @property
    def path(self) -> Path:
        """``location`` as a path (a FAISS index folder)."""
        return Path(self.location)

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def nodes_from_documents(
    documents: Sequence[Document],
    chunking: Chunking | None = None,
    tokenizer: Tokenizer | None = None,
) -> list[TextNode]:
    """The nodes to embed: one per document keeping its id without ``chunking`` (as
    BEIR scoring by document id needs), else the chunks of `split_documents` (counted
    with ``tokenizer``). Metadata (source, title...) is kept but not embedded or shown
    to the LLM (the title is already in the text). Two documents with one id, or a
    chunk id that is also a document's, are a `ValueError`: one would replace the other."""
    seen: set[str] = set()
    for d in documents:
        if d.doc_id in seen:
            raise ValueError(f"duplicate document id {d.doc_id!r}; give every document its own")
        seen.add(d.doc_id)
    if chunking is not None:
        nodes = split_documents(documents, chunking, tokenizer)
        ids = [n.node_id for n in nodes]
        if len(set(ids)) != len(ids):
            clash = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(
                f"chunk id {clash!r} is also another document's id; rename that document"
            )
        return nodes
    return [
        TextNode(
            id_=d.doc_id,
            text=d.text,
            metadata=dict(d.metadata),
            excluded_embed_metadata_keys=list(d.metadata),
            excluded_llm_metadata_keys=list(d.metadata),
            embedding=d.embedding,
        )
        for d in documents
    ]


def prepare_nodes(
    documents: Sequence[Document],
    embed_model: BaseEmbedding,
    chunking: Chunking | None,
    max_length: int,
) -> tuple[list[TextNode], dict[str, Any] | None]:
    """``(nodes, chunking settings to record)`` for a build: chunks counted in the
    tokens of ``embed_model`` when ``chunking`` is given (checked against
    ``max_length`` first), else one node per document and None."""
    if chunking is None:
        return nodes_from_documents(documents), None
    chunking.check(max_length)
    name, tokenizer = tokenizer_for(embed_model)
    return nodes_from_documents(documents, chunking, tokenizer), chunking.as_meta(name)


def check_batch_size(batch_size: int) -> None:
    """A `ValueError` naming ``--batch-size`` unless it is a whole number of at least 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch-size must be a whole number of at least 1, not {batch_size!r}")


def embed_nodes(
    nodes: Sequence[BaseNode],
    embed_model: BaseEmbedding,
    *,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
) -> None:
    """Set ``node.embedding`` on every node that has none, in batches, reporting
    progress (a node that already carries a vector, such as a document built from an
    index's stored vectors, is counted but not embedded again).

    The nodes are embedded shortest text first, so texts of similar length share a
    batch and little of each batch is padding; ``nodes`` itself keeps its order."""
    check_batch_size(batch_size)
    if progress is not None and any(n.embedding is not None for n in nodes):
        progress(sum(1 for n in nodes if n.embedding is not None))
    texts = [n.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
    todo = [i for i, n in enumerate(nodes) if n.embedding is None]
    order = sorted(todo, key=lambda i: len(texts[i]))
    for batch in _batches(order, batch_size):
        vectors = embed_model.get_text_embedding_batch([texts[i] for i in batch])
        for i, vector in zip(batch, vectors, strict=True):
            nodes[i].embedding = vector
        if progress is not None:
            progress(len(batch))


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
    inner-product index at ``out``."""
    import faiss
    from llama_index.vector_stores.faiss import FaissVectorStore

    out = check_index_target(out)
    start = time.perf_counter()
    nodes, chunk_meta = prepare_nodes(documents, embed_model, chunking, max_length)
    if total is not None:
        total(len(nodes))
    embed_nodes(nodes, embed_model, batch_size=batch_size, progress=progress)
    dim = len(nodes[0].embedding or [])
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(dim))
    storage = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)
    seconds = time.perf_counter() - start

    info = IndexInfo(str(out), len(documents), dim, embed_spec, max_length, seconds, len(nodes))
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
    }
    write_index(out, index.storage_context, meta)
    return info


def embedding_model_name(embed_model: BaseEmbedding) -> str:
    """The name recorded beside an index (and checked when it is queried)."""
    return str(getattr(embed_model, "model_name", None) or type(embed_model).__name__)


class EmbeddingMismatchError(ValueError):
    """The query embedding does not match the one the index was built with."""


def _dimension_error(where: str, index_dim: int, query_dim: int) -> EmbeddingMismatchError:
    return EmbeddingMismatchError(
        f"{where} holds {index_dim}-d vectors but the query embedding has {query_dim} "
        "dimensions; query with the embedding model the index was built with, or rebuild it"
    )


def check_embedding_model(where: str, meta: dict[str, Any], embed_model: BaseEmbedding) -> None:
    """Raise `EmbeddingMismatchError` when ``meta`` records another embedding model."""
    recorded = meta.get("embed_model")
    in_use = embedding_model_name(embed_model)
    if recorded and str(recorded) != in_use:
        raise EmbeddingMismatchError(
            f"{where} was embedded with {recorded!r} but the query uses {in_use!r}; "
            "use the same embedding model (or rebuild the index with this one)"
        )
    dim = getattr(embed_model, "dim", None)
    if isinstance(dim, int) and isinstance(meta.get("dim"), int) and dim != meta["dim"]:
        raise _dimension_error(where, int(meta["dim"]), dim)


def _checked_faiss_store(faiss_index: Any, where: str) -> Any:
    """A `FaissVectorStore` whose queries check the embedding dimension first (FAISS
    itself aborts with a bare assertion)."""
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryResult
    from llama_index.vector_stores.faiss import FaissVectorStore

    class CheckedFaissVectorStore(FaissVectorStore):
        def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
            got = len(query.query_embedding or [])
            if got != faiss_index.d:
                raise _dimension_error(where, int(faiss_index.d), got)
            return super().query(query, **kwargs)

    return CheckedFaissVectorStore(faiss_index=faiss_index)  # type: ignore[call-arg]


def load_faiss_index(path: Path, embed_model: BaseEmbedding) -> VectorStoreIndex:
    """Load an index written by `build_faiss_index`.

    A `ValueError` names what is wrong (a missing or truncated file, a corrupt
    metadata file, another embedding model than the one it was built with)."""
    import faiss

    path = path.expanduser()
    meta = read_meta(path)
    check_embedding_model(f"the index at {path}", meta, embed_model)
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


def load_index(path: Path | str, embed: str | None = None) -> VectorStoreIndex:
    """The FAISS index folder ``path`` (as `hyde-plus index` writes it) as a LlamaIndex
    ``VectorStoreIndex``, with the embedding model recorded at indexing (or ``embed``,
    a model spec such as ``openai:text-embedding-3-small``), so queries embed alike."""
    from .stores import FaissStore

    store = FaissStore(path)
    return store.load(store.embedding_model(embed))
