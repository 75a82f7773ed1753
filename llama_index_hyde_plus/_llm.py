"""One LLM call, through LlamaIndex's own ``complete``/``acomplete``, with its usage.

The call goes through the LLM's public methods so that its callback manager and the
instrumentation dispatcher see it. When the host's callback manager (by default
``Settings.callback_manager``) has handlers the LLM's own manager lacks, as happens
for any LLM built without ``callback_manager=``, the same LLM event is reported to
those handlers too, so a ``TokenCountingHandler`` on ``Settings`` counts our calls on
the sync and async paths alike, exactly once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.llms import LLM

from .reliability import (
    NO_RETRY,
    CircuitBreaker,
    CircuitOpenError,
    LLMTimeoutError,
    RetryPolicy,
    is_transient,
)

__all__ = ["LLMReply", "LLMTimeoutError", "acomplete", "complete"]
from ._workers import DaemonWorkers
from .usage import ModelPrice, Usage, usage_for_call

logger = logging.getLogger(__name__)


#: Set by `complete` for the thread that runs an attempt: the event is set when the
#: attempt times out, so an LLM that can stop mid-generation (`LocalLLM`) does.
CANCEL_EVENT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "hyde_plus_cancel_event", default=None
)


def has_native_async(llm: Any) -> bool:
    """False for an LLM whose ``acomplete`` is LlamaIndex's `CustomLLM` default, which
    just calls the blocking ``complete`` on the event loop."""
    from llama_index.core.llms.custom import CustomLLM

    if not isinstance(llm, CustomLLM):
        return True
    # the class that defines acomplete (LlamaIndex re-wraps inherited methods per
    # subclass for instrumentation, so identity with CustomLLM.acomplete does not hold)
    owner = next(k for k in type(llm).__mro__ if "acomplete" in vars(k))
    return owner is not CustomLLM


def _needs_loading(llm: Any) -> bool:
    """True for an LLM that loads lazily (``loaded`` is False and it has ``warm_up``)."""
    return getattr(llm, "loaded", True) is False and callable(getattr(llm, "warm_up", None))


@dataclass(frozen=True)
class LLMReply:
    text: str
    usage: Usage
    model_id: str | None = None
    """The model id the provider reported in its response, when it did."""


def _reported_model(raw: Any) -> str | None:
    value = raw.get("model") if isinstance(raw, Mapping) else getattr(raw, "model", None)
    return str(value) if isinstance(value, str) and value else None


def model_name(llm: Any) -> str | None:
    """The model id an LLM reports (``metadata.model_name``, else ``.model``)."""
    try:
        name = llm.metadata.model_name
    except Exception:
        name = None
    if not name or name == "unknown":
        name = getattr(llm, "model", None)
    return str(name) if name else None


SMALL_GENERATORS: tuple[str, ...] = ("SmolLM2-135M",)
"""Model-name prefixes of the generators measured too weak for the capable-model
defaults: the bundled SmolLM2-135M (BENCHMARKS.md, issue #23)."""
_SMALL_PREFIXES = tuple(p.lower() for p in SMALL_GENERATORS)  # read on every search


def generator_kind(llm: Any) -> str:
    """``"small"`` for a generator listed in `SMALL_GENERATORS` (the bundled local
    model), else ``"capable"``: which set of shipped defaults a transform uses."""
    name = (model_name(llm) or "").lower()
    return "small" if name.startswith(_SMALL_PREFIXES) else "capable"


def is_local(llm: Any) -> bool:
    """True for LLMs that run on this machine and cost nothing per token."""
    return bool(getattr(llm, "is_local", False))


def _missing_handlers(llm: LLM, host: CallbackManager | None) -> list[Any]:
    if host is None:
        return []
    own = getattr(llm, "callback_manager", None)
    own_handlers = list(own.handlers) if own is not None else []
    return [h for h in host.handlers if not any(h is o for o in own_handlers)]


def _report_to_host(handlers: list[Any], prompt: str, response: CompletionResponse) -> None:
    if not handlers:
        return
    manager = CallbackManager(handlers)
    with manager.event(CBEventType.LLM, payload={EventPayload.PROMPT: prompt}) as event:
        event.on_end(payload={EventPayload.PROMPT: prompt, EventPayload.COMPLETION: response})


@dataclass(frozen=True)
class CallOptions:
    """How one LLM call is made (`complete`, `acomplete`): ``temperature`` and
    ``max_tokens`` go to the model (None: its own); ``timeout`` bounds the whole call,
    retries included; ``prices`` price its usage; ``host_callback_manager`` is told
    of it when the LLM's own handlers are not; ``retry`` and ``breaker`` decide
    what a transient error does."""

    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    prices: Mapping[str, ModelPrice] | None = None
    host_callback_manager: CallbackManager | None = None
    retry: RetryPolicy = NO_RETRY
    breaker: CircuitBreaker | None = None

    def llm_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the model's ``complete`` receives."""
        kwargs: dict[str, Any] = {}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        return kwargs


DEFAULTS = CallOptions()


def _reply(
    llm: LLM, prompt: str, response: CompletionResponse, prices: Mapping[str, ModelPrice] | None
) -> LLMReply:
    text = response.text or ""
    usage = usage_for_call(
        prompt=prompt,
        completion=text,
        raw=response.raw,
        additional_kwargs=response.additional_kwargs,
        model=model_name(llm),
        local=is_local(llm),
        prices=prices,
    )
    return LLMReply(text=text, usage=usage, model_id=_reported_model(response.raw))


class _Attempts:
    """The retry driver shared by `complete` and `acomplete`: the breaker is consulted
    before and told after every attempt, transient failures are retried per ``retry``,
    and ``timeout`` bounds the whole call, retries included."""

    def __init__(
        self, retry: RetryPolicy, breaker: CircuitBreaker | None, timeout: float | None
    ) -> None:
        self.retry, self.breaker, self.timeout = retry, breaker, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.attempt = 0

    def budget(self) -> float | None:
        """Seconds the next attempt may take (None: unbounded); raises when the breaker
        is open or the time is up."""
        if self.breaker is not None and not self.breaker.allow():
            raise CircuitOpenError(
                f"circuit breaker for {self.breaker.name} is open; not calling the LLM"
            )
        if self.deadline is None:
            return None
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.timed_out()
        return remaining

    def timed_out(self) -> LLMTimeoutError:
        return LLMTimeoutError(f"LLM did not answer within {self.timeout:g}s")

    def succeeded(self) -> None:
        if self.breaker is not None:
            self.breaker.record_success()

    def failed(self, exc: Exception) -> float:
        """Record the failure; the pause before the next attempt, or ``exc`` raised
        when it is not worth retrying (not transient, retries or time used up)."""
        if self.breaker is not None:
            self.breaker.record_failure()
        if self.attempt >= self.retry.max_retries or not is_transient(exc):
            raise exc
        pause = self.retry.delay(self.attempt)
        if self.deadline is not None and time.monotonic() + pause >= self.deadline:
            raise exc
        self.attempt += 1
        logger.info(
            "transient LLM error (%s: %s); retry %d of %d in %.2fs",
            type(exc).__name__,
            exc,
            self.attempt,
            self.retry.max_retries,
            pause,
        )
        return pause


def complete(llm: LLM, prompt: str, options: CallOptions = DEFAULTS) -> LLMReply:
    """Blocking completion, made as ``options`` say (`CallOptions`).

    The timeout bounds the whole call, retries included: each attempt runs in a daemon
    thread and `LLMTimeoutError` is raised when the budget runs out (the thread is
    abandoned, and told through `CANCEL_EVENT` so an LLM that can stop generating
    does). A lazily loaded local model is loaded before the clock starts. Transient
    errors are retried per ``options.retry``; its breaker is consulted before and told
    after every attempt."""
    kwargs = options.llm_kwargs()

    def call() -> CompletionResponse:
        return llm.complete(prompt, **kwargs)

    if _needs_loading(llm):
        # loading a local model is not answering: it happens before the clock starts
        getattr(llm, "warm_up")()  # noqa: B009
    attempts = _Attempts(options.retry, options.breaker, options.timeout)
    while True:
        budget = attempts.budget()
        try:
            response = call() if budget is None else _call_with_timeout(call, budget, attempts)
        except Exception as exc:
            time.sleep(attempts.failed(exc))
            continue
        attempts.succeeded()
        break
    _report_to_host(_missing_handlers(llm, options.host_callback_manager), prompt, response)
    return _reply(llm, prompt, response, options.prices)


#: The threads sync calls with a timeout run on (reused; see `_workers`).
WORKERS = DaemonWorkers()


def _call_with_timeout(call: Any, timeout: float, attempts: _Attempts) -> CompletionResponse:
    """``call()`` on a worker thread; `LLMTimeoutError` after ``timeout`` seconds (the
    attempt is told through `CANCEL_EVENT`, which is set in the worker's context)."""
    cancel = threading.Event()

    def attempt() -> Any:
        CANCEL_EVENT.set(cancel)
        return call()

    box, done = WORKERS.submit(attempt)
    if not done.wait(timeout):
        cancel.set()
        raise attempts.timed_out()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def acomplete(llm: LLM, prompt: str, options: CallOptions = DEFAULTS) -> LLMReply:
    """Async completion: the async twin of `complete`; an overrun attempt is cancelled.

    An LLM with native async runs ``llm.acomplete``; one that only implements the
    blocking ``complete`` (LlamaIndex's `CustomLLM` default ``acomplete``) runs it in a
    worker thread, so the event loop keeps running and the timeout holds (the thread is
    abandoned and told through `CANCEL_EVENT`). A lazily loaded local model is loaded
    (in a thread) before the clock starts."""
    if _needs_loading(llm):
        await asyncio.to_thread(getattr(llm, "warm_up"))  # noqa: B009
    native = has_native_async(llm)
    kwargs = options.llm_kwargs()
    attempts = _Attempts(options.retry, options.breaker, options.timeout)
    while True:
        budget = attempts.budget()
        cancel = None if native else threading.Event()  # only a thread needs telling
        if cancel is None:
            coro = llm.acomplete(prompt, **kwargs)
        else:
            coro = _in_thread(llm, prompt, kwargs, cancel)
        try:
            response = await _bounded(coro, budget, cancel, attempts)
        except Exception as exc:
            await asyncio.sleep(attempts.failed(exc))
            continue
        attempts.succeeded()
        break
    _report_to_host(_missing_handlers(llm, options.host_callback_manager), prompt, response)
    return _reply(llm, prompt, response, options.prices)


async def _bounded(
    coro: Any, budget: float | None, cancel: threading.Event | None, attempts: _Attempts
) -> CompletionResponse:
    """Await one attempt within ``budget`` seconds; on overrun it is cancelled and
    ``cancel`` set (for an attempt running in a thread)."""
    if budget is None:
        return await coro  # type: ignore[no-any-return]
    try:
        if sys.version_info >= (3, 11):  # a deadline on this task: no task, no extra hop
            async with asyncio.timeout(budget):
                return await coro  # type: ignore[no-any-return]
        return await asyncio.wait_for(coro, budget)
    except asyncio.TimeoutError as exc:
        if cancel is not None:
            cancel.set()
        raise attempts.timed_out() from exc


async def _in_thread(
    llm: LLM, prompt: str, kwargs: dict[str, Any], cancel: threading.Event
) -> CompletionResponse:
    """``llm.complete`` in a worker thread; cancelling the await sets ``cancel``."""
    ctx = contextvars.copy_context()
    ctx.run(CANCEL_EVENT.set, cancel)
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, lambda: ctx.run(llm.complete, prompt, **kwargs))
    try:
        return await future
    except asyncio.CancelledError:
        cancel.set()
        raise
