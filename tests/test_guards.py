"""The quality guards as `TransformRetriever` carries them out: query weight, hybrid
routing, rerank instead of replace, gating, grounded HyDE and the fan-out guard; plus
the options' validation and how results and caches carry them."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.types import VectorStoreQuery

from llama_index_hyde_plus import (
    Decompose,
    HyDE,
    MultiQuery,
    Rewrite,
    StepBack,
    TransformRetriever,
)
from llama_index_hyde_plus.caching.cache import MemoryCache
from llama_index_hyde_plus.search.expansion import keyword_query, weighted_vector
from llama_index_hyde_plus.search.retriever import SearchResult
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.base import Guards, TransformResult
from llama_index_hyde_plus.transforms.hyde import Shipped, _resolve_weight
from llama_index_hyde_plus.transforms.parsing import trim_passage
from llama_index_hyde_plus.transforms.prompts import GROUNDING_PREFIX

from .conftest import DOCS, P1, Q, ids, search

P2 = "Large accounts delayed signing their renewals, so revenue fell."
UNRELATED = "Penguins waddle across Antarctic ice floes at dawn."
# with DeterministicEmbedding: cosine(Q, P1) = 0.25, cosine(Q, UNRELATED) = 0.0


def no_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- query weight on a dense store ------------------------------------------------------
@pytest.mark.parametrize("w", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("use_async", [False, True])
async def test_faiss_receives_the_query_weighted_vector(
    faiss_index: VectorStoreIndex,
    embed_model: DeterministicEmbedding,
    spy_queries: list[VectorStoreQuery],
    w: float,
    use_async: bool,
) -> None:
    llm = ScriptedLLM([P1, P2], forbid_sync=use_async)
    hyde = HyDE(llm, num_passages=2, query_weight=w)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=3), hyde)
    result = await search(retriever, Q, use_async)
    assert not result.transform.fallback, result.transform.error
    [query] = spy_queries
    want = weighted_vector(
        embed_model.vector(Q), [embed_model.vector(P1), embed_model.vector(P2)], w
    )
    np.testing.assert_allclose(query.query_embedding, want, atol=1e-6)
    assert result.transform.search_options["query_weight"] == w
    if use_async:
        assert llm.sync_calls == 0


def test_the_weight_changes_what_is_found(faiss_index: VectorStoreIndex) -> None:
    base = faiss_index.as_retriever(similarity_top_k=1)
    assert ids(base.retrieve(Q)) == ["lunch"]
    passages_only = TransformRetriever(base, HyDE(ScriptedLLM([P1]), query_weight=0.0)).search(Q)
    question_only = TransformRetriever(base, HyDE(ScriptedLLM([P1]), query_weight=1.0)).search(Q)
    assert ids(passages_only.nodes) == ["renewals"]
    assert ids(question_only.nodes) == ["lunch"]


def test_a_profile_chooses_the_shipped_defaults_explicitly_and_repr_shows_it() -> None:
    bundled = ScriptedLLM([P1], model_name="SmolLM2-135M-Instruct-Q4_1")
    strong = ScriptedLLM([P1], model_name="gpt-4o-mini")
    assert HyDE(bundled, profile="capable").generator == "capable"
    assert HyDE(strong, profile="small").generator == "small"
    assert HyDE(strong, profile="small").query_weight == HyDE.SHIPPED["small"].query_weight
    assert HyDE(strong, profile="small").transform(Q).defaults == "small"
    assert HyDE(bundled).generator == "small"  # "auto" reads the model's name
    assert repr(HyDE(strong)) == "HyDE(llm='gpt-4o-mini', profile='auto: capable')"
    assert repr(MultiQuery(bundled, profile="capable")) == (
        "MultiQuery(llm='SmolLM2-135M-Instruct-Q4_1', profile='capable')"
    )
    with pytest.raises(ValueError, match="profile must be one of auto, small, capable"):
        HyDE(strong, profile="large")  # type: ignore[typeddict-item]


def test_a_profile_sweep_reuses_one_generation() -> None:
    # the profile chooses search defaults only: its passages are the same
    strong = ScriptedLLM([P1], model_name="gpt-4o-mini")
    keys = {HyDE(strong, profile=p).cache_key_for(Q) for p in ("auto", "small", "capable")}
    assert len(keys) == 1
    lists = {MultiQuery(strong, profile=p).cache_key_for(Q) for p in ("auto", "small")}
    assert len(lists) == 1


def test_plain_hyde_ships_guarded_defaults_for_the_small_model_and_weights_for_others() -> None:
    small = HyDE(ScriptedLLM([P1], model_name="SmolLM2-135M-Instruct-Q4_1"))
    capable = HyDE(ScriptedLLM([P1], model_name="gpt-4o-mini"))
    assert small.generator == "small" and capable.generator == "capable"
    assert HyDE.SHIPPED["small"] == Shipped(query_weight=0.8, gate=0.7)
    assert HyDE.SHIPPED["capable"] == Shipped(query_weight=0.7, gate=None)
    assert small.guards == Guards(strategy="replace", blend=HyDE.DEFAULT_BLEND, gate=0.7)
    assert capable.guards == Guards(strategy="replace", blend=HyDE.DEFAULT_BLEND, gate=None)
    assert (small.query_weight, capable.query_weight) == (0.8, 0.7)
    assert small.include_query and capable.include_query
    assert small.transform(Q).defaults == "small"
    assert capable.transform(Q).defaults == "capable"
    assert HyDE(ScriptedLLM([P1]), query_weight=0.7).transform(Q).defaults is None


def test_the_shipped_defaults_follow_settings_llm_when_no_llm_is_given() -> None:
    from llama_index.core import Settings

    before = Settings._llm
    try:
        Settings.llm = ScriptedLLM([P1], model_name="SmolLM2-135M-Instruct-Q4_1")
        assert HyDE().query_weight == 0.8 and HyDE().guards.gate == 0.7
        Settings.llm = ScriptedLLM([P1], model_name="claude-sonnet")
        assert HyDE().query_weight == 0.7 and HyDE().guards.gate is None
    finally:
        Settings._llm = before


@pytest.mark.parametrize(
    "options", [{"include_query": True}, {"include_query": False}, {"query_weight": 0.5}]
)
def test_choosing_the_vector_yourself_turns_the_shipped_guards_off(options: dict) -> None:
    assert HyDE(ScriptedLLM([P1]), **options).guards == Guards()


def test_replace_with_the_default_weight_sends_the_weighted_vector(
    faiss_index: VectorStoreIndex,
    embed_model: DeterministicEmbedding,
    spy_queries: list[VectorStoreQuery],
) -> None:
    hyde = HyDE(ScriptedLLM([P1]), strategy="replace", gate=None)
    shipped = HyDE.SHIPPED["capable"].query_weight
    assert hyde.query_weight == shipped and hyde.include_query
    TransformRetriever(faiss_index.as_retriever(), hyde).search(Q)
    want = weighted_vector(embed_model.vector(Q), [embed_model.vector(P1)], shipped)
    np.testing.assert_allclose(spy_queries[0].query_embedding, want, atol=1e-6)


def test_an_explicit_embed_model_is_used_for_a_retriever_without_one() -> None:
    embed = DeterministicEmbedding()
    base = StaticRetriever(DOCS, default=["pto"])
    TransformRetriever(base, HyDE(ScriptedLLM([P1]), query_weight=0.4), embed_model=embed).search(Q)
    [bundle] = base.bundles
    want = weighted_vector(embed.vector(Q), [embed.vector(P1)], 0.4)
    np.testing.assert_allclose(bundle.embedding, want, atol=1e-12)


# -- keyword and hybrid routing -----------------------------------------------------------
def test_a_keyword_retriever_receives_the_keyword_text_with_the_question_repeated() -> None:
    base = StaticRetriever(DOCS, default=["pto"])
    base.search_type = "keyword"  # type: ignore[attr-defined]
    hyde = HyDE(ScriptedLLM([P1]), keyword_weight=0.5, strategy="replace", gate=None)
    retriever = TransformRetriever(base, hyde)
    assert retriever.search_type == "keyword"
    result = retriever.search(Q)
    [bundle] = base.bundles
    assert bundle.query_str == result.transform.searches()[0].text
    assert bundle.query_str.count(Q) >= 2 and bundle.query_str.endswith(P1)
    assert bundle.embedding is None


def test_replacing_hyde_repeats_the_question_for_keyword_search() -> None:
    base = StaticRetriever(DOCS, default=["pto"])
    hyde = HyDE(ScriptedLLM([P1]), strategy="replace", gate=None)
    TransformRetriever(base, hyde, search_type="keyword").search(Q)
    text = base.queries[0]
    assert text == keyword_query(Q, [P1], HyDE.SHIPPED["capable"].query_weight)
    assert text.count(Q) > 1


@pytest.mark.parametrize("use_async", [False, True])
async def test_hybrid_routing_dense_side_keeps_the_question_bm25_gets_the_passage(
    use_async: bool,
) -> None:
    embed = DeterministicEmbedding()
    base = StaticRetriever(DOCS, default=["pto"])
    base.search_type = "hybrid"  # type: ignore[attr-defined]
    hyde = HyDE(ScriptedLLM([P1], forbid_sync=use_async), query_weight=1.0, keyword_weight=0.3)
    retriever = TransformRetriever(base, hyde, embed_model=embed)
    assert retriever.search_type == "hybrid"
    await search(retriever, Q, use_async)
    [bundle] = base.bundles
    np.testing.assert_allclose(bundle.embedding, embed.vector(Q), atol=1e-12)
    assert bundle.query_str == keyword_query(Q, [P1], 0.3)
    assert P1 in bundle.query_str and Q in bundle.query_str


def test_keyword_weight_defaults_to_query_weight() -> None:
    assert HyDE(ScriptedLLM(), query_weight=0.6).keyword_weight == 0.6
    assert HyDE(ScriptedLLM(), query_weight=0.6, keyword_weight=0.2).keyword_weight == 0.2
    assert HyDE(ScriptedLLM(), include_query=True).keyword_weight is None


def test_query_weight_one_without_an_embedder_embeds_the_question_alone() -> None:
    result = HyDE(ScriptedLLM([P1]), query_weight=1.0).transform(Q)
    assert result.embedding_strs == (Q,)


@pytest.mark.parametrize(
    ("w", "n", "share"), [(0.5, 1, 0.5), (0.75, 1, 0.75), (0.5, 2, 0.5), (0.8, 2, 0.8)]
)
def test_embedding_strs_fallback_repeats_the_question_to_its_share(
    w: float, n: int, share: float
) -> None:
    passages = tuple(f"passage {i}" for i in range(n))
    result = HyDE(ScriptedLLM(list(passages)), query_weight=w, num_passages=n).transform(Q)
    assert sorted(result.hypothetical) == list(passages)  # the calls run at once
    strs = result.embedding_strs
    assert strs[:n] == result.hypothetical and set(strs[n:]) == {Q}
    assert strs.count(Q) / len(strs) == pytest.approx(share)


def test_embedding_strs_without_a_weight_are_the_papers_mean_or_passages_only() -> None:
    with_q = TransformResult(query=Q, method="hyde", queries=(Q,), hypothetical=(P1, P2))
    assert with_q.embedding_strs == (P1, P2, Q)
    assert with_q.searches()[0].query_weight == pytest.approx(1 / 3)
    without = TransformResult(
        query=Q, method="hyde", queries=(Q,), hypothetical=(P1,), include_query=False
    )
    assert without.embedding_strs == (P1,) and without.searches()[0].query_weight == 0.0


# -- rerank instead of replace ------------------------------------------------------------
@pytest.mark.parametrize("use_async", [False, True])
async def test_rerank_returns_exactly_the_questions_candidates(
    top3: tuple[BaseRetriever, list[str]], spy_queries: list[VectorStoreQuery], use_async: bool
) -> None:
    base, plain = top3
    assert "renewals" not in plain  # the passage's best match is outside the candidates
    llm = ScriptedLLM([P1], forbid_sync=use_async)
    retriever = TransformRetriever(base, HyDE(llm, strategy="rerank", blend=1.0, gate=None))
    result = await search(retriever, Q, use_async)
    assert set(ids(result.nodes)) == set(plain)  # Recall@3 is plain search's
    assert len(spy_queries) == 1  # only the question was searched
    assert not result.transform.fallback and result.transform.hypothetical == (P1,)


@pytest.mark.parametrize("use_async", [False, True])
async def test_rerank_reorders_by_similarity_to_the_generated_text(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=len(DOCS))
    plain = ids(base.retrieve(Q))
    assert plain[0] == "lunch" and plain[-1] == "renewals"
    retriever = TransformRetriever(
        base,
        HyDE(ScriptedLLM([P1], forbid_sync=use_async), strategy="rerank", blend=1.0, gate=None),
    )
    result = await search(retriever, Q, use_async)
    got = ids(result.nodes)
    assert sorted(got) == sorted(plain)
    assert got[0] == "renewals"  # the passage's best match moved to the top


@pytest.mark.parametrize("use_async", [False, True])
async def test_rerank_with_blend_zero_keeps_the_questions_order(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=len(DOCS))
    plain = ids(base.retrieve(Q))
    retriever = TransformRetriever(
        base,
        HyDE(ScriptedLLM([P1], forbid_sync=use_async), strategy="rerank", blend=0.0, gate=None),
    )
    result = await search(retriever, Q, use_async)
    assert ids(result.nodes) == plain


def test_rerank_on_a_static_retriever_with_an_explicit_embed_model() -> None:
    base = StaticRetriever(DOCS, results={Q: ["lunch", "pricing", "renewals"]})
    retriever = TransformRetriever(
        base,
        HyDE(ScriptedLLM([P1]), strategy="rerank", blend=0.8, gate=None),
        embed_model=DeterministicEmbedding(),
    )
    result = retriever.search(Q)
    assert base.queries == [Q]
    assert ids(result.nodes)[0] == "renewals" and set(ids(result.nodes)) == {
        "lunch",
        "pricing",
        "renewals",
    }


def test_rerank_after_a_failed_generation_keeps_the_questions_hits(
    top3: tuple[BaseRetriever, list[str]],
) -> None:
    base, plain = top3
    hyde = HyDE(ScriptedLLM([RuntimeError("down")]), strategy="rerank", retry=None, gate=None)
    result = TransformRetriever(base, hyde).search(Q)
    assert result.transform.fallback and ids(result.nodes) == plain


# -- gate ---------------------------------------------------------------------------------
@pytest.mark.parametrize("use_async", [False, True])
async def test_gate_skips_an_unrelated_passage_quietly(
    faiss_index: VectorStoreIndex, caplog: pytest.LogCaptureFixture, use_async: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    base = faiss_index.as_retriever(similarity_top_k=3)
    plain = base.retrieve(Q)
    llm = ScriptedLLM([UNRELATED], forbid_sync=use_async)
    retriever = TransformRetriever(base, HyDE(llm, query_weight=0.0, gate=0.2))
    result = await search(retriever, Q, use_async)
    assert result.transform.skipped and "gate" in result.transform.skipped
    assert not result.transform.fallback and result.transform.error is None
    assert ids(result.nodes) == ids(plain)
    assert [n.score for n in result.nodes] == pytest.approx([n.score for n in plain])
    assert no_warnings(caplog) == []
    assert result.transform.to_dict()["skipped"] == result.transform.skipped


@pytest.mark.parametrize("use_async", [False, True])
async def test_gate_keeps_a_related_passage(faiss_index: VectorStoreIndex, use_async: bool) -> None:
    base = faiss_index.as_retriever(similarity_top_k=1)
    llm = ScriptedLLM([P1], forbid_sync=use_async)
    retriever = TransformRetriever(base, HyDE(llm, query_weight=0.0, gate=0.2))
    result = await search(retriever, Q, use_async)
    assert result.transform.skipped is None
    assert ids(result.nodes) == ["renewals"]  # the passage was searched


def test_gate_threshold_is_inclusive_of_the_similarity() -> None:
    # cosine(Q, P1) is 0.25: a gate above it skips, one at or below keeps
    base = StaticRetriever(DOCS, default=["pto"])
    embed = DeterministicEmbedding()
    above = TransformRetriever(base, HyDE(ScriptedLLM([P1]), gate=0.3), embed_model=embed)
    below = TransformRetriever(base, HyDE(ScriptedLLM([P1]), gate=0.25), embed_model=embed)
    assert above.search(Q).transform.skipped
    assert below.search(Q).transform.skipped is None


def test_gate_with_rerank_keeps_the_questions_order(faiss_index: VectorStoreIndex) -> None:
    base = faiss_index.as_retriever(similarity_top_k=len(DOCS))
    plain = ids(base.retrieve(Q))
    hyde = HyDE(ScriptedLLM([UNRELATED]), strategy="rerank", blend=1.0, gate=0.2)
    result = TransformRetriever(base, hyde).search(Q)
    assert result.transform.skipped and ids(result.nodes) == plain


# -- grounded HyDE ------------------------------------------------------------------------
@pytest.mark.parametrize("use_async", [False, True])
async def test_grounded_prompt_shows_the_questions_top_k_passages_trimmed(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    base = faiss_index.as_retriever(similarity_top_k=5)
    plain = ids(base.retrieve(Q))
    llm = ScriptedLLM([P1], forbid_sync=use_async)
    hyde = HyDE(llm, grounded=2, context_characters=40)
    retriever = TransformRetriever(base, hyde)
    result = await search(retriever, Q, use_async)
    assert not result.transform.fallback
    [prompt] = llm.prompts
    shown = [trim_passage(DOCS[nid], 40) for nid in plain[:2]]
    assert all(len(s) <= 40 for s in shown)
    block = "\n".join(f"[{i}] {text}" for i, text in enumerate(shown, 1))
    assert prompt.startswith(GROUNDING_PREFIX.format(context=block))
    assert f"Question: {Q}" in prompt
    assert DOCS[plain[0]] not in prompt  # the full passage was trimmed
    assert trim_passage(DOCS[plain[2]], 40) not in prompt  # only the top 2


def test_ungrounded_prompt_has_no_passages(faiss_index: VectorStoreIndex) -> None:
    llm = ScriptedLLM([P1])
    TransformRetriever(faiss_index.as_retriever(), HyDE(llm)).search(Q)
    assert "Passages from the collection" not in llm.prompts[0]


def test_grounded_then_gated_searches_the_question_only_once() -> None:
    embed = DeterministicEmbedding()
    base = StaticRetriever(DOCS, results={Q: ["renewals", "lunch"]})
    hyde = HyDE(ScriptedLLM([UNRELATED]), grounded=2, gate=0.2)
    result = TransformRetriever(base, hyde, embed_model=embed).search(Q)
    assert result.transform.skipped
    assert base.queries == [Q]  # the grounding search's hits are the question's list
    assert ids(result.nodes) == ["renewals", "lunch"]


async def test_grounded_search_runs_the_question_then_the_expansion() -> None:
    embed = DeterministicEmbedding()
    base = StaticRetriever(DOCS, results={Q: ["renewals", "lunch"]}, default=["pto"])
    hyde = HyDE(ScriptedLLM([P1], forbid_sync=True), grounded=1, query_weight=0.5)
    await TransformRetriever(base, hyde, embed_model=embed).asearch(Q)
    assert len(base.bundles) == 2
    np.testing.assert_allclose(base.bundles[0].embedding, embed.vector(Q), atol=1e-12)
    want = weighted_vector(embed.vector(Q), [embed.vector(P1)], 0.5)
    np.testing.assert_allclose(base.bundles[1].embedding, want, atol=1e-12)


@pytest.mark.parametrize("use_async", [False, True])
async def test_grounded_generations_are_cached_per_context(use_async: bool) -> None:
    base = StaticRetriever(DOCS, results={Q: ["renewals", "lunch"]})
    llm = ScriptedLLM([P1, P2, P1], forbid_sync=use_async)
    hyde = HyDE(llm, grounded=2, cache=MemoryCache())
    retriever = TransformRetriever(base, hyde, embed_model=DeterministicEmbedding())

    async def run() -> TransformResult:
        result = await search(retriever, Q, use_async)
        return result.transform

    first, second = await run(), await run()
    assert len(llm.prompts) == 1 and second.cached and second.hypothetical == (P1,)
    assert not first.cached
    base.results[Q] = ["pto", "hiring"]  # the collection changed: other context
    third = await run()
    assert len(llm.prompts) == 2 and not third.cached and third.hypothetical == (P2,)
    assert DOCS["pto"] in llm.prompts[1]


def test_context_is_not_in_the_cache_key_of_an_ungrounded_hyde() -> None:
    llm = ScriptedLLM([P1, P2])
    hyde = HyDE(llm, cache=MemoryCache())
    hyde.transform(Q, context=["one passage"])
    again = hyde.transform(Q, context=["another passage"])
    assert len(llm.prompts) == 1 and again.cached
    assert hyde.cache_key_for(Q) == hyde.cache_key_for(Q, None)
    grounded = HyDE(llm, grounded=1)
    assert grounded.cache_key_for(Q, ["a"]) != grounded.cache_key_for(Q, ["b"])


def test_search_options_share_one_cached_generation() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM([P1])
    HyDE(llm, cache=cache, query_weight=0.3).transform(Q)
    other = HyDE(llm, cache=cache, query_weight=0.9, keyword_weight=0.1, gate=0.5).transform(Q)
    assert len(llm.prompts) == 1 and other.cached
    assert other.search_options == {"query_weight": 0.9, "keyword_weight": 0.1}
    assert other.searches()[0].query_weight == 0.9
    plain_mean = HyDE(llm, cache=cache, include_query=True).transform(Q)
    assert plain_mean.cached and plain_mean.search_options == {} and plain_mean.include_query
    assert plain_mean.searches()[0].query_weight == pytest.approx(1 / 2)


def test_grounding_is_part_of_the_cache_key() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM([P1, P2])
    HyDE(llm, cache=cache).transform(Q)
    grounded = HyDE(llm, cache=cache, grounded=1).transform(Q, context=["some passage"])
    assert len(llm.prompts) == 2 and not grounded.cached


# -- fan-out guard ------------------------------------------------------------------------
FANOUT = {
    "q": ["pto", "hiring"],
    "para one": ["office", "security"],
    "para two": ["office", "security"],
}


@pytest.mark.parametrize("use_async", [False, True])
async def test_original_weight_puts_the_questions_hits_first(use_async: bool) -> None:
    async def run_with(weight: float) -> SearchResult:
        base = StaticRetriever(DOCS, results=FANOUT)
        llm = ScriptedLLM(["1. para one\n2. para two"], forbid_sync=use_async)
        retriever = TransformRetriever(base, MultiQuery(llm, n=2, original_weight=weight))
        return await retriever.asearch("q") if use_async else retriever.search("q")

    heavy = await run_with(10.0)
    assert ids(heavy.nodes)[:2] == ["pto", "hiring"]
    assert heavy.transform.original_weight == 10.0
    equal = await run_with(1.0)
    assert ids(equal.nodes)[0] == "office"  # two paraphrases outvote the question


@pytest.mark.parametrize(
    ("cls", "reply"),
    [(StepBack, "para one"), (Rewrite, "para one"), (Decompose, "1. para one\n2. para two")],
)
def test_every_fan_out_transform_weights_the_question(cls: type, reply: str) -> None:
    base = StaticRetriever(DOCS, results=FANOUT)
    transform = cls(ScriptedLLM([reply]), include_query=True, original_weight=10.0)
    result = TransformRetriever(base, transform).search("q")
    assert ids(result.nodes)[:2] == ["pto", "hiring"]
    specs = result.transform.searches()
    assert specs[0].text == "q" and specs[0].weight == 10.0
    assert all(s.weight == 1.0 for s in specs[1:])


def test_original_weight_survives_the_cache() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM(["1. para one\n2. para two"])
    MultiQuery(llm, n=2, cache=cache, include_query=False).transform("q")
    again = MultiQuery(llm, n=2, cache=cache, original_weight=3.0).transform("q")
    assert len(llm.prompts) == 1 and again.cached
    assert again.original_weight == 3.0 and again.include_query
    assert again.search_queries == ("q", "para one", "para two")


def test_parse_rule_is_part_of_the_list_cache_key() -> None:
    # MultiQuery drops an echo of the question while parsing, Rewrite keeps it: they
    # must not share a cached parse
    assert MultiQuery.parse_excludes_query and not Rewrite.parse_excludes_query
    assert not Decompose.parse_excludes_query and StepBack.parse_excludes_query
    mq = MultiQuery(ScriptedLLM(["1. q\n2. other"]), n=2)
    assert mq.transform("q").queries == ("other",)
    dec = Decompose(ScriptedLLM(["1. q"]), n=2)
    assert dec.transform("q").queries == ("q",)


@pytest.mark.parametrize("bad", [-1, 101, float("nan")])
def test_bad_original_weight_is_a_value_error(bad: float) -> None:
    with pytest.raises(ValueError, match="original_weight"):
        MultiQuery(ScriptedLLM(), original_weight=bad)


@pytest.mark.parametrize("bad", [True, "2"])
def test_non_number_original_weight_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="original_weight"):
        StepBack(ScriptedLLM(), original_weight=bad)  # type: ignore[arg-type]


# -- hostile options ----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["query_weight", "keyword_weight", "blend"])
def test_out_of_range_weights_are_value_errors_naming_them(name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=name):
        HyDE(ScriptedLLM(), **{name: bad})


@pytest.mark.parametrize("bad", [True, "0.5", [0.5]])
@pytest.mark.parametrize("name", ["query_weight", "keyword_weight"])
def test_non_number_weights_are_type_errors_naming_them(name: str, bad: object) -> None:
    with pytest.raises(TypeError, match=name):
        HyDE(ScriptedLLM(), **{name: bad})


def test_contradicting_include_query_and_query_weight_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="include_query=False contradicts"):
        HyDE(ScriptedLLM(), include_query=False, query_weight=0.5)
    with pytest.raises(ValueError, match="include_query=True contradicts"):
        HyDE(ScriptedLLM(), include_query=True, query_weight=0.0)


@pytest.mark.parametrize(
    ("query_weight", "include_query", "want"),
    [
        (None, None, (None, True)),  # the shipped defaults decide later
        (None, True, (None, True)),
        (None, False, (None, False)),
        (0.0, None, (0.0, False)),
        (0.0, False, (0.0, False)),
        (0.4, None, (0.4, True)),
        (0.4, True, (0.4, True)),
    ],
)
def test_resolve_weight(
    query_weight: float | None, include_query: bool | None, want: tuple
) -> None:
    assert _resolve_weight(query_weight, include_query) == want


def test_strategy_must_be_replace_or_rerank() -> None:
    with pytest.raises(ValueError, match="strategy"):
        HyDE(ScriptedLLM(), strategy="bogus")  # type: ignore[arg-type]
    assert HyDE(ScriptedLLM()).guards.strategy == "replace"


@pytest.mark.parametrize("bad", [-1, 21])
def test_grounded_out_of_range_is_a_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match="between 0 and 20"):
        HyDE(ScriptedLLM(), grounded=bad)


def test_grounded_error_names_the_option() -> None:
    with pytest.raises(ValueError, match="grounded"):
        HyDE(ScriptedLLM(), grounded=21)


@pytest.mark.parametrize("bad", [True, 2.0, "3"])
def test_grounded_must_be_an_int(bad: object) -> None:
    with pytest.raises(TypeError):
        HyDE(ScriptedLLM(), grounded=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [2, -1.5, float("nan")])
def test_gate_outside_minus_one_to_one_is_a_value_error(bad: float) -> None:
    with pytest.raises(ValueError, match="gate"):
        HyDE(ScriptedLLM(), gate=bad)


@pytest.mark.parametrize("bad", ["0.5", True])
def test_gate_must_be_a_number(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="gate"):
        HyDE(ScriptedLLM(), gate=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"context_characters": 0}, ValueError), ({"context_characters": True}, TypeError)],
)
def test_bad_context_characters(kwargs: dict, error: type) -> None:
    with pytest.raises(error, match="context_characters"):
        HyDE(ScriptedLLM(), **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_k": 21},
        {"strategy": "x"},
        {"blend": 1.1},
        {"gate": -2.0},
        {"feedback_k": 101},
        {"feedback_alpha": -1.0},
        {"feedback_beta": -0.5},
    ],
)
def test_guards_reject_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Guards(**kwargs)


def test_needs_question_hits() -> None:
    assert not Guards().needs_question_hits
    assert not Guards(gate=0.5).needs_question_hits
    assert Guards(context_k=1).needs_question_hits
    assert Guards(strategy="rerank").needs_question_hits
    assert Guards(feedback_k=3).needs_question_hits


def test_every_hyde_tune_grid_configuration_builds() -> None:
    from llama_index_hyde_plus.transforms.registry import entry_for

    grid = entry_for("hyde").grid
    assert grid[0] == {"include_query": False}
    for options in grid:
        HyDE(ScriptedLLM(), **options)
    for options in entry_for("multi-query").grid:
        MultiQuery(ScriptedLLM(), **options)


# -- the result carries the options -------------------------------------------------------
def test_result_round_trips_the_new_fields() -> None:
    result = TransformResult(
        query=Q,
        method="hyde",
        queries=(Q,),
        hypothetical=(P1,),
        search_options={"query_weight": 0.6, "keyword_weight": 0.2},
        original_weight=3.0,
        skipped="gate said no",
    )
    data = result.to_dict()
    assert (data["query_weight"], data["keyword_weight"]) == (0.6, 0.2)
    assert (data["original_weight"], data["skipped"]) == (3.0, "gate said no")
    assert TransformResult.from_dict(data) == result


def test_result_defaults_are_left_out_of_the_dict_and_restored() -> None:
    result = TransformResult(query=Q, method="multi-query", queries=("a",))
    data = result.to_dict()
    assert not {"query_weight", "keyword_weight", "original_weight", "skipped"} & set(data)
    back = TransformResult.from_dict(data)
    assert back == result and back.original_weight == 1.0 and back.search_options == {}


def test_hyde_search_spec_carries_passages_and_weight() -> None:
    result = HyDE(ScriptedLLM([P1]), query_weight=0.4, keyword_weight=0.5).transform(Q)
    [spec] = result.searches()
    assert spec.passages == (P1,) and spec.query == Q and spec.query_weight == 0.4
    assert spec.text == keyword_query(Q, [P1], 0.5)
    assert result.search_options == {"query_weight": 0.4, "keyword_weight": 0.5}


def test_a_result_with_passages_and_no_specs_is_searched_with_the_papers_mean() -> None:
    """A user's passage transform that fills no ``specs`` still searches its passages
    (the question and passages averaged), never the question alone."""
    result = TransformResult(query=Q, method="mine", queries=(Q,), hypothetical=(P1,))
    [spec] = result.searches()
    assert spec.passages == (P1,) and spec.query_weight == pytest.approx(0.5)
    assert spec.embedding_strs == (P1, Q) and spec.text == f"{Q}\n\n{P1}"


@pytest.mark.parametrize("options", [{"gate": 0.2}, {"strategy": "rerank"}, {"grounded": 2}])
def test_a_chain_refuses_guards_it_cannot_carry_out(options: dict) -> None:
    with pytest.raises(ValueError, match="then"):
        StepBack(ScriptedLLM(["sub question"])).then(HyDE(ScriptedLLM([UNRELATED]), **options))


# -- non-finite vectors fall back to the question's search ---------------------
class _Poisoned(DeterministicEmbedding):
    """Embeds any text holding ``poison`` (or a document listed in it) as NaNs."""

    poison: tuple[str, ...] = ("poison",)

    def vector(self, text: str) -> list[float]:
        if any(p in text for p in self.poison):
            return [float("nan")] * self.dim
        return super().vector(text)


def _plain_index() -> VectorStoreIndex:
    from llama_index.core.schema import TextNode

    nodes = [TextNode(id_=k, text=v) for k, v in DOCS.items()]
    return VectorStoreIndex(nodes, embed_model=DeterministicEmbedding(dim=64))


def _all_finite(result: SearchResult) -> bool:
    return bool(result.nodes) and all(np.isfinite(n.score) for n in result.nodes)  # type: ignore[arg-type]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_nan_document_vector_makes_rocchio_fall_back_with_the_reason(
    use_async: bool,
) -> None:
    from llama_index_hyde_plus.transforms.feedback import Rocchio

    index = _plain_index()
    base = index.as_retriever(similarity_top_k=5)
    plain = [n.node.node_id for n in base.retrieve("Why did revenue drop?")]
    poisoned = _Poisoned(dim=64, poison=(DOCS[plain[0]][:30],))
    retriever = TransformRetriever(base, Rocchio(k=3, beta=0.5), embed_model=poisoned)
    q = "Why did revenue drop?"
    result = await retriever.asearch(q) if use_async else retriever.search(q)
    assert _all_finite(result), [n.score for n in result.nodes]
    assert [n.node.node_id for n in result.nodes] == plain  # the question's own search
    assert result.transform.fallback and "NaN" in (result.transform.error or "")


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_nan_passage_vector_makes_hyde_fall_back_with_the_reason(
    use_async: bool,
) -> None:
    index = _plain_index()
    base = index.as_retriever(similarity_top_k=5)
    q = "Why did revenue drop?"
    plain = [n.node.node_id for n in base.retrieve(q)]
    hyde = HyDE(ScriptedLLM(["A poison passage about revenue."] * 2), include_query=True)
    retriever = TransformRetriever(base, hyde, embed_model=_Poisoned(dim=64))
    result = await retriever.asearch(q) if use_async else retriever.search(q)
    assert _all_finite(result), [n.score for n in result.nodes]
    assert [n.node.node_id for n in result.nodes] == plain
    assert result.transform.fallback and "NaN" in (result.transform.error or "")
