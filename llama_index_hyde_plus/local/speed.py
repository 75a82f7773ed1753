"""Planning local generation from the speed this machine gives now, not a fixed guess.

On a CPU shared with other busy processes, llama.cpp's threads wait for each other: two
threads on two busy cores can be ten times slower than one (measured: 1.3 to 4.5 tokens/s
against 21 to 24 for the bundled model, with three other CPU-bound jobs). `plan_threads`
times a short generation with one thread and with every core, and keeps the faster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from .llm import LocalLLM

SPEED_MARGIN = 0.5
"""The share of the measured speed the timeout policy budgets calls by: the machine may
get busier after the probe, and calls decoded together share it."""


@dataclass(frozen=True)
class SpeedPlan:
    """What `plan_threads` measured and chose."""

    threads: int
    """llama.cpp threads: the faster of one and every core."""
    tokens_per_s: float
    """One generation's measured speed with ``threads``."""
    tried: dict[int, float]
    """Each thread count tried and its measured tokens/s."""

    @property
    def budget_rate(self) -> float:
        """The rate calls are budgeted by (`SPEED_MARGIN` of the measured one)."""
        return max(self.tokens_per_s * SPEED_MARGIN, 0.1)

    def describe(self) -> str:
        """``"22.1 tokens/s with 1 llama.cpp thread (2 threads: 1.3)"``."""
        others = ", ".join(
            f"{n} thread{'s' if n > 1 else ''}: {f'{rate:.1f}' if rate else 'under 1'}"
            for n, rate in sorted(self.tried.items())
            if n != self.threads
        )
        plural = "s" if self.threads > 1 else ""
        tail = f" ({others})" if others else ""
        return (
            f"{self.tokens_per_s:.1f} tokens/s with {self.threads} llama.cpp thread{plural}{tail}"
        )


def plan_threads(make: Callable[[int], LocalLLM], cores: int | None = None) -> SpeedPlan:
    """Time a short generation of ``make(1)`` and of ``make(cores)`` (the machine's
    cores), and keep the faster thread count. The many-thread probe may take at most
    1.5 times what the one-thread probe took (prompt and generation): slower than that,
    it has lost anyway."""
    cores = cores or os.cpu_count() or 1
    one = make(1)
    one.warm_up()  # loading is not timed
    start = time.perf_counter()
    tried = {1: one.measure_speed()}
    allowed = 1.5 * (time.perf_counter() - start)  # reading the prompt included
    one.close()
    if cores > 1:
        many = make(cores)
        many.warm_up()
        tried[cores] = many.measure_speed(budget_s=allowed)
        many.close()
    threads = max(tried, key=lambda n: tried[n])
    return SpeedPlan(threads, tried[threads], tried)
