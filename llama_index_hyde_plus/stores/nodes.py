"""What a build embeds, whatever the store: documents as nodes (one per document, or
chunks), their embedding in batches, what a build reports (`IndexInfo`), and the check
that a query embeds as the index was built."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, MetadataMode, TextNode

from .._checks import is_int
from ..chunking import Chunking, Tokenizer, split_documents, tokenizer_for

ProgressFn = Callable[[int], None]
TotalFn = Callable[[int], None]
"""Told the number of texts to embed (chunks or documents) before any progress."""


@dataclass(frozen=True)
class IndexInfo:
    """What a build wrote: where (an index folder, or a Milvus URI and collection),
    how many documents (and ``chunks``, the nodes they were split into: as many as the
    documents without chunking), the vector size, the embedding and how long it took;
    ``embedded`` of the chunks were embedded by this build and ``reused`` kept the
    vectors of the build before (an incremental rebuild, `ingestion`); ``unchanged``
    when the build holds just the chunks of the build before (nothing embedded or
    dropped: the index is up to date)."""

    location: str
    documents: int
    dim: int
    embed: str
    max_length: int
    seconds: float
    chunks: int = 0
    embedded: int = -1
    reused: int = 0
    unchanged: bool = False

    def __post_init__(self) -> None:
        if not self.chunks:
            object.__setattr__(self, "chunks", self.documents)
        if self.embedded < 0:
            object.__setattr__(self, "embedded", self.chunks - self.reused)

    @property
    def path(self) -> Path:
        """``location`` as a path (a FAISS index folder)."""
        return Path(self.location)

    @property
    def docs_per_second(self) -> float:
        """Documents indexed per second of the build (0 when it took no time)."""
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
    if not is_int(batch_size) or batch_size < 1:
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


def embedding_model_name(embed_model: BaseEmbedding) -> str:
    """The name recorded beside an index (and checked when it is queried)."""
    return str(getattr(embed_model, "model_name", None) or type(embed_model).__name__)


class EmbeddingMismatchError(ValueError):
    """The query embedding does not match the one the index was built with."""


def dimension_error(where: str, index_dim: int, query_dim: int) -> EmbeddingMismatchError:
    """The error for a query embedding whose size is not the index's, naming the fix."""
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
        raise dimension_error(where, int(meta["dim"]), dim)
