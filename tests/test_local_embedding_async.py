"""`LocalEmbedding`'s async methods run its blocking ones on the model's own worker
threads (`door.arun`): never on the event loop nor its default executor, with the same
vectors as the blocking path; cancelling the await abandons the call; a search bounds
a hung one by its deadline on those threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import PrivateAttr

from llama_index_hyde_plus.calls import door
from llama_index_hyde_plus.local.embedding import LocalEmbedding
from llama_index_hyde_plus.search.vectors import Embedder
from llama_index_hyde_plus.testing import DeterministicEmbedding

_words = DeterministicEmbedding(dim=16)


class _Stand(LocalEmbedding):
    """`LocalEmbedding` with its ONNX run replaced by word vectors; each run records
    its thread, and blocks while ``hold`` is clear (set by default)."""

    _threads: list[str] = PrivateAttr(default_factory=list)
    _hold: threading.Event = PrivateAttr(default_factory=threading.Event)
    _started: threading.Event = PrivateAttr(default_factory=threading.Event)
    _runs: int = PrivateAttr(default=0)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model_dir="unused", **kwargs)
        self._hold.set()

    def _embed(self, texts: list[str], query: bool = False) -> list[list[float]]:
        self._runs += 1
        self._threads.append(threading.current_thread().name)
        self._started.set()
        self._hold.wait(30)
        return [_words.vector(("q:" if query else "t:") + t) for t in texts]


class _RefusingExecutor(ThreadPoolExecutor):
    """A default executor that records every call handed to it and runs none."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.used = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.used += 1
        future: Future[Any] = Future()
        future.set_exception(AssertionError("the loop's default executor was used"))
        return future


@pytest.fixture
async def refusing_default_executor() -> AsyncIterator[_RefusingExecutor]:
    executor = _RefusingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    yield executor


@pytest.fixture
def stand() -> Iterator[_Stand]:
    model = _Stand(model_name=f"stand-{time.monotonic_ns()}")  # a pool of its own
    yield model
    model._hold.set()


async def test_async_embeddings_equal_the_blocking_ones_and_never_use_the_default_executor(
    stand: _Stand, refusing_default_executor: _RefusingExecutor
) -> None:
    texts = ["renewals slipped", "hiring froze", "pto policy"]
    assert await stand.aget_query_embedding("why?") == stand.get_query_embedding("why?")
    assert await stand.aget_text_embedding(texts[0]) == stand.get_text_embedding(texts[0])
    assert await stand.aget_text_embedding_batch(texts) == stand.get_text_embedding_batch(texts)
    assert refusing_default_executor.used == 0
    loop_thread = threading.current_thread().name
    async_runs = stand._threads[0::2]
    assert async_runs and loop_thread not in async_runs


async def test_cancelling_an_async_embedding_propagates_and_abandons_the_call(
    stand: _Stand,
) -> None:
    stand._hold.clear()
    first = asyncio.ensure_future(stand.aget_query_embedding("a hung question"))
    while not stand._started.is_set():
        await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(first, 5)
    # a call waiting in line behind busy threads, cancelled, never runs
    pool = door.pool(stand)
    pool.max_busy = 1
    try:
        queued = asyncio.ensure_future(stand.aget_text_embedding("never run"))
        await asyncio.sleep(0.05)
        assert pool.queued() == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        stand._hold.set()
        await asyncio.sleep(0.2)
        assert stand._runs == 1
    finally:
        pool.max_busy = door.WORKERS.max_busy


@pytest.mark.parametrize("use_async", [False, True])
def test_a_hung_local_embedding_fails_a_search_embed_at_its_deadline_and_counts_as_overrun(
    stand: _Stand, use_async: bool
) -> None:
    """The search hands the model's blocking method to its worker threads under the
    deadline (its async method could take none): past it the call is abandoned and,
    still running, counts as overrun (the pool refuses a call behind only such calls
    at once)."""
    stand._hold.clear()
    embedder = Embedder(stand)
    deadline = door.Deadline.start(0.2)
    start = time.monotonic()
    with pytest.raises(door.ModelTimeoutError):
        if use_async:
            asyncio.run(embedder.aquery("a hung question", deadline))
        else:
            embedder.query("a hung question", deadline)
    assert time.monotonic() - start < 5
    running = list(door.pool(stand)._running)
    assert len(running) == 1 and running[0].overran


def test_an_async_burst_runs_as_many_embeddings_at_once_as_the_model_allows(
    stand: _Stand,
) -> None:
    """Each run uses every core: more at once only wait, each on a thread started while
    the cores are busy (with the event loop waiting on every start)."""
    running, most = 0, 0
    guard = threading.Lock()
    embed = stand._embed

    def counted(texts: list[str], query: bool = False) -> list[list[float]]:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        time.sleep(0.005)
        try:
            return embed(texts, query)
        finally:
            with guard:
                running -= 1

    object.__setattr__(stand, "_embed", counted)

    async def burst() -> list[list[float]]:
        return await asyncio.gather(*(stand.aget_query_embedding(f"q{i}") for i in range(50)))

    vectors = asyncio.run(burst())
    assert vectors == [_words.vector(f"q:q{i}") for i in range(50)]
    assert door.pool(stand).max_busy == LocalEmbedding.calls_at_once
    assert 1 <= most <= LocalEmbedding.calls_at_once


class _NativeStand(_Stand):
    """A subclass with an async method of its own (no worker thread)."""

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return _words.vector("native:" + query)


def test_a_search_awaits_a_subclasss_own_async_method_and_runs_the_inherited_one_itself() -> None:
    native, stand = _NativeStand(), _Stand()
    found = asyncio.run(Embedder(native).aquery("why?", door.Deadline.start(5)))
    assert found == _words.vector("native:why?") and native._runs == 0
    found = asyncio.run(Embedder(stand).aquery("why?", door.Deadline.start(5)))
    assert found == _words.vector("q:why?") and stand._runs == 1


@pytest.mark.local
def test_the_real_models_async_vectors_equal_its_blocking_ones(real_embedding: Any) -> None:
    texts = ["Revenue dropped because renewals slipped.", "The team hired two engineers."]

    async def both() -> tuple[list[float], list[list[float]]]:
        return (
            await real_embedding.aget_query_embedding("Why did revenue drop?"),
            await real_embedding.aget_text_embedding_batch(texts),
        )

    query, batch = asyncio.run(both())
    assert query == real_embedding.get_query_embedding("Why did revenue drop?")
    assert batch == real_embedding.get_text_embedding_batch(texts)
