"""Fault injection: transient and permanent errors, hangs, garbage, the breaker,
cancellation. Every search must still return results and never raise."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import openai
import pytest

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.calls.llm import LLMTimeoutError
from llama_index_hyde_plus.calls.reliability import (
    NO_RETRY,
    CircuitBreaker,
    RetryPolicy,
    is_transient,
)
from llama_index_hyde_plus.testing import HANG, ScriptedLLM, StaticRetriever

from .conftest import DOCS

Q = "Why did revenue drop?"
FAST = RetryPolicy(max_retries=2, base_delay_s=0.01, max_delay_s=0.02)


class StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


def openai_error(cls: type, status: int) -> Exception:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    return cls("provider said no", response=httpx.Response(status, request=request), body=None)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (StatusError(429), True),
        (StatusError(503), True),
        (StatusError(500), True),
        (StatusError(400), False),
        (StatusError(401), False),
        (StatusError(404), False),
        (ConnectionResetError("reset"), True),
        (ConnectionRefusedError("refused"), True),
        (ValueError("bad"), False),
        (LLMTimeoutError("slow"), False),
        (openai_error(openai.RateLimitError, 429), True),
        (openai_error(openai.InternalServerError, 500), True),
        (openai_error(openai.BadRequestError, 400), False),
        (openai_error(openai.AuthenticationError, 401), False),
        (openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1")), True),
    ],
)
def test_only_transient_errors_are_retryable(exc: Exception, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_retry_delays_are_jittered_and_capped() -> None:
    policy = RetryPolicy(max_retries=5, base_delay_s=0.1, max_delay_s=0.3)
    for attempt in range(6):
        for _ in range(50):
            assert 0 <= policy.delay(attempt) <= min(0.3, 0.1 * 2**attempt)
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


@pytest.mark.parametrize("use_async", [False, True])
async def test_transient_errors_are_retried_then_succeed(use_async: bool) -> None:
    llm = ScriptedLLM([StatusError(503), ConnectionResetError("reset"), "A passage."])
    hyde = HyDE(llm, retry=FAST)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert not result.fallback and result.hypothetical == ("A passage.",)
    assert len(llm.prompts) == 3


@pytest.mark.parametrize("use_async", [False, True])
async def test_bad_requests_are_never_retried(use_async: bool) -> None:
    llm = ScriptedLLM([StatusError(400), "never used"])
    hyde = HyDE(llm, retry=FAST)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.fallback and "400" in (result.error or "") and len(llm.prompts) == 1


def test_retries_are_bounded() -> None:
    llm = ScriptedLLM([StatusError(429)] * 5)
    result = HyDE(llm, retry=FAST).transform(Q)
    assert result.fallback and len(llm.prompts) == 3


@pytest.mark.parametrize("use_async", [False, True])
async def test_hang_falls_back_within_the_timeout(use_async: bool) -> None:
    hyde = HyDE(ScriptedLLM([HANG]), timeout=0.3, retry=FAST)
    start = time.perf_counter()
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.fallback and "LLMTimeoutError" in (result.error or "")
    assert time.perf_counter() - start < 0.3 + 1.0  # a small margin, never a hang


async def test_retries_stay_inside_the_timeout() -> None:
    llm = ScriptedLLM([StatusError(503)] * 10, delay=0.1)
    hyde = HyDE(llm, timeout=0.35, retry=RetryPolicy(max_retries=10, base_delay_s=0.05))
    start = time.perf_counter()
    result = await hyde.atransform(Q)
    assert result.fallback and time.perf_counter() - start < 0.35 + 1.0
    assert len(llm.prompts) < 10


@pytest.mark.parametrize("reply", ["", "   ", "!!! ### ???", "1.\n2.\n3."])
def test_empty_or_garbage_list_replies_fall_back(reply: str) -> None:
    result = MultiQuery(ScriptedLLM([reply])).transform(Q)
    assert result.fallback and result.search_queries == (Q,)


def test_breaker_opens_after_k_failures_skips_the_llm_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llama_index_hyde_plus")
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=60, name="hyde")
    llm = ScriptedLLM([RuntimeError("down")] * 3)
    hyde = HyDE(llm, retry=NO_RETRY, breaker=breaker)
    for _ in range(3):
        assert hyde.transform(Q).fallback
    assert breaker.state == "open" and len(llm.prompts) == 3
    for _ in range(5):
        result = hyde.transform(Q)
        assert result.fallback and "CircuitOpenError" in (result.error or "")
    assert len(llm.prompts) == 3  # the LLM was not called while open
    opened = [r for r in caplog.records if "is now open" in r.getMessage()]
    assert len(opened) == 1
    warnings = [
        r
        for r in caplog.records
        if "original query" in r.getMessage() and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 3  # one per real failure, none per skipped call


def test_breaker_probes_after_cooldown_and_closes_on_success() -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=0.2)
    llm = ScriptedLLM([RuntimeError("down"), RuntimeError("still down"), "A passage."])
    hyde = HyDE(llm, retry=NO_RETRY, breaker=breaker)
    assert hyde.transform(Q).fallback and breaker.state == "open"
    time.sleep(0.25)
    assert breaker.state == "half-open"
    assert hyde.transform(Q).fallback and breaker.state == "open"  # failed probe
    time.sleep(0.25)
    assert not hyde.transform(Q).fallback and breaker.state == "closed"


def test_half_open_lets_one_probe_through_at_a_time() -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=0.05)
    breaker.settle("call", "failure")
    time.sleep(0.06)
    probe = breaker.acquire()
    assert probe == "probe"
    assert breaker.acquire() is None
    breaker.settle(probe, "success")
    assert breaker.state == "closed" and breaker.acquire() == "call"


async def test_hanging_provider_opens_the_breaker_and_searches_get_fast() -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=60)
    llm = ScriptedLLM([HANG, HANG, HANG, HANG])
    retriever = TransformRetriever(
        StaticRetriever(DOCS, default=["pto"]),
        HyDE(llm, timeout=1.0, retry=NO_RETRY, breaker=breaker),
    )
    for _ in range(2):
        assert (await retriever.asearch(Q)).nodes
    assert breaker.state == "open"
    start = time.perf_counter()
    result = await retriever.asearch(Q)
    assert result.nodes and result.transform.fallback
    assert "circuit breaker" in (result.transform.error or "")
    assert time.perf_counter() - start < 0.9  # no waiting out the 1 s timeout


@pytest.mark.parametrize("use_async", [False, True])
async def test_every_fault_still_returns_results(use_async: bool) -> None:
    faults = [
        StatusError(500),
        StatusError(400),
        ConnectionResetError("x"),
        HANG,
        "",
        "!!!",
        RuntimeError("boom"),
        TimeoutError("t"),
        KeyError("k"),
    ]
    base = StaticRetriever(DOCS, default=["pto", "hiring"])
    for fault in faults:
        llm = ScriptedLLM([fault] * 3)
        retriever = TransformRetriever(base, MultiQuery(llm, timeout=0.2, retry=FAST))
        result = await retriever.asearch(Q) if use_async else retriever.search(Q)
        assert [n.node.node_id for n in result.nodes] == ["pto", "hiring"], fault


async def test_cancelling_asearch_mid_flight_leaves_nothing_behind() -> None:
    base = StaticRetriever(DOCS, default=["pto"], delay=0.05)
    retriever = TransformRetriever(base, HyDE(ScriptedLLM([HANG, "A passage."]), timeout=None))
    task = asyncio.create_task(retriever.asearch(Q))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()
    result = await retriever.asearch(Q)  # the retriever still works
    assert result.transform.hypothetical == ("A passage.",)


async def test_cancelling_during_the_fan_out() -> None:
    base = StaticRetriever(DOCS, default=["pto"], delay=5)
    retriever = TransformRetriever(base, MultiQuery(ScriptedLLM(["1. a1\n2. b2"]), n=2))
    task = asyncio.create_task(retriever.asearch(Q))
    await asyncio.sleep(0.1)
    assert base.active == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.01)
    assert base.active == 0  # every sub-search was cancelled too
