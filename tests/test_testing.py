from __future__ import annotations

import asyncio

import pytest

from llama_index_hyde_plus.testing import (
    HANG,
    DeterministicEmbedding,
    ScriptedLLM,
    StaticRetriever,
    SyncCallError,
    echo_llm,
)
from llama_index_hyde_plus.transforms.prompts import CONDENSE_PROMPT


def test_scripted_llm_replies_in_order_and_records() -> None:
    llm = ScriptedLLM(["one", ValueError("two"), lambda p: p.upper()])
    assert llm.complete("a").text == "one"
    with pytest.raises(ValueError):
        llm.complete("b")
    assert llm.complete("c").text == "C"
    assert llm.prompts == ["a", "b", "c"] and llm.sync_calls == 3
    with pytest.raises(RuntimeError, match=r"no reply left for this prompt.*'d'"):
        llm.complete("d")
    with pytest.raises(RuntimeError, match=r"respond=\): 'x{300}\.\.\.'$"):
        llm.complete("x" * 5000)  # says what it was asked, shortened


def test_scripted_llm_reports_usage_and_can_forbid_sync() -> None:
    response = ScriptedLLM(["three word reply"]).complete("two words")
    assert response.raw["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    with pytest.raises(SyncCallError):
        ScriptedLLM(["x"], forbid_sync=True).complete("p")


async def test_hang_waits_until_cancelled() -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(ScriptedLLM([HANG]).acomplete("p"), 0.05)


def test_echo_llm_keeps_no_history() -> None:
    llm = echo_llm()
    text = llm.complete("Question: why?\nPassage:").text
    assert text.startswith("1. why? explained") and llm.prompts == []


def test_echo_llm_answers_a_chat_engine_about_the_users_message() -> None:
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.chat_engine import ContextChatEngine

    embed = DeterministicEmbedding()
    index = VectorStoreIndex.from_documents(
        [Document(text="The pro plan costs 20 dollars.")], embed_model=embed
    )
    engine = ContextChatEngine.from_defaults(
        retriever=index.as_retriever(similarity_top_k=1), llm=echo_llm()
    )
    reply = str(engine.chat("How much is the pro plan?"))
    assert reply.startswith("1. How much is the pro plan? explained"), reply
    again = str(engine.chat("and the enterprise plan?"))  # history before it
    assert again.startswith("1. and the enterprise plan? explained"), again


@pytest.mark.parametrize(
    ("prompt", "question"),
    [
        (CONDENSE_PROMPT.format(history="User: Hi", query="and for it?"), "and for it?"),
        (
            "Please write a passage to answer the question\nTry to include as many key "
            'details as possible.\n\n\nWhy did revenue drop?\n\n\nPassage:"""\n',
            "Why did revenue drop?",
        ),
        ("Context: a\nQuery: Why did revenue drop?\nAnswer: ", "Why did revenue drop?"),
        ("Write a counter argument.\nPassage: cats are best\nCounter Argument:", "cats are best"),
    ],
    ids=["condense", "core-hyde", "answer", "labelled-passage"],
)
def test_echo_llm_finds_the_question_of_the_prompts_the_docs_send(
    prompt: str, question: str
) -> None:
    assert echo_llm().complete(prompt).text.startswith(f"1. {question} explained\n")


def test_echo_llm_raises_saying_what_it_was_asked_when_the_prompt_holds_no_question() -> None:
    with pytest.raises(ValueError, match=r"found no question in the prompt.*'Answer:\\n'"):
        echo_llm().complete("Answer:\n")
    with pytest.raises(ValueError, match="found no question"):
        echo_llm().complete("system: be brief\nassistant: ")  # a chat with no user message


def test_deterministic_embedding_is_meaningful() -> None:
    emb = DeterministicEmbedding(dim=128)
    a, b, c = (emb.vector(t) for t in ("renewals slipped", "the renewals slipped again", "laptops"))
    dot = lambda x, y: sum(i * j for i, j in zip(x, y))  # noqa: E731
    assert dot(a, b) > 0.5 > abs(dot(a, c))
    assert emb.vector("renewals slipped") == a


def test_static_retriever_records_queries_and_fails_on_demand() -> None:
    r = StaticRetriever({"a": "A", "b": "B"}, results={"q": ["b", "a"]}, fail_on=["bad"])
    assert [n.node.node_id for n in r.retrieve("q")] == ["b", "a"]
    with pytest.raises(RuntimeError):
        r.retrieve("bad")
    assert r.queries == ["q", "bad"]
