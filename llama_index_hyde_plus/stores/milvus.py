"""`MilvusStore`: a hybrid (BM25 full-text + dense) Milvus collection, built by
`llama_index_hyde_plus.milvus`, in a Milvus Lite file or on a cluster."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding

from ..milvus import DEFAULT_COLLECTION
from .base import BuildSettings, Store

if TYPE_CHECKING:
    from ..indexing import IndexInfo

__all__ = ["DEFAULT_COLLECTION", "MilvusStore"]


class MilvusStore(Store):
    """Collection (an alias) ``collection`` at ``uri``: a Milvus Lite file path or a
    cluster URL with ``token``. Needs the ``milvus`` extra."""

    kind: ClassVar[str] = "milvus"
    modes: ClassVar[tuple[str, ...]] = ("hybrid",)
    search: ClassVar[str] = "BM25 + dense"

    def __init__(self, uri: str, *, collection: str = DEFAULT_COLLECTION, token: str = "") -> None:
        from ..models import require_extra

        require_extra("milvus", ("pymilvus", "llama_index.vector_stores.milvus"), "--store milvus")
        from ..milvus import check_collection_name, check_uri

        check_uri(uri)
        check_collection_name(collection)
        self.uri, self.collection, self.token = uri, collection, token

    @property
    def location(self) -> str:
        from .._redact import redact_uri

        return f"collection {self.collection!r} at {redact_uri(self.uri)}"

    def check_target(self, docs: Path | None = None) -> None:
        from ..milvus import is_local_uri

        if docs is not None and is_local_uri(self.uri):
            target = Path(self.uri).expanduser().resolve()
            if target == docs.expanduser().resolve() or docs.expanduser().resolve() in (
                target.parents
            ):
                raise ValueError(f"--uri {self.uri} is inside the documents folder {docs}")

    def _build(
        self, documents: Sequence[Document], embed_model: BaseEmbedding, settings: BuildSettings
    ) -> IndexInfo:
        from ..indexing import IndexInfo
        from ..milvus import build_milvus_index

        start = time.perf_counter()
        index = build_milvus_index(
            documents,
            embed_model,
            self.uri,
            collection=self.collection,
            token=self.token,
            **settings.as_kwargs(),
        )
        meta = self.meta() or {}
        chunks = int(meta.get("chunks") or len(index.index_struct.nodes_dict) or len(documents))
        dim = int(meta.get("dim") or len(embed_model.get_query_embedding("dimension probe")))
        seconds = time.perf_counter() - start
        return IndexInfo(
            self.location,
            len(documents),
            dim,
            settings.embed_spec,
            settings.max_length,
            seconds,
            chunks,
        )

    def meta(self) -> dict[str, Any] | None:
        from ..milvus import read_milvus_meta

        return read_milvus_meta(self.uri, self.collection, token=self.token)

    def load(self, embed_model: BaseEmbedding) -> VectorStoreIndex:
        from ..milvus import load_milvus_index

        return load_milvus_index(
            self.uri, embed_model, collection=self.collection, token=self.token
        )

    def retriever(self, index: VectorStoreIndex, top_k: int) -> BaseRetriever:
        from ..milvus import hybrid_retriever

        return hybrid_retriever(index, top_k)
