"""Incremental builds: LlamaIndex's `IngestionPipeline` decides what a rebuild embeds.

A build runs its documents (ids: their path relative to the folder, or a ``.jsonl``
line's ``_id``) through an ``IngestionPipeline`` whose transformations are the build's
chunking (`Chunker`) and embedding (`Embedder`), with the docstore of the previous
build and ``DocstoreStrategy.UPSERTS_AND_DELETE``: a document whose hash is unchanged is
skipped, a changed one has its old chunks deleted and is chunked and embedded again, a
new one is added, and one no longer there has its chunks deleted. The pipeline's vector
store is a LlamaIndex ``SimpleVectorStore`` seeded with the previous build's chunks and
their vectors, so what is left in it after the run is exactly the new build: the
unchanged chunks with the vectors they had, plus the new ones. The store then writes
that set as a whole new build (a FAISS data folder, a Milvus collection) and switches
to it as any build does.

What was recorded is reused only when it was made the same way (`fingerprint`: the
embedding model, its vector size and window, the chunking): another model or other
chunking starts from an empty docstore, so every chunk is embedded again. The
pipeline's `IngestionCache` is keyed by that fingerprint too (its collection), so it
never serves vectors of another model or chunker.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.ingestion import DocstoreStrategy, IngestionCache, IngestionPipeline
from llama_index.core.schema import BaseNode, NodeRelationship, RelatedNodeInfo, TransformComponent
from llama_index.core.storage.docstore import SimpleDocumentStore
from llama_index.core.storage.kvstore import SimpleKVStore as SimpleCache
from llama_index.core.vector_stores import SimpleVectorStore

from ..chunking import Chunking, Tokenizer, tokenizer_for
from .nodes import ProgressFn, TotalFn, embed_nodes, embedding_model_name, nodes_from_documents

logger = logging.getLogger(__name__)


def fingerprint(embed_model: BaseEmbedding, max_length: int, chunk_meta: Any) -> str:
    """What makes two builds' vectors interchangeable, as a short hash: the embedding
    model (name, class, vector size when it says), the window ``max_length`` and the
    chunking settings recorded beside the index (``chunk_meta``; None: one node per
    document)."""
    identity = {
        "model": embedding_model_name(embed_model),
        "class": type(embed_model).__name__,
        "dim": getattr(embed_model, "dim", None),
        "max_length": max_length,
        "chunking": chunk_meta,
    }
    blob = json.dumps(identity, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class Chunker(TransformComponent):
    """The build's chunking as a pipeline step: `nodes_from_documents`, each node
    pointing at its document (``SOURCE``, also for a document kept whole), which is how
    the pipeline's vector store deletes a document's chunks. ``settings`` names the
    chunking (it is part of the cache key)."""

    settings: str
    _chunking: Chunking | None = PrivateAttr(default=None)
    _tokenizer: Tokenizer | None = PrivateAttr(default=None)

    def __init__(self, chunking: Chunking | None, tokenizer: Tokenizer | None, settings: str):
        super().__init__(**{"settings": settings})
        self._chunking, self._tokenizer = chunking, tokenizer

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[BaseNode]:
        documents = [n for n in nodes if isinstance(n, Document)]
        out = nodes_from_documents(documents, self._chunking, self._tokenizer)
        for node in out:
            if self._chunking is None:  # the id given for hashing (`_hashed_by_id`) only
                node.metadata.pop("doc_id", None)
                node.excluded_embed_metadata_keys = list(node.metadata)
                node.excluded_llm_metadata_keys = list(node.metadata)
            if NodeRelationship.SOURCE not in node.relationships:
                node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=node.node_id)
        return list(out)


class Embedder(TransformComponent):
    """The build's embedding as a pipeline step: `embed_nodes` in batches of
    ``batch_size`` with progress; ``identity`` (the `fingerprint`) is its part of the
    cache key. ``embedded`` counts the texts it embedded."""

    identity: str
    _model: BaseEmbedding | None = PrivateAttr(default=None)
    _batch_size: int = PrivateAttr(default=64)
    _progress: ProgressFn | None = PrivateAttr(default=None)
    _total: TotalFn | None = PrivateAttr(default=None)
    _embedded: int = PrivateAttr(default=0)

    def __init__(
        self,
        model: BaseEmbedding,
        identity: str,
        *,
        batch_size: int,
        progress: ProgressFn | None,
        total: TotalFn | None,
    ) -> None:
        super().__init__(**{"identity": identity})
        self._model, self._batch_size = model, batch_size
        self._progress, self._total = progress, total

    def start(self) -> None:
        """Tell ``total`` that nothing is to embed yet (a rebuild may embed nothing)."""
        if self._total is not None:
            self._total(0)

    @property
    def embedded(self) -> int:
        """How many texts this step embedded."""
        return self._embedded

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[BaseNode]:
        assert self._model is not None
        if self._total is not None:
            self._total(len(nodes))
        embed_nodes(nodes, self._model, batch_size=self._batch_size, progress=self._progress)
        self._embedded += len(nodes)
        return list(nodes)


def build_steps(
    embed_model: BaseEmbedding,
    chunking: Chunking | None,
    max_length: int,
    *,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
    total: TotalFn | None = None,
) -> tuple[tuple[Chunker, Embedder], dict[str, Any] | None]:
    """The pipeline's two steps for a build, and the chunking settings to record (None
    without ``chunking``; checked against ``max_length`` first, counted in the tokens
    of ``embed_model``). ``progress`` and ``total`` are told about the texts embedded."""
    tokenizer: Tokenizer | None = None
    chunk_meta: dict[str, Any] | None = None
    if chunking is not None:
        chunking.check(max_length)
        name, tokenizer = tokenizer_for(embed_model)
        chunk_meta = chunking.as_meta(name)
    identity = fingerprint(embed_model, max_length, chunk_meta)
    chunker = Chunker(chunking, tokenizer, json.dumps(chunk_meta, sort_keys=True))
    embedder = Embedder(
        embed_model, identity, batch_size=batch_size, progress=progress, total=total
    )
    return (chunker, embedder), chunk_meta


Recorded = dict[str, list[str]]
"""A build's chunks as it wrote them: chunk id -> ``[document id, chunk hash]``."""


@dataclass(frozen=True)
class Previous:
    """What a store recorded of its build in use: its `fingerprint`, the pipeline's
    docstore, and that build's ``chunks`` with their vectors, in the order it wrote
    them. With ``recorded`` (what the build wrote, `recorded`), only the chunks it
    lists, unchanged, are reused: a document with a chunk missing or changed since (a
    Milvus collection served ``--writable``, a FAISS docstore edited by hand) is
    embedded again, and a chunk it does not list is dropped, so the rebuild holds what
    a build from scratch would."""

    fingerprint: str
    docstore: SimpleDocumentStore
    chunks: list[BaseNode]
    recorded: Recorded | None = None

    def reusable(self) -> list[BaseNode]:
        """The ``chunks`` to start from (see the class docstring); the documents whose
        chunks are not all there as listed, or that have none there, are removed from
        ``docstore`` first (so they are chunked and embedded again)."""
        if self.recorded is None:
            return self.chunks
        listed = self.recorded
        good = [n for n in self.chunks if listed.get(n.node_id) == [_doc(n), n.hash]]
        there = {n.node_id for n in good}
        stale = {doc for chunk, (doc, _) in listed.items() if chunk not in there}
        stale |= {_doc(n) for n in self.chunks if n.node_id not in there}
        known = set(self.docstore.get_all_document_hashes().values())
        stale |= known - {_doc(n) for n in good}  # known, with no chunk kept
        for doc in stale:
            self.docstore.delete_document(doc, raise_error=False)
        return [n for n in good if _doc(n) not in stale]


@dataclass(frozen=True)
class Ingested:
    """A build's chunks (``nodes``, every one with its vector, in the order a build from
    scratch writes them), how many were ``embedded`` and how many ``reused``, and the
    pipeline's ``docstore`` and ``cache`` for the store to keep; ``unchanged`` when
    nothing was embedded and they are what the previous build wrote (`written`: the
    same chunks, texts and order; nothing dropped)."""

    nodes: list[BaseNode]
    embedded: int
    reused: int
    docstore: SimpleDocumentStore
    cache: IngestionCache
    unchanged: bool = False


def ingest(
    documents: Sequence[Document],
    steps: tuple[Chunker, Embedder],
    previous: Previous | None,
    cache: IngestionCache | None = None,
) -> Ingested:
    """Run ``documents`` through the pipeline (see the module's docstring) from the
    ``previous`` build, when its fingerprint is the ``Embedder``'s, else from nothing;
    ``cache`` is consulted for this fingerprint's collection only."""
    chunker, embedder = steps
    _check_unique_ids(documents)
    same = previous is not None and previous.fingerprint == embedder.identity
    docstore = previous.docstore if same and previous is not None else SimpleDocumentStore()
    old = previous.reusable() if same and previous is not None else []
    embedder.start()
    vectors = SimpleVectorStore()
    vectors.add(old)
    pipeline = IngestionPipeline(
        transformations=[chunker, embedder],
        docstore=docstore,
        vector_store=vectors,
        cache=cache or IngestionCache(),
        docstore_strategy=DocstoreStrategy.UPSERTS_AND_DELETE,
    )
    new = pipeline.run(documents=_hashed_by_id(documents), cache_collection=embedder.identity)
    nodes = _build_order(documents, _merged(old, list(new), set(vectors.data.embedding_dict)))
    unchanged = (
        not new and same and previous is not None and written(nodes) == written(previous.chunks)
    )
    reused = len(nodes) - len(new)
    return Ingested(nodes, embedder.embedded, reused, docstore, pipeline.cache, unchanged)


def _merged(old: list[BaseNode], new: list[BaseNode], kept: set[str]) -> list[BaseNode]:
    """The ``new`` chunks and the ``old`` ones still ``kept`` in the pipeline's vector
    store (a new chunk replaces the old one of its own document with its id); a
    `ValueError` when a chunk id is also another document's chunk or id."""
    by_id: dict[str, BaseNode] = {}
    for node in new:
        _claim(by_id, node)
    for node in old:
        if node.node_id not in kept:
            continue
        mine = by_id.get(node.node_id)
        if mine is None or _document(mine) != _document(node):
            _claim(by_id, node)
    return list(by_id.values())


def _document(node: BaseNode) -> str:
    return node.ref_doc_id or node.node_id


def _claim(by_id: dict[str, BaseNode], node: BaseNode) -> None:
    if node.node_id in by_id:
        raise ValueError(
            f"chunk id {node.node_id!r} is also another document's id; rename that document"
        )
    by_id[node.node_id] = node


def written(nodes: Sequence[BaseNode]) -> list[tuple[str, str]]:
    """What a build writes, for telling whether two are the same: each chunk's id and
    hash (of its text and metadata), in the order written (which ranks tied hits)."""
    return [(n.node_id, n.hash) for n in nodes]


def _doc(node: BaseNode) -> str:
    return node.ref_doc_id or node.node_id


def recorded(nodes: Sequence[BaseNode]) -> Recorded:
    """What a store records of the chunks it wrote, to check them at the next build."""
    return {n.node_id: [_doc(n), n.hash] for n in nodes}


def check_recorded(value: object) -> Recorded:
    """``value`` as a build's record of its chunks (`recorded`); a `ValueError` for
    anything else (damaged or edited by hand: the build then starts over)."""
    if isinstance(value, dict) and all(
        isinstance(chunk, str)
        and isinstance(entry, list)
        and len(entry) == 2
        and all(isinstance(part, str) for part in entry)
        for chunk, entry in value.items()
    ):
        return value
    raise ValueError("the record of the chunks it wrote is damaged")


def _check_unique_ids(documents: Sequence[Document]) -> None:
    """A `ValueError` for two documents with one id (one would replace the other)."""
    seen: set[str] = set()
    for d in documents:
        if d.doc_id in seen:
            raise ValueError(f"duplicate document id {d.doc_id!r}; give every document its own")
        seen.add(d.doc_id)


def cache_bytes(cache: IngestionCache, identity: str) -> bytes:
    """The collection ``identity`` of ``cache`` (the entries of one fingerprint) as the
    JSON a `SimpleCache` persists."""
    entries = cache.cache.get_all(collection=identity)
    return json.dumps({identity: entries}).encode("utf-8")


def read_cache(path: Path) -> IngestionCache:
    """The `IngestionCache` persisted at ``path``; an empty one when there is none or
    it is unreadable (a cache only saves work: losing it costs embeddings, not data)."""
    try:
        if path.is_file() and not path.is_symlink():
            return IngestionCache(cache=SimpleCache.from_persist_path(str(path)))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        logger.warning("ignoring the unreadable ingestion cache %s (%s)", path, exc)
    return IngestionCache()


def _hashed_by_id(documents: Sequence[Document]) -> list[Document]:
    """``documents`` as the pipeline sees them: each with its id in its metadata, so two
    documents with the same text (two identical lines of a ``.jsonl``) still hash
    apart (the docstore maps a hash to one id), as chunks record it anyway; a vector
    a document carries (an index's stored one) goes with it, so it is not embedded."""
    return [
        Document(
            text=d.text,
            id_=d.doc_id,
            metadata={**d.metadata, "doc_id": d.doc_id},
            embedding=d.embedding,
        )
        for d in documents
    ]


def _build_order(documents: Sequence[Document], nodes: list[BaseNode]) -> list[BaseNode]:
    """``nodes`` in document order, then chunk order: the order of a build from scratch,
    so FAISS positions (and ties between equal scores) come out the same."""
    place = {d.doc_id: i for i, d in enumerate(documents)}
    return sorted(
        nodes,
        key=lambda n: (
            place.get(n.ref_doc_id or n.node_id, len(place)),
            n.metadata.get("chunk", 0),
        ),
    )
