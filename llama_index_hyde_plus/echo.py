"""`EchoLLM`: the model behind ``--llm scripted[:DELAY_MS]``, for load tests and demos
of the plumbing. It answers every prompt with three numbered variations of the
question it finds in the prompt, after a fixed delay, and keeps nothing."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from pydantic import Field

_SUBJECT = re.compile(r"(?:Question|Query|Claim): (.+)")


def echo_reply(prompt: str) -> str:
    """Three numbered variations of the question in ``prompt`` (the text after
    ``Question:``, ``Query:`` or ``Claim:``, else its last line)."""
    match = _SUBJECT.search(prompt)
    lines = prompt.strip().splitlines()
    subject = match.group(1).strip() if match else (lines[-1] if lines else "the question")
    return f"1. {subject} explained\n2. background of {subject}\n3. evidence about {subject}"


class PromptLLM(CustomLLM):
    """A completion LLM whose reply is a pure function of the prompt (`reply`), given
    after ``delay`` seconds (``asyncio.sleep`` on the async path). It costs nothing
    (a local model's $0) and streams its reply as one chunk."""

    model_name: str = Field(default="prompt")
    delay: float = Field(default=0.0, ge=0, le=3600, allow_inf_nan=False)
    is_local: bool = Field(default=True)

    def reply(self, prompt: str) -> str:
        """The answer to ``prompt``; raising makes the call fail."""
        raise NotImplementedError(f"{type(self).__name__} must implement reply()")

    @property
    def metadata(self) -> LLMMetadata:
        """A completion model named ``model_name``, LlamaIndex's defaults otherwise."""
        return LLMMetadata(model_name=self.model_name, is_chat_model=False)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """`reply` to ``prompt``, after ``delay`` seconds."""
        if self.delay:
            time.sleep(self.delay)
        return CompletionResponse(text=self.reply(prompt))

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """`complete` without blocking the event loop."""
        if self.delay:
            await asyncio.sleep(self.delay)
        return CompletionResponse(text=self.reply(prompt))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """The whole `reply` as one chunk."""
        text = self.complete(prompt, formatted=formatted).text

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=text, delta=text)

        return gen()


class EchoLLM(PromptLLM):
    """`echo_reply` after ``delay`` seconds (``asyncio.sleep`` on the async path)."""

    model_name: str = Field(default="echo")

    def reply(self, prompt: str) -> str:
        """Three numbered variations of the question found in ``prompt`` (`echo_reply`)."""
        return echo_reply(prompt)
