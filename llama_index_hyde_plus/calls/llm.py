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
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.llms import LLM

from .._attrs import optional_attr, overrides
from ..usage import ModelPrice, Usage, usage_for_call
from . import door
from .door import CANCEL_EVENT
from .reliability import (
    NO_RETRY,
    CircuitBreaker,
    CircuitOpenError,
    LLMTimeoutError,
    Outcome,
    Permit,
    RetryPolicy,
    as_failure,
    counts_against_provider,
    is_transient,
    propagates,
)
from .timeouts import is_local, with_slot_wait
from .workers import DaemonWorkers, Job

__all__ = ["LLMReply", "LLMTimeoutError", "acomplete", "complete", "complete_all"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def has_native_async(llm: Any) -> bool:
    """False for an LLM whose ``acomplete`` is LlamaIndex's `CustomLLM` default, which
    just calls the blocking ``complete`` on the event loop (`overrides`: through a
    proxy too)."""
    from llama_index.core.llms.custom import CustomLLM

    return overrides(llm, "acomplete", CustomLLM)


def _needs_loading(llm: Any) -> bool:
    """True for an LLM that loads lazily (``loaded`` is False and it has ``warm_up``)."""
    return optional_attr(llm, "loaded", True) is False and callable(optional_attr(llm, "warm_up"))


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
        name = optional_attr(llm, "model")
    return str(name) if name else None


SMALL_GENERATORS: tuple[str, ...] = ("SmolLM2-135M",)
"""Model-name prefixes of the generators measured too weak for the capable-model
defaults: the bundled SmolLM2-135M (BENCHMARKS.md)."""
_SMALL_PREFIXES = tuple(p.lower() for p in SMALL_GENERATORS)  # read on every search


def generator_kind(llm: Any) -> str:
    """``"small"`` for a generator listed in `SMALL_GENERATORS` (the bundled local
    model), else ``"capable"``: which set of shipped defaults a transform uses."""
    name = (model_name(llm) or "").lower()
    return "small" if name.startswith(_SMALL_PREFIXES) else "capable"


def _missing_handlers(llm: LLM, host: CallbackManager | None) -> list[Any]:
    if host is None:
        return []
    own = getattr(llm, "callback_manager", None)
    own_handlers = list(own.handlers) if own is not None else []
    return [h for h in host.handlers if not any(h is o for o in own_handlers)]


def _handlers_to_tell(llm: LLM, options: CallOptions, response: CompletionResponse) -> list[Any]:
    """The handlers `_report_to_host` tells of ``response``: the host's that the LLM's
    own manager lacks and, for a generation stopped early (`STOPPED_EARLY`), the LLM's
    own too, since LlamaIndex ended their event when the stream was closed with an
    exception payload and no tokens (``TokenCountingHandler`` counted 0)."""
    handlers = _missing_handlers(llm, options.host_callback_manager)
    raw = response.raw
    if isinstance(raw, Mapping) and raw.get(STOPPED_EARLY) is True:
        own = getattr(llm, "callback_manager", None)
        handlers = [*(own.handlers if own is not None else ()), *handlers]
    return handlers


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
    what a transient error does; ``enough`` stops a streamed reply early."""

    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    prices: Mapping[str, ModelPrice] | None = None
    host_callback_manager: CallbackManager | None = None
    retry: RetryPolicy = NO_RETRY
    breaker: CircuitBreaker | None = None
    enough: Callable[[str], bool] | None = None
    """True for a reply so far that holds all the caller keeps of it: an LLM that
    `streams` stops generating there (the tokens it did not write are counted in
    ``Usage.tokens_saved``). None: the whole reply is generated."""

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
    raw = response.raw
    if isinstance(raw, Mapping) and raw.get(STOPPED_EARLY) is True:
        usage = _stopped_usage(usage, prompt, raw)
    return LLMReply(text=text, usage=usage, model_id=_reported_model(response.raw))


STOPPED_EARLY = "hyde_plus_stopped_early"
"""Set in the ``raw`` reply of a generation stopped once it held what is kept, with
``pieces`` (the tokens written: one a streamed piece, for llama.cpp and OpenAI-style
servers) and ``cap`` (the tokens it was allowed)."""

#: Set by `complete`/`acomplete` for an LLM that stops itself (`stops_when_enough`):
#: its `CallOptions.enough`, read where the reply is generated (`LocalLLM`).
ENOUGH: contextvars.ContextVar[Callable[[str], bool] | None] = contextvars.ContextVar(
    "hyde_plus_enough", default=None
)


def stops_when_enough(llm: Any) -> bool:
    """Whether ``llm`` reads `ENOUGH` and stops generating there itself (its class
    sets ``stops_when_enough = True``, as `LocalLLM` does)."""
    return getattr(type(llm), "stops_when_enough", False) is True


def streams(llm: Any) -> bool:
    """Whether ``llm``'s class says its ``stream_complete`` hands the reply on as it is
    written (``streams_replies = True``), so reading it can stop once it holds what is
    kept (`CallOptions.enough`). Opt-in: a streamed OpenAI reply carries no provider
    token counts unless asked for in a provider-specific way, and a `CustomLLM`'s
    stream is often its whole reply made by ``complete`` (reported twice), so other
    LLMs answer in full, within the token cap the transform sets."""
    return getattr(type(llm), "streams_replies", False) is True


def _stopped_usage(usage: Usage, prompt: str, raw: Mapping[str, Any]) -> Usage:
    """The usage of a generation stopped early: no provider counts came (they end the
    reply), so the tokens written are its pieces, the prompt's estimated, and
    ``tokens_saved`` what the cap still allowed."""
    from ..usage import estimate_tokens

    pieces, cap = raw.get("pieces"), raw.get("cap")
    if type(pieces) is not int:
        return usage
    prompt_tokens = usage.input_tokens if usage.usage_source == "provider" else None
    if prompt_tokens is None:
        prompt_tokens = estimate_tokens(prompt)
    return replace(
        usage,
        input_tokens=prompt_tokens,
        output_tokens=pieces,
        total_tokens=prompt_tokens + pieces,
        usage_source="estimated",
        tokens_saved=max(0, cap - pieces) if type(cap) is int else 0,
    )


def _cap(llm: Any, kwargs: Mapping[str, Any]) -> int | None:
    cap = kwargs.get("max_tokens", optional_attr(llm, "max_tokens"))
    return cap if type(cap) is int and cap > 0 else None


def _stopped(
    llm: Any, last: CompletionResponse | None, pieces: int, kwargs: dict[str, Any]
) -> CompletionResponse:
    """The reply of a stream stopped after ``pieces`` pieces (`STOPPED_EARLY`)."""
    raw = {STOPPED_EARLY: True, "pieces": pieces, "cap": _cap(llm, kwargs)}
    return CompletionResponse(text=last.text if last is not None else "", raw=raw)


def _stream_until(
    llm: LLM, prompt: str, kwargs: dict[str, Any], enough: Callable[[str], bool]
) -> CompletionResponse:
    """``llm.stream_complete`` read until ``enough(text)``; closing the stream then
    stops the generation (a local model stops within a token, a remote stream is
    closed). A stream that ends on its own is its last chunk, provider counts and all.
    Once the call is abandoned (`CANCEL_EVENT` set: its caller's time ran out) the
    stream is closed at the next chunk and `LLMTimeoutError` raised (nobody reads it)."""
    cancel = CANCEL_EVENT.get()
    stream = llm.stream_complete(prompt, **kwargs)
    last: CompletionResponse | None = None
    pieces = 0
    try:
        for chunk in stream:
            if cancel is not None and cancel.is_set():
                raise LLMTimeoutError("the call was abandoned; stopped reading its stream")
            last, pieces = chunk, pieces + bool(chunk.delta)
            if enough(chunk.text or ""):
                return _stopped(llm, last, pieces, kwargs)
    finally:
        stream.close()
    return last if last is not None else CompletionResponse(text="")


async def _astream_until(
    llm: LLM, prompt: str, kwargs: dict[str, Any], enough: Callable[[str], bool]
) -> CompletionResponse:
    """`_stream_until` with ``astream_complete``."""
    stream = await llm.astream_complete(prompt, **kwargs)
    last: CompletionResponse | None = None
    pieces = 0
    try:
        async for chunk in stream:
            last, pieces = chunk, pieces + bool(chunk.delta)
            if enough(chunk.text or ""):
                return _stopped(llm, last, pieces, kwargs)
    finally:
        await stream.aclose()
    return last if last is not None else CompletionResponse(text="")


class _Attempts:
    """The retry driver shared by `complete` and `acomplete` (the paths only do I/O).

    Used as ``with attempts:`` around one call's attempts: entering takes a breaker
    permit (`CircuitOpenError` when there is none), leaving settles it exactly once, as
    a success, a failure (when an attempt failed in a way that
    `counts_against_provider`), or released: cancelled, interrupted, a bad request, or
    the LLM not called at all. A call counts once, whatever its retries. Transient
    failures are retried per ``retry``; ``timeout`` bounds the whole call, retries
    included. ``in_task``: the attempts run on the async path (see `propagates`)."""

    def __init__(self, options: CallOptions, *, in_task: bool = False) -> None:
        self.retry, self.breaker, self.timeout = options.retry, options.breaker, options.timeout
        self.in_task = in_task
        self.deadline: door.Deadline | None = None  # `Deadline.start`, one call fewer
        if self.timeout is not None:
            self.deadline = door.Deadline(self.timeout, time.monotonic() + self.timeout)
        self.attempt = 0
        self._permit: Permit | None = None
        self._counted = False  # an attempt failed in a way the breaker counts

    def __enter__(self) -> _Attempts:
        if self.breaker is not None:
            self._permit = self.breaker.acquire()
            if self._permit is None:
                raise CircuitOpenError(
                    f"circuit breaker for {self.breaker.name} is open; not calling the LLM"
                )
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        permit, self._permit = self._permit, None
        if self.breaker is None or permit is None:
            return
        outcome: Outcome = "success" if exc is None else "released"
        counted = exc is not None and (self._counted or counts_against_provider(exc))
        if counted and not propagates(exc, in_task=self.in_task):  # type: ignore[arg-type]
            outcome = "failure"
        self.breaker.settle(permit, outcome)

    def budget(self) -> float | None:
        """Seconds the next attempt may take (None: unbounded); raises `LLMTimeoutError`
        when the time is up."""
        left = None if self.deadline is None else self.deadline.left()
        if left == 0:
            raise self.timed_out()
        return left

    def timed_out(self) -> LLMTimeoutError:
        return LLMTimeoutError(f"LLM did not answer within {self.timeout:g}s")

    def failed(self, exc: BaseException) -> float:
        """The pause before the next attempt, after ``exc``. Raises ``exc`` itself when
        it must propagate (`propagates`); else, when it is not worth retrying (not
        transient, retries or time used up, or the breaker opened meanwhile), the
        failure as an ``Exception``: our deadline (the door's `ModelTimeoutError`) as
        `LLMTimeoutError`, a non-Exception error from the provider (gevent's
        ``Timeout``...) as an `LLMCallError`."""
        if propagates(exc, in_task=self.in_task):
            raise exc
        if isinstance(exc, door.ModelTimeoutError):
            exc = self.timed_out()
        if counts_against_provider(exc):
            self._counted = True
        pause = self.retry.delay(self.attempt)
        if (
            self.attempt >= self.retry.max_retries
            or not is_transient(exc)
            or (self.deadline is not None and pause >= self.deadline.left())
            or (self._permit == "call" and self._opened())
        ):
            raise as_failure(exc)
        self.attempt += 1
        logger.info(
            "transient LLM error (%s: %s); retry %d of %d in %.2fs",
            type(exc).__name__, exc, self.attempt, self.retry.max_retries, pause,
        )  # fmt: skip
        return pause

    def _opened(self) -> bool:
        return self.breaker is not None and self.breaker.state == "open"


def _stop_rule(llm: Any, options: CallOptions) -> tuple[Callable[[str], bool] | None, bool]:
    """``(enough, itself)``: the rule that stops this call's generation early (None: the
    LLM can neither stop itself nor stream) and whether the LLM applies it itself."""
    enough = options.enough
    if enough is None:
        return None, False
    if stops_when_enough(llm):
        return enough, True
    return (enough, False) if streams(llm) else (None, False)


def times_itself(llm: Any, budget: float) -> bool:
    """Whether ``llm``'s own client gives up within ``budget`` seconds: a request
    ``timeout`` (or ``request_timeout``) in seconds no longer than the budget, and no
    retries of its own (``max_retries=0``; our retries are under the budget). Such a
    call is made in the caller's thread, with no worker to hand it to."""
    try:
        retries = optional_attr(llm, "max_retries")
        limit = optional_attr(llm, "timeout")
        if limit is None:
            limit = optional_attr(llm, "request_timeout")
    except Exception:  # a property that raises vouches for nothing
        return False
    if type(retries) is not int or retries != 0 or not isinstance(limit, (int, float)):
        return False
    return not isinstance(limit, bool) and 0 < limit <= budget


def complete(llm: LLM, prompt: str, options: CallOptions = DEFAULTS) -> LLMReply:
    """Blocking completion, made as ``options`` say (`CallOptions`).

    The timeout bounds the whole call, retries included: an LLM whose own client gives
    up in time (`times_itself`) and is not streamed is called in this thread; any
    other attempt runs through `door.run` (`LLMTimeoutError` once the budget runs out,
    the attempt told through `door.CANCEL_EVENT`). A lazily loaded local model is
    loaded before the clock starts. Transient errors are retried per
    ``options.retry``; its breaker hears of the call once. Every failure raises an
    ``Exception``; only what `propagates` escapes as itself."""
    enough, itself = _stop_rule(llm, options)
    call = _blocking_call(llm, prompt, options.llm_kwargs(), enough, itself)
    if _needs_loading(llm):
        # loading a local model is not answering: it happens before the clock starts
        getattr(llm, "warm_up")()  # noqa: B009
    streamed = enough is not None and not itself  # a client's timeout is per read
    with _slot(llm), _Attempts(options) as attempts:
        while True:
            budget = attempts.budget()
            try:
                if budget is None or (not streamed and times_itself(llm, budget)):
                    response = call()  # in this thread: no hand-off
                else:
                    response = door.run(
                        call, on=llm, deadline=attempts.deadline, what=_WHAT, cancellable=True
                    )
                break
            except BaseException as exc:
                time.sleep(attempts.failed(exc))
    _report_to_host(_handlers_to_tell(llm, options, response), prompt, response)
    return _reply(llm, prompt, response, options.prices)


def _slot(llm: Any) -> AbstractContextManager[object]:
    """A slot of a model that hands out a fixed number (`LocalLLM.generation_slot`),
    taken before the call's clock starts, so that its timeout counts from when it can
    generate, not from when it queued; for any other model, nothing."""
    take = optional_attr(llm, "generation_slot")
    return take() if callable(take) else nullcontext()


def _aslot(llm: Any) -> AbstractAsyncContextManager[object]:
    """`_slot` on the async path (`LocalLLM.ageneration_slot`)."""
    take = optional_attr(llm, "ageneration_slot")
    return take() if callable(take) else nullcontext()


CALLERS = DaemonWorkers(max_busy=256, name="hyde-plus-llm-call", cap="callers")
"""The threads `complete_all` runs its calls' retry loops on (they wait on the LLM's
pool, so they take slots of a cap of their own)."""


def complete_all(
    llm: LLM, prompt: str, options: CallOptions, n: int
) -> list[LLMReply | BaseException]:
    """``n`` blocking completions at once, as the async path gathers them: each is a
    `complete` (its own retries, all under one deadline, which a model that hands out
    slots lengthens by its wait for one) and the list holds, in order, each reply or
    what its call raised. The first runs in the caller's thread, the
    others on `CALLERS`; a lazily loaded model is loaded once, before any starts."""
    if _needs_loading(llm):
        getattr(llm, "warm_up")()  # noqa: B009
    deadline = door.Deadline.start(with_slot_wait(llm, options.timeout))
    jobs = [_caller(partial(complete, llm, prompt, options)) for _ in range(n - 1)]
    outcomes: list[LLMReply | BaseException] = []
    try:
        outcomes.append(complete(llm, prompt, options))
    except Exception as exc:
        outcomes.append(exc)
    for job in jobs:
        if isinstance(job, Job) and not job.done.wait(_left(deadline)):
            job.abandon()  # it waited in line for a thread: it ends by itself
            job = LLMTimeoutError(f"LLM did not answer within {options.timeout:g}s")
        try:
            outcomes.append(job.result() if isinstance(job, Job) else job)
        except BaseException as exc:
            outcomes.append(exc)
    return outcomes


def _left(deadline: door.Deadline | None) -> float | None:
    return None if deadline is None else deadline.left()


def _caller(call: Callable[[], LLMReply]) -> Job | Exception:
    """``call`` on `CALLERS`, or what starting it raised (no thread could be started):
    that call's outcome, never the transform's."""
    try:
        return CALLERS.submit(call)
    except Exception as exc:
        return exc


def _blocking_call(
    llm: LLM, prompt: str, kwargs: dict[str, Any], enough: Callable[[str], bool] | None,
    itself: bool,
) -> Callable[[], CompletionResponse]:  # fmt: skip
    """One blocking attempt: ``llm.complete``, streamed until ``enough`` (when given),
    or with `ENOUGH` set for an LLM that stops itself (``itself``)."""
    if enough is not None and not itself:
        return partial(_stream_until, llm, prompt, kwargs, enough)
    call = partial(llm.complete, prompt, **kwargs)
    return partial(_told, enough, call) if itself else call


_WHAT = "the LLM"


async def acomplete(llm: LLM, prompt: str, options: CallOptions = DEFAULTS) -> LLMReply:
    """The async twin of `complete`: an LLM with native async runs ``llm.acomplete``
    (as a task dropped at the deadline: `door.await_within`, so our deadline is never
    confused with a ``TimeoutError`` the provider raised); one that only implements
    the blocking ``complete`` runs it through `door.arun` (never on the loop nor its
    default executor). The task's own cancellation propagates; any other failure
    raises an ``Exception``."""
    if _needs_loading(llm):
        await door.arun(getattr(llm, "warm_up"), on=llm, what=_WHAT)  # noqa: B009
    kwargs = options.llm_kwargs()
    enough, itself = _stop_rule(llm, options)
    call = None if has_native_async(llm) else _blocking_call(llm, prompt, kwargs, enough, itself)
    async with _aslot(llm):
        with _Attempts(options, in_task=True) as attempts:
            while True:
                attempts.budget()
                deadline = attempts.deadline
                try:
                    if call is not None:  # on a worker thread, abandoned at the deadline
                        response = await door.arun(
                            call, on=llm, deadline=deadline, what=_WHAT, cancellable=True
                        )
                    else:
                        coro = _native(llm, prompt, kwargs, enough, itself)
                        response = await door.await_within(coro, deadline, _WHAT)
                    break
                except BaseException as exc:
                    await asyncio.sleep(attempts.failed(exc))
    _report_to_host(_handlers_to_tell(llm, options, response), prompt, response)
    return _reply(llm, prompt, response, options.prices)


def _native(
    llm: LLM, prompt: str, kwargs: dict[str, Any], enough: Callable[[str], bool] | None,
    itself: bool,
) -> Awaitable[CompletionResponse]:  # fmt: skip
    """One native async attempt, as `_blocking_call` makes a blocking one."""
    if enough is not None and not itself:
        return _astream_until(llm, prompt, kwargs, enough)
    coro = llm.acomplete(prompt, **kwargs)
    return _atold(enough, coro) if itself else coro


def _told(enough: Callable[[str], bool] | None, call: Callable[[], T]) -> T:
    """``call()`` with `ENOUGH` set to ``enough``."""
    told = ENOUGH.set(enough)
    try:
        return call()
    finally:
        ENOUGH.reset(told)


async def _atold(enough: Callable[[str], bool] | None, coro: Any) -> CompletionResponse:
    """``await coro`` with `ENOUGH` set to ``enough`` (in this task's context, which
    the call copies when it starts)."""
    told = ENOUGH.set(enough)
    try:
        return await coro  # type: ignore[no-any-return]
    finally:
        ENOUGH.reset(told)
