"""`Outage`: the one rule for a dependency that fails or hangs (a cache, a store):
skip it for a while, then let one caller probe it."""

from __future__ import annotations

import threading
import time

from . import timeouts


class Outage:
    """Whether a dependency that failed is asked (thread-safe): after a failure it is
    skipped for ``retry_s`` seconds; then one caller is let through to probe it while
    the others go on skipping for another ``retry_s``, unless the probe is answered.
    So a dependency that is down, locked or hung costs one bounded wait every few
    seconds, never one per concurrent caller.

    Args:
        retry_s: seconds between probes (`timeouts.DOWN_RETRY_S`, read at each
            failure, when None).
    """

    def __init__(self, retry_s: float | None = None) -> None:
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._down = False
        self._skip_until = 0.0  # time.monotonic() before which it is not asked

    @property
    def retry_s(self) -> float:
        """Seconds a failed dependency is skipped before the next probe."""
        return timeouts.DOWN_RETRY_S if self._retry_s is None else self._retry_s

    def skipping(self) -> bool:
        """True when the dependency is not to be asked now; False lets this caller call
        it (during an outage, as the one probe of the next ``retry_s``)."""
        if not self._down:
            return False
        with self._lock:
            now = time.monotonic()
            if now < self._skip_until:
                return True
            self._skip_until = now + self.retry_s  # this caller is the probe
            return False

    def failed(self) -> bool:
        """Count a failed call: skipped for ``retry_s``. True for the first failure of
        an outage (say so once; later ones at debug level)."""
        with self._lock:
            first, self._down = not self._down, True
            self._skip_until = time.monotonic() + self.retry_s
        return first

    def answered(self) -> None:
        """Count a call it answered: the outage, if any, is over."""
        if self._down:
            with self._lock:
                self._down = False
