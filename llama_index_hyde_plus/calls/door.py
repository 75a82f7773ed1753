"""The door every blocking or async call to a dependency goes through.

`run` and `arun` run a blocking call on the worker threads of what it calls, waited
for until a `Deadline` (then abandoned: `ModelTimeoutError`); `run_all` runs many at
once; `await_within` bounds a native coroutine. The async path never blocks the event
loop nor uses its default executor, and cancelling the await abandons the call. Which
threads a call takes is decided here only, by ``kind``:

- ``"model"``: its provider's (class and endpoint, `workers.provider_key`), for the
  LLM, an embedder, a reranker: a hung provider holds only its own threads;
- ``"store"``: the object's own, for a cache, a vector store, a retriever's searches
  with generated text, a transform run on a thread;
- ``"search"``: the object's own, under the cap of unbounded searches
  (`workers.CAPS`): a retriever's searches of the question.

``skip_when_down``: the one rule for a failing dependency (`Outage`): a call that
overran leaves it skipped (`DependencyDownError`) for `timeouts.DOWN_RETRY_S`, then
one call probes it; any answer, even a late one, ends the outage.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Literal, TypeVar

from .reliability import CallError, LLMNotCalledError, failure, propagates
from .workers import DaemonWorkers, Job, LLMPools, QueuedTooLongError

T = TypeVar("T")
Kind = Literal["model", "store", "search"]

WORKERS = LLMPools()
"""Every pool of worker threads of the process, one per provider or object."""

CANCEL_EVENT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "hyde_plus_cancel_event", default=None
)
"""In a ``cancellable`` call: set once its caller abandons it, so a callee that can
stop midway (`LocalLLM`, a streamed reply) does."""


class ModelTimeoutError(TimeoutError):
    """A dependency did not answer before its deadline."""


class DependencyDownError(LLMNotCalledError):
    """The dependency overran a call recently and is skipped: it was not called."""


class Deadline:
    """The moment ``at`` (``time.monotonic()``), ``seconds`` after the bound started."""

    __slots__ = ("at", "seconds")

    def __init__(self, seconds: float, at: float) -> None:
        self.seconds, self.at = seconds, at

    @classmethod
    def start(cls, seconds: float | None) -> Deadline | None:
        """A deadline ``seconds`` from now (None: no bound)."""
        return None if seconds is None else cls(seconds, time.monotonic() + seconds)

    def left(self) -> float:
        """Seconds until it passes (0 once it has)."""
        return max(self.at - time.monotonic(), 0.0)

    def overrun(self, what: str) -> ModelTimeoutError:
        """The error saying ``what`` did not answer in time."""
        return ModelTimeoutError(f"{what} did not answer within {self.seconds:g}s")


def pool(on: object, kind: Kind = "model") -> DaemonWorkers:
    """The worker threads a call of ``kind`` to ``on`` runs on (module docstring);
    ``on`` may be the pool itself."""
    if isinstance(on, DaemonWorkers):
        return on
    if kind == "model":
        return WORKERS.for_llm(on)
    cls = type(on)  # the calls hold ``on``: its id is not reused while they run
    key = (kind, f"{cls.__module__}.{cls.__qualname__}", f"id={id(on)}")
    return WORKERS.for_key(key, cap="search" if kind == "search" else "llm")


def _budget(deadline: Deadline | None) -> float:
    """A call's own time (`Job.abandon`): what is left of ``deadline``, else no end."""
    return math.inf if deadline is None else deadline.left()


def _submit(
    workers: DaemonWorkers, call: Callable[[], T], deadline: Deadline | None, what: str,
    skip_when_down: bool, on_done: Callable[[], object] | None = None,
) -> Job:  # fmt: skip
    if deadline is not None and not deadline.left():
        raise deadline.overrun(what)
    if not skip_when_down:
        return workers.submit(call, on_done, _budget(deadline), what)
    if workers.outage.skipping():
        raise DependencyDownError(f"{what} overran a call recently; skipping it")

    def done() -> None:
        workers.outage.answered()  # late too: it answers again
        if on_done is not None:
            on_done()

    return workers.submit(call, done, _budget(deadline), what)


def _overran(
    workers: DaemonWorkers, job: Job, deadline: Deadline, what: str, breaker_counts: bool
) -> Exception:
    """The error of an abandoned call whose deadline passed: `ModelTimeoutError` (an
    outage of the callee), or, for a call a breaker counts (``cancellable``: the LLM),
    `QueuedTooLongError` when it spent more of its time waiting in line for a worker
    than running (the callee was not given the time to answer)."""
    now = time.monotonic()
    ran = 0.0 if job.started_at is None else now - job.started_at
    waited = (job.started_at or now) - job.submitted_at
    if not breaker_counts or ran >= waited:
        workers.outage.failed()
        return deadline.overrun(what)
    state = "was never made" if job.started_at is None else f"ran only {ran:.2f}s"
    return QueuedTooLongError(
        f"the call to {what} waited {waited:.2f}s of its {deadline.seconds:g}s for a "
        f"worker thread (all busy) and {state}"
    )


def _cancellable(call: Callable[[], T]) -> tuple[Callable[[], T], threading.Event]:
    """``call`` run with `CANCEL_EVENT` set to the event returned."""
    stop = threading.Event()

    def told() -> T:
        CANCEL_EVENT.set(stop)
        return call()

    return told, stop


def _result(job: Job, what: str) -> Any:
    """What the call returned; what it raised, an error that is not an ``Exception``
    (a ``CancelledError`` from a blocking client) as a `CallError`, never taken for
    the caller's own cancellation."""
    try:
        return job.result()
    except Exception:
        raise
    except BaseException as exc:
        if propagates(exc):  # an interrupt or an exit
            raise
        raise CallError(exc, what) from exc


def run(
    call: Callable[[], T],
    *,
    on: object,
    kind: Kind = "model",
    deadline: Deadline | None = None,
    what: str = "the model",
    skip_when_down: bool = False,
    cancellable: bool = False,
) -> T:
    """``call()`` on ``on``'s worker threads, waited for until ``deadline`` (then
    abandoned: `ModelTimeoutError`); with no deadline, in the caller's thread.
    ``cancellable``: the call sees `CANCEL_EVENT` set once it is abandoned."""
    if deadline is None:
        return call()
    workers = pool(on, kind)
    call, stop = _cancellable(call) if cancellable else (call, None)
    job = _submit(workers, call, deadline, what, skip_when_down)
    answered = False
    try:
        answered = job.done.wait(deadline.left())
    finally:  # not answered in time, or interrupted while waiting (Ctrl-C)
        if not answered:
            _abandon(job, stop)
    if not answered:
        raise _overran(workers, job, deadline, what, cancellable)
    return _result(job, what)  # type: ignore[no-any-return]


def _abandon(job: Job, stop: threading.Event | None) -> None:
    if stop is not None:
        stop.set()
    job.abandon()


async def arun(
    call: Callable[[], T],
    *,
    on: object,
    kind: Kind = "model",
    deadline: Deadline | None = None,
    what: str = "the model",
    skip_when_down: bool = False,
    cancellable: bool = False,
) -> T:
    """`run` on the async path: the loop waits for the worker without blocking (with no
    deadline too); cancelling the await abandons the call."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    workers = pool(on, kind)
    call, stop = _cancellable(call) if cancellable else (call, None)
    ring = partial(loop.call_soon_threadsafe, wake, woken)
    job = _submit(workers, call, deadline, what, skip_when_down, ring)
    try:
        await wait_woken(woken, None if deadline is None else deadline.left())
    except asyncio.TimeoutError:
        if deadline is None or job.done.is_set():  # answered as the time ran out
            return _result(job, what)  # type: ignore[no-any-return]
        _abandon(job, stop)
        raise _overran(workers, job, deadline, what, cancellable) from None
    except BaseException:  # our own cancellation
        _abandon(job, stop)
        raise
    return _result(job, what)  # type: ignore[no-any-return]


def run_all(
    calls: Sequence[Callable[[], T]],
    *,
    on: object,
    kind: Kind = "model",
    deadline: Deadline | None,
    what: str,
    at_once: int,
) -> list[T | Exception]:
    """Each of ``calls`` on ``on``'s worker threads, at most ``at_once`` at a time, all
    waited for until ``deadline``: in order, each one's value or failure
    (`reliability.failure`), `ModelTimeoutError` for those not done by then."""
    workers = pool(on, kind)
    outcomes: list[T | Exception | None] = [None] * len(calls)
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()
    jobs: dict[int, Job] = {}
    waiting = list(range(len(calls)))[::-1]  # popped from the end: in order
    try:
        while waiting or jobs:
            while waiting and len(jobs) < max(1, at_once):
                i = waiting.pop()
                try:
                    jobs[i] = workers.submit(
                        calls[i], partial(finished.put, i), _budget(deadline), what
                    )
                except Exception as exc:  # WorkersBusyError: all its workers overran
                    outcomes[i] = exc
            if not jobs:
                continue
            try:
                i = finished.get(timeout=None if deadline is None else deadline.left())
            except queue.Empty:
                break
            try:
                outcomes[i] = jobs.pop(i).result()
            except BaseException as exc:
                outcomes[i] = failure(exc)
    finally:  # the deadline passed, or we were interrupted: stop waiting for the rest
        for job in jobs.values():
            job.abandon()
    for i in [*jobs, *waiting]:
        outcomes[i] = deadline.overrun(what) if deadline is not None else None
    return outcomes  # type: ignore[return-value]


def wake(future: asyncio.Future[None]) -> None:
    """Set ``future`` unless it is already done (cancelled, or timed out)."""
    if not future.done():
        future.set_result(None)


def _time_out(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


async def wait_woken(woken: asyncio.Future[None], timeout: float | None) -> None:
    """Wait until ``woken`` is set (`wake`); `asyncio.TimeoutError` after ``timeout``
    seconds (None: no bound). The future is awaited directly, so a cancellation that
    arrives as the worker answers is never lost (as ``wait_for`` loses it on 3.10)."""
    if timeout is None:
        await woken
        return
    timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), _time_out, woken)
    try:
        await woken
    finally:
        timer.cancel()


async def await_within(awaitable: Awaitable[T], deadline: Deadline | None, what: str) -> T:
    """A native coroutine, cancelled when ``deadline`` passes (`ModelTimeoutError`); its
    own ``TimeoutError`` keeps its message."""
    if deadline is None:
        return await awaitable
    left = deadline.left()
    if not left:
        close = getattr(awaitable, "close", None)
        if callable(close):
            close()  # never awaited: no warning
        raise deadline.overrun(what)
    task = await run_as_task(awaitable, left)
    if task is None:
        raise deadline.overrun(what)
    return task.result()


async def run_as_task(awaitable: Awaitable[T], timeout: float) -> asyncio.Task[T] | None:
    """``awaitable`` as a task of its own, waited for ``timeout`` seconds: the finished
    task, or None once the time is up and the task dropped (`drop`: one that swallows
    its cancellation never holds the caller). The caller's cancellation drops it too."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    task = loop.create_task(_waking(awaitable, woken))
    try:
        await wait_woken(woken, timeout)
    except asyncio.TimeoutError:
        drop(task)
        return None
    except BaseException:
        drop(task)
        raise
    return task


async def _waking(awaitable: Awaitable[T], woken: asyncio.Future[None]) -> T:
    try:
        return await awaitable
    finally:
        wake(woken)


def drop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` without waiting for it; whatever it ends with is discarded."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
