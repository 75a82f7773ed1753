"""The LLM call layer under load: threads that only wait take no slot of the process's
thread cap and a burst past it waits in line; a streamed reply keeps the overall
deadline on the sync path and an abandoned one is not read further; a generation stopped
early is counted by the host's token counter; an async LLM that swallows its
cancellation is never waited for; a sync `HANG` frees its thread once abandoned."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.calls import door
from llama_index_hyde_plus.calls import llm as _llm
from llama_index_hyde_plus.calls import workers as _workers
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.testing import HANG, ScriptedLLM

Q = "Why did revenue drop?"
PASSAGE = "Enterprise renewals slipped last quarter as large accounts delayed signing."


@pytest.fixture(autouse=True)
def own_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh LLM pools, so a hung call of one test never holds another's threads."""
    monkeypatch.setattr(door, "WORKERS", _workers.LLMPools())


@pytest.fixture
def four_thread_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most 4 calls running in the process (the ``"llm"`` cap is 256)."""
    monkeypatch.setitem(_workers.CAPS, "llm", _workers.Cap(4))


def _healthy(name: str, delay: float = 0.2) -> ScriptedLLM:
    return ScriptedLLM(respond=lambda _: PASSAGE, delay=delay, model_name=name, record=False)


# -- threads that only wait hold no slot; a healthy burst waits in line -------------
def test_num_passages_calls_fit_the_thread_cap_they_use(four_thread_slots: None) -> None:
    # 4 LLM calls, 4 slots: the 3 threads that wait on them must take none
    llm = _healthy("d4-fit")
    result = HyDE(llm, num_passages=4, timeout=10, breaker=None).transform(Q)
    assert not result.fallback and result.error is None
    assert llm.sync_calls == 4


def test_a_healthy_burst_past_the_thread_cap_waits_in_line(four_thread_slots: None) -> None:
    results: list[Any] = [None] * 3
    errors: list[BaseException] = []

    def search(i: int) -> None:
        transform = HyDE(_healthy(f"d4-burst-{i}"), num_passages=4, timeout=10, breaker=None)
        try:
            results[i] = transform.transform(f"{Q} {i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []  # 12 calls, 4 slots: never raised, never failed
    assert all(not r.fallback and r.error is None for r in results)


def test_a_caller_thread_that_cannot_start_is_that_calls_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_llm.CALLERS, "submit", no_thread)
    result = HyDE(_healthy("d4-nothread", 0.0), num_passages=3, breaker=None).transform(Q)
    assert not result.fallback  # the call in the caller's thread answered
    assert "can't start new thread" in (result.error or "")


# -- streamed replies keep the deadline and stop being read once abandoned ------
class _Trickle(CustomLLM):
    """A streamed reply, one piece every ``gap`` seconds; its client's timeout (1 s,
    per read, as httpx's) may be within the budget, so it 'times itself'."""

    streams_replies: ClassVar[bool] = True
    timeout: float = 1.0
    max_retries: int = 0
    gap: float = 0.1
    pieces: int = 30
    read: list[int] = []  # one list per instance: pydantic copies the default
    closed: list[bool] = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="trickle")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text="x")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        def gen() -> Any:
            text = ""
            try:
                for _ in range(self.pieces):
                    time.sleep(self.gap)
                    text += " w"
                    self.read.append(1)
                    yield CompletionResponse(text=text, delta=" w")
            finally:
                self.closed.append(True)

        return gen()


@pytest.mark.parametrize("use_async", [False, True])
def test_a_trickling_stream_falls_back_at_the_timeout(use_async: bool) -> None:
    transform = HyDE(_Trickle(timeout=0.4), timeout=0.5, retry=NO_RETRY, breaker=None)
    started = time.monotonic()
    result = asyncio.run(transform.atransform(Q)) if use_async else transform.transform(Q)
    assert time.monotonic() - started < 1.5  # 30 x 0.1 s before: 3 s on the sync path
    assert result.fallback and "LLMTimeoutError" in (result.error or "")


@pytest.mark.parametrize("use_async", [False, True])
def test_an_abandoned_stream_is_closed_and_no_longer_read(use_async: bool) -> None:
    llm = _Trickle(gap=0.05, pieces=100, timeout=30.0)
    transform = HyDE(llm, timeout=0.3, retry=NO_RETRY, breaker=None)
    result = asyncio.run(transform.atransform(Q)) if use_async else transform.transform(Q)
    assert result.fallback
    at_return = len(llm.read)
    threading.Event().wait(0.6)  # 12 more pieces if it were still read
    assert len(llm.read) <= at_return + 1 and llm.closed == [True]


# -- a generation stopped early is counted by the host's TokenCountingHandler --------
class _Streamer(CustomLLM):
    """A streamed reply far longer than ``max_characters``, through LlamaIndex's own
    callback decorator (closing the stream ends its event with an exception)."""

    streams_replies: ClassVar[bool] = True

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="streamer")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=PASSAGE * 20)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        def gen() -> Any:
            text = ""
            for word in (PASSAGE * 20).split():
                text += " " + word
                yield CompletionResponse(text=text, delta=" " + word)

        return gen()


@pytest.mark.parametrize("use_async", [False, True])
def test_a_stopped_generation_is_counted_once_by_the_token_counter(use_async: bool) -> None:
    counter = TokenCountingHandler()
    llm = _Streamer(callback_manager=CallbackManager([counter]))
    transform = HyDE(llm, max_characters=60, retry=NO_RETRY, cache=None)
    result = asyncio.run(transform.atransform(Q)) if use_async else transform.transform(Q)
    assert result.usage.tokens_saved > 0  # it was stopped
    counted = [e for e in counter.llm_token_counts if e.total_token_count]
    assert len(counted) == 1  # LlamaIndex's own event for the closed stream counts 0
    assert counted[0].completion_token_count > 0
    assert Q in counted[0].prompt


# -- an async LLM that swallows its cancellation is abandoned at the deadline -------
class _Stubborn(CustomLLM):
    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="stubborn")

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text="x")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1.5)  # a slow cleanup that ignores the cancellation
        return CompletionResponse(text="A late reply.")


async def test_an_llm_that_swallows_its_cancellation_is_not_waited_for() -> None:
    started = time.monotonic()
    result = await HyDE(_Stubborn(), timeout=0.3, retry=NO_RETRY, breaker=None).atransform(Q)
    assert time.monotonic() - started < 1.0  # 1.8 s before, and the late reply was used
    assert result.fallback and "LLMTimeoutError" in (result.error or "")


# -- a sync HANG ends when its call is abandoned ------------------------------------
def _busy_after(pool: _workers.DaemonWorkers, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while pool.busy() and time.monotonic() < deadline:
        threading.Event().wait(0.02)
    return pool.busy()


def test_a_sync_hang_frees_its_worker_once_abandoned() -> None:
    llm = ScriptedLLM(replies=[HANG, HANG])
    transform = HyDE(llm, timeout=0.05, retry=NO_RETRY, breaker=None)
    assert transform.transform(Q).fallback
    assert _busy_after(door.pool(llm), 2.0) == 0  # an hour before


@pytest.fixture
def one_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(door, "WORKERS", _workers.LLMPools(max_busy=1))
    yield


def test_a_healthy_double_answers_after_hang_tests(one_worker: None) -> None:
    for i in range(3):  # "the provider hangs" tests, each with its own double
        assert (
            HyDE(ScriptedLLM(replies=[HANG]), timeout=0.05, breaker=None)
            .transform(f"hang {i}?")
            .fallback
        )
    _busy_after(door.pool(ScriptedLLM()), 2.0)
    result = HyDE(ScriptedLLM(replies=[PASSAGE]), timeout=5, breaker=None).transform(Q)
    assert not result.fallback
