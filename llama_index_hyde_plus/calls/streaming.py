"""Turn a blocking producer that reports text pieces through a callback into a
generator (or an async generator) that yields each piece as it is produced.

The producer runs on a worker thread (`STREAMS`, under a process-wide cap of its own:
its consumer may hold a slot of the ``"llm"`` cap), so a blocking native call
(llama.cpp's streamed completion) can feed a consumer token by token. The last item is
a `Done` carrying the producer's return value; a producer's exception is raised in the
consumer. When the consumer stops early (closes the generator, or its task is
cancelled) ``stop`` is set, so a producer that watches it can stop working.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .workers import DaemonWorkers

R = TypeVar("R")

Emit = Callable[[str], None]
Producer = Callable[[Emit], R]

_PIECE, _DONE, _ERROR = "piece", "done", "error"


@dataclass(frozen=True)
class Done(Generic[R]):
    """The end of a stream: the producer's return value."""

    value: R


STREAMS = DaemonWorkers(max_busy=256, name="hyde-plus-stream", cap="streams")
"""The threads the producers run on."""


def _start(produce: Producer[R], put: Callable[[tuple[str, Any]], None]) -> None:
    def run() -> None:
        try:
            result = produce(lambda piece: put((_PIECE, piece)))
        except BaseException as exc:
            put((_ERROR, exc))
        else:
            put((_DONE, result))

    STREAMS.submit(run, what="the stream's producer")


def _item(kind: str, value: Any) -> str | Done[Any]:
    if kind == _ERROR:
        raise value
    return str(value) if kind == _PIECE else Done(value)


def stream_in_thread(produce: Producer[R], stop: threading.Event) -> Iterator[str | Done[R]]:
    """Yield the pieces ``produce(emit)`` emits while it runs, then `Done`."""
    items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    try:
        _start(produce, items.put)
        while True:
            item = _item(*items.get())
            yield item
            if isinstance(item, Done):
                return
    finally:
        stop.set()


async def astream_in_thread(
    produce: Producer[R], stop: threading.Event
) -> AsyncIterator[str | Done[R]]:
    """`stream_in_thread` for an event loop: waiting never blocks the loop."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(item: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    try:
        _start(produce, put)
        while True:
            item = _item(*(await items.get()))
            yield item
            if isinstance(item, Done):
                return
    finally:
        stop.set()
