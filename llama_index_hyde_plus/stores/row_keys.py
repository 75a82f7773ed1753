"""How hyde-plus addresses the rows of a Milvus collection: by keys it derives, never
by user text.

Every row carries ``doc_key``, the SHA-256 of its document's id in hex, in a VARCHAR
field of its own, and its primary key is ``<doc_key>-<24 hex of the SHA-256 of the
node id>``. Both are in a fixed alphabet (``0-9a-f`` and ``-``), so selecting or
deleting a document's rows is ``doc_key in ["<hex>", ...]`` whatever characters the
document id holds (quotes, backslashes, control characters), and a chunk of one
document can never take the primary key of another document's row (``guide`` chunked
and a document whose id is ``guide#1`` are two rows with two keys). What a reader
sees is unchanged: the node id (``guide#1``), the document id (``ref_doc_id``) and the
metadata come from the node stored with the row.

A collection built before these keys (no ``doc_key`` field) is still searched; writes
to it are refused (`milvus_rows.has_row_keys`), since its rows can only be found by
pasting ids. The Milvus store that writes rows so is `milvus_rows.KeyedMilvusVectorStore`.

`RowsLock` makes a write's upsert and delete one step for the searches of the same
process: a search holds it shared, a write holds it alone.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from llama_index.core.schema import BaseNode

#: The field holding a row's document key.
KEY_FIELD = "doc_key"
#: What a key Milvus is ever given looks like (`key_filter` checks every one).
_KEY = re.compile(r"^[0-9a-f]{64}(-[0-9a-f]{24})?$")


def _digest(text: str) -> str:
    # surrogatepass: a lone surrogate digests instead of crashing (writes refuse such
    # ids before this; Milvus cannot store them)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def doc_key(document_id: str) -> str:
    """The key of every row of the document ``document_id``."""
    return _digest(document_id)


def document_of(node: BaseNode) -> str:
    """The id of the document ``node`` belongs to (its own id when it is a whole
    document built without a SOURCE relationship)."""
    return node.ref_doc_id or node.node_id


def row_key(node: BaseNode) -> str:
    """The primary key of ``node``'s row."""
    return key_of(document_of(node), node.node_id)


def key_of(document_id: str, node_id: str) -> str:
    """The primary key of the row of node ``node_id`` of document ``document_id``
    (the document itself when it is one node)."""
    return f"{doc_key(document_id)}-{_digest(node_id)[:24]}"


def key_filter(field: str, keys: Sequence[str]) -> str:
    """The Milvus filter ``<field> in [...]`` over derived ``keys``; a `ValueError` for
    anything that is not one (so no other text ever reaches an expression)."""
    bad = [k for k in keys if not isinstance(k, str) or not _KEY.match(k)]
    if bad or field not in ("id", KEY_FIELD):
        raise ValueError(f"not a derived row key: {bad[:1]!r} ({field})")
    return f"{field} in [" + ",".join(f'"{k}"' for k in keys) + "]"


class RowsLock:
    """A shared/exclusive lock: any number of searches at once, or one write alone.
    A waiting write goes before searches that arrive after it, so a stream of
    searches cannot hold a write off."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writing and not self._readers)
            finally:
                self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
