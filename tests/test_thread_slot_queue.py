"""The worker threads: the process's line for thread slots."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from llama_index_hyde_plus.calls import workers as _workers


def test_a_long_line_for_slots_behind_a_full_pool_never_deepens_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1,500 calls waiting for a slot behind a full pool: each freed slot goes to the
    # next in a loop (no recursion), they all run in order, and every slot comes back
    cap = _workers.Cap(2)
    monkeypatch.setitem(_workers.CAPS, "llm", cap)
    release = threading.Event()
    hogs = _workers.DaemonWorkers(max_busy=2, name="hog")
    held = [hogs.submit(lambda: release.wait(30)) for _ in range(2)]
    pool = _workers.DaemonWorkers(max_busy=1, name="p")
    jobs = [pool.submit(lambda i=i: i) for i in range(1500)]
    assert cap.waiting() == 1500
    release.set()
    deadline = time.monotonic() + 60
    for job in held + jobs:
        assert job.done.wait(max(0.0, deadline - time.monotonic()))
    assert [job.result() for job in jobs] == list(range(1500))
    time.sleep(0.2)
    assert not cap.holders and cap.waiting() == 0


# -- single-flight: a slow cache write and a cancelled leader -----
def test_waiters_have_the_leaders_value_before_its_cache_write_ends() -> None:
    from llama_index_hyde_plus.calls.singleflight import SingleFlight

    flights: SingleFlight[str] = SingleFlight()
    writing, calls, got = threading.Event(), [], []

    def work(budget: float | None) -> str:
        calls.append(1)
        time.sleep(0.2)
        return "passage"

    def slow_write(value: str) -> None:
        writing.set()
        time.sleep(1.5)  # a slow store, within the cache's own bound

    def waiter() -> None:
        got.append(flights.run("k", work, timeout=1.0))

    leader = threading.Thread(target=lambda: flights.run("k", work, 1.0, after=slow_write))
    leader.start()
    time.sleep(0.05)
    early = [threading.Thread(target=waiter) for _ in range(4)]
    for t in early:
        t.start()
    assert writing.wait(5)
    late = threading.Thread(target=waiter)  # comes while the value is being written
    late.start()
    for t in [*early, late]:
        t.join(5)
    leader.join(5)
    assert got == [("passage", True)] * 5 and len(calls) == 1  # none timed out at 1 s


async def test_an_async_waiter_has_the_value_before_the_write_ends() -> None:
    import asyncio

    from llama_index_hyde_plus.calls.singleflight import SingleFlight

    flights: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work(budget: float | None) -> str:
        calls.append(1)
        await asyncio.sleep(0.2)
        return "passage"

    async def slow_write(value: str) -> None:
        await asyncio.sleep(1.5)

    leader = asyncio.ensure_future(flights.arun("k", work, 1.0, after=slow_write))
    await asyncio.sleep(0.05)
    waiters = [flights.arun("k", work, 1.0) for _ in range(4)]
    assert await asyncio.gather(*waiters) == [("passage", True)] * 4
    await asyncio.sleep(0.2)  # the leader still writes: a newcomer is handed the value
    assert await flights.arun("k", work, 1.0) == ("passage", True)
    assert await leader == ("passage", False) and len(calls) == 1


async def test_when_the_leader_is_cancelled_one_waiter_leads_and_the_rest_wait() -> None:
    import asyncio

    from llama_index_hyde_plus.calls.singleflight import SingleFlight

    flights: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work(budget: float | None) -> str:
        calls.append(1)
        await asyncio.sleep(0.3)
        return "passage"

    leader = asyncio.ensure_future(flights.arun("k", work, 5.0))
    await asyncio.sleep(0.05)
    waiters = [asyncio.ensure_future(flights.arun("k", work, 5.0)) for _ in range(19)]
    await asyncio.sleep(0.05)
    leader.cancel()
    results = await asyncio.gather(*waiters)
    assert all(value == "passage" for value, _ in results)
    assert len(calls) == 2  # the cancelled leader's and one waiter's: not 20


def test_when_the_sync_leader_is_interrupted_one_waiter_leads() -> None:
    from llama_index_hyde_plus.calls.singleflight import SingleFlight

    flights: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    got: list[tuple[str, bool]] = []

    def interrupted(budget: float | None) -> str:
        calls.append(1)
        time.sleep(0.2)
        raise KeyboardInterrupt

    def work(budget: float | None) -> str:
        calls.append(1)
        time.sleep(0.2)
        return "passage"

    def lead() -> None:
        with pytest.raises(KeyboardInterrupt):
            flights.run("k", interrupted, 5.0)

    leader = threading.Thread(target=lead)
    leader.start()
    time.sleep(0.05)
    waiters = [
        threading.Thread(target=lambda: got.append(flights.run("k", work, 5.0))) for _ in range(10)
    ]
    for t in waiters:
        t.start()
    for t in [leader, *waiters]:
        t.join(5)
    assert len(got) == 10 and all(value == "passage" for value, _ in got)
    assert len(calls) == 2


# -- a reranker that overruns model_timeout --------------------
def _rerank_retriever(reranker: object, model_timeout: float) -> object:
    from llama_index.core import Document, VectorStoreIndex

    from llama_index_hyde_plus import HyDE, TransformRetriever
    from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

    index = VectorStoreIndex.from_documents(
        [
            Document(text="Enterprise renewals slipped last quarter."),
            Document(text="Office moved."),
        ],
        embed_model=DeterministicEmbedding(),
    )
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped last quarter.")
    return TransformRetriever.from_index(
        index, HyDE(llm), reranker=reranker, model_timeout=model_timeout
    )


@pytest.mark.parametrize("use_async", [False, True])
def test_a_reranker_that_overran_never_changes_the_nodes_already_returned(
    use_async: bool,
) -> None:
    import asyncio

    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class LateMutator(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
            time.sleep(0.6)
            for n in nodes:
                n.score = -999.0
            del nodes[1:]
            return nodes

    retriever: Any = _rerank_retriever(LateMutator(), 0.2)
    q = "Why did revenue drop?"
    found = asyncio.run(retriever.asearch(q)) if use_async else retriever.search(q)
    before = [(n.node.node_id, n.score) for n in found.nodes]
    time.sleep(0.9)  # the abandoned reranker has rewritten what it was handed by now
    assert [(n.node.node_id, n.score) for n in found.nodes] == before
    assert len(before) == 2 and all(score != -999.0 for _, score in before)


async def test_an_async_reranker_that_swallows_its_cancellation_costs_model_timeout() -> None:
    import asyncio

    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class Swallower(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
            return nodes

        async def _apostprocess_nodes(self, nodes, query_bundle=None):  # type: ignore[no-untyped-def]
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await asyncio.sleep(3)  # a cleanup that ignores the deadline
            return nodes

    retriever: Any = _rerank_retriever(Swallower(), 0.3)
    start = time.monotonic()
    found = await retriever.asearch("Why did revenue drop?")
    assert time.monotonic() - start < 2.0 and len(found.nodes) == 2  # was 3.3 s


# -- the prompt is rendered once per call: what is keyed is what is sent --
@pytest.mark.parametrize("use_async", [False, True])
def test_a_rotating_mapping_never_stores_one_renderings_passage_under_anothers_key(
    use_async: bool,
) -> None:
    import asyncio
    import itertools

    from llama_index.core.prompts import PromptTemplate

    from llama_index_hyde_plus import HyDE, MemoryCache
    from llama_index_hyde_plus.testing import ScriptedLLM

    examples = itertools.cycle(["EXAMPLE-A", "EXAMPLE-B"])
    renders: list[str] = []

    def example(**kwargs: Any) -> str:
        renders.append(next(examples))  # a few-shot example rotated per rendering
        return f"{renders[-1]}\nQuestion: {kwargs['query']}"

    prompt = PromptTemplate("{query}\nPassage:", function_mappings={"query": example})
    llm = ScriptedLLM(respond=lambda p: "passage " + ("A" if "EXAMPLE-A" in p else "B"))
    hyde = HyDE(llm, prompt=prompt, cache=MemoryCache())
    q = "Why did revenue drop?"
    results = [
        asyncio.run(hyde.atransform(q)) if use_async else hyde.transform(q) for _ in range(4)
    ]
    assert len(renders) == 4  # once per call, not once for the key and again to send
    assert [r.hypothetical[0] for r in results] == ["passage A", "passage B"] * 2
    assert [r.cached for r in results] == [False, False, True, True]


# -- a call whose caller went away is not a hung call ------------------
def test_calls_abandoned_by_cancelled_callers_do_not_make_a_provider_look_hung() -> None:
    release = threading.Event()
    pool = _workers.DaemonWorkers(max_busy=2, name="cancelled")
    gone = [pool.submit(lambda: release.wait(0.5), budget=10.0) for _ in range(2)]
    for job in gone:
        job.abandon()  # their callers were cancelled long before their own 10 s ran out
    late = pool.submit(lambda: "answered", budget=10.0)  # waits for a worker: no refusal
    assert late.done.wait(5) and late.result() == "answered"


def test_calls_past_their_own_time_still_make_a_provider_look_hung() -> None:
    release = threading.Event()
    pool = _workers.DaemonWorkers(max_busy=2, name="hung")
    try:
        hung = [pool.submit(lambda: release.wait(30), budget=0.05) for _ in range(2)]
        time.sleep(0.1)
        for job in hung:
            job.abandon()
        with pytest.raises(_workers.WorkersBusyError):
            pool.submit(lambda: "never", budget=10.0)
    finally:
        release.set()


# -- minor: fuse's and from_index's arguments ------------------------------
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"k": float("nan")}, "k"),
        ({"k": 0}, "k"),
        ({"top_k": float("nan")}, "top_k"),
        ({"weights": "ab"}, "weights"),
        ({"weights": ["x", 1.0]}, "weights"),
        ({"mode": "best"}, "mode"),
    ],
)
def test_fuse_refuses_bad_arguments_naming_them(kwargs: dict[str, Any], name: str) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from llama_index_hyde_plus.search.fusion import fuse

    lists = [[NodeWithScore(node=TextNode(id_="a", text="a"), score=1.0)]] * 2
    with pytest.raises((TypeError, ValueError), match=name):
        fuse(lists, **kwargs)


@pytest.mark.parametrize("bad", [0, False, [], "filters", {1: 2}])
def test_from_index_refuses_retriever_kwargs_that_are_not_options(bad: Any) -> None:
    from llama_index.core import Document, VectorStoreIndex

    from llama_index_hyde_plus import HyDE, TransformRetriever
    from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

    index = VectorStoreIndex.from_documents(
        [Document(text="Renewals slipped.")], embed_model=DeterministicEmbedding()
    )
    with pytest.raises(TypeError, match="retriever_kwargs"):
        TransformRetriever.from_index(index, HyDE(ScriptedLLM(replies=["x"])), retriever_kwargs=bad)
