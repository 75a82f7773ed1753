"""`KVStoreCache` on a real Redis server (and on LlamaIndex's in-memory KV store)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_index.core.storage.kvstore import SimpleKVStore

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.testing import ScriptedLLM

from .redis_server import redis_server

Q = "Why did revenue drop?"
PASSAGE = "Enterprise renewals slipped as large accounts delayed signing."


@pytest.fixture(scope="module")
def redis_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as uri:
        yield uri


def _hyde(cache: KVStoreCache, llm: ScriptedLLM) -> HyDE:
    return HyDE(llm, num_passages=1, cache=cache)


def test_a_redis_hit_serves_another_cache_instance_without_a_call(
    redis_uri: str, tmp_path: Path
) -> None:
    collection = f"c{time.monotonic_ns()}"
    writer = ScriptedLLM([PASSAGE])
    first = _hyde(KVStoreCache.from_uri(redis_uri, collection=collection), writer).transform(Q)
    reader = ScriptedLLM([])  # would raise if called
    second = _hyde(KVStoreCache.from_uri(redis_uri, collection=collection), reader).transform(Q)
    assert first.hypothetical == second.hypothetical == (PASSAGE,)
    assert second.cached and not second.fallback and reader.sync_calls == 0


def test_a_redis_hit_serves_another_process(redis_uri: str) -> None:
    collection = f"p{time.monotonic_ns()}"
    _hyde(
        KVStoreCache.from_uri(redis_uri, collection=collection), ScriptedLLM([PASSAGE])
    ).transform(Q)
    code = (
        "import json, sys\n"
        "from llama_index_hyde_plus import HyDE\n"
        "from llama_index_hyde_plus.caching.kv_cache import KVStoreCache\n"
        "from llama_index_hyde_plus.testing import ScriptedLLM\n"
        "llm = ScriptedLLM([])\n"
        f"cache = KVStoreCache.from_uri({redis_uri!r}, collection={collection!r})\n"
        f"r = HyDE(llm, num_passages=1, cache=cache).transform({Q!r})\n"
        "print(json.dumps([r.cached, r.fallback, list(r.hypothetical), llm.sync_calls]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False, [PASSAGE], 0]


async def test_the_async_path_reads_redis_off_the_event_loop(redis_uri: str) -> None:
    collection = f"a{time.monotonic_ns()}"
    cache = KVStoreCache.from_uri(redis_uri, collection=collection)
    await _hyde(cache, ScriptedLLM([PASSAGE])).atransform(Q)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    original = cache.get

    def spy(key: str) -> object:
        seen.append(threading.get_ident())
        return original(key)

    cache.get = spy  # type: ignore[method-assign]
    hit = await _hyde(cache, ScriptedLLM([], forbid_sync=True)).atransform(Q)
    assert hit.cached and seen and loop_thread not in seen


def test_entries_expire_after_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("llama_index_hyde_plus.caching.kv_cache.time.time", lambda: clock[0])
    store = SimpleKVStore()
    cache = KVStoreCache(store, ttl_s=10)
    cache.set("k", {"x": 1})
    clock[0] += 5
    assert cache.get("k") == {"x": 1}
    clock[0] += 6
    assert cache.get("k") is None
    assert store.get("k", collection=cache.collection) is None  # the expired entry is gone


def test_any_llama_index_kvstore_serves_as_a_cache() -> None:
    cache = KVStoreCache(SimpleKVStore())
    llm = ScriptedLLM([PASSAGE])
    _hyde(cache, llm).transform(Q)
    assert _hyde(cache, llm).transform(Q).cached and llm.sync_calls == 1


def test_malformed_entries_are_misses() -> None:
    store = SimpleKVStore()
    cache = KVStoreCache(store)
    for bad in ({"created": "yesterday", "result": {}}, {"result": {"q": 1}}, {"created": 1.0}):
        store.put("k", bad, collection=cache.collection)
        assert cache.get("k") is None
    store.put("k", {"created": time.time(), "result": {"query": 7}}, collection=cache.collection)
    llm = ScriptedLLM([PASSAGE])
    hyde = HyDE(llm, num_passages=1, cache=cache)
    store.put(
        hyde.cache_key_for(Q),
        {"created": time.time(), "result": {"not": "a result"}},
        collection=cache.collection,
    )
    result = hyde.transform(Q)  # an entry that does not decode: the LLM is asked
    assert result.hypothetical == (PASSAGE,) and not result.cached and llm.sync_calls == 1


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_redis_that_is_down_never_fails_a_search(caplog: pytest.LogCaptureFixture) -> None:
    cache = KVStoreCache.from_uri(f"redis://127.0.0.1:{_unused_port()}/0", timeout_s=0.5)
    llm = ScriptedLLM([PASSAGE, PASSAGE, PASSAGE])
    with caplog.at_level(logging.WARNING, logger="llama_index_hyde_plus.caching.kv_cache"):
        results = [_hyde(cache, llm).transform(Q) for _ in range(3)]
    assert all(r.hypothetical == (PASSAGE,) and not r.fallback for r in results)
    warnings = [r for r in caplog.records if r.name == "llama_index_hyde_plus.caching.kv_cache"]
    assert len(warnings) == 1 and "continuing without it" in warnings[0].getMessage()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


async def test_a_hung_redis_costs_at_most_its_timeout(silent_server: int) -> None:
    cache = KVStoreCache.from_uri(f"redis://127.0.0.1:{silent_server}/0", timeout_s=0.3)
    llm = ScriptedLLM([PASSAGE, PASSAGE])
    start = time.monotonic()
    sync = _hyde(cache, llm).transform(Q)
    asynchronous = await asyncio.wait_for(_hyde(cache, llm).atransform(Q), 10)
    assert sync.hypothetical == asynchronous.hypothetical == (PASSAGE,)
    assert time.monotonic() - start < 5  # 4 bounded waits (get, set on each path), not a hang


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(TypeError, match="kvstore"):
        KVStoreCache({})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl_s"):
        KVStoreCache(SimpleKVStore(), ttl_s=0)
    with pytest.raises(ValueError, match="ttl_s"):
        KVStoreCache(SimpleKVStore(), ttl_s=float("nan"))
    with pytest.raises(ValueError, match="collection"):
        KVStoreCache(SimpleKVStore(), collection="")
    with pytest.raises(ValueError, match="uri"):
        KVStoreCache.from_uri("localhost:6379")
    with pytest.raises(ValueError, match="timeout_s"):
        KVStoreCache.from_uri("redis://localhost:6379", timeout_s=0)


def test_two_serve_processes_share_one_redis_cache(redis_uri: str) -> None:
    import rcp

    from .conftest import Served

    uri = redis_uri.replace("/0", "/1")  # a database of its own: no other test's entries
    first, second = Served("--llm", "scripted", "--cache", uri), None
    try:
        assert "cache: redis 127.0.0.1:" in first.banner
        question = f"Why did revenue drop in week {time.monotonic_ns()}?"
        miss = rcp.connect_http(first.url).transform(question, "hyde")
        assert miss["usage"].get("cached") is not True
        second = Served("--llm", "scripted", "--cache", uri)
        hit = rcp.connect_http(second.url).transform(question, "hyde")
        assert hit["usage"]["cached"] is True and hit["hypothetical"] == miss["hypothetical"]
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_serve_refuses_a_cache_url_it_cannot_use() -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    result = CliRunner().invoke(app, ["serve", "--stdio", "--cache", "memcached://x:1"])
    assert result.exit_code == 2 and "--cache must be memory, a Redis URL" in result.output


def test_a_failed_store_is_left_alone_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    from llama_index_hyde_plus.caching import kv_cache
    from llama_index_hyde_plus.calls import timeouts

    class Hung(SimpleKVStore):
        calls = 0

        def get(self, key: str, collection: str = "data") -> dict | None:  # type: ignore[override]
            Hung.calls += 1
            raise TimeoutError("Redis did not answer within 2 s")

        def put(self, key: str, val: dict, collection: str = "data") -> None:  # type: ignore[override]
            Hung.calls += 1
            raise TimeoutError("Redis did not answer within 2 s")

    clock = [100.0]
    monkeypatch.setattr(kv_cache.time, "monotonic", lambda: clock[0])
    cache = KVStoreCache(Hung())
    for _ in range(5):  # one failed read; then neither reads nor writes until the retry
        assert cache.get("k") is None
        cache.set("k", {"x": 1})
    assert Hung.calls == 1
    clock[0] += timeouts.DOWN_RETRY_S + 0.1
    assert cache.get("k") is None and Hung.calls == 2  # asked again after the pause


def test_an_entry_from_far_in_the_future_is_expired(monkeypatch: pytest.MonkeyPatch) -> None:
    store = SimpleKVStore()
    cache = KVStoreCache(store, ttl_s=60)
    store.put("soon", {"created": time.time() + 5, "result": {"x": 1}}, collection=cache.collection)
    store.put(
        "far", {"created": time.time() + 3600, "result": {"x": 2}}, collection=cache.collection
    )
    assert cache.get("soon") == {"x": 1}  # another replica's clock a little ahead
    assert cache.get("far") is None
