"""LlamaIndex's Milvus store writing rows under the keys of `row_keys` (needs the
``milvus`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.utils import node_to_metadata_dict
from llama_index.vector_stores.milvus import MilvusVectorStore

from .row_keys import KEY_FIELD, RowsLock, doc_key, document_of, row_key


def has_row_keys(client: Any, physical: str) -> bool:
    """Whether the collection ``physical`` has the ``doc_key`` field."""
    fields = client.describe_collection(physical).get("fields", [])
    return any(f.get("name") == KEY_FIELD for f in fields)


class KeyedMilvusVectorStore(MilvusVectorStore):
    """LlamaIndex's ``MilvusVectorStore`` writing rows under derived keys (see
    `row_keys`); created with the ``doc_key`` field."""

    _rows_lock: RowsLock = PrivateAttr(default_factory=RowsLock)

    def __init__(self, **kwargs: Any) -> None:
        from pymilvus import DataType

        super().__init__(
            scalar_field_names=[KEY_FIELD], scalar_field_types=[DataType.VARCHAR], **kwargs
        )

    @property
    def rows_lock(self) -> RowsLock:
        """Held shared by this process's searches, alone by its writes."""
        return self._rows_lock

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Write ``nodes`` (embedded) as rows under their derived keys (upserted in
        ``upsert_mode``); the node ids, as LlamaIndex expects."""
        rows = [self._row(node) for node in nodes]
        write = self.client.upsert if self.upsert_mode else self.client.insert
        for start in range(0, len(rows), self.batch_size):
            write(self.collection_name, rows[start : start + self.batch_size])
        return [node.node_id for node in nodes]

    def _row(self, node: BaseNode) -> dict[str, Any]:
        row = node_to_metadata_dict(node, remove_text=True, text_field=self.text_key)
        row[self.text_key] = node.get_content()
        row["id"] = row_key(node)
        row[KEY_FIELD] = doc_key(document_of(node))
        row[self.embedding_field] = node.embedding
        return row
