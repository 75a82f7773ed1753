"""The sync timeout without a thread hop and the call's hand-off."""

from __future__ import annotations

import threading
from typing import Any

from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.llms.callbacks import llm_completion_callback
from pydantic import Field

from llama_index_hyde_plus.calls import llm as llm_calls
from llama_index_hyde_plus.calls.workers import DaemonWorkers, Signal
from llama_index_hyde_plus.testing import ScriptedLLM


class ClientTimed(ScriptedLLM):
    """A scripted LLM with a client of its own: ``timeout`` and ``max_retries``, and
    the thread each call ran in."""

    timeout: float = Field(default=10.0)
    max_retries: int = Field(default=0)
    threads: list[str] = Field(default_factory=list, exclude=True)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.threads.append(threading.current_thread().name)
        return super().complete(prompt, formatted=formatted, **kwargs)


def test_an_llm_whose_client_times_out_in_time_is_called_in_the_callers_thread() -> None:
    llm = ClientTimed(respond=lambda p: "ok", timeout=10.0, max_retries=0)
    reply = llm_calls.complete(llm, "p", llm_calls.CallOptions(timeout=30.0))
    assert reply.text == "ok" and llm.threads == [threading.current_thread().name]


def test_a_client_that_retries_or_waits_longer_than_the_budget_gets_a_worker() -> None:
    for timeout, retries in ((10.0, 2), (60.0, 0)):
        llm = ClientTimed(respond=lambda p: "ok", timeout=timeout, max_retries=retries)
        llm_calls.complete(llm, "p", llm_calls.CallOptions(timeout=30.0))
        assert llm.threads != [threading.current_thread().name]


def test_an_llm_without_a_client_timeout_still_times_out_on_a_worker() -> None:
    from llama_index_hyde_plus.testing import HANG

    llm = ScriptedLLM([HANG])
    try:
        llm_calls.complete(llm, "p", llm_calls.CallOptions(timeout=0.2))
    except llm_calls.LLMTimeoutError:
        pass
    else:
        raise AssertionError("a hung call returned")


def test_a_signal_wakes_every_waiter_and_times_out_when_never_set() -> None:
    signal = Signal()
    assert not signal.wait(0.01) and not signal.is_set()
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(signal.wait(5))) for _ in range(3)]
    for t in waiters:
        t.start()
    signal.set()
    for t in waiters:
        t.join(5)
    assert woken == [True, True, True] and signal.wait() and signal.is_set()


def test_a_worker_job_is_done_once_it_returned() -> None:
    pool = DaemonWorkers(max_busy=2)
    job = pool.submit(lambda: 42)
    assert job.done.wait(5) and job.result() == 42
