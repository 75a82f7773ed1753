"""Queries in flight during an evaluation (`evaluation.pacing.Pacer`): chosen from the
local model's measured speed, fewer when calls slow down or time out, more again when
they keep up; a query's deadline starts once it is let in."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from llama_index.core.base.llms.types import CompletionResponse
from pydantic import PrivateAttr

from llama_index_hyde_plus import HyDE, TransformRetriever
from llama_index_hyde_plus.evaluation.pacing import Pacer, Ticket, planned_width, slots
from llama_index_hyde_plus.evaluation.session import _run_one
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever


def _local(rate: float | None, max_tokens: int = 160) -> Any:
    return SimpleNamespace(is_local=True, tokens_per_s=rate, max_tokens=max_tokens)


@pytest.mark.parametrize(
    ("llm", "width"),
    [
        (_local(75.0), 4),  # an idle machine: as many as asked
        (_local(16.0), 2),  # 20 s x 16 tokens/s / 160 tokens
        (_local(4.0), 1),  # a busy machine: one at a time
        (_local(0.1), 1),  # never fewer than one
        (_local(None), 4),  # no speed measured: as asked
        (SimpleNamespace(is_local=False, tokens_per_s=1.0, max_tokens=160), 4),  # remote
    ],
)
def test_the_queries_in_flight_follow_the_measured_speed(llm: Any, width: int) -> None:
    assert planned_width(llm, 4) == width


@pytest.mark.parametrize(
    ("n_parallel", "local", "most"),
    [(8, True, 8), (4, True, 4), (2, True, 2), (None, True, 16), (True, True, 16), (2, False, 16)],
)
def test_a_local_model_never_gets_more_queries_than_its_slots(
    n_parallel: Any, local: bool, most: int
) -> None:
    llm = SimpleNamespace(is_local=local, n_parallel=n_parallel, tokens_per_s=None)
    assert slots(llm, 16) == most
    pacer = Pacer.for_transform(SimpleNamespace(llm=llm, timeout=30.0), 16)
    assert (pacer.limit, pacer.width, pacer.timeout) == (most, most, 30.0)


def test_a_transform_whose_model_cannot_be_read_gets_the_width_asked() -> None:
    class Broken:
        @property
        def llm(self) -> Any:
            raise RuntimeError("no Settings.llm")

    pacer = Pacer.for_transform(Broken(), 3)
    assert (pacer.limit, pacer.width, pacer.timeout) == (3, 3, None)


def test_a_timeout_halves_the_width_once_per_crowded_moment() -> None:
    pacer = Pacer(limit=8, timeout=10.0)
    crowded = [0.0, 0.1, 0.2]  # three queries that started together
    for started in crowded:
        pacer.record(Ticket(started, 8), 10.0, timed_out=True)
    assert pacer.width == 4 and len(pacer.changes) == 1
    assert pacer.changes[0] == "8 -> 4 in flight: a call timed out"


def test_a_slow_query_takes_one_off_and_calls_that_keep_up_add_one_back() -> None:
    pacer = Pacer(limit=3, timeout=10.0)
    pacer.record(Ticket(float("inf"), 2), 6.0, timed_out=False)  # over half its timeout
    assert pacer.width == 2 and pacer.note() == "2 in flight"
    for _ in range(3):
        pacer.record(Ticket(float("inf"), 2), 1.0, timed_out=False)
    assert pacer.width == 2  # four in a row needed at width 2
    pacer.record(Ticket(float("inf"), 2), 1.0, timed_out=False)
    assert pacer.width == 3 and pacer.note() == ""
    assert pacer.changes[-1] == "2 -> 3 in flight: calls kept up"


def test_the_width_never_drops_below_one() -> None:
    pacer = Pacer(limit=2, width=1, timeout=1.0)
    pacer.record(Ticket(float("inf"), 2), 5.0, timed_out=True)
    assert pacer.width == 1 and pacer.changes == []


def test_narrowing_re_measures_and_budgets_the_calls_by_a_speed_that_fell() -> None:
    llm = SimpleNamespace(is_local=True, tokens_per_s=10.0)
    pacer = Pacer(limit=4, width=4, timeout=20.0, llm=llm, timeout_of=lambda: 99.0)
    for _ in range(3):  # 4 in flight, 16 tokens in 4 s each: 16 tokens/s together
        pacer.record(Ticket(0.0, 4), 4.0, timed_out=False, tokens=16)
    pacer.record(Ticket(0.0, 4), 20.0, timed_out=True)
    assert llm.tokens_per_s == 10.0  # 16 x 0.5 is over half the budgeted 10: kept
    assert pacer.changes == ["4 -> 2 in flight: a call timed out"]
    for _ in range(8):  # then alone, 4 tokens in 8 s: 0.5 tokens/s
        pacer.record(Ticket(float("inf"), 1), 8.0, timed_out=False, tokens=4)
    pacer.record(Ticket(float("inf"), 1), 20.0, timed_out=True)
    assert llm.tokens_per_s == 2.5 and pacer.timeout == 99.0  # a quarter at a time
    assert pacer.changes[-2] == "re-measured: 0.5 tokens/s; calls now get 99 s"
    pacer.record(Ticket(float("inf"), 1), 20.0, timed_out=True)
    assert llm.tokens_per_s == 0.625


def test_a_remote_model_is_never_re_budgeted() -> None:
    llm = SimpleNamespace(is_local=False, tokens_per_s=10.0)
    pacer = Pacer(limit=2, timeout=10.0, llm=llm)
    pacer.record(Ticket(0.0, 2), 9.0, timed_out=False, tokens=1)
    assert llm.tokens_per_s == 10.0 and pacer.width == 1


@pytest.mark.parametrize("limit", [0, -3])
def test_a_pacer_needs_room_for_one(limit: int) -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Pacer(limit=limit)


async def test_the_gate_holds_its_width_and_a_cancelled_waiter_takes_no_room() -> None:
    pacer = Pacer(limit=2)
    inside = 0
    most = 0
    release = asyncio.Event()

    async def query() -> None:
        nonlocal inside, most
        async with pacer:
            inside += 1
            most = max(most, inside)
            await release.wait()
            inside -= 1

    tasks = [asyncio.create_task(query()) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert (inside, most) == (2, 2)
    tasks[4].cancel()  # waiting for room: cancelled cleanly
    await asyncio.sleep(0)
    release.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[4], asyncio.CancelledError)
    assert most == 2 and inside == 0 and pacer._in_flight == 0


class _Crowded(ScriptedLLM):
    """A model whose calls share one speed (a CPU that one generation fills): a reply
    is ``work_s`` seconds of the whole speed, and the calls in flight split it."""

    work_s: float = 0.12
    _inside: int = PrivateAttr(default=0)

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self._inside += 1
        done = 0.0
        try:
            while done < self.work_s:
                await asyncio.sleep(0.005)
                done += 0.005 / self._inside
            return CompletionResponse(text="Revenue fell as renewals slipped.")
        finally:
            self._inside -= 1


async def test_an_evaluation_narrows_when_its_calls_time_out_and_finishes_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hyde = HyDE(_Crowded(), timeout=0.3)
    retriever = TransformRetriever(StaticRetriever({"a": "renewals"}, default=["a"]), hyde)
    queries = {f"q{i}": f"question {i}" for i in range(12)}
    seen: list[str] = []
    with caplog.at_level(logging.INFO, logger="llama_index_hyde_plus.evaluation.session"):
        _, records = await _run_one(
            retriever,
            queries,
            4,
            lambda n, fell_back=0, note="": seen.append(note),
        )
    fell_back = sum(r.fallback for r in records)
    assert len(records) == 12 and all(r.timed_out for r in records if r.fallback)
    # 4 together time out (0.48 s > 0.3 s): 2 in flight, slow (0.24 s): 1, and then one
    # at a time (0.12 s), never widened again (two would be slow). A fixed 4 in flight
    # times out on all 12.
    assert 4 <= fell_back <= 6, [(r.qid, r.fallback) for r in records]
    assert "4 -> 2 in flight: a call timed out" in caplog.text
    assert "2 -> 1 in flight: a query took" in caplog.text
    assert seen[-1] == "1 in flight"


async def test_a_fixed_width_would_time_out_on_every_query() -> None:
    """The control for the test above: the same model with its 4 queries always
    crowded (every query let in at once) falls back on all of them."""
    hyde = HyDE(_Crowded(), timeout=0.3)
    retriever = TransformRetriever(StaticRetriever({"a": "renewals"}, default=["a"]), hyde)
    results = await asyncio.gather(*(retriever.asearch(f"question {i}") for i in range(4)))
    assert all(r.transform.fallback for r in results)


@pytest.mark.parametrize(
    ("error", "out_of_time"),
    [
        ("LLMTimeoutError: LLM did not answer within 40s", True),
        ("QueuedTooLongError: the call waited 39s of its 40s for a worker thread", True),
        ("ModelBusyError: model busy: all 4 slots of the local model stayed busy", True),
        ("UnusableReplyError: no query could be parsed from the reply", False),
        ("ConnectionError: refused", False),
    ],
)
def test_a_fallback_for_a_busy_local_model_counts_as_out_of_time(
    error: str, out_of_time: bool
) -> None:
    from llama_index_hyde_plus.evaluation.session import ran_out_of_time
    from llama_index_hyde_plus.transforms.base import TransformResult

    result = TransformResult.fallback_for("q", "hyde", error)
    assert ran_out_of_time(result) is out_of_time
