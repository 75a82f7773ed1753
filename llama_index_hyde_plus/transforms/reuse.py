"""`Reuse`: a transform's generations served again, from its cache and to identical
concurrent calls, so that `LLMTransform` itself only renders, calls, parses and falls
back.

For one cache key a call reads the cache (a hit costs no LLM call), else joins an
identical generation already running (`SingleFlight`: the provider is asked once),
else generates and writes what it made. A cache outside the process is read and
written on its own worker threads (`door`, ``kind="store"``) within
`timeouts.CACHE_TIMEOUT_S`, skipped while it is down: a cache that fails or hangs is a
miss, never an error. Only a complete success is reused (`shareable`), and, by a
cache that keeps them (an evaluation's), a generation whose replies could not be used
(`unusable`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

from ..caching.cache import (
    TransformCache,
    answers_in_process,
    holds_objects,
    keeps_unusable_replies,
)
from ..calls import door, timeouts
from ..calls.door import Deadline, DependencyDownError, ModelTimeoutError
from ..calls.reliability import LLMNotCalledError, describe, failure
from ..calls.singleflight import SingleFlight, WaitExpired
from ..usage import Usage
from .base import TransformResult, logger, revised

_T = TypeVar("_T")


class Owner(Protocol):
    """What `Reuse` reads of its transform, at each call: ``cache`` may be replaced
    (or set to None) at any time, and a call keeps the one it read first."""

    cache: TransformCache | None

    @property
    def method(self) -> str:
        """The transform's method name, kept with each result."""

    def _with_search_options(self, result: TransformResult, **changes: Any) -> TransformResult:
        """A stored result with the transform's own search options, and ``changes``."""


Generate = Callable[[float | None], TransformResult]
"""Makes the generation within the seconds given (None: no bound)."""
Overdue = Callable[[float], TransformResult]
"""The fallback of a caller whose own time ran out while it waited (given its start)."""
Wait = Callable[[], float | None]
"""How long a caller waits on an identical generation (asked on a miss only: a hit
reads no timeout)."""


class Reuse:
    """One transform's reuse of its generations (module docstring)."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self._flights: SingleFlight[TransformResult] = SingleFlight()

    def get(
        self, key: str, query: str, generate: Generate, wait: Wait, overdue: Overdue
    ) -> TransformResult:
        """The result for ``key``: a cache hit, an identical call's generation (waited
        for at most ``wait()`` seconds, else ``overdue``), or ``generate``'s, written to
        the cache once the callers waiting on it have it."""
        start = time.perf_counter()
        cache = self._owner.cache  # this call's, whatever the transform holds meanwhile
        hit, answered = None, False
        if cache is not None:
            hit, answered = self._io(cache, lambda: self._lookup(cache, key, query, start), "read")
        if hit is not None:
            return hit

        def write(result: TransformResult) -> None:
            if answered and cache is not None:  # one whose read overran: no write either
                self._io(cache, lambda: self._store(cache, key, result), "write")

        try:
            result, shared = self._flights.run(key, generate, wait(), after=write)
        except WaitExpired:
            return overdue(start)
        return as_waiter(result, start) if shared else result

    async def aget(
        self,
        key: str,
        query: str,
        generate: Callable[[float | None], Awaitable[TransformResult]],
        wait: Wait,
        overdue: Overdue,
    ) -> TransformResult:
        """`get` on the async path: cache calls never block the loop, and cancelling
        the await abandons them."""
        start = time.perf_counter()
        cache = self._owner.cache  # see get
        hit, answered = None, False
        if cache is not None:
            read = partial(self._lookup, cache, key, query, start)
            hit, answered = await self._aio(cache, read, "read")
        if hit is not None:
            return hit

        async def write(result: TransformResult) -> None:
            if answered and cache is not None:  # see get
                await self._aio(cache, lambda: self._store(cache, key, result), "write")

        try:
            result, shared = await self._flights.arun(key, generate, wait(), after=write)
        except WaitExpired:
            return overdue(start)
        return as_waiter(result, start) if shared else result

    def _lookup(
        self, cache: TransformCache, key: str, query: str, start: float
    ) -> TransformResult | None:
        """The cached result under ``key`` as this call's hit, or None: a miss, an entry
        that does not serve ``query`` (`serves`), one of another shape than a result
        record (`TransformResult.from_dict` refuses it: the generation made instead
        overwrites it), or a cache that failed."""
        try:
            data = cache.get(key)
            if data is None:
                return None
            # an in-process cache holds the (immutable) result itself: no decoding
            try:
                stored = (
                    data if isinstance(data, TransformResult) else TransformResult.from_dict(data)
                )
            except ValueError as exc:
                logger.warning("transform cache entry unusable (%s); calling the LLM", exc)
                return None
            method = self._owner.method
            serve = self._owner._with_search_options
            if not serves(stored, query, method):
                if not (keeps_unusable_replies(cache) and replays(stored, query, method)):
                    return None  # another question's, empty, or partial
                if stored.fallback:  # searched as the question: no options to apply
                    serve = revised
            return serve(stored, **reused(stored, start))
        except BaseException as exc:
            said = describe(failure(exc))
            logger.warning("transform cache read failed (%s); calling the LLM", said)
            return None

    def _store(self, cache: TransformCache, key: str, result: TransformResult) -> None:
        if not (shareable(result) or (keeps_unusable_replies(cache) and unusable(result))):
            return  # never cache an outage, nor a generation some of whose calls failed
        try:
            # a hit's searches are rebuilt (`_with_search_options`): `to_dict` leaves them out
            value: Any = replace(result, specs=()) if holds_objects(cache) else result.to_dict()
            cache.set(key, value)
        except BaseException as exc:
            logger.warning("transform cache write failed (%s)", describe(failure(exc)))

    @staticmethod
    def _on_threads(cache: TransformCache, what: str) -> dict[str, Any] | None:
        """How `door.run` makes a call on the cache: on its own worker threads (a store
        that hangs holds only those, never the caller nor the loop's executor), within
        `timeouts.CACHE_TIMEOUT_S`, skipped while it is down (`outage.Outage`); None for
        a cache that answers in this process (called in place)."""
        if answers_in_process(cache):
            return None
        deadline = Deadline.start(timeouts.CACHE_TIMEOUT_S)
        return {"on": cache, "kind": "store", "deadline": deadline,
                "what": f"transform cache {what}", "skip_when_down": True}  # fmt: skip

    def _io(
        self, cache: TransformCache, call: Callable[[], _T | None], what: str
    ) -> tuple[_T | None, bool]:
        """``(value, answered)`` of ``call`` on the cache: in place for an in-process
        cache, else through `door.run` (past its bound, or with the cache skipped,
        ``(None, False)``: a read is a miss and a write is dropped)."""
        how = self._on_threads(cache, what)
        if how is None:
            return call(), True
        try:
            return door.run(call, **how), True
        except (ModelTimeoutError, LLMNotCalledError) as exc:
            return _skipped(exc, what)

    async def _aio(
        self, cache: TransformCache, call: Callable[[], _T | None], what: str
    ) -> tuple[_T | None, bool]:
        """`_io` on the async path: cancelling the await abandons the call."""
        how = self._on_threads(cache, what)
        if how is None:
            return call(), True
        try:
            return await door.arun(call, **how), True
        except (ModelTimeoutError, LLMNotCalledError) as exc:
            return _skipped(exc, what)


def _skipped(exc: Exception, what: str) -> tuple[None, bool]:
    """A cache call that overran (say so) or was not made: a miss, or no write."""
    if isinstance(exc, ModelTimeoutError):
        then = "not cached" if what == "write" else "calling the LLM"
        logger.warning("%s; %s", exc, then)
    elif not isinstance(exc, DependencyDownError):  # said when it overran
        logger.warning("the transform cache is not answering; skipping it")
    return None, False


def serves(stored: TransformResult, query: str, method: str) -> bool:
    """Whether a cached ``stored`` may answer ``query``: a complete generation
    (`shareable`) of this very question by this method, with something generated in
    it (passages, or a query other than the question)."""
    return (
        stored.query == query
        and stored.method == method
        and shareable(stored)
        and _generated(stored, query)
    )


def _generated(stored: TransformResult, query: str) -> bool:
    """Whether ``stored`` holds something generated: passages, or a query other than
    the question."""
    return bool(stored.hypothetical or any(q != query for q in stored.queries))


def unusable(result: TransformResult) -> bool:
    """Whether ``result`` is a generation the model answered, some or all of it
    unusable (its error an ``UnusableReplyError``: an empty or unparseable reply, not
    a failed call): what a cache that `keeps_unusable_replies` also keeps."""
    return (result.error or "").startswith("UnusableReplyError")


def replays(stored: TransformResult, query: str, method: str) -> bool:
    """Whether a cache that `keeps_unusable_replies` serves ``stored``, which `serves`
    refused, to ``query``: an `unusable` generation of this question by this method,
    served again as it was: a fallback that searches the question alone (nothing else
    in it), or a partial generation holding something generated, as `serves` asks."""
    if stored.query != query or stored.method != method or not unusable(stored):
        return False
    if stored.fallback:
        return not (stored.queries or stored.hypothetical or stored.children)
    return _generated(stored, query)


def shareable(result: TransformResult) -> bool:
    """The one rule for reusing a generation, from a cache or by identical concurrent
    calls: only a complete success, no call of which failed. A fallback is an outage;
    a result with ``error`` set (HyDE with one of three calls failed) holds fewer
    passages and an old error, and reusing it would keep the healthy provider from
    ever being asked again."""
    return not result.fallback and result.error is None


def as_waiter(result: TransformResult, start: float) -> TransformResult:
    """What an identical concurrent call's ``result`` is to a caller that waited for
    it: a complete generation as a cache hit (no usage, the generation's kept); a
    failure (a fallback, or some calls failed) as this caller's own, with its own
    latency and no usage (it made no call, and asking the provider again would wait
    out its timeout once more)."""
    if not shareable(result):
        return replace(
            result, usage=Usage(), generation_usage=None, latency_s=time.perf_counter() - start
        )
    return revised(result, **reused(result, start))


def reused(result: TransformResult, start: float) -> dict[str, Any]:
    """What a generation served again (a cache hit, an identical call's) changes in
    ``result``: no usage of its own (the generation's is kept), marked cached, with
    the latency of the call it answers (started at ``start``)."""
    return {
        "usage": Usage(cached=True),
        "cached": True,
        "generation_usage": result.generation_usage or result.usage,
        "latency_s": time.perf_counter() - start,
    }
