"""KV store entries expire in the store itself when it can expire a field, a hit is a
copy the caller may change, and an in-memory store is read where the transform runs
while a store that may do I/O is read on the cache's threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from llama_index.core.storage.kvstore import SimpleKVStore

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.testing import ScriptedLLM

from .conftest import Q


class _SubclassedStore(SimpleKVStore):
    """A SimpleKVStore subclass: it may do I/O, so its cache is called on threads."""


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_working_kv_cache_still_serves_hits_through_its_threads(use_async: bool) -> None:
    cache = KVStoreCache(_SubclassedStore())
    assert not cache.answers_in_process
    llm = ScriptedLLM(respond=lambda p: "a passage")
    transform = HyDE(llm=llm, cache=cache)
    for _ in range(2):
        result = await transform.atransform(Q) if use_async else transform.transform(Q)
    assert result.cached and len(llm.prompts) == 1


class ResponseError(Exception):
    """What redis-py raises for a command the server does not know (by its name)."""


class _FakeRedisClient:
    def __init__(self, knows_hexpire: bool) -> None:
        self.knows_hexpire = knows_hexpire
        self.expiries: list[tuple[str, int, str]] = []

    def hexpire(self, name: str, seconds: int, *fields: str) -> list[int]:
        if not self.knows_hexpire:
            raise ResponseError("unknown command 'HEXPIRE'")
        self.expiries += [(name, seconds, f) for f in fields]
        return [1] * len(fields)


class _RedisLikeStore(SimpleKVStore):
    """A KV store with a Redis client the way ``RedisKVStore`` holds one."""

    def __init__(self, client: _FakeRedisClient) -> None:
        super().__init__()
        self._redis_client = client


@pytest.mark.parametrize("use_async", [False, True])
async def test_entries_expire_in_redis_itself_when_it_supports_field_expiry(
    use_async: bool,
) -> None:
    client = _FakeRedisClient(knows_hexpire=True)
    cache = KVStoreCache(_RedisLikeStore(client), ttl_s=90.5)
    transform = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=cache)
    await transform.atransform(Q) if use_async else transform.transform(Q)
    assert client.expiries == [(cache.collection, 91, transform.cache_key_for(Q))]


def test_a_redis_without_field_expiry_still_caches_and_is_asked_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _FakeRedisClient(knows_hexpire=False)
    cache = KVStoreCache(_RedisLikeStore(client), ttl_s=60)
    llm = ScriptedLLM(respond=lambda p: "a passage")
    transform = HyDE(llm=llm, cache=cache)
    for question in (Q, Q + " again", Q):
        transform.transform(question)
    assert len(llm.prompts) == 2 and cache._no_field_expiry
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_mutating_a_kv_cache_hit_never_changes_a_later_hit(use_async: bool) -> None:
    cache = KVStoreCache(SimpleKVStore())
    transform = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=cache)
    await transform.atransform(Q) if use_async else transform.transform(Q)
    key = transform.cache_key_for(Q)
    cache.get(key)["hypothetical"].append("EVIL")  # type: ignore[index]
    hit = await transform.atransform(Q) if use_async else transform.transform(Q)
    assert hit.cached and hit.hypothetical == ("a passage",)


def test_mutating_a_value_after_storing_it_never_changes_the_entry() -> None:
    cache = KVStoreCache(SimpleKVStore())
    value: dict[str, Any] = {"hypothetical": ["a passage"]}
    cache.set("k", value)
    value["hypothetical"].append("EVIL")
    assert cache.get("k") == {"hypothetical": ["a passage"]}


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_in_memory_kv_store_is_read_in_the_callers_thread(
    use_async: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LlamaIndex's own SimpleKVStore only computes: its reads and writes are made
    where the transform runs (the event loop's thread on the async path), with no
    hand-off; a subclass of it still goes to the cache's worker threads."""
    seen: list[int] = []
    real_get = SimpleKVStore.get

    def get(self: SimpleKVStore, key: str, collection: str = "data") -> Any:
        seen.append(threading.get_ident())
        return real_get(self, key, collection=collection)

    monkeypatch.setattr(SimpleKVStore, "get", get)
    for store, in_place in ((SimpleKVStore(), True), (_SubclassedStore(), False)):
        seen.clear()
        cache = KVStoreCache(store)
        assert cache.answers_in_process is in_place
        llm = ScriptedLLM(respond=lambda p: "a passage")
        transform = HyDE(llm=llm, cache=cache)
        for _ in range(2):
            result = await transform.atransform(Q) if use_async else transform.transform(Q)
        assert result.cached and len(llm.prompts) == 1
        here = threading.get_ident()
        assert seen and all((ident == here) is in_place for ident in seen), (store, seen)
