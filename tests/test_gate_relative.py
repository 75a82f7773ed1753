"""HyDE's relative gate: skip the expansion when the passage's cosine to the
question is more than ``gate_relative`` below the question's cosine to its own top hit,
the hits the retriever already fetches while the LLM writes."""

from __future__ import annotations

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.caching.cache import MemoryCache
from llama_index_hyde_plus.search.plan import gate_verdict
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.base import Guards, TransformResult
from llama_index_hyde_plus.transforms.hyde import Shipped
from llama_index_hyde_plus.transforms.registry import entry_for

from .conftest import DOCS, P1, Q, ids, search

# with DeterministicEmbedding: cosine(Q, P1) = 0.25; Q's top hit is "lunch", cosine 0.471,
# so P1 is 0.221 below the question's own top hit
TOP, SIM = 0.471, 0.25


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_passage_far_below_the_questions_top_hit_is_skipped_with_its_hits(
    top3: tuple[BaseRetriever, list[str]], spy_queries: list[VectorStoreQuery], use_async: bool
) -> None:
    base, plain = top3
    hyde = HyDE(ScriptedLLM([P1], forbid_sync=use_async), query_weight=0.0, gate_relative=0.2)
    retriever = TransformRetriever(base, hyde)
    result = await search(retriever, Q, use_async)
    skipped = result.transform.skipped
    assert skipped and "top hit" in skipped and "0.471" in skipped
    assert not result.transform.fallback and result.transform.error is None
    assert ids(result.nodes) == plain
    assert len(spy_queries) == 1  # the question's hits, fetched while the LLM wrote, reused
    assert result.transform.to_dict()["skipped"] == skipped


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_passage_within_the_margin_of_the_top_hit_is_searched(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=1)
    hyde = HyDE(ScriptedLLM([P1], forbid_sync=use_async), query_weight=0.0, gate_relative=0.3)
    retriever = TransformRetriever(base, hyde)
    result = await search(retriever, Q, use_async)
    assert result.transform.skipped is None
    assert ids(result.nodes) == ["renewals"]  # the passage was searched, not the question


def test_the_relative_gate_is_strict_below_the_margin() -> None:
    guards = Guards(gate_relative=0.2)
    result = TransformResult(query=Q, method="hyde", queries=(Q,), hypothetical=(P1,))
    assert gate_verdict(result, guards, 0.3, 0.5).skipped is None  # exactly 0.2 below: kept
    assert gate_verdict(result, guards, 0.2999, 0.5).skipped
    assert gate_verdict(result, Guards(gate_relative=0.0), 0.5, 0.5).skipped is None
    assert gate_verdict(result, Guards(gate_relative=0.0), 0.49, 0.5).skipped


def test_with_no_hit_the_relative_gate_has_nothing_to_compare_and_keeps() -> None:
    guards = Guards(gate_relative=0.0)
    result = TransformResult(query=Q, method="hyde", queries=(Q,), hypothetical=(P1,))
    assert gate_verdict(result, guards, -0.9, None) is result
    retriever = TransformRetriever(
        StaticRetriever(DOCS, results={}, default=[]),
        HyDE(ScriptedLLM([P1]), query_weight=0.5, gate_relative=0.0),
        embed_model=DeterministicEmbedding(),
    )
    assert retriever.search(Q).transform.skipped is None


def test_a_non_finite_top_similarity_falls_back_saying_so() -> None:
    result = TransformResult(query=Q, method="hyde", queries=(Q,), hypothetical=(P1,))
    out = gate_verdict(result, Guards(gate_relative=0.1), 0.5, float("nan"))
    assert out.fallback and out.error and "not a number" in out.error


def test_the_absolute_gate_still_applies_beside_the_relative_one() -> None:
    result = TransformResult(query=Q, method="hyde", queries=(Q,), hypothetical=(P1,))
    both = Guards(gate=0.6, gate_relative=1.0)
    out = gate_verdict(result, both, 0.5, 0.55)
    assert out.skipped and "gate 0.6" in out.skipped


@pytest.mark.parametrize("use_async", [False, True])
async def test_the_reference_is_the_top_hits_own_vector_not_the_stores_score(
    use_async: bool,
) -> None:
    # StaticRetriever scores hits 3, 2, 1 (not cosines): the gate reads the hit's vector
    embed = DeterministicEmbedding()
    base = StaticRetriever(DOCS, default=["lunch", "pto"])
    near = HyDE(ScriptedLLM([P1], forbid_sync=use_async), query_weight=0.5, gate_relative=0.3)
    far = HyDE(ScriptedLLM([P1], forbid_sync=use_async), query_weight=0.5, gate_relative=0.2)
    for hyde, kept in ((near, True), (far, False)):
        retriever = TransformRetriever(base, hyde, embed_model=embed)
        result = await search(retriever, Q, use_async)
        assert (result.transform.skipped is None) is kept


def test_gate_relative_is_a_search_option_outside_the_cache_key() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM([P1])
    HyDE(llm, cache=cache, query_weight=0.5).transform(Q)
    gated = HyDE(llm, cache=cache, query_weight=0.5, gate_relative=0.1)
    assert "gate_relative" in HyDE.SEARCH_OPTIONS
    assert gated.transform(Q).cached and len(llm.prompts) == 1
    assert gated.cache_key_for(Q) == HyDE(llm, query_weight=0.5).cache_key_for(Q)


@pytest.mark.parametrize("bad", [-0.1, 2.5, float("nan")])
def test_gate_relative_outside_zero_to_two_is_a_value_error(bad: float) -> None:
    with pytest.raises(ValueError, match="gate_relative"):
        HyDE(ScriptedLLM([P1]), gate_relative=bad)


def test_gate_relative_that_is_not_a_number_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="gate_relative"):
        HyDE(ScriptedLLM([P1]), gate_relative="0.1")  # type: ignore[arg-type]


def test_gate_relative_asks_for_the_questions_hits_while_the_llm_writes() -> None:
    assert Guards(gate_relative=0.1).needs_question_hits
    assert not Guards(gate=0.5).needs_question_hits
    complexity = entry_for("hyde").complexity
    assert complexity({"gate_relative": 0.1}) > complexity({})


def test_a_given_gate_relative_joins_the_shipped_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(HyDE.SHIPPED, "capable", Shipped(query_weight=0.7, gate=None))
    hyde = HyDE(ScriptedLLM([P1]), gate_relative=0.15)
    assert hyde.guards.gate_relative == 0.15
    assert hyde.defaults is not None  # the weight is still the shipped one


def test_a_shipped_gate_relative_applies_until_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = Shipped(query_weight=0.8, gate=None, gate_relative=0.1)
    monkeypatch.setitem(HyDE.SHIPPED, "capable", shipped)
    monkeypatch.setitem(HyDE.SHIPPED, "small", shipped)
    assert HyDE(ScriptedLLM([P1])).guards.gate_relative == 0.1
    assert HyDE(ScriptedLLM([P1]), gate_relative=None).guards.gate_relative is None
    assert HyDE(ScriptedLLM([P1]), query_weight=0.6).guards.gate_relative is None


def test_then_refuses_a_relative_gate() -> None:
    with pytest.raises(ValueError, match="gate"):
        MultiQuery(ScriptedLLM(["a"])).then(HyDE(ScriptedLLM([P1]), gate_relative=0.1))
