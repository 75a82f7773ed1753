"""A hung cache store costs one bound per search and never hangs a sync or an async
search, its threads are its own (another cache of its class still serves hits), and a
cache turned off by a setting it cannot key says so."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.storage.kvstore import SimpleKVStore

from llama_index_hyde_plus import HyDE, MemoryCache, TransformRetriever
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.calls import door, timeouts
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

from .conftest import Q, sync_within


class _HungKV(SimpleKVStore):
    """A store with no socket timeouts: reads and writes block until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.reads = 0
        self.writes = 0

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        self.release.wait(30)
        return None

    def put(self, *args: Any, **kwargs: Any) -> None:
        self.writes += 1
        self.release.wait(30)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_search_whose_cache_read_overran_does_not_also_wait_on_its_write(
    monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    monkeypatch.setattr(timeouts, "CACHE_TIMEOUT_S", 0.1)
    store = _HungKV()
    hyde = HyDE(ScriptedLLM(respond=lambda p: "Renewals slipped."), cache=KVStoreCache(store))
    try:
        for i in range(3):
            query = f"Why did revenue drop {i}?"
            result = asyncio.run(hyde.atransform(query)) if use_async else hyde.transform(query)
            assert not result.fallback and not result.cached
        # the first read overran and still hangs: the next searches skip the cache at
        # once (no read, no write queued behind it) instead of waiting on it again
        assert store.reads == 1
        assert store.writes == 0
    finally:
        store.release.set()


class _SlowKV(SimpleKVStore):
    """A store whose reads take ``delay`` seconds (healthy, slow) and are counted."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.reads = 0

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        time.sleep(self.delay)
        return super().get(*args, **kwargs)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_hung_cache_costs_one_bound_then_is_tried_again_after_the_retry_time(
    monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    """a store that hangs cost its 2 s bound on each of the first 32 searches
    (until all its threads held hung calls). Now the searches while the hung call runs
    skip it at once; once ``DOWN_RETRY_S`` has passed one more call tries it, and once
    the store answers again it is used."""
    monkeypatch.setattr(timeouts, "CACHE_TIMEOUT_S", 0.1)
    monkeypatch.setattr(timeouts, "DOWN_RETRY_S", 0.5)
    store = _HungKV()
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
    hyde = HyDE(llm, cache=KVStoreCache(store))

    def run(query: str) -> Any:
        return asyncio.run(hyde.atransform(query)) if use_async else hyde.transform(query)

    try:
        start = time.perf_counter()
        for i in range(20):
            assert not run(f"Why did revenue drop {i}?").fallback
        assert store.reads == 1  # the others skipped it: one bound, not twenty
        assert time.perf_counter() - start < 0.1 * 20  # fewer than one bound each
        time.sleep(0.6)  # past the retry time: one more call tries the store
        run("Why did revenue drop again?")
        assert store.reads == 2
    finally:
        store.release.set()
    deadline = time.monotonic() + 10
    while door.pool(hyde.cache, "store").busy() and time.monotonic() < deadline:
        time.sleep(0.01)  # the hung calls return once released
    reads, writes = store.reads, store.writes
    run("Why did revenue drop, once it answers?")  # the store is read and written again
    assert (store.reads, store.writes) == (reads + 1, writes + 1)


async def test_a_healthy_cache_whose_caller_was_cancelled_is_not_taken_for_hung() -> None:
    """A read abandoned because its caller was cancelled, that then answers within its
    bound, does not make the next searches skip the cache."""
    store = _SlowKV(0.3)
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
    hyde = HyDE(llm, cache=KVStoreCache(store))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(hyde.atransform("Why did revenue drop?"), 0.05)
    # the abandoned read still runs (0.3 s, within its bound): the next search reads
    # the store too instead of skipping it as hung
    assert not (await hyde.atransform("Why did revenue drop?")).cached
    assert store.reads == 2
    store.delay = 0.0
    assert (await hyde.atransform("Why did revenue drop?")).cached


def test_a_write_follows_a_read_that_answered() -> None:
    store = SimpleKVStore()
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
    hyde = HyDE(llm, cache=KVStoreCache(store))
    assert not hyde.transform("Why did revenue drop?").cached
    assert hyde.transform("Why did revenue drop?").cached
    assert llm.sync_calls == 1


def _only_text(messages: Any) -> str:
    return str(messages.upper())  # a formatter for text: raises on a list of messages


def test_a_cache_the_key_cannot_serve_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A formatter that raises on the messages it is keyed by leaves no key: the cache
    is off for that transform, said once, and every search still answered."""
    llm = ScriptedLLM(respond=lambda p: "Renewals slipped.", messages_to_prompt=_only_text)
    hyde = HyDE(llm, cache=MemoryCache())
    with caplog.at_level(logging.WARNING):
        results = [hyde.transform("Why did revenue drop?") for _ in range(5)]
    assert not any(r.cached for r in results) and llm.sync_calls == 5
    said = [r for r in caplog.records if "transform cache off" in r.getMessage()]
    assert len(said) == 1 and "HyDE" in said[0].getMessage()


async def test_a_cached_transform_never_waits_on_the_loops_default_executor() -> None:
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    app_pool = ThreadPoolExecutor(1)
    loop.set_default_executor(app_pool)
    busy = threading.Event()
    loop.run_in_executor(None, busy.wait, 30)  # the app's own work fills the executor
    try:
        llm = ScriptedLLM(respond=lambda p: "Renewals slipped.")
        hyde = HyDE(llm, cache=MemoryCache())
        first = await asyncio.wait_for(hyde.atransform("Why did revenue drop?"), 5)
        second = await asyncio.wait_for(hyde.atransform("Why did revenue drop?"), 5)
        assert not first.cached and second.cached and llm.async_calls == 1
    finally:
        busy.set()
        app_pool.shutdown(wait=False)


# -- a blocking cache store never hangs a search -----------------------------------
_RELEASE = threading.Event()


class _BlockingStore(SimpleKVStore):
    """A KV store whose every read and write blocks (a stopped Redis with no socket
    timeout) until the test ends."""

    def get(self, *args: Any, **kwargs: Any) -> Any:
        _RELEASE.wait(120)

    def put(self, *args: Any, **kwargs: Any) -> None:
        _RELEASE.wait(120)


@pytest.fixture
def blocking_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[KVStoreCache]:
    monkeypatch.setattr(timeouts, "CACHE_TIMEOUT_S", 0.2)
    _RELEASE.clear()
    yield KVStoreCache(_BlockingStore())
    _RELEASE.set()


def _blocked_retriever(cache: KVStoreCache) -> TransformRetriever:
    transform = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=cache, timeout=5)
    return TransformRetriever(StaticRetriever({"a": "x"}, default=["a"]), transform)


def test_a_blocking_cache_store_never_hangs_a_sync_search(blocking_cache: KVStoreCache) -> None:
    retriever = _blocked_retriever(blocking_cache)
    result = sync_within(lambda: retriever.search(Q), 20)[0]
    assert [n.node.node_id for n in result.nodes] == ["a"]
    assert result.transform.hypothetical == ("a passage",)  # generated, not cached


def test_a_blocking_cache_store_never_hangs_an_async_search_nor_its_loop(
    blocking_cache: KVStoreCache,
) -> None:
    retriever = _blocked_retriever(blocking_cache)

    async def main() -> tuple[Any, int]:
        results = await asyncio.gather(*(retriever.asearch(f"{Q} {i}") for i in range(8)))
        # the loop's default executor is free: the app's own to_thread work still runs
        free = await asyncio.wait_for(asyncio.to_thread(lambda: 1), 5)
        return results, free

    results, free = sync_within(lambda: asyncio.run(main()), 30)[0]  # asyncio.run exits too
    assert free == 1
    assert all(r.transform.hypothetical == ("a passage",) for r in results)


def test_once_the_cache_threads_all_hold_overrun_calls_it_is_skipped_at_once(
    blocking_cache: KVStoreCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    transform = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=blocking_cache)
    sync_within(lambda: [transform.transform(f"{Q} {i}") for i in range(40)], 60)  # 40 overrun
    monkeypatch.setattr(timeouts, "CACHE_TIMEOUT_S", 60.0)
    result = sync_within(lambda: transform.transform(Q + " once more"), 10)[0]  # not 2 x 60 s
    assert result.hypothetical == ("a passage",) and not result.cached


def test_a_hung_cache_never_turns_off_another_cache_of_its_class(
    blocking_cache: KVStoreCache,
) -> None:
    # the threads of one store that hangs are its own
    hung = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=blocking_cache)
    sync_within(lambda: [hung.transform(f"{Q} {i}") for i in range(40)], 60)  # its threads all hung
    healthy = HyDE(
        llm=ScriptedLLM(respond=lambda p: "a passage"), cache=KVStoreCache(SimpleKVStore())
    )
    healthy.transform(Q)
    assert sync_within(lambda: healthy.transform(Q), 10)[0].cached
