"""`SingleFlight`: identical concurrent work done once, shared with those who wait.

Sync callers (threads) wait on an event, async ones (one loop) await the leader's
future without being able to cancel it. Each caller has its own time: the leader
hands its budget to the work; a waiter waits at most until its own time runs out
(`WaitExpired`) and is handed the leader's value (a failure returned as a value
included), so a hung provider is waited on once. Only when the leader's work raised
(its own cancellation or interrupt) does a waiter do the work, with what is left of
its time. The value is handed over before the leader's ``after`` (a cache write).
What the leader ends with is never raised in a waiter.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class WaitExpired(TimeoutError):
    """A waiter's own time ran out while the identical work it waited on still ran (or
    before it could start the work itself)."""


class _Flight(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: tuple[T] | None = None
        """``(value,)`` once the leader's work returned; None if it raised."""


def _left(timeout: float | None, started: float) -> float | None:
    """What is left of ``timeout`` seconds from ``started`` (None: no bound);
    `WaitExpired` when nothing is."""
    if timeout is None:
        return None
    left = timeout - (time.monotonic() - started)
    if left <= 0:
        raise WaitExpired(f"no answer within {timeout:g}s")
    return left


class SingleFlight(Generic[T]):
    """Deduplicates work by key while it is in progress (nothing is kept after)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: dict[str, _Flight[T]] = {}
        self._async: dict[str, asyncio.Future[tuple[T] | None]] = {}

    def run(
        self,
        key: str,
        work: Callable[[float | None], T],
        timeout: float | None = None,
        after: Callable[[T], object] | None = None,
    ) -> tuple[T, bool]:
        """``(value, shared)``: ``work(timeout)``'s value, or, when ``shared``, the value
        a concurrent leader's work returned (the caller did no work).

        Args:
            key: what identical work shares.
            work: does the work within the seconds it is given (None: no bound).
            timeout: the caller's own time, from this call (None: no bound); a waiter
                raises `WaitExpired` once it has run out.
            after: what the leader does with its value once its waiters have it (a
                cache write): callers that come meanwhile are handed the value too,
                so nobody waits on it and nobody does the work again.
        """
        started = time.monotonic()
        budget = timeout  # the leader's: all of its time, or what waiting left of it
        while True:  # a waiter whose leader raised leads, or waits for whoever does
            with self._lock:
                flight = self._sync.get(key)
                if flight is None:
                    flight = self._sync[key] = _Flight()
                    break
            if not flight.done.wait(_left(timeout, started)):
                raise WaitExpired(f"no answer within {timeout:g}s")
            if flight.value is not None:
                return flight.value[0], True
            budget = _left(timeout, started)
        try:
            value = work(budget)
        except BaseException:
            with self._lock:
                self._sync.pop(key, None)
            flight.done.set()
            raise
        flight.value = (value,)
        flight.done.set()
        try:
            if after is not None:
                after(value)
        finally:
            with self._lock:
                if self._sync.get(key) is flight:
                    del self._sync[key]
        return value, False

    async def arun(
        self,
        key: str,
        work: Callable[[float | None], Awaitable[T]],
        timeout: float | None = None,
        after: Callable[[T], Awaitable[object]] | None = None,
    ) -> tuple[T, bool]:
        """Async twin of `run`, for callers on one event loop. A waiter cancelled itself
        is cancelled (even when its leader was cancelled at the same moment); when the
        leader was cancelled or raised, one waiter leads, within what is left of its
        time, and the others wait for it."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        budget = timeout
        while True:
            existing = self._async.get(key)
            if existing is None or existing.get_loop() is not loop:
                break
            # never cancels the leader's future; a CancelledError here is our own
            done, _ = await asyncio.wait((existing,), timeout=_left(timeout, started))
            if not done:
                raise WaitExpired(f"no answer within {timeout:g}s")
            outcome = existing.result()
            if outcome is not None:
                return outcome[0], True
            budget = _left(timeout, started)
        future: asyncio.Future[tuple[T] | None] = loop.create_future()
        self._async[key] = future
        try:
            value = await work(budget)
        except BaseException:
            if self._async.get(key) is future:
                del self._async[key]
            future.set_result(None)  # the leader raised or was cancelled
            raise
        future.set_result((value,))
        try:
            if after is not None:
                await after(value)
        finally:
            if self._async.get(key) is future:
                del self._async[key]
        return value, False
