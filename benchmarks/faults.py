"""Search latency under provider faults, with and without the circuit breaker, and
cache hit against miss.

The provider is a scripted LLM that takes 100 ms per call; one variant fails 30% of
calls with HTTP 503 (seeded), another hangs on every call. The retriever returns at
once, so the numbers are the transform's. Each scenario runs ``--searches`` async
searches, 8 at a time.

    uv run --frozen python benchmarks/faults.py [--searches 200] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus import HyDE, MemoryCache, TransformRetriever
from llama_index_hyde_plus.calls.reliability import NO_RETRY, CircuitBreaker, RetryPolicy
from llama_index_hyde_plus.testing import HANG, ScriptedLLM, StaticRetriever

DOCS = {f"d{i}": f"document {i}" for i in range(10)}


class ServiceUnavailable(Exception):
    status_code = 503


def flaky(rate: float, seed: int = 7) -> Callable[[str], str]:
    rng = random.Random(seed)

    def respond(prompt: str) -> str:
        if rng.random() < rate:
            raise ServiceUnavailable("HTTP 503 from the provider")
        return "A hypothetical passage about the question."

    return respond


async def run(retriever: TransformRetriever, searches: int, concurrency: int = 8) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    fallbacks = 0
    errors = 0

    async def one(i: int) -> None:
        nonlocal fallbacks, errors
        async with gate:
            start = time.perf_counter()
            try:
                result = await retriever.asearch(f"question {i}")
                fallbacks += result.transform.fallback
                assert result.nodes
            except Exception:
                errors += 1
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(one(i) for i in range(searches)))
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"p50": cuts[49], "p99": cuts[98], "fallbacks": fallbacks / searches, "errors": errors}


def retriever_for(llm: ScriptedLLM, **hyde: Any) -> TransformRetriever:
    return TransformRetriever(StaticRetriever(DOCS, default=["d1", "d2"]), HyDE(llm, **hyde))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    logging.getLogger("llama_index_hyde_plus").setLevel(logging.ERROR)  # fallbacks are counted
    n = args.searches
    retry = RetryPolicy(max_retries=2, base_delay_s=0.05, max_delay_s=0.2)
    rows: list[tuple[str, dict[str, Any]]] = []

    def scenario(name: str, make: Callable[[], TransformRetriever]) -> None:
        rows.append((name, asyncio.run(run(make(), n))))

    scenario(
        "healthy provider (100 ms)",
        lambda: retriever_for(ScriptedLLM(respond=flaky(0.0), delay=0.1)),
    )
    scenario(
        "30% HTTP 503, no retry",
        lambda: retriever_for(
            ScriptedLLM(respond=flaky(0.3), delay=0.1), retry=NO_RETRY, breaker=None
        ),
    )
    scenario(
        "30% HTTP 503, retries (2, jittered)",
        lambda: retriever_for(
            ScriptedLLM(respond=flaky(0.3), delay=0.1), retry=retry, breaker=None
        ),
    )
    scenario(
        "30% HTTP 503, retries + breaker",
        lambda: retriever_for(ScriptedLLM(respond=flaky(0.3), delay=0.1), retry=retry),
    )
    scenario(
        "hanging provider, timeout 1 s, no breaker",
        lambda: retriever_for(
            ScriptedLLM([HANG] * (3 * n)), timeout=1.0, retry=NO_RETRY, breaker=None
        ),
    )
    scenario(
        "hanging provider, timeout 1 s, breaker (5 failures, 30 s)",
        lambda: retriever_for(
            ScriptedLLM([HANG] * (3 * n)),
            timeout=1.0,
            retry=NO_RETRY,
            breaker=CircuitBreaker(5, 30.0),
        ),
    )

    async def cache_latency() -> tuple[float, float]:
        cache = MemoryCache()
        hyde = HyDE(ScriptedLLM(respond=flaky(0.0), delay=0.1), cache=cache)
        retriever = TransformRetriever(StaticRetriever(DOCS, default=["d1"]), hyde)
        misses, hits = [], []
        for i in range(50):
            start = time.perf_counter()
            await retriever.asearch(f"cached question {i}")
            misses.append(time.perf_counter() - start)
            start = time.perf_counter()
            await retriever.asearch(f"cached question {i}")
            hits.append(time.perf_counter() - start)
        return statistics.median(misses), statistics.median(hits)

    miss, hit = asyncio.run(cache_latency())

    def ms(x: float) -> str:
        return f"{x * 1000:.1f} ms"

    if args.markdown:
        print("| scenario | p50 | p99 | fallbacks | errors |\n| --- | ---: | ---: | ---: | ---: |")
        for name, r in rows:
            print(
                f"| {name} | {ms(r['p50'])} | {ms(r['p99'])} | {r['fallbacks']:.0%} | "
                f"{r['errors']} |"
            )
        print(
            f"\n| cache | median search latency |\n| --- | ---: |\n| miss (LLM call) | "
            f"{ms(miss)} |\n| hit (MemoryCache) | {ms(hit)} |"
        )
        return
    table = Table(title=f"Search latency under faults ({n} async searches, 8 in flight)")
    for col in ("scenario", "p50", "p99", "fallbacks", "errors"):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for name, r in rows:
        table.add_row(name, ms(r["p50"]), ms(r["p99"]), f"{r['fallbacks']:.0%}", str(r["errors"]))
    console = Console(width=110)
    console.print(table)
    console.print(f"cache miss {ms(miss)} vs hit {ms(hit)} (median of 50)")


if __name__ == "__main__":
    main()
