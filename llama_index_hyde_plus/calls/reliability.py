"""Retries for transient provider errors, a circuit breaker, and what propagates.

`RetryPolicy` retries only what a retry can fix (429, 5xx, dropped connections, a
provider's own timeouts) with full-jitter backoff inside the transform's ``timeout``.
`CircuitBreaker` opens after ``failure_threshold`` consecutive failed calls: for
``cooldown_s`` every transform falls back at once, then one call probes. It hears of
each call once, and only of what speaks of the provider (`counts_against_provider`).
`propagates` is the one rule for what a "never raises" layer lets through.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
import time
from dataclasses import dataclass
from typing import Literal

from .._checks import check_int, check_number

logger = logging.getLogger(__name__)


class LLMTimeoutError(TimeoutError):
    """The LLM did not answer within the transform's ``timeout`` (never retried)."""


class LLMNotCalledError(RuntimeError):
    """The callee was not called (breaker open, no worker free): no breaker counts it."""


class CircuitOpenError(LLMNotCalledError):
    """The breaker is open: the LLM was not called."""


class CallError(RuntimeError):
    """A dependency raised an error that is not an ``Exception`` (gevent's ``Timeout``,
    a ``CancelledError`` from a blocking client): a failure like any other, wrapped for
    every ``except Exception`` above. ``error`` (also ``__cause__``) is what it raised."""

    def __init__(self, error: BaseException, what: str = "a component") -> None:
        text = str(error)
        super().__init__(f"{what} raised {type(error).__name__}" + (f": {text}" if text else ""))
        self.error = error


class LLMCallError(CallError):
    """The LLM raised an error that is not an ``Exception`` (see `CallError`)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error, "the LLM")


BreakerState = Literal["closed", "open", "half-open"]
"""A `CircuitBreaker`'s state: ``closed`` (calls go through), ``open`` (every call
falls back at once, until ``cooldown_s`` has passed), ``half-open`` (one probe call at a
time is let through)."""
Permit = Literal["call", "probe"]
"""What `CircuitBreaker.acquire` grants: an ordinary call, or the one half-open probe."""
Outcome = Literal["success", "failure", "released"]
"""How a call ends for the breaker: `CircuitBreaker.settle`."""
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_HEALTH_STATUS = frozenset({408, 429})
"""The 4xx statuses that speak of the provider (too slow, too busy), not the request."""
_ALWAYS_PROPAGATE = (KeyboardInterrupt, SystemExit, GeneratorExit)
# GeneratorExit: on the async path it may close the caller's own coroutine, which must
# go on up (swallowing it is a RuntimeError).
_TRANSIENT_NAMES = frozenset(
    {
        "APIConnectionError",
        "APITimeoutError",
        "RateLimitError",
        "InternalServerError",
        "ServiceUnavailableError",
        "ConnectError",
        "ReadError",
        "RemoteProtocolError",
        "ConnectTimeout",
        "ReadTimeout",
        "PoolTimeout",
        "ServerDisconnectedError",
    }
)


def _status_of(exc: BaseException) -> int | None:
    for attr in ("status_code", "status", "http_status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` can help: 408/409/425/429/5xx, connection errors, a
    provider's own timeout, the SDK classes that mean the same; never our timeout."""
    if isinstance(exc, (LLMTimeoutError, LLMNotCalledError)):
        return False
    status = _status_of(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS or 500 <= status < 600
    if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return True
    return any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__)


def counts_against_provider(exc: BaseException) -> bool:
    """Whether ``exc`` speaks of the provider's health (the breaker counts it): all but
    a refused request (4xx other than 408 and 429) and a call never made
    (`LLMNotCalledError`). Our own timeout counts."""
    if isinstance(exc, LLMNotCalledError):
        return False
    status = _status_of(exc)
    return status is None or not 400 <= status < 500 or status in _HEALTH_STATUS


MAX_ERROR_CHARS = 1000
"""The most characters of an error's message kept (in ``TransformResult.error``,
``failed_searches``, a node's ``hyde_plus`` metadata) and logged: `describe`."""


def describe(exc: BaseException) -> str:
    """``exc`` as a result keeps it and a warning logs it: ``"ConnectionError:
    refused"``, cut at `MAX_ERROR_CHARS` (``... (N more characters)``)."""
    text = str(exc)
    if len(text) > MAX_ERROR_CHARS:
        more = len(text) - MAX_ERROR_CHARS
        text = f"{text[:MAX_ERROR_CHARS]}... ({more:,} more characters)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def as_failure(exc: BaseException, wrapper: type[CallError] = LLMCallError) -> Exception:
    """A failed call's error as an ``Exception``: ``exc``, or a ``wrapper`` around it."""
    if isinstance(exc, Exception):
        return exc
    wrapped = wrapper(exc)
    wrapped.__cause__ = exc
    return wrapped


def failure(exc: BaseException, *, in_task: bool = False) -> Exception:
    """``exc`` as a failure to handle (`as_failure`), or re-raised when it must
    propagate (`propagates`): what every "never breaks search" layer does with it."""
    if propagates(exc, in_task=in_task):
        raise exc
    return as_failure(exc, CallError)


def propagates(exc: BaseException, *, in_task: bool = False) -> bool:
    """Whether ``exc`` must propagate rather than count as a failed call: an interrupt,
    an exit, ``GeneratorExit``; a ``CancelledError`` only on the async path
    (``in_task``) when the running task is being cancelled (always on Python 3.10,
    which cannot tell). Anything else is a failed call: the transform falls back."""
    if isinstance(exc, _ALWAYS_PROPAGATE):
        return True
    if not isinstance(exc, asyncio.CancelledError) or not in_task:
        return False
    if sys.version_info < (3, 11):
        return True
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


MAX_RETRIES = 100
"""The most retries a `RetryPolicy` takes (more is a mistake: with ``timeout=None``
nothing else would end them)."""
MAX_SECONDS = 1e6
"""The longest delay or cooldown in seconds (about 11 days, the bound ``timeout``
has): beyond it a breaker would in effect never half-open again."""
MAX_THRESHOLD = 1_000_000
"""The largest ``failure_threshold`` of a `CircuitBreaker`."""


@dataclass(frozen=True)
class RetryPolicy:
    """Up to ``max_retries`` more attempts for transient errors, sleeping a random
    time in ``[0, min(max_delay_s, base_delay_s * 2**attempt)]`` before each.

    ``max_retries`` is an int from 0 to `MAX_RETRIES`; the delays are finite numbers of
    seconds from 0 to `MAX_SECONDS` (a bool is neither): anything else is a `TypeError`
    or `ValueError` naming the field, raised here rather than on the first retry."""

    max_retries: int = 2
    base_delay_s: float = 0.1
    max_delay_s: float = 1.0

    def __post_init__(self) -> None:
        check_int(self.max_retries, "max_retries", 0, MAX_RETRIES)
        for name in ("base_delay_s", "max_delay_s"):
            seconds = check_number(getattr(self, name), name, 0.0, MAX_SECONDS)
            object.__setattr__(self, name, seconds)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep before retry number ``attempt``, with full jitter.

        Args:
            attempt: the retry's number, 0-based.
            rng: the random source; None: the ``random`` module's.
        """
        cap = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return (rng or random).uniform(0, cap)


NO_RETRY = RetryPolicy(max_retries=0)
"""A `RetryPolicy` that never retries: ``retry=NO_RETRY``."""


class CircuitBreaker:
    """Consecutive-failure circuit breaker shared by every call of one transform
    (thread- and async-safe). ``state`` is ``"closed"``, ``"open"`` or ``"half-open"``.

    A call takes a permit (`acquire`: ``"call"``, ``"probe"`` for the one half-open
    probe, or None: do not call) and settles it exactly once (`settle`): a success
    closes the breaker, a failure counts (and a failed probe reopens it), and a call
    that ends with no verdict on the provider (cancelled, interrupted, or refused as a
    bad request) is ``"released"``: it is not counted, and a released probe frees the
    half-open slot, so the next call probes. Only the probe's own permit settles the
    probe: a call that began before the breaker opened and ends during the probe is
    counted like any other.

    Args:
        failure_threshold: consecutive failures that open the breaker (an int from 1
            to `MAX_THRESHOLD`).
        cooldown_s: seconds it stays open before a probe call is let through (a finite
            number above 0, at most `MAX_SECONDS`).
        name: what the log lines call the breaker's provider (a non-empty string).

    Anything else is a `TypeError` or `ValueError` naming the argument: a NaN
    ``cooldown_s`` would keep an opened breaker open for good, a NaN threshold never
    open it.
    """

    def __init__(
        self, failure_threshold: int = 5, cooldown_s: float = 30.0, *, name: str = "llm"
    ) -> None:
        self.failure_threshold = check_int(failure_threshold, "failure_threshold", 1, MAX_THRESHOLD)
        self.cooldown_s = check_number(cooldown_s, "cooldown_s", 0.0, MAX_SECONDS)
        if self.cooldown_s == 0:
            raise ValueError("cooldown_s must be > 0 seconds")
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, not {type(name).__name__}")
        if not name.strip():
            raise ValueError("name must be a non-empty string")
        self.name = name
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    @property
    def state(self) -> BreakerState:
        """The state now: an open breaker whose cooldown has passed is ``"half-open"``."""
        with self._lock:
            if self._state == "open" and self._cooled_down():
                return "half-open"
            return self._state

    @property
    def consecutive_failures(self) -> int:
        """Failures counted since the last success (or `reset`)."""
        return self._failures

    def _cooled_down(self) -> bool:
        return time.monotonic() - self._opened_at >= self.cooldown_s

    def _set(self, state: BreakerState, reason: str) -> None:
        if state != self._state:
            self._state = state
            level = logging.INFO if state == "closed" else logging.WARNING
            logger.log(level, "circuit breaker for %s is now %s (%s)", self.name, state, reason)

    def acquire(self) -> Permit | None:
        """A permit for one call, to be settled once (`settle`); None while open, and
        in half-open state while the one probe is out."""
        with self._lock:
            if self._state == "closed":
                return "call"
            if self._state == "open":
                if not self._cooled_down():
                    return None
                self._set("half-open", f"probing after {self.cooldown_s:g}s")
            if self._probing:
                return None
            self._probing = True
            return "probe"

    def settle(self, permit: Permit, outcome: Outcome) -> None:
        """The end of the call ``permit`` was acquired for (class docstring).

        Args:
            permit: what `acquire` granted for the call.
            outcome: ``"success"``, ``"failure"``, or ``"released"`` (no verdict).
        """
        with self._lock:
            probe = permit == "probe"
            if probe:
                self._probing = False
            if outcome == "released":
                return
            if outcome == "success":
                self._failures = 0
                self._set("closed", "a call succeeded")
                return
            self._failures += 1
            if probe and self._state == "half-open":
                self._opened_at = time.monotonic()
                self._set("open", "the probe failed")
            elif self._state == "closed" and self._failures >= self.failure_threshold:
                self._opened_at = time.monotonic()
                self._set("open", f"{self._failures} consecutive failures")
