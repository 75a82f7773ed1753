"""Retries for transient provider errors, and a circuit breaker.

`RetryPolicy` retries only what a retry can fix: rate limits (429), server errors
(5xx) and dropped connections, with full-jitter exponential backoff, inside the
transform's ``timeout``. Bad requests (4xx other than 408/409/429), authentication
errors and our own timeouts are never retried.

`CircuitBreaker` stops calling a provider that keeps failing: after
``failure_threshold`` consecutive failures it opens, and for ``cooldown_s`` every
transform falls back at once instead of waiting on a dead provider; then one call
probes (half-open) and closes the breaker if it succeeds. Each change of state is
logged once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)


class LLMTimeoutError(TimeoutError):
    """The LLM did not answer within the transform's ``timeout`` (never retried)."""


BreakerState = Literal["closed", "open", "half-open"]
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
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
    """Whether retrying ``exc`` can help: 408/409/425/429/5xx statuses, connection
    resets and refusals, and the SDK error classes that mean the same (OpenAI's
    ``RateLimitError``, ``APIConnectionError``...). Our own timeout is not transient."""

    if isinstance(exc, LLMTimeoutError):
        return False
    status = _status_of(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS or 500 <= status < 600
    if isinstance(exc, (ConnectionError, BrokenPipeError)):
        return True
    return any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__)


@dataclass(frozen=True)
class RetryPolicy:
    """Up to ``max_retries`` more attempts for transient errors, sleeping a random
    time in ``[0, min(max_delay_s, base_delay_s * 2**attempt)]`` before each."""

    max_retries: int = 2
    base_delay_s: float = 0.1
    max_delay_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("retry delays must be >= 0")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Sleep before retry number ``attempt`` (0-based), full jitter."""
        cap = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return (rng or random).uniform(0, cap)


NO_RETRY = RetryPolicy(max_retries=0)


class CircuitOpenError(RuntimeError):
    """The breaker is open: the LLM was not called."""


class CircuitBreaker:
    """Consecutive-failure circuit breaker shared by every call of one transform
    (thread- and async-safe). ``state`` is ``"closed"``, ``"open"`` or ``"half-open"``."""

    def __init__(
        self, failure_threshold: int = 5, cooldown_s: float = 30.0, *, name: str = "llm"
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if cooldown_s <= 0:
            raise ValueError("cooldown_s must be > 0")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.name = name
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    @property
    def state(self) -> BreakerState:
        with self._lock:
            if self._state == "open" and self._cooled_down():
                return "half-open"
            return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def _cooled_down(self) -> bool:
        return time.monotonic() - self._opened_at >= self.cooldown_s

    def _set(self, state: BreakerState, reason: str) -> None:
        if state != self._state:
            self._state = state
            level = logging.INFO if state == "closed" else logging.WARNING
            logger.log(level, "circuit breaker for %s is now %s (%s)", self.name, state, reason)

    def allow(self) -> bool:
        """May a call go ahead now? In half-open state only one probe at a time."""
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open":
                if not self._cooled_down():
                    return False
                self._set("half-open", f"probing after {self.cooldown_s:g}s")
            if self._probing:
                return False
            self._probing = True
            return True

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False
            self._set("closed", "a call succeeded")

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            was_probe = self._probing
            self._probing = False
            if self._state == "half-open" or was_probe:
                self._opened_at = time.monotonic()
                self._set("open", "the probe failed")
            elif self._state == "closed" and self._failures >= self.failure_threshold:
                self._opened_at = time.monotonic()
                self._set("open", f"{self._failures} consecutive failures")

    def reset(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False
            self._set("closed", "reset")
