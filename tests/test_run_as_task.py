"""`run_as_task`: a model's coroutine bounded by a deadline, as the LLM and the models
after it are awaited on the async path."""

from __future__ import annotations

import asyncio
import time

import pytest

from llama_index_hyde_plus.calls.door import (
    Deadline,
    ModelTimeoutError,
    await_within,
    run_as_task,
)


async def _answer(value: int, delay: float = 0.0) -> int:
    if delay:
        await asyncio.sleep(delay)
    return value


async def test_a_reply_is_the_finished_tasks_and_its_own_timeout_stays_its_own() -> None:
    task = await run_as_task(_answer(7), 5.0)
    assert task is not None and task.result() == 7

    async def provider_times_out() -> None:
        raise TimeoutError("the provider's own")

    task = await run_as_task(provider_times_out(), 5.0)
    assert task is not None  # finished in time: its error is the caller's to read
    with pytest.raises(TimeoutError, match="provider's own"):
        task.result()


async def test_a_coroutine_that_swallows_its_cancellation_is_left_at_the_deadline() -> None:
    went_on = asyncio.Event()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            went_on.set()
            await asyncio.sleep(5)  # a slow cleanup nobody waits for
        return "late"

    start = time.monotonic()
    assert await run_as_task(stubborn(), 0.05) is None
    assert time.monotonic() - start < 2.5  # not held by its 5 s cleanup
    await asyncio.wait_for(went_on.wait(), 5)  # it was told to stop
    with pytest.raises(ModelTimeoutError, match=r"the reranker did not answer within 0\.05s"):
        await await_within(stubborn(), Deadline.start(0.05), "the reranker")


async def test_the_callers_cancellation_propagates_and_drops_the_task() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(run_as_task(slow(), 30.0))
    await asyncio.wait_for(started.wait(), 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_an_interrupt_raised_inside_reaches_the_caller() -> None:
    class Interrupt(BaseException):
        pass

    async def interrupted() -> None:
        raise Interrupt

    task = await run_as_task(interrupted(), 5.0)
    assert task is not None
    with pytest.raises(Interrupt):
        task.result()


async def test_thousands_at_once_each_get_their_own_reply_and_leave_no_task() -> None:
    before = len(asyncio.all_tasks())
    tasks = await asyncio.gather(
        *(run_as_task(_answer(i, 0.001 * (i % 3)), 10.0) for i in range(2000))
    )
    assert [t.result() for t in tasks if t is not None] == list(range(2000))
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before
