"""The bounded calls after the LLM and their worker pools: cancelled callers never make
a healthy pool look hung, an interrupt abandons its call and the pools' lines drop
abandoned calls, and the question's own search never waits on the event loop's default
executor."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.llms import CustomLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llama_index_hyde_plus import (
    HyDE,
    MemoryCache,
    MultiQuery,
    TransformRetriever,
)
from llama_index_hyde_plus.calls import door
from llama_index_hyde_plus.calls import workers as _workers
from llama_index_hyde_plus.calls.door import Deadline
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.calls.workers import LLMPools
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms.base import QueryTransformer
from llama_index_hyde_plus.transforms.core import CoreTransform

from .conftest import DOCS, Q

EMBEDDER = "the embedding model"


async def _cancelled_while_running(pool: _workers.DaemonWorkers, gate: threading.Event) -> None:
    """A healthy call (it ends once ``gate`` is set, well within its 30 s) whose
    caller is cancelled while it runs."""
    task = asyncio.ensure_future(
        door.arun(gate.wait, on=pool, deadline=Deadline.start(30.0), what=EMBEDDER)
    )
    while not pool.busy():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelled_callers_never_make_a_healthy_pool_look_hung() -> None:
    # the door submitted with no budget, so each call abandoned by a cancelled
    # caller counted as overrun at once: a full pool of them refused the next call
    pool = _workers.DaemonWorkers(max_busy=2, name="embedder")
    gate = threading.Event()
    for _ in range(2):
        await _cancelled_while_running(pool, gate)
    later = asyncio.ensure_future(
        door.arun(lambda: "answered", on=pool, deadline=Deadline.start(30.0), what=EMBEDDER)
    )
    await asyncio.sleep(0.05)
    gate.set()  # the healthy calls end: the next one runs (it was not refused)
    assert await asyncio.wait_for(later, 10) == "answered"
    # the sync twins as well: a call in line behind healthy calls waits, never refused
    gate.clear()
    for _ in range(2):
        await _cancelled_while_running(pool, gate)
    threading.Timer(0.1, gate.set).start()
    assert door.run(lambda: "sync", on=pool, deadline=Deadline.start(30.0), what=EMBEDDER) == "sync"
    found = door.run_all(
        [lambda: 1, lambda: 2], on=pool, deadline=Deadline.start(30.0), what=EMBEDDER, at_once=2
    )
    assert found == [1, 2]


async def test_cancelled_callers_never_make_the_process_slots_look_hung(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the same at process scope: cancelled healthy calls holding every slot of
    # the process's cap made any other pool's call fail at once
    monkeypatch.setitem(_workers.CAPS, "llm", _workers.Cap(2))
    gate = threading.Event()
    for k in range(2):
        await _cancelled_while_running(_workers.DaemonWorkers(name=f"embedder-{k}"), gate)
    other = _workers.DaemonWorkers(name="other")
    later = asyncio.ensure_future(
        door.arun(lambda: "answered", on=other, deadline=Deadline.start(30.0), what="the reranker")
    )
    await asyncio.sleep(0.05)
    gate.set()
    assert await asyncio.wait_for(later, 10) == "answered"


def test_a_busy_pool_names_the_model_it_did_not_call() -> None:
    # the message said "LLM worker threads ... not calling the LLM" for every pool
    pool = _workers.DaemonWorkers(max_busy=1, name="embedder")
    hang = threading.Event()
    try:
        with pytest.raises(TimeoutError):
            door.run(hang.wait, on=pool, deadline=Deadline.start(0.05), what=EMBEDDER)
        with pytest.raises(_workers.WorkersBusyError) as raised:
            door.run(lambda: None, on=pool, deadline=Deadline.start(5.0), what=EMBEDDER)
    finally:
        hang.set()
    assert EMBEDDER in str(raised.value) and "LLM" not in str(raised.value)


class _Interrupting(_workers.DaemonWorkers):
    """A pool whose caller gets Ctrl-C while it waits for the call it submitted."""

    jobs: list[_workers.Job]

    def submit(self, *args: Any, **kwargs: Any) -> _workers.Job:
        job = super().submit(*args, **kwargs)
        self.jobs.append(job)
        done = job.done

        class Interrupted:
            is_set, set = done.is_set, done.set

            def wait(self, timeout: float | None = None) -> bool:
                raise KeyboardInterrupt

        job.done = Interrupted()  # type: ignore[assignment]
        return job


def test_an_interrupt_abandons_the_call_it_waited_for() -> None:
    # the door re-raised the KeyboardInterrupt without abandoning the call, so a
    # hung one never counted as overrun and one still in line would run later
    pool = _Interrupting(max_busy=1, name="embedder")
    pool.jobs = []
    hang = threading.Event()
    try:
        for _ in range(2):  # the first runs, the second waits in line
            with pytest.raises(KeyboardInterrupt):
                door.run(hang.wait, on=pool, deadline=Deadline.start(30.0), what=EMBEDDER)
        assert [job.abandoned for job in pool.jobs] == [True, True]
    finally:
        hang.set()


def test_abandoned_calls_never_pile_up_in_a_pools_line() -> None:
    # with every worker busy, each call that gave up stayed in the pool's line for
    # good (only a finishing call drained it): 2 -> 202 -> 402
    pool = _workers.DaemonWorkers(max_busy=1, name="embedder")
    hang = threading.Event()
    try:
        pool.submit(hang.wait, budget=30.0)  # healthy for now: later calls wait in line
        for _ in range(500):
            pool.submit(lambda: None, budget=30.0).abandon()
        assert pool.queued() <= 2 * _workers.MAX_BUSY
        wanted = pool.submit(lambda: "wanted", budget=30.0)
    finally:
        hang.set()
    assert wanted.done.wait(10) and wanted.result() == "wanted"


def test_abandoned_calls_never_pile_up_in_the_process_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the line for the process's slots dropped only abandoned calls at its head
    monkeypatch.setitem(_workers.CAPS, "llm", _workers.Cap(1))
    hang = threading.Event()
    try:
        _workers.DaemonWorkers(name="hog").submit(hang.wait, budget=30.0)
        pool = _workers.DaemonWorkers(name="p")
        first = pool.submit(lambda: "first", budget=30.0)  # wanted: at the head
        for _ in range(500):
            pool.submit(lambda: None, budget=30.0).abandon()
        assert _workers.CAPS["llm"].waiting() <= 2 * _workers.MAX_BUSY
    finally:
        hang.set()
    assert first.done.wait(10) and first.result() == "first"


class _SyncOnly(BaseRetriever):
    """A retriever with no async search of its own."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(id_=k, text=t), score=1.0 / (r + 1))
            for r, (k, t) in enumerate(DOCS.items())
        ]


class _OwnTransform(QueryTransformer):
    """A user's transform with only the blocking ``transform``."""

    method = "own"

    def transform(self, query: str) -> Any:
        return [f"{query} renewals"]


@pytest.fixture
async def busy_default_executor() -> AsyncIterator[None]:
    """The event loop's default executor, its one thread held by the app's own job."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    release = threading.Event()
    held = loop.run_in_executor(None, release.wait)
    yield
    release.set()
    await held
    executor.shutdown(wait=False)


@pytest.mark.usefixtures("busy_default_executor")
async def test_the_questions_own_search_never_waits_on_the_default_executor() -> None:
    # a retriever without native async was searched for the question through
    # asyncio.to_thread, so the app's own jobs on the default executor held every
    # fan-out, cache hit and fallback (and hung searches held the app's threads)
    fan_out = TransformRetriever(
        _SyncOnly(),
        MultiQuery(ScriptedLLM(respond=lambda p: "- costs\n- renewals"), cache=MemoryCache()),
        search_type="keyword",
    )
    down = ScriptedLLM(replies=[ConnectionError("down")] * 4)
    fallback = TransformRetriever(
        _SyncOnly(), HyDE(down, retry=NO_RETRY, breaker=None), search_type="keyword"
    )
    for retriever in (fan_out, fan_out, fallback):  # the second: a cache hit
        found = await asyncio.wait_for(retriever.asearch(Q), 10)
        assert found.nodes and found.transform.fallback is (retriever is fallback)


@pytest.mark.usefixtures("busy_default_executor")
async def test_a_users_blocking_transform_never_waits_on_the_default_executor() -> None:
    # QueryTransformer.atransform ran a user's blocking transform() there too
    own = await asyncio.wait_for(_OwnTransform().atransform_safe(Q), 10)
    assert not own.fallback and own.queries


class _GatedCore(BaseQueryTransform):
    """A healthy core transform: it answers once ``gate`` is set."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        self.gate.wait(30)
        return QueryBundle(query_str=f"{query_bundle.query_str} renewals")

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        return None


class _GatedLLM(CustomLLM):
    """A healthy blocking-only LLM: it answers once ``gate`` is set."""

    gate: Any = None

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="gated")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self.gate.wait(30)
        return CompletionResponse(text="Renewals slipped as large accounts delayed signing.")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("kind", ["core transform", "LLM with no timeout"])
async def test_cancelled_transforms_never_make_their_pool_look_hung(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # the same defect in the other submits: a wrapped core transform's run, and an
    # attempt of a blocking LLM with no timeout (budget None), counted as overrun at once
    monkeypatch.setattr(door, "WORKERS", LLMPools(max_busy=2))
    gate = threading.Event()
    transform: QueryTransformer = (
        CoreTransform(_GatedCore(gate), timeout=30.0)
        if kind == "core transform"
        else HyDE(_GatedLLM(gate=gate), timeout=None, retry=NO_RETRY, breaker=None)
    )
    for i in range(2):
        task = asyncio.ensure_future(transform.atransform_safe(f"{Q} {i}"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    later = asyncio.ensure_future(transform.atransform_safe(Q))
    await asyncio.sleep(0.05)
    gate.set()
    result = await asyncio.wait_for(later, 10)
    assert not result.fallback, result.error


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
