from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.core.prompts import PromptTemplate

from llama_index_hyde_plus import (
    Condense,
    HyDE,
    MemoryCache,
    TransformRetriever,
    chat_history,
)
from llama_index_hyde_plus.testing import HANG, ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.registry import make_transform

FOLLOW_UP = "and for the enterprise plan?"
STANDALONE = "What does the enterprise plan cost?"
HISTORY = [
    {"role": "user", "content": "How much is the pro plan?"},
    {"role": "assistant", "content": "The pro plan costs 20 dollars a month."},
]
DOCS = {
    "pro": "The pro plan costs 20 dollars a month.",
    "ent": "The enterprise plan costs 90 dollars a month.",
    "misc": "Our office is in Lisbon.",
}


def knows_pricing(prompt: str) -> str:
    """Condenses correctly only when the conversation reached the prompt."""
    return STANDALONE if "pro plan" in prompt else "enterprise plan"


async def run(condense: Condense, use_async: bool, **kwargs: Any) -> Any:
    if use_async:
        return await condense.atransform(FOLLOW_UP, **kwargs)
    return condense.transform(FOLLOW_UP, **kwargs)


def calls(llm: ScriptedLLM) -> int:
    return llm.sync_calls + llm.async_calls


@pytest.mark.parametrize("use_async", [False, True])
async def test_the_history_reaches_the_prompt_and_the_condensed_question_is_searched(
    use_async: bool,
) -> None:
    llm = ScriptedLLM(respond=knows_pricing)
    result = await run(Condense(llm), use_async, chat_history=HISTORY)
    assert result.queries == (STANDALONE,) and not result.fallback
    assert "User: How much is the pro plan?" in llm.prompts[0]
    assert "Assistant: The pro plan costs 20 dollars a month." in llm.prompts[0]
    assert result.search_queries == (FOLLOW_UP, STANDALONE)  # the message as written too
    assert result.usage.calls == 1


@pytest.mark.parametrize("use_async", [False, True])
async def test_without_history_no_call_is_made_and_nothing_is_spent(use_async: bool) -> None:
    llm = ScriptedLLM()  # any call raises: no reply scripted
    for history in (None, [], [{"role": "assistant", "content": "  "}]):
        result = await run(Condense(llm), use_async, chat_history=history)
        assert result.search_queries == (FOLLOW_UP,) and result.skipped
        assert result.usage.calls == 0 and result.usage.total_tokens == 0
        assert not result.fallback
    assert calls(llm) == 0


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_message_that_stands_alone_makes_no_call(use_async: bool) -> None:
    llm = ScriptedLLM(respond=knows_pricing)
    condense = Condense(llm, standalone_words=5)
    message = "What does the enterprise plan cost per month?"
    result = (
        await condense.atransform(message, chat_history=HISTORY)
        if use_async
        else condense.transform(message, chat_history=HISTORY)
    )
    assert result.skipped and "stands alone" in result.skipped and calls(llm) == 0
    assert condense.stands_alone(message)
    assert not condense.stands_alone("What does it cost per month for us?")  # refers back
    assert not condense.stands_alone("enterprise plan?")  # too short
    assert not Condense(llm, standalone_words=None).stands_alone(message)


def chat_memory_buffer() -> ChatMemoryBuffer:
    memory = ChatMemoryBuffer.from_defaults(token_limit=2000)
    for item in HISTORY:
        memory.put(ChatMessage(role=MessageRole(item["role"]), content=item["content"]))
    return memory


def new_memory() -> Memory:
    memory = Memory.from_defaults(session_id="test", token_limit=2000)
    for item in HISTORY:
        memory.put(ChatMessage(role=MessageRole(item["role"]), content=item["content"]))
    return memory


@pytest.mark.parametrize("make_memory", [chat_memory_buffer, new_memory])
@pytest.mark.parametrize("use_async", [False, True])
async def test_the_conversation_is_read_from_a_llamaindex_memory(
    make_memory: Any, use_async: bool
) -> None:
    memory = make_memory()
    llm = ScriptedLLM(respond=knows_pricing)
    result = await run(Condense(llm, memory=memory), use_async)
    assert result.queries == (STANDALONE,) and "pro plan" in llm.prompts[0]
    # an agent stores the message before its tool searches: it is not history
    memory.put(ChatMessage(role=MessageRole.USER, content=FOLLOW_UP))
    await run(Condense(llm, memory=memory), use_async)
    assert llm.prompts[1].count(FOLLOW_UP) == 1


def test_per_call_history_wins_over_the_memory() -> None:
    memory = ChatMemoryBuffer.from_defaults()
    memory.put(ChatMessage(role=MessageRole.USER, content="Where is your office?"))
    llm = ScriptedLLM(respond=knows_pricing)
    condense = Condense(llm, memory=memory)
    with chat_history(HISTORY):
        assert condense.transform(FOLLOW_UP).queries == (STANDALONE,)
    assert "office" not in llm.prompts[0]
    condense.transform(FOLLOW_UP, chat_history=[{"role": "user", "content": "pro plan price?"}])
    assert "pro plan price?" in llm.prompts[1] and "office" not in llm.prompts[1]


def test_the_history_reaching_the_prompt_is_bounded() -> None:
    llm = ScriptedLLM(respond=knows_pricing)
    turns = [{"role": "user", "content": f"old question {i}"} for i in range(10)]
    Condense(llm, history_messages=2).transform(FOLLOW_UP, chat_history=[*turns, *HISTORY])
    assert "old question" not in llm.prompts[0] and "pro plan" in llm.prompts[0]
    long = [{"role": "user", "content": "x" * 5000}, *HISTORY]
    Condense(llm, history_characters=100).transform(FOLLOW_UP, chat_history=long)
    history = llm.prompts[1].split("Conversation:\n")[1].split("\n\nFollow-up")[0]
    assert len(history.replace("\n", "")) <= 100 and "x" * 200 not in history
    assert history.endswith(
        "User: How much is the pro plan?\nAssistant: The pro plan costs 20 dollars a month."
    )


def test_the_cache_key_holds_the_history() -> None:
    llm = ScriptedLLM(respond=knows_pricing)
    condense = Condense(llm, cache=MemoryCache())
    first = condense.transform(FOLLOW_UP, chat_history=HISTORY)
    again = condense.transform(FOLLOW_UP, chat_history=HISTORY)
    assert again.cached and again.queries == first.queries and calls(llm) == 1
    other = [{"role": "user", "content": "How much is the pro plan in euros?"}]
    condense.transform(FOLLOW_UP, chat_history=other)
    assert calls(llm) == 2  # another conversation: not served the first one's question


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_retriever_searches_the_message_and_the_condensed_question(
    use_async: bool,
) -> None:
    base = StaticRetriever(DOCS, results={STANDALONE: ["ent"], FOLLOW_UP: ["misc"]})
    retriever = TransformRetriever(base, Condense(ScriptedLLM(respond=knows_pricing)))
    with chat_history(HISTORY):
        found = await retriever.asearch(FOLLOW_UP) if use_async else retriever.search(FOLLOW_UP)
    assert {n.node.node_id for n in found.nodes} == {"ent", "misc"}
    assert set(base.queries) == {FOLLOW_UP, STANDALONE}


@pytest.mark.parametrize("use_async", [False, True])
async def test_condense_then_hyde_counts_each_call_once(use_async: bool) -> None:
    llm = ScriptedLLM(respond=lambda p: knows_pricing(p) if "Conversation" in p else "A plan.")
    chain = Condense(llm).then(HyDE(llm))
    base = StaticRetriever(DOCS, default=["ent"])
    retriever = TransformRetriever(base, chain)
    with chat_history(HISTORY):
        found = await retriever.asearch(FOLLOW_UP) if use_async else retriever.search(FOLLOW_UP)
    usage = found.transform.usage
    assert found.transform.method == "condense+hyde"
    assert usage.calls == calls(llm) == 3  # the condense, HyDE on the message and on its rewrite
    spent = sum(len(p.split()) for p in llm.prompts)
    assert usage.input_tokens == spent
    assert STANDALONE in [c.query for c in found.transform.children]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hung_llm_falls_back_to_the_message_within_the_timeout(use_async: bool) -> None:
    condense = Condense(ScriptedLLM([HANG]), timeout=0.2)
    result = await run(condense, use_async, chat_history=HISTORY)
    assert result.fallback and "LLMTimeoutError" in (result.error or "")
    assert result.search_queries == (FOLLOW_UP,)


async def test_cancelling_a_condense_cancels_its_call() -> None:
    llm = ScriptedLLM([HANG])
    task = asyncio.ensure_future(Condense(llm).atransform(FOLLOW_UP, chat_history=HISTORY))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert llm.async_calls == 1


class BrokenMemory(ChatMemoryBuffer):
    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        raise OSError("store down")

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        raise OSError("store down")


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_unreadable_memory_falls_back_to_the_message(use_async: bool) -> None:
    llm = ScriptedLLM()
    result = await run(Condense(llm, memory=BrokenMemory(token_limit=100)), use_async)
    assert result.fallback and "store down" in (result.error or "") and calls(llm) == 0
    assert result.search_queries == (FOLLOW_UP,)


class HungMemory(ChatMemoryBuffer):
    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        time.sleep(30)  # a store that never answers (the reading thread is a daemon)
        return []

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        await asyncio.sleep(3600)
        return []


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hung_memory_is_given_up_at_the_timeout(use_async: bool) -> None:
    llm = ScriptedLLM()
    condense = Condense(llm, memory=HungMemory(token_limit=100), timeout=0.3)
    start = time.perf_counter()
    result = await run(condense, use_async)
    assert time.perf_counter() - start < 5
    assert result.fallback and "memory unreadable" in (result.error or "") and calls(llm) == 0
    assert "did not answer within 0.3s" in (result.error or "")
    assert result.search_queries == (FOLLOW_UP,)


async def test_cancelling_while_the_memory_hangs_propagates() -> None:
    condense = Condense(ScriptedLLM(), memory=HungMemory(token_limit=100), timeout=60)
    task = asyncio.ensure_future(condense.atransform(FOLLOW_UP))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_bad_options_and_messages_are_refused_naming_the_field() -> None:
    llm = ScriptedLLM()
    with pytest.raises(TypeError, match="memory"):
        Condense(llm, memory=[])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="history_messages"):
        Condense(llm, history_messages=0)
    with pytest.raises(TypeError, match="history_characters"):
        Condense(llm, history_characters="9")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="standalone_words"):
        Condense(llm, standalone_words=0)
    with pytest.raises(ValueError, match=r"chat_history\[0\]\.role"):
        Condense(llm).transform(FOLLOW_UP, chat_history=[{"role": "system", "content": "x"}])
    with pytest.raises(TypeError, match=r"chat_history\[1\]\.content"):
        Condense(llm).transform(FOLLOW_UP, chat_history=[HISTORY[0], {"role": "user"}])
    with pytest.raises(TypeError, match="chat_history"):
        Condense(llm).transform(FOLLOW_UP, chat_history="How much?")  # type: ignore[arg-type]
    assert calls(llm) == 0


def test_the_prompt_is_swapped_with_update_prompts() -> None:
    llm = ScriptedLLM(respond=knows_pricing)
    condense = make_transform("condense", llm)
    assert isinstance(condense, Condense) and set(condense.get_prompts()) == {"condense_prompt"}
    condense.update_prompts(
        {"condense_prompt": PromptTemplate("Chat:\n{history}\nRewrite: {query}\nQuery:")}
    )
    condense.transform(FOLLOW_UP, chat_history=HISTORY)
    assert llm.prompts[0].startswith("Chat:\nUser: How much is the pro plan?")
    with pytest.raises(ValueError, match="placeholder"):
        condense.update_prompts({"condense_prompt": "{query} {turns}"})


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_context_chat_engine_condenses_with_its_own_memory(use_async: bool) -> None:
    from llama_index.core.chat_engine import ContextChatEngine

    memory = ChatMemoryBuffer.from_defaults(token_limit=3000)
    rewriter = ScriptedLLM(respond=knows_pricing)
    base = StaticRetriever(DOCS, results={STANDALONE: ["ent"]}, default=["misc"])
    engine = ContextChatEngine.from_defaults(
        retriever=TransformRetriever(base, Condense(rewriter, memory=memory)),
        memory=memory,
        llm=ScriptedLLM(respond=lambda p: "The pro plan costs 20 dollars a month."),
    )
    chat = engine.achat if use_async else engine.chat
    for message in ("How much is the pro plan?", FOLLOW_UP):
        reply = chat(message)
        if use_async:
            await reply  # type: ignore[misc]
    assert calls(rewriter) == 1  # the first message had no history
    assert "User: How much is the pro plan?" in rewriter.prompts[0]
    assert STANDALONE in base.queries


def test_the_rewriting_model_s_tokens_reach_a_token_counting_handler() -> None:
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    counter = TokenCountingHandler()
    llm = ScriptedLLM(respond=knows_pricing)
    condense = Condense(llm, callback_manager=CallbackManager([counter]))
    result = condense.transform(FOLLOW_UP, chat_history=HISTORY)
    assert counter.total_llm_token_count > 0
    assert len(counter.llm_token_counts) == result.usage.calls == 1


@pytest.mark.parametrize("use_async", [False, True])
async def test_condense_then_hyde_keeps_the_drift_guard_weight(use_async: bool) -> None:
    llm = ScriptedLLM(respond=lambda p: knows_pricing(p) if "Conversation" in p else "A plan.")
    chain = Condense(llm, original_weight=3.0, rrf_k=20).then(HyDE(llm))
    assert chain.rrf_k == 20
    with chat_history(HISTORY):
        result = await chain.atransform(FOLLOW_UP) if use_async else chain.transform(FOLLOW_UP)
    weights = {spec.query or spec.text: spec.weight for spec in result.searches()}
    assert result.original_weight == 3.0
    assert weights[FOLLOW_UP] == 3.0 and weights[STANDALONE] == 1.0


async def test_an_agent_run_searches_through_condense_and_counts_the_rewriter_s_tokens() -> None:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    from llama_index_hyde_plus.testing import agent_llm

    counter = TokenCountingHandler()
    callbacks = CallbackManager([counter])
    memory = Memory.from_defaults(session_id="agent-test", token_limit=4000)
    rewriter = ScriptedLLM(respond=lambda p: knows_pricing(p) if "Conversation" in p else "A plan.")
    base = StaticRetriever(DOCS, results={STANDALONE: ["ent"]}, default=["misc"])
    chain = Condense(rewriter, memory=memory, callback_manager=callbacks).then(
        HyDE(rewriter, callback_manager=callbacks)
    )
    retriever = TransformRetriever(base, chain)
    searched: list[str] = []

    async def search_docs(question: str) -> str:
        """Search the pricing documents."""
        searched.append(question)
        found = await retriever.asearch(question)
        return " ".join(n.node.node_id for n in found.nodes)

    agent = FunctionAgent(tools=[search_docs], llm=agent_llm())
    for message in ("How much is the pro plan?", FOLLOW_UP):
        await agent.run(message, memory=memory)
    assert searched == ["How much is the pro plan?", FOLLOW_UP]
    condensing = [p for p in rewriter.prompts if "Conversation" in p]
    assert len(condensing) == 1  # the first message had no history: no call
    assert "User: How much is the pro plan?" in condensing[0]
    assert any(STANDALONE in p for p in rewriter.prompts)  # HyDE on the standalone question
    # every call of the rewriting model, and only those, in the run's token counter
    assert len(counter.llm_token_counts) == calls(rewriter) == 4
    assert counter.total_llm_token_count > 0
