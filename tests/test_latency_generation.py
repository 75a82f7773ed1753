"""Generate only what is kept: a HyDE reply stops once it holds what
``max_characters`` keeps, for the local model (llama.cpp told to stop) and for an LLM
whose class says it streams (``streams_replies``); the tokens not written are counted.
Other LLMs answer in full (an OpenAI stream carries no provider counts)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen
from llama_index.core.llms.callbacks import llm_completion_callback

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.local.llm import LocalLLM
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms.parsing import reply_past, trim_passage

Q = "Why did revenue drop?"
WORD = "renewal "  # 8 characters a token: the passage cap (max_characters / 4) is loose
LIMIT = 100


class FakeServer:
    """llama.cpp's ``handle_chat_completions`` for a model that writes ``WORD`` until
    its ``max_tokens``, streamed one token a chunk; ``written`` counts the tokens."""

    def __init__(self) -> None:
        self.written: list[int] = []

    def handle_chat_completions(
        self, request: dict[str, Any], on_chunk: Callable[..., bool]
    ) -> Any:
        count = 0
        for _ in range(request["max_tokens"]):
            count += 1
            if on_chunk({"choices": [{"delta": {"content": WORD}}]}):
                self.written.append(count)
                return None
        on_chunk({"choices": [{"delta": {}, "finish_reason": "length"}]})
        on_chunk({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": count}})
        self.written.append(count)
        return None


def fake_local() -> tuple[LocalLLM, FakeServer]:
    llm = LocalLLM(model_path="/nonexistent/model.gguf", max_tokens=256)
    server = FakeServer()
    llm._server = server
    return llm, server


def kept() -> str:
    cap = -(-LIMIT // HyDE.CHARACTERS_PER_TOKEN)
    return trim_passage(WORD * cap, LIMIT)


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_a_local_generation_stops_once_it_holds_what_is_kept(
    use_async: bool, timeout: float | None
) -> None:
    llm, server = fake_local()
    hyde = HyDE(llm, max_characters=LIMIT, breaker=None, timeout=timeout)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    cap = hyde.max_tokens  # 25 tokens: 200 characters, where 100 are kept
    assert result.hypothetical == (kept(),)
    (written,) = server.written
    assert written < cap  # failed before: all 25 tokens were written
    assert result.usage.output_tokens == written
    assert result.usage.tokens_saved == cap - written


class StreamingLLM(ScriptedLLM):
    """A scripted LLM whose stream hands on one word at a time (a remote streaming
    client's shape); ``pieces`` counts what it handed on."""

    streams_replies: ClassVar[bool] = True
    pieces: ClassVar[list[int]] = []

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        def gen() -> CompletionResponseGen:
            text = ""
            for i in range(kwargs.get("max_tokens", 256)):
                text += WORD
                StreamingLLM.pieces.append(i + 1)
                yield CompletionResponse(text=text, delta=WORD)

        return gen()

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        async def gen() -> Any:
            for chunk in self.stream_complete(prompt, **kwargs):
                yield chunk

        return gen()


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_streaming_llm_is_read_only_until_the_reply_holds_what_is_kept(
    use_async: bool,
) -> None:
    StreamingLLM.pieces.clear()
    hyde = HyDE(StreamingLLM(), max_characters=LIMIT, breaker=None)
    result = await hyde.atransform(Q) if use_async else hyde.transform(Q)
    assert result.hypothetical == (kept(),)
    assert max(StreamingLLM.pieces) < hyde.max_tokens
    assert result.usage.tokens_saved == hyde.max_tokens - max(StreamingLLM.pieces)


def test_an_llm_that_does_not_stream_answers_in_full() -> None:
    llm = ScriptedLLM([WORD * 25])
    result = HyDE(llm, max_characters=LIMIT, breaker=None).transform(Q)
    assert result.hypothetical == (kept(),) and result.usage.tokens_saved == 0


def test_what_is_kept_is_decided_once_the_content_runs_past_the_limit() -> None:
    text = "A short sentence. " * 10  # 180 characters
    assert not reply_past(100, text[:100])
    assert reply_past(100, text[:102]) and trim_passage(text[:102], 100) == trim_passage(text, 100)
    # an echoed label and a special token half written are not content yet
    import re

    label = re.compile(r"^\s*passage\s*:\s*", re.IGNORECASE)
    assert not reply_past(100, "Passage: " + text[:95], label)
    assert not reply_past(100, text[:95] + "<|im_en")


def test_the_stream_is_closed_when_generation_stops() -> None:
    llm, server = fake_local()
    before = threading.active_count()
    HyDE(llm, max_characters=LIMIT, breaker=None, timeout=None).transform(Q)
    assert server.written and server.written[0] < 25
    for _ in range(100):  # the stream's producer thread ends once llama.cpp stopped
        if threading.active_count() <= before:
            break
        threading.Event().wait(0.02)
    assert threading.active_count() <= before
