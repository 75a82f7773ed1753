"""Cancellation that races a result: ``asyncio.wait_for`` on Python 3.10 and 3.11
returns the inner result when the task's cancellation arrives just after that result
is ready; a cancelled ``asearch`` whose worker had just answered still raises
``CancelledError``."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.indices.query.query_transform import HyDEQueryTransform
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llama_index_hyde_plus import HyDE, SQLiteCache, TransformRetriever
from llama_index_hyde_plus.calls.door import wait_woken, wake
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever


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
