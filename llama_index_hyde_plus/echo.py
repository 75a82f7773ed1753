"""`EchoLLM`: the model behind ``--llm scripted[:DELAY_MS]``, for load tests and demos
of the plumbing. It answers every prompt with three numbered variations of the
question it finds in the prompt (`echo_reply`: a transform's ``Question:`` line, a
chat's last user message...), after a fixed delay, and keeps nothing; a prompt with no
question in it is an error that quotes it."""

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

_LABELLED = re.compile(
    r"^[ \t]*(?:question|query|claim|topic|follow-up message|follow up input)[ \t]*:"
    r"[ \t]*(\S.*)$",
    re.IGNORECASE | re.MULTILINE,
)
"""A line that gives the question under a label: our transforms' prompts (``Question:``,
``Query:``, ``Claim:``, ``Follow-up message:``), LlamaIndex's answer prompts
(``Query:``) and its condense prompt (``Follow Up Input:``)."""
_ROLE = re.compile(r"^(system|user|assistant|tool|function|chatbot|model|developer): ?", re.M)
"""The start of a message in a chat rendered as text (LlamaIndex's ``messages_to_prompt``,
what a chat engine's calls to a completion model become: ``role: content`` lines, and
``assistant: `` last)."""
_CUE = re.compile(r"^[ \t]*[^\W\d][\w '-]{0,40}:[ \t]*(?:\"\"\"|\'\'\'|```)?[ \t]*$")
"""A line that only cues the reply: a label with nothing after it (``Passage:``,
``Standalone query:``, ``Answer:``, ``Passage:\"\"\"``)."""
_LABEL = re.compile(r"^[^\W\d][\w '-]{0,30}:[ \t]+")


def question_in(prompt: str) -> str:
    """The question ``prompt`` asks about, found as `echo_reply` documents; a
    `ValueError` quoting the prompt when it holds none."""
    text = prompt.strip()
    roles = list(_ROLE.finditer(text))
    if roles and roles[-1].group(1) == "assistant" and not text[roles[-1].end() :].strip():
        return _last_user_message(text, roles, prompt)
    labelled = _LABELLED.findall(text)
    if labelled:
        return str(labelled[-1]).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    while lines and _CUE.match(lines[-1]):
        lines.pop()
    if lines:
        return _LABEL.sub("", lines[-1], count=1) or lines[-1]
    raise _no_question(prompt, "no 'Question:', 'Query:' or 'Claim:' line, no line of text")


def _last_user_message(text: str, roles: list[re.Match[str]], prompt: str) -> str:
    """The last user message of a chat rendered as ``text`` (``roles``: where each of
    its messages starts), up to the next message."""
    users = [i for i, m in enumerate(roles) if m.group(1) == "user"]
    found = ""
    if users:
        end = roles[users[-1] + 1].start()
        found = " ".join(text[roles[users[-1]].end() : end].split())
    if not found:
        raise _no_question(prompt, "a chat with no user message")
    return found


def _no_question(prompt: str, why: str) -> ValueError:
    shown = prompt if len(prompt) <= 300 else prompt[:300] + "..."
    return ValueError(f"echo_reply found no question in the prompt ({why}): {shown!r}")


def echo_reply(prompt: str) -> str:
    """Three numbered variations of the question ``prompt`` asks about: the last user
    message of a chat rendered as text (``user: ...`` lines ending with
    ``assistant:``, what a chat engine sends a completion model); else the text of its
    last ``Question:``, ``Query:``, ``Claim:``, ``Topic:``, ``Follow-up message:`` or
    ``Follow Up Input:`` line; else its last line of text before the cue it ends with
    (``Passage:``, ``Answer:``), less a label (``Passage: ...``). A prompt with none of
    them (empty, or only cues) is a `ValueError` that quotes it."""
    subject = question_in(prompt)
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
