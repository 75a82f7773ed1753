"""How many queries an evaluation keeps in flight: chosen from the local model's
measured speed, fewer when calls slow down or time out, more again when they keep up.

A query waits here, before its transform starts, so its LLM call's deadline starts
when the call is made, never while it waits for the others. On a CPU shared with other
busy processes, generations decoded together share one slowing throughput: each one
in flight makes every other slower, and past a point every call runs out of time.
One at a time, each call gets the whole speed.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, TypeGuard

from ..calls.timeouts import is_local

CALL_TARGET_S = 20.0
"""Seconds a call should take when the queries in flight share the model's measured
speed: `Pacer.for_transform` keeps as many in flight as fit."""
SLOW_SHARE = 0.5
"""A query that took more than this share of its transform's timeout was slow: one
fewer is kept in flight."""
SPEEDS_KEPT = 8
"""How many recent queries' speeds a re-measure reads."""


class Ticket(NamedTuple):
    """A query let in: when, and how many could be in flight with it."""

    started: float
    width: int


def slots(llm: Any, limit: int) -> int:
    """The most queries ever in flight for ``llm``: ``limit``, and for a local model no
    more than the calls it decodes at once (``n_parallel``), so that no call of a
    question let in waits for a free slot with its deadline running."""
    parallel = getattr(llm, "n_parallel", None) if is_local(llm) else None
    if isinstance(parallel, int) and not isinstance(parallel, bool) and parallel >= 1:
        return min(limit, parallel)
    return limit


def planned_width(llm: Any, limit: int) -> int:
    """Queries to keep in flight for ``llm`` at first (``limit``: the most, `slots`):
    ``limit`` for a remote model or one that reports no speed; for a local model with a
    measured ``tokens_per_s``, as many as can share that speed and each still write a
    whole reply (``max_tokens``) within `CALL_TARGET_S`, at least 1."""
    if not is_local(llm):
        return limit
    rate = getattr(llm, "tokens_per_s", None)
    tokens = getattr(llm, "max_tokens", None)
    if not (isinstance(rate, (int, float)) and isinstance(tokens, int)) or rate <= 0:
        return limit
    fits = math.floor(CALL_TARGET_S * float(rate) / max(tokens, 1))
    return max(1, min(limit, fits))


class Pacer:
    """An async gate whose width (queries in flight) moves with how the calls fare:
    halved when a query times out, one fewer when one is slow (over `SLOW_SHARE` of
    ``timeout``), one more after twice the width of queries in a row that kept up (that
    would not have been slow sharing the speed with one more). A
    query that started before the last narrowing does not narrow it again (the calls
    of one crowded moment count once). ``changes`` says what happened, in words.

    With a local ``llm`` whose calls are budgeted by its ``tokens_per_s``, narrowing
    also re-measures: the speed the last queries wrote at (their tokens over their
    time, times the queries in flight with them), and when it fell well below the
    budgeted one, the model's calls are budgeted by it from then on (a longer timeout:
    ``timeout_of`` reads it again)."""

    def __init__(
        self,
        *,
        limit: int,
        width: int | None = None,
        timeout: float | None = None,
        llm: Any = None,
        timeout_of: Callable[[], float | None] | None = None,
    ):
        if limit < 1:
            raise ValueError(f"limit must be >= 1, not {limit}")
        self.limit = limit
        self.width = max(1, min(limit, width if width is not None else limit))
        self.timeout = timeout
        self.llm = llm
        self.timeout_of = timeout_of
        self.changes: list[str] = []
        self._in_flight = 0
        self._kept_up = 0
        self._narrowed_at = -math.inf
        self._speeds: deque[float] = deque(maxlen=SPEEDS_KEPT)
        self._cond = asyncio.Condition()

    @classmethod
    def for_transform(cls, transformer: Any, limit: int) -> Pacer:
        """A pacer for ``transformer``'s queries: its width from its LLM's measured
        speed (`planned_width`), slowness measured against its timeout."""

        def timeout_of() -> float | None:
            timeout = getattr(transformer, "timeout", None)
            return float(timeout) if _positive(timeout) else None

        try:
            llm = getattr(transformer, "llm", None)
            timeout = timeout_of()
        except Exception:  # an LLM that cannot be resolved: its calls fall back anyway
            return cls(limit=limit)
        if llm is None:
            return cls(limit=limit, timeout=timeout)
        limit = slots(llm, limit)
        width = planned_width(llm, limit)
        return cls(limit=limit, width=width, timeout=timeout, llm=llm, timeout_of=timeout_of)

    async def __aenter__(self) -> Ticket:
        """Wait for room; the query's `Ticket` (for `record`)."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._in_flight < self.width)
            self._in_flight += 1
            return Ticket(time.monotonic(), self.width)

    async def __aexit__(self, *exc: object) -> None:
        async with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def record(self, ticket: Ticket, seconds: float, timed_out: bool, tokens: int = 0) -> None:
        """How the query let in with ``ticket`` fared: ``seconds``, whether its LLM call
        ran out of time, and the ``tokens`` its calls wrote."""
        if not timed_out and tokens > 0 and seconds > 0:
            self._speeds.append(tokens * ticket.width / seconds)
        slow = self.timeout is not None and seconds > SLOW_SHARE * self.timeout
        if timed_out or slow:
            self._kept_up = 0
            if ticket.started < self._narrowed_at:
                return
            self._narrowed_at = time.monotonic()
            self._remeasure()
            if self.width == 1:
                return
            before = self.width
            self.width = max(1, before // 2 if timed_out else before - 1)
            why = "a call timed out" if timed_out else f"a query took {seconds:.1f} s"
            self.changes.append(f"{before} -> {self.width} in flight: {why}")
            return
        if self.timeout is not None and seconds * (self.width + 1) / self.width > (
            SLOW_SHARE * self.timeout
        ):
            return  # one more in flight would make it slow (calls share the speed)
        self._kept_up += 1
        if self._kept_up >= 2 * self.width and self.width < self.limit:
            self._kept_up = 0
            self.width += 1
            self.changes.append(f"{self.width - 1} -> {self.width} in flight: calls kept up")

    def _remeasure(self) -> None:
        """Budget the model's calls by the speed its last queries wrote at
        (`local.speed.SPEED_MARGIN` of it), when that fell below half the budgeted
        speed; never below a quarter of it at once."""
        budgeted = getattr(self.llm, "tokens_per_s", None)
        if not (self._speeds and _positive(budgeted) and is_local(self.llm)):
            return
        from ..local.speed import SPEED_MARGIN

        measured = statistics.median(self._speeds)
        # at most a quarter of the budgeted speed at a time: a timeout never leaps to
        # hours on a few slow replies
        rate = max(measured * SPEED_MARGIN, budgeted / 4)
        if rate >= 0.5 * budgeted:
            return
        self.llm.tokens_per_s = rate
        if self.timeout_of is not None:
            self.timeout = self.timeout_of()
        longer = f"; calls now get {self.timeout:.0f} s" if self.timeout else ""
        self.changes.append(f"re-measured: {measured:.1f} tokens/s{longer}")

    def note(self) -> str:
        """``"2 in flight"`` when fewer than ``limit``, else ``""``: for a progress bar."""
        return f"{self.width} in flight" if self.width < self.limit else ""


def _positive(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0
