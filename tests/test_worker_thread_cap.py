"""One cap on worker threads across every pool: calls past it wait in line without
holding a place of their pool, a slot comes back when its worker exits, idle workers
never lock another pool out, and past the cap a hung provider falls back at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from pydantic import Field

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.calls import workers

from .conftest import Q


@pytest.fixture
def few_thread_slots(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """At most 4 calls running in the process (the ``"llm"`` cap is 256), and an
    event that ends the hung calls. A cap of its own: calls of earlier tests still
    running (healthy, within their time) would otherwise count among the holders, and
    a call is refused at once only when every holder overran."""
    monkeypatch.setitem(workers.CAPS, "llm", workers.Cap(4))
    release = threading.Event()
    yield release
    release.set()


def test_hung_calls_over_many_pools_hold_at_most_the_global_thread_cap(
    few_thread_slots: threading.Event,
) -> None:
    pools = [workers.DaemonWorkers(max_busy=2, name=f"test-{i}") for i in range(4)]
    jobs = [pool.submit(lambda: few_thread_slots.wait(60)) for pool in pools for _ in range(2)]
    for _ in range(100):  # the first four run (their workers take them)
        if all(job.started for job in jobs[:4]):
            break
        threading.Event().wait(0.02)
    assert all(job.started for job in jobs[:4])
    assert not any(job.started for job in jobs[4:])  # past the cap: waiting in line
    assert pools[2].busy() == 0  # a call waiting for a slot holds no place of its pool
    for job in jobs:  # only once every running call overran, refuse at once
        job.abandon()
    with pytest.raises(workers.WorkersBusyError):
        pools[3].submit(lambda: 1)


def test_a_thread_slot_is_free_again_once_its_call_returns(
    few_thread_slots: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "MAX_IDLE", 0)  # and its thread exits
    pools = [workers.DaemonWorkers(max_busy=1) for _ in range(4)]
    jobs = [pool.submit(lambda: few_thread_slots.wait(60)) for pool in pools]
    few_thread_slots.set()
    assert all(job.done.wait(10) for job in jobs)
    assert not workers.CAPS["llm"].holders
    job = workers.DaemonWorkers().submit(lambda: 7)
    assert job.done.wait(10) and job.result() == 7


def test_idle_workers_of_healthy_pools_never_lock_another_pool_out(
    few_thread_slots: threading.Event,
) -> None:
    # four pools that each ran a call keep idle workers; a fifth still runs
    pools = [workers.DaemonWorkers(max_busy=2) for _ in range(4)]
    done = [pool.submit(lambda: 1) for pool in pools]
    assert all(job.done.wait(10) for job in done)
    assert workers.idle() >= 1 and not workers.CAPS["llm"].holders  # idle: no slot
    job = workers.DaemonWorkers().submit(lambda: 7)
    assert job.done.wait(10) and job.result() == 7


def test_a_queued_call_inherits_the_slot_of_the_call_before_it(
    few_thread_slots: threading.Event,
) -> None:
    pool = workers.DaemonWorkers(max_busy=1)
    first = pool.submit(lambda: few_thread_slots.wait(60))
    queued = pool.submit(lambda: 8)  # waits in line, holds no slot yet
    others = [workers.DaemonWorkers().submit(lambda: few_thread_slots.wait(60)) for _ in range(3)]
    past_cap = workers.DaemonWorkers().submit(lambda: 9)  # 4 running: waits for a slot
    assert not past_cap.done.wait(0.1)
    few_thread_slots.set()
    assert all(j.done.wait(10) for j in (first, queued, past_cap, *others))
    assert queued.result() == 8 and past_cap.result() == 9
    assert not workers.CAPS["llm"].holders  # every slot comes back once the calls end


def test_a_call_gives_its_slot_back_to_the_cap_it_took_it_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = workers.Cap(2)
    monkeypatch.setitem(workers.CAPS, "llm", taken)
    release = threading.Event()
    job = workers.DaemonWorkers().submit(lambda: release.wait(10))
    assert taken.holders == {job}
    monkeypatch.setitem(workers.CAPS, "llm", workers.Cap(2))  # replaced while it runs
    release.set()
    assert job.done.wait(10)
    assert not taken.holders  # its slot is free again, not leaked


class _BlockingLLM(CustomLLM):
    """An LLM with only a blocking ``complete`` (the async path runs it on a worker
    thread too), hung until ``release`` is set."""

    model_name: str = "blocking"
    release: Any = Field(default=None, exclude=True)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name=self.model_name)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.release.wait(60)
        return CompletionResponse(text="")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("use_async", [False, True])
async def test_past_the_thread_cap_a_hung_provider_falls_back_at_once_uncounted(
    few_thread_slots: threading.Event, use_async: bool
) -> None:
    transforms = [
        HyDE(
            llm=_BlockingLLM(model_name=f"tenant-{use_async}-{m}", release=few_thread_slots),
            timeout=0.05,
            retry=None,
        )
        for m in range(6)
    ]
    results = [await t.atransform_safe(Q) if use_async else t.transform_safe(Q) for t in transforms]
    assert all(r.fallback for r in results)
    assert "WorkersBusyError" in (results[-1].error or "")
    breaker = transforms[-1].breaker
    assert breaker is None or breaker.state == "closed"


def test_a_long_line_for_slots_behind_a_full_pool_never_deepens_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1,500 calls waiting for a slot behind a full pool: each freed slot goes to the
    # next in a loop (no recursion), they all run in order, and every slot comes back
    cap = workers.Cap(2)
    monkeypatch.setitem(workers.CAPS, "llm", cap)
    release = threading.Event()
    hogs = workers.DaemonWorkers(max_busy=2, name="hog")
    held = [hogs.submit(lambda: release.wait(30)) for _ in range(2)]
    pool = workers.DaemonWorkers(max_busy=1, name="p")
    jobs = [pool.submit(lambda i=i: i) for i in range(1500)]
    assert cap.waiting() == 1500
    release.set()
    deadline = time.monotonic() + 60
    for job in held + jobs:
        assert job.done.wait(max(0.0, deadline - time.monotonic()))
    assert [job.result() for job in jobs] == list(range(1500))
    time.sleep(0.2)
    assert not cap.holders and cap.waiting() == 0
