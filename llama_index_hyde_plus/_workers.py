"""`DaemonWorkers`: reusable daemon threads for blocking calls that may be abandoned.

A sync LLM call with a timeout runs in a worker thread so the caller can stop waiting.
Starting a thread per call costs more than the rest of a search's orchestration, so
finished workers wait for the next call instead of exiting. They are daemon threads:
a call abandoned on timeout never keeps the interpreter from exiting. A worker still
busy with an abandoned call is simply not reused until it returns; when no worker is
idle a new one starts, and at most ``max_idle`` idle workers are kept.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

_Job = tuple[Callable[[], Any], dict[str, Any], threading.Event]


class DaemonWorkers:
    """Runs callables on reusable daemon threads (see the module docstring)."""

    def __init__(self, max_idle: int = 16, name: str = "hyde-plus-llm") -> None:
        self.max_idle = max_idle
        self.name = name
        self._idle: list[queue.SimpleQueue[_Job | None]] = []
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], Any]) -> tuple[dict[str, Any], threading.Event]:
        """Start ``call`` in the caller's context; returns ``(box, done)``: when ``done``
        is set, ``box`` holds ``"value"`` or ``"error"``."""
        ctx = contextvars.copy_context()
        box: dict[str, Any] = {}
        done = threading.Event()
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(inbox,), name=self.name, daemon=True).start()
        inbox.put((lambda: ctx.run(call), box, done))
        return box, done

    def _work(self, inbox: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            call, box, done = job
            try:
                box["value"] = call()
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()
            del job, call, box, done
            with self._lock:
                if len(self._idle) >= self.max_idle:
                    return
                self._idle.append(inbox)

    def idle(self) -> int:
        """How many workers wait for a call."""
        with self._lock:
            return len(self._idle)
