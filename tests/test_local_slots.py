"""The local model's slots: a call's timeout counts from when llama.cpp can generate for
it, not from when it queued behind busy slots; the wait for a slot has its own bound
("model busy"); at most ``n_parallel`` calls are ever inside llama.cpp; cancelling a
waiting call leaves the line and loses no slot. Sync and async paths alike, through a
transform, against a stand-in for llama.cpp's server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.calls import llm as calls_llm
from llama_index_hyde_plus.local.llm import LocalLLM, LocalLLMCancelledError
from llama_index_hyde_plus.local.slots import ModelBusyError, Slots, SlotWaitCancelledError

from .conftest import sync_within

Q = "Why did revenue drop?"
REPLY = "Revenue dropped because enterprise renewals slipped last quarter."


class Server:
    """llama.cpp's ``handle_chat_completions``: each call holds its slot ``hold``
    seconds (sending empty chunks, so a cancelled call stops at the next one), then
    writes `REPLY`; ``peak`` is the most calls it ever had at once."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.active = 0
        self.peak = 0
        self.calls = 0
        self.stopped = 0
        self._lock = threading.Lock()

    def handle_chat_completions(
        self, request: dict[str, Any], on_chunk: Callable[..., bool]
    ) -> Any:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
        try:
            end = time.monotonic() + self.hold
            while time.monotonic() < end:
                if on_chunk({"choices": [{"delta": {}}]}):
                    with self._lock:
                        self.stopped += 1
                    return None
                time.sleep(0.01)
            on_chunk({"choices": [{"delta": {"content": REPLY}}]})
            on_chunk({"choices": [{"delta": {}, "finish_reason": "stop"}]})
            on_chunk({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 9}})
            return None
        finally:
            with self._lock:
                self.active -= 1


def local(server: Server, n_parallel: int = 1, **kwargs: Any) -> LocalLLM:
    llm = LocalLLM(model_path="/nonexistent/model.gguf", n_parallel=n_parallel, **kwargs)
    llm._server = server
    return llm


def hyde(llm: LocalLLM, timeout: float) -> HyDE:
    return HyDE(llm, timeout=timeout, breaker=None, retry=None)


def occupy(llm: LocalLLM, seconds: float) -> threading.Thread:
    """A call that holds one slot for about ``seconds`` (a direct, untimed call)."""
    server = llm._server
    assert isinstance(server, Server)
    server.hold = seconds
    started = threading.Event()

    def call() -> None:
        started.set()
        llm.complete("hold a slot")

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    started.wait()
    deadline = time.monotonic() + 5
    while server.active == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    server.hold = 0.0  # the calls after this one answer at once
    return thread


def settled(llm: LocalLLM) -> None:
    """Every slot is free again and nobody waits (none was lost)."""
    gate = llm._gate()
    deadline = time.monotonic() + 5
    while gate.free() != gate.size and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.free() == gate.size
    assert gate.waiting() == 0


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_call_queued_behind_a_busy_slot_gets_its_whole_timeout_once_it_generates(
    use_async: bool,
) -> None:
    server = Server()
    llm = local(server, slot_wait=10.0)
    holder = occupy(llm, 1.2)  # longer than the transform's whole timeout
    t = hyde(llm, timeout=0.6)
    start = time.monotonic()
    result = await t.atransform(Q) if use_async else sync_within(lambda: t.transform(Q), 10)[0]
    waited = time.monotonic() - start
    assert not result.fallback, result.error  # failed before: timed out while queued
    assert result.hypothetical == (REPLY,)
    assert waited >= 0.9  # it did wait for the slot, outside its 0.6 s
    holder.join(5)
    assert server.peak == 1
    settled(llm)


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_call_that_waits_longer_than_slot_wait_falls_back_as_model_busy(
    use_async: bool,
) -> None:
    server = Server()
    llm = local(server, slot_wait=0.3)
    holder = occupy(llm, 1.5)
    t = hyde(llm, timeout=5.0)
    start = time.monotonic()
    result = await t.atransform(Q) if use_async else sync_within(lambda: t.transform(Q), 10)[0]
    took = time.monotonic() - start
    assert result.fallback
    assert result.search_queries == (Q,)
    assert (result.error or "").startswith("ModelBusyError: model busy")
    assert 0.25 <= took < 1.2  # its own bound, far inside the holder's 1.5 s
    assert server.calls == 1  # the busy call never reached llama.cpp
    holder.join(5)
    settled(llm)


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_slow_call_that_times_out_hands_its_slot_to_the_next_with_its_own_time(
    use_async: bool,
) -> None:
    server = Server(hold=30.0)  # a model far too slow: every call would run 30 s
    llm = local(server, slot_wait=10.0)
    t = hyde(llm, timeout=0.4)

    async def both() -> list[Any]:
        if use_async:
            first = asyncio.ensure_future(t.atransform(Q))
            await asyncio.sleep(0.1)
            server.hold = 0.0  # the second call answers at once once it generates
            return list(await asyncio.gather(first, t.atransform(Q)))
        loop = asyncio.get_running_loop()
        first_f = loop.run_in_executor(None, t.transform, Q)
        await asyncio.sleep(0.1)
        server.hold = 0.0
        second_f = loop.run_in_executor(None, t.transform, Q)
        return [await first_f, await second_f]

    first, second = await asyncio.wait_for(both(), 10)
    assert first.fallback and (first.error or "").startswith("LLMTimeoutError")
    assert not second.fallback, second.error  # waited ~0.3 s for the slot, then had 0.4 s
    assert server.stopped == 1  # the timed-out call stopped generating
    assert server.peak == 1
    settled(llm)


async def test_cancelling_a_call_waiting_for_a_slot_propagates_and_loses_no_slot() -> None:
    server = Server()
    llm = local(server, slot_wait=10.0)
    holder = occupy(llm, 0.8)
    task = asyncio.ensure_future(hyde(llm, timeout=5.0).atransform(Q))
    await asyncio.sleep(0.2)
    assert llm._gate().waiting() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert llm._gate().waiting() == 0  # it left the line at once
    holder.join(5)
    assert server.calls == 1  # the cancelled call never reached llama.cpp
    settled(llm)


def test_a_worker_told_to_stop_while_it_waits_for_a_slot_never_reaches_the_model() -> None:
    server = Server()
    llm = local(server, slot_wait=10.0)
    holder = occupy(llm, 1.0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            llm._request([], {}, cancel=stop)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    time.sleep(0.1)
    start = time.monotonic()
    stop.set()
    worker.join(2)
    assert time.monotonic() - start < 0.5
    assert len(errors) == 1 and isinstance(errors[0], LocalLLMCancelledError)
    holder.join(5)
    assert server.calls == 1
    settled(llm)


@pytest.mark.parametrize("use_async", [False, True])
async def test_many_concurrent_searches_share_two_slots_and_none_times_out_in_line(
    use_async: bool,
) -> None:
    server = Server(hold=0.1)
    llm = local(server, n_parallel=2, slot_wait=30.0)
    t = hyde(llm, timeout=0.5)  # 16 calls x 0.1 s on 2 slots: the last waits ~0.7 s
    if use_async:
        results = await asyncio.gather(*(t.atransform(f"{Q} {i}") for i in range(16)))
    else:
        loop = asyncio.get_running_loop()
        calls = [loop.run_in_executor(None, t.transform, f"{Q} {i}") for i in range(16)]
        results = await asyncio.gather(*calls)
    assert [r.error for r in results if r.fallback] == []
    assert server.peak <= 2
    settled(llm)


@pytest.mark.parametrize("use_async", [False, True])
async def test_the_calls_of_one_generation_each_take_a_slot_in_turn(use_async: bool) -> None:
    server = Server(hold=0.3)
    llm = local(server, n_parallel=1, slot_wait=10.0)
    t = HyDE(llm, num_passages=3, timeout=0.5, breaker=None, retry=None)
    result = await t.atransform(Q) if use_async else sync_within(lambda: t.transform(Q), 10)[0]
    assert not result.fallback, result.error  # 3 x 0.3 s on one slot, 0.5 s each
    assert not result.error
    assert server.calls == 3 and server.peak == 1
    settled(llm)


def test_other_models_take_no_slot() -> None:
    from llama_index_hyde_plus.testing import ScriptedLLM

    with calls_llm._slot(ScriptedLLM(replies=["x"])) as taken:
        assert taken is None


# -- the line itself -------------------------------------------------------------------
def test_slots_are_handed_out_first_come_first_served() -> None:
    slots = Slots(1)
    slots.acquire(None)
    order: list[int] = []
    threads = []
    for i in range(5):
        thread = threading.Thread(target=lambda i=i: (slots.acquire(None), order.append(i)))
        thread.start()
        threads.append(thread)
        while slots.waiting() < i + 1:
            time.sleep(0.001)
    for _ in range(5):
        slots.release()
        time.sleep(0.02)
    for thread in threads:
        thread.join(2)
    assert order == [0, 1, 2, 3, 4]
    slots.release()
    assert slots.free() == 1


def test_a_blocking_wait_ends_on_its_cancel_event_and_leaves_the_line() -> None:
    slots = Slots(1)
    slots.acquire(None)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    with pytest.raises(SlotWaitCancelledError):
        slots.acquire(None, (stop,))
    assert slots.waiting() == 0
    slots.release()
    assert slots.free() == 1


async def test_an_async_wait_past_its_bound_is_model_busy_and_leaves_the_line() -> None:
    slots = Slots(2)
    await slots.aacquire(None)
    await slots.aacquire(None)
    with pytest.raises(ModelBusyError, match="all 2 slots"):
        await slots.aacquire(0.1)
    assert slots.waiting() == 0
    slots.release()
    slots.release()
    assert slots.free() == 2


def test_a_slot_handed_to_a_closed_loop_goes_to_the_next_caller() -> None:
    slots = Slots(1)
    slots.acquire(None)
    loop = asyncio.new_event_loop()
    waiting = loop.create_task(slots.aacquire(None))
    loop.run_until_complete(asyncio.sleep(0.01))  # the task is in line now
    assert slots.waiting() == 1
    loop.close()  # its loop is gone with the task still waiting
    slots.release()  # cannot be woken: the slot is free again
    assert slots.free() == 1
    del waiting


class HungServer(Server):
    """A llama.cpp that neither answers nor hears that it should stop, for 2 s."""

    def handle_chat_completions(
        self, request: dict[str, Any], on_chunk: Callable[..., bool]
    ) -> Any:
        with self._lock:
            self.calls += 1
        time.sleep(2.0)
        return None


@pytest.mark.parametrize("use_async", [False, True])
async def test_behind_a_hung_model_every_call_falls_back_within_its_bounds(use_async: bool) -> None:
    server = HungServer()
    llm = local(server, n_parallel=2, slot_wait=0.3)
    t = hyde(llm, timeout=0.3)
    start = time.monotonic()
    if use_async:
        results = await asyncio.gather(*(t.atransform(f"{Q} {i}") for i in range(6)))
    else:
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(None, t.transform, f"{Q} {i}") for i in range(6))
        )
    assert time.monotonic() - start < 1.5  # 0.3 s in line or 0.3 s generating, never 2 s
    assert all(r.fallback for r in results)
    reasons = sorted((r.error or "").split(":")[0] for r in results)
    assert reasons.count("LLMTimeoutError") == 2 and reasons.count("ModelBusyError") == 4
    assert server.calls == 2  # only the two with a slot reached it
    settled(llm)


class RaisingServer(Server):
    def handle_chat_completions(
        self, request: dict[str, Any], on_chunk: Callable[..., bool]
    ) -> Any:
        with self._lock:
            self.calls += 1
        if self.calls % 2:
            raise RuntimeError("llama.cpp failed")
        return {"error": {"message": "bad request"}}


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_failing_model_gives_its_slot_back(use_async: bool) -> None:
    llm = local(RaisingServer(), n_parallel=1, slot_wait=1.0)
    t = hyde(llm, timeout=1.0)
    for i in range(4):
        result = await t.atransform(f"{Q} {i}") if use_async else t.transform(f"{Q} {i}")
        assert result.fallback
        assert (result.error or "").startswith(("RuntimeError", "LocalLLMError"))
    settled(llm)


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_identical_search_waiting_on_a_queued_one_waits_for_its_slot_too(
    use_async: bool,
) -> None:
    from llama_index_hyde_plus import MemoryCache

    server = Server()
    llm = local(server, slot_wait=10.0)
    holder = occupy(llm, 1.2)
    t = HyDE(llm, timeout=0.6, breaker=None, retry=None, cache=MemoryCache())
    if use_async:
        results = await asyncio.gather(t.atransform(Q), t.atransform(Q))
    else:
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(*(loop.run_in_executor(None, t.transform, Q) for _ in "ab"))
    assert [r.error for r in results if r.fallback] == []  # failed before: the waiter's 0.6 s
    assert server.calls == 2  # the holder's and one generation, shared
    holder.join(5)
    settled(llm)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e9, "soon"])
def test_a_bad_slot_wait_is_refused_naming_the_field(bad: Any) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="slot_wait"):
        LocalLLM(model_path="/nonexistent/model.gguf", slot_wait=bad)
