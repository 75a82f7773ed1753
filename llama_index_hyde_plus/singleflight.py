"""`SingleFlight`: identical concurrent work done once, shared with those who wait.

One object serves both paths: sync callers (threads) wait on an event, async callers
(one event loop) await a shielded future. A waiter is handed the leader's value only
when ``share(value)`` says so (a transform shares a generation, never a fallback);
otherwise, or when the leader raised or was cancelled, the waiter does the work itself.
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
        self.value: T | None = None


class SingleFlight(Generic[T]):
    """Deduplicates work by key while it is in progress (nothing is kept after)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: dict[str, _Flight[T]] = {}
        self._async: dict[str, asyncio.Future[T]] = {}

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
            if flight.value is not None and share(flight.value):
                return flight.value, True
            return work(), False
        try:
            flight.value = work()
            return flight.value, False
        finally:
            with self._lock:
                self._sync.pop(key, None)
            flight.done.set()

    async def arun(
        self, key: str, work: Callable[[], Awaitable[T]], share: Callable[[T], bool]
    ) -> tuple[T, bool]:
        """Async twin of `run`, for callers on one event loop. A waiter cancelled
        itself is cancelled; a waiter whose leader was cancelled or failed works alone."""
        loop = asyncio.get_running_loop()
        existing = self._async.get(key)
        if existing is not None and existing.get_loop() is loop:
            try:
                value = await asyncio.shield(existing)
            except asyncio.CancelledError:
                if existing.cancelled():  # the leader was cancelled, not us
                    return await work(), False
                raise
            except Exception:  # the leader failed: try alone, as the sync path does
                return await work(), False
            if share(value):
                return value, True
            return await work(), False
        future: asyncio.Future[T] = loop.create_future()
        self._async[key] = future
        try:
            value = await work()
            future.set_result(value)
            return value, False
        except BaseException as exc:
            if not future.done():
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            if self._async.get(key) is future:
                del self._async[key]
