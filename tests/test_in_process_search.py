"""A search that only computes in this process (an in-memory or FAISS
index given the vector) runs in the caller's thread, with no worker hand-off; a search
that may wait on I/O keeps its `model_timeout` bound."""

from __future__ import annotations

import threading
from typing import Any

import faiss
import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.indices.vector_store.retrievers import VectorIndexRetriever
from llama_index.core.schema import QueryBundle, TextNode
from llama_index.core.storage.docstore import SimpleDocumentStore
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryResult
from llama_index.vector_stores.faiss import FaissVectorStore

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.search.retriever import searches_in_process
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

from .conftest import DOCS, Q, ids, sync_within

PASSAGE = "Revenue dropped because enterprise renewals slipped last quarter."
VECTOR = QueryBundle(query_str="q", embedding=[1.0, 0.0])


def _index(store: Any, embed: DeterministicEmbedding) -> VectorStoreIndex:
    nodes = [TextNode(id_=nid, text=text) for nid, text in DOCS.items()]
    context = StorageContext.from_defaults(vector_store=store)
    return VectorStoreIndex(nodes, storage_context=context, embed_model=embed)


def _hyde_over(index: VectorStoreIndex, **kwargs: Any) -> TransformRetriever:
    llm = ScriptedLLM(respond=lambda prompt: PASSAGE)
    return TransformRetriever.from_index(index, HyDE(llm), similarity_top_k=3, **kwargs)


@pytest.mark.parametrize("kind", ["simple", "faiss"])
def test_a_search_of_an_in_process_index_runs_in_the_callers_thread(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HyDE search of LlamaIndex's in-memory store and of FAISS is made in the
    thread that called ``search`` (before: on a worker of the retriever's pool, a
    hand-off that cost more than the search), and finds what it found there."""
    embed = DeterministicEmbedding(dim=64)
    cls = SimpleVectorStore if kind == "simple" else FaissVectorStore
    store = SimpleVectorStore() if kind == "simple" else FaissVectorStore(faiss.IndexFlatIP(64))
    threads: list[str] = []
    original = cls.query

    def query(self: Any, q: VectorStoreQuery, **kw: Any) -> VectorStoreQueryResult:
        threads.append(threading.current_thread().name)
        return original(self, q, **kw)

    monkeypatch.setattr(cls, "query", query)
    index = _index(store, embed)
    found = _hyde_over(index).search(Q)
    assert threads == [threading.current_thread().name]
    unbounded = _hyde_over(index, model_timeout=None).search(Q)  # in this thread by definition
    assert not found.transform.fallback and ids(found.nodes) == ids(unbounded.nodes)


class _ThreadsSeen(StaticRetriever):
    """`StaticRetriever` noting the thread each query was searched in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: dict[str, str] = {}

    def _retrieve(self, query_bundle: QueryBundle) -> Any:
        self.threads[query_bundle.query_str] = threading.current_thread().name
        return super()._retrieve(query_bundle)


@pytest.mark.parametrize("delay", [0.0, 0.01])
def test_a_fanouts_searches_of_an_in_process_store_run_in_the_callers_thread(
    delay: float,
) -> None:
    """The generated queries of a multi-query search of a store that only computes
    are searched in the caller's thread, one after another (a worker hand-off would
    cost more than the search); a store that may wait on I/O is searched on workers,
    bounded by ``model_timeout``."""
    llm = ScriptedLLM(respond=lambda prompt: "first variant\nsecond variant")
    base = _ThreadsSeen(DOCS, default=["renewals"], delay=delay)
    found = TransformRetriever(base, MultiQuery(llm, n=2)).search(Q)
    assert not found.failed_searches and not found.transform.fallback
    here = threading.current_thread().name
    searched_here = [base.threads[q] == here for q in ("first variant", "second variant")]
    assert searched_here == [not delay, not delay], base.threads


def test_a_subclass_of_the_vector_retriever_is_still_bounded_by_model_timeout() -> None:
    """A ``VectorIndexRetriever`` subclass may search anything (here it hangs on the
    HyDE vector): it is still searched on a worker and abandoned at ``model_timeout``,
    and the question's own hits come back."""
    embed = DeterministicEmbedding(dim=64)
    retriever = _hyde_over(_index(SimpleVectorStore(), embed), model_timeout=0.3)
    inner = retriever.retriever
    assert isinstance(inner, VectorIndexRetriever)
    release = threading.Event()
    calls: list[str] = []

    class Custom(VectorIndexRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> Any:
            calls.append(threading.current_thread().name)
            if len(calls) == 1:  # the generated text's search: hangs
                release.wait(30)
            return super()._retrieve(query_bundle)

    retriever.retriever = Custom(inner._index, similarity_top_k=3)
    try:
        found, seconds = sync_within(lambda: retriever.search(Q), 20)
    finally:
        release.set()
    assert found.transform.fallback and ids(found.nodes) == ids(inner.retrieve(Q))
    assert seconds < 15 and calls[0].startswith("hyde-plus")


def test_which_searches_are_in_process() -> None:
    embed = DeterministicEmbedding(dim=8)
    plain = VectorStoreIndex([], embed_model=embed).as_retriever()
    assert isinstance(plain, VectorIndexRetriever)
    assert searches_in_process(plain, VECTOR)
    assert not searches_in_process(plain, QueryBundle(query_str="q"))  # it would embed

    class Sub(VectorIndexRetriever):
        pass

    assert not searches_in_process(Sub(plain._index), VECTOR)

    class IOStore(SimpleVectorStore):  # a subclass may do I/O: not vouched for
        pass

    class IODocs(SimpleDocumentStore):
        pass

    sub_store = VectorStoreIndex(
        [], embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=IOStore())
    ).as_retriever()
    sub_docs = VectorStoreIndex(
        [], embed_model=embed, storage_context=StorageContext.from_defaults(docstore=IODocs())
    ).as_retriever()
    from llama_index_hyde_plus.stores.faiss import _checked_faiss_store

    ours = _checked_faiss_store(faiss.IndexFlatIP(8), "the index")  # says so itself
    context = StorageContext.from_defaults(vector_store=ours)
    ours_retriever = VectorStoreIndex([], embed_model=embed, storage_context=context)
    assert searches_in_process(ours_retriever.as_retriever(), VECTOR)
    assert not searches_in_process(sub_store, VECTOR)
    assert not searches_in_process(sub_docs, VECTOR)
    plain.object_map = {"x": object()}  # recursive retrieval may call anything
    assert not searches_in_process(plain, VECTOR)
    assert searches_in_process(StaticRetriever({"a": "text"}), VECTOR)
    assert not searches_in_process(StaticRetriever({"a": "text"}, delay=0.1), VECTOR)

    class Raises(StaticRetriever):
        @property
        def searches_in_process(self) -> bool:
            raise RuntimeError("no")

    assert not searches_in_process(Raises({"a": "text"}), VECTOR)

    class SaysSo(StaticRetriever):
        searches_in_process = "yes"  # type: ignore[assignment]  # only True vouches

    assert not searches_in_process(SaysSo({"a": "text"}, delay=0.1), VECTOR)
