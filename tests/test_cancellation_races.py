"""Cancellation that races a result: ``asyncio.wait_for`` on Python 3.10 and 3.11
returns the inner result when the task's cancellation arrives just after that result
is ready; a cancelled ``asearch`` whose worker had just answered still raises
``CancelledError``. A search cancelled at any of its awaits raises it and leaves no
task, no search and no step running."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Generator
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.indices.query.query_transform import HyDEQueryTransform
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llama_index_hyde_plus import HyDE, MultiQuery, SQLiteCache, TransformRetriever
from llama_index_hyde_plus.calls.door import wait_woken, wake
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.search import steps
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

from .conftest import DOCS, P1, Q


async def test_a_cancel_that_lands_as_the_worker_answers_is_raised() -> None:
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    task = asyncio.create_task(wait_woken(woken, 5.0))
    await asyncio.sleep(0)  # the task waits on the future
    wake(woken)  # the worker answers ...
    task.cancel()  # ... and the app cancels, in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_waiting_for_a_worker_times_out_or_waits_without_a_bound() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    with pytest.raises(asyncio.TimeoutError):
        await wait_woken(never, 0.01)
    later: asyncio.Future[None] = loop.create_future()
    loop.call_later(0.02, wake, later)
    await wait_woken(later, None)
    assert later.done()


class _SyncOnly(BaseRetriever):
    """A remote store's client with no async search."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        time.sleep(0.002)
        return [NodeWithScore(node=TextNode(id_="a", text="Renewals slipped."), score=1.0)]


def _retriever(kind: str, tmp_path: object) -> TransformRetriever:
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.", record=False)
    static = StaticRetriever({"a": "Renewals slipped."}, default=["a"])
    if kind == "blocking retriever":
        return TransformRetriever(_SyncOnly(), HyDE(llm, retry=NO_RETRY), search_type="keyword")
    if kind == "core transform":
        return TransformRetriever(static, HyDEQueryTransform(llm=llm))
    cache = SQLiteCache(f"{tmp_path}/cache.sqlite")
    return TransformRetriever(static, HyDE(llm, retry=NO_RETRY, cache=cache))


@pytest.mark.parametrize("kind", ["blocking retriever", "core transform", "sqlite cache"])
async def test_a_cancelled_search_never_returns_a_result(kind: str, tmp_path: object) -> None:
    """300 searches, about one in six cancelled at a random moment: each search whose
    ``cancel()`` was accepted raises `CancelledError` (before: 19 of 82, up to 108 of
    109, and 1-2 of 40 returned a result)."""
    retriever = _retriever(kind, tmp_path)
    loop = asyncio.get_running_loop()
    rnd = random.Random(0)
    tasks = [
        asyncio.ensure_future(retriever.asearch(f"Why did revenue drop {i % 20}?"))
        for i in range(300)
    ]
    told: set[asyncio.Future[object]] = set()

    def cancel(task: asyncio.Future[object]) -> None:
        if task.cancel():
            told.add(task)

    for task in tasks:
        if rnd.random() < 0.2:
            loop.call_later(rnd.random() * 0.3, cancel, task)
    out = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    swallowed = [o for t, o in zip(tasks, out) if t in told and not isinstance(o, BaseException)]
    assert told and not swallowed
    assert all(o.nodes for t, o in zip(tasks, out) if t not in told)  # type: ignore[union-attr]


# -- a cancel at every await -----------------------------------------------------------
TURNS = 3
"""How many turns of the event loop each fake below gives away before it answers."""


async def _turns() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


class _TurnsLLM(ScriptedLLM):
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        await _turns()
        return await super().acomplete(prompt, formatted=formatted, **kwargs)


class _TurnsEmbedding(DeterministicEmbedding):
    """Fails on the passage ``P1`` when ``fail`` (a fallback to the question's search)."""

    fail: bool = False

    async def _aget_query_embedding(self, query: str) -> list[float]:
        await _turns()
        return await super()._aget_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        await _turns()
        if self.fail and text == P1:
            raise ConnectionError("embedder down")
        return await super()._aget_text_embedding(text)


class _TurnsStore(StaticRetriever):
    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self._enter(query_bundle)
        try:
            await _turns()
            return self._answer(query_bundle)
        finally:
            self._exit()


class _TurnsReranker(BaseNodePostprocessor):
    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        return nodes[::-1]

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        await _turns()
        return nodes[::-1]


def _turning(kind: str) -> TransformRetriever:
    store = _TurnsStore(DOCS, default=["renewals", "pto", "hiring"])
    llm = _TurnsLLM(respond=lambda prompt: P1)
    embed = _TurnsEmbedding(dim=64, fail=kind == "fallback")
    if kind == "question beside the LLM":  # the question searched while the LLM writes
        return TransformRetriever(store, HyDE(llm, strategy="rerank"), embed_model=embed)
    if kind == "fan-out and reranker":
        lists = _TurnsLLM(respond=lambda prompt: "1. renewals slipped\n2. revenue fell")
        transform = MultiQuery(lists, n=2, retry=NO_RETRY)
        return TransformRetriever(store, transform, embed_model=embed, reranker=_TurnsReranker())
    return TransformRetriever(store, HyDE(llm, retry=NO_RETRY), embed_model=embed)


@pytest.mark.parametrize("kind", ["question beside the LLM", "fan-out and reranker", "fallback"])
async def test_a_search_cancelled_at_any_await_raises_and_leaves_nothing_running(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search cancelled after 0, 1, ... turns of the event loop, until it is done:
    each cancel lands at another await (the LLM, an embedding, a search, the reranker,
    the question's own search running beside the LLM, the fallback). Each raises
    `CancelledError`; no task, no search and no step is left running, and nothing is
    reported to the loop (no "Task exception was never retrieved")."""
    made: list[Generator[Any, Any, Any]] = []

    def recorded(make: Any) -> Any:
        def make_and_record(*args: Any) -> Any:
            made.append(make(*args))
            return made[-1]

        return make_and_record

    monkeypatch.setattr(steps, "search", recorded(steps.search))
    monkeypatch.setattr(steps, "question_hits", recorded(steps.question_hits))
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        whole = asyncio.ensure_future(_turning(kind).asearch(Q))
        turns = 0
        while not whole.done():
            await asyncio.sleep(0)
            turns += 1
        found = whole.result()
        assert found.nodes and found.transform.fallback == (kind == "fallback")
        for turn in range(turns):
            retriever = _turning(kind)
            before = asyncio.all_tasks()
            made.clear()
            task = asyncio.ensure_future(retriever.asearch(Q))
            for _ in range(turn):
                await asyncio.sleep(0)
            assert task.cancel(), turn
            with pytest.raises(asyncio.CancelledError):
                await task
            left = asyncio.all_tasks() - before  # the cancelled calls, ending
            if left:
                await asyncio.wait(left, timeout=5.0)
            assert all(t.done() for t in left), turn
            assert retriever.retriever.active == 0, turn  # type: ignore[attr-defined]
            assert made or turn == 0  # cancelled before it started: no step made
            assert all(g.gi_frame is None for g in made), turn  # every step closed
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert reported == []
