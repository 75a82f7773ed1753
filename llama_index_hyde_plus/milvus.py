"""Hybrid (BM25 + dense) search on Milvus: Milvus Lite from a local file, or a cluster.

The same code serves both: a ``uri`` that is a file path runs Milvus Lite in-process
(``milvus-lite``, no server), a ``http(s)://`` URI (and ``token``) talks to a Milvus
cluster or Zilliz Cloud. The collection has a dense vector field and a sparse field
filled by Milvus's built-in BM25 function from the text, and hybrid queries are fused
by Milvus (RRF, k=60, or weighted). With `TransformRetriever`, the dense side gets the
HyDE embedding and the BM25 side the passage text (query plus passage with
``include_query=True``). Needs the ``milvus`` extra.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle

from .indexing import ProgressFn, embed_nodes, nodes_from_documents

Ranker = Literal["rrf", "weighted"]
DEFAULT_COLLECTION = "hyde_plus"


def is_local_uri(uri: str) -> bool:
    """A Milvus Lite file (not ``http://``, ``https://`` or ``tcp://``)."""
    return "://" not in uri


def _meta_path(uri: str, collection: str) -> Path | None:
    return Path(f"{uri}.{collection}.hyde_plus.json") if is_local_uri(uri) else None


def milvus_store(
    uri: str,
    *,
    collection: str = DEFAULT_COLLECTION,
    dim: int | None = None,
    token: str = "",
    overwrite: bool = False,
    ranker: Ranker = "rrf",
    weights: tuple[float, float] = (1.0, 1.0),
) -> Any:
    """A ``MilvusVectorStore`` with a dense field, a BM25 sparse field and hybrid fusion.

    ``ranker="rrf"`` fuses with reciprocal rank fusion (k=60); ``"weighted"`` with
    ``weights`` (sparse, dense) on normalised scores.
    """
    from llama_index.vector_stores.milvus import MilvusVectorStore
    from llama_index.vector_stores.milvus.utils import BM25BuiltInFunction

    if ranker not in ("rrf", "weighted"):
        raise ValueError("ranker must be 'rrf' or 'weighted'")
    if is_local_uri(uri):
        Path(uri).expanduser().parent.mkdir(parents=True, exist_ok=True)
    params: dict[str, Any] = {"k": 60} if ranker == "rrf" else {"weights": list(weights)}
    return MilvusVectorStore(
        uri=str(Path(uri).expanduser()) if is_local_uri(uri) else uri,
        token=token,
        collection_name=collection,
        dim=dim,
        overwrite=overwrite,
        enable_sparse=True,
        sparse_embedding_function=BM25BuiltInFunction(),
        hybrid_ranker="RRFRanker" if ranker == "rrf" else "WeightedRanker",
        hybrid_ranker_params=params,
    )


def build_milvus_index(
    documents: Sequence[Document],
    embed_model: BaseEmbedding,
    uri: str,
    *,
    collection: str = DEFAULT_COLLECTION,
    token: str = "",
    embed_spec: str = "",
    max_length: int = 256,
    batch_size: int = 64,
    progress: ProgressFn | None = None,
) -> VectorStoreIndex:
    """Embed ``documents`` and write them to a fresh hybrid collection (replacing one of
    the same name). Beside a Milvus Lite file, a small JSON records how it was embedded."""
    nodes = nodes_from_documents(documents)
    if not nodes:
        raise ValueError("no documents to index")
    embed_nodes(nodes, embed_model, batch_size=batch_size, progress=progress)
    dim = len(nodes[0].embedding or [])
    store = milvus_store(uri, collection=collection, dim=dim, token=token, overwrite=True)
    index = VectorStoreIndex(
        nodes,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embed_model,
    )
    meta = _meta_path(uri, collection)
    if meta is not None:
        meta.write_text(
            json.dumps(
                {
                    "documents": len(nodes),
                    "dim": dim,
                    "embed": embed_spec,
                    "max_length": max_length,
                    "collection": collection,
                }
            )
        )
    return index


def read_milvus_meta(uri: str, collection: str = DEFAULT_COLLECTION) -> dict[str, Any] | None:
    """How a local collection was embedded (None for a cluster or an unknown file)."""
    meta = _meta_path(uri, collection)
    if meta is None or not meta.is_file():
        return None
    return dict(json.loads(meta.read_text()))


def load_milvus_index(
    uri: str,
    embed_model: BaseEmbedding,
    *,
    collection: str = DEFAULT_COLLECTION,
    token: str = "",
    ranker: Ranker = "rrf",
) -> VectorStoreIndex:
    """Open an existing hybrid collection."""
    if is_local_uri(uri) and not Path(uri).expanduser().exists():
        raise ValueError(
            f"no Milvus Lite database at {uri}; build one with "
            "`hyde-plus index DIR --store milvus --uri PATH`"
        )
    store = milvus_store(uri, collection=collection, token=token, ranker=ranker)
    return VectorStoreIndex.from_vector_store(store, embed_model=embed_model)


class MilvusHybridRetriever(BaseRetriever):
    """Milvus hybrid search (BM25 + dense, fused by Milvus) as a LlamaIndex retriever.

    Its async path runs the synchronous client in a worker thread: pymilvus's async
    client binds to the first event loop that uses it and fails in any later one (each
    ``asyncio.run``, each notebook cell), so it is not used.
    """

    search_type = "hybrid"

    def __init__(self, index: VectorStoreIndex, top_k: int = 10) -> None:
        super().__init__()
        self._inner = index.as_retriever(vector_store_query_mode="hybrid", similarity_top_k=top_k)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._inner.retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._inner.retrieve, query_bundle)


def hybrid_retriever(index: VectorStoreIndex, top_k: int = 10) -> MilvusHybridRetriever:
    """A retriever that runs Milvus hybrid search (BM25 + dense, fused by Milvus)."""
    return MilvusHybridRetriever(index, top_k)
