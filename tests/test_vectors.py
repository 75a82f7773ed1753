"""`Embedder` (cached query/text embeddings, sync and async) and `DocVectors` (the
stored vectors of retrieved nodes)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index_hyde_plus.search.vectors import DocVectors, Embedder, embed_model_of
from llama_index_hyde_plus.stores.row_keys import key_filter, key_of
from llama_index_hyde_plus.testing import DeterministicEmbedding, StaticRetriever

from .conftest import DOCS, LoopTicks


class NativeAsyncEmbedding(DeterministicEmbedding):
    """Native async for single texts AND batches (as OpenAIEmbedding has)."""

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self._async_calls += len(texts)
        return [self.vector(t) for t in texts]


class BlockingEmbedding(BaseEmbedding):
    """Sync only (like a local model): each call sleeps and records its thread."""

    delay: float = 0.15
    threads: list[int] = []

    def _embed(self) -> list[float]:
        self.threads.append(threading.get_ident())
        time.sleep(self.delay)
        return [1.0, 0.0, 0.0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed()

    async def _aget_query_embedding(self, query: str) -> list[float]:  # pragma: no cover
        raise AssertionError("replaced below")


# BaseEmbedding declares _aget_query_embedding abstract; drop ours so the class falls
# back to the base (blocking) implementation, as a sync-only model does
del BlockingEmbedding._aget_query_embedding
BlockingEmbedding.__abstractmethods__ = frozenset()


# -- Embedder -------------------------------------------------------------------------
def test_embedder_calls_the_model_once_per_distinct_query() -> None:
    model = DeterministicEmbedding()
    embedder = Embedder(model)
    first = embedder.query("why did revenue drop")
    assert embedder.query("why did revenue drop") == first == model.vector("why did revenue drop")
    embedder.query("another question")
    assert model.sync_calls == 2


def test_embedder_calls_the_model_once_per_distinct_text() -> None:
    model = DeterministicEmbedding()
    embedder = Embedder(model)
    out = embedder.texts(["alpha text", "beta text", "alpha text"])
    assert out == [
        model.vector("alpha text"),
        model.vector("beta text"),
        model.vector("alpha text"),
    ]
    assert model.sync_calls == 2
    embedder.texts(["beta text", "alpha text"])
    assert model.sync_calls == 2


def test_query_and_text_embeddings_are_cached_apart() -> None:
    # an asymmetric model embeds a question and a document differently
    model = DeterministicEmbedding()
    embedder = Embedder(model)
    embedder.query("same words")
    embedder.texts(["same words"])
    assert model.sync_calls == 2


def test_embedder_cache_evicts_the_least_recent_entry() -> None:
    model = DeterministicEmbedding()
    embedder = Embedder(model, max_entries=2)
    embedder.query("a one")
    embedder.query("b two")
    embedder.query("a one")  # a is now the most recent
    embedder.query("c three")  # evicts b
    assert model.sync_calls == 3
    embedder.query("a one")
    assert model.sync_calls == 3
    embedder.query("b two")
    assert model.sync_calls == 4


def test_embedder_rejects_a_non_embedding_model() -> None:
    with pytest.raises(TypeError, match="BaseEmbedding"):
        Embedder(object())  # type: ignore[arg-type]


async def test_async_embedder_never_calls_sync_methods_of_a_native_async_model() -> None:
    model = NativeAsyncEmbedding()
    embedder = Embedder(model)
    q = await embedder.aquery("why did revenue drop")
    t = await embedder.atexts(["renewals slipped", "renewals slipped", "hiring grew"])
    assert q == model.vector("why did revenue drop")
    assert t[0] == t[1] == model.vector("renewals slipped")
    assert model.sync_calls == 0
    assert model.async_calls == 3
    await embedder.aquery("why did revenue drop")
    await embedder.atexts(["hiring grew"])
    assert model.async_calls == 3  # cached


async def test_async_texts_use_the_native_single_text_async_method() -> None:
    model = DeterministicEmbedding()
    await Embedder(model).atexts(["renewals slipped", "hiring grew"])
    assert model.sync_calls == 0


async def test_async_embedder_runs_a_blocking_model_in_a_thread() -> None:
    model = BlockingEmbedding(threads=[])
    embedder = Embedder(model)
    async with LoopTicks() as loop:
        await embedder.aquery("q")
        await embedder.atexts(["t one", "t two"])
    ticks = loop.ticks
    loop_thread = threading.get_ident()
    assert len(model.threads) == 3
    assert loop_thread not in model.threads
    assert ticks >= LoopTicks.FREE  # the loop ran during ~0.45 s of blocking embedding


def test_embed_model_of_finds_a_vector_retrievers_model(
    faiss_index: VectorStoreIndex, embed_model: DeterministicEmbedding
) -> None:
    assert embed_model_of(faiss_index.as_retriever()) is embed_model
    assert embed_model_of(StaticRetriever(DOCS)) is None


# -- DocVectors -----------------------------------------------------------------------
def test_doc_vectors_are_read_from_faiss_and_equal_the_stored_embeddings(
    faiss_index: VectorStoreIndex,
) -> None:
    retriever = faiss_index.as_retriever(similarity_top_k=len(DOCS))
    hits = retriever.retrieve("paid time off for employees")
    assert {h.node.node_id for h in hits} == set(DOCS)
    counting = DeterministicEmbedding()
    docs = DocVectors(retriever, Embedder(counting))
    vectors = docs.get(hits)
    assert docs.source == "faiss"
    assert counting.sync_calls == 0  # nothing was re-embedded
    for hit, vec in zip(hits, vectors):
        np.testing.assert_allclose(vec, counting.vector(DOCS[hit.node.node_id]), atol=1e-6)


async def test_async_doc_vectors_match_the_sync_ones(faiss_index: VectorStoreIndex) -> None:
    retriever = faiss_index.as_retriever(similarity_top_k=3)
    hits = retriever.retrieve("laptops security key")
    sync = DocVectors(retriever, None).get(hits)
    docs = DocVectors(retriever, None)
    assert await docs.aget(hits) == sync
    assert docs.source == "faiss"


def test_doc_vectors_re_embed_when_the_retriever_cannot_say() -> None:
    retriever = StaticRetriever(DOCS, default=["pto", "hiring"])
    hits = retriever.retrieve("anything")
    model = DeterministicEmbedding()
    docs = DocVectors(retriever, Embedder(model))
    vectors = docs.get(hits)
    assert docs.source == "embedding"
    assert vectors == [model.vector(DOCS["pto"]), model.vector(DOCS["hiring"])]
    assert model.sync_calls == 2
    docs.get(hits)  # cached per node id
    assert model.sync_calls == 2


def test_doc_vectors_without_a_store_or_an_embedder_is_a_value_error() -> None:
    retriever = StaticRetriever(DOCS, default=["pto"])
    with pytest.raises(ValueError, match="embedding model"):
        DocVectors(retriever, None).get(retriever.retrieve("x"))


def test_doc_vectors_prefer_the_nodes_own_embedding() -> None:
    node = TextNode(id_="n", text="some text", embedding=[0.0, 1.0, 0.0])
    model = DeterministicEmbedding()
    docs = DocVectors(StaticRetriever({}), Embedder(model))
    assert docs.get([NodeWithScore(node=node, score=1.0)]) == [[0.0, 1.0, 0.0]]
    assert docs.source == "node" and model.sync_calls == 0


class MilvusVectorStore:
    """Stands in for llama_index's MilvusVectorStore (DocVectors matches by name); its
    rows are keyed as hyde-plus keys them (`milvus_rows.key_of`)."""

    collection_name = "docs"
    embedding_field = "embedding"

    def __init__(self, rows: dict[str, list[float]], fail: bool = False) -> None:
        self.rows = {key_of(i, i): v for i, v in rows.items()}
        self.fail = fail
        self.calls: list[dict[str, Any]] = []
        self.client = self

    def query(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.calls.append(kwargs)
        if self.fail:
            raise ConnectionError("milvus down")
        keys = re.findall(r'"([0-9a-f-]+)"', kwargs["filter"])
        return [{"id": k, "embedding": self.rows[k]} for k in keys if k in self.rows]


def _with_store(store: MilvusVectorStore) -> StaticRetriever:
    retriever = StaticRetriever(DOCS, default=["pto", "hiring"])
    retriever._vector_store = store  # type: ignore[attr-defined]
    return retriever


def test_doc_vectors_are_read_from_milvus() -> None:
    store = MilvusVectorStore({"pto": [1.0, 0.0], "hiring": [0.0, 1.0]})
    retriever = _with_store(store)
    docs = DocVectors(retriever, None)
    assert docs.get(retriever.retrieve("x")) == [[1.0, 0.0], [0.0, 1.0]]
    assert docs.source == "milvus"
    keys = [key_of("pto", "pto"), key_of("hiring", "hiring")]
    assert store.calls[0]["filter"] == key_filter("id", keys)
    assert store.calls[0]["collection_name"] == "docs"


def test_doc_vectors_re_embed_when_the_store_fails() -> None:
    retriever = _with_store(MilvusVectorStore({}, fail=True))
    model = DeterministicEmbedding()
    docs = DocVectors(retriever, Embedder(model))
    assert docs.get(retriever.retrieve("x")) == [
        model.vector(DOCS["pto"]),
        model.vector(DOCS["hiring"]),
    ]
    assert docs.source == "embedding"


def test_doc_vectors_are_read_from_the_clis_faiss_index_not_re_embedded(tmp_path: Path) -> None:
    from llama_index.core import Document

    from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index

    embed = DeterministicEmbedding()
    docs = [Document(text=t, id_=i) for i, t in DOCS.items()]
    build_faiss_index(docs, embed, tmp_path / "idx", embed_spec="det", max_length=256)
    retriever = load_faiss_index(tmp_path / "idx", embed).as_retriever(similarity_top_k=3)
    hits = retriever.retrieve("laptops security key")
    reader = DocVectors(retriever, None)  # no embedder: re-embedding would raise
    vectors = reader.get(hits)
    assert reader.source == "faiss"
    for hit, vec in zip(hits, vectors, strict=True):
        np.testing.assert_allclose(vec, embed.vector(DOCS[hit.node.node_id]), atol=1e-6)
