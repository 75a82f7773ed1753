"""Contract tests: `TransformRetriever` and this package's transforms work
in each LlamaIndex 0.14 surface docs/from-core.md and docs/quickstart.md name.

Each test asserts the surface returns the expected nodes or answer, that the transform
really ran, that the answer prompt saw the ORIGINAL question (never the generated
passage), and on async paths that the rewriting LLM made no blocking call.

The question "Why did revenue decline?" alone finds the "lunch" document first (it is the
only one saying "revenue"); the HyDE passage finds "renewals" first. So "renewals" at
the top of the results shows the passage, not the question, was searched.
"""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.agent.workflow import AgentOutput, ReActAgent
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.chat_engine import CondensePlusContextChatEngine, ContextChatEngine
from llama_index.core.indices.query.query_transform.base import HyDEQueryTransform
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine, TransformQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever, RecursiveRetriever
from llama_index.core.schema import IndexNode, NodeWithScore, TextNode
from llama_index.core.tools import QueryEngineTool, RetrieverTool

from llama_index_hyde_plus import HyDE, TransformRetriever, transform_of
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue decline?"
PASSAGE = "Enterprise renewals slipped last quarter: large accounts delayed signing contracts."
"""The HyDE passage; no document holds this exact text, so finding it in a prompt means
the passage leaked into the answer."""
ANSWER = "Renewals slipped."
HYDE_MARK = "Please write a passage to answer the question"
"""The start of this package's HyDE prompt."""


def _rewriter(*, forbid_sync: bool = False) -> ScriptedLLM:
    """The LLM that writes the HyDE passage (``forbid_sync`` proves an async path)."""
    return ScriptedLLM(respond=lambda prompt: PASSAGE, forbid_sync=forbid_sync)


def _answerer() -> ScriptedLLM:
    return ScriptedLLM(respond=lambda prompt: ANSWER)


def _ids(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.node_id for n in nodes]


def _ours(index: VectorStoreIndex, rewriter: ScriptedLLM, top_k: int = 2) -> TransformRetriever:
    return TransformRetriever(index.as_retriever(similarity_top_k=top_k), HyDE(rewriter))


def _assert_rewrote(rewriter: ScriptedLLM, question: str = Q, calls: int = 1) -> None:
    """The rewriter wrote ``calls`` HyDE passages for ``question``; none blocked when it
    forbids blocking calls (a blocking call would have raised and fallen back)."""
    assert len(rewriter.prompts) == calls
    assert all(HYDE_MARK in p and question in p for p in rewriter.prompts)
    if rewriter.forbid_sync:
        assert rewriter.sync_calls == 0


def _assert_answered_the_question(answerer: ScriptedLLM) -> None:
    """The answer prompt held the original question and the found document, never the
    generated passage."""
    prompt = answerer.prompts[-1]
    assert Q in prompt and DOCS["renewals"] in prompt
    assert PASSAGE not in prompt and HYDE_MARK not in prompt


def _assert_hyde_summary(carrier: Any) -> None:
    info = transform_of(carrier)
    assert info is not None
    assert info["method"] == "hyde" and not info["fallback"]
    assert info["hypothetical"] == [PASSAGE]


def test_the_question_alone_finds_another_document_first(
    faiss_index: VectorStoreIndex,
) -> None:
    """The premise of every test here: without the rewrite, "renewals" is not first."""
    assert _ids(faiss_index.as_retriever(similarity_top_k=2).retrieve(Q))[0] != "renewals"


# -- 1. retrieve / aretrieve ------------------------------------------------------------
def test_retrieve_searches_the_passage_and_carries_the_transform(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter = _rewriter()
    nodes = _ours(faiss_index, rewriter).retrieve(Q)
    assert _ids(nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(nodes)


async def test_aretrieve_rewrites_without_blocking(faiss_index: VectorStoreIndex) -> None:
    rewriter = _rewriter(forbid_sync=True)
    nodes = await _ours(faiss_index, rewriter).aretrieve(Q)
    assert _ids(nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(nodes)


# -- 2. RetrieverQueryEngine ------------------------------------------------------------
def test_retriever_query_engine_query_answers_the_question(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter, answerer = _rewriter(), _answerer()
    engine = RetrieverQueryEngine.from_args(_ours(faiss_index, rewriter), llm=answerer)
    response = engine.query(Q)
    assert str(response) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


async def test_retriever_query_engine_aquery_rewrites_without_blocking(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter, answerer = _rewriter(forbid_sync=True), _answerer()
    engine = RetrieverQueryEngine.from_args(_ours(faiss_index, rewriter), llm=answerer)
    response = await engine.aquery(Q)
    assert str(response) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)
    assert answerer.sync_calls == 0  # the synthesizer's acomplete, not complete


def test_retriever_query_engine_streaming_streams_the_answer(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter, answerer = _rewriter(), _answerer()
    engine = RetrieverQueryEngine.from_args(
        _ours(faiss_index, rewriter), llm=answerer, streaming=True
    )
    response = engine.query(Q)
    assert isinstance(response, StreamingResponse)
    assert "".join(response.response_gen) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


async def test_retriever_query_engine_async_streaming_rewrites_without_blocking(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter, answerer = _rewriter(forbid_sync=True), _answerer()
    engine = RetrieverQueryEngine.from_args(
        _ours(faiss_index, rewriter), llm=answerer, streaming=True
    )
    response = await engine.aquery(Q)
    assert isinstance(response, AsyncStreamingResponse)
    text = "".join([t async for t in response.async_response_gen()])
    assert text == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


# -- 3. core's TransformQueryEngine ---------------------------------------------------
def test_core_transform_query_engine_runs_our_hyde(faiss_index: VectorStoreIndex) -> None:
    rewriter, answerer = _rewriter(), _answerer()
    engine = TransformQueryEngine(
        faiss_index.as_query_engine(llm=answerer, similarity_top_k=2), HyDE(rewriter)
    )
    response = engine.query(Q)
    assert str(response) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"  # the passage's embedding searched
    _assert_rewrote(rewriter)
    _assert_answered_the_question(answerer)


async def test_core_transform_query_engine_aquery_rewrites_synchronously(
    faiss_index: VectorStoreIndex,
) -> None:
    # Core's TransformQueryEngine._aquery calls the transform's blocking ``run`` (core's
    # design, docs/from-core.md): the rewrite is one blocking LLM call on the event loop.
    # RetrieverQueryEngine over a TransformRetriever is the non-blocking pattern (above).
    rewriter, answerer = _rewriter(), _answerer()
    engine = TransformQueryEngine(
        faiss_index.as_query_engine(llm=answerer, similarity_top_k=2), HyDE(rewriter)
    )
    response = await engine.aquery(Q)
    assert str(response) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    assert (rewriter.sync_calls, rewriter.async_calls) == (1, 0)  # core's blocking call
    _assert_answered_the_question(answerer)


# -- 4. chat engines --------------------------------------------------------------------
CHAT_ENGINES: dict[str, type[CondensePlusContextChatEngine] | type[ContextChatEngine]] = {
    "condense_plus_context": CondensePlusContextChatEngine,
    "context": ContextChatEngine,
}


def _chat_engine(kind: str, retriever: TransformRetriever, llm: ScriptedLLM) -> Any:
    return CHAT_ENGINES[kind].from_defaults(retriever, llm=llm)


@pytest.mark.parametrize("kind", CHAT_ENGINES)
def test_chat_engine_chat_answers_from_the_passages_hits(
    faiss_index: VectorStoreIndex, kind: str
) -> None:
    rewriter, answerer = _rewriter(), _answerer()
    response = _chat_engine(kind, _ours(faiss_index, rewriter), answerer).chat(Q)
    assert response.response == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


@pytest.mark.parametrize("kind", CHAT_ENGINES)
def test_chat_engine_stream_chat_streams_the_answer(
    faiss_index: VectorStoreIndex, kind: str
) -> None:
    rewriter, answerer = _rewriter(), _answerer()
    response = _chat_engine(kind, _ours(faiss_index, rewriter), answerer).stream_chat(Q)
    assert "".join(response.response_gen) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


@pytest.mark.parametrize("kind", CHAT_ENGINES)
async def test_chat_engine_achat_rewrites_without_blocking(
    faiss_index: VectorStoreIndex, kind: str
) -> None:
    rewriter, answerer = _rewriter(forbid_sync=True), _answerer()
    response = await _chat_engine(kind, _ours(faiss_index, rewriter), answerer).achat(Q)
    assert response.response == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


@pytest.mark.parametrize("kind", CHAT_ENGINES)
async def test_chat_engine_astream_chat_rewrites_without_blocking(
    faiss_index: VectorStoreIndex, kind: str
) -> None:
    rewriter, answerer = _rewriter(forbid_sync=True), _answerer()
    engine = _chat_engine(kind, _ours(faiss_index, rewriter), answerer)
    response = await engine.astream_chat(Q)
    assert "".join([t async for t in response.async_response_gen()]) == ANSWER
    assert _ids(response.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(response)
    _assert_answered_the_question(answerer)


# -- 5. tools and an agent --------------------------------------------------------------
def test_retriever_tool_call_returns_the_passages_hits(faiss_index: VectorStoreIndex) -> None:
    rewriter = _rewriter()
    output = RetrieverTool.from_defaults(_ours(faiss_index, rewriter)).call(Q)
    assert _ids(output.raw_output)[0] == "renewals"
    assert DOCS["renewals"] in output.content and PASSAGE not in output.content
    _assert_rewrote(rewriter)
    _assert_hyde_summary(output.raw_output)


async def test_retriever_tool_acall_rewrites_without_blocking(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter = _rewriter(forbid_sync=True)
    output = await RetrieverTool.from_defaults(_ours(faiss_index, rewriter)).acall(Q)
    assert _ids(output.raw_output)[0] == "renewals"
    assert DOCS["renewals"] in output.content and PASSAGE not in output.content
    _assert_rewrote(rewriter)
    _assert_hyde_summary(output.raw_output)


def _handbook_tool(retriever: TransformRetriever, answerer: ScriptedLLM) -> QueryEngineTool:
    return QueryEngineTool.from_defaults(
        RetrieverQueryEngine.from_args(retriever, llm=answerer),
        name="handbook",
        description="Answers questions about the company handbook.",
    )


def test_query_engine_tool_call_answers_the_question(faiss_index: VectorStoreIndex) -> None:
    rewriter, answerer = _rewriter(), _answerer()
    output = _handbook_tool(_ours(faiss_index, rewriter), answerer).call(Q)
    assert output.content == ANSWER
    assert _ids(output.raw_output.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(output.raw_output)
    _assert_answered_the_question(answerer)


async def test_query_engine_tool_acall_rewrites_without_blocking(
    faiss_index: VectorStoreIndex,
) -> None:
    rewriter, answerer = _rewriter(forbid_sync=True), _answerer()
    output = await _handbook_tool(_ours(faiss_index, rewriter), answerer).acall(Q)
    assert output.content == ANSWER
    assert _ids(output.raw_output.source_nodes)[0] == "renewals"
    _assert_rewrote(rewriter)
    _assert_hyde_summary(output.raw_output)
    _assert_answered_the_question(answerer)


FINAL = "Revenue dropped because renewals slipped."


def _react_step(prompt: str) -> str:
    """A ReAct agent's script: call the handbook tool, then answer from its observation."""
    if ANSWER in prompt:  # the tool's answer came back as an observation
        return f"Thought: I can answer without using any more tools.\nAnswer: {FINAL}"
    return f'Thought: I need the handbook.\nAction: handbook\nAction Input: {{"input": "{Q}"}}'


async def test_a_react_agent_calls_the_query_engine_tool(faiss_index: VectorStoreIndex) -> None:
    rewriter, answerer = _rewriter(forbid_sync=True), _answerer()
    agent_llm = ScriptedLLM(respond=_react_step)
    agent = ReActAgent(
        tools=[_handbook_tool(_ours(faiss_index, rewriter), answerer)], llm=agent_llm
    )
    result: Any = await agent.run(user_msg=Q)
    assert isinstance(result, AgentOutput)
    assert str(result.response.content) == FINAL
    calls: list[Any] = list(result.tool_calls)  # ToolCallResults, though typed otherwise
    (call,) = calls
    assert call.tool_name == "handbook" and call.tool_output.content == ANSWER
    _assert_hyde_summary(call.tool_output.raw_output)
    _assert_rewrote(rewriter)  # the agent acalls the tool: the rewrite never blocked
    _assert_answered_the_question(answerer)
    assert ANSWER in agent_llm.prompts[-1]  # the observation reached the agent


# -- 6. QueryFusionRetriever ------------------------------------------------------------
def _fusion(ours: TransformRetriever, plain: StaticRetriever, use_async: bool) -> Any:
    # num_queries=1: the fusion retriever generates no queries, so its LLM (no replies
    # scripted) is never called
    return QueryFusionRetriever(
        [ours, plain], llm=ScriptedLLM(), use_async=use_async, num_queries=1, similarity_top_k=3
    )


@pytest.mark.parametrize("use_async", [False, True])
def test_query_fusion_retriever_fuses_ours_with_a_plain_retriever(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    # use_async=True runs each retriever's aretrieve (in a loop of its own): the
    # rewriter then must not block
    rewriter = _rewriter(forbid_sync=use_async)
    plain = StaticRetriever(DOCS, default=["pto"])
    nodes = _fusion(_ours(faiss_index, rewriter), plain, use_async).retrieve(Q)
    assert set(_ids(nodes)) >= {"renewals", "pto"}
    assert plain.queries == [Q]  # the plain retriever got the question as asked
    _assert_rewrote(rewriter)
    _assert_hyde_summary(nodes)


@pytest.mark.parametrize("use_async", [False, True])
async def test_query_fusion_aretrieve_rewrites_without_blocking(
    faiss_index: VectorStoreIndex, use_async: bool
) -> None:
    rewriter = _rewriter(forbid_sync=True)
    plain = StaticRetriever(DOCS, default=["pto"])
    nodes = await _fusion(_ours(faiss_index, rewriter), plain, use_async).aretrieve(Q)
    assert set(_ids(nodes)) >= {"renewals", "pto"}
    _assert_rewrote(rewriter)
    _assert_hyde_summary(nodes)


def test_query_fusion_keeps_a_node_both_retrievers_found_once(
    faiss_index: VectorStoreIndex,
) -> None:
    # QueryFusionRetriever dedups by node.hash: the provenance copy of our first node
    # must not count as another node
    plain = StaticRetriever(DOCS, default=["renewals", "pto"])
    nodes = _fusion(_ours(faiss_index, _rewriter()), plain, use_async=False).retrieve(Q)
    assert _ids(nodes).count("renewals") == 1


# -- 7. RecursiveRetriever ---------------------------------------------------------------
def _linked_index(embed_model: DeterministicEmbedding) -> VectorStoreIndex:
    """An in-memory index whose renewals entry is an IndexNode pointing to "accounts"."""
    link = IndexNode(id_="link", text=DOCS["renewals"], index_id="accounts")
    other = [TextNode(id_=nid, text=DOCS[nid]) for nid in ("lunch", "pto")]
    return VectorStoreIndex([link, *other], embed_model=embed_model)


def _recursive(
    embed_model: DeterministicEmbedding, rewriter: ScriptedLLM, accounts: StaticRetriever
) -> RecursiveRetriever:
    root = TransformRetriever(
        _linked_index(embed_model).as_retriever(similarity_top_k=1), HyDE(rewriter)
    )
    return RecursiveRetriever("root", retriever_dict={"root": root, "accounts": accounts})


def _accounts() -> StaticRetriever:
    return StaticRetriever(DOCS, default=["renewals", "pricing"])


def test_recursive_retriever_follows_the_link_our_root_found(
    embed_model: DeterministicEmbedding,
) -> None:
    rewriter, accounts = _rewriter(), _accounts()
    nodes = _recursive(embed_model, rewriter, accounts).retrieve(Q)
    assert _ids(nodes) == ["renewals", "pricing"]  # the linked retriever's nodes
    assert accounts.queries == [Q]  # it was asked the original question
    _assert_rewrote(rewriter)


async def test_recursive_retriever_aretrieve_runs_our_root_synchronously(
    embed_model: DeterministicEmbedding,
) -> None:
    # Core's RecursiveRetriever has no async path: its aretrieve is BaseRetriever's
    # default, which calls the blocking _retrieve, so our root runs its sync search (one
    # blocking rewrite on the loop). Ours adds no blocking call of its own.
    rewriter, accounts = _rewriter(), _accounts()
    nodes = await _recursive(embed_model, rewriter, accounts).aretrieve(Q)
    assert _ids(nodes) == ["renewals", "pricing"]
    assert accounts.queries == [Q]
    _assert_rewrote(rewriter)
    assert (rewriter.sync_calls, rewriter.async_calls) == (1, 0)


# -- 8. core's TransformRetriever keywords and prompt keys ------------------------------


def test_core_keywords_take_a_core_hyde_transform(faiss_index: VectorStoreIndex) -> None:
    rewriter = _rewriter()
    ours = TransformRetriever(
        retriever=faiss_index.as_retriever(similarity_top_k=2),
        query_transform=HyDEQueryTransform(llm=rewriter),
    )
    nodes = ours.retrieve(Q)
    assert _ids(nodes)[0] == "renewals"
    (prompt,) = rewriter.prompts
    assert Q in prompt  # core's own HyDE prompt ran
    info = transform_of(nodes)
    assert info is not None and info["method"] == "HyDEQueryTransform"
    assert info["hypothetical"] == [PASSAGE]


def test_core_prompt_key_updates_a_core_hyde_prompt(faiss_index: VectorStoreIndex) -> None:
    rewriter = _rewriter()
    ours = TransformRetriever(
        retriever=faiss_index.as_retriever(similarity_top_k=2),
        query_transform=HyDEQueryTransform(llm=rewriter),
    )
    ours.update_prompts(
        {"query_transform:hyde_prompt": PromptTemplate("CUSTOM CORE: {context_str}\nPassage:")}
    )
    assert _ids(ours.retrieve(Q))[0] == "renewals"
    assert rewriter.prompts == [f"CUSTOM CORE: {Q}\nPassage:"]


async def test_core_prompt_key_updates_our_hyde_prompt(faiss_index: VectorStoreIndex) -> None:
    rewriter = _rewriter(forbid_sync=True)
    ours = _ours(faiss_index, rewriter)
    ours.update_prompts(
        {"query_transform:hyde_prompt": PromptTemplate("CUSTOM OURS: {query}\nPassage:")}
    )
    assert _ids(await ours.aretrieve(Q))[0] == "renewals"
    assert rewriter.prompts == [f"CUSTOM OURS: {Q}\nPassage:"]
    assert rewriter.sync_calls == 0
