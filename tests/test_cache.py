from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from llama_index_hyde_plus import HyDE, MemoryCache, MultiQuery, SQLiteCache
from llama_index_hyde_plus.cache import cache_key
from llama_index_hyde_plus.testing import ScriptedLLM

Q = "Why did revenue drop?"


def test_memory_cache_evicts_least_recently_used() -> None:
    cache = MemoryCache(max_entries=2)
    cache.set("a", {"v": 1})
    cache.set("b", {"v": 2})
    assert cache.get("a") == {"v": 1}  # a is now most recent
    cache.set("c", {"v": 3})
    assert cache.get("b") is None and cache.get("a") and cache.get("c") and len(cache) == 2


def test_memory_cache_is_thread_safe() -> None:
    cache = MemoryCache(max_entries=50)

    def work(i: int) -> None:
        for j in range(200):
            cache.set(f"{i}-{j}", {"j": j})
            cache.get(f"{i}-{j - 1}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50


def test_sqlite_cache_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    SQLiteCache(path).set("k", {"x": [1, 2]})
    assert SQLiteCache(path).get("k") == {"x": [1, 2]}
    assert len(SQLiteCache(path)) == 1


def test_sqlite_cache_ttl_expires_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("llama_index_hyde_plus.cache.time.time", lambda: clock[0])
    cache = SQLiteCache(tmp_path / "c.sqlite", ttl_s=10)
    cache.set("k", {"x": 1})
    clock[0] += 5
    assert cache.get("k") == {"x": 1}
    clock[0] += 6
    assert cache.get("k") is None


def test_corrupted_sqlite_file_is_moved_aside_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") == {"x": 1}
    assert list(tmp_path.glob("c.sqlite.corrupt-*"))
    assert any("unreadable" in r.getMessage() for r in caplog.records)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        MemoryCache(max_entries=0)
    with pytest.raises(ValueError, match="ttl_s"):
        SQLiteCache(":memory:", ttl_s=0)
    with pytest.raises(TypeError, match="cache"):
        HyDE(ScriptedLLM(), cache={})  # type: ignore[arg-type]


@pytest.mark.parametrize("make_cache", [lambda p: MemoryCache(), lambda p: SQLiteCache(p / "c")])
def test_a_hit_makes_no_llm_call_and_reports_zero_cost(make_cache, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM(["A passage."], model_name="gpt-4o-mini")
    hyde = HyDE(llm, cache=make_cache(tmp_path))
    first = hyde.transform(Q)
    second = hyde.transform(Q)
    assert len(llm.prompts) == 1
    assert not first.cached and first.usage.calls == 1 and first.usage.cost > 0
    assert second.cached and second.hypothetical == first.hypothetical
    assert second.usage.calls == 0 and second.usage.cost == 0 and second.usage.cached
    assert second.generation_usage == first.usage


async def test_async_hit_on_sqlite_never_calls_sync_llm(tmp_path: Path) -> None:
    cache = SQLiteCache(tmp_path / "c")
    HyDE(ScriptedLLM(["A passage."]), cache=cache).transform(Q)
    llm = ScriptedLLM(forbid_sync=True)
    result = await HyDE(llm, cache=cache).atransform(Q)
    assert result.cached and llm.sync_calls == llm.async_calls == 0


def test_key_covers_method_model_prompt_parameters_and_query() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM(respond=lambda p: "passage.")
    base = HyDE(llm, cache=cache)
    keys = {
        base.cache_key_for(Q),
        base.cache_key_for(Q + "!"),
        HyDE(llm, cache=cache, num_passages=2).cache_key_for(Q),
        HyDE(llm, cache=cache, max_characters=50).cache_key_for(Q),
        HyDE(llm, cache=cache, prompt="Doc: {query}").cache_key_for(Q),
        HyDE(ScriptedLLM(model_name="other"), cache=cache).cache_key_for(Q),
        MultiQuery(llm, cache=cache).cache_key_for(Q),
    }
    assert len(keys) == 7
    assert base.cache_key_for(Q) == HyDE(llm).cache_key_for(Q)
    # include_query changes how HyDE's passages are searched, not the passages
    assert base.cache_key_for(Q) == HyDE(llm, include_query=True).cache_key_for(Q)
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})


def test_a_hyde_hit_takes_the_include_query_of_the_asking_transform() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM(["A passage."])
    HyDE(llm, cache=cache).transform(Q)
    hit = HyDE(llm, cache=cache, include_query=True).transform(Q)
    assert hit.cached and hit.include_query and hit.embedding_strs == ("A passage.", Q)


def test_fallbacks_are_not_cached() -> None:
    llm = ScriptedLLM([RuntimeError("down"), "A passage."])
    hyde = HyDE(llm, cache=MemoryCache())
    assert hyde.transform(Q).fallback
    assert hyde.transform(Q).hypothetical == ("A passage.",)


async def test_identical_concurrent_async_requests_share_one_call() -> None:
    llm = ScriptedLLM(["A passage."], delay=0.1)
    hyde = HyDE(llm, cache=MemoryCache())
    results = await asyncio.gather(*(hyde.atransform(Q) for _ in range(5)))
    assert len(llm.prompts) == 1
    assert sum(not r.cached for r in results) == 1
    assert all(r.hypothetical == ("A passage.",) for r in results)
    assert sum(r.usage.calls for r in results) == 1


def test_identical_concurrent_sync_requests_share_one_call() -> None:
    llm = ScriptedLLM(["A passage."], delay=0.2)
    hyde = HyDE(llm, cache=MemoryCache())
    results = []
    threads = [threading.Thread(target=lambda: results.append(hyde.transform(Q))) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(llm.prompts) == 1 and len(results) == 5
    assert sum(r.cached for r in results) == 4


async def test_leader_failure_lets_waiters_try_themselves() -> None:
    llm = ScriptedLLM([RuntimeError("down"), "p2.", "p3."], delay=0.05)
    hyde = HyDE(llm, cache=MemoryCache())
    results = await asyncio.gather(hyde.atransform(Q), hyde.atransform(Q))
    assert results[0].fallback
    assert results[1].hypothetical == ("p2.",)


async def test_cancelling_the_leader_cancels_only_it_and_the_follower_goes_alone() -> None:
    llm = ScriptedLLM(["A passage.", "A passage."], delay=0.2)
    hyde = HyDE(llm, cache=MemoryCache())
    leader = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    follower = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    result = await follower
    assert result.hypothetical == ("A passage.",) and not result.cached
