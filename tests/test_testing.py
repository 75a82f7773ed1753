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
