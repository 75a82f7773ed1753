"""The search path after the LLM: a store that answers the question but hangs on the
generated text is bounded by ``model_timeout`` (the question's own hits come back); a
document whose text changes under the same id is scored by its new text; a failing
question search raises at once, not after the LLM; the test double makes no zero
vector, and a zero vector from a real embedder is an unusable vector (fallback, no NaN
score)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llama_index_hyde_plus import HyDE, MultiQuery, Rocchio, StepBack, TransformRetriever
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

from .conftest import DOCS, Q, ids, search, sync_within

_words = DeterministicEmbedding(dim=64)

# -- document vectors keyed by id and content ---------------------------------------

RENEWALS = "Enterprise renewals slipped last quarter as accounts delayed signing."
OFFICE = "The office moved to the third floor in March."


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_document_changed_under_its_id_is_reranked_by_its_new_text(
    use_async: bool,
) -> None:
    """Two documents swap texts (an upsert by id): a long-lived retriever ranks as a
    fresh one does. Before the fix its cache served the old texts' vectors (the
    renewals text, now id b, ranked 2nd)."""
    store = StaticRetriever({"a": RENEWALS, "b": OFFICE}, default=["a", "b"])
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped as accounts delayed signing.")
    retriever = TransformRetriever(
        store, HyDE(llm, strategy="rerank", blend=1.0), embed_model=_words
    )
    assert ids((await search(retriever, "Why did renewals slip?", use_async)).nodes)[0] == "a"
    store.nodes["a"] = TextNode(id_="a", text=OFFICE)
    store.nodes["b"] = TextNode(id_="b", text=RENEWALS)
    found = await search(retriever, "Why did renewals slip?", use_async)
    assert ids(found.nodes)[0] == "b" and not found.transform.fallback


def test_an_unchanged_document_is_still_served_from_the_cache() -> None:
    model = DeterministicEmbedding(dim=64)
    store = StaticRetriever({"a": RENEWALS, "b": OFFICE}, default=["a", "b"])
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
    retriever = TransformRetriever(store, HyDE(llm, strategy="rerank"), embed_model=model)
    retriever.search("Why did renewals slip?")
    embedded = len(model.embedded_texts)
    retriever.search("Why did renewals slip?")
    assert len(model.embedded_texts) == embedded  # nothing embedded again


# -- zero vectors ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "the and a of", "What is it?"])
def test_the_deterministic_embedding_never_returns_a_zero_vector(text: str) -> None:
    model = DeterministicEmbedding()
    vector = model.get_text_embedding(text)
    assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0)
    assert vector == model.get_query_embedding(text)  # the same text, the same vector
    assert math.isfinite(model.similarity(vector, model.get_text_embedding("Revenue dropped.")))


class ZeroFor(BaseEmbedding):
    """A real-looking embedder that returns an all-zero vector for ``zero_for``."""

    zero_for: str = ""

    def _vec(self, text: str) -> list[float]:
        return [0.0] * 64 if text == self.zero_for else _words.vector(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)


PASSAGE = "Revenue dropped because enterprise renewals slipped last quarter."


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("kind", ["mix", "rerank", "gate"])
async def test_a_zero_vector_of_the_generated_text_falls_back(use_async: bool, kind: str) -> None:
    options: dict[str, Any] = {"mix": {}, "rerank": {"strategy": "rerank"}, "gate": {"gate": 0.1}}
    store = StaticRetriever(DOCS, default=["pto", "renewals"])
    hyde = HyDE(ScriptedLLM(respond=lambda p: PASSAGE), **options[kind])
    retriever = TransformRetriever(store, hyde, embed_model=ZeroFor(zero_for=PASSAGE))
    found = await search(retriever, Q, use_async)
    assert found.transform.fallback and "all zeros" in (found.transform.error or "")
    assert ids(found.nodes) == ["pto", "renewals"]
    assert all(math.isfinite(n.score or 0.0) for n in found.nodes)


class Recording(StaticRetriever):
    """A `StaticRetriever` that keeps the bundles it was asked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[QueryBundle] = []

    def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
        self.asked.append(bundle)
        return super()._answer(bundle)


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_zero_vector_of_the_question_is_never_searched_with(use_async: bool) -> None:
    """The gate cannot compare with a zero question vector: a fallback saying so (before:
    cosine 0 read as "disagrees"), and the question's own search is not handed our zero
    vector (the store's similarity with it is NaN)."""
    store = Recording(DOCS, default=["pto"])
    hyde = HyDE(ScriptedLLM(respond=lambda p: PASSAGE), gate=0.3)
    retriever = TransformRetriever(store, hyde, embed_model=ZeroFor(zero_for=Q))
    found = await search(retriever, Q, use_async)
    assert found.transform.fallback and "all zeros" in (found.transform.error or "")
    assert [b.embedding for b in store.asked] == [None]  # the store embeds it itself


# -- a store that hangs on the generated text -----------------------------------------

T = 0.3
"""The configured ``model_timeout``; a search must end well within `LIMIT`."""
LIMIT = 5 * T
ASKED = "Why did revenue drop?"
REPLY = "Renewals slipped last quarter.\n1. revenue decline causes\n2. renewal delays"


def _generated(bundle: QueryBundle) -> bool:
    """Whether ``bundle`` is not the question's own search: another text (a passage,
    a sub-query) or another vector (HyDE's mix, Rocchio's feedback)."""
    own = _words.get_query_embedding(ASKED)
    return bundle.query_str != ASKED or bundle.embedding not in (None, own)


class HangsOnGenerated(BaseRetriever):
    """A blocking-only store: answers the question at once and hangs on any other
    search (`_generated`) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = 0
        self.cancelled = 0

    def _answer(self) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_="a", text="Renewals slipped."), score=1.0)]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if _generated(query_bundle):
            self.entered += 1
            self.release.wait()
        return self._answer()


class AsyncHangsOnGenerated(HangsOnGenerated):
    """`HangsOnGenerated` with an async method of its own, which awaits an
    ``asyncio.Event`` never set."""

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if _generated(query_bundle):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return self._answer()


@pytest.fixture
def hung() -> Iterator[Callable[[bool], HangsOnGenerated]]:
    """Makes hung stores (``native``: `AsyncHangsOnGenerated`), released at teardown."""
    made: list[HangsOnGenerated] = []

    def make(native: bool) -> HangsOnGenerated:
        made.append(AsyncHangsOnGenerated() if native else HangsOnGenerated())
        return made[-1]

    yield make
    for store in made:
        store.release.set()


def _llm() -> ScriptedLLM:
    return ScriptedLLM(respond=lambda p: REPLY, record=False, model_name=uuid.uuid4().hex)


TRANSFORMS: dict[str, Callable[[], Any]] = {
    "hyde": lambda: HyDE(_llm(), timeout=5),
    "multi-query": lambda: MultiQuery(_llm(), timeout=5),
    "step-back": lambda: StepBack(_llm(), timeout=5),
    "rocchio": lambda: Rocchio(k=1),
}


def _question_hits(found: Any) -> None:
    """``found`` is the question's own hits, saying the generated search overran."""
    assert ids(found.nodes) == ["a"]
    said = [found.transform.error or "", *found.failed_searches]
    assert any(f"the retriever did not answer within {T:g}s" in s for s in said), said


@pytest.mark.parametrize("kind", list(TRANSFORMS))
def test_a_store_hung_on_the_generated_text_is_bounded_on_the_sync_path(
    kind: str, hung: Callable[[bool], HangsOnGenerated]
) -> None:
    store = hung(False)
    retriever = TransformRetriever(store, TRANSFORMS[kind](), embed_model=_words, model_timeout=T)
    found, seconds = sync_within(lambda: retriever.search(ASKED), LIMIT)
    _question_hits(found)
    assert seconds < LIMIT and store.entered >= 1


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("kind", list(TRANSFORMS))
async def test_a_store_hung_on_the_generated_text_is_bounded_on_the_async_path(
    kind: str, native: bool, hung: Callable[[bool], HangsOnGenerated]
) -> None:
    store = hung(native)
    retriever = TransformRetriever(store, TRANSFORMS[kind](), embed_model=_words, model_timeout=T)
    start = time.perf_counter()
    found = await asyncio.wait_for(retriever.asearch(ASKED), LIMIT)
    _question_hits(found)
    assert time.perf_counter() - start < LIMIT
    if native:
        assert store.cancelled >= 1  # nothing of it keeps running
    await asyncio.sleep(0)
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_a_hung_blocking_store_holds_at_most_its_own_threads(
    hung: Callable[[bool], HangsOnGenerated],
) -> None:
    """40 searches hold at most the store's own 32 threads (never the loop's default
    executor); once all overran, the next searches use the question's hits at once."""
    store = hung(False)
    retriever = TransformRetriever(store, HyDE(_llm()), embed_model=_words, model_timeout=T)
    found = await asyncio.wait_for(
        asyncio.gather(*(retriever.asearch(ASKED) for _ in range(40))), 4 * LIMIT
    )
    for one in found:
        _question_hits(one)
    assert store.entered <= 32
    again = await asyncio.wait_for(
        asyncio.gather(*(retriever.asearch(ASKED) for _ in range(10))), LIMIT
    )
    # refused at once (no thread is waited for: the threads all overran)
    assert all("worker threads are busy" in (r.transform.error or "") for r in again)
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"


# -- the question's own search fails while the LLM writes -----------------------------


class Down(BaseRetriever):
    """A store that is down: every search raises at once."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise ConnectionError("index down")

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise ConnectionError("index down")


async def test_a_failed_question_search_raises_at_once_on_the_async_path() -> None:
    """Before the fix the error came after the LLM's 3 s; now at once, the LLM call
    cancelled (no task left), its breaker untouched."""
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.", delay=3)
    transform = HyDE(llm, strategy="rerank")
    retriever = TransformRetriever(Down(), transform, embed_model=_words)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match="index down"):
        await retriever.asearch(ASKED)
    assert time.perf_counter() - start < 1.0
    await asyncio.sleep(0.05)
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert transform.breaker is not None and transform.breaker.state == "closed"
