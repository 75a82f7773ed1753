"""`Slots`: the local model's generation slots, taken in turn, so that a call's deadline
starts when its generation does.

llama.cpp decodes ``n_parallel`` calls at once; a call beyond them waits in its queue,
and a timeout counted from the request would run while it waits. So `LocalLLM` lets at
most ``n_parallel`` calls into llama.cpp, first come first served, and the call layer
takes a slot before it starts a call's clock (`LocalLLM.generation_slot` and
``agenration_slot``): the timeout then counts from the moment the call can generate.
The wait for a slot has its own bound; past it the call is not made (`ModelBusyError`,
"model busy") and the search falls back to the question's own.

A slot taken for a call (`Reservation`) is held until both the caller has left (it
answered, timed out or was cancelled) and llama.cpp has returned from the call, so a
timed-out call that is still stopping never shares its slot with the next one.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from ..calls.door import wait_woken
from ..calls.reliability import LLMNotCalledError

POLL_S = 0.05
"""How often a blocking wait for a slot looks at its cancel events."""


class ModelBusyError(LLMNotCalledError):
    """Every slot of the local model stayed busy for the whole wait: not called."""


class _Waiter:
    """One call in line: ``granted`` once a slot was handed to it, ``gone`` once it
    stopped waiting; ``wake`` tells it (called outside the lock; False when nobody
    can hear it any more: its event loop closed)."""

    __slots__ = ("gone", "granted", "wake")

    def __init__(self, wake: Callable[[], bool]) -> None:
        self.granted = False
        self.gone = False
        self.wake = wake


class Reservation:
    """A slot taken for one call before its clock starts: the worker that makes the
    call uses it (`Slots.hold`) instead of taking another, and it goes back once the
    caller has left and no worker is using it."""

    __slots__ = ("caller", "slots", "users")

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.caller = True
        self.users = 0


RESERVED: contextvars.ContextVar[Reservation | None] = contextvars.ContextVar(
    "hyde_plus_reserved_slot", default=None
)
"""The slot the current call took before its clock started (copied into the worker
thread or task that makes it)."""


class Slots:
    """``size`` slots handed out first come, first served (module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._line: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    def free(self) -> int:
        """How many slots nobody holds."""
        with self._lock:
            return self._free

    def waiting(self) -> int:
        """How many calls wait in line for a slot."""
        with self._lock:
            return sum(not w.gone for w in self._line)

    # -- taking and giving back ----------------------------------------------------
    def _take_or_queue(self, waiter: _Waiter) -> bool:
        with self._lock:
            if self._free and not self._line:
                self._free -= 1
                return True
            self._line.append(waiter)
            return False

    def release(self) -> None:
        """Give a slot back: to the first caller still waiting, else to the free ones."""
        while True:
            with self._lock:
                chosen = None
                while self._line:
                    waiter = self._line.popleft()
                    if not waiter.gone:
                        chosen = waiter
                        chosen.granted = True
                        break
                if chosen is None:
                    self._free += 1
                    return
            if chosen.wake():
                return
            chosen.gone = True  # its loop closed: the slot goes to the next one

    def _leave(self, waiter: _Waiter) -> bool:
        """``waiter`` stops waiting; True when a slot was handed to it meanwhile (it
        holds it now)."""
        with self._lock:
            if waiter.granted:
                return True
            waiter.gone = True
            try:
                self._line.remove(waiter)
            except ValueError:
                pass
            return False

    def acquire(self, wait: float | None, cancel: tuple[threading.Event, ...] = ()) -> None:
        """Take a slot, waiting at most ``wait`` seconds (None: no bound) in line:
        `ModelBusyError` past it; `SlotWaitCancelledError` once one of ``cancel``
        is set (the caller abandoned the call)."""
        event = threading.Event()
        waiter = _Waiter(lambda: _set_event(event))
        if self._take_or_queue(waiter):
            return
        end = None if wait is None else time.monotonic() + wait
        try:
            while True:
                left = POLL_S if end is None else min(POLL_S, end - time.monotonic())
                if event.wait(max(left, 0.0)):
                    return
                if any(c.is_set() for c in cancel):
                    raise SlotWaitCancelledError("the call was abandoned while it waited")
                if end is not None and time.monotonic() >= end:
                    raise self.busy(wait)
        except BaseException:  # out of time, cancelled, or interrupted (Ctrl-C)
            if self._leave(waiter):
                self.release()
            raise

    async def aacquire(self, wait: float | None) -> None:
        """`acquire` without blocking the event loop; cancelling the await leaves the
        line (a slot handed over meanwhile goes to the next caller)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        waiter = _Waiter(lambda: _wake_from_any_thread(loop, woken))
        if self._take_or_queue(waiter):
            return
        try:
            await wait_woken(woken, wait)
        except BaseException as exc:  # out of time, or our own cancellation
            if self._leave(waiter):
                if not isinstance(exc, asyncio.TimeoutError):
                    self.release()
                    raise
                return  # handed over as the time ran out: it is ours
            if isinstance(exc, asyncio.TimeoutError):
                raise self.busy(wait) from None
            raise

    def busy(self, wait: float | None) -> ModelBusyError:
        """The error of a call that waited ``wait`` seconds for a slot in vain."""
        return ModelBusyError(
            f"model busy: all {self.size} slots of the local model stayed busy "
            f"for {wait or 0:g} s; not calling it"
        )

    # -- for one call --------------------------------------------------------------
    @contextmanager
    def reserve(self, wait: float | None) -> Iterator[Reservation]:
        """A slot for the call made inside, taken before its clock starts (`RESERVED`
        tells the worker that makes it)."""
        self.acquire(wait)
        with self._reserved() as reservation:
            yield reservation

    @asynccontextmanager
    async def areserve(self, wait: float | None) -> AsyncIterator[Reservation]:
        """`reserve` on the async path."""
        await self.aacquire(wait)
        with self._reserved() as reservation:
            yield reservation

    @contextmanager
    def _reserved(self) -> Iterator[Reservation]:
        """The slot just taken, told to the worker through `RESERVED` while the caller
        is inside, given back once the caller and every call on it have left."""
        reservation = Reservation(self)
        told = RESERVED.set(reservation)
        try:
            yield reservation
        finally:
            RESERVED.reset(told)
            self._caller_left(reservation)

    def _caller_left(self, reservation: Reservation) -> None:
        with self._lock:
            reservation.caller = False
            last = reservation.users == 0
        if last:
            self.release()

    @contextmanager
    def hold(self, wait: float | None, cancel: tuple[threading.Event, ...]) -> Iterator[None]:
        """A slot while llama.cpp makes one call: the call's `Reservation` when its
        caller took one and no other worker uses it, else one taken now (`acquire`)."""
        reservation = RESERVED.get()
        with self._lock:
            reserved = (
                reservation is not None
                and reservation.slots is self
                and reservation.caller
                and reservation.users == 0
            )
            if reserved:
                assert reservation is not None
                reservation.users += 1
        if not reserved:
            self.acquire(wait, cancel)
        try:
            yield
        finally:
            if reserved:
                assert reservation is not None
                with self._lock:
                    reservation.users -= 1
                    last = not reservation.caller
                if last:
                    self.release()
            else:
                self.release()


class SlotWaitCancelledError(RuntimeError):
    """The call was abandoned while it waited for a slot (it never reached llama.cpp)."""


def _wake_from_any_thread(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> bool:
    """Set ``woken`` on its loop's thread; False when the loop closed (nobody waits)."""
    try:
        loop.call_soon_threadsafe(_set, woken)
    except RuntimeError:
        return False
    return True


def _set_event(event: threading.Event) -> bool:
    event.set()
    return True


def _set(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
