"""Worker threads for blocking calls that may be abandoned (`door` picks the pool;
never the event loop's default executor).

A pool (`DaemonWorkers`, one per provider or object) runs at most ``max_busy`` calls
at once, and the pools of one `Cap` together at most its ``limit``: a hung provider
holds its own pool's places, many hung providers at most the cap. A call past either
waits in its pool's line (FIFO) while its caller waits; one abandoned before it
started never runs. A call abandoned while it runs keeps its place until it returns,
and counts as overrun once its own time (``budget``) is up: only when every call in
the way overran (the callee hangs) does a new one fail at once (`WorkersBusyError`).

The threads are daemon threads (a hung call never keeps the interpreter alive) shared
by every pool: a finished call's thread runs the next call waiting for the place it
freed, else waits `IDLE_EXIT_S` for one, so the fast path reuses a thread.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from .._attrs import optional_attr
from .outage import Outage
from .reliability import LLMNotCalledError

MAX_BUSY = 32
"""Calls one pool may run at once: they wait on a network or a local model, not this
CPU; more than one API key is usually allowed, few enough for a hung provider."""
MAX_IDLE = 64
"""Idle threads kept waiting for a call (shared by every pool: a burst of concurrent
searches reuses them rather than starting threads)."""
IDLE_EXIT_S = 30.0
"""Seconds an idle thread waits for a call before it exits."""
MAX_POOLS = 64
"""Pools kept before the idle ones are forgotten (`LLMPools.for_key`)."""


class WorkersBusyError(LLMNotCalledError):
    """Every call in the way overran its time: the callee was not called."""


class QueuedTooLongError(LLMNotCalledError):
    """The call spent its time waiting in line for a thread: not the callee's fault,
    so no breaker counts it."""


class Cap:
    """At most ``limit`` calls of the pools that take its slots run at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.holders: set[Job] = set()
        self.lines: dict[DaemonWorkers, None] = {}  # pools with calls in line, oldest first

    def waiting(self) -> int:
        """How many calls wait in line in its pools (abandoned ones included)."""
        with _lock:
            return sum(len(pool._line) for pool in self.lines)


CAPS = {"llm": Cap(256), "search": Cap(256), "callers": Cap(256), "streams": Cap(256)}
"""The process-wide caps: ``"llm"`` for every model, cache and store call;
``"search"`` for the unbounded searches of the question (a plain retriever's have no
timeout), so hung searches never hold a slot an LLM call needs; ``"callers"`` for the
threads that only wait on other calls (`llm.complete_all`); ``"streams"`` for the
producers of streamed replies (`streaming`), whose consumers may hold an ``"llm"`` slot."""

_lock = threading.Lock()  # guards every pool's places and line, the caps, the idle threads
_idle: list[queue.SimpleQueue[Job | None]] = []


class Signal:
    """A one-shot ``threading.Event`` on a bare lock (a hand-off costs the two thread
    wake-ups and little else)."""

    __slots__ = ("_flag", "_lock")

    def __init__(self) -> None:
        self._flag = False
        self._lock = threading.Lock()
        self._lock.acquire()  # held until set: a waiter blocks on it

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it was set within ``timeout`` seconds (None: wait for it)."""
        if self._flag:
            return True
        got = self._lock.acquire(True, -1 if timeout is None else max(timeout, 0.0))
        if got:
            self._lock.release()  # the next waiter passes too
        return got or self._flag


class Job:
    """One call on a worker: ``done`` is set once it returned or raised."""

    __slots__ = (
        *("abandoned", "call", "cap", "done", "error", "on_done", "overrun_at", "pool"),
        *("started_at", "submitted_at", "value"),
    )

    def __init__(self, call: Callable[[], Any], on_done: Callable[[], object] | None,
                 budget: float | None, pool: DaemonWorkers) -> None:  # fmt: skip
        self.call, self.on_done, self.pool = call, on_done, pool
        self.cap = CAPS[pool.cap]
        """The cap whose slot it holds while it runs."""
        self.done = Signal()
        self.abandoned = False
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        self.overrun_at = None if budget is None else self.submitted_at + budget
        """When the call's own time runs out, else when it was abandoned."""
        self.value: Any = None
        self.error: BaseException | None = None

    @property
    def started(self) -> bool:
        """Whether a thread took it (False: it waits in line, or never ran)."""
        return self.started_at is not None

    def result(self) -> Any:
        """What the call returned; what it raised is raised (call when ``done``)."""
        if self.error is not None:
            raise self.error
        return self.value

    def abandon(self) -> None:
        """The caller stopped waiting: never started if it still waits in line; if it
        runs, overrun once its own time is up, so a healthy call whose caller went
        away early does not make its provider look hung."""
        self.abandoned = True
        if self.overrun_at is None:
            self.overrun_at = time.monotonic()

    @property
    def overran(self) -> bool:
        """Abandoned, and still running past its own time: what "hung" means here."""
        return self.abandoned and time.monotonic() >= (self.overrun_at or 0.0)


class _Line(deque[Job]):
    """A FIFO of calls waiting that drops its abandoned ones once it has grown to
    twice its live calls at the last look: with hung workers nothing else would."""

    prune_at = MAX_BUSY

    def queue(self, job: Job) -> None:
        if len(self) >= self.prune_at:
            live = [j for j in self if not j.abandoned]
            self.clear()
            self.extend(live)
            self.prune_at = max(MAX_BUSY, 2 * len(live))
        self.append(job)


class DaemonWorkers:
    """A pool: at most ``max_busy`` of its calls run at once, each taking a slot of
    the `Cap` named ``cap`` (module docstring)."""

    def __init__(self, max_busy: int = MAX_BUSY, name: str = "hyde-plus-llm", *,
                 cap: str = "llm") -> None:  # fmt: skip
        if max_busy < 1:
            raise ValueError("max_busy must be >= 1")
        self.max_busy, self.name, self.cap = max_busy, name, cap
        self._running: set[Job] = set()
        self._line = _Line()
        self.outage = Outage()
        """Whether the callee is skipped after a call overran (`door.run`)."""

    def submit(self, call: Callable[[], Any], on_done: Callable[[], object] | None = None,
               budget: float | None = None, what: str = "the LLM") -> Job:  # fmt: skip
        """Start ``call`` in the caller's context, or queue it; ``on_done()`` runs on
        the worker when it ends. ``budget``: the call's own time (`Job.abandon`);
        ``what`` names the callee in a `WorkersBusyError`."""
        job = Job(partial(contextvars.copy_context().run, call), on_done, budget, self)
        with _lock:
            cap = job.cap
            full = len(self._running) >= self.max_busy
            if full or len(cap.holders) >= cap.limit:
                ahead = self._running if full else cap.holders
                if ahead and all(j.overran for j in ahead):
                    scope = "" if full else " of the process"
                    raise WorkersBusyError(
                        f"all {len(ahead)} worker threads{scope} are busy with calls that "
                        f"overran their timeout; not calling {what}"
                    )
                self._line.queue(job)
                cap.lines[self] = None
                return job
            self._hold(job, cap)
            inbox = _idle.pop() if _idle else None
        if inbox is not None:
            inbox.put(job)
            return job
        try:
            threading.Thread(target=_serve, args=(job,), name=self.name, daemon=True).start()
        except BaseException:  # no thread: the call never ran
            with _lock:
                self._running.discard(job)
                cap.holders.discard(job)
            raise
        return job

    def _hold(self, job: Job, cap: Cap) -> None:
        self._running.add(job)
        cap.holders.add(job)

    def _take(self, cap: Cap) -> Job | None:
        """The first call in line still wanted, now running, when there is room."""
        while self._line and len(self._running) < self.max_busy and len(cap.holders) < cap.limit:
            job = self._line.popleft()
            if not job.abandoned:
                self._hold(job, cap)
                return job
        if not self._line:
            cap.lines.pop(self, None)
        return None

    def busy(self) -> int:
        """How many calls are running (abandoned ones included)."""
        with _lock:
            return len(self._running)

    def queued(self) -> int:
        """How many calls wait in line (abandoned ones included)."""
        with _lock:
            return len(self._line)


def idle() -> int:
    """How many threads wait for a call."""
    with _lock:
        return len(_idle)


def _following(finished: Job) -> Job | None:
    """Free ``finished``'s places; the call that takes them (its pool's next, else
    the oldest waiting for a slot of its cap), now running. Called under `_lock`."""
    pool, cap = finished.pool, finished.cap
    pool._running.discard(finished)
    cap.holders.discard(finished)
    if not cap.lines:  # nobody waits: the fast path
        return None
    for candidate in (pool, *cap.lines):
        job = candidate._take(cap)
        if job is not None:
            return job
    return None


def _serve(job: Job | None) -> None:
    inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
    while job is not None:
        job.started_at = time.monotonic()
        try:
            job.value = job.call()
        except BaseException as exc:
            job.error = exc
        with _lock:
            following = _following(job)  # its places are free before anyone hears
        job.done.set()
        if job.on_done is not None:
            try:
                job.on_done()
            except Exception:  # the waiter is gone (its event loop closed)
                pass
        job.call = job.on_done = None  # type: ignore[assignment]  # hold nothing of it
        job = following if following is not None else _wait(inbox)


def _wait(inbox: queue.SimpleQueue[Job | None]) -> Job | None:
    """The next call for an idle thread, or None once it waited `IDLE_EXIT_S` (it
    leaves the idle list first, so no call is put in an inbox nobody reads)."""
    with _lock:
        if len(_idle) >= MAX_IDLE:
            return None
        _idle.append(inbox)
    while True:
        try:
            return inbox.get(timeout=IDLE_EXIT_S)
        except queue.Empty:
            with _lock:
                if inbox in _idle:
                    _idle.remove(inbox)
                    return None
            # handed a call just as the wait ran out: it is in the inbox


class LLMPools:
    """One `DaemonWorkers` per provider or object (`door.pool` names them): a hung
    provider only ever uses its own pool's places, however many objects call it."""

    def __init__(self, max_busy: int = MAX_BUSY) -> None:
        self.max_busy = max_busy
        self._pools: dict[tuple[str, ...], DaemonWorkers] = {}
        self._lock = threading.Lock()

    def for_llm(self, llm: object) -> DaemonWorkers:
        """The pool of ``llm``'s provider (`provider_key`), running as many of its
        calls at once as its class allows (`calls_at_once`)."""
        return self.for_key(provider_key(llm), max_busy=calls_at_once(llm))

    def for_key(
        self, key: tuple[str, ...], *, cap: str = "llm", max_busy: int | None = None
    ) -> DaemonWorkers:
        """The pool named ``key`` (made on first use, running ``max_busy`` calls at
        once, else `MAX_BUSY`), taking slots of ``cap``; past `MAX_POOLS`, those with
        nothing running or waiting are forgotten."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                if len(self._pools) >= MAX_POOLS:
                    for old, idle_pool in list(self._pools.items()):
                        if not idle_pool.busy() and not idle_pool.queued():
                            del self._pools[old]
                pool = DaemonWorkers(max_busy or self.max_busy, cap=cap)
                self._pools[key] = pool
            return pool

    def __len__(self) -> int:
        with self._lock:
            return len(self._pools)


def calls_at_once(model: object) -> int | None:
    """How many calls of ``model`` its class lets run at once (``calls_at_once``, a
    positive int: a model that computes on this machine's cores, as `LocalEmbedding`,
    gains nothing from more, and each waits on a thread start); None: `MAX_BUSY`."""
    value = getattr(type(model), "calls_at_once", None)
    return value if type(value) is int and value >= 1 else None


def provider_key(llm: object) -> tuple[str, ...]:
    """Which provider ``llm`` calls: its class and its endpoint when it has one (every
    model a server serves shares its threads), else its model (a local model's file)."""
    kind = type(llm)
    parts = [f"{kind.__module__}.{kind.__qualname__}"]
    for names in (("api_base", "base_url", "endpoint"), ("model_path", "model", "model_name")):
        for name in names:
            try:
                value = optional_attr(llm, name)
            except Exception:  # a property that raises names nothing
                value = None
            if isinstance(value, str) and value:
                return (*parts, f"{name}={value}")
    return tuple(parts)
