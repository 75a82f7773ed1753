"""The door every call to a dependency goes through (`calls.door`): which threads a call
takes, the one rule for a failing dependency, and what a callee raises."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from llama_index_hyde_plus.calls import door, timeouts
from llama_index_hyde_plus.calls.door import (
    Deadline,
    DependencyDownError,
    ModelTimeoutError,
)
from llama_index_hyde_plus.calls.reliability import CallError
from llama_index_hyde_plus.calls.workers import LLMPools, QueuedTooLongError


class _Provider:
    def __init__(self, endpoint: str) -> None:
        self.api_base = endpoint


class _Store:
    """A dependency keyed by the object itself."""


@pytest.fixture(autouse=True)
def _own_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(door, "WORKERS", LLMPools())


def test_a_model_shares_its_providers_threads_and_a_store_has_its_own() -> None:
    one, other = _Provider("http://a"), _Provider("http://a")
    assert door.pool(one) is door.pool(other)  # one provider, however many objects
    assert door.pool(one) is not door.pool(_Provider("http://b"))
    first, second = _Store(), _Store()
    assert door.pool(first, "store") is not door.pool(second, "store")
    searches = door.pool(first, "search")
    assert searches is not door.pool(first, "store") and searches.cap == "search"
    assert door.pool(first, "store").cap == "llm"


def test_with_no_deadline_a_blocking_call_runs_in_the_callers_thread() -> None:
    assert door.run(threading.get_ident, on=_Store(), kind="store") == threading.get_ident()


async def test_the_async_door_never_runs_a_blocking_call_on_the_loop() -> None:
    here = threading.get_ident()
    ran_on = await door.arun(threading.get_ident, on=_Store(), kind="store")
    assert ran_on != here


@pytest.mark.parametrize("use_async", [False, True])
def test_a_dependency_that_overran_is_skipped_then_probed_once_and_a_late_answer_reopens_it(
    monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    monkeypatch.setattr(timeouts, "DOWN_RETRY_S", 0.3)
    store, gate, calls = _Store(), threading.Event(), [0]

    def slow() -> str:
        calls[0] += 1
        gate.wait(10)
        return "value"

    def call() -> object:
        kwargs = {"on": store, "kind": "store", "skip_when_down": True}
        try:
            if use_async:
                return asyncio.run(door.arun(slow, deadline=Deadline.start(0.05), **kwargs))  # type: ignore[arg-type]
            return door.run(slow, deadline=Deadline.start(0.05), **kwargs)  # type: ignore[arg-type]
        except (ModelTimeoutError, DependencyDownError) as exc:
            return type(exc)

    try:
        assert call() is ModelTimeoutError
        assert [call() for _ in range(10)] == [DependencyDownError] * 10
        assert calls[0] == 1  # skipped at once: one bound, not eleven
        time.sleep(0.35)
        assert call() is ModelTimeoutError and calls[0] == 2  # the one probe
        assert call() is DependencyDownError
    finally:
        gate.set()
    deadline = time.monotonic() + 10
    while door.pool(store, "store").busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert door.run(lambda: "ok", on=store, kind="store", deadline=Deadline.start(5)) == "ok"
    kwargs = {"on": store, "kind": "store", "skip_when_down": True}
    assert door.run(lambda: "ok", deadline=Deadline.start(5), **kwargs) == "ok"  # type: ignore[arg-type]


def test_an_llm_call_that_waited_in_line_past_its_deadline_was_not_the_callees_fault() -> None:
    store, hang = _Store(), threading.Event()
    workers = door.pool(store, "store")
    workers.max_busy = 1
    try:
        running = threading.Thread(
            target=lambda: door.run(hang.wait, on=store, kind="store", deadline=Deadline.start(5))
        )
        running.start()
        while not workers.busy():
            time.sleep(0.005)
        with pytest.raises(QueuedTooLongError, match="never made"):
            door.run(
                lambda: None,
                on=store,
                kind="store",
                deadline=Deadline.start(0.05),
                cancellable=True,
            )
        with pytest.raises(ModelTimeoutError):  # a call no breaker counts: its timeout
            door.run(lambda: None, on=store, kind="store", deadline=Deadline.start(0.05))
    finally:
        hang.set()
        running.join()


@pytest.mark.parametrize("raised", [asyncio.CancelledError(), type("Odd", (BaseException,), {})()])
async def test_what_a_blocking_callee_raises_is_its_failure_never_our_cancellation(
    raised: BaseException,
) -> None:
    def call() -> None:
        raise raised

    with pytest.raises(CallError, match="the store raised"):
        await door.arun(call, on=_Store(), kind="store", what="the store")
    with pytest.raises(CallError, match="the store raised"):
        door.run(call, on=_Store(), kind="store", deadline=Deadline.start(5), what="the store")


async def test_cancelling_the_await_tells_a_cancellable_call_to_stop() -> None:
    started, stopped = threading.Event(), threading.Event()

    def call() -> None:
        told = door.CANCEL_EVENT.get()
        assert told is not None
        started.set()
        if told.wait(10):
            stopped.set()

    task = asyncio.ensure_future(
        door.arun(call, on=_Store(), kind="store", deadline=Deadline.start(30), cancellable=True)
    )
    while not started.is_set():
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(stopped.wait, 5)
