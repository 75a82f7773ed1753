"""`DaemonWorkers`: a bounded pool of reusable daemon threads for blocking calls that
may be abandoned (`door` chooses the pool; never the event loop's default executor).

Finished workers wait for the next call (at most ``max_idle``, for `IDLE_EXIT_S`)
rather than exit: starting a thread costs more than a search's orchestration. They
are daemon threads, so an abandoned call never keeps the interpreter alive. At most
``max_busy`` calls run at once; one beyond waits in line (FIFO) while its caller
waits, and one abandoned before it started never runs. An abandoned call counts as
overrun once its own time (``budget``) is up; only when every running call overran
(the callee hangs) does a new one fail at once (`WorkersBusyError`). The process-wide
caps (`MAX_THREADS`, `MAX_SEARCH_THREADS`) work the same way (`_SlotLine`).
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from .._attrs import optional_attr
from .outage import Outage
from .reliability import LLMNotCalledError

MAX_POOLS = 64
"""Pools kept before the idle ones are forgotten (`LLMPools._prune`)."""

IDLE_EXIT_S = 30.0
"""Seconds an idle worker waits for a call before it exits."""

MAX_BUSY = 32
"""Calls one pool may run at once: they wait on a network or a local model, not this
CPU; more than one API key is usually allowed, few enough for a hung provider."""

MAX_THREADS = 256
"""Calls all pools together may run at once: one past it waits in line for a slot
within its caller's time, and fails at once (`WorkersBusyError`) only when every call
holding a slot overran, so many hung providers never grow thousands of threads. Idle
workers, threads that only wait on other pools (``cap=None``) and unbounded searches
(``cap="search"``) hold none."""

MAX_SEARCH_THREADS = 256
"""Unbounded blocking searches of the question (a plain retriever's have no timeout)
all pools may run at once: a cap apart from `MAX_THREADS`, so hung searches never
hold a slot an LLM call needs; one past it waits in line while its caller waits."""

_E = TypeVar("_E")

_thread_slots = threading.BoundedSemaphore(MAX_THREADS)
"""One slot per running call, across every `DaemonWorkers` (see `MAX_THREADS`)."""

_search_slots = threading.BoundedSemaphore(MAX_SEARCH_THREADS)
"""One slot per running unbounded search (see `MAX_SEARCH_THREADS`)."""


class WorkersBusyError(LLMNotCalledError):
    """Every worker thread holds an overrun call: the callee was not called."""


class QueuedTooLongError(LLMNotCalledError):
    """The call spent its time waiting in line for a worker: not the callee's fault,
    so no breaker counts it."""


class Signal:
    """A one-shot ``threading.Event`` on a bare lock (no condition variable: a hand-off
    costs the two thread wake-ups and little else)."""

    __slots__ = ("_flag", "_lock")

    def __init__(self) -> None:
        self._flag = False
        self._lock = threading.Lock()
        self._lock.acquire()  # held until set: a waiter blocks on it

    def is_set(self) -> bool:
        """Whether `set` was called."""
        return self._flag

    def set(self) -> None:
        """Wake every waiter, now and later (called once, by the worker)."""
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
        *("_error", "_on_done", "_value", "abandoned", "call", "done", "started"),
        *("submitted_at", "started_at", "slot", "overrun_at"),
    )

    def __init__(self, call: Callable[[], Any], on_done: Callable[[], object] | None) -> None:
        self.call = call
        self.done = Signal()
        self.abandoned = False
        self.started = False
        """Whether a worker took it (False: it still waits in line, or never ran)."""
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        self._on_done = on_done
        self._value: Any = None
        self._error: BaseException | None = None
        self.slot: threading.Semaphore | None = None
        """The `MAX_THREADS` slot it holds while it runs (released by its worker)."""
        self.overrun_at: float | None = None
        """When the call's own time runs out (its timeout from submission), else when it
        was abandoned: an abandoned call counts as overrun from then on."""

    def result(self) -> Any:
        """What the call returned; what it raised is raised (call when ``done``)."""
        if self._error is not None:
            raise self._error
        return self._value

    def abandon(self) -> None:
        """The caller stopped waiting (its timeout ran out, or it was cancelled): never
        started if it still waits in line; if it runs, counted as overrun once its own
        time is up (`overran`), so a healthy call whose caller went away early does
        not make its provider look hung."""
        self.abandoned = True
        if self.overrun_at is None:
            self.overrun_at = time.monotonic()

    @property
    def overran(self) -> bool:
        """Abandoned, and still running past its own time: what "hung" means here."""
        return (
            self.abandoned and self.overrun_at is not None and time.monotonic() >= self.overrun_at
        )


class _Line(deque[_E]):
    """A FIFO of calls waiting (`Job`, or (pool, job)) that drops its abandoned ones
    when it has grown to twice its live waiters at the last look (at least `MAX_BUSY`):
    they never run, and with hung workers nothing else would drain them. So it stays
    within about twice its live waiters, at O(1) per call on average."""

    def __init__(self) -> None:
        super().__init__()
        self._prune_at = MAX_BUSY

    def queue(self, entry: _E) -> None:
        """Append ``entry`` (dropping the abandoned ones first, when it is time)."""
        if len(self) >= self._prune_at:
            live = [e for e in self if not _job(e).abandoned]
            self.clear()
            self.extend(live)
            self._prune_at = max(MAX_BUSY, 2 * len(live))
        self.append(entry)


def _job(entry: Any) -> Job:
    """The job of a line's ``entry`` (a `Job`, or (pool, job))."""
    return entry[1] if isinstance(entry, tuple) else entry  # type: ignore[no-any-return]


class DaemonWorkers:
    """Runs callables on reusable daemon threads (see the module docstring);
    ``max_busy=None`` for no bound; ``cap``: which process-wide cap its calls take a
    slot of, ``"llm"`` (`MAX_THREADS`), ``"search"`` (`MAX_SEARCH_THREADS`) or None for
    calls that only wait on other pools' calls."""

    def __init__(
        self,
        max_busy: int | None = MAX_BUSY,
        max_idle: int = 16,
        name: str = "hyde-plus-llm",
        *,
        cap: Literal["llm", "search"] | None = "llm",
    ) -> None:
        if max_busy is not None and max_busy < 1:
            raise ValueError("max_busy must be >= 1")
        self.max_busy = max_busy
        self.max_idle = max_idle
        self.name = name
        self.cap = cap
        self._idle: list[queue.SimpleQueue[Job | None]] = []
        self._running: set[Job] = set()
        self._waiting: _Line[Job] = _Line()
        self._lock = threading.Lock()
        self.outage = Outage()
        """Whether the callee is skipped after a call overran (`door.run`)."""

    def submit(
        self,
        call: Callable[[], Any],
        on_done: Callable[[], object] | None = None,
        budget: float | None = None,
        what: str = "the LLM",
    ) -> Job:
        """Start ``call`` in the caller's context, or queue it when ``max_busy`` calls
        are running or no slot of `MAX_THREADS` is free; ``on_done()`` runs on the
        worker when it ends (what it raises is ignored). ``budget``: the call's own
        time (`Job.abandon`; ``math.inf`` for none); ``what`` names the callee in the
        `WorkersBusyError` raised when every running call (of this pool, or holding a
        slot) overran."""
        ctx = contextvars.copy_context()
        job = Job(lambda: ctx.run(call), on_done)
        if budget is not None:  # the call's own time: see `Job.abandon`
            job.overrun_at = job.submitted_at + budget
        with self._lock:
            if self.max_busy is not None and len(self._running) >= self.max_busy:
                if all(j.overran for j in self._running):
                    raise WorkersBusyError(
                        f"all {self.max_busy} worker threads are busy with calls that "
                        f"overran their timeout; not calling {what}"
                    )
                self._waiting.queue(job)  # a worker takes it when it is free
                return job
            cap = _cap_of(self.cap)
            if cap is not None and not cap[0].take(self, job, cap[1], what):
                return job  # waits in line for a slot of the process
            self._running.add(job)
            inbox = self._idle.pop() if self._idle else None
        self._launch(job, inbox)
        return job

    def _own_line(self) -> _SlotLine:
        """The line of this pool's cap (called only for a call that holds a slot)."""
        cap = _cap_of(self.cap)
        assert cap is not None
        return cap[0]

    def _launch(self, job: Job, inbox: queue.SimpleQueue[Job | None] | None) -> None:
        """Hand ``job`` (in ``_running``) to ``inbox``'s worker, or to a new one."""
        if inbox is None:
            inbox = queue.SimpleQueue()
            try:
                threading.Thread(
                    target=self._serve, args=(inbox,), name=self.name, daemon=True
                ).start()
            except BaseException:
                slot, job.slot = job.slot, None
                with self._lock:
                    self._running.discard(job)
                if slot is not None:
                    self._own_line().give_back(job, slot)
                raise
        inbox.put(job)

    def admit(self, job: Job) -> bool:
        """Run ``job``, which waited in line for a slot of `MAX_THREADS` and holds one:
        True when the slot is spent (``job`` runs with it, or no thread could start: its
        waiter hears why and `_launch` handed the slot on). False when this pool is full
        meanwhile: ``job`` waits in the pool's own line without a slot (it inherits one
        from the pool's next finished call) and the slot is the caller's to hand on
        (`_SlotLine.give_back`, a loop, never a recursion)."""
        with self._lock:
            full = self.max_busy is not None and len(self._running) >= self.max_busy
            if full:
                job.slot = None
                self._waiting.queue(job)
                return False
            self._running.add(job)
            inbox = self._idle.pop() if self._idle else None
        try:
            self._launch(job, inbox)  # on failure it has handed the slot on itself
        except BaseException as exc:  # no thread: the waiter hears it as the outcome
            job._error = exc
            job.done.set()
        return True

    def _next(self, finished: Job) -> Job | None:
        """Free ``finished``'s place and take the next queued call still wanted, which
        inherits its slot of `MAX_THREADS` (else the slot goes to the process's line)."""
        slot, finished.slot = finished.slot, None
        with self._lock:
            self._running.discard(finished)
            while self._waiting:
                job = self._waiting.popleft()
                if not job.abandoned:
                    if slot is not None:
                        job.slot = slot
                        self._own_line().passed(finished, job)
                    self._running.add(job)
                    return job
        if slot is not None:
            self._own_line().give_back(finished, slot)
        return None

    def _serve(self, inbox: queue.SimpleQueue[Job | None]) -> None:
        job: Job | None = inbox.get()
        while job is not None:
            job.started, job.started_at = True, time.monotonic()
            try:
                job._value = job.call()
            except BaseException as exc:
                job._error = exc
            following = self._next(job)  # the slot is free before anyone hears it is done
            job.done.set()
            if job._on_done is not None:
                try:
                    job._on_done()
                except Exception:  # the waiter is gone (its event loop closed)
                    pass
            job.call = job._on_done = _dropped  # hold nothing of a finished call
            job = following
            if job is None:
                with self._lock:
                    if len(self._idle) >= self.max_idle:
                        return
                    self._idle.append(inbox)
                job = self._wait(inbox)

    def _wait(self, inbox: queue.SimpleQueue[Job | None]) -> Job | None:
        """The next call for an idle worker, or None once it waited `IDLE_EXIT_S` (it
        leaves the idle list first, so no call is put in an inbox nobody reads)."""
        while True:
            try:
                return inbox.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return None
                # handed a call just as the wait ran out: it is in the inbox

    def idle(self) -> int:
        """How many workers wait for a call."""
        with self._lock:
            return len(self._idle)

    def busy(self) -> int:
        """How many calls are running (abandoned ones included)."""
        with self._lock:
            return len(self._running)

    def close(self) -> None:
        """Let the idle workers exit (busy ones exit when their call returns and no
        other is queued); the pool still starts new ones if used again."""
        with self._lock:
            idle, self._idle = self._idle, []
            self.max_idle = 0
        for inbox in idle:
            inbox.put(None)

    def queued(self) -> int:
        """How many calls wait in line for a worker (abandoned ones included)."""
        with self._lock:
            return len(self._waiting)


class _SlotLine:
    """The calls waiting (FIFO) for a slot of `MAX_THREADS`, and the calls holding
    one: a freed slot goes to the first call still wanted, in whichever pool it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: _Line[tuple[DaemonWorkers, Job]] = _Line()
        self._holders: set[Job] = set()

    def take(
        self, pool: DaemonWorkers, job: Job, slots: threading.Semaphore, what: str = "the LLM"
    ) -> bool:
        """True when ``job`` took a slot of ``slots``; False when it waits in line for
        one (`give_back` admits it to ``pool``). Raises `WorkersBusyError` when every
        call holding a slot overran its timeout (hung providers: no use waiting)."""
        with self._lock:
            if slots.acquire(blocking=False):
                job.slot = slots
                self._holders.add(job)
                return True
            if all(j.overran for j in self._holders):
                raise WorkersBusyError(
                    f"all {MAX_THREADS} worker threads of the process are running calls "
                    f"that overran their timeout; not calling {what}"
                )
            self._waiting.queue((pool, job))
            return False

    def passed(self, finished: Job, following: Job) -> None:
        """``finished``'s slot went to ``following`` (the next call of its pool)."""
        with self._lock:
            self._holders.discard(finished)
            self._holders.add(following)

    def give_back(self, finished: Job, slot: threading.Semaphore) -> None:
        """``finished`` no longer holds ``slot``: the first call in line still wanted
        whose pool can run it takes it, else it is released. One loop over the line:
        calls of a full pool move to that pool's own line (thousands of them never
        deepen the stack)."""
        with self._lock:
            self._holders.discard(finished)
        while True:
            with self._lock:
                chosen: tuple[DaemonWorkers, Job] | None = None
                while self._waiting:
                    pool, job = self._waiting.popleft()
                    if not job.abandoned:
                        job.slot = slot
                        self._holders.add(job)
                        chosen = (pool, job)
                        break
                if chosen is None:
                    slot.release()
                    return
            pool, job = chosen
            if pool.admit(job):
                return
            with self._lock:
                self._holders.discard(job)

    def waiting(self) -> int:
        """How many calls wait in line for a slot (abandoned ones included)."""
        with self._lock:
            return len(self._waiting)


_slot_line = _SlotLine()
"""The line for `_thread_slots` (see `MAX_THREADS`)."""


_search_line = _SlotLine()
"""The line for `_search_slots` (see `MAX_SEARCH_THREADS`)."""


def _cap_of(cap: str | None) -> tuple[_SlotLine, threading.Semaphore] | None:
    """The line and the slots of the process-wide cap named ``cap`` (None: no cap),
    looked up at each call."""
    if cap is None:
        return None
    return (_search_line, _search_slots) if cap == "search" else (_slot_line, _thread_slots)


def _dropped() -> None:
    """What a finished `Job` holds instead of its call."""


class LLMPools:
    """One `DaemonWorkers` per provider (the LLM's class, model and endpoint), so a
    provider that hangs only ever uses up its own threads: another provider's calls
    never wait behind them, nor fall back for want of a worker. LLM objects built per
    request for one provider share its pool, so a hung provider holds at most
    ``max_busy`` threads however many objects call it; the pools are as many as the
    providers, and their idle threads exit after `IDLE_EXIT_S`."""

    def __init__(self, max_busy: int | None = MAX_BUSY, name: str = "hyde-plus-llm") -> None:
        self.max_busy = max_busy
        self.name = name
        self._pools: dict[tuple[str, ...], DaemonWorkers] = {}
        self._lock = threading.Lock()

    def for_llm(self, llm: object) -> DaemonWorkers:
        """The pool of ``llm``'s provider (made on first use)."""
        return self.for_key(provider_key(llm))

    def for_cache(self, cache: object) -> DaemonWorkers:
        """The pool of one cache or store object: one that hangs holds its own threads
        only, never those of another of its class. (The hung calls hold ``cache``, so
        its id is not reused while they run.)"""
        kind = type(cache)
        return self.for_key((f"{kind.__module__}.{kind.__qualname__}", f"id={id(cache)}"))

    def for_key(
        self, key: tuple[str, ...], *, cap: Literal["llm", "search"] | None = "llm"
    ) -> DaemonWorkers:
        """The pool named ``key`` (made on first use; ``cap``: the process-wide cap its
        calls take a slot of, see `DaemonWorkers`)."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                if len(self._pools) >= MAX_POOLS:
                    self._prune()
                pool = DaemonWorkers(self.max_busy, name=self.name, cap=cap)
                self._pools[key] = pool
            return pool

    def _prune(self) -> None:
        """Forget the pools with nothing running or waiting (their idle workers exit on
        their own), so a process that meets many providers keeps few pools."""
        for key, pool in list(self._pools.items()):
            if not pool.busy() and not pool.queued():
                del self._pools[key]
                pool.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._pools)


def provider_key(llm: object) -> tuple[str, ...]:
    """Which provider ``llm`` calls: its class and its endpoint when it has one (every
    model a server serves shares its threads: per-tenant fine-tunes of one hung server
    hold 32, not 32 each), else its model (a local model's file)."""
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
