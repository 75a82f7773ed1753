"""Odd replies and inputs: a reranker's garbage, GeneratorExit, function mappings with
an escaped ``{{name}}``, a huge provider error and ``fuse``'s ``lists``."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts import PromptTemplate
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index_hyde_plus import HyDE, TransformRetriever
from llama_index_hyde_plus.calls.reliability import MAX_ERROR_CHARS, describe
from llama_index_hyde_plus.search.fusion import fuse
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

Q = "Why did revenue drop?"
TEXTS = [
    "Enterprise renewals slipped last quarter as large accounts delayed signing.",
    "The revenue operations team moved to the third floor in March.",
    "Churn rose among small customers after the price change.",
    "The cafeteria serves lunch from noon to two.",
]
PASSAGE = "Revenue dropped as enterprise renewals slipped."


def _index(embed: BaseEmbedding | None = None) -> VectorStoreIndex:
    docs = [Document(text=t) for t in TEXTS]
    return VectorStoreIndex.from_documents(docs, embed_model=embed or DeterministicEmbedding())


def _llm() -> ScriptedLLM:
    return ScriptedLLM(respond=lambda p: PASSAGE)


def _search(retriever: TransformRetriever, use_async: bool) -> Any:
    return asyncio.run(retriever.asearch(Q)) if use_async else retriever.search(Q)


def _ranked(nodes: list[Any]) -> list[tuple[str, Any]]:
    return [(n.node.node_id, n.score) for n in nodes]


# -- a reranker that returns garbage is a failed reranker ---------------------------
class _Garbage(BaseNodePostprocessor):
    """Returns what ``mode`` says instead of reranked nodes."""

    mode: str = "none"

    def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
        if self.mode == "none":
            return None
        if self.mode == "str":
            return "garbage"
        if self.mode == "texts":
            return [n.node.get_content() for n in nodes]
        if self.mode == "tuple":
            return tuple(reversed(nodes))
        for n in nodes:  # "nan", "inf", "text score"
            n.score = {"nan": math.nan, "inf": math.inf}.get(self.mode, "high")
        return list(reversed(nodes))


class _AsyncGarbage(_Garbage):
    """The same, from a native ``_apostprocess_nodes`` (awaited on the event loop)."""

    async def _apostprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
        return self._postprocess_nodes(nodes, query_bundle)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("mode", ["none", "str", "texts", "tuple", "nan", "inf", "text score"])
def test_a_reranker_that_returns_garbage_keeps_the_fused_nodes_with_a_warning(
    mode: str, use_async: bool, native: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # None crashed search/asearch/retrieve with a TypeError; a str or a list
    # of texts was served as the result's nodes; NaN scores passed through
    index = _index()
    plain = _search(TransformRetriever.from_index(index, HyDE(_llm())), use_async)
    reranker = (_AsyncGarbage if native else _Garbage)(mode=mode)
    retriever = TransformRetriever.from_index(index, HyDE(_llm()), reranker=reranker)
    with caplog.at_level(logging.WARNING):
        found = _search(retriever, use_async)
    assert found.nodes and all(isinstance(n, NodeWithScore) for n in found.nodes)
    assert _ranked(found.nodes) == _ranked(plain.nodes)  # the fused nodes, in their order
    assert not found.transform.fallback  # the reranker is not the transform
    assert any("the reranker failed" in r.getMessage() for r in caplog.records)


def test_retrieve_with_a_reranker_that_returns_none_returns_the_fused_nodes() -> None:
    index = _index()
    retriever = TransformRetriever.from_index(index, HyDE(_llm()), reranker=_Garbage())
    nodes = retriever.retrieve(Q)
    assert nodes and all(isinstance(n, NodeWithScore) for n in nodes)


class _Reverser(BaseNodePostprocessor):
    """A well-behaved reranker: the nodes reversed, the last without a score."""

    def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
        out = list(reversed(nodes))
        out[-1].score = None
        return out


@pytest.mark.parametrize("use_async", [False, True])
def test_a_reranker_answer_with_none_scores_is_used(
    use_async: bool, caplog: pytest.LogCaptureFixture
) -> None:
    index = _index()
    retriever = TransformRetriever.from_index(index, HyDE(_llm()), reranker=_Reverser())
    plain = _search(TransformRetriever.from_index(index, HyDE(_llm())), use_async)
    with caplog.at_level(logging.WARNING):
        found = _search(retriever, use_async)
    ids = [n.node.node_id for n in found.nodes]
    assert ids == [n.node.node_id for n in reversed(plain.nodes)]
    assert found.nodes[-1].score is None
    assert not any("the reranker failed" in r.getMessage() for r in caplog.records)


# -- GeneratorExit propagates, as documented ---------------------------------------
class _GenExitEmbed(BaseEmbedding):
    """Blocking text embeddings (run on worker threads) that raise GeneratorExit for
    the generated passage; the documents and the question embed normally."""

    def _v(self, text: str) -> list[float]:
        return DeterministicEmbedding().vector(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._v(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._v(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        if text.startswith("GEN"):
            raise GeneratorExit()
        return self._v(text)


class _GenExitRerank(BaseNodePostprocessor):
    def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
        raise GeneratorExit()


def _gen_exit_retriever(where: str) -> TransformRetriever:
    gen = ScriptedLLM(respond=lambda p: "GEN renewals slipped.")
    if where == "llm":
        return TransformRetriever.from_index(_index(), HyDE(ScriptedLLM([GeneratorExit()] * 3)))
    if where == "embedder":
        return TransformRetriever.from_index(_index(_GenExitEmbed()), HyDE(gen))
    return TransformRetriever.from_index(_index(), HyDE(gen), reranker=_GenExitRerank())


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("where", ["llm", "embedder", "reranker"])
def test_generator_exit_from_a_component_propagates(where: str, use_async: bool) -> None:
    # decided to propagate, like KeyboardInterrupt and SystemExit (on the
    # async path it may be the close of the caller's own coroutine, which must go on
    # up); the docs now say so
    with pytest.raises(GeneratorExit):
        _search(_gen_exit_retriever(where), use_async)


def test_the_docs_list_generator_exit_among_what_still_raises() -> None:
    text = (Path(__file__).parents[1] / "docs" / "failures-and-caches.md").read_text()
    still = text.split("What still raises:", 1)[1].split("\n\n", 1)[0]
    assert "`GeneratorExit`" in still and "`KeyboardInterrupt`" in still


# -- a function mapping runs once per rendering, escapes or not ----------------------
@pytest.mark.parametrize("use_async", [False, True])
def test_a_function_mapping_runs_once_per_prompt_with_escaped_names(use_async: bool) -> None:
    # with escapes the template was formatted piece by piece, each piece
    # calling the mapping again: 3 calls for 2 escapes, and two renderings in one prompt
    calls: list[int] = []

    def rotating(**kwargs: Any) -> str:
        calls.append(1)
        return f"EXAMPLE-{len(calls)} {kwargs['query']}"

    template = PromptTemplate(
        "Q: {query} {{literal}} {{other}} Again: {query}", function_mappings={"query": rotating}
    )
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
    hyde = HyDE(llm, prompt=template)
    asyncio.run(hyde.atransform(Q)) if use_async else hyde.transform(Q)
    assert len(calls) == 1
    assert llm.prompts[-1] == f"Q: EXAMPLE-1 {Q} {{literal}} {{other}} Again: EXAMPLE-1 {Q}"


def test_escaped_names_keep_partial_values_and_variable_mappings() -> None:
    from llama_index_hyde_plus.transforms.templates import render_template

    calls: list[int] = []

    def tone(**kwargs: Any) -> str:
        calls.append(1)
        return kwargs["style"].upper()

    template = PromptTemplate(
        "{style}: {question} {{query}} ({tone}) {style}",
        template_var_mappings={"query": "question"},
        function_mappings={"tone": tone},
    ).partial_format(style="handbook")
    assert render_template(template, query=Q) == f"handbook: {Q} {{query}} (HANDBOOK) handbook"
    assert len(calls) == 1


# -- a huge provider error is cut where its text is made -----------------------------
HUGE = "<html>" + "x" * 5_000_000 + "</html>"


def test_describe_cuts_a_long_message_and_keeps_a_short_one() -> None:
    assert describe(ConnectionError("refused")) == "ConnectionError: refused"
    assert describe(GeneratorExit()) == "GeneratorExit"
    text = describe(ConnectionError(HUGE))
    more = len(HUGE) - MAX_ERROR_CHARS
    assert text == f"ConnectionError: {HUGE[:MAX_ERROR_CHARS]}... ({more:,} more characters)"


def test_a_huge_provider_error_is_kept_and_logged_cut(caplog: pytest.LogCaptureFixture) -> None:
    # a 5 MB error page was kept verbatim in TransformResult.error, in the
    # first node's hyde_plus metadata, and logged
    retriever = TransformRetriever.from_index(
        _index(), HyDE(ScriptedLLM([ConnectionError(HUGE)] * 6))
    )
    with caplog.at_level(logging.WARNING):
        nodes = retriever.retrieve(Q)
    assert nodes
    assert len(str(nodes[0].node.metadata["hyde_plus"])) < 2 * MAX_ERROR_CHARS
    assert all(len(r.getMessage()) < 2 * MAX_ERROR_CHARS for r in caplog.records)
    error = retriever.search(Q).transform.error or ""
    assert len(error) < MAX_ERROR_CHARS + 100 and error.endswith("more characters)")


class _HugeErrorEmbed(_GenExitEmbed):
    def _get_text_embedding(self, text: str) -> list[float]:
        if text.startswith("GEN"):
            raise ValueError(HUGE)
        return self._v(text)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_huge_error_after_the_llm_is_kept_cut(use_async: bool) -> None:
    gen = ScriptedLLM(respond=lambda p: "GEN renewals slipped.")
    retriever = TransformRetriever.from_index(_index(_HugeErrorEmbed()), HyDE(gen))
    found = _search(retriever, use_async)
    assert found.transform.fallback
    assert len(found.transform.error or "") < MAX_ERROR_CHARS + 200


# -- fuse refuses bad lists by name ---------------------------------------------------
def _nws(name: str, score: float) -> NodeWithScore:
    return NodeWithScore(node=TextNode(text=name, id_=name), score=score)


@pytest.mark.parametrize(
    "lists", [[[1, 2]], "abc", [["a"]], [None], None, [[_nws("a", 1.0)], "ab"], b"ab", 3]
)
def test_fuse_refuses_lists_that_are_not_lists_of_nodes(lists: Any) -> None:
    # [[1]], "abc" and [["a"]] raised a bare AttributeError
    with pytest.raises(TypeError, match=re.escape("lists must be")):
        fuse(lists)


def test_fuse_still_takes_tuples_and_empty_lists() -> None:
    a, b = _nws("a", 0.9), _nws("b", 0.5)
    assert [n.node.node_id for n in fuse(((a, b), [b]))] == ["b", "a"]
    assert fuse([]) == [] and fuse([[]]) == []
