"""`LocalLLM`: a LlamaIndex LLM running a GGUF model in-process with llama.cpp.

The runtime is ``xllamacpp`` (prebuilt CPU wheels, no compiler). Its server object keeps
``n_parallel`` slots and serves calls from several threads at once, releasing the GIL
while it computes, so the async methods run calls in worker threads without blocking
the event loop. Replies carry llama.cpp's own ``usage`` block (provider counts), and the
model's own chat template formats the prompt. Calls are streamed internally so that a
cancelled or timed-out call stops generating within a token instead of running on, and
the ``stream_*`` methods hand each token on as llama.cpp produces it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import hashlib
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from pydantic import Field, PrivateAttr

from ..calls.door import CANCEL_EVENT
from ..calls.llm import ENOUGH, STOPPED_EARLY
from ..calls.reliability import MAX_SECONDS
from ..calls.streaming import Done, Producer, astream_in_thread, stream_in_thread
from ..calls.timeouts import timeout_for
from .gguf import control_tokens, escape_controls
from .slots import Reservation, Slots, SlotWaitCancelledError

_MAX_SEEDS = 100_000
SPEED_PROBE = "Write a short paragraph about the history of the printing press."
"""The prompt `LocalLLM.measure_speed` times: one any model writes on without stopping."""
SPEED_PROBE_TOKENS = 32
"""Tokens the speed probe writes: about a second on an idle 2-core machine."""
EXIT_WAIT = 120.0
"""Seconds the interpreter waits at exit for local calls to stop (see `_InFlight`)."""


class LocalLLMError(RuntimeError):
    """llama.cpp answered with an error (context overflow, bad request...)."""


class LocalLLMCancelledError(LocalLLMError):
    """The call was cancelled (its transform timed out) and generation was stopped."""


_Cancel = threading.Event | Sequence[threading.Event] | None
"""What stops a call: an event, several (any one set stops it), or none."""


def _events(cancel: _Cancel) -> tuple[threading.Event, ...]:
    if cancel is None:
        return ()
    if isinstance(cancel, threading.Event):
        return (cancel,)
    return tuple(cancel)


class _InFlight:
    """The local calls inside llama.cpp right now, in any thread, so the interpreter
    never exits under one: a call abandoned on timeout (in a daemon worker) that calls
    back into Python while the interpreter is being torn down crashes the process
    (``FATAL: exception not rethrown``, SIGABRT; or SIGSEGV). At exit `stop` tells every
    call to stop at its next token and waits for them to return; a call that comes to
    llama.cpp after that (a worker that had not started yet) is refused, never let in
    under the teardown."""

    def __init__(self) -> None:
        self.count = 0
        self.exiting = threading.Event()
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        with self._cond:
            if self.exiting.is_set():
                raise LocalLLMCancelledError("the interpreter is exiting: no local call starts")
            self.count += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self.count -= 1
            self._cond.notify_all()

    def stop(self, timeout: float) -> bool:
        """Stop every call and wait up to ``timeout`` seconds; whether none is left."""
        self.exiting.set()
        with self._cond:
            return self._cond.wait_for(lambda: self.count == 0, timeout)


_IN_FLIGHT = _InFlight()


def _stop_at_exit() -> None:
    """Join the local calls before the interpreter is torn down; one still inside
    llama.cpp after `EXIT_WAIT` seconds (a prompt that never finishes evaluating) would
    crash the teardown, so the process then ends without it."""
    if _IN_FLIGHT.stop(2.0):
        return
    print("hyde-plus: waiting for the local model to stop generating...", file=sys.stderr)
    if _IN_FLIGHT.stop(EXIT_WAIT):
        return
    print(
        f"hyde-plus: a local model call did not stop within {EXIT_WAIT:g} s; exiting",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


atexit.register(_stop_at_exit)
if hasattr(threading, "_register_atexit"):
    # before the interpreter joins worker pools (it waits for their calls): stop them
    threading._register_atexit(_IN_FLIGHT.exiting.set)


class _Collector:
    """Gathers a streamed llama.cpp reply chunk by chunk; `on_chunk` returns True (which
    stops llama.cpp) once one of the ``cancel`` events is set."""

    def __init__(
        self,
        cancel: tuple[threading.Event, ...],
        on_delta: Callable[[str], None] | None,
        enough: Callable[[str], bool] | None = None,
        cap: int | None = None,
    ) -> None:
        self.cancel = cancel
        self.on_delta = on_delta
        self.enough = enough
        self.cap = cap
        self.stopped_early = False
        self.pieces = 0
        self.parts: list[str] = []
        self.head: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: Any = None

    def cancelled(self) -> bool:
        return any(event.is_set() for event in self.cancel)

    def on_chunk(self, chunk: Any) -> bool:
        if not isinstance(chunk, dict) or "error" in chunk:
            self.error = chunk.get("error") if isinstance(chunk, dict) else chunk
            return True
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "model", "created") if k in chunk}
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.parts.append(str(content))
                self.pieces += 1
                if self.on_delta is not None:
                    self.on_delta(str(content))
                if self.enough is not None and self.enough("".join(self.parts)):
                    self.stopped_early = True  # what is kept is written: stop here
                    return True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        return self.cancelled()  # True stops llama.cpp

    def response(self) -> dict[str, Any]:
        """The whole reply as a chat completion; raises on an error or a cancellation."""
        if self.error is not None:
            error = self.error
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise LocalLLMError(f"llama.cpp error: {message}")
        if self.stopped_early:
            early = {STOPPED_EARLY: True, "pieces": self.pieces, "cap": self.cap}
        elif self.cancelled() and self.finish_reason is None:
            raise LocalLLMCancelledError("the call was cancelled; llama.cpp stopped generating")
        else:
            early = {}
        message = {"role": "assistant", "content": "".join(self.parts)}
        finish = "stop" if self.stopped_early else self.finish_reason
        choice = {"index": 0, "finish_reason": finish, "message": message}
        response: dict[str, Any] = {**self.head, "object": "chat.completion", "choices": [choice]}
        if self.usage is not None:
            response["usage"] = self.usage
        return {**response, **early}


class LocalLLM(CustomLLM):
    """A GGUF chat model on the CPU, through llama.cpp (``xllamacpp``).

    ``n_ctx`` is the context per parallel slot; ``n_parallel`` calls run at once, their
    tokens decoded together in one llama.cpp batch per step (continuous batching; 4 slots
    cover HyDE's and multi-query's usual fan-out, and each slot's KV cache costs
    ``n_ctx`` x 23 KB for SmolLM2-135M, about 47 MB at 2048);
    ``max_tokens`` caps each reply; ``temperature`` is the default sampling temperature
    (a ``temperature=`` keyword on a call overrides it); ``seed`` makes a run
    repeatable (the seed of a call depends on the prompt and on how many times it was asked, not on
    call order, so repeated samples still differ and concurrent runs repeat).
    ``threads`` defaults to the machine's cores.

    At most ``n_parallel`` calls are inside llama.cpp at once; the others wait in line
    for a slot (`slots.Slots`), at most ``slot_wait`` seconds (None: one call's budget
    under the timeout policy, `timeouts.timeout_for`), and past that are not made
    (`slots.ModelBusyError`, "model busy"). Through a transform the slot is taken
    before the call's timeout starts, so the timeout counts from its generation.
    """

    model_path: str = Field(description="Path of the GGUF file.")
    model_name: str = Field(default="local-gguf")
    n_ctx: int = Field(default=2048, gt=0)
    n_parallel: int = Field(default=4, gt=0)
    max_tokens: int = Field(default=256, gt=0)
    temperature: float = Field(default=0.7, ge=0, le=2)
    seed: int | None = Field(default=None)
    threads: int | None = Field(default=None)
    tokens_per_s: float | None = Field(default=None, gt=0)
    """The measured speed (`measure_speed`), which the timeout policy budgets each call
    by (`timeouts.timeout_for`); None: the policy's nominal rate."""
    slot_wait: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    """Seconds a call may wait for a free slot before it is not made ("model busy");
    None: one call's budget under the timeout policy (`timeouts.timeout_for`)."""
    is_local: bool = Field(default=True)
    cache_key_ignores: ClassVar[frozenset[str]] = frozenset(
        {"threads", "tokens_per_s", "slot_wait"}
    )
    """How fast the machine runs the model and how long a call waits for it, not what
    it writes: a run whose speed probe chose another thread count (or measured another
    speed) reuses the cached replies."""
    stops_when_enough: ClassVar[bool] = True
    """A call stops generating once the reply holds what its transform keeps (the
    rule in `ENOUGH`, HyDE's ``max_characters``), llama.cpp told to stop at that token;
    the reply's ``raw`` then says so (`STOPPED_EARLY`, with the tokens written)."""

    _server: Any = PrivateAttr(default=None)
    _controls: tuple[str, ...] = PrivateAttr(default=())
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _seen: Any = PrivateAttr(default_factory=OrderedDict)
    _pool: Any = PrivateAttr(default=None)
    _slots: Any = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class."""
        return "LocalLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """A chat model named ``model_name`` with ``n_ctx`` tokens of context and
        ``max_tokens`` of output."""
        return LLMMetadata(
            context_window=self.n_ctx,
            num_output=self.max_tokens,
            is_chat_model=True,
            model_name=self.model_name,
        )

    # -- runtime -------------------------------------------------------------------
    def _get_server(self) -> Any:
        if self._server is None:
            with self._lock:
                if self._server is None:
                    self._server = self._start()
        return self._server

    def _start(self) -> Any:
        if not Path(self.model_path).is_file():
            raise FileNotFoundError(f"GGUF model not found: {self.model_path}")
        import xllamacpp

        self._controls = control_tokens(self.model_path)
        threads = self.threads or os.cpu_count() or 2
        params = xllamacpp.CommonParams()
        params.model.path = self.model_path
        params.n_parallel = self.n_parallel
        params.n_ctx = self.n_ctx * self.n_parallel
        params.n_predict = self.max_tokens
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.warmup = False
        params.verbosity = -1
        return xllamacpp.Server(params)

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory (it loads on the first call or `warm_up`)."""
        return self._server is not None

    def warm_up(self) -> None:
        """Load the model now rather than on the first call. Transforms do this before
        starting their ``timeout`` clock, so loading never counts against it; call it
        at start-up to keep the first search fast."""
        self._get_server()

    def measure_speed(
        self, tokens: int = SPEED_PROBE_TOKENS, budget_s: float | None = None
    ) -> float:
        """Tokens per second of one generation of up to ``tokens`` tokens, from the
        model's own first token to its last (loading and reading the prompt excluded),
        measured now: on a shared CPU it is what this machine gives at this moment. A
        probe still writing after ``budget_s`` seconds stops there (its rate so far);
        0.0 when it wrote fewer than 2 tokens by then."""
        server = self._get_server()
        stamps: list[float] = []
        stop = threading.Event()
        start = time.perf_counter()

        def on_delta(_: str) -> None:
            stamps.append(time.perf_counter())
            if budget_s is not None and stamps[-1] - start > budget_s:
                stop.set()

        request = self._payload([ChatMessage(role=MessageRole.USER, content=SPEED_PROBE)], {})
        request |= {"max_tokens": tokens, "temperature": 0.0}
        collector = _Collector((stop, _IN_FLIGHT.exiting), on_delta)
        with self._slot_held(collector.cancel), _IN_FLIGHT:
            server.handle_chat_completions(request, collector.on_chunk)
        if len(stamps) < 2:
            return 0.0
        return (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-6)

    # -- slots ---------------------------------------------------------------------
    def _gate(self) -> Slots:
        if self._slots is None:
            with self._lock:
                if self._slots is None:
                    self._slots = Slots(self.n_parallel)
        slots: Slots = self._slots
        return slots

    @property
    def slot_wait_s(self) -> float:
        """Seconds a call waits for a slot: `slot_wait`, else one call's budget under
        the timeout policy."""
        return self.slot_wait if self.slot_wait is not None else timeout_for(self)

    def generation_slot(self) -> AbstractContextManager[Reservation]:
        """A slot for the one call made inside (blocking until one is free, at most
        ``slot_wait`` seconds: `slots.ModelBusyError` past it). The call layer takes
        it before a call's timeout starts, so the timeout counts from generation."""
        return self._gate().reserve(self.slot_wait_s)

    def ageneration_slot(self) -> AbstractAsyncContextManager[Reservation]:
        """`generation_slot` without blocking the event loop; cancelling the wait
        leaves the line."""
        return self._gate().areserve(self.slot_wait_s)

    @contextmanager
    def _slot_held(self, cancel: tuple[threading.Event, ...]) -> Iterator[None]:
        """A slot while llama.cpp makes a call: the one its caller reserved, else one
        taken now; `LocalLLMCancelledError` when ``cancel`` is set while it waits."""
        try:
            with self._gate().hold(self.slot_wait_s, cancel):
                yield
        except SlotWaitCancelledError:  # raised only while it waits: nothing ran
            raise LocalLLMCancelledError("the call was cancelled before it started") from None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.n_parallel, "hyde-plus-llm")
        pool: ThreadPoolExecutor = self._pool
        return pool

    def close(self) -> None:
        """Free the model (it loads again on the next call)."""
        with self._lock:
            self._server = None

    def _payload(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI-style streamed chat request for llama.cpp. Every message's text
        has the model's control tokens escaped: llama.cpp parses them in the formatted
        prompt, so a ``<|im_start|>`` in a question or a document would otherwise open
        a chat turn of its own; only the chat template writes them."""
        request: dict[str, Any] = {
            "messages": [
                {"role": m.role.value, "content": escape_controls(m.content or "", self._controls)}
                for m in messages
            ],
            "max_tokens": int(kwargs.get("max_tokens", self.max_tokens)),
            "temperature": float(kwargs.get("temperature", self.temperature)),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.seed is not None:
            request["seed"] = self._seed_for(request["messages"])
        return request

    def _request(
        self,
        messages: Sequence[ChatMessage],
        kwargs: dict[str, Any],
        cancel: _Cancel = None,
        on_delta: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """One chat completion, streamed token by token (each piece of text goes to
        ``on_delta`` as llama.cpp produces it) so that it stops within a token once
        ``cancel`` (else the caller's `CANCEL_EVENT`, set when a transform's timeout
        expires) is set; raises `LocalLLMCancelledError` then."""
        server = self._get_server()  # reads the control tokens `_payload` escapes
        request = self._payload(messages, kwargs)
        if cancel is None:
            cancel = CANCEL_EVENT.get()
        events = (*_events(cancel), _IN_FLIGHT.exiting)
        collector = _Collector(events, on_delta, ENOUGH.get(), request["max_tokens"])
        with self._slot_held(events), _IN_FLIGHT:
            result = server.handle_chat_completions(request, collector.on_chunk)
        if isinstance(result, dict) and "error" in result:
            collector.error = result["error"]
        return collector.response()

    async def _arequest(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """`_request` in a worker thread; cancelling the await stops the generation (or
        drops the call before it starts). The threads are this LLM's own, one per slot,
        so every slot can be busy however small the loop's default executor is."""
        cancel = threading.Event()
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        call = functools.partial(ctx.run, self._request, messages, kwargs, cancel)
        try:
            return await loop.run_in_executor(self._executor(), call)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def _seed_for(self, messages: list[dict[str, str]]) -> int:
        """A seed that depends on the prompt and on how often this prompt was asked
        before, not on call order: concurrent runs sample the same set of replies, and
        N samples of one prompt (HyDE's ``num_passages``) still differ."""
        digest = hashlib.blake2b(repr(messages).encode(), digest_size=4).digest()
        base = int.from_bytes(digest, "little")
        with self._lock:
            repeat = self._seen.pop(base, 0)
            self._seen[base] = repeat + 1
            while len(self._seen) > _MAX_SEEDS:
                self._seen.popitem(last=False)
        return int((int(self.seed or 0) + base + 7919 * repeat) % (2**31 - 1))

    @staticmethod
    def _text(response: dict[str, Any]) -> str:
        choices = response.get("choices") or [{}]
        message = choices[0].get("message") or {}
        return str(message.get("content") or "")

    # -- LlamaIndex LLM interface --------------------------------------------------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer ``messages`` with llama.cpp's chat template (blocking); generation stops
        within a token when the calling thread abandons the call."""
        response = self._request(messages, kwargs)
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=self._text(response)),
            raw=response,
        )

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` as one user message (blocking)."""
        response = self._request([ChatMessage(role=MessageRole.USER, content=prompt)], kwargs)
        return CompletionResponse(text=self._text(response), raw=response)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """`chat` without blocking the event loop; cancelling it stops generation."""
        response = await self._arequest(messages, kwargs)
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=self._text(response)),
            raw=response,
        )

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """`complete` without blocking the event loop; cancelling it stops generation."""
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        response = await self._arequest(messages, kwargs)
        return CompletionResponse(text=self._text(response), raw=response)

    def _stream(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> tuple[Producer[dict[str, Any]], threading.Event]:
        """A producer for `_streaming` and the event that stops it: set when the consumer
        stops early; the caller's `CANCEL_EVENT` (a timed-out call) stops it too."""
        stop = threading.Event()
        caller = CANCEL_EVENT.get()
        cancel = (stop,) if caller is None else (stop, caller)

        def produce(emit: Callable[[str], None]) -> dict[str, Any]:
            return self._request(messages, kwargs, cancel, emit)

        return produce, stop

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """Yields each piece of text as llama.cpp produces it (``delta``, with the
        cumulative ``text``); a last chunk with an empty ``delta`` carries the whole
        reply as ``raw`` (with llama.cpp's ``usage``)."""
        produce, stop = self._stream([ChatMessage(role=MessageRole.USER, content=prompt)], kwargs)

        def gen() -> CompletionResponseGen:
            text = ""
            for item in stream_in_thread(produce, stop):
                chunk = _completion_chunk(text, item)
                text = chunk.text
                yield chunk

        return gen()

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """`stream_complete` for chat messages."""
        produce, stop = self._stream(messages, kwargs)

        def gen() -> ChatResponseGen:
            text = ""
            for item in stream_in_thread(produce, stop):
                chunk = _chat_chunk(text, item)
                text = chunk.message.content or ""
                yield chunk

        return gen()

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """`stream_complete` without blocking the event loop; cancelling stops it."""
        produce, stop = self._stream([ChatMessage(role=MessageRole.USER, content=prompt)], kwargs)

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async for item in astream_in_thread(produce, stop):
                chunk = _completion_chunk(text, item)
                text = chunk.text
                yield chunk

        return gen()

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """`stream_chat` without blocking the event loop; cancelling stops it."""
        produce, stop = self._stream(messages, kwargs)

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for item in astream_in_thread(produce, stop):
                chunk = _chat_chunk(text, item)
                text = chunk.message.content or ""
                yield chunk

        return gen()


def _chat_chunk(text: str, item: str | Done[dict[str, Any]]) -> ChatResponse:
    """The chat chunk after ``text``: one more piece, or the end (empty delta, raw reply)."""
    if isinstance(item, Done):
        message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
        return ChatResponse(message=message, delta="", raw=item.value)
    message = ChatMessage(role=MessageRole.ASSISTANT, content=text + item)
    return ChatResponse(message=message, delta=item)


def _completion_chunk(text: str, item: str | Done[dict[str, Any]]) -> CompletionResponse:
    """The completion chunk after ``text``: one more piece, or the end (empty delta, raw)."""
    if isinstance(item, Done):
        return CompletionResponse(text=text, delta="", raw=item.value)
    return CompletionResponse(text=text + item, delta=item)
