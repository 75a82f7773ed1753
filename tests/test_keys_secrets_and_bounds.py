"""The cache key covers bound built-ins, the globals a setting reads and a prompt's
function mappings; secret names are exactly secrets; a blocking cache store never hangs
a search; a wrapped core transform sees the caller's bundle and its own embedding is
searched; worker threads have one overall cap; KV store entries expire in the store and
a hit cannot be mutated."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.prompts import PromptTemplate
from llama_index.core.retrievers import TransformRetriever as CoreTransformRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.storage.kvstore import SimpleKVStore
from pydantic import Field

from llama_index_hyde_plus import HyDE, MemoryCache, TransformRetriever
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.calls import timeouts
from llama_index_hyde_plus.calls import workers as _workers
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

Q = "Why did revenue drop?"


def _key(respond: Callable[[str], str], **fields: Any) -> str:
    transform = HyDE(llm=ScriptedLLM(respond=respond, **fields), cache=MemoryCache())
    return transform.cache_key_for(Q)


# -- a prompt formatter is keyed by what it renders ---------------------------------
def test_bound_builtin_prompt_functions_of_the_llm_are_keyed_by_what_they_render() -> None:
    def key(**fields: Any) -> str:
        return _key(lambda p: "x", **fields)

    assert key(completion_to_prompt="EN {}".format) != key(completion_to_prompt="FR {}".format)
    assert key(messages_to_prompt="EN {}".format) != key(messages_to_prompt="FR {}".format)
    assert key(completion_to_prompt="EN {}".format) == key(completion_to_prompt="EN {}".format)


# -- a prompt's function mappings are in the key ------------------------------------
def _mapped(language: str) -> PromptTemplate:
    def render(**kwargs: Any) -> str:
        return f"in {language}: {kwargs['query']}"

    return PromptTemplate("Q: {query}", function_mappings={"query": render})


@pytest.mark.parametrize("use_async", [False, True])
async def test_prompts_with_other_function_mappings_never_share_a_generation(
    use_async: bool,
) -> None:
    cache = MemoryCache()
    results = []
    for language in ("English", "French"):
        llm = ScriptedLLM(respond=lambda p: "reply to " + p)
        transform = HyDE(llm=llm, prompt=_mapped(language), cache=cache)
        result = await transform.atransform(Q) if use_async else transform.transform(Q)
        results.append((result, llm))
    assert not results[1][0].cached and len(results[1][1].prompts) == 1
    assert "French" in results[1][0].hypothetical[0]


def test_a_plain_prompt_keeps_its_key_and_equal_mappings_share_one() -> None:
    plain = HyDE(llm=ScriptedLLM(respond=lambda p: "x"), cache=MemoryCache())
    same = HyDE(
        llm=ScriptedLLM(respond=lambda p: "x"), prompt=plain.prompt.get_template(), cache=None
    )
    assert plain.cache_key_for(Q) == same.cache_key_for(Q)
    one = HyDE(llm=ScriptedLLM(respond=lambda p: "x"), prompt=_mapped("English"))
    two = HyDE(llm=ScriptedLLM(respond=lambda p: "x"), prompt=_mapped("English"))
    assert one.cache_key_for(Q) == two.cache_key_for(Q) != plain.cache_key_for(Q)


# -- secret names are exactly secrets ----------------------------------------------
class _TokenLLM(ScriptedLLM):
    stop_token: str = Field(default="\n")
    eos_token: str = Field(default="</s>")
    hf_token: str = Field(default="hf_x")
    access_token: str = Field(default="a")
    client_secret: str = Field(default="s")
    openai_api_key: str = Field(default="k")
    password: str = Field(default="p")
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)


def _token_key(**fields: Any) -> str:
    llm = _TokenLLM(respond=lambda p: "x", **fields)
    return HyDE(llm=llm, cache=MemoryCache()).cache_key_for(Q)


@pytest.mark.parametrize(
    ("field", "first", "second"),
    [
        ("stop_token", "\n", "."),
        ("eos_token", "</s>", "<|end|>"),
        ("additional_kwargs", {"stop_token_ids": [1]}, {"stop_token_ids": [2]}),
        ("additional_kwargs", {"eos_token": "</s>"}, {"eos_token": "<|end|>"}),
        ("additional_kwargs", {"bos_token_id": 1}, {"bos_token_id": 2}),
        ("additional_kwargs", {"max_new_tokens": 1}, {"max_new_tokens": 2}),
    ],
)
def test_token_generation_settings_are_in_the_key(field: str, first: Any, second: Any) -> None:
    assert _token_key(**{field: first}) != _token_key(**{field: second})


@pytest.mark.parametrize(
    ("field", "first", "second"),
    [
        ("hf_token", "hf_a", "hf_b"),
        ("access_token", "a", "b"),
        ("client_secret", "a", "b"),
        ("openai_api_key", "a", "b"),
        ("password", "a", "b"),
    ],
)
def test_secrets_are_never_in_the_key(field: str, first: Any, second: Any) -> None:
    assert _token_key(**{field: first}) == _token_key(**{field: second})


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


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` on a daemon thread; its result, or a failure if it is still running
    after ``seconds`` (it hangs)."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"still running after {seconds}s: it hangs"
    return box[0]


def test_a_blocking_cache_store_never_hangs_a_sync_search(blocking_cache: KVStoreCache) -> None:
    retriever = _blocked_retriever(blocking_cache)
    result = _within(20, lambda: retriever.search(Q))
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

    results, free = _within(30, lambda: asyncio.run(main()))  # asyncio.run exits too
    assert free == 1
    assert all(r.transform.hypothetical == ("a passage",) for r in results)


def test_once_the_cache_threads_all_hold_overrun_calls_it_is_skipped_at_once(
    blocking_cache: KVStoreCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    transform = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=blocking_cache)
    _within(60, lambda: [transform.transform(f"{Q} {i}") for i in range(40)])  # 40 overrun
    monkeypatch.setattr(timeouts, "CACHE_TIMEOUT_S", 60.0)
    result = _within(10, lambda: transform.transform(Q + " once more"))  # not 2 x 60 s
    assert result.hypothetical == ("a passage",) and not result.cached


def test_a_hung_cache_never_turns_off_another_cache_of_its_class(
    blocking_cache: KVStoreCache,
) -> None:
    # the threads of one store that hangs are its own
    hung = HyDE(llm=ScriptedLLM(respond=lambda p: "a passage"), cache=blocking_cache)
    _within(60, lambda: [hung.transform(f"{Q} {i}") for i in range(40)])  # its threads all hung
    healthy = HyDE(
        llm=ScriptedLLM(respond=lambda p: "a passage"), cache=KVStoreCache(SimpleKVStore())
    )
    healthy.transform(Q)
    assert _within(10, lambda: healthy.transform(Q)).cached


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


# -- one cap on worker threads across all pools ------------------------------------
@pytest.fixture
def few_thread_slots(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """At most 4 worker threads in the process (the cap is `MAX_THREADS`), and an
    event that ends the hung calls."""
    monkeypatch.setattr(_workers, "_thread_slots", threading.BoundedSemaphore(4))
    # a line of its own: calls of earlier tests still running (healthy, within their
    # time) would otherwise count among the holders, and a cap is refused at once only
    # when every holder overran
    monkeypatch.setattr(_workers, "_slot_line", _workers._SlotLine())
    release = threading.Event()
    yield release
    release.set()


def test_hung_calls_over_many_pools_hold_at_most_the_global_thread_cap(
    few_thread_slots: threading.Event,
) -> None:
    pools = [_workers.DaemonWorkers(max_busy=2, name=f"test-{i}") for i in range(4)]
    jobs = [pool.submit(lambda: few_thread_slots.wait(60)) for pool in pools for _ in range(2)]
    for _ in range(100):  # the first four run (their workers take them)
        if all(job.started for job in jobs[:4]):
            break
        threading.Event().wait(0.02)
    assert all(job.started for job in jobs[:4])
    assert not any(job.started for job in jobs[4:])  # past the cap: waiting in line
    assert pools[2].busy() == 0  # a call waiting for a slot holds no place of its pool
    for job in jobs:  # only once every running call overran, refuse at once
        job.abandon()
    with pytest.raises(_workers.WorkersBusyError):
        pools[3].submit(lambda: 1)


def test_a_thread_slot_is_free_again_once_its_worker_exits(
    few_thread_slots: threading.Event,
) -> None:
    pools = [_workers.DaemonWorkers(max_busy=1, max_idle=0) for _ in range(4)]
    jobs = [pool.submit(lambda: few_thread_slots.wait(60)) for pool in pools]
    few_thread_slots.set()
    assert all(job.done.wait(10) for job in jobs)
    for _ in range(100):  # the workers exit (max_idle=0) and give their slots back
        if _workers._thread_slots._value == 4:  # type: ignore[attr-defined]
            break
        threading.Event().wait(0.05)
    job = _workers.DaemonWorkers().submit(lambda: 7)
    assert job.done.wait(10) and job.result() == 7


def test_idle_workers_of_healthy_pools_never_lock_another_pool_out(
    few_thread_slots: threading.Event,
) -> None:
    # four pools that each ran a call keep idle workers; a fifth still runs
    pools = [_workers.DaemonWorkers(max_busy=2) for _ in range(4)]
    done = [pool.submit(lambda: 1) for pool in pools]
    assert all(job.done.wait(10) for job in done)
    assert all(pool.idle() == 1 for pool in pools)  # 4 idle threads, the cap is 4
    job = _workers.DaemonWorkers().submit(lambda: 7)
    assert job.done.wait(10) and job.result() == 7


def test_a_queued_call_inherits_the_slot_of_the_call_before_it(
    few_thread_slots: threading.Event,
) -> None:
    pool = _workers.DaemonWorkers(max_busy=1)
    first = pool.submit(lambda: few_thread_slots.wait(60))
    queued = pool.submit(lambda: 8)  # waits in line, holds no slot yet
    others = [_workers.DaemonWorkers().submit(lambda: few_thread_slots.wait(60)) for _ in range(3)]
    past_cap = _workers.DaemonWorkers().submit(lambda: 9)  # 4 running: waits for a slot
    assert not past_cap.done.wait(0.1)
    few_thread_slots.set()
    assert all(j.done.wait(10) for j in (first, queued, past_cap, *others))
    assert queued.result() == 8 and past_cap.result() == 9
    for _ in range(100):  # every slot comes back once the calls end
        if _workers._thread_slots._value == 4:  # type: ignore[attr-defined]
            break
        threading.Event().wait(0.05)
    assert _workers._thread_slots._value == 4  # type: ignore[attr-defined]


class _BlockingLLM(CustomLLM):
    """An LLM with only a blocking ``complete`` (the async path runs it on a worker
    thread too), hung until ``release`` is set."""

    model_name: str = "blocking"
    release: Any = Field(default=None, exclude=True)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name=self.model_name)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.release.wait(60)
        return CompletionResponse(text="")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("use_async", [False, True])
async def test_past_the_thread_cap_a_hung_provider_falls_back_at_once_uncounted(
    few_thread_slots: threading.Event, use_async: bool
) -> None:
    transforms = [
        HyDE(
            llm=_BlockingLLM(model_name=f"tenant-{use_async}-{m}", release=few_thread_slots),
            timeout=0.05,
            retry=None,
        )
        for m in range(6)
    ]
    results = [await t.atransform_safe(Q) if use_async else t.transform_safe(Q) for t in transforms]
    assert all(r.fallback for r in results)
    assert "WorkersBusyError" in (results[-1].error or "")
    breaker = transforms[-1].breaker
    assert breaker is None or breaker.state == "closed"


# -- KV store entries expire in Redis, and a hit is a copy --------------------------
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


# -- a wrapped core transform sees the caller's bundle, and its vector is searched ---
class _CoreBase(BaseQueryTransform):
    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass


class _EmbeddingTransform(_CoreBase):
    """A core transform that answers with a vector of its own."""

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        return QueryBundle(query_str=query_bundle.query_str, embedding=[1.0] + [0.0] * 7)


class _SpyTransform(_CoreBase):
    """A core transform that records what it was given and returns it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        bundle = query_bundle
        self.seen.append((bundle.query_str, bundle.custom_embedding_strs, bundle.embedding))
        return query_bundle


class _Recording(StaticRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.bundles.append(query_bundle)
        return super()._retrieve(query_bundle)


def _recording() -> _Recording:
    retriever = _Recording({"a": "x"}, default=["a"])
    retriever.bundles = []
    return retriever


async def _retrieve(retriever: Any, query: Any, use_async: bool) -> Any:
    return await retriever.aretrieve(query) if use_async else retriever.retrieve(query)


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_core_transforms_own_embedding_is_searched_as_core_searches_it(
    use_async: bool,
) -> None:
    searched: dict[str, set[tuple[float, ...]]] = {}
    for name, make in (
        ("core", lambda r: CoreTransformRetriever(r, _EmbeddingTransform())),
        (
            "ours",
            lambda r: TransformRetriever(
                r,
                query_transform=_EmbeddingTransform(),
                embed_model=DeterministicEmbedding(),
                search_type="dense",
            ),
        ),
    ):
        inner = _recording()
        await _retrieve(make(inner), "q", use_async)
        searched[name] = {tuple(b.embedding or ()) for b in inner.bundles}
    assert searched["ours"] == searched["core"] == {(1.0,) + (0.0,) * 7}


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_core_transform_is_given_the_callers_own_bundle(use_async: bool) -> None:
    given = QueryBundle("q", custom_embedding_strs=["special text"], embedding=[0.5, 0.5])
    seen: dict[str, Any] = {}
    for name, make in (
        ("core", lambda r, t: CoreTransformRetriever(r, t)),
        ("ours", lambda r, t: TransformRetriever(r, query_transform=t)),
    ):
        spy = _SpyTransform()
        inner = _recording()
        await _retrieve(make(inner, spy), given, use_async)
        seen[name] = (spy.seen, {tuple(b.embedding or ()) for b in inner.bundles})
    assert seen["ours"] == seen["core"]
    assert seen["ours"][0] == [("q", ["special text"], [0.5, 0.5])]


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
