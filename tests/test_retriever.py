from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import wrapt
from llama_index.core import VectorStoreIndex
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import (
    Decompose,
    FusionMode,
    HyDE,
    MultiQuery,
    QueryTransformer,
    StepBack,
    TransformRetriever,
)
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.search import loops
from llama_index_hyde_plus.search.requests import Failed
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.base import Guards, SearchSpec, TransformResult

from .conftest import DOCS, LoopTicks

Q = "Why did revenue drop?"
P1 = "Revenue dropped because enterprise renewals slipped last quarter."
P2 = "Large accounts delayed signing their renewals, so revenue fell."


def mean_vector(embed: DeterministicEmbedding, texts: list[str]) -> np.ndarray:
    """The paper's plain mean, scaled to unit length (FAISS inner product ranks by
    direction, and the search vector is sent at unit length)."""
    mean = np.mean([embed.vector(t) for t in texts], axis=0)
    return mean / np.linalg.norm(mean)


@pytest.mark.parametrize("include_query", [False, True])
def test_hyde_search_vector_is_the_mean_of_passages_and_query(
    faiss_index: VectorStoreIndex,
    embed_model: DeterministicEmbedding,
    spy_queries: list[VectorStoreQuery],
    include_query: bool,
) -> None:
    hyde = HyDE(ScriptedLLM([P1, P2]), num_passages=2, include_query=include_query)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=2), hyde)
    retriever.search(Q)
    [query] = spy_queries
    texts = [P1, P2] + ([Q] if include_query else [])
    np.testing.assert_allclose(query.query_embedding, mean_vector(embed_model, texts), atol=1e-6)


async def test_async_hyde_search_vector_is_the_same_mean(
    faiss_index: VectorStoreIndex,
    embed_model: DeterministicEmbedding,
    spy_queries: list[VectorStoreQuery],
) -> None:
    hyde = HyDE(ScriptedLLM([P1, P2], forbid_sync=True), num_passages=2, include_query=True)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=2), hyde)
    await retriever.asearch(Q)
    [query] = spy_queries
    np.testing.assert_allclose(
        query.query_embedding, mean_vector(embed_model, [P1, P2, Q]), atol=1e-6
    )


def test_hyde_finds_the_document_the_question_misses(faiss_index: VectorStoreIndex) -> None:
    base = faiss_index.as_retriever(similarity_top_k=1)
    plain = base.retrieve(Q)
    assert plain[0].node.node_id == "lunch"  # shares the question's words, not its answer
    result = TransformRetriever(base, HyDE(ScriptedLLM([P1]), include_query=False)).search(Q)
    assert [n.node.node_id for n in result.nodes] == ["renewals"]
    assert result.transform.hypothetical == (P1,)
    assert result.latency_s > 0


@pytest.mark.parametrize("failure", [RuntimeError("down"), ""])
async def test_failed_transform_still_returns_results_sync_and_async(
    faiss_index: VectorStoreIndex, failure: object
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=2)
    retriever = TransformRetriever(base, HyDE(ScriptedLLM([failure, failure])))  # type: ignore[list-item]
    for result in (
        retriever.search("paid time off days"),
        await retriever.asearch("paid time off days"),
    ):
        assert result.transform.fallback
        assert result.nodes[0].node.node_id == "pto"


async def test_asearch_never_calls_blocking_llm_or_retriever_methods(
    faiss_index: VectorStoreIndex,
) -> None:
    class AsyncOnly(StaticRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            raise AssertionError("blocking _retrieve called on the async path")

    llm = ScriptedLLM(["1. q one\n2. q two"], forbid_sync=True)
    base = AsyncOnly(DOCS, default=["pto"])
    result = await TransformRetriever(base, MultiQuery(llm, n=2)).asearch("question")
    assert not result.transform.fallback, result.transform.error
    assert result.failed_searches == ()
    assert llm.sync_calls == 0 and len(base.queries) == 3


async def test_sync_only_retriever_runs_off_the_event_loop() -> None:
    class SyncOnly(StaticRetriever):
        async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            raise AssertionError("not native async")

    del SyncOnly._aretrieve  # a retriever without native async support
    base = SyncOnly(DOCS, default=["pto"], delay=0.3)
    retriever = TransformRetriever(base, HyDE(ScriptedLLM(["passage."], forbid_sync=True)))
    async with LoopTicks() as loop:
        result = await retriever.asearch("q")
    assert result.nodes[0].node.node_id == "pto"
    assert loop.ticks >= LoopTicks.FREE  # the loop ran while the retriever slept in a thread


class RecordingReranker(BaseNodePostprocessor):
    seen: list[str] = []

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        assert query_bundle is not None
        self.seen.append(query_bundle.query_str)
        for n in nodes:
            n.score = 100.0  # a reranker that rewrites scores in place
        return list(reversed(nodes))


async def test_reranker_scores_against_the_original_question() -> None:
    base = StaticRetriever(DOCS, default=["pto", "hiring"])
    original = base._answer(QueryBundle("x"))
    reranker = RecordingReranker(seen=[])
    retriever = TransformRetriever(base, HyDE(ScriptedLLM([P1, P1])), reranker=reranker)
    sync_ids = [n.node.node_id for n in retriever.search(Q).nodes]
    async_ids = [n.node.node_id for n in (await retriever.asearch(Q)).nodes]
    assert reranker.seen == [Q, Q]
    assert sync_ids == async_ids == ["hiring", "pto"]
    assert [n.score for n in original] == [2.0, 1.0]


def test_wrapped_retriever_nodes_are_never_mutated() -> None:
    class Keeping(StaticRetriever):
        handed_out: list[NodeWithScore] = []

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            nodes = super()._retrieve(query_bundle)
            self.handed_out.extend(nodes)
            return nodes

    base = Keeping(DOCS, default=["pto", "hiring"])
    retriever = TransformRetriever(
        base, MultiQuery(ScriptedLLM(["1. a\n2. b"]), n=2), reranker=RecordingReranker(seen=[])
    )
    retriever.search("q")
    assert base.handed_out and all(n.score in (1.0, 2.0) for n in base.handed_out)


@pytest.mark.parametrize("use_async", [False, True])
async def test_fan_out_runs_every_query_concurrently(use_async: bool) -> None:
    base = StaticRetriever(DOCS, default=["pto"], delay=0.2)
    llm = ScriptedLLM(["1. q one\n2. q two\n3. q three"])
    retriever = TransformRetriever(base, MultiQuery(llm, n=3))
    result = await retriever.asearch("q") if use_async else retriever.search("q")
    assert base.queries and sorted(base.queries) == sorted(["q", "q one", "q two", "q three"])
    assert base.max_active == 4  # all four searches were in flight at once
    assert result.transform.search_queries == ("q", "q one", "q two", "q three")


class _Clocked(StaticRetriever):
    """Records when each query's search started and ended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.started.setdefault(query_bundle.query_str, time.monotonic())
        try:
            return super()._retrieve(query_bundle)
        finally:
            self.ended.setdefault(query_bundle.query_str, time.monotonic())

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.started.setdefault(query_bundle.query_str, time.monotonic())
        try:
            return await super()._aretrieve(query_bundle)
        finally:
            self.ended.setdefault(query_bundle.query_str, time.monotonic())


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("kind", ["multi-query", "rerank"])
async def test_the_question_is_searched_while_the_llm_writes(use_async: bool, kind: str) -> None:
    base = _Clocked(DOCS, default=["pto", "hiring"], delay=0.3)
    answered: list[float] = []

    def respond(prompt: str) -> str:
        answered.append(time.monotonic())
        return "1. q one\n2. q two"

    llm = ScriptedLLM(respond=respond, delay=0.15)  # answers halfway through the search
    embed = DeterministicEmbedding(dim=64)
    transformer: Any = {
        "multi-query": lambda: MultiQuery(llm, n=2),
        "rerank": lambda: HyDE(llm, strategy="rerank"),
    }[kind]()
    retriever = TransformRetriever(base, transformer, embed_model=embed)
    found = await retriever.asearch("q") if use_async else retriever.search("q")
    assert found.nodes and not found.transform.fallback
    # the LLM answered while the question was being searched
    assert base.started["q"] < answered[0] < base.ended["q"]
    assert base.queries.count("q") == 1  # and its hits reused, not searched again


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_grounded_transform_still_searches_the_question_first(use_async: bool) -> None:
    base = _Clocked(DOCS, default=["pto", "hiring"])
    answered: list[float] = []
    llm = ScriptedLLM(respond=lambda p: answered.append(time.monotonic()) or "A passage.")
    retriever = TransformRetriever(
        base, HyDE(llm, grounded=2), embed_model=DeterministicEmbedding(dim=64)
    )
    await retriever.asearch("q") if use_async else retriever.search("q")
    assert base.started["q"] < answered[0] and "paid time off" in llm.prompts[0]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_failed_question_search_during_the_llm_leaves_the_paraphrases(
    use_async: bool,
) -> None:
    base = StaticRetriever(DOCS, default=["pto"], fail_on=["q"])
    retriever = TransformRetriever(base, MultiQuery(ScriptedLLM(["1. q one\n2. q two"]), n=2))
    found = await retriever.asearch("q") if use_async else retriever.search("q")
    assert found.nodes and any("search failed for 'q'" in e for e in found.failed_searches)


@pytest.mark.parametrize("use_async", [False, True])
async def test_max_concurrency_bounds_the_fan_out(use_async: bool) -> None:
    base = StaticRetriever(DOCS, default=["pto"], delay=0.05)
    llm = ScriptedLLM(["1. a1\n2. b2\n3. c3\n4. d4"])
    retriever = TransformRetriever(base, MultiQuery(llm, n=4), max_concurrency=2)
    await retriever.asearch("q") if use_async else retriever.search("q")
    assert len(base.queries) == 5 and base.max_active == 2


async def test_sync_search_inside_a_running_event_loop_does_not_deadlock() -> None:
    base = StaticRetriever(DOCS, default=["pto"], delay=0.01)
    retriever = TransformRetriever(base, MultiQuery(ScriptedLLM(["1. a\n2. b"]), n=2))
    result = retriever.search("q")  # called from inside a coroutine, as in Jupyter
    assert [n.node.node_id for n in result.nodes] == ["pto"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_one_failing_sub_search_is_logged_and_the_others_return(
    use_async: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    base = StaticRetriever(DOCS, results={"q": ["pto"], "good": ["hiring"]}, fail_on=["bad"])
    retriever = TransformRetriever(base, MultiQuery(ScriptedLLM(["1. good\n2. bad"]), n=2))
    result = await retriever.asearch("q") if use_async else retriever.search("q")
    assert {n.node.node_id for n in result.nodes} == {"pto", "hiring"}
    assert len(result.failed_searches) == 1 and "bad" in result.failed_searches[0]
    assert any("sub-search" in r.getMessage() for r in caplog.records)


def test_explain_scores_says_how_a_fan_out_fused_its_lists_and_nothing_for_one_list() -> None:
    base = StaticRetriever(DOCS, results={"q": ["pto"], "good": ["hiring"]}, fail_on=["bad"])
    fan = TransformRetriever(
        base, MultiQuery(ScriptedLLM(["1. good\n2. other"]), n=2, original_weight=100)
    )
    found = fan.search("q")
    assert max(n.score or 0 for n in found.nodes) > 1  # 100/11: a rank score, not a cosine
    assert fan.explain_scores(found) == (
        "fused = sum of weight/(10+rank) over 3 searches (question x100, rest x1)"
    )
    one_failed = TransformRetriever(base, MultiQuery(ScriptedLLM(["1. good\n2. bad"]), n=2))
    assert one_failed.explain_scores(one_failed.search("q")) == (
        "fused = sum of weight/(10+rank) over 2 searches (question x5, rest x1)"
    )
    fell_back = fan.search("q")  # no reply left: a fallback searches the question alone
    assert fell_back.transform.fallback and fan.explain_scores(fell_back) is None
    passage = TransformRetriever(base, HyDE(ScriptedLLM(["a passage"])))
    assert passage.explain_scores(passage.search("q")) is None


@pytest.mark.parametrize("use_async", [False, True])
async def test_explain_scores_weighs_only_the_searches_that_answered(use_async: bool) -> None:
    base = StaticRetriever(
        DOCS, results={"q": ["pto"], "good": ["hiring"], "more": ["pto"]}, fail_on=["bad", "q"]
    )
    weighted = MultiQuery(ScriptedLLM(["1. good\n2. bad\n3. more"]), n=3, original_weight=100)
    retriever = TransformRetriever(base, weighted)
    found = await retriever.asearch("x q") if use_async else retriever.search("x q")
    assert found.failed_positions == (2,) and len(found.failed_searches) == 1
    assert retriever.explain_scores(found) == (
        "fused = sum of weight/(10+rank) over 3 searches (question x100, rest x1)"
    )
    asked_q = MultiQuery(ScriptedLLM(["1. good\n2. more"]), n=2, original_weight=100)
    without_own = TransformRetriever(base, asked_q)
    found = await without_own.asearch("q") if use_async else without_own.search("q")
    assert found.failed_positions == (0,)
    weights_alike = "fused = sum of weight/(10+rank) over 2 searches"
    assert without_own.explain_scores(found) == weights_alike


def test_all_sub_searches_failing_raises_the_retriever_error() -> None:
    base = StaticRetriever(DOCS, fail_on=["q", "a"])
    retriever = TransformRetriever(base, MultiQuery(ScriptedLLM(["1. a"]), n=1))
    with pytest.raises(RuntimeError, match="search failed"):
        retriever.search("q")


def test_raising_custom_transformer_searches_with_the_original_query() -> None:
    class Broken(QueryTransformer):
        def transform(self, query: str) -> str:
            raise RuntimeError("bug in user code")

    base = StaticRetriever(DOCS, results={"q": ["pto"]})
    result = TransformRetriever(base, Broken()).search("q")
    assert base.queries == ["q"] and result.transform.fallback
    assert [n.node.node_id for n in result.nodes] == ["pto"]


def test_keyword_retriever_gets_passage_text_and_warns_without_include_query(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    base = StaticRetriever(DOCS, default=["pto"])
    retriever = TransformRetriever(
        base, HyDE(ScriptedLLM([P1, P1]), include_query=False), search_type="keyword"
    )
    retriever.search(Q)
    retriever.search(Q)
    assert base.queries == [P1, P1]
    warnings = [r for r in caplog.records if "include_query=False" in r.getMessage()]
    assert len(warnings) == 1


def test_keyword_retriever_gets_query_and_passage_with_include_query(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    base = StaticRetriever(DOCS, default=["pto"])
    hyde = HyDE(ScriptedLLM([P1]), include_query=True)
    TransformRetriever(base, hyde, search_type="keyword").search(Q)
    assert base.queries == [f"{Q}\n\n{P1}"]
    assert not [r for r in caplog.records if "include_query" in r.getMessage()]


def test_hybrid_vector_store_mode_is_detected_and_warned(
    faiss_index: VectorStoreIndex, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    hybrid = faiss_index.as_retriever(vector_store_query_mode="hybrid")
    retriever = TransformRetriever(hybrid, HyDE(ScriptedLLM(), include_query=False))
    assert retriever.search_type == "hybrid"
    assert any("hybrid search" in r.getMessage() for r in caplog.records)
    dense = TransformRetriever(faiss_index.as_retriever(), HyDE(ScriptedLLM(), include_query=False))
    assert dense.search_type == "dense"


def test_decompose_interleaves_so_each_sub_question_is_represented() -> None:
    base = StaticRetriever(
        DOCS, results={"s1": ["pto", "hiring", "office"], "s2": ["security", "pricing"]}
    )
    retriever = TransformRetriever(base, Decompose(ScriptedLLM(["1. s1\n2. s2"]), n=2), top_k=2)
    assert [n.node.node_id for n in retriever.search("q").nodes] == ["pto", "security"]


def test_explicit_fusion_and_top_k() -> None:
    base = StaticRetriever(DOCS, results={"q": ["pto", "hiring"], "a": ["hiring", "office"]})
    retriever = TransformRetriever(
        base, StepBack(ScriptedLLM(["a"])), fusion=FusionMode.RRF, top_k=1
    )
    assert [n.node.node_id for n in retriever.search("q").nodes] == ["hiring"]


def test_works_inside_a_retriever_query_engine(faiss_index: VectorStoreIndex) -> None:
    answer_llm = ScriptedLLM(respond=lambda p: "ok")
    retriever = TransformRetriever(
        faiss_index.as_retriever(similarity_top_k=1), HyDE(ScriptedLLM([P1]), include_query=False)
    )
    engine = RetrieverQueryEngine.from_args(retriever, llm=answer_llm)
    response = engine.query(Q)
    assert response.source_nodes[0].node.node_id == "renewals"
    assert Q in answer_llm.prompts[0] and P1 not in answer_llm.prompts[0]


async def test_aretrieve_returns_nodes(faiss_index: VectorStoreIndex) -> None:
    retriever = TransformRetriever(
        faiss_index.as_retriever(similarity_top_k=1), HyDE(ScriptedLLM([P1]), include_query=False)
    )
    nodes = await retriever.aretrieve(Q)
    assert nodes[0].node.node_id == "renewals"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"top_k": 0}, "top_k"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"search_type": "fuzzy"}, "search_type"),
        ({"fusion": "nope"}, "nope"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        TransformRetriever(StaticRetriever(DOCS), HyDE(ScriptedLLM()), **kwargs)


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="retriever"):
        TransformRetriever(object(), HyDE(ScriptedLLM()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transformer"):
        TransformRetriever(StaticRetriever(DOCS), object())  # type: ignore[arg-type]


def test_empty_query_is_value_error() -> None:
    with pytest.raises(ValueError, match="query"):
        TransformRetriever(StaticRetriever(DOCS), HyDE(ScriptedLLM())).search(" ")


def test_search_latency_is_measured() -> None:
    base = StaticRetriever(DOCS, default=["pto"], delay=0.05)
    start = time.perf_counter()
    result = TransformRetriever(base, HyDE(ScriptedLLM(["p."]))).search("q")
    assert 0.05 <= result.latency_s <= time.perf_counter() - start


class TopKAware(StaticRetriever):
    """A static retriever that declares a ``similarity_top_k`` but returns whatever its
    script says (more than that, here), as a careless custom retriever might."""

    similarity_top_k = 2


SPREAD = ["1. paid time off days\n2. laptop disk encryption\n3. Lisbon office building"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_default_top_k_is_the_wrapped_retrievers_own_for_a_fan_out(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=3)
    llm = ScriptedLLM(SPREAD, forbid_sync=use_async)
    retriever = TransformRetriever(base, MultiQuery(llm, n=3))
    result = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert len(result.transform.search_queries) == 4 and len(result.nodes) == 3
    wider = TransformRetriever(base, MultiQuery(ScriptedLLM(SPREAD), n=3), top_k=10)
    assert len(wider.search(Q).nodes) > 3  # an explicit top_k is the cut, not the retriever's


@pytest.mark.parametrize("use_async", [False, True])
async def test_default_top_k_cuts_a_single_search_to_the_retrievers_own(use_async: bool) -> None:
    base = TopKAware(DOCS, default=["pto", "hiring", "office", "lunch"])
    retriever = TransformRetriever(base, HyDE(ScriptedLLM([P1], forbid_sync=use_async)))
    result = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert [n.node.node_id for n in result.nodes] == ["pto", "hiring"]


def test_default_top_k_follows_a_changed_similarity_top_k(faiss_index: VectorStoreIndex) -> None:
    base = faiss_index.as_retriever(similarity_top_k=3)
    retriever = TransformRetriever(base, MultiQuery(ScriptedLLM(SPREAD * 2), n=3))
    assert len(retriever.search(Q).nodes) == 3
    base.similarity_top_k = 2
    assert retriever.cut == 2 and len(retriever.search(Q).nodes) == 2


def test_retriever_without_similarity_top_k_is_not_cut() -> None:
    base = StaticRetriever(DOCS, results={"q": ["pto", "hiring"], "a": ["office", "lunch"]})
    retriever = TransformRetriever(base, StepBack(ScriptedLLM(["a"])))
    assert retriever.cut is None
    assert {n.node.node_id for n in retriever.search("q").nodes} == {
        "pto",
        "hiring",
        "office",
        "lunch",
    }


def test_from_index_searches_the_index_with_its_embedding_model(
    faiss_index: VectorStoreIndex, embed_model: DeterministicEmbedding
) -> None:
    retriever = TransformRetriever.from_index(
        faiss_index, MultiQuery(ScriptedLLM(SPREAD), n=3), similarity_top_k=3
    )
    assert isinstance(retriever, TransformRetriever)
    assert retriever.embedder is not None and retriever.embedder.model is embed_model
    assert retriever.top_k == 3 and len(retriever.search(Q).nodes) == 3


def test_from_index_fetches_rerank_candidates_and_cuts_to_similarity_top_k(
    faiss_index: VectorStoreIndex, spy_queries: list[VectorStoreQuery]
) -> None:
    hyde = HyDE(ScriptedLLM([P1]), strategy="rerank")
    retriever = TransformRetriever.from_index(faiss_index, hyde, similarity_top_k=2)
    result = retriever.search(Q)
    assert [q.similarity_top_k for q in spy_queries] == [50]
    assert len(result.nodes) == 2 and not result.transform.fallback


def test_from_index_plain_transform_fetches_only_similarity_top_k(
    faiss_index: VectorStoreIndex, spy_queries: list[VectorStoreQuery]
) -> None:
    retriever = TransformRetriever.from_index(
        faiss_index, HyDE(ScriptedLLM([P1]), include_query=True), similarity_top_k=2
    )
    retriever.search(Q)
    assert [q.similarity_top_k for q in spy_queries] == [2]


def test_from_index_passes_options_on(faiss_index: VectorStoreIndex) -> None:
    retriever = TransformRetriever.from_index(
        faiss_index,
        StepBack(ScriptedLLM(["a"])),
        similarity_top_k=3,
        top_k=1,
        fusion="max",
        retriever_kwargs={"vector_store_query_mode": "hybrid"},
    )
    assert retriever.top_k == 1 and retriever.fusion is FusionMode.MAX
    assert retriever.search_type == "hybrid"


def test_from_index_rejects_bad_arguments(faiss_index: VectorStoreIndex) -> None:
    with pytest.raises(TypeError, match="index"):
        TransformRetriever.from_index(StaticRetriever(DOCS), HyDE(ScriptedLLM()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transformer"):
        TransformRetriever.from_index(faiss_index, object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="similarity_top_k"):
        TransformRetriever.from_index(faiss_index, HyDE(ScriptedLLM()), similarity_top_k=0)


def test_from_index_takes_similarity_top_k_once(faiss_index: VectorStoreIndex) -> None:
    from llama_index_hyde_plus import HyDE

    with pytest.raises(ValueError, match="give similarity_top_k as from_index's own argument"):
        TransformRetriever.from_index(
            faiss_index, HyDE(ScriptedLLM()), retriever_kwargs={"similarity_top_k": 3}
        )


class _QuestionAndPassage(QueryTransformer):
    """An LLM transform (the question searched on its own while it writes) that asks for
    the question's list and one passage's, the passage embedded by the retriever."""

    uses_llm = True
    include_query = True

    def __init__(self, guards: Guards | None = None) -> None:
        super().__init__()
        self.guards = guards or Guards()

    def transform(self, query: str) -> TransformResult:
        passage = SearchSpec(P1, (P1,), passages=(P1,), query=query, query_weight=0.5)
        return TransformResult(
            query=query,
            method="question-and-passage",
            queries=(query,),
            hypothetical=(P1,),
            specs=(SearchSpec(query, (query,)), passage),
        )


class _FailsOnPassage(DeterministicEmbedding):
    """Embeds the question; the passage's embedding fails as ``mode`` says: ``503``
    raises (a provider's HTTP 503), ``zeros`` is a vector no search can use."""

    mode: str = "503"

    def _passage(self, text: str) -> list[float]:
        if self.mode == "503":
            raise RuntimeError("HTTP 503 Service Unavailable")
        return [0.0] * self.dim

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._passage(text)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._passage(text)


#: Where the generated side fails while the question's own search is still running:
#: embedding the passage, a vector no search can use, the gate's similarity.
_OVERLAP_FAILURES = [
    ("503", Guards(), "HTTP 503"),
    ("zeros", Guards(), "all zeros"),
    ("503", Guards(gate=0.1), "HTTP 503"),
]


@pytest.mark.parametrize(("mode", "guards", "error"), _OVERLAP_FAILURES)
@pytest.mark.parametrize("use_async", [False, True])
async def test_generated_side_failing_beside_the_running_question_search_returns_its_hits(
    mode: str, guards: Guards, error: str, use_async: bool
) -> None:
    base = StaticRetriever(DOCS, results={Q: ["renewals", "pto"]}, delay=0.2)
    retriever = TransformRetriever(
        base, _QuestionAndPassage(guards), embed_model=_FailsOnPassage(dim=64, mode=mode)
    )
    found = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert [n.node.node_id for n in found.nodes] == ["renewals", "pto"]
    assert found.transform.fallback and error in (found.transform.error or "")
    assert base.queries == [Q]  # the search that was running, not a second one


async def test_caller_cancelling_during_the_fallback_cancels_the_question_search() -> None:
    base = StaticRetriever(DOCS, results={Q: ["renewals"]}, delay=5.0)
    retriever = TransformRetriever(base, _QuestionAndPassage(), embed_model=_FailsOnPassage(dim=64))
    before = asyncio.all_tasks()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(retriever.asearch(Q), 0.3)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()  # nothing left running
    assert base.active == 0


class _CountsPaths(StaticRetriever):
    """A `StaticRetriever` that counts its blocking and its async searches."""

    def __init__(self) -> None:
        super().__init__(DOCS, default=["renewals", "pto"])
        self.blocking = 0
        self.native = 0

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.blocking += 1
        return super()._retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.native += 1
        return await super()._aretrieve(query_bundle)


async def test_llm_embedder_and_retriever_behind_a_transparent_proxy_run_natively_async() -> None:
    llm = ScriptedLLM([P1], forbid_sync=True)
    embed = DeterministicEmbedding(dim=64)
    base = _CountsPaths()
    retriever = TransformRetriever(
        wrapt.ObjectProxy(base),
        HyDE(wrapt.ObjectProxy(llm), include_query=True),
        embed_model=wrapt.ObjectProxy(embed),
    )
    found = await retriever.asearch(Q)
    assert not found.transform.fallback, found.transform.error
    assert found.transform.hypothetical == (P1,) and llm.async_calls == 1
    assert embed.async_calls > 0 and embed.sync_calls == 0
    assert base.native == 1 and base.blocking == 0


class _Fatal:
    """Raises ``raised`` (a ``fatal``) at the first call of the component ``where``."""

    def __init__(self, where: str, fatal: type[BaseException]) -> None:
        self.where, self.raised, self.done = where, fatal(), False

    def check(self, component: str) -> None:
        if component == self.where and not self.done:
            self.done = True
            raise self.raised


class _FatalStore(StaticRetriever):
    fatal: _Fatal

    def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
        self.fatal.check("retriever")
        return super()._answer(bundle)


class _FatalEmbedding(DeterministicEmbedding):
    fatal: Any = None

    def _get_text_embedding(self, text: str) -> list[float]:
        self.fatal.check("embedder")
        return super()._get_text_embedding(text)


class _FatalReranker(BaseNodePostprocessor):
    fatal: Any = None

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        self.fatal.check("reranker")
        return list(reversed(nodes))


def _fatal_retriever(fatal: _Fatal) -> TransformRetriever:
    """A remote store (its searches on worker threads), a blocking embedder and reranker,
    and an LLM whose first reply may be ``fatal``'s."""
    store = _FatalStore(DOCS, default=["renewals", "pto", "hiring"], delay=0.01)
    store.fatal = fatal
    first = [fatal.raised] if fatal.where == "llm" else []
    llm = ScriptedLLM([*first, P1, P1])
    return TransformRetriever(
        store,
        HyDE(llm, retry=NO_RETRY),
        embed_model=_FatalEmbedding(dim=64, fatal=fatal),
        reranker=_FatalReranker(fatal=fatal),
    )


@pytest.mark.parametrize("fatal", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("where", ["llm", "embedder", "retriever", "reranker"])
def test_an_interrupt_or_exit_from_any_component_reaches_the_sync_caller_unchanged(
    where: str, fatal: type[BaseException]
) -> None:
    """Raised in the caller's thread or a worker's, it is the very exception the
    component raised (not a fallback, not a wrapper), and the next search works."""
    expected = _fatal_retriever(_Fatal("nowhere", fatal)).search(Q)
    thrown = _Fatal(where, fatal)
    retriever = _fatal_retriever(thrown)
    with pytest.raises(fatal) as raised:
        retriever.search(Q)
    assert raised.value is thrown.raised
    found = retriever.search(Q)
    assert not found.transform.fallback and not found.failed_searches
    assert [n.node.node_id for n in found.nodes] == [n.node.node_id for n in expected.nodes]


_STOP = KeyboardInterrupt("stop")


def _at_once(value: str | None) -> Generator[Any, Any, str | None]:
    """Steps that ask for nothing."""
    return value
    yield  # a generator


def _catching(seen: list[Any]) -> Generator[Any, Any, str]:
    """Steps that catch an interrupt their call raised, are answered a failure, and raise
    an error of their own on an exit."""
    try:
        yield Failed(_STOP)  # a call that raises the interrupt
    except KeyboardInterrupt as exc:
        seen.append(exc)
    seen.append((yield Failed(ValueError("a failure"))))  # answered, not raised
    try:
        yield Failed(SystemExit(3))
    except SystemExit:
        raise LookupError("the steps' own error") from None
    return "not reached"


@pytest.mark.parametrize("use_async", [False, True])
async def test_both_loops_throw_in_what_a_call_raised_and_return_what_the_steps_return(
    use_async: bool,
) -> None:
    async def run(todo: Generator[Any, Any, Any]) -> Any:
        return await loops.ASYNC.run(todo) if use_async else loops.BLOCKING.run(todo)

    assert await run(_at_once("done")) == "done"
    assert await run(_at_once(None)) is None
    seen: list[Any] = []
    todo = _catching(seen)
    with pytest.raises(LookupError, match="the steps' own error"):
        await run(todo)
    assert seen[0] is _STOP  # thrown in at the yield, the very exception
    assert isinstance(seen[1], ValueError) and str(seen[1]) == "a failure"
    assert todo.gi_frame is None  # the steps ended
