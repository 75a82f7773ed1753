from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.llms.openai import OpenAI
from pydantic import PrivateAttr

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.calls.llm import (
    CallOptions,
    LLMTimeoutError,
    acomplete,
    complete,
    has_native_async,
)
from llama_index_hyde_plus.calls.reliability import RetryPolicy
from llama_index_hyde_plus.testing import HANG, ScriptedLLM
from llama_index_hyde_plus.usage import provider_token_counts, usage_for_call

from .conftest import LoopTicks
from .openai_stub import openai_stub


def install_counter(monkeypatch: pytest.MonkeyPatch) -> TokenCountingHandler:
    handler = TokenCountingHandler()
    monkeypatch.setattr(Settings, "_callback_manager", CallbackManager([handler]))
    return handler


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> TokenCountingHandler:
    return install_counter(monkeypatch)


def llm_tokens(handler: TokenCountingHandler) -> tuple[int, int]:
    return handler.prompt_llm_token_count, handler.completion_llm_token_count


@pytest.mark.parametrize("use_async", [False, True])
async def test_token_counting_handler_on_settings_sees_exactly_the_transform_tokens(
    faiss_index: VectorStoreIndex, monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    # The LLM is built before the handler is installed (an app's module-level LLM), so
    # its own callback manager lacks the handler: LlamaIndex alone would miss the call.
    llm = ScriptedLLM(["1. staff hired\n2. offices moved"])
    counter = install_counter(monkeypatch)
    assert not llm.callback_manager.handlers
    retriever = TransformRetriever(faiss_index.as_retriever(), MultiQuery(llm, n=2))
    result = await retriever.asearch("growth") if use_async else retriever.search("growth")
    usage = result.transform.usage
    assert usage.input_tokens > 0
    assert llm_tokens(counter) == (usage.input_tokens, usage.output_tokens)
    assert len(counter.llm_token_counts) == 1


def test_an_llm_already_reporting_to_the_handler_is_not_counted_twice(
    counter: TokenCountingHandler,
) -> None:
    llm = ScriptedLLM(["passage."])  # built after the handler: LlamaIndex wires it in
    assert counter in llm.callback_manager.handlers
    result = HyDE(llm).transform("q")
    assert len(counter.llm_token_counts) == 1
    assert llm_tokens(counter) == (result.usage.input_tokens, result.usage.output_tokens)


def test_explicit_callback_manager_on_the_transform_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = ScriptedLLM(["p."])
    counter = install_counter(monkeypatch)
    mine = TokenCountingHandler()
    HyDE(llm, callback_manager=CallbackManager([mine])).transform("q")
    assert len(mine.llm_token_counts) == 1 and not counter.llm_token_counts


def test_sync_timeout_raises_llm_timeout_error() -> None:
    with pytest.raises(LLMTimeoutError):
        complete(ScriptedLLM([HANG]), "p", CallOptions(timeout=0.1))


async def test_async_timeout_cancels_the_call() -> None:
    with pytest.raises(LLMTimeoutError):
        await acomplete(ScriptedLLM([HANG]), "p", CallOptions(timeout=0.1))


@pytest.mark.parametrize("use_async", [False, True])
async def test_openai_client_against_a_real_http_server_reports_provider_usage(
    counter: TokenCountingHandler, use_async: bool
) -> None:
    with openai_stub(text="Renewals slipped.", prompt_tokens=42, completion_tokens=7) as (
        base,
        state,
    ):
        llm = OpenAI(model="gpt-4o-mini", api_base=base, api_key="test-key", max_retries=0)
        hyde = HyDE(llm, temperature=0.7)
        result = await hyde.atransform("Why?") if use_async else hyde.transform("Why?")
    assert not result.fallback, result.error
    assert result.hypothetical == ("Renewals slipped.",)
    usage = result.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (42, 7, 49)
    assert usage.usage_source == "provider" and usage.cost_source == "price-table"
    assert usage.cost == pytest.approx((42 * 0.15 + 7 * 0.60) / 1e6)
    assert llm_tokens(counter) == (42, 7)
    [request] = state.requests
    assert request["path"].endswith("/chat/completions")
    assert request["body"]["temperature"] == 0.7
    assert "Why?" in request["body"]["messages"][-1]["content"]


@pytest.mark.parametrize("use_async", [False, True])
async def test_an_openai_endpoint_answering_500_is_reported_with_its_status(
    monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    from llama_index_hyde_plus.models import resolve_llm

    with openai_stub(status=500) as (base, state):
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_API_BASE", base)
        hyde = HyDE(resolve_llm("openai"), timeout=600)
        result = await hyde.atransform("Why?") if use_async else hyde.transform("Why?")
    assert result.fallback and result.error is not None
    assert result.error.startswith("InternalServerError") and "500" in result.error
    assert len(state.requests) == 1 + RetryPolicy().max_retries  # our retries, no others


class BlockingLLM(CustomLLM):
    """A LlamaIndex CustomLLM with only a blocking `complete` (no native async)."""

    delay: float = 2.0
    loaded: bool = True
    _release: Any = PrivateAttr(default_factory=threading.Event)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="blocking")

    def warm_up(self) -> None:
        time.sleep(self.delay)  # a slow model load
        self.loaded = True

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._release.wait(self.delay)  # blocks the calling thread
        return CompletionResponse(text="Enterprise renewals slipped.")

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_a_custom_llm_without_native_async_is_detected() -> None:
    assert not has_native_async(BlockingLLM())
    assert has_native_async(ScriptedLLM())


async def test_asearch_with_a_blocking_llm_keeps_the_loop_running_and_times_out(
    faiss_index: VectorStoreIndex,
) -> None:
    llm = BlockingLLM(delay=30.0)
    start = time.monotonic()
    try:
        async with LoopTicks() as loop:
            result = await TransformRetriever(
                faiss_index.as_retriever(), HyDE(llm, timeout=0.3)
            ).asearch("Why did revenue drop?")
    finally:
        llm._release.set()
    elapsed = time.monotonic() - start
    assert result.transform.fallback and "LLMTimeoutError" in (result.transform.error or "")
    assert elapsed < 15.0 and loop.ticks >= LoopTicks.FREE  # not the 30 s call
    assert result.nodes  # the search went on with the question


async def test_a_blocking_llm_answers_on_the_async_path_in_a_thread() -> None:
    reply = await acomplete(BlockingLLM(delay=0.05), "p", CallOptions(timeout=5))
    assert reply.text == "Enterprise renewals slipped."


@pytest.mark.parametrize("use_async", [False, True])
async def test_loading_a_lazy_model_does_not_count_against_the_timeout(use_async: bool) -> None:
    llm = BlockingLLM(delay=0.6, loaded=False)  # load 0.6 s, answer 0.6 s, timeout 1 s
    hyde = HyDE(llm, timeout=1.0)
    result = await hyde.atransform("q") if use_async else hyde.transform("q")
    assert not result.fallback, result.error
    assert llm.loaded


@pytest.mark.parametrize("bad", [-5, 10**30, True, False, 1.5, 1e30, "12", None])
def test_only_sane_provider_token_counts_are_taken(bad: Any) -> None:
    raw = {"usage": {"prompt_tokens": bad, "completion_tokens": 3}}
    assert provider_token_counts(raw) is None
    assert provider_token_counts(None, {"prompt_tokens": 4, "completion_tokens": bad}) is None
    usage = usage_for_call(
        prompt="four words of prompt",
        completion="two words",
        raw=raw,
        additional_kwargs=None,
        model=None,
        local=False,
    )
    assert usage.usage_source == "estimated" and usage.input_tokens > 0


def test_sane_provider_token_counts_are_taken() -> None:
    raw = {"usage": {"prompt_tokens": 0, "completion_tokens": 1_000_000}}
    assert provider_token_counts(raw) == (0, 1_000_000)
