"""Embeddings the quality guards need: the question's, the generated text's, and the
stored vectors of retrieved documents.

`Embedder` wraps a LlamaIndex embedding model with an LRU cache bounded by entries and
bytes, so a question or passage embedded for the gate is not embedded again for the
search, and runs blocking models off the event loop on the async path. `DocVectors`
reads a retrieved node's vector from the node, the FAISS index or the Milvus collection
it came from, and only re-embeds its text when the store cannot say.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore

from ..caching.cache import BoundedLRU, LRUHolder
from ..calls import door
from ..calls.door import Deadline
from ..calls.workers import DaemonWorkers
from ..stores.row_keys import key_filter, row_key
from .loops import ASYNC, BLOCKING
from .requests import Embed, ReadStore, Steps

logger = logging.getLogger(__name__)

Vec = list[float]

EMBEDDER_MAX_BYTES = 64 << 20
"""`Embedder`'s cache budget when none is given: 64 MiB (the texts it is keyed by
included), about 10,000 1536-d float32 vectors of short texts."""
DOC_VECTORS_MAX_BYTES = 128 << 20
"""`DocVectors`' cache budget when none is given: 128 MiB, about 21,000 1536-d or
87,000 384-d float32 vectors."""


def _pack(vector: object) -> npt.NDArray[np.floating[Any]] | None:
    """``vector`` as a compact read-only 1-d array of its own: float32 when that
    loses nothing (the output of every real embedding model, which computes in
    float32), else float64, so a hit returns exactly what the model did. None for what
    cannot be searched with (not a 1-d run of real numbers, empty, NaN or infinite):
    it is not cached, so a glitch is not served again."""
    try:
        arr = np.asarray(vector)
    except Exception:
        return None
    if arr.ndim != 1 or not arr.size or arr.dtype.kind not in "fiu":
        return None
    wide = arr.astype(np.float64, copy=False)
    if not np.isfinite(wide).all():
        return None
    with np.errstate(over="ignore"):
        narrow = wide.astype(np.float32)
    packed = narrow if np.array_equal(narrow, wide) else np.array(wide, dtype=np.float64)
    packed.flags.writeable = False
    return packed


def _entry_size(key: tuple[str, str], value: npt.NDArray[Any]) -> int:
    return sys.getsizeof(key) + sum(sys.getsizeof(k) for k in key) + sys.getsizeof(value)


class _LRU(LRUHolder[tuple[str, str], npt.NDArray[Any]]):
    """Vectors by ``(kind, text or id)``, held as compact arrays (`_pack`) in a
    `BoundedLRU` of at most ``max_entries`` entries and ``max_bytes`` bytes, key texts
    included (a 1 MB question as a key weighs 1 MB). `get` returns a new list: the
    caller and the cache never share one."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._lru = BoundedLRU(max_entries, max_bytes, _entry_size)

    def get(self, key: tuple[str, str]) -> Vec | None:
        packed = self._lru.get(key)
        return None if packed is None else packed.tolist()

    def set(self, key: tuple[str, str], value: object) -> None:
        packed = _pack(value)
        if packed is not None:
            self._lru.set(key, packed)


class Embedder:
    """A LlamaIndex embedding model with an LRU cache of recent texts, bounded by
    ``max_entries`` and ``max_bytes`` (vectors and the texts they are keyed by).

    Questions are embedded as queries (``get_query_embedding``) and generated passages
    and documents as text (``get_text_embedding``), as an asymmetric model expects; the
    HyDE paper embeds its passages with the document encoder. Every method returns
    new lists of exactly the values the model returned.

    Args:
        model: the LlamaIndex embedding model.
        max_entries: most vectors kept.
        max_bytes: most bytes the kept vectors and their texts weigh in all.
    """

    def __init__(
        self,
        model: BaseEmbedding,
        *,
        max_entries: int = 4096,
        max_bytes: int = EMBEDDER_MAX_BYTES,
    ) -> None:
        if not isinstance(model, BaseEmbedding):
            raise TypeError(
                f"embed_model must be a LlamaIndex BaseEmbedding, not {type(model).__name__}"
            )
        self.model = model
        self._cache = _LRU(max_entries, max_bytes)

    def embed_query(self, text: str, deadline: Deadline | None = None) -> Steps[Vec]:
        """The query embedding of ``text`` (cached per `Embedder`), as a step (`loops`
        carries it out: `query` and `aquery` do).

        Args:
            text: the question.
            deadline: when to stop waiting for the model (on its own worker threads,
                or its native coroutine cancelled; `ModelTimeoutError` once it passes);
                None: unbounded (a blocking model called in this thread).
        """
        key = ("q", text)
        hit = self._cache.get(key)
        if hit is None:
            hit = list((yield Embed(self.model, "query", text, deadline)))
            self._cache.set(key, hit)
        return hit

    def embed_texts(
        self, texts: Sequence[str], deadline: Deadline | None = None
    ) -> Steps[list[Vec]]:
        """Document embeddings of ``texts``, in order, as a step: only those not
        cached are embedded, each distinct text once, in one batch (then one by one
        for any the model's batch left out).

        Args:
            texts: passages or documents.
            deadline: when to stop waiting for the model (shared by all its calls), as
                in `embed_query`.
        """
        found = self._cached_texts(texts)
        missing = [t for t, vec in found.items() if vec is None]
        if missing:
            batch = yield Embed(self.model, "texts", self._fit(missing), deadline)
            self._keep(found, missing, batch)
            for text in self._still_missing(found):  # the model returned too few
                vec = yield Embed(self.model, "text", self._fit([text])[0], deadline)
                found[text] = self._keep_one(text, vec)
        return [found[t] for t in texts]  # type: ignore[misc]

    def query(self, text: str, deadline: Deadline | None = None) -> Vec:
        """`embed_query`, blocking."""
        return BLOCKING.run(self.embed_query(text, deadline))

    def texts(self, texts: Sequence[str], deadline: Deadline | None = None) -> list[Vec]:
        """`embed_texts`, blocking."""
        return BLOCKING.run(self.embed_texts(texts, deadline))

    async def aquery(self, text: str, deadline: Deadline | None = None) -> Vec:
        """`embed_query` on the async path: the model's own async method when it has
        one, else its blocking one on its own worker threads."""
        return await ASYNC.run(self.embed_query(text, deadline))

    async def atexts(self, texts: Sequence[str], deadline: Deadline | None = None) -> list[Vec]:
        """`embed_texts` on the async path, as `aquery` calls the model."""
        return await ASYNC.run(self.embed_texts(texts, deadline))

    def _fit(self, texts: list[str]) -> list[str]:
        """``texts`` cut to the model's window where the model says how
        (``fit_to_window``, as `local.LocalEmbedding` does): a generated passage longer
        than the window is embedded as the model would cut it, without the warning
        meant for documents that were split too coarsely."""
        fit = getattr(self.model, "fit_to_window", None)
        return [fit(t) for t in texts] if callable(fit) else texts

    def pool(self) -> DaemonWorkers:
        """The model's own worker threads (one pool per provider: its class, model and
        endpoint), so a hung embedder holds only those."""
        return door.pool(self.model)

    def _cached_texts(self, texts: Sequence[str]) -> dict[str, Vec | None]:
        """Each distinct text's cached vector, None where there is none."""
        return {t: self._cache.get(("t", t)) for t in dict.fromkeys(texts)}

    def _keep(
        self, found: dict[str, Vec | None], texts: Sequence[str], vecs: Sequence[Any]
    ) -> None:
        for text, vec in zip(texts, vecs):
            found[text] = self._keep_one(text, vec)

    def _keep_one(self, text: str, vec: Any) -> Vec:
        out = list(vec)
        self._cache.set(("t", text), out)
        return out

    @staticmethod
    def _still_missing(found: dict[str, Vec | None]) -> list[str]:
        return [t for t, vec in found.items() if vec is None]


def embed_model_of(source: object) -> BaseEmbedding | None:
    """The embedding model a LlamaIndex vector retriever (or index) searches with, if it
    has one."""
    model = getattr(source, "_embed_model", None)
    return model if isinstance(model, BaseEmbedding) else None


def content_key(node: NodeWithScore) -> str:
    """What `DocVectors` caches ``node``'s vector by: its id and a digest of the text
    that is embedded for it (``get_content(metadata_mode="embed")``), so a document
    whose text changes under the same id (a Milvus upsert, a database-backed
    retriever) misses the cache and is read or embedded again."""
    text = node.node.get_content(metadata_mode="embed")  # type: ignore[arg-type]
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    return f"{node.node.node_id}\x00{digest.hexdigest()}"


class DocVectors:
    """Stored vectors of retrieved documents, by node id and content.

    Looks, in order, at ``node.embedding``, the FAISS index behind a
    ``VectorIndexRetriever`` (``reconstruct``), the Milvus collection behind one
    (``get``), and only then re-embeds the node's text with ``embedder``. Vectors read
    or embedded are cached by node id and the digest of the node's embedded text
    (`content_key`: a changed text is a miss, never its old vector), at most
    ``max_entries`` of them and ``max_bytes`` in all (float32 when that is exact, as
    stored vectors are).
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        embedder: Embedder | None,
        *,
        max_entries: int = 50_000,
        max_bytes: int = DOC_VECTORS_MAX_BYTES,
    ) -> None:
        self.retriever = retriever
        self.embedder = embedder
        self._cache = _LRU(max_entries, max_bytes)
        self._faiss_ids: dict[str, int] | None = None
        self._lock = threading.Lock()
        self.source = "unknown"
        """Where the last lookup found its vectors: node, faiss, milvus or embedding."""

    def read(
        self, nodes: Sequence[NodeWithScore], deadline: Deadline | None = None
    ) -> Steps[list[Vec]]:
        """Vectors of ``nodes`` in order, as a step (`loops` carries it out: `get` and
        `aget` do).

        Args:
            nodes: retrieved nodes.
            deadline: when to stop waiting for a remote store and the embedder (each on
                worker threads of its own; `ModelTimeoutError` once it passes); None: no
                bound.
        """
        found = self._known(nodes)
        missing = [n for n in nodes if n.node.node_id not in found]
        if not missing:
            return [found[n.node.node_id] for n in nodes]
        kind, store = self._store()
        fetched = yield ReadStore(partial(self._from_store, missing), kind, store, deadline)
        missing = [n for n in missing if n.node.node_id not in fetched]
        if missing:
            texts = self._texts_of(missing)
            assert self.embedder is not None  # `_texts_of` raised otherwise
            vecs = yield from self.embedder.embed_texts(list(texts.values()), deadline)
            fetched.update(zip(texts, vecs))
        return self._kept(nodes, found, fetched)

    def get(self, nodes: Sequence[NodeWithScore], deadline: Deadline | None = None) -> list[Vec]:
        """`read`, blocking."""
        return BLOCKING.run(self.read(nodes, deadline))

    async def aget(
        self, nodes: Sequence[NodeWithScore], deadline: Deadline | None = None
    ) -> list[Vec]:
        """`read` on the async path: store reads on worker threads, embedding as
        `Embedder.aquery` does it; never on the event loop nor its default executor."""
        return await ASYNC.run(self.read(nodes, deadline))

    def _texts_of(self, nodes: Sequence[NodeWithScore]) -> dict[str, str]:
        """What is embedded for each of ``nodes`` the store could not return, by node id
        (a `ValueError` with no embedder)."""
        if self.embedder is None:
            raise ValueError("no embedding model to embed documents the store cannot return")
        self.source = "embedding"
        return {n.node.node_id: n.node.get_content(metadata_mode="embed") for n in nodes}  # type: ignore[arg-type]

    def _kept(
        self, nodes: Sequence[NodeWithScore], found: dict[str, Vec], fetched: dict[str, Vec]
    ) -> list[Vec]:
        """``nodes``' vectors in order, the ``fetched`` ones cached (what was already
        cached stays as it is)."""
        for item in nodes:
            vec = fetched.get(item.node.node_id)
            if vec is not None:
                self._cache.set(("d", content_key(item)), vec)
        found.update(fetched)
        return [found[n.node.node_id] for n in nodes]

    def _known(self, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        found: dict[str, Vec] = {}
        for item in nodes:
            node_id = item.node.node_id
            cached = self._cache.get(("d", content_key(item)))
            if cached is not None:
                found[node_id] = cached
            elif item.node.embedding is not None:
                found[node_id] = list(item.node.embedding)
                self.source = "node"
        return found

    def _store(self) -> tuple[str | None, Any]:
        """The kind of vector store behind the retriever (faiss, milvus or None) and
        the store."""
        from ..stores.choice import vector_store_kind

        store = getattr(self.retriever, "_vector_store", None)
        return vector_store_kind(store), store

    def _from_store(self, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        kind, store = self._store()
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
                out[item.node.node_id] = faiss_index.reconstruct(vid).tolist()
        if out:
            self.source = "faiss"
        return out

    def _milvus(self, store: Any, nodes: Sequence[NodeWithScore]) -> dict[str, Vec]:
        """The stored vectors of ``nodes``' rows, found by their derived keys
        (`milvus_rows`; a collection built without them has none: re-embedded)."""
        keys = {row_key(n.node): n.node.node_id for n in nodes}
        rows = store.client.query(
            collection_name=store.collection_name,
            filter=key_filter("id", list(keys)),
            output_fields=["id", store.embedding_field],
        )
        out = {
            keys[str(row["id"])]: [float(x) for x in row[store.embedding_field]]
            for row in rows
            if str(row["id"]) in keys
        }
        if out:
            self.source = "milvus"
        return out
