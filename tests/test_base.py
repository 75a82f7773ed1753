from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.query_engine import TransformQueryEngine
from llama_index.core.schema import QueryBundle

from llama_index_hyde_plus import (
    Decompose,
    FusionMode,
    HyDE,
    QueryTransformer,
    TransformResult,
    TransformRetriever,
)
from llama_index_hyde_plus.testing import ScriptedLLM


class ExpandAcronyms(QueryTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def transform(self, query: str) -> str:
        self.threads.append(threading.current_thread().name)
        return query.replace("PTO", "paid time off")


def test_custom_transformer_returning_str_is_coerced() -> None:
    result = ExpandAcronyms().transform_safe("How much PTO do I get?")
    assert result.queries == ("How much paid time off do I get?",)
    # what the transformer returns is what gets searched, as in the seed
    assert result.search_queries == ("How much paid time off do I get?",)
    assert result.method == "ExpandAcronyms"
    assert not result.fallback


async def test_custom_transformer_async_runs_in_a_worker_thread() -> None:
    transformer = ExpandAcronyms()
    result = await transformer.atransform_safe("PTO policy")
    assert result.queries == ("paid time off policy",)
    assert transformer.threads and transformer.threads[0] != threading.main_thread().name


def test_custom_transformer_returning_list_or_result() -> None:
    class Listy(QueryTransformer):
        include_query = False

        def transform(self, query: str) -> list[str]:
            return [query + " a", query + " b"]

    class Full(QueryTransformer):
        method = "full"

        def transform(self, query: str) -> TransformResult:
            return TransformResult(query=query, method="full", queries=("x",))

    assert Listy().transform_safe("q").search_queries == ("q a", "q b")
    assert Full().transform_safe("q").queries == ("x",)


def test_raising_custom_transformer_is_logged_and_falls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(QueryTransformer):
        def transform(self, query: str) -> str:
            raise KeyError("nope")

    caplog.set_level(logging.ERROR, logger="llama_index_hyde_plus")
    result = Broken().transform_safe("q")
    assert result.fallback and result.queries == () and "KeyError" in (result.error or "")
    assert result.search_queries == ("q",)
    assert any("Broken" in r.getMessage() for r in caplog.records)


def test_wrong_return_type_falls_back_with_type_error() -> None:
    class Wrong(QueryTransformer):
        def transform(self, query: str) -> int:
            return 3

    result = Wrong().transform_safe("q")
    assert result.fallback and "TypeError" in (result.error or "")


def test_run_returns_bundle_with_original_question_and_passages_to_embed() -> None:
    bundle = HyDE(ScriptedLLM(["A passage."]), include_query=True).run("Why?")
    assert isinstance(bundle, QueryBundle)
    assert bundle.query_str == "Why?"
    assert bundle.embedding_strs == ["A passage.", "Why?"]


def test_transform_query_engine_answers_with_the_original_question(
    faiss_index: VectorStoreIndex,
) -> None:
    marker = "Revenue fell when enterprise renewals slipped and accounts delayed signing."
    answer_llm = ScriptedLLM(respond=lambda prompt: "Renewals slipped.")
    engine = faiss_index.as_query_engine(llm=answer_llm, similarity_top_k=1)
    hyde_llm = ScriptedLLM([marker])
    response = TransformQueryEngine(engine, HyDE(hyde_llm, include_query=False)).query(
        "Why did revenue drop?"
    )
    assert str(response) == "Renewals slipped."
    assert response.source_nodes[0].node.node_id == "renewals"
    [answer_prompt] = answer_llm.prompts
    assert "Why did revenue drop?" in answer_prompt
    assert marker not in answer_prompt
    assert len(hyde_llm.prompts) == 1


def test_prompts_of_a_transform_are_reachable_through_host_components(
    faiss_index: VectorStoreIndex,
) -> None:
    engine = TransformQueryEngine(
        faiss_index.as_query_engine(llm=ScriptedLLM()), HyDE(ScriptedLLM())
    )
    assert "query_transform:hyde_prompt" in engine.get_prompts()


def test_then_runs_second_transform_for_each_sub_question() -> None:
    decompose_llm = ScriptedLLM(["1. sub one\n2. sub two"])
    hyde_llm = ScriptedLLM(respond=lambda p: "passage about " + p.split("Question: ")[1][:7])
    chain = Decompose(decompose_llm, n=2, include_query=False).then(HyDE(hyde_llm))
    result = chain.transform_safe("complex question")
    assert result.method == "decompose+hyde"
    assert result.queries == ("sub one", "sub two")
    assert [c.query for c in result.children] == ["sub one", "sub two"]
    assert len(result.searches()) == 2
    assert result.usage.calls == 3
    assert chain.default_fusion is FusionMode.INTERLEAVE


async def test_then_runs_the_second_transform_concurrently() -> None:
    started: list[str] = []
    release = asyncio.Event()

    class Gate(QueryTransformer):
        async def atransform(self, query: str) -> str:
            started.append(query)
            if len(started) == 3:
                release.set()
            await asyncio.wait_for(release.wait(), 2)
            return query + "!"

    chain = Decompose(ScriptedLLM(["1. a1\n2. b2\n3. c3"]), n=3, include_query=False).then(Gate())
    result = await chain.atransform_safe("q")
    assert [c.queries for c in result.children] == [("a1!",), ("b2!",), ("c3!",)]
    assert not any(c.fallback for c in result.children)


def test_chain_is_usable_in_a_transform_retriever(faiss_index: VectorStoreIndex) -> None:
    chain = Decompose(
        ScriptedLLM(["1. engineers hired\n2. office moved"]), n=2, include_query=False
    ).then(
        HyDE(
            ScriptedLLM(respond=lambda p: p.split("Question: ")[1].split("\n")[0]),
            include_query=False,
        )
    )
    # one hit per sub-search; top_k=2 keeps both (None would cut to the retriever's 1)
    retriever = TransformRetriever(faiss_index.as_retriever(similarity_top_k=1), chain, top_k=2)
    ids = [n.node.node_id for n in retriever.search("growth questions").nodes]
    assert ids == ["hiring", "office"]


def test_a_doubled_braced_name_is_a_literal_and_json_braces_are_kept() -> None:
    from llama_index_hyde_plus import HyDE, MultiQuery
    from llama_index_hyde_plus.testing import ScriptedLLM

    llm = ScriptedLLM(["passage."])
    prompt = 'Reply as JSON {"passage": "..."}; never write {{name}} or {{query}}.\nQ: {query}'
    HyDE(llm, prompt=prompt).transform("Why?")
    assert llm.prompts[-1].endswith(
        'Reply as JSON {"passage": "..."}; never write {name} or {query}.\nQ: Why?'
    )
    MultiQuery(ScriptedLLM(), prompt="{{n}} is a literal; give {n} for {query}")
    with pytest.raises(ValueError, match=r"double its braces: \{\{name\}\}"):
        HyDE(llm, prompt="{qeury} {query}")


def test_a_query_with_a_lone_surrogate_is_a_clear_value_error() -> None:
    from llama_index_hyde_plus.transforms.base import validate_query

    with pytest.raises(ValueError, match="surrogate"):
        validate_query("a \udcff revenue")


def test_a_transform_class_without_build_is_refused_when_it_is_made() -> None:
    from llama_index_hyde_plus.transforms.llm_base import LLMTransform

    with pytest.raises(TypeError, match="must define _build"):

        class Forgetful(LLMTransform):
            method = "forgetful"
