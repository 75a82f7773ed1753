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

    uv run --frozen python benchmarks/overhead.py [--queries 2000] [--markdown]

Rows (1), (0) and (1t) time ``--queries`` searches of each side in blocks of 20 that
alternate (which side goes first flips every block), and show the median time per
search and the median of the blocks' ratios with its quartiles: one run's spread, so
a ratio's uncertainty is printed beside it. ``instructions.py`` counts the same rows'
work without timing noise.
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
from dataclasses import dataclass
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


BLOCK = 20
"""Searches per timed block: ours and the other side alternate block by block."""


@dataclass(frozen=True)
class Paired:
    """Ours against another side, measured in alternating blocks."""

    ours: float
    """Median seconds per search of ours, over the blocks."""
    theirs: float
    """The same for the other side."""
    ratio: float
    """The median over block pairs of theirs / ours (above 1: ours is faster)."""
    low: float
    """The lower quartile of those ratios."""
    high: float
    """The upper quartile."""

    def ratio_text(self) -> str:
        return f"{self.ratio:.2f}x ({self.low:.2f}-{self.high:.2f})"


_Side = tuple[Any, list[float]]
"""A retriever and the per-search times of its blocks."""


def _paired(mine: list[float], other: list[float]) -> Paired:
    ratios = [b / a for a, b in zip(mine, other)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    median = statistics.median
    return Paired(median(mine), median(other), median(ratios), q1, q3)


def _turns(k: int, ours: _Side, theirs: _Side) -> tuple[_Side, _Side]:
    """The two sides in the order block ``k`` times them: which goes first flips
    every block, so load that comes and goes weighs on both."""
    return (ours, theirs) if k % 2 == 0 else (theirs, ours)


def paired_sync(ours: Callable[[], Any], theirs: Callable[[], Any], n: int) -> Paired:
    """``n`` sync searches of each side in blocks of `BLOCK`, taken in turn (`_turns`)."""
    a, b = ours(), theirs()
    a.retrieve("warm up")
    b.retrieve("warm up")
    mine: list[float] = []
    other: list[float] = []
    for k in range(max(1, n // BLOCK)):
        for r, times in _turns(k, (a, mine), (b, other)):
            start = time.perf_counter()
            for i in range(BLOCK):
                r.retrieve(f"question {k} {i}")
            times.append((time.perf_counter() - start) / BLOCK)
    return _paired(mine, other)


def paired_async(ours: Callable[[], Any], theirs: Callable[[], Any], n: int) -> Paired:
    """`paired_sync` with ``aretrieve``, both sides on one event loop."""

    async def run() -> Paired:
        a, b = ours(), theirs()
        await a.aretrieve("warm up")
        await b.aretrieve("warm up")
        mine: list[float] = []
        other: list[float] = []
        for k in range(max(1, n // BLOCK)):
            for r, times in _turns(k, (a, mine), (b, other)):
                start = time.perf_counter()
                for i in range(BLOCK):
                    await r.aretrieve(f"question {k} {i}")
                times.append((time.perf_counter() - start) / BLOCK)
        return _paired(mine, other)

    return asyncio.run(run())


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
    parser.add_argument("--queries", type=int, default=2000, help="searches of each side")
    parser.add_argument("--markdown", action="store_true")
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
    rows: list[tuple[str, str, str, str]] = []

    def add(name: str, ours: float, theirs: float, unit: str, scale: float) -> None:
        rows.append(
            (
                name,
                f"{ours * scale:,.0f} {unit}",
                f"{theirs * scale:,.0f} {unit}",
                f"{theirs / ours:.2f}x",
            )
        )

    def add_paired(name: str, found: Paired) -> None:
        rows.append(
            (name, f"{found.ours * us:,.0f} µs", f"{found.theirs * us:,.0f} µs", found.ratio_text())
        )

    multi_floor = lambda: Floor(1, N + 1)  # noqa: E731
    add_paired("(1) HyDE, sync", paired_sync(ours_hyde, core_hyde, n))
    add_paired("(1) HyDE, async", paired_async(ours_hyde, core_hyde, n))
    add_paired(f"(1) multi-query n={N}, sync", paired_sync(ours_multi, core_multi, n // 4))
    add_paired(f"(1) multi-query n={N}, async", paired_async(ours_multi, core_multi, n // 4))
    add(
        "(2) HyDE, 64 at once, 100 ms LLM",
        concurrent_wall(lambda: ours_hyde(0.1)),
        concurrent_wall(lambda: core_hyde(0.1)),
        "ms",
        1000,
    )
    add(
        f"(2) multi-query n={N}, 64 at once",
        concurrent_wall(lambda: ours_multi(0.1)),
        concurrent_wall(lambda: core_multi(0.1)),
        "ms",
        1000,
    )
    add("(3) HyDE, peak, 1,000 in flight", peak_memory(ours_hyde), peak_memory(core_hyde), "MB", 1)
    add(
        f"(3) multi-query n={N}, peak memory",
        peak_memory(ours_multi),
        peak_memory(core_multi),
        "MB",
        1,
    )
    add_paired("(0) floor: HyDE, sync", paired_sync(ours_hyde, Floor, n))
    add_paired("(0) floor: HyDE, async", paired_async(ours_hyde, Floor, n))
    add_paired("(0) floor: multi-query, sync", paired_sync(ours_multi, multi_floor, n // 4))
    add_paired("(0) floor: multi-query, async", paired_async(ours_multi, multi_floor, n // 4))
    add_paired("(1t) HyDE sync: timeout / None", paired_sync(ours_hyde, ours_hyde_untimed, n))
    miss, hit = cache_hit_ratio(50)
    add("(4) cache: hit / 100 ms miss", hit, miss, "µs", us)

    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"{os.cpu_count()} cores, {load}")
    head = ("measure", "hyde-plus", "other", "other / ours")
    if args.markdown:
        print(f"| {' | '.join(head)} |\n| --- | ---: | ---: | ---: |")
        for row in rows:
            print(f"| {' | '.join(row)} |")
        return
    table = Table(title="Overhead against LlamaIndex's built-ins")
    for col in head:
        table.add_column(col, justify="left" if col == "measure" else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=80).print(table)
    print(
        f"(1), (0), (1t): medians of {BLOCK}-search blocks of each side taken in turn; "
        "the quartiles of the blocks' ratios in brackets."
    )


if __name__ == "__main__":
    main()
