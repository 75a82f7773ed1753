"""Orchestration overhead, concurrency and memory, against LlamaIndex's built-ins.

(1) Per-query overhead with an instant LLM and an in-memory retriever: what the
    orchestration (transform, fan-out, fusion, events, usage) costs by itself.
(2) 64 concurrent ``aretrieve`` calls with a 100 ms LLM.
(3) Memory: peak traced allocation with 1,000 searches in flight at once.

Both libraries get the same LLM, retriever and work in the same run; the last column
is the built-in's time (or memory) divided by ours. Ours runs with the shipped
defaults (the LLM timeout and the circuit breaker on; the built-ins have neither); row
(1t) shows what the default timeout costs on the sync path (the LLM call handed to a
pooled worker thread, so the caller can stop waiting) against the same search with
``timeout=None``. The load average is printed before and after.

    uv run --frozen python benchmarks/overhead.py [--queries 2000] [--rounds 5] [--markdown]

Rows (1) and (0) alternate ours and the other side ``--rounds`` times and show medians.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.indices.query.query_transform.base import HyDEQueryTransform
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.retrievers import TransformRetriever as CoreTransformRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus import HyDE, MemoryCache, MultiQuery, TransformRetriever
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

TEXTS = {f"d{i}": f"document number {i}" for i in range(20)}
N = 4


def llm(delay: float = 0.0) -> ScriptedLLM:
    reply = "\n".join(f"{i}. paraphrase {i}" for i in range(1, N + 1))
    return ScriptedLLM(respond=lambda prompt: reply, delay=delay)


def base() -> StaticRetriever:
    return StaticRetriever(TEXTS, default=[f"d{i}" for i in range(10)])


def ours_hyde(delay: float = 0.0) -> Any:
    """HyDE with the shipped defaults: the one timeout policy (30 s for this remote-like
    LLM) and the circuit breaker."""
    return TransformRetriever(base(), HyDE(llm(delay)))


def ours_hyde_untimed(delay: float = 0.0) -> Any:
    """HyDE with ``timeout=None``: the LLM called in the caller's thread."""
    return TransformRetriever(base(), HyDE(llm(delay), timeout=None))


def core_hyde(delay: float = 0.0) -> Any:
    return CoreTransformRetriever(base(), HyDEQueryTransform(llm=llm(delay)))


def ours_multi(delay: float = 0.0) -> Any:
    return TransformRetriever(base(), MultiQuery(llm(delay), n=N))


def core_multi(delay: float = 0.0) -> Any:
    return QueryFusionRetriever(
        [base()],
        llm=llm(delay),
        num_queries=N + 1,
        use_async=True,
        mode="reciprocal_rerank",
        similarity_top_k=10,
    )


class Floor(BaseRetriever):
    """The work no HyDE retriever can skip: its own instrumented ``retrieve``, the LLM
    call(s) and the inner retriever's instrumented ``retrieve`` (``calls`` LLM calls,
    ``searches`` inner searches), and nothing else."""

    def __init__(self, calls: int = 1, searches: int = 1) -> None:
        super().__init__()
        self.llm, self.inner = llm(), base()
        self.calls, self.searches = calls, searches

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        for _ in range(self.calls):
            self.llm.complete(f"Write a passage.\nQuestion: {query_bundle.query_str}")
        found: list[NodeWithScore] = []
        for _ in range(self.searches):
            found = self.inner.retrieve(query_bundle)
        return found

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        for _ in range(self.calls):
            await self.llm.acomplete(f"Write a passage.\nQuestion: {query_bundle.query_str}")
        found: list[NodeWithScore] = []
        for _ in range(self.searches):
            found = await self.inner.aretrieve(query_bundle)
        return found


def cache_hit_ratio(n: int) -> tuple[float, float]:
    """``(miss, hit)`` median seconds of ``TransformRetriever.search`` with a 100 ms LLM
    and a `MemoryCache`: each question is searched once (a miss), then all again (hits)."""
    retriever = TransformRetriever(
        base(),
        HyDE(llm(0.1), cache=MemoryCache(), include_query=True),
    )
    misses, hits = [], []
    for i in range(n):  # every question once: misses
        start = time.perf_counter()
        retriever.search(f"question {i}")
        misses.append(time.perf_counter() - start)
    for i in range(n):  # every question again: hits
        start = time.perf_counter()
        retriever.search(f"question {i}")
        hits.append(time.perf_counter() - start)
    return statistics.median(misses), statistics.median(hits)


def per_query_sync(make: Callable[[], Any], n: int) -> float:
    r = make()
    r.retrieve("warm up")
    start = time.perf_counter()
    for i in range(n):
        r.retrieve(f"question {i}")
    return (time.perf_counter() - start) / n


def per_query_async(make: Callable[[], Any], n: int) -> float:
    async def run() -> float:
        r = make()
        await r.aretrieve("warm up")
        start = time.perf_counter()
        for i in range(n):
            await r.aretrieve(f"question {i}")
        return (time.perf_counter() - start) / n

    return asyncio.run(run())


def paired(
    measure: Callable[[Callable[[], Any], int], float],
    ours: Callable[[], Any],
    theirs: Callable[[], Any],
    n: int,
    rounds: int,
) -> tuple[float, float]:
    """Median per-query seconds of ``ours`` and ``theirs`` over ``rounds`` runs taken
    alternately (ours, theirs, ours, ...), so load that comes and goes hits both."""
    mine: list[float] = []
    other: list[float] = []
    for _ in range(rounds):
        mine.append(measure(ours, n))
        other.append(measure(theirs, n))
    return statistics.median(mine), statistics.median(other)


def concurrent_wall(make: Callable[[], Any], k: int = 64) -> float:
    async def run() -> float:
        r = make()
        start = time.perf_counter()
        await asyncio.gather(*(r.aretrieve(f"question {i}") for i in range(k)))
        return time.perf_counter() - start

    return statistics.median(asyncio.run(run()) for _ in range(3))


def peak_memory(make: Callable[[], Any], k: int = 1000) -> float:
    async def run() -> None:
        r = make()
        await asyncio.gather(*(r.aretrieve(f"question {i}") for i in range(k)))

    gc.collect()
    tracemalloc.start()
    asyncio.run(run())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternate runs per row (1); medians shown"
    )
    parser.epilog = (
        "Rows (0) compare ours with the floor (the last column is floor / ours: 1.0 is "
        "the floor, 0.77 is 1.3x it); row (4) puts a cache hit (hyde-plus column) against "
        "a 100 ms miss (other column)."
    )
    args = parser.parse_args()
    logging.getLogger("llama_index_hyde_plus").setLevel(logging.ERROR)
    load_before = os.getloadavg()[0]
    n = args.queries
    us = 1e6
    rows: list[tuple[str, str, str, float]] = []

    def add(name: str, ours: float, theirs: float, unit: str, scale: float) -> None:
        rows.append(
            (name, f"{ours * scale:,.0f} {unit}", f"{theirs * scale:,.0f} {unit}", theirs / ours)
        )

    r = args.rounds
    add("(1) HyDE, sync, per query", *paired(per_query_sync, ours_hyde, core_hyde, n, r), "µs", us)
    add(
        "(1) HyDE, async, per query",
        *paired(per_query_async, ours_hyde, core_hyde, n, r),
        "µs",
        us,
    )
    add(
        f"(1) multi-query n={N}, sync, per query",
        *paired(per_query_sync, ours_multi, core_multi, n // 4, r),
        "µs",
        us,
    )
    add(
        f"(1) multi-query n={N}, async, per query",
        *paired(per_query_async, ours_multi, core_multi, n // 4, r),
        "µs",
        us,
    )
    add(
        "(2) HyDE, 64 concurrent, 100 ms LLM",
        concurrent_wall(lambda: ours_hyde(0.1)),
        concurrent_wall(lambda: core_hyde(0.1)),
        "ms",
        1000,
    )
    add(
        f"(2) multi-query n={N}, 64 concurrent, 100 ms LLM",
        concurrent_wall(lambda: ours_multi(0.1)),
        concurrent_wall(lambda: core_multi(0.1)),
        "ms",
        1000,
    )
    add(
        "(3) HyDE, peak memory, 1,000 in flight",
        peak_memory(ours_hyde),
        peak_memory(core_hyde),
        "MB",
        1,
    )
    add(
        f"(3) multi-query n={N}, peak memory, 1,000 in flight",
        peak_memory(ours_multi),
        peak_memory(core_multi),
        "MB",
        1,
    )

    floors = [
        ("(0) floor: HyDE, sync", paired(per_query_sync, ours_hyde, Floor, n, r)),
        ("(0) floor: HyDE, async", paired(per_query_async, ours_hyde, Floor, n, r)),
        (
            f"(0) floor: multi-query n={N}, sync",
            paired(per_query_sync, ours_multi, lambda: Floor(1, N + 1), n // 4, r),
        ),
        (
            f"(0) floor: multi-query n={N}, async",
            paired(per_query_async, ours_multi, lambda: Floor(1, N + 1), n // 4, r),
        ),
    ]
    for name, (ours_s, floor) in floors:  # measured in pairs too: the same load on both
        rows.append(
            (
                f"{name} (ours / floor)",
                f"{ours_s * us:,.0f} µs",
                f"{floor * us:,.0f} µs",
                floor / ours_s,
            )
        )
    timed, untimed = paired(per_query_sync, ours_hyde, ours_hyde_untimed, n, r)
    rows.append(
        (
            "(1t) HyDE, sync: default timeout (ours) / timeout=None (other column)",
            f"{timed * us:,.0f} µs",
            f"{untimed * us:,.0f} µs",
            untimed / timed,
        )
    )
    miss, hit = cache_hit_ratio(50)
    rows.append(
        (
            "(4) cache: miss (100 ms LLM) / hit",
            f"{hit * us:,.0f} µs",
            f"{miss * us:,.0f} µs",
            miss / hit,
        )
    )

    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"{os.cpu_count()} cores, {load}")
    if args.markdown:
        print("| measure | hyde-plus | LlamaIndex built-in | built-in / ours |")
        print("| --- | ---: | ---: | ---: |")
        for name, ours, theirs, ratio in rows:
            print(f"| {name} | {ours} | {theirs} | {ratio:.2f}x |")
        return
    table = Table(title="Overhead, concurrency and memory against LlamaIndex built-ins")
    for col in ("measure", "hyde-plus", "LlamaIndex", "built-in / ours"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for name, ours, theirs, ratio in rows:
        table.add_row(name, ours, theirs, f"{ratio:.2f}x")
    Console(width=110).print(table)


if __name__ == "__main__":
    main()
