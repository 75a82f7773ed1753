"""A hung embedder never hangs a search.

Every model call hyde-plus makes after the LLM (embedding the generated text, the
question for the gate and the mix, documents for rerank and Rocchio) is bounded by
``model_timeout``: a blocking embedder on worker threads of its own, a native async one
under asyncio's timeout. Past the deadline the search falls back to the question's own
hits."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import PrivateAttr

from llama_index_hyde_plus import HyDE, Rocchio, TransformRetriever
from llama_index_hyde_plus.calls import door
from llama_index_hyde_plus.testing import (
    DeterministicEmbedding,
    ScriptedLLM,
    StaticRetriever,
    SyncCallError,
)
from llama_index_hyde_plus.transforms.base import QueryTransformer

from .conftest import DOCS, sync_within

Q = "Why did revenue drop?"
PASSAGE = "Revenue dropped because enterprise renewals slipped last quarter."
HITS = ["pto", "renewals", "hiring"]
T = 0.3
"""The configured ``model_timeout``; a search must end well within 5 x T."""
LIMIT = 5 * T

_words = DeterministicEmbedding(dim=64)


class BlockingEmbedding(BaseEmbedding):
    """A blocking-only embedder (no async text methods of its own) whose document
    embeddings, and its query embeddings too with ``queries=True``, block on a
    ``threading.Event`` the test sets only at teardown."""

    queries: bool = False
    _release: threading.Event = PrivateAttr(default_factory=threading.Event)
    _entered: int = PrivateAttr(default=0)

    def _block(self) -> None:
        self._entered += 1
        self._release.wait()

    def _get_query_embedding(self, query: str) -> list[float]:
        if self.queries:
            self._block()
        return _words.vector(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        if self.queries:  # as a client with no async API would: in a thread
            return await asyncio.to_thread(self._get_query_embedding, query)
        return _words.vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        self._block()
        return _words.vector(text)


class AsyncHangingEmbedding(BaseEmbedding):
    """A native async embedder whose coroutines await an ``asyncio.Event`` never set
    (document embeddings; queries too with ``queries=True``); its blocking methods
    must never be called. ``cancelled`` counts the awaits that were cancelled."""

    queries: bool = False
    _cancelled: int = PrivateAttr(default=0)

    async def _hang(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self._cancelled += 1
            raise

    def _get_query_embedding(self, query: str) -> list[float]:
        raise SyncCallError("blocking query embedding on the async path")

    def _get_text_embedding(self, text: str) -> list[float]:
        raise SyncCallError("blocking text embedding on the async path")

    async def _aget_query_embedding(self, query: str) -> list[float]:
        if self.queries:
            await self._hang()
        return _words.vector(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        await self._hang()
        return _words.vector(text)


@pytest.fixture
def blocking() -> Iterator[Callable[..., BlockingEmbedding]]:
    """Makes `BlockingEmbedding` s with a model name of their own (so each test has
    its own worker threads), all released at teardown."""
    made: list[BlockingEmbedding] = []

    def make(**fields: Any) -> BlockingEmbedding:
        made.append(BlockingEmbedding(model_name=f"hung-{uuid.uuid4().hex}", **fields))
        return made[-1]

    yield make
    for model in made:
        model._release.set()


def _transforms() -> dict[str, Callable[[], QueryTransformer]]:
    return {
        "hyde": lambda: HyDE(ScriptedLLM(replies=[PASSAGE] * 100)),
        "rerank": lambda: HyDE(ScriptedLLM(replies=[PASSAGE] * 100), strategy="rerank"),
        "rocchio": lambda: Rocchio(k=2),
        "gate": lambda: HyDE(ScriptedLLM(replies=[PASSAGE] * 100), gate=0.5),
    }


KINDS = list(_transforms())


def _retriever(kind: str, model: BaseEmbedding, **kwargs: Any) -> TransformRetriever:
    return TransformRetriever(
        StaticRetriever(DOCS, default=HITS),
        _transforms()[kind](),
        embed_model=model,
        model_timeout=T,
        **kwargs,
    )


def _is_question_fallback(found: Any) -> None:
    assert [n.node.node_id for n in found.nodes] == HITS
    assert found.transform.fallback, found.transform
    assert f"did not answer within {T:g}s" in (found.transform.error or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_hung_blocking_embedder_falls_back_to_the_question_on_the_sync_path(
    kind: str, blocking: Callable[..., BlockingEmbedding]
) -> None:
    retriever = _retriever(kind, blocking())
    found, seconds = sync_within(lambda: retriever.search(Q), LIMIT)
    _is_question_fallback(found)
    assert seconds < LIMIT


@pytest.mark.parametrize("kind", KINDS)
async def test_a_hung_blocking_embedder_falls_back_on_the_async_path_off_the_loop(
    kind: str, blocking: Callable[..., BlockingEmbedding]
) -> None:
    retriever = _retriever(kind, blocking())
    start = time.perf_counter()
    found = await asyncio.wait_for(retriever.asearch(Q), LIMIT)
    _is_question_fallback(found)
    assert time.perf_counter() - start < LIMIT


@pytest.mark.parametrize("kind", KINDS)
async def test_a_hung_async_embedder_falls_back_and_its_call_is_cancelled(kind: str) -> None:
    model = AsyncHangingEmbedding()
    retriever = _retriever(kind, model)
    start = time.perf_counter()
    found = await asyncio.wait_for(retriever.asearch(Q), LIMIT)
    _is_question_fallback(found)
    assert time.perf_counter() - start < LIMIT
    assert model._cancelled >= 1  # nothing of it keeps running


def test_an_embedder_hung_on_the_question_too_still_serves_the_question_sync(
    blocking: Callable[..., BlockingEmbedding],
) -> None:
    """HyDE embeds the question after the LLM (for the mix): the fallback lets the
    wrapped retriever embed it, rather than wait on the hung embedder again."""
    model = blocking(queries=True)
    retriever = _retriever("hyde", model)
    found, seconds = sync_within(lambda: retriever.search(Q), LIMIT)
    _is_question_fallback(found)
    assert seconds < LIMIT
    assert retriever.retriever.bundles[-1].embedding is None  # type: ignore[attr-defined]


async def test_an_embedder_hung_on_the_question_too_still_serves_the_question_async() -> None:
    retriever = _retriever("hyde", AsyncHangingEmbedding(queries=True))
    start = time.perf_counter()
    found = await asyncio.wait_for(retriever.asearch(Q), LIMIT)
    _is_question_fallback(found)
    assert time.perf_counter() - start < LIMIT


async def test_fifty_concurrent_searches_against_a_hung_embedder_all_return(
    blocking: Callable[..., BlockingEmbedding],
) -> None:
    """50 searches hold at most the embedder's own 32 threads (the rest wait in line
    and never run); once all 32 overran, the next searches fall back at once, and the
    loop's default executor stays free for the app."""
    model = blocking()
    retriever = _retriever("hyde", model)
    start = time.perf_counter()
    # a bound far from the 0.3 s each search waits, for a box busy with other tests;
    # a search stuck on the hung embedder would never return
    found = await asyncio.wait_for(
        asyncio.gather(*(retriever.asearch(Q) for _ in range(50))), 20 * LIMIT
    )
    assert time.perf_counter() - start < 20 * LIMIT
    for one in found:
        _is_question_fallback(one)
    assert model._entered <= 32
    # a retriever that would wait 10 s on the embedder: it does not wait at all, the
    # embedder's threads all overran (a bound far from the wait, for a loaded CI box)
    hyde = _transforms()["hyde"]()
    patient = TransformRetriever(
        StaticRetriever(DOCS, default=HITS), hyde, embed_model=model, model_timeout=10.0
    )
    start = time.perf_counter()
    again = await asyncio.wait_for(asyncio.gather(*(patient.asearch(Q) for _ in range(50))), 8)
    assert time.perf_counter() - start < 5.0
    assert all("worker threads are busy" in (r.transform.error or "") for r in again)
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"


@pytest.mark.parametrize("native", [False, True])
async def test_cancelling_a_search_waiting_on_a_hung_embedder_propagates(
    native: bool, blocking: Callable[..., BlockingEmbedding], caplog: pytest.LogCaptureFixture
) -> None:
    model: BaseEmbedding = AsyncHangingEmbedding() if native else blocking()
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=HITS),
        HyDE(ScriptedLLM(replies=[PASSAGE] * 10)),
        embed_model=model,
        model_timeout=30.0,
    )
    start = time.perf_counter()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(retriever.asearch(Q), 0.2)
    assert time.perf_counter() - start < 5.0
    await asyncio.sleep(0.05)
    if native:
        assert model._cancelled == 1  # type: ignore[union-attr]
    else:
        pool = door.pool(retriever.embedder.model)  # type: ignore[union-attr]
        assert all(job.abandoned for job in pool._running)  # never waited for again
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert "fail" not in caplog.text.lower()  # no fallback, no stray error


def test_model_timeout_is_checked_by_name() -> None:
    for bad in (0, -1, float("inf"), "3"):
        with pytest.raises(ValueError, match="model_timeout"):
            TransformRetriever(StaticRetriever(DOCS), HyDE(ScriptedLLM()), model_timeout=bad)


class MilvusVectorStore:
    """Stands in for a Milvus collection (matched by name), its ``query`` hung until
    the test sets ``release``."""

    collection_name = "docs"
    embedding_field = "embedding"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.client = self

    def query(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.release.wait()
        return []


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hung_milvus_read_of_document_vectors_falls_back(use_async: bool) -> None:
    store = MilvusVectorStore()
    base = StaticRetriever(DOCS, default=HITS)
    base._vector_store = store  # type: ignore[attr-defined]
    retriever = TransformRetriever(
        base, Rocchio(k=2), embed_model=DeterministicEmbedding(dim=64), model_timeout=T
    )
    try:
        start = time.perf_counter()
        if use_async:
            found = await asyncio.wait_for(retriever.asearch(Q), LIMIT)
        else:
            found, _ = sync_within(lambda: retriever.search(Q), LIMIT)
        assert time.perf_counter() - start < LIMIT
        assert [n.node.node_id for n in found.nodes] == HITS and found.transform.fallback
        assert f"the vector store did not answer within {T:g}s" in (found.transform.error or "")
    finally:
        store.release.set()


class _QuestionAndTwoVariants(QueryTransformer):
    """A transform with no LLM that searches the question and two variants: the
    question is not searched while it runs, so the fan-out embeds it (the variants are
    embedded by the retriever, if at all)."""

    include_query = True

    def transform(self, query: str) -> list[str]:
        return ["fails", "works"]


class _SyncOnlyStatic(StaticRetriever):
    """`StaticRetriever` with no async search of its own: the async path runs its
    blocking one on a worker thread."""

    _aretrieve = BaseRetriever._aretrieve  # type: ignore[assignment]


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("use_async", [False, True])
async def test_an_embedder_hung_on_the_question_leaves_in_process_searches_unbounded(
    use_async: bool, native: bool, blocking: Callable[..., BlockingEmbedding]
) -> None:
    """The hung embedder spends the whole ``model_timeout`` on the question's vector;
    the fan-out goes on without it. Its searches of an in-process store only compute,
    so on either path, natively async or not, they are not bounded by the spent
    deadline: the one that raised is the only failed search, and the other's hits are
    fused in."""
    model: BaseEmbedding = (
        AsyncHangingEmbedding(queries=True) if use_async else blocking(queries=True)
    )
    kind = StaticRetriever if native else _SyncOnlyStatic
    base = kind(DOCS, results={"works": ["office"]}, default=HITS, fail_on=["fails"])
    assert base.searches_in_process
    retriever = TransformRetriever(
        base, _QuestionAndTwoVariants(), embed_model=model, model_timeout=T
    )
    if use_async:
        found = await asyncio.wait_for(retriever.asearch(Q), LIMIT)
    else:
        found, _ = sync_within(lambda: retriever.search(Q), LIMIT)
    assert found.failed_searches == ("RuntimeError: search failed for 'fails'",)
    assert not found.transform.fallback
    assert sorted(n.node.node_id for n in found.nodes) == sorted([*HITS, "office"])


# -- a reranker that overruns model_timeout --------------------
def _rerank_retriever(reranker: object, model_timeout: float) -> object:
    from llama_index.core import Document, VectorStoreIndex

    from llama_index_hyde_plus import HyDE, TransformRetriever
    from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

    index = VectorStoreIndex.from_documents(
        [
            Document(text="Enterprise renewals slipped last quarter."),
            Document(text="Office moved."),
        ],
        embed_model=DeterministicEmbedding(),
    )
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped last quarter.")
    return TransformRetriever.from_index(
        index, HyDE(llm), reranker=reranker, model_timeout=model_timeout
    )


@pytest.mark.parametrize("use_async", [False, True])
def test_a_reranker_that_overran_never_changes_the_nodes_already_returned(
    use_async: bool,
) -> None:
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class LateMutator(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
            time.sleep(0.6)
            for n in nodes:
                n.score = -999.0
            del nodes[1:]
            return nodes

    retriever: Any = _rerank_retriever(LateMutator(), 0.2)
    q = "Why did revenue drop?"
    found = asyncio.run(retriever.asearch(q)) if use_async else retriever.search(q)
    before = [(n.node.node_id, n.score) for n in found.nodes]
    time.sleep(0.9)  # the abandoned reranker has rewritten what it was handed by now
    assert [(n.node.node_id, n.score) for n in found.nodes] == before
    assert len(before) == 2 and all(score != -999.0 for _, score in before)


async def test_an_async_reranker_that_swallows_its_cancellation_costs_model_timeout() -> None:
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class Swallower(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
            return nodes

        async def _apostprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await asyncio.sleep(3)  # a cleanup that ignores the deadline
            return nodes

    retriever: Any = _rerank_retriever(Swallower(), 0.3)
    start = time.monotonic()
    found = await retriever.asearch("Why did revenue drop?")
    assert time.monotonic() - start < 2.0 and len(found.nodes) == 2  # was 3.3 s
