"""Thread slots: hung question searches of retrievers built per request do not hold the
process's thread slots, and cache warnings shorten a huge error (a subclass of an
in-process store is tested in test_in_process_search.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.storage.kvstore import SimpleKVStore

from llama_index_hyde_plus import HyDE, MultiQuery, StepBack, TransformRetriever
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.calls import timeouts
from llama_index_hyde_plus.calls import workers as _workers
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.testing import ScriptedLLM

from .conftest import Q


class _HungQuestion(BaseRetriever):
    """A sync-only store whose search of the question itself hangs until released,
    counting how many such searches ever started (from any thread)."""

    gate = threading.Event()
    started = 0
    lock = threading.Lock()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if query_bundle.query_str.startswith(Q):
            with _HungQuestion.lock:
                _HungQuestion.started += 1
            self.gate.wait(30)
        return [NodeWithScore(node=TextNode(id_="a", text="Renewals slipped."), score=1.0)]


async def _another_provider_answers() -> None:
    """A healthy transform of another provider is answered, not refused for want of a
    thread, while the hung searches run."""
    other = ScriptedLLM(respond=lambda p: "A healthy passage.", model_name="another")
    hyde = HyDE(other, timeout=5.0, retry=NO_RETRY, breaker=None)
    result = await asyncio.to_thread(hyde.transform, "Why did costs rise?")
    assert not result.fallback, result.error


async def test_hung_question_searches_hold_no_slot_of_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """12 requests, each with its own retriever (``index.as_retriever()`` per request)
    over a store that hangs, given up by the app: their question searches hold none of
    the process's thread slots (here 8), so a healthy transform of another provider is
    still answered (before: it waited its whole timeout for a slot and fell back)."""
    monkeypatch.setitem(_workers.CAPS, "llm", _workers.Cap(8))
    _HungQuestion.gate.clear()
    try:
        for _ in range(12):
            llm = ScriptedLLM(respond=lambda p: "- costs\n- renewals")
            per_request = TransformRetriever(_HungQuestion(), MultiQuery(llm), model_timeout=1.0)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(per_request.asearch(Q), 0.3)
        await _another_provider_answers()
    finally:
        _HungQuestion.gate.set()


class _Raises(SimpleKVStore):
    def get(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("x" * 100_000)

    def put(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("y" * 100_000)


def test_a_cache_failure_with_a_huge_message_is_logged_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hyde = HyDE(ScriptedLLM(respond=lambda p: "Renewals slipped."), cache=KVStoreCache(_Raises()))
    with caplog.at_level(logging.DEBUG):
        assert not hyde.transform(Q).fallback
    said = [r.getMessage() for r in caplog.records if "transform cache" in r.getMessage()]
    assert said and all(len(m) < 2_000 for m in said)
    assert any("more characters" in m for m in said)


def _twelve_at_once(hyde: HyDE) -> None:
    """12 different questions transformed at once, from threads."""
    threads = [
        threading.Thread(target=hyde.transform, args=(f"Why did revenue drop {i}?",))
        for i in range(1, 13)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)


class _CountedReads(SimpleKVStore):
    """A store that counts its reads (from any thread): `_read` is the read's number."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self._lock = threading.Lock()

    def _read(self) -> int:
        with self._lock:
            self.reads += 1
            return self.reads


class _HangsTwice(_CountedReads):
    """A store whose first two reads hang until released; the later ones answer at
    once (connections that black-holed while the server itself recovered)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        if self._read() <= 2:
            self.release.wait(30)
        return super().get(*args, **kwargs)


def test_after_the_retry_time_one_caller_tries_the_hung_cache_and_its_answer_reopens_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once `DOWN_RETRY_S` has passed, 12 concurrent callers sent 12 reads to a
    store that still hung (each paid the bound); now one caller tries while the rest
    skip, and once a try answers the cache is used again although the hung reads still
    run."""
    import time

    monkeypatch.setattr(timeouts, "CACHE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(timeouts, "DOWN_RETRY_S", 0.5)
    store = _HangsTwice()
    hyde = HyDE(ScriptedLLM(respond=lambda p: "Renewals slipped."), cache=KVStoreCache(store))
    try:
        assert not hyde.transform("Why did revenue drop 0?").fallback  # read 1 hangs
        time.sleep(0.6)  # past the retry time
        _twelve_at_once(hyde)
        assert store.reads == 2  # one try (it hangs too), not twelve
        time.sleep(0.9)  # past the retry time after that try overran
        hyde.transform("Why did revenue drop 13?")
        assert store.reads == 3  # this try answers
        hyde.transform("Why did revenue drop 14?")
        assert store.reads == 4  # and the cache is read again, the hung reads still running
    finally:
        store.release.set()


class _PerStore(BaseRetriever):
    """A sync-only retriever class whose objects each have a store: ``hangs`` or not."""

    def __init__(self, hangs: threading.Event | None) -> None:
        super().__init__()
        self.hangs = hangs

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.hangs is not None:
            self.hangs.wait(30)
        return [NodeWithScore(node=TextNode(id_="a", text="Renewals slipped."), score=1.0)]


async def test_one_retrievers_hung_question_searches_never_hold_another_of_its_class() -> None:
    """With one pool per retriever class, 40 given-up searches of a hung
    store held all 32 threads and every other object of that class waited for good;
    now each object has its own."""
    gate = threading.Event()
    hung = TransformRetriever(_PerStore(gate), MultiQuery(ScriptedLLM(respond=lambda p: "- a")))
    healthy = TransformRetriever(
        _PerStore(None), MultiQuery(ScriptedLLM(respond=lambda p: "- costs\n- renewals"))
    )
    try:
        for _ in range(40):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(hung.asearch(Q), 0.05)
        found = await asyncio.wait_for(healthy.asearch(Q), 10)
        assert found.nodes and not found.transform.fallback
    finally:
        gate.set()


class _DownThenUp(_CountedReads):
    """A store whose client fails every read after its own timeout (0.2 s) until ``up``
    is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = threading.Event()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self._read()
        if not self.up.is_set():
            self.up.wait(0.2)  # the client's own timeout
            raise TimeoutError("Timeout reading from socket")
        return super().get(*args, **kwargs)


def test_after_an_outage_one_caller_tries_the_store_while_the_others_skip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After `DOWN_RETRY_S` every concurrent caller asked a store that was
    still down (each paying its client's timeout); now one does, and once it succeeds
    the store is asked again by all."""
    import time

    monkeypatch.setattr(timeouts, "DOWN_RETRY_S", 0.3)
    store = _DownThenUp()
    hyde = HyDE(ScriptedLLM(respond=lambda p: "Renewals slipped."), cache=KVStoreCache(store))
    assert not hyde.transform("Why did revenue drop 0?").fallback  # the outage starts
    time.sleep(0.4)
    _twelve_at_once(hyde)
    assert store.reads == 2  # one try, not twelve
    store.up.set()
    time.sleep(0.4)
    hyde.transform("Why did revenue drop 13?")  # this try succeeds
    hyde.transform("Why did revenue drop 14?")
    assert store.reads == 4


def test_a_locked_sqlite_cache_costs_one_busy_wait_not_one_per_caller(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process holds the file's write lock,
    12 concurrent writers each waited ``busy_timeout_s`` in turn (serialised on the
    cache's lock: 12 x 0.3 s); now the first failure leaves writes alone for one
    ``busy_timeout_s``, the callers queued behind it skip, then one caller tries again,
    and once the lock is gone writes land again."""
    import sqlite3
    import time

    from llama_index_hyde_plus.caching.cache import SQLiteCache

    path = tmp_path / "cache.sqlite"
    cache = SQLiteCache(path, busy_timeout_s=0.3)
    tries = [0]
    opened = SQLiteCache._open

    def counted(self: SQLiteCache) -> sqlite3.Connection:
        tries[0] += 1
        return opened(self)

    monkeypatch.setattr(SQLiteCache, "_open", counted)
    other = sqlite3.connect(path, isolation_level=None)  # another process's writer
    other.execute("BEGIN EXCLUSIVE")

    def twelve_writes(round_: int) -> None:
        threads = [
            threading.Thread(target=cache.set, args=(f"k{round_}-{i}", {"i": i})) for i in range(12)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)

    twelve_writes(1)
    assert tries[0] == 1  # one busy wait, not twelve
    time.sleep(0.4)
    twelve_writes(2)
    assert tries[0] == 2  # after the pause one caller tried, the others skipped
    other.execute("COMMIT")
    other.close()
    time.sleep(0.4)
    cache.set("after", {"ok": True})  # the one try: it succeeds
    cache.set("again", {"ok": 2})
    assert cache.get("after") == {"ok": True} and cache.get("again") == {"ok": 2}


async def test_hung_question_searches_of_many_retrievers_share_one_thread_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retrievers built per request over a store whose searches hang each
    grew threads of their own with no process-wide bound (6 of 6 searches ran at once
    here); now they share the ``"search"`` cap (here 4): the rest wait in line, a
    cancelled one leaves it and never runs, an LLM call is not held up, and once the
    store answers every search left completes."""
    searches = _workers.Cap(4)
    monkeypatch.setitem(_workers.CAPS, "search", searches)
    _HungQuestion.gate.clear()
    _HungQuestion.started = 0
    try:
        step_back = StepBack(ScriptedLLM(respond=lambda p: "What drives revenue?"))
        retrievers = [TransformRetriever(_HungQuestion(), step_back) for _ in range(6)]
        tasks = [asyncio.create_task(r.aretrieve(Q)) for r in retrievers]
        for _ in range(100):
            await asyncio.sleep(0.02)
            if _HungQuestion.started >= 4 and searches.waiting() >= 2:
                break
        assert _HungQuestion.started == 4  # the cap, not 6
        tasks[-1].cancel()  # a waiter given up by its app
        await _another_provider_answers()
    finally:
        _HungQuestion.gate.set()
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert isinstance(done[-1], asyncio.CancelledError)
    assert all(isinstance(d, list) and d for d in done[:-1])
    assert _HungQuestion.started == 5  # the cancelled waiter's search never ran
