"""Where the vectors live: one `Store` interface, two implementations.

`FaissStore` is an index folder on disk (dense search, the embedded default);
`MilvusStore` is a Milvus collection with BM25 full-text and dense fields (hybrid
search), in a Milvus Lite file or on a cluster. The CLI, the evaluation runner and the
RCP server take any `Store`.
"""

from __future__ import annotations

from .base import Store
from .choice import STORE_KINDS, STORES, kind_at, make_store, open_store, store_for, store_kind
from .faiss import FaissStore
from .milvus import MilvusStore

__all__ = [
    "STORES",
    "STORE_KINDS",
    "FaissStore",
    "MilvusStore",
    "Store",
    "kind_at",
    "make_store",
    "open_store",
    "store_for",
    "store_kind",
]
