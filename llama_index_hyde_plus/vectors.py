"""Embeddings the quality guards need: the question's, the generated text's, and the
stored vectors of retrieved documents.

`Embedder` wraps a LlamaIndex embedding model with a small LRU cache, so a question or
passage embedded for the gate is not embedded again for the search, and runs blocking
models off the event loop on the async path. `DocVectors` reads a retrieved node's
vector from the node, the FAISS index or the Milvus collection it came from, and only
re-embeds its text when the store cannot say.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore

logger = logging.getLogger(__name__)

Vec = list[float]


class _LRU:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[tuple[str, str], Vec] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> Vec | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def set(self, key: tuple[str, str], value: Vec) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)


def _native_async(model: BaseEmbedding, name: str) -> bool:
    return getattr(type(model), name, None) is not getattr(BaseEmbedding, name, None)


class Embedder:
    """A LlamaIndex embedding model with an LRU cache of recent texts.

    Questions are embedded as queries (``get_query_embedding``) and generated passages
    and documents as text (``get_text_embedding``), as an asymmetric model expects; the
    HyDE paper embeds its passages with the document encoder.
    """

    def __init__(self, model: BaseEmbedding, *, max_entries: int = 4096) -> None:
        if not isinstance(model, BaseEmbedding):
            raise TypeError(
                f"embed_model must be a LlamaIndex BaseEmbedding, not {type(model).__name__}"
            )
        self.model = model
        self._cache = _LRU(max_entries)

    def query(self, text: str) -> Vec:
        key = ("q", text)
        hit = self._cache.get(key)
        if hit is None:
            hit = list(self.model.get_query_embedding(text))
            self._cache.set(key, hit)
        return hit

    def texts(self, texts: Sequence[str]) -> list[Vec]:
        missing = [t for t in dict.fromkeys(texts) if self._cache.get(("t", t)) is None]
        if missing:
            for text, vec in zip(missing, self.model.get_text_embedding_batch(missing)):
                self._cache.set(("t", text), list(vec))
        return [self._get_text(t) for t in texts]

    async def aquery(self, text: str) -> Vec:
        key = ("q", text)
        hit = self._cache.get(key)
        if hit is None:
            if _native_async(self.model, "_aget_query_embedding"):
                hit = list(await self.model.aget_query_embedding(text))
            else:
                hit = list(await asyncio.to_thread(self.model.get_query_embedding, text))
            self._cache.set(key, hit)
        return hit

    async def atexts(self, texts: Sequence[str]) -> list[Vec]:
        missing = [t for t in dict.fromkeys(texts) if self._cache.get(("t", t)) is None]
        if missing:
            if _native_async(self.model, "_aget_text_embeddings") or _native_async(
                self.model, "_aget_text_embedding"
            ):
                vecs = await self.model.aget_text_embedding_batch(missing)
            else:
                vecs = await asyncio.to_thread(self.model.get_text_embedding_batch, missing)
            for text, vec in zip(missing, vecs):
                self._cache.set(("t", text), list(vec))
        return [self._get_text(t) for t in texts]

    def _get_text(self, text: str) -> Vec:
        hit = self._cache.get(("t", text))
        if hit is None:  # evicted between the batch and here (tiny cache): embed alone
            hit = list(self.model.get_text_embedding(text))
            self._cache.set(("t", text), hit)
        return hit


def embed_model_of(source: object) -> BaseEmbedding | None:
    """The embedding model a LlamaIndex vector retriever (or index) searches with, if it
    has one."""
    model = getattr(source, "_embed_model", None)
    return model if isinstance(model, BaseEmbedding) else None


class DocVectors:
    """Stored vectors of retrieved documents, by node id.

    Looks, in order, at ``node.embedding``, the FAISS index behind a
    ``VectorIndexRetriever`` (``reconstruct``), the Milvus collection behind one
    (``get``), and only then re-embeds the node's text with ``embedder``. Vectors are
    cached per node id.
    """

    def __init__(
        self, retriever: BaseRetriever, embedder: Embedder | None, *, max_entries: int = 50_000
    ) -> None:
        self.retriever = retriever
        self.embedder = embedder
        self._cache = _LRU(max_entries)
        self._faiss_ids: dict[str, int] | None = None
        self._lock = threading.Lock()
        self.source = "unknown"
        """Where the last lookup found its vectors: node, faiss, milvus or embedding."""

    def get(self, nodes: Sequence[NodeWithScore]) -> list[Vec]:
        """Vectors of ``nodes`` in order (blocking; store reads are quick or remote)."""
        found = self._known(nodes)
        missing = [n for n in nodes if n.node.node_id not in found]
        fetched = self._from_store(missing) if missing else {}
        missing = [n for n in missing if n.node.node_id not in fetched]
        if missing:
            if self.embedder is None:
                raise ValueError("no embedding model to embed documents the store cannot return")
            texts = [n.node.get_content(metadata_mode="embed") for n in missing]  # type: ignore[arg-type]
            self.source = "embedding"
            fetched.update(zip((n.node.node_id for n in missing), self.embedder.texts(texts)))
        for node_id, vec in fetched.items():  # what was already cached stays as it is
            self._cache.set(("d", node_id), vec)
        found.update(fetched)
        return [found[n.node.node_id] for n in nodes]

    async def aget(self, nodes: Sequence[NodeWithScore]) -> list[Vec]:
        """Async twin of `get`: store reads and embedding run off the event loop."""
        found = self._known(nodes)
        if all(n.node.node_id in found for n in nodes):
            return [found[n.node.node_id] for n in nodes]
        return await asyncio.to_thread(self.get, nodes)

    def _known(self, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        found: dict[str, Vec] = {}
        for item in nodes:
            node_id = item.node.node_id
            cached = self._cache.get(("d", node_id))
            if cached is not None:
                found[node_id] = cached
            elif item.node.embedding is not None:
                found[node_id] = list(item.node.embedding)
                self.source = "node"
        return found

    def _from_store(self, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        from .stores.choice import vector_store_kind

        store = getattr(self.retriever, "_vector_store", None)
        kind = vector_store_kind(store)
        try:
            if kind == "faiss":
                return self._faiss(store, nodes)
            if kind == "milvus":
                return self._milvus(store, nodes)
        except Exception as exc:  # a store that cannot say: re-embed instead
            logger.debug("reading vectors from %s failed (%s); re-embedding", kind, exc)
        return {}

    def _faiss(self, store: Any, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        with self._lock:
            if self._faiss_ids is None:
                index = getattr(self.retriever, "_index", None)
                mapping = index.index_struct.nodes_dict if index is not None else {}
                self._faiss_ids = {node_id: int(vid) for vid, node_id in mapping.items()}
        faiss_index = store._faiss_index
        out: dict[str, Vec] = {}
        for item in nodes:
            vid = self._faiss_ids.get(item.node.node_id)
            if vid is not None and 0 <= vid < faiss_index.ntotal:
                out[item.node.node_id] = [float(x) for x in faiss_index.reconstruct(vid)]
        if out:
            self.source = "faiss"
        return out

    def _milvus(self, store: Any, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        ids = [n.node.node_id for n in nodes]
        rows = store.client.get(
            collection_name=store.collection_name, ids=ids, output_fields=[store.embedding_field]
        )
        out = {str(row["id"]): [float(x) for x in row[store.embedding_field]] for row in rows}
        if out:
            self.source = "milvus"
        return out
