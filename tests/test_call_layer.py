"""The LLM call layer: the breaker's half-open slot, single-flight cancellation, the
LLM worker pool, what the breaker counts, non-Exception errors, timeout accounting and
provider token counts."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from pydantic import PrivateAttr

from llama_index_hyde_plus import HyDE, TransformRetriever
from llama_index_hyde_plus.calls import door
from llama_index_hyde_plus.calls import llm as _llm
from llama_index_hyde_plus.calls.llm import CallOptions, LLMTimeoutError, acomplete, complete
from llama_index_hyde_plus.calls.reliability import (
    NO_RETRY,
    CircuitBreaker,
    CircuitOpenError,
    RetryPolicy,
    is_transient,
)
from llama_index_hyde_plus.calls.workers import DaemonWorkers, LLMPools
from llama_index_hyde_plus.testing import HANG, ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue drop?"
FAST = RetryPolicy(max_retries=2, base_delay_s=0.01, max_delay_s=0.02)


class StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class GeventTimeout(BaseException):
    """Like ``gevent.Timeout``: a BaseException a blocking provider may raise."""


class StuckLLM(CustomLLM):
    """Only a blocking ``complete``, which never answers until ``release()`` (then it
    raises): a hung provider whose calls overrun every timeout."""

    _release: Any = PrivateAttr(default_factory=threading.Event)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _calls: int = PrivateAttr(default=0)
    _active: int = PrivateAttr(default=0)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="stuck")

    @property
    def calls(self) -> int:
        return self._calls

    @property
    def active(self) -> int:
        return self._active

    def release(self) -> None:
        self._release.set()
        deadline = time.monotonic() + 10
        while self._active and time.monotonic() < deadline:
            time.sleep(0.01)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        with self._lock:
            self._calls += 1
            self._active += 1
        try:
            self._release.wait(60)
            raise RuntimeError("released")
        finally:
            with self._lock:
                self._active -= 1

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.fixture
def stuck() -> Iterator[StuckLLM]:
    llm = StuckLLM()
    try:
        yield llm
    finally:
        llm.release()


@pytest.fixture
def own_pool(monkeypatch: pytest.MonkeyPatch) -> LLMPools:
    """Fresh LLM worker pools with the default cap, so hung calls of one test never
    take the workers of another."""
    pools = LLMPools()
    monkeypatch.setattr(door, "WORKERS", pools)
    return pools


def opened(breaker: CircuitBreaker) -> CircuitBreaker:
    """``breaker`` opened by one failure, its cooldown already over (half-open)."""
    breaker.settle("call", "failure")  # one failed call
    time.sleep(breaker.cooldown_s + 0.02)
    assert breaker.state == "half-open"
    return breaker


# -- 1. the half-open probe is a slot that is always released ------------------------


@pytest.mark.parametrize("timeout", [None, 5.0])  # in the caller's thread / in a worker
def test_an_interrupted_probe_frees_the_half_open_slot_sync(timeout: float | None) -> None:
    breaker = opened(CircuitBreaker(failure_threshold=1, cooldown_s=0.05))
    llm = ScriptedLLM([KeyboardInterrupt(), "A passage."])
    hyde = HyDE(llm, timeout=timeout, retry=NO_RETRY, breaker=breaker)
    with pytest.raises(KeyboardInterrupt):
        hyde.transform(Q)
    assert breaker.state == "half-open"  # not counted
    result = hyde.transform(Q)  # the next call probes
    assert not result.fallback, result.error
    assert breaker.state == "closed" and len(llm.prompts) == 2


def test_a_probe_interrupted_in_a_thread_frees_the_half_open_slot() -> None:
    breaker = opened(CircuitBreaker(failure_threshold=1, cooldown_s=0.05))
    llm = ScriptedLLM([SystemExit(3), "A passage."])
    hyde = HyDE(llm, retry=NO_RETRY, breaker=breaker)
    raised: list[BaseException] = []

    def probe() -> None:
        try:
            hyde.transform(Q)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    assert [type(e) for e in raised] == [SystemExit]
    assert not hyde.transform(Q).fallback and breaker.state == "closed"


async def test_a_cancelled_probe_frees_the_half_open_slot_async() -> None:
    breaker = opened(CircuitBreaker(failure_threshold=1, cooldown_s=0.05))
    llm = ScriptedLLM([HANG, HANG, "A passage."])
    hyde = HyDE(llm, timeout=None, retry=NO_RETRY, breaker=breaker)
    task = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.state == "half-open"
    with pytest.raises(asyncio.TimeoutError):  # a caller's own deadline: a cancellation too
        await asyncio.wait_for(hyde.atransform(Q), 0.05)
    assert breaker.state == "half-open"
    result = await hyde.atransform(Q)
    assert not result.fallback, result.error
    assert breaker.state == "closed" and len(llm.prompts) == 3


def test_a_released_permit_lets_the_next_call_probe() -> None:
    breaker = opened(CircuitBreaker(failure_threshold=1, cooldown_s=0.05))
    permit = breaker.acquire()
    assert permit == "probe" and breaker.acquire() is None
    breaker.settle(permit, "released")
    assert breaker.state == "half-open" and breaker.consecutive_failures == 1
    assert breaker.acquire() == "probe"


def test_a_late_call_failing_does_not_settle_the_probe() -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=0.05)
    early = breaker.acquire()
    breaker.settle(breaker.acquire(), "failure")  # another call opens it
    time.sleep(0.07)
    probe = breaker.acquire()
    breaker.settle(early, "failure")  # the early call ends during the probe
    assert probe == "probe" and breaker.state == "half-open" and breaker.acquire() is None
    breaker.settle(probe, "success")
    assert breaker.state == "closed"


# -- 3. blocking LLM calls run on a bounded pool of their own -------------------------


async def test_hung_blocking_calls_leave_the_default_executor_free(
    stuck: StuckLLM, own_pool: LLMPools
) -> None:
    hyde = HyDE(stuck, timeout=0.05, retry=NO_RETRY, breaker=None)
    results = await asyncio.gather(*(hyde.atransform(f"{Q} {i}") for i in range(40)))
    assert all(r.fallback for r in results)
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["pto"]), HyDE(stuck, timeout=0.3, breaker=None)
    )
    found = await asyncio.wait_for(retriever.asearch(Q), 3)
    assert found.nodes and found.transform.fallback


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_exhausted_llm_pool_falls_back_at_once(
    stuck: StuckLLM, monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    monkeypatch.setattr(door, "WORKERS", LLMPools(max_busy=2))
    hyde = HyDE(stuck, timeout=0.05, retry=FAST, breaker=None)
    for _ in range(2):
        result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
        assert "LLMTimeoutError" in (result.error or "")
    start = time.monotonic()
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.fallback and "all 2 worker threads are busy" in (result.error or "")
    assert "calls that overran their timeout" in (result.error or "")
    assert time.monotonic() - start < 0.05 + 1.0 and stuck.calls == 2  # not even tried


def test_a_full_pool_queues_healthy_calls_and_refuses_only_behind_overrun_ones() -> None:
    pool = DaemonWorkers(max_busy=1)
    gate = threading.Event()
    first = pool.submit(gate.wait)
    queued = pool.submit(lambda: "queued")  # the running call is healthy: wait in line
    assert pool.queued() == 1 and not queued.done.wait(0.1)
    gate.set()
    assert first.done.wait(5) and queued.done.wait(5) and queued.result() == "queued"
    hang = threading.Event()
    stuck = pool.submit(hang.wait)
    given_up = pool.submit(lambda: "never")  # its caller stops waiting before it starts
    given_up.abandon()
    stuck.abandon()  # the running call overran: a new call is refused at once
    with pytest.raises(RuntimeError, match="all 1 worker threads are busy with calls"):
        pool.submit(lambda: None)
    hang.set()
    assert stuck.done.wait(5)
    deadline = time.monotonic() + 5
    while pool.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not given_up.done.is_set()  # abandoned in line: never ran
    second = pool.submit(lambda: "ok")
    assert second.done.wait(5) and second.result() == "ok"


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hung_provider_holds_only_its_own_worker_threads(
    stuck: StuckLLM, monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    monkeypatch.setattr(door, "WORKERS", LLMPools(max_busy=2))
    hung = HyDE(stuck, timeout=0.05, retry=NO_RETRY, breaker=None)
    for i in range(3):  # both of its threads overrun; the third call is refused at once
        await hung.atransform(f"{Q} {i}") if use_async else hung.transform(f"{Q} {i}")
    healthy_llm = ScriptedLLM(respond=lambda prompt: "Renewals slipped.")
    monkeypatch.setattr(_llm, "has_native_async", lambda model: False)  # the blocking path
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=60)
    healthy = HyDE(healthy_llm, timeout=5, retry=NO_RETRY, breaker=breaker)
    for i in range(3):
        result = await healthy.atransform(f"{Q} {i}") if use_async else healthy.transform(Q)
        assert not result.fallback, result.error
    assert breaker.state == "closed"


def test_a_provider_is_named_by_a_property_an_extra_field_or_a_proxy_as_before() -> None:
    """The per-class shortcut in `provider_key` (no failed lookup per call on a plain
    pydantic LLM) still reads every place an endpoint or model can live: a property,
    an attribute set on the instance, an extra field, a proxy's ``__getattr__``."""
    from pydantic import ConfigDict

    from llama_index_hyde_plus.calls.workers import provider_key

    class ByProperty(ScriptedLLM):
        @property
        def api_base(self) -> str:
            return "http://by-property:1"

    class WithExtras(ScriptedLLM):
        model_config = ConfigDict(extra="allow")

    class Proxy:
        def __getattr__(self, name: str) -> str:
            if name == "base_url":
                return "http://proxied:2"
            raise AttributeError(name)

    assert provider_key(ByProperty())[-1] == "api_base=http://by-property:1"
    assert provider_key(WithExtras(endpoint="http://extra:3"))[-1] == "endpoint=http://extra:3"
    assert provider_key(Proxy())[-1] == "base_url=http://proxied:2"
    plain = ScriptedLLM(model_name="m")
    assert provider_key(plain)[-1] == "model_name=m"
    object.__setattr__(plain, "base_url", "http://set-later:4")  # on the instance
    assert provider_key(plain)[-1] == "base_url=http://set-later:4"


def test_llm_objects_of_one_provider_share_a_pool_and_idle_workers_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llama_index_hyde_plus.calls import workers as _workers

    pools = LLMPools()
    pool = pools.for_llm(ScriptedLLM(model_name="a"))
    assert pools.for_llm(ScriptedLLM(model_name="a")) is pool  # built per request: one pool
    assert pools.for_llm(ScriptedLLM(model_name="b")) is not pool and len(pools) == 2
    monkeypatch.setattr(_workers, "IDLE_EXIT_S", 0.05)
    ran: set[threading.Thread] = set()
    jobs = [pool.submit(lambda: (ran.add(threading.current_thread()), time.sleep(0.05)))]
    jobs += [pool.submit(lambda: time.sleep(0.05)) for _ in range(3)]
    assert all(job.done.wait(5) for job in jobs)
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in ran) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.is_alive() for t in ran)  # the idle worker exited
    assert pool.submit(lambda: "again").done.wait(5)  # and new ones start when needed


def test_more_blocking_calls_than_workers_all_answer_within_their_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(door, "WORKERS", LLMPools(max_busy=2))
    llm = ScriptedLLM(respond=lambda prompt: "Renewals slipped.", delay=0.05)
    hyde = HyDE(llm, timeout=10, retry=NO_RETRY, breaker=None)

    async def many() -> list[Any]:
        return list(await asyncio.gather(*(hyde.atransform(f"{Q} {i}") for i in range(12))))

    # ScriptedLLM has native async: force the blocking path the pool serves
    monkeypatch.setattr(_llm, "has_native_async", lambda model: False)
    results = asyncio.run(many())
    assert all(not r.fallback for r in results)


# -- 8. what the breaker counts --------------------------------------------------------


@pytest.mark.parametrize("status", [400, 403, 404, 409, 413, 422, 425])
@pytest.mark.parametrize("use_async", [False, True])
async def test_bad_requests_do_not_open_the_breaker(status: int, use_async: bool) -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=60)
    llm = ScriptedLLM(respond=None)
    llm.add_replies(*[StatusError(status)] * 15)
    hyde = HyDE(llm, retry=FAST, breaker=breaker)
    for _ in range(5):
        result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
        assert result.fallback and str(status) in (result.error or "")
    assert breaker.state == "closed" and breaker.consecutive_failures == 0


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_provider_health_errors_open_the_breaker(status: int) -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=60)
    hyde = HyDE(ScriptedLLM([StatusError(status)] * 2), retry=NO_RETRY, breaker=breaker)
    for _ in range(2):
        assert hyde.transform(Q).fallback
    assert breaker.state == "open"


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_call_counts_once_whatever_its_retries(use_async: bool) -> None:
    breaker = CircuitBreaker(failure_threshold=5, cooldown_s=60)
    llm = ScriptedLLM([StatusError(503)] * 6)
    hyde = HyDE(llm, retry=FAST, breaker=breaker)
    for _ in range(2):
        result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
        assert result.fallback
    assert len(llm.prompts) == 6  # 2 calls x 3 attempts
    assert breaker.state == "closed" and breaker.consecutive_failures == 2


@pytest.mark.parametrize("use_async", [False, True])
async def test_our_timeout_counts_and_a_skipped_call_does_not(use_async: bool) -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=60)
    hyde = HyDE(ScriptedLLM([HANG]), timeout=0.05, retry=NO_RETRY, breaker=breaker)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert "LLMTimeoutError" in (result.error or "") and breaker.state == "open"
    for _ in range(3):
        result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
        assert "CircuitOpenError" in (result.error or "")
    assert breaker.consecutive_failures == 1


def test_a_success_after_retries_resets_the_count_once() -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=60)
    llm = ScriptedLLM([StatusError(503), StatusError(503), "A passage.", StatusError(503)])
    hyde = HyDE(llm, retry=FAST, breaker=breaker)
    assert not hyde.transform(Q).fallback
    assert breaker.consecutive_failures == 0
    assert HyDE(llm, retry=NO_RETRY, breaker=breaker).transform(Q).fallback
    assert breaker.state == "closed" and breaker.consecutive_failures == 1


# -- 11. non-Exception errors from the LLM -------------------------------------------


class OnlyBlocking(CustomLLM):
    """A blocking-only LLM that raises ``error`` once, then answers."""

    _errors: list[BaseException] = PrivateAttr(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="only-blocking")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        if self._errors:
            raise self._errors.pop(0)
        return CompletionResponse(text="A passage.")

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


def raising(error: BaseException) -> OnlyBlocking:
    llm = OnlyBlocking()
    llm._errors.append(error)
    return llm


@pytest.mark.parametrize("make", [GeventTimeout, asyncio.CancelledError])
@pytest.mark.parametrize("timeout", [None, 5.0])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_base_exception_from_a_blocking_llm_is_a_failed_call(
    make: type[BaseException], timeout: float | None, use_async: bool
) -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=60)
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["pto"]),
        HyDE(raising(make()), timeout=timeout, retry=NO_RETRY, breaker=breaker),
    )
    found = await retriever.asearch(Q) if use_async else retriever.search(Q)
    assert found.nodes and found.transform.fallback
    assert make.__name__ in (found.transform.error or "")
    assert breaker.state == "open"  # a provider failure counts


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="3.10 cannot tell whose cancellation it is: propagates"
)
async def test_a_cancelled_error_from_a_native_async_llm_is_a_failed_call() -> None:
    hyde = HyDE(ScriptedLLM([asyncio.CancelledError(), "A passage."]), retry=NO_RETRY)
    result = await hyde.atransform(Q)  # our task is not being cancelled
    assert result.fallback and "CancelledError" in (result.error or "")
    assert not (await hyde.atransform(Q)).fallback


@pytest.mark.parametrize("make", [KeyboardInterrupt, SystemExit, GeneratorExit])
@pytest.mark.parametrize("use_async", [False, True])
async def test_interrupts_and_exits_still_propagate(
    make: type[BaseException], use_async: bool
) -> None:
    hyde = HyDE(raising(make()), timeout=5.0, retry=NO_RETRY)
    with pytest.raises(make):
        await hyde.atransform(Q) if use_async else hyde.transform(Q)
    with pytest.raises(make):
        complete(raising(make()), "p")


async def test_a_multi_call_transform_hides_a_provider_cancelled_error() -> None:
    llm = ScriptedLLM([asyncio.CancelledError(), "One.", "Two."])
    result = await HyDE(llm, num_passages=3, retry=NO_RETRY).atransform(Q)
    assert not result.fallback and len(result.hypothetical) == 2
    assert "CancelledError" in (result.error or "")


def test_a_failed_call_is_reported_before_the_calls_the_breaker_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hyde = HyDE(ScriptedLLM(), num_passages=2)
    skipped = CircuitOpenError("circuit breaker for hyde is open; not calling the LLM")
    result = hyde._finish(Q, [skipped, RuntimeError("down")], time.perf_counter())
    assert result.fallback and result.error == "RuntimeError: down"
    assert any(r.levelno == logging.WARNING for r in caplog.records)  # not hushed


# -- 14. timeout accounting ------------------------------------------------------------


def test_the_timeout_bounds_all_passages_on_the_sync_path(
    stuck: StuckLLM, own_pool: LLMPools
) -> None:
    hyde = HyDE(stuck, num_passages=4, timeout=1.0, retry=NO_RETRY, breaker=None)
    start = time.monotonic()
    result = hyde.transform(Q)
    assert result.fallback and "LLMTimeoutError" in (result.error or "")
    assert time.monotonic() - start < 3.0  # one deadline, not 4 x 1 s
    assert stuck.calls == 4


def test_sync_passages_run_together_and_keep_what_answered() -> None:
    llm = ScriptedLLM(["One.", HANG, "Three.", "Four."])
    result = HyDE(llm, num_passages=4, timeout=0.5, retry=NO_RETRY).transform(Q)
    assert not result.fallback and sorted(result.hypothetical) == ["Four.", "One.", "Three."]
    assert "LLMTimeoutError" in (result.error or "")


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_providers_own_timeout_is_reported_as_its_own(use_async: bool) -> None:
    llm = ScriptedLLM([TimeoutError("provider read timed out")])
    hyde = HyDE(llm, timeout=30, retry=NO_RETRY)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.fallback
    assert result.error == "TimeoutError: provider read timed out"


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_providers_own_timeout_is_retried(use_async: bool) -> None:
    llm = ScriptedLLM([TimeoutError("provider read timed out"), "A passage."])
    hyde = HyDE(llm, timeout=30, retry=FAST)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert not result.fallback and len(llm.prompts) == 2
    assert is_transient(TimeoutError("x")) and not is_transient(LLMTimeoutError("ours"))


async def test_our_deadline_is_reported_only_when_it_expired() -> None:
    with pytest.raises(LLMTimeoutError, match=r"within 0\.05s"):
        await acomplete(ScriptedLLM([HANG]), "p", CallOptions(timeout=0.05))
    with pytest.raises(TimeoutError, match="provider") as info:
        await acomplete(ScriptedLLM([TimeoutError("provider")]), "p", CallOptions(timeout=5))
    assert not isinstance(info.value, LLMTimeoutError)


async def test_the_deadline_of_a_native_call_tells_the_two_timeouts_apart() -> None:
    once = CallOptions(timeout=0.05, retry=NO_RETRY)
    with pytest.raises(LLMTimeoutError):
        await acomplete(ScriptedLLM([HANG]), "p", once)
    with pytest.raises(TimeoutError, match="provider") as info:
        await acomplete(ScriptedLLM([TimeoutError("provider")]), "p", replace(once, timeout=5))
    assert not isinstance(info.value, LLMTimeoutError)
    reply = await acomplete(ScriptedLLM(["ok"]), "p", replace(once, timeout=5))
    assert reply.text == "ok"
    task = asyncio.create_task(acomplete(ScriptedLLM([HANG]), "p", replace(once, timeout=5)))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_call_that_never_left_the_line_does_not_count_against_the_provider(
    monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    monkeypatch.setattr(door, "WORKERS", LLMPools(max_busy=1))
    monkeypatch.setattr(_llm, "has_native_async", lambda model: False)  # the blocking path
    llm = ScriptedLLM(respond=lambda prompt: "Renewals slipped.", delay=0.6)
    busy = HyDE(llm, timeout=5, retry=NO_RETRY, breaker=None)
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=60)
    waiting = HyDE(llm, timeout=0.2, retry=NO_RETRY, breaker=breaker)

    if use_async:
        first = asyncio.ensure_future(busy.atransform(Q))
        await asyncio.sleep(0.1)  # the one worker is taken
        result = await waiting.atransform(f"{Q} again")
        await first
    else:
        holder = threading.Thread(target=busy.transform, args=(Q,))
        holder.start()
        time.sleep(0.1)
        result = waiting.transform(f"{Q} again")
        holder.join()
    assert result.fallback and "QueuedTooLongError" in (result.error or "")
    assert breaker.state == "closed"  # the provider was never asked: not its failure


async def test_calls_that_spent_most_of_their_time_in_line_do_not_open_the_breaker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(door, "WORKERS", LLMPools(max_busy=2))
    monkeypatch.setattr(_llm, "has_native_async", lambda model: False)  # the blocking path
    llm = ScriptedLLM(respond=lambda prompt: "Renewals slipped.", delay=0.2)  # a healthy 0.2 s
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=60)
    hyde = HyDE(llm, timeout=0.5, retry=NO_RETRY, breaker=breaker)
    results = await asyncio.gather(*(hyde.atransform(f"{Q} {i}") for i in range(8)))
    late = [r for r in results if r.fallback]
    assert late and all("QueuedTooLongError" in (r.error or "") for r in late)
    assert breaker.state == "closed"  # a provider answering in 0.2 s is not down
