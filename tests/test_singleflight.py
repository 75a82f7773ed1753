from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from typing import Any

import pytest

from llama_index_hyde_plus import HyDE, MemoryCache, TransformRetriever
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.calls.singleflight import SingleFlight, WaitExpired
from llama_index_hyde_plus.testing import HANG, ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue drop?"


def test_concurrent_sync_callers_share_one_piece_of_work() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    started = threading.Event()

    def work(budget: float | None) -> str:
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return "value"

    out: list[tuple[str, bool]] = []
    leader = threading.Thread(target=lambda: out.append(flight.run("k", work)))
    leader.start()
    started.wait()
    waiters = [threading.Thread(target=lambda: out.append(flight.run("k", work))) for _ in range(3)]
    for t in waiters:
        t.start()
    for t in [leader, *waiters]:
        t.join()
    assert len(calls) == 1
    assert sorted(shared for _, shared in out) == [False, True, True, True]


def test_a_failure_the_leader_returned_is_shared_not_worked_again() -> None:
    """A waiter handed a fallback does not call the provider again."""
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    started = threading.Event()

    def work(budget: float | None) -> str:
        calls.append(1)
        started.set()
        time.sleep(0.1)
        return "outage"

    leader = threading.Thread(target=lambda: flight.run("k", work))
    leader.start()
    started.wait()
    value, shared = flight.run("k", work)
    leader.join()
    assert (value, shared) == ("outage", True) and len(calls) == 1


def test_nothing_is_kept_after_the_work_ends() -> None:
    flight: SingleFlight[int] = SingleFlight()
    assert flight.run("k", lambda b: 1) == (1, False)
    assert flight.run("k", lambda b: 2) == (2, False)


async def test_concurrent_async_callers_share_one_await() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work(budget: float | None) -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        return "value"

    out = await asyncio.gather(*(flight.arun("k", work) for _ in range(4)))
    assert len(calls) == 1
    assert sorted(shared for _, shared in out) == [False, True, True, True]


async def test_a_cancelled_leader_leaves_waiters_to_work_alone() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work(budget: float | None) -> str:
        calls.append(1)
        await asyncio.sleep(0.2)
        return "value"

    leader = asyncio.create_task(flight.arun("k", work))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(flight.arun("k", work))
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await waiter == ("value", False)
    assert len(calls) == 2


async def test_waiters_of_a_failed_leader_work_alone_as_on_the_sync_path() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work(budget: float | None) -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "value"

    results = await asyncio.gather(
        flight.arun("k", work),
        flight.arun("k", work),
        return_exceptions=True,
    )
    assert isinstance(results[0], RuntimeError) and results[1] == ("value", False)
    assert len(calls) == 2


async def test_a_waiter_cancelled_with_its_leader_is_cancelled() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work(budget: float | None) -> str:
        calls.append(1)
        await asyncio.sleep(0.3)
        return "value"

    leader = asyncio.create_task(flight.arun("k", work))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(flight.arun("k", work))
    await asyncio.sleep(0.01)
    leader.cancel()
    waiter.cancel()
    for task in (leader, waiter):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(calls) == 1  # the waiter started no work of its own


async def test_wait_for_on_identical_cached_searches_raises_timeout() -> None:
    llm = ScriptedLLM(respond=lambda p: "A passage.", delay=3.0)
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["pto"]), HyDE(llm, timeout=None, cache=MemoryCache())
    )
    start = time.monotonic()
    outcomes = await asyncio.gather(  # both reach the flight well before their time is up
        *(asyncio.wait_for(retriever.aretrieve(Q), 0.5) for _ in range(2)),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [asyncio.TimeoutError] * 2
    assert time.monotonic() - start < 2.8  # nobody waited out a fresh LLM call
    assert len(llm.prompts) == 1


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_an_interrupted_sync_waiter_propagates_and_starts_no_work() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    started = threading.Event()

    def work(budget: float | None) -> str:
        calls.append(1)
        started.set()
        time.sleep(0.4)
        return "value"

    class Interrupted(BaseException):
        pass

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    leader = threading.Thread(target=lambda: flight.run("k", work))
    leader.start()
    started.wait()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            flight.run("k", work)  # waits on the main thread
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    leader.join()
    assert len(calls) == 1


# -- a waiter waits at most its own time and shares the leader's failure --
def test_a_sync_waiter_waits_no_longer_than_its_own_time() -> None:
    flight: SingleFlight[str] = SingleFlight()
    started, release = threading.Event(), threading.Event()

    def work(budget: float | None) -> str:
        started.set()
        release.wait(5)
        return "late"

    leader = threading.Thread(target=lambda: flight.run("k", work, 5.0))
    leader.start()
    started.wait()
    begin = time.monotonic()
    try:
        with pytest.raises(WaitExpired):
            flight.run("k", work, 0.1)
        assert time.monotonic() - begin < 1.0
    finally:
        release.set()
        leader.join()


async def test_an_async_waiter_waits_no_longer_than_its_own_time() -> None:
    flight: SingleFlight[str] = SingleFlight()

    async def work(budget: float | None) -> str:
        await asyncio.sleep(5)
        return "late"

    leader = asyncio.create_task(flight.arun("k", work, 5.0))
    await asyncio.sleep(0.01)
    begin = time.monotonic()
    with pytest.raises(WaitExpired):
        await flight.arun("k", work, 0.1)
    assert time.monotonic() - begin < 1.0
    assert not leader.done()  # the waiter's own time never touches the leader
    leader.cancel()


def test_a_waiter_of_an_interrupted_sync_leader_works_with_what_is_left_of_its_time() -> None:
    flight: SingleFlight[str] = SingleFlight()
    started = threading.Event()
    budgets: list[float | None] = []

    class Interrupted(BaseException):
        pass

    def interrupted(budget: float | None) -> str:
        started.set()
        time.sleep(0.2)
        raise Interrupted

    def work(budget: float | None) -> str:
        budgets.append(budget)
        return "value"

    def lead() -> None:
        with pytest.raises(Interrupted):
            flight.run("k", interrupted, 1.0)

    leader = threading.Thread(target=lead)
    leader.start()
    started.wait()
    assert flight.run("k", work, 1.0) == ("value", False)
    leader.join()
    assert budgets[0] is not None and 0.5 < budgets[0] < 0.85


async def test_a_waiter_of_a_cancelled_async_leader_works_with_what_is_left() -> None:
    flight: SingleFlight[str] = SingleFlight()
    budgets: list[float | None] = []

    async def work(budget: float | None) -> str:
        budgets.append(budget)
        await asyncio.sleep(5 if len(budgets) == 1 else 0)
        return "value"

    leader = asyncio.create_task(flight.arun("k", work, 1.0))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(flight.arun("k", work, 1.0))
    await asyncio.sleep(0.2)
    leader.cancel()
    assert await waiter == ("value", False)
    assert budgets[0] == 1.0 and budgets[1] is not None and 0.5 < budgets[1] < 0.85


T = 0.3


def _hung_retriever(timeout: float = T) -> tuple[TransformRetriever, ScriptedLLM]:
    llm = ScriptedLLM(replies=[HANG] * 40, model_name=f"hung-{uuid.uuid4().hex}")
    hyde = HyDE(llm, timeout=timeout, cache=MemoryCache(), retry=NO_RETRY)
    return TransformRetriever(StaticRetriever(DOCS, default=["pto"]), hyde), llm


def _all_fell_back(found: list[Any]) -> None:
    assert len(found) == 20
    for one in found:
        assert one.transform.fallback and "did not answer within" in (one.transform.error or "")
        assert [n.node.node_id for n in one.nodes] == ["pto"]
    assert all(not one.transform.cached for one in found)  # a failure, never a "hit"


def test_twenty_identical_sync_searches_against_a_hung_provider_wait_one_timeout() -> None:
    retriever, llm = _hung_retriever()
    found: list[Any] = []
    threads = [
        threading.Thread(target=lambda: found.append(retriever.search(Q))) for _ in range(20)
    ]
    begin = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert time.monotonic() - begin < 2 * T  # the old waiters called again: 2 x T
    _all_fell_back(found)
    assert len(llm.prompts) == 1


async def test_twenty_identical_async_searches_against_a_hung_provider_wait_one_timeout() -> None:
    retriever, llm = _hung_retriever()
    begin = time.monotonic()
    found = await asyncio.wait_for(asyncio.gather(*(retriever.asearch(Q) for _ in range(20))), 5)
    assert time.monotonic() - begin < 2 * T
    _all_fell_back(list(found))
    assert len(llm.prompts) == 1


async def test_when_the_leader_is_cancelled_a_waiter_calls_and_succeeds() -> None:
    llm = ScriptedLLM(replies=[HANG, "Renewals slipped last quarter."])
    hyde = HyDE(llm, timeout=5.0, cache=MemoryCache(), retry=NO_RETRY)
    leader = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    leader.cancel()
    result = await asyncio.wait_for(waiter, 5)
    assert not result.fallback and result.hypothetical == ("Renewals slipped last quarter.",)
    assert result.usage.calls == 1 and len(llm.prompts) == 2


async def test_a_cancelled_waiter_on_a_hung_provider_raises_its_cancellation() -> None:
    llm = ScriptedLLM(replies=[HANG] * 3)
    hyde = HyDE(llm, timeout=5.0, cache=MemoryCache(), retry=NO_RETRY)
    leader = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not leader.done() and len(llm.prompts) == 1
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader


# -- single-flight: a slow cache write and a cancelled leader -----
def test_waiters_have_the_leaders_value_before_its_cache_write_ends() -> None:
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
