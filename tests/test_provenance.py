from __future__ import annotations

import json

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever, transform_of
from llama_index_hyde_plus.provenance import METADATA_KEY
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "How many vacation days do employees get?"
PARAPHRASES = "1. paid time off allowance\n2. annual leave entitlement"
PASSAGE = "Staff are given twenty five days of paid leave every year."


def engine_over(index: VectorStoreIndex, transform_llm: ScriptedLLM, answer: ScriptedLLM):  # type: ignore[no-untyped-def]
    retriever = TransformRetriever(
        index.as_retriever(similarity_top_k=2), MultiQuery(transform_llm, n=2)
    )
    return RetrieverQueryEngine.from_args(retriever, llm=answer)


def assert_carries_the_multi_query(info: dict | None) -> None:
    assert info is not None
    assert info["method"] == "multi-query" and info["query"] == Q
    assert info["queries"] == ["paid time off allowance", "annual leave entitlement"]
    assert info["usage"]["calls"] == 1 and info["usage"]["total_tokens"] > 0
    assert info["fallback"] is False and info["error"] is None and info["skipped"] is None
    json.dumps(info)  # JSON-able, as node metadata should be


def test_query_engine_response_carries_what_the_transform_did(
    faiss_index: VectorStoreIndex,
) -> None:
    answer = ScriptedLLM(respond=lambda p: "Twenty five days.")
    response = engine_over(faiss_index, ScriptedLLM([PARAPHRASES]), answer).query(Q)
    assert str(response) == "Twenty five days." and len(response.source_nodes) == 2
    top = response.source_nodes[0].node.node_id
    assert METADATA_KEY in (response.metadata or {})[top]  # one carrier: the top node
    assert_carries_the_multi_query(transform_of(response))


async def test_async_query_engine_response_carries_it_without_blocking(
    faiss_index: VectorStoreIndex,
) -> None:
    llm = ScriptedLLM([PARAPHRASES], forbid_sync=True)
    answer = ScriptedLLM(respond=lambda p: "Twenty five days.", forbid_sync=True)
    response = await engine_over(faiss_index, llm, answer).aquery(Q)
    assert_carries_the_multi_query(transform_of(response))
    assert llm.sync_calls == 0 and answer.sync_calls == 0


def test_the_answer_prompt_and_embeddings_never_see_the_summary(
    faiss_index: VectorStoreIndex,
) -> None:
    answer = ScriptedLLM(respond=lambda p: "ok")
    response = engine_over(faiss_index, ScriptedLLM([PARAPHRASES]), answer).query(Q)
    [prompt] = answer.prompts
    assert DOCS["pto"] in prompt  # the context is there...
    assert METADATA_KEY not in prompt and "annual leave entitlement" not in prompt  # ...not it
    assert METADATA_KEY in response.source_nodes[0].node.get_content(MetadataMode.ALL)
    for item in response.source_nodes:
        assert METADATA_KEY not in item.node.get_content(MetadataMode.LLM)
        assert METADATA_KEY not in item.node.get_content(MetadataMode.EMBED)


@pytest.mark.parametrize("use_async", [False, True])
async def test_the_wrapped_stores_nodes_are_left_untouched(use_async: bool) -> None:
    base = StaticRetriever(DOCS, default=["pto", "hiring"])
    base.nodes["pto"].metadata["team"] = "people"
    base.nodes["pto"].excluded_llm_metadata_keys = ["team"]
    retriever = TransformRetriever(base, HyDE(ScriptedLLM([PASSAGE]), include_query=True))
    nodes = await retriever.aretrieve(Q) if use_async else retriever.retrieve(Q)
    assert nodes[0].node.metadata["team"] == "people" and METADATA_KEY in nodes[0].node.metadata
    assert nodes[0].node.excluded_llm_metadata_keys == ["team", METADATA_KEY]
    assert base.nodes["pto"].metadata == {"team": "people"}
    assert base.nodes["pto"].excluded_llm_metadata_keys == ["team"]
    assert base.nodes["pto"].excluded_embed_metadata_keys == []
    assert [n.score for n in nodes] == [2.0, 1.0]


def test_hyde_passages_and_a_fallback_reach_the_response(faiss_index: VectorStoreIndex) -> None:
    answer = ScriptedLLM(respond=lambda p: "ok")
    hyde = HyDE(ScriptedLLM([PASSAGE]), include_query=True)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=1), hyde)
    info = transform_of(RetrieverQueryEngine.from_args(retriever, llm=answer).query(Q))
    assert info is not None and info["method"] == "hyde" and info["hypothetical"] == [PASSAGE]

    broken = HyDE(ScriptedLLM([TimeoutError("slow")] * 6), include_query=True)  # retried
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=1), broken)
    info = transform_of(RetrieverQueryEngine.from_args(retriever, llm=answer).query(Q))
    assert info is not None and info["fallback"] is True
    assert "TimeoutError" in (info["error"] or "") and info["hypothetical"] == []


def test_a_gated_expansion_says_why_it_was_skipped(faiss_index: VectorStoreIndex) -> None:
    off_topic = "Laptops must use full disk encryption and a hardware key."
    hyde = HyDE(ScriptedLLM([off_topic]), gate=0.99)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=1), hyde)
    info = transform_of(retriever.retrieve(Q))
    assert info is not None and "gate" in (info["skipped"] or "")


def test_search_results_are_not_tagged_and_untagged_things_read_as_none() -> None:
    base = StaticRetriever(DOCS, default=["pto"])
    retriever = TransformRetriever(base, HyDE(ScriptedLLM([PASSAGE]), include_query=True))
    assert transform_of(retriever.search(Q).nodes) is None  # search() leaves nodes as found
    assert transform_of(base.retrieve(Q)) is None
    assert transform_of([]) is None and transform_of(None) is None and transform_of("x") is None


def test_transform_of_returns_a_copy(faiss_index: VectorStoreIndex) -> None:
    retriever = TransformRetriever(
        faiss_index.as_retriever(similarity_top_k=1), MultiQuery(ScriptedLLM([PARAPHRASES]), n=2)
    )
    nodes = retriever.retrieve(Q)
    first = transform_of(nodes)
    assert first is not None
    first["queries"].clear()
    assert transform_of(nodes)["queries"] == ["paid time off allowance", "annual leave entitlement"]  # type: ignore[index]
