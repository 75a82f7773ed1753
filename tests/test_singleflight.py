from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import pytest

from llama_index_hyde_plus import HyDE, MemoryCache, TransformRetriever
from llama_index_hyde_plus.singleflight import SingleFlight
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue drop?"


def test_concurrent_sync_callers_share_one_piece_of_work() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    started = threading.Event()

    def work() -> str:
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return "value"

    out: list[tuple[str, bool]] = []
    leader = threading.Thread(target=lambda: out.append(flight.run("k", work, lambda v: True)))
    leader.start()
    started.wait()
    waiters = [
        threading.Thread(target=lambda: out.append(flight.run("k", work, lambda v: True)))
        for _ in range(3)
    ]
    for t in waiters:
        t.start()
    for t in [leader, *waiters]:
        t.join()
    assert len(calls) == 1
    assert sorted(shared for _, shared in out) == [False, True, True, True]


def test_a_value_not_shareable_makes_each_waiter_work_alone() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    started = threading.Event()

    def work() -> str:
        calls.append(1)
        started.set()
        time.sleep(0.1)
        return "outage"

    leader = threading.Thread(target=lambda: flight.run("k", work, lambda v: False))
    leader.start()
    started.wait()
    value, shared = flight.run("k", work, lambda v: False)
    leader.join()
    assert (value, shared) == ("outage", False) and len(calls) == 2


def test_nothing_is_kept_after_the_work_ends() -> None:
    flight: SingleFlight[int] = SingleFlight()
    assert flight.run("k", lambda: 1, lambda v: True) == (1, False)
    assert flight.run("k", lambda: 2, lambda v: True) == (2, False)


async def test_concurrent_async_callers_share_one_await() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        return "value"

    out = await asyncio.gather(*(flight.arun("k", work, lambda v: True) for _ in range(4)))
    assert len(calls) == 1
    assert sorted(shared for _, shared in out) == [False, True, True, True]


async def test_a_cancelled_leader_leaves_waiters_to_work_alone() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        await asyncio.sleep(0.2)
        return "value"

    leader = asyncio.create_task(flight.arun("k", work, lambda v: True))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(flight.arun("k", work, lambda v: True))
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await waiter == ("value", False)
    assert len(calls) == 2


async def test_waiters_of_a_failed_leader_work_alone_as_on_the_sync_path() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "value"

    results = await asyncio.gather(
        flight.arun("k", work, lambda v: True),
        flight.arun("k", work, lambda v: True),
        return_exceptions=True,
    )
    assert isinstance(results[0], RuntimeError) and results[1] == ("value", False)
    assert len(calls) == 2


async def test_a_waiter_cancelled_with_its_leader_is_cancelled() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        await asyncio.sleep(0.3)
        return "value"

    leader = asyncio.create_task(flight.arun("k", work, lambda v: True))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(flight.arun("k", work, lambda v: True))
    await asyncio.sleep(0.01)
    leader.cancel()
    waiter.cancel()
    for task in (leader, waiter):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(calls) == 1  # the waiter started no work of its own


async def test_wait_for_on_identical_cached_searches_raises_timeout() -> None:
    llm = ScriptedLLM(respond=lambda p: "A passage.", delay=1.5)
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["pto"]), HyDE(llm, timeout=None, cache=MemoryCache())
    )
    start = time.monotonic()
    outcomes = await asyncio.gather(
        *(asyncio.wait_for(retriever.aretrieve(Q), 0.1) for _ in range(2)),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [asyncio.TimeoutError] * 2
    assert time.monotonic() - start < 1.4  # nobody waited out a fresh LLM call
    assert len(llm.prompts) == 1


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_an_interrupted_sync_waiter_propagates_and_starts_no_work() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    started = threading.Event()

    def work() -> str:
        calls.append(1)
        started.set()
        time.sleep(0.4)
        return "value"

    class Interrupted(BaseException):
        pass

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    leader = threading.Thread(target=lambda: flight.run("k", work, lambda v: True))
    leader.start()
    started.wait()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            flight.run("k", work, lambda v: True)  # waits on the main thread
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    leader.join()
    assert len(calls) == 1
