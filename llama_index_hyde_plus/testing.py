"""Test doubles shipped for your own tests: a scripted LLM, a deterministic embedding
model whose similarities mean something, and a static retriever.

>>> llm = ScriptedLLM(replies=["Renewals slipped last quarter."])
>>> HyDE(llm).transform("Why did revenue drop?").hypothetical
('Renewals slipped last quarter.',)
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import Field, PrivateAttr

from .calls.door import CANCEL_EVENT
from .echo import echo_reply

__all__ = [
    "HANG",
    "DeterministicEmbedding",
    "ScriptedLLM",
    "StaticRetriever",
    "SyncCallError",
    "agent_llm",
    "echo_llm",
]


class _Hang:
    def __repr__(self) -> str:
        return "HANG"


HANG = _Hang()
"""Put in `ScriptedLLM` replies to make that call never answer (until cancelled)."""

Reply = str | BaseException | _Hang | Callable[[str], str]
"""One scripted reply: a text, an exception to raise, `HANG`, or a function of the prompt."""


class SyncCallError(AssertionError):
    """A blocking method of a `ScriptedLLM(forbid_sync=True)` was called."""


def _count_tokens(text: str) -> int:
    return len(text.split())


class _CountsCalls:
    """``sync_calls`` / ``async_calls``: how often the blocking and the async methods
    ran (a test of an async path asserts ``sync_calls == 0``)."""

    _sync_calls: int
    _async_calls: int

    @property
    def sync_calls(self) -> int:
        return self._sync_calls

    @property
    def async_calls(self) -> int:
        return self._async_calls


class ScriptedLLM(_CountsCalls, CustomLLM):
    """An LLM that answers from a script, for tests.

    ``replies`` is a queue consumed one per call: a ``str`` is the reply, an exception
    instance is raised, `HANG` blocks until cancelled (async), or on the sync path
    until the call is abandoned on its timeout (its worker thread is then free again)
    or for an hour, and a callable gets the prompt and returns the reply. When the queue is empty,
    ``respond(prompt)`` answers if given, else the call raises ``RuntimeError``.
    ``delay`` seconds are slept before each reply (``asyncio.sleep`` on the async
    path). Every prompt is recorded in ``prompts`` and every call's kwargs in
    ``call_kwargs``; ``sync_calls`` and ``async_calls`` count the paths taken, and with
    ``forbid_sync=True`` a blocking call raises `SyncCallError`, so a test can prove an
    async path never blocks. Replies carry OpenAI-style provider usage (whitespace
    token counts) unless ``report_usage=False``. ``record=False`` keeps no history
    (for long load tests, where the history would grow without bound).
    """

    model_name: str = Field(default="scripted")
    delay: float = Field(default=0.0, ge=0)
    forbid_sync: bool = Field(default=False)
    report_usage: bool = Field(default=True)
    is_local: bool = Field(default=False)
    record: bool = Field(default=True)
    respond: Callable[[str], str] | None = Field(default=None, exclude=True)

    _queue: deque[Any] = PrivateAttr(default_factory=deque)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _prompts: list[str] = PrivateAttr(default_factory=list)
    _kwargs: list[dict[str, Any]] = PrivateAttr(default_factory=list)
    _sync_calls: int = PrivateAttr(default=0)
    _async_calls: int = PrivateAttr(default=0)

    def __init__(self, replies: Iterable[Reply] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._queue = deque(replies)

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class."""
        return "ScriptedLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """A completion model named ``model_name``, LlamaIndex's defaults otherwise."""
        return LLMMetadata(model_name=self.model_name, is_chat_model=False)

    # -- inspection ----------------------------------------------------------------
    @property
    def prompts(self) -> list[str]:
        """Every prompt received, in order."""
        return list(self._prompts)

    @property
    def call_kwargs(self) -> list[dict[str, Any]]:
        """The keyword arguments of every call (``temperature``...), in order."""
        return list(self._kwargs)

    def add_replies(self, *replies: Reply) -> None:
        """Queue more replies after those already waiting (thread-safe)."""
        with self._lock:
            self._queue.extend(replies)

    # -- behaviour -----------------------------------------------------------------
    def _next(self, prompt: str, kwargs: dict[str, Any]) -> Reply:
        with self._lock:
            if self.record:
                self._prompts.append(prompt)
                self._kwargs.append({k: v for k, v in kwargs.items() if k != "formatted"})
            if self._queue:
                return self._queue.popleft()  # type: ignore[no-any-return]
        if self.respond is not None:
            return self.respond
        shown = prompt if len(prompt) <= 300 else prompt[:300] + "..."
        raise RuntimeError(
            f"ScriptedLLM has no reply left for this prompt (queue more with replies= or "
            f"add_replies, or answer any prompt with respond=): {shown!r}"
        )

    def _response(self, prompt: str, reply: Reply) -> CompletionResponse:
        if isinstance(reply, BaseException):
            raise reply
        text = reply(prompt) if callable(reply) else str(reply)
        raw: dict[str, Any] = {"model": self.model_name}
        if self.report_usage:
            p, c = _count_tokens(prompt), _count_tokens(text)
            raw["usage"] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        return CompletionResponse(text=text, raw=raw)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """The next scripted reply to ``prompt``, after ``delay`` seconds: raises a scripted
        exception, blocks for a `HANG`, and fails with `SyncCallError` when ``forbid_sync``."""
        with self._lock:
            self._sync_calls += 1
        if self.forbid_sync:
            raise SyncCallError("ScriptedLLM.complete() called on a path that must be async")
        reply = self._next(prompt, kwargs)
        if self.delay:
            time.sleep(self.delay)
        if isinstance(reply, _Hang):
            # until the call is abandoned (its worker thread is free again), else an hour
            told = CANCEL_EVENT.get()
            (told if told is not None else threading.Event()).wait(3600)
            raise TimeoutError("ScriptedLLM hung")
        return self._response(prompt, reply)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """`complete` for the async path: sleeps and hangs without blocking the loop."""
        with self._lock:
            self._async_calls += 1
        reply = self._next(prompt, kwargs)
        if self.delay:
            await asyncio.sleep(self.delay)
        if isinstance(reply, _Hang):
            await asyncio.Event().wait()
        return self._response(prompt, reply)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """`complete`'s reply as one chunk."""
        response = self.complete(prompt, formatted=formatted, **kwargs)

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=response.text, delta=response.text, raw=response.raw)

        return gen()


def echo_llm(delay: float = 0.0, **kwargs: Any) -> ScriptedLLM:
    """A `ScriptedLLM` that answers every prompt with three numbered variations of the
    question it finds in it (`echo.echo_reply`: a chat's last user message, a
    ``Question:`` or ``Query:`` line, the last line of text), after ``delay`` seconds,
    keeping no history: a stand-in for load tests and the docs' examples. A prompt with
    no question in it raises a `ValueError` quoting it."""
    kwargs.setdefault("record", False)
    return ScriptedLLM(respond=echo_reply, delay=delay, **kwargs)


def agent_llm() -> FunctionCallingLLM:
    """A function-calling LLM for agent tests (LlamaIndex's `MockFunctionCallingLLM`,
    scripted): to a user message it calls each tool it is given once, with the message
    as the tool's first required argument; once the tools have answered, it replies
    with the last tool result. Given no tools, it repeats the last message."""
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        users = [i for i, m in enumerate(messages) if m.role == MessageRole.USER]
        turn = messages[users[-1] :] if users else list(messages)
        answered = [m for m in turn if m.role == MessageRole.TOOL]
        if answered or not kwargs.get("tools"):
            last = (answered or turn or [ChatMessage(content="")])[-1]
            return ChatMessage(role=MessageRole.ASSISTANT, content=last.content or "")
        question = turn[0].content or ""
        calls = []
        for n, tool in enumerate(kwargs["tools"]):
            schema = tool.metadata.fn_schema
            required = [k for k, f in schema.model_fields.items() if f.is_required()]
            calls.append(
                ToolCallBlock(
                    tool_call_id=f"call-{len(users)}-{n}",
                    tool_name=tool.metadata.name or "",
                    tool_kwargs={required[0]: question} if required else {},
                )
            )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=list(calls))

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "their",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


def _no_words(text: str, dim: int) -> list[float]:
    """The unit vector of a text with no content words: +-1/sqrt(dim) in every position,
    the signs drawn from a hash of the whole text (the same text, the same vector), so
    it is near-orthogonal to every word vector and to other such texts."""
    bits = hashlib.shake_128(text.encode("utf-8", "surrogatepass")).digest((dim + 7) // 8)
    scale = 1.0 / math.sqrt(dim)
    return [scale if bits[i // 8] >> (i % 8) & 1 else -scale for i in range(dim)]


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


class DeterministicEmbedding(_CountsCalls, BaseEmbedding):
    """Hashed bag-of-words embedding: texts that share (stemmed, non-stop) words are
    close, unrelated texts are near-orthogonal. Same text, same vector, on any machine.
    ``dim`` sets the size (default 256). Counts calls in ``sync_calls``/``async_calls``
    and records every document text it embeds in ``embedded_texts`` (not queries), so a
    test can prove that an index or a guard did not embed documents again.
    """

    dim: int = Field(default=256, gt=7)
    model_name: str = Field(default="deterministic-bow")
    _sync_calls: int = PrivateAttr(default=0)
    _async_calls: int = PrivateAttr(default=0)
    _embedded_texts: list[str] = PrivateAttr(default_factory=list)

    @property
    def embedded_texts(self) -> list[str]:
        """Every document text embedded so far, in order (queries are not recorded)."""
        return self._embedded_texts

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class."""
        return "DeterministicEmbedding"

    def vector(self, text: str) -> list[float]:
        """The unit vector of ``text``: each content word (lower-cased, stemmed, stop words
        left out) adds +1 or -1 at a position its hash chooses. A text whose words add
        up to nothing (empty, only stop words such as "What is it?", or words that cancel
        out) gets `_no_words` instead, never a zero vector, which no similarity can be
        computed with (a real model embeds any text to a non-zero vector too)."""
        vec = [0.0] * self.dim
        for word in _WORD.findall(text.lower()):
            if word in _STOP:
                continue
            digest = hashlib.blake2b(_stem(word).encode(), digest_size=8).digest()
            index = int.from_bytes(digest[:4], "little") % self.dim
            vec[index] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vec))
        return [v / norm for v in vec] if norm else _no_words(text, self.dim)

    def _get_query_embedding(self, query: str) -> list[float]:
        self._sync_calls += 1
        return self.vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        self._sync_calls += 1
        self._embedded_texts.append(text)
        return self.vector(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        self._async_calls += 1
        return self.vector(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        self._async_calls += 1
        self._embedded_texts.append(text)
        return self.vector(text)


class StaticRetriever(BaseRetriever):
    """A retriever over fixed texts, for tests.

    ``results`` maps a query string to the node ids to return (best first); any other
    query returns ``default`` ids. ``delay`` seconds are slept per call (async sleeps
    on the async path), ``fail_on`` queries raise ``RuntimeError``. Every query string
    seen is recorded in ``queries`` and every bundle in ``bundles``.
    """

    def __init__(
        self,
        texts: dict[str, str],
        *,
        results: dict[str, Sequence[str]] | None = None,
        default: Sequence[str] = (),
        delay: float = 0.0,
        fail_on: Iterable[str] = (),
    ) -> None:
        super().__init__()
        self.nodes = {nid: TextNode(id_=nid, text=text) for nid, text in texts.items()}
        self.results = {k: list(v) for k, v in (results or {}).items()}
        self.default = list(default)
        self.delay = delay
        self.fail_on = set(fail_on)
        self.bundles: list[QueryBundle] = []
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    @property
    def queries(self) -> list[str]:
        """Every query string searched so far, in order (one per bundle)."""
        return [b.query_str for b in self.bundles]

    @property
    def searches_in_process(self) -> bool:
        """True with no ``delay``: a search is a dict lookup, so `TransformRetriever`
        runs it in the caller's thread (`retriever.searches_in_process`); one that
        sleeps stands for a remote store and is bounded by ``model_timeout``."""
        return not self.delay

    def _answer(self, bundle: QueryBundle) -> list[NodeWithScore]:
        if bundle.query_str in self.fail_on:
            raise RuntimeError(f"search failed for {bundle.query_str!r}")
        ids = self.results.get(bundle.query_str, self.default)
        n = len(ids)
        return [NodeWithScore(node=self.nodes[i], score=float(n - r)) for r, i in enumerate(ids)]

    def _enter(self, bundle: QueryBundle) -> None:
        with self._lock:
            self.bundles.append(bundle)
            self.active += 1
            self.max_active = max(self.max_active, self.active)

    def _exit(self) -> None:
        with self._lock:
            self.active -= 1

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self._enter(query_bundle)
        try:
            if self.delay:
                time.sleep(self.delay)
            return self._answer(query_bundle)
        finally:
            self._exit()

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self._enter(query_bundle)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._answer(query_bundle)
        finally:
            self._exit()
