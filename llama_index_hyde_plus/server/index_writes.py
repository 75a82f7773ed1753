"""Writes to a served index (RCP ``index/add`` and ``index/delete``): documents upserted
by id and deleted idempotently, with nothing lost if the process dies mid-write.

A document is a whole document (RCP §7.10: ``{id?, text, meta?}``). It is embedded with
the index's own model and, when the index was built with chunking (`hyde-plus index`
chunks by default), split exactly as the build split it: its chunks are
``<id>#1``, ``<id>#2``... (or just ``<id>`` when it fits one chunk), as a build names
them. Re-adding an id replaces every chunk of the document; deleting an id removes them
all. ``meta`` is kept with each chunk, out of the embedded text (as a build does).

Rows are found by keys derived from the document id (`stores.row_keys`), never by
pasting an id into a filter, so an id may hold any character Milvus can store: what is
refused (-32602, naming the field, before anything is written) is an empty or
whitespace-only id, one over `MAX_ID_CHARS` characters, one with a lone surrogate
(not storable text), ``None``, and, in ``index/add``, an id with ``#`` (it would read as
a chunk of another document; ``index/delete`` takes it, for documents a build indexed
from ``.jsonl``). A chunk whose id is the id of a document already in the index is
refused too. A document whose text (a chunk of it) or metadata Milvus cannot hold is
refused the same way: a chunk over `MAX_FIELD_BYTES` bytes of UTF-8, a metadata key
starting with ``$`` or ``_`` or naming one of the row's own fields, an integer outside
int64, a float that is not finite.

A write holds the store's `RowsLock` alone from its upsert to its delete, and searches
of the same process hold it shared, so a search sees a replaced document whole, the
old version or the new, never chunks of both.

Only Milvus is writable (`MilvusWriter`): it upserts by primary key. A FAISS folder stays
read-only: LlamaIndex's FAISS store cannot delete a vector, so a write would mean
rewriting the whole folder per call.

Order of a write, so that a crash at any point loses nothing that was there before:
everything is checked and embedded first (no write yet); then the new chunks are
upserted (each replaces the row of its key, or is added); then the document's chunks
that the new version no longer has are deleted. Dying after the upsert leaves the new version plus,
at worst, stale chunks of the old one; repeating the same ``index/add`` (it is
idempotent) removes them. Milvus keeps a write it acknowledged (a cluster in its log,
Milvus Lite in its files: a process killed right after the answer loses none), so no
``flush`` is called (a cluster limits those: they seal segments).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from llama_index.core import Document
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

from ..chunking import Chunking, tokenizer_for
from ..stores.nodes import embed_nodes, nodes_from_documents
from ..stores.row_keys import KEY_FIELD, doc_key, key_filter, row_key

#: Most documents one ``index/add`` may carry (more: RCP -32013, split the call).
MAX_DOCUMENTS = 256
#: Most ids one ``index/delete`` may carry.
MAX_IDS = 1024
#: Longest document id accepted (Milvus stores ids as VARCHAR).
MAX_ID_CHARS = 512
#: Most UTF-8 bytes of a chunk's text: Milvus's VARCHAR limit (a cluster counts bytes).
MAX_FIELD_BYTES = 65_535
#: Metadata keys a document's ``meta`` may not use: the row's own fields in Milvus.
RESERVED_META = frozenset(
    {
        "id",
        "doc_id",
        "doc_key",
        "document_id",
        "ref_doc_id",
        "text",
        "embedding",
        "sparse_embedding",
    }
)
_INT64 = (-(2**63), 2**63 - 1)


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


def check_id(value: Any, where: str, *, chunk_mark: bool = False) -> str:
    """``value`` if it is a usable document id, else a `WriteError` naming ``where``;
    ``chunk_mark``: ``#`` is accepted (an id to delete)."""
    if not isinstance(value, str) or not value.strip():
        raise WriteError(f"'{where}' MUST be a non-empty string", where)
    if len(value) > MAX_ID_CHARS:
        raise WriteError(f"'{where}' MUST be at most {MAX_ID_CHARS} characters", where)
    if not _storable(value):
        raise WriteError(f"'{where}' MUST be valid Unicode text (no lone surrogates)", where)
    if value == "None":  # what LlamaIndex stores as the document of a node without one
        raise WriteError(f"'{where}' MUST NOT be the reserved id 'None'", where)
    if "#" in value and not chunk_mark:
        raise WriteError(
            f"'{where}' MUST NOT contain '#' (it separates a document id from its chunk number)",
            where,
        )
    return value


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    """``meta`` if Milvus can store it with a row, else a `WriteError` naming the key."""
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise WriteError(f"'{where}' MUST be an object", where)
    for key, value in meta.items():
        if key in RESERVED_META or key.startswith(("_", "$")) or not _storable(key):
            raise WriteError(
                f"'{where}' MUST NOT use the key {key!r} (reserved for the index's own "
                "fields, or not storable)",
                f"{where}.{key}",
            )
        _check_value(value, f"{where}.{key}")
    return dict(meta)


def _check_value(value: Any, where: str) -> None:
    """A `WriteError` naming ``where`` for a value Milvus's JSON cannot hold."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise WriteError(f"'{where}' MUST be an integer within int64", where)
    if isinstance(value, float) and not math.isfinite(value):
        raise WriteError(f"'{where}' MUST be a finite number", where)
    if isinstance(value, str) and not _storable(value):
        raise WriteError(f"'{where}' MUST be valid Unicode text (no lone surrogates)", where)
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not _storable(key):
                raise WriteError(f"'{where}' has a key that is not storable text", where)
            _check_value(item, f"{where}.{key}")


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
        if not _storable(text):
            raise WriteError(
                f"'{where}.text' MUST be valid Unicode text (no lone surrogates)", f"{where}.text"
            )
        meta = check_meta(doc.get("meta", {}), f"{where}.meta")
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
    ids = [check_id(v, f"ids[{i}]", chunk_mark=True) for i, v in enumerate(value)]
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


def check_chunks(documents: Sequence[NewDocument], nodes: Sequence[TextNode]) -> None:
    """A `WriteError` naming the document whose chunk's text Milvus cannot hold."""
    place = {d.id: i for i, d in enumerate(documents)}
    for node in nodes:
        size = len(node.get_content().encode("utf-8"))
        if size > MAX_FIELD_BYTES:
            where = f"documents[{place[node.ref_doc_id or node.node_id]}].text"
            raise WriteError(
                f"'{where}' has a chunk of {size} bytes (UTF-8); the index holds at most "
                f"{MAX_FIELD_BYTES} per chunk (a run of text without spaces is one token to "
                "the chunker): break it up",
                where,
            )


class StoreWriteError(ValueError):
    """Milvus failed a write whose input was checked (unreachable, full, ...)."""


class MilvusWriter:
    """Upserts and deletes in the Milvus collection an index was loaded from.

    ``index`` is the served ``VectorStoreIndex`` (its vector store, a
    `KeyedMilvusVectorStore`, is switched to upsert by primary key); ``embed_model``
    the index's; ``chunking`` as the index was built (None: one node per document).
    Writes are serialised and exclusive of this process's searches (`RowsLock`). A
    collection without derived row keys (built by an older hyde-plus) is refused: a
    `ValueError` saying to rebuild it."""

    kind = "milvus"

    def __init__(
        self,
        index: Any,
        embed_model: BaseEmbedding,
        chunking: Chunking | None,
    ) -> None:
        from ..stores.milvus_rows import has_row_keys

        self.store = index.vector_store
        if not has_row_keys(self.store.client, self.collection):
            raise ValueError(
                f"collection {self.collection!r} was built by an older hyde-plus, whose rows "
                "can only be found by their ids: it is served read-only by this version. "
                "Rebuild it with `hyde-plus index DIR --store milvus` (same --uri and "
                "--collection) to serve it --writable"
            )
        self.store.upsert_mode = True  # Milvus upsert: replace the row of the same key
        self.embed_model = embed_model
        self.chunking = chunking

    @property
    def collection(self) -> str:
        return str(self.store.collection_name)

    def _rows(self, documents: Sequence[str]) -> list[dict[str, Any]]:
        """The rows (``id``, ``doc_key``) of ``documents``, found by their keys."""
        if not documents:
            return []
        rows: list[dict[str, Any]] = self.store.client.query(
            collection_name=self.collection,
            filter=key_filter(KEY_FIELD, [doc_key(d) for d in documents]),
            output_fields=["id", KEY_FIELD],
            consistency_level="Strong",  # see the rows written just before, on a cluster too
        )
        return rows

    def _delete_rows(self, keys: Sequence[str]) -> None:
        if keys:
            self.store.client.delete(collection_name=self.collection, filter=key_filter("id", keys))

    def add(self, documents: Sequence[NewDocument]) -> AddResult:
        """Upsert ``documents`` (see the module's docstring for the order of steps):
        checked (chunks, clashes) and embedded before anything is written."""
        ids = [d.id for d in documents]
        if not documents:
            return AddResult([], 0)
        nodes = document_nodes(documents, self.embed_model, self.chunking)
        check_chunks(documents, nodes)
        self._check_no_clash(documents, nodes)
        embed_nodes(nodes, self.embed_model)  # before any write: a failure writes nothing
        with self._failures(), self.store.rows_lock.exclusive():
            self.store.add(nodes)
            self._drop_stale(ids, {row_key(n) for n in nodes})
        return AddResult(ids, len(nodes))

    def _drop_stale(self, documents: Sequence[str], keep: set[str]) -> None:
        """Delete the rows of ``documents`` whose keys are not among the new chunks'
        ``keep`` (chunks of an older, longer version)."""
        self._delete_rows([str(r["id"]) for r in self._rows(documents) if str(r["id"]) not in keep])

    def _check_no_clash(self, documents: Sequence[NewDocument], nodes: Sequence[TextNode]) -> None:
        """A `WriteError` when a chunk's id is the id of a document in the index (one
        a build indexed from ``.jsonl``, say): a reader could not tell them apart."""
        place = {d.id: i for i, d in enumerate(documents)}
        chunk_ids = {n.node_id: n.ref_doc_id or n.node_id for n in nodes}
        chunk_ids = {c: d for c, d in chunk_ids.items() if c != d}
        with self._failures():
            taken = {str(r[KEY_FIELD]) for r in self._rows(list(chunk_ids))}
        for chunk, document in chunk_ids.items():
            if doc_key(chunk) in taken:
                where = f"documents[{place[document]}].id"
                raise WriteError(
                    f"'{where}': its chunk {chunk!r} has the id of another document in the "
                    "index; choose another id",
                    where,
                )

    def delete(self, ids: Sequence[str]) -> int:
        """Delete every chunk of the documents ``ids``; how many of them were there."""
        with self._failures(), self.store.rows_lock.exclusive():
            rows = self._rows(ids)
            self._delete_rows([str(r["id"]) for r in rows])
        there = {str(r[KEY_FIELD]) for r in rows}
        return sum(1 for d in ids if doc_key(d) in there)

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """Milvus's own errors during a checked write as a `StoreWriteError`."""
        from pymilvus.exceptions import MilvusException

        try:
            yield
        except MilvusException as exc:
            message = getattr(exc, "message", "") or str(exc)
            raise StoreWriteError(f"Milvus: {message}") from exc
