"""Model calls after the LLM, each waited for until one `Deadline`.

Once the LLM has answered, `TransformRetriever` still calls models: the embedder (the
generated text, the question, documents the store cannot return), the vector store
(stored document vectors) and the reranker. Each call is bounded here, as the LLM's
own are: a blocking call runs on its model's own worker threads (`_llm.WORKERS`, never
the event loop's default executor) and is abandoned when the deadline passes; a native
coroutine is awaited under asyncio's timeout and cancelled then. Either way the caller
gets a `ModelTimeoutError` and falls back; a model whose worker threads all hold
overrun calls fails at once (`_workers.WorkersBusyError`), so a hung model never holds
more than its pool's threads. The caller's own cancellation propagates, and a call it
abandoned is never waited for.
"""

from __future__ import annotations

import asyncio
import math
import queue
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from ._workers import DaemonWorkers, Job
from .reliability import failure

T = TypeVar("T")


class ModelTimeoutError(TimeoutError):
    """A model called after the LLM did not answer before its deadline."""


@dataclass(frozen=True)
class Deadline:
    """The moment ``at`` (``time.monotonic()``), ``seconds`` after the bound started."""

    seconds: float
    at: float

    @classmethod
    def start(cls, seconds: float | None) -> Deadline | None:
        """A deadline ``seconds`` from now (None: no bound).

        Args:
            seconds: the bound, in seconds; None for none.
        """
        return None if seconds is None else cls(seconds, time.monotonic() + seconds)

    def left(self) -> float:
        """Seconds until it passes (0 once it has)."""
        return max(self.at - time.monotonic(), 0.0)

    def overrun(self, what: str) -> ModelTimeoutError:
        """The error saying ``what`` did not answer in time."""
        return ModelTimeoutError(f"{what} did not answer within {self.seconds:g}s")


def run_within(
    pool: DaemonWorkers, call: Callable[[], T], deadline: Deadline | None, what: str
) -> T:
    """``call()`` on a worker of ``pool``, waited for until ``deadline`` (then abandoned,
    `ModelTimeoutError`); with no deadline, called in the caller's thread.

    Args:
        pool: the model's own worker threads.
        call: the blocking call.
        deadline: when to stop waiting; None for no bound.
        what: names the model in the error.
    """
    if deadline is None:
        return call()
    if not deadline.left():
        raise deadline.overrun(what)
    job = pool.submit(call, budget=deadline.left(), what=what)
    answered = False
    try:
        answered = job.done.wait(deadline.left())
    finally:  # not answered in time, or interrupted while waiting (Ctrl-C)
        if not answered:
            job.abandon()
    if not answered:
        raise deadline.overrun(what)
    return job.result()  # type: ignore[no-any-return]


def run_all_within(
    pool: DaemonWorkers,
    calls: Sequence[Callable[[], T]],
    deadline: Deadline | None,
    what: str,
    at_once: int,
) -> list[T | Exception]:
    """Each of ``calls`` on a worker of ``pool``, at most ``at_once`` running at a time,
    all waited for until ``deadline`` (None: no bound); in order, what each returned or
    the failure it raised (`reliability.failure`: an interrupt propagates), and a
    `ModelTimeoutError` for each not done by then (abandoned, or never started). A call
    the pool refuses (every worker holds an overrun call) fails at once.

    Args:
        pool: the model's (or store's) own worker threads.
        calls: the blocking calls.
        deadline: when to stop waiting for all of them; None for no bound.
        what: names the model in the error.
        at_once: the most calls running at once (>= 1).
    """
    outcomes: list[T | Exception | None] = [None] * len(calls)
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()
    jobs: dict[int, Job] = {}
    waiting = list(range(len(calls)))[::-1]  # popped from the end: in order
    try:
        while waiting or jobs:
            while waiting and len(jobs) < max(1, at_once):
                i = waiting.pop()
                try:
                    jobs[i] = pool.submit(
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


def _budget(deadline: Deadline | None) -> float:
    """A call's own time for `DaemonWorkers.submit`: what is left of ``deadline`` (no end
    with no deadline), so a call abandoned because its caller was cancelled counts
    as overrun (its callee hung) only once its own time has run out, never at once."""
    return math.inf if deadline is None else deadline.left()


def wake(future: asyncio.Future[None]) -> None:
    """Set ``future`` (a worker's "done" for `wait_woken`), unless it is already done
    (cancelled, or timed out)."""
    if not future.done():
        future.set_result(None)


def _time_out(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


async def wait_woken(woken: asyncio.Future[None], timeout: float | None) -> None:
    """Wait until a worker sets ``woken`` (`wake`); `asyncio.TimeoutError` after
    ``timeout`` seconds (None: no bound). Unlike ``asyncio.wait_for`` on Python 3.10
    and 3.11, a cancellation that arrives just as the worker answers is never lost:
    the future is awaited directly, so the task's cancel always raises
    `asyncio.CancelledError` here.

    Args:
        woken: the future the worker's ``on_done`` sets.
        timeout: seconds to wait; None for no bound.
    """
    if timeout is None:
        await woken
        return
    timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), _time_out, woken)
    try:
        await woken
    finally:
        timer.cancel()


async def arun_within(
    pool: DaemonWorkers, call: Callable[[], T], deadline: Deadline | None, what: str
) -> T:
    """`run_within` on the async path: the event loop waits for the worker without
    blocking (also with no deadline: a blocking call never runs on the loop, nor on its
    default executor). Cancelling the await abandons the call.

    Args:
        pool: the model's own worker threads.
        call: the blocking call.
        deadline: when to stop waiting; None for no bound.
        what: names the model in the error.
    """
    if deadline is not None and not deadline.left():
        raise deadline.overrun(what)
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    job = pool.submit(
        call, lambda: loop.call_soon_threadsafe(wake, woken), _budget(deadline), what
    )
    try:
        await wait_woken(woken, None if deadline is None else deadline.left())
    except BaseException as exc:  # the deadline, or our own cancellation
        job.abandon()
        if isinstance(exc, asyncio.TimeoutError) and deadline is not None:
            raise deadline.overrun(what) from None
        raise
    return job.result()  # type: ignore[no-any-return]


async def await_within(awaitable: Awaitable[T], deadline: Deadline | None, what: str) -> T:
    """A native coroutine of a model, cancelled when ``deadline`` passes
    (`ModelTimeoutError`); the model's own ``TimeoutError`` keeps its message.

    Args:
        awaitable: the model's coroutine.
        deadline: when to stop waiting; None for no bound.
        what: names the model in the error.
    """
    if deadline is None:
        return await awaitable
    if not deadline.left():
        _close(awaitable)
        raise deadline.overrun(what)
    task = await run_as_task(awaitable, deadline.left())
    if task is None:
        raise deadline.overrun(what)
    return task.result()  # the model's own errors (its own TimeoutError too) as they are


async def run_as_task(awaitable: Awaitable[T], timeout: float) -> asyncio.Task[T] | None:
    """``awaitable`` run as a task of its own, waited for ``timeout`` seconds: the
    finished task (its result or error is the caller's to read), or None once the time
    is up, the task dropped (`drop`: not awaited, so one that swallows its
    cancellation never holds the caller, and its late result is never used). The
    caller's own cancellation drops it too, and propagates.

    The task wakes the caller itself as it ends (`wake`), not through its done
    callbacks: two event-loop turns for a reply that needs none of its own, where
    ``asyncio.wait`` takes three (and a third fewer bytecodes).

    Args:
        awaitable: the coroutine (or future) to run.
        timeout: seconds to wait for it.
    """
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    task = loop.create_task(_waking(awaitable, woken))
    try:
        await wait_woken(woken, timeout)
    except asyncio.TimeoutError:
        drop(task)
        return None
    except BaseException:  # our caller is cancelled: the task is dropped
        drop(task)
        raise
    return task


async def _waking(awaitable: Awaitable[T], woken: asyncio.Future[None]) -> T:
    """``await awaitable``, then set ``woken`` (unless the waiter gave up)."""
    try:
        return await awaitable
    finally:
        wake(woken)


def drop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` without waiting for it; whatever it ends with is discarded."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def _close(awaitable: Awaitable[object]) -> None:
    """Close a coroutine that will never be awaited (no "never awaited" warning)."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()
