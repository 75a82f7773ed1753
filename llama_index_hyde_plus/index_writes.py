"""Writes to a served index (RCP ``index/add`` and ``index/delete``): documents upserted
by id and deleted idempotently, with nothing lost if the process dies mid-write.

A document is a whole document (RCP §7.10: ``{id?, text, meta?}``). It is embedded with
the index's own model and, when the index was built with chunking (`hyde-plus index`
chunks by default), split exactly as the build split it: its chunks are
``<id>#1``, ``<id>#2``... (or just ``<id>`` when it fits one chunk), as a build names
them. Re-adding an id replaces every chunk of the document; deleting an id removes them
all. ``meta`` is kept with each chunk, out of the embedded text (as a build does).

Only Milvus is writable (`MilvusWriter`): it upserts by primary key. A FAISS folder stays
read-only: LlamaIndex's FAISS store cannot delete a vector, so a write would mean
rewriting the whole folder per call.

Order of a write, so that a crash at any point loses nothing that was there before:
everything is embedded first (no write yet); then the new chunks are upserted (each
replaces the row of its id, or is added); then the document's chunks that the new
version no longer has are deleted. Dying after the upsert leaves the new version plus,
at worst, stale chunks of the old one; repeating the same ``index/add`` (it is
idempotent) removes them. Milvus keeps a write it acknowledged (a cluster in its log,
Milvus Lite in its files: a process killed right after the answer loses none), so no
``flush`` is called (a cluster limits those: they seal segments).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core import Document
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

from .chunking import Chunking, tokenizer_for
from .stores.nodes import embed_nodes, nodes_from_documents

#: Most documents one ``index/add`` may carry (more: RCP -32013, split the call).
MAX_DOCUMENTS = 256
#: Most ids one ``index/delete`` may carry.
MAX_IDS = 1024
#: Longest document id accepted (Milvus stores ids as VARCHAR).
MAX_ID_CHARS = 512
#: Metadata keys a document's ``meta`` may not use: the row's own fields in Milvus.
RESERVED_META = frozenset(
    {"id", "doc_id", "document_id", "ref_doc_id", "text", "embedding", "sparse_embedding"}
)


class WriteError(ValueError):
    """A write refused for its input; ``field`` is the offending params path (RCP
    ``error.data.field``) and ``too_large`` marks a call over a size limit (-32013)."""

    def __init__(self, message: str, field: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.too_large = too_large


@dataclass(frozen=True)
class NewDocument:
    """One document of an ``index/add``: its id (given or minted), text and metadata."""

    id: str
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AddResult:
    """What an ``index/add`` wrote: the document ids in input order and the chunks."""

    ids: list[str]
    chunks: int


def check_id(value: Any, where: str) -> str:
    """``value`` if it is a usable document id, else a `WriteError` naming ``where``."""
    if not isinstance(value, str) or not value.strip():
        raise WriteError(f"'{where}' MUST be a non-empty string", where)
    if len(value) > MAX_ID_CHARS:
        raise WriteError(f"'{where}' MUST be at most {MAX_ID_CHARS} characters", where)
    if value == "None":  # what LlamaIndex stores as the document of a node without one
        raise WriteError(f"'{where}' MUST NOT be the reserved id 'None'", where)
    if "#" in value:
        raise WriteError(
            f"'{where}' MUST NOT contain '#' (it separates a document id from its chunk number)",
            where,
        )
    return value


def parse_documents(value: Any) -> list[NewDocument]:
    """The ``documents`` of an ``index/add``, checked; an id is minted (uuid4) for a
    document without one, so such a document is not idempotent (RCP §7.10)."""
    if not isinstance(value, list):
        raise WriteError("'documents' MUST be an array of {id?, text, meta?}", "documents")
    if len(value) > MAX_DOCUMENTS:
        raise WriteError(
            f"at most {MAX_DOCUMENTS} documents per index/add; split the call",
            "documents",
            too_large=True,
        )
    out: list[NewDocument] = []
    seen: set[str] = set()
    for i, doc in enumerate(value):
        where = f"documents[{i}]"
        if not isinstance(doc, dict):
            raise WriteError(f"'{where}' MUST be an object {{id?, text, meta?}}", where)
        unknown = sorted(set(doc) - {"id", "text", "meta", "_meta"})
        if unknown:
            raise WriteError(f"'{where}' has unknown field(s) {unknown}", f"{where}.{unknown[0]}")
        text = doc.get("text")
        if not isinstance(text, str) or not text.strip():
            raise WriteError(f"'{where}.text' MUST be a non-empty string", f"{where}.text")
        meta = doc.get("meta", {})
        if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
            raise WriteError(f"'{where}.meta' MUST be an object", f"{where}.meta")
        clash = sorted(RESERVED_META & set(meta))
        if clash or any(k.startswith("_") for k in meta):
            bad = clash[0] if clash else next(k for k in meta if k.startswith("_"))
            raise WriteError(
                f"'{where}.meta' MUST NOT use the key {bad!r} (reserved for the index's "
                "own fields)",
                f"{where}.meta.{bad}",
            )
        doc_id = check_id(doc["id"], f"{where}.id") if "id" in doc else uuid.uuid4().hex
        if doc_id in seen:
            raise WriteError(f"'{where}.id' {doc_id!r} appears twice in one call", f"{where}.id")
        seen.add(doc_id)
        out.append(NewDocument(doc_id, text, dict(meta)))
    return out


def parse_ids(value: Any) -> list[str]:
    """The ``ids`` of an ``index/delete``, checked (repeats collapse)."""
    if not isinstance(value, list):
        raise WriteError("'ids' MUST be an array of document ids", "ids")
    if len(value) > MAX_IDS:
        raise WriteError(
            f"at most {MAX_IDS} ids per index/delete; split the call", "ids", too_large=True
        )
    ids = [check_id(v, f"ids[{i}]") for i, v in enumerate(value)]
    return list(dict.fromkeys(ids))


def chunking_from_meta(meta: Mapping[str, Any] | None) -> Chunking | None:
    """The `Chunking` an index records (``chunking`` in its metadata), None if it was
    built one node per document."""
    recorded = (meta or {}).get("chunking")
    if not isinstance(recorded, dict):
        return None
    return Chunking(int(recorded["chunk_size"]), int(recorded["chunk_overlap"]))


def document_nodes(
    documents: Sequence[NewDocument], embed_model: BaseEmbedding, chunking: Chunking | None
) -> list[TextNode]:
    """The nodes (chunks) of ``documents`` as a build of this index makes them, each
    pointing at its document (LlamaIndex's SOURCE relationship, so its row records
    the document's id), not yet embedded."""
    docs = [Document(text=d.text, id_=d.id, metadata=dict(d.meta)) for d in documents]
    tokenizer = tokenizer_for(embed_model)[1] if chunking is not None else None
    nodes = nodes_from_documents(docs, chunking, tokenizer)
    for node in nodes:
        if NodeRelationship.SOURCE not in node.relationships:
            node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=node.node_id)
    return nodes


def _literal_list(values: Sequence[str]) -> str:
    """A Milvus expression list of string literals (JSON string escaping)."""
    return "[" + ",".join(json.dumps(v, ensure_ascii=False) for v in values) + "]"


def rows_of(documents: Sequence[str]) -> str:
    """The Milvus filter matching every row (chunk) of the ``documents``: a chunk's id
    is the document's when it fits one chunk, and every chunk (of a chunked build, or
    written here) records its document in ``doc_id``."""
    ids = _literal_list(documents)
    return f"id in {ids} or doc_id in {ids}"


class MilvusWriter:
    """Upserts and deletes in the Milvus collection an index was loaded from.

    ``index`` is the served ``VectorStoreIndex`` (its vector store is switched to upsert
    by primary key); ``embed_model`` the index's; ``chunking`` as the index was built
    (None: one node per document). Writes are serialised: one at a time per server."""

    kind = "milvus"

    def __init__(
        self,
        index: Any,
        embed_model: BaseEmbedding,
        chunking: Chunking | None,
    ) -> None:
        self.store = index.vector_store
        self.store.upsert_mode = True  # Milvus upsert: replace the row of the same id
        self.embed_model = embed_model
        self.chunking = chunking
        self._lock = threading.Lock()

    @property
    def collection(self) -> str:
        return str(self.store.collection_name)

    def _rows(self, documents: Sequence[str]) -> list[dict[str, Any]]:
        if not documents:
            return []
        rows: list[dict[str, Any]] = self.store.client.query(
            collection_name=self.collection,
            filter=rows_of(documents),
            output_fields=["id", "doc_id"],
            consistency_level="Strong",  # see the rows written just before, on a cluster too
        )
        return rows

    def add(self, documents: Sequence[NewDocument]) -> AddResult:
        """Upsert ``documents`` (see the module's docstring for the order of steps)."""
        ids = [d.id for d in documents]
        if not documents:
            return AddResult([], 0)
        nodes = document_nodes(documents, self.embed_model, self.chunking)
        embed_nodes(nodes, self.embed_model)  # before any write: a failure writes nothing
        with self._lock:
            self.store.add(nodes)
            self._drop_stale(ids, {n.node_id for n in nodes})
        return AddResult(ids, len(nodes))

    def _drop_stale(self, documents: Sequence[str], keep: set[str]) -> None:
        """Delete the rows of ``documents`` that are not among the new chunks ``keep``
        (chunks of an older, longer version)."""
        stale = [str(r["id"]) for r in self._rows(documents) if str(r["id"]) not in keep]
        if stale:
            self.store.client.delete(collection_name=self.collection, pks=stale)

    def delete(self, ids: Sequence[str]) -> int:
        """Delete every chunk of the documents ``ids``; how many of them were there."""
        with self._lock:
            rows = self._rows(ids)
            wanted = set(ids)
            found = {str(r["id"]) for r in rows if str(r["id"]) in wanted}
            found |= {str(r["doc_id"]) for r in rows if str(r.get("doc_id")) in wanted}
            if rows:
                self.store.client.delete(
                    collection_name=self.collection, pks=[str(r["id"]) for r in rows]
                )
            return len(found)
