"""`SingleFlight`: identical concurrent work done once, shared with those who wait.

One object serves both paths: sync callers (threads) wait on an event, async callers
(one event loop) await a shielded future. A waiter is handed the leader's value only
when ``share(value)`` says so (a transform shares a generation, never a fallback);
otherwise, or when the leader raised or was cancelled, the waiter does the work itself.
What the leader ends with is never raised in a waiter: the shared future only ever
holds the leader's value or "none", so an interruption or a cancellation a waiter sees
is its own, and it propagates.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Flight(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: tuple[T] | None = None
        """``(value,)`` once the leader's work returned; None if it raised."""


class SingleFlight(Generic[T]):
    """Deduplicates work by key while it is in progress (nothing is kept after)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: dict[str, _Flight[T]] = {}
        self._async: dict[str, asyncio.Future[tuple[T] | None]] = {}

    def run(self, key: str, work: Callable[[], T], share: Callable[[T], bool]) -> tuple[T, bool]:
        """``(value, shared)``: ``work()``'s value, or a concurrent leader's when
        ``shared`` (the caller did no work)."""
        with self._lock:
            flight = self._sync.get(key)
            leader = flight is None
            if flight is None:
                flight = self._sync[key] = _Flight()
        if not leader:
            flight.done.wait()
            if flight.value is not None and share(flight.value[0]):
                return flight.value[0], True
            return work(), False
        try:
            value = work()
            flight.value = (value,)
            return value, False
        finally:
            with self._lock:
                self._sync.pop(key, None)
            flight.done.set()

    async def arun(
        self, key: str, work: Callable[[], Awaitable[T]], share: Callable[[T], bool]
    ) -> tuple[T, bool]:
        """Async twin of `run`, for callers on one event loop. A waiter cancelled itself
        is cancelled (even when its leader was cancelled at the same moment); a waiter
        whose leader was cancelled or failed works alone."""
        loop = asyncio.get_running_loop()
        existing = self._async.get(key)
        if existing is not None and existing.get_loop() is loop:
            outcome = await asyncio.shield(existing)  # a CancelledError here is our own
            if outcome is not None and share(outcome[0]):
                return outcome[0], True
            return await work(), False
        future: asyncio.Future[tuple[T] | None] = loop.create_future()
        self._async[key] = future
        outcome = None
        try:
            value = await work()
            outcome = (value,)
            return value, False
        finally:
            future.set_result(outcome)  # None: the leader raised or was cancelled
            if self._async.get(key) is future:
                del self._async[key]
