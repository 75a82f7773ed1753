"""End-to-end latency as a user feels it: a remote-like LLM and store.

A scripted LLM that answers in ``--llm-ms`` (100 ms) and a store that answers each
search in ``--search-ms`` (50 ms). For HyDE (shipped defaults, and ``strategy="rerank"``),
multi-query (n=4) and step-back, one search's wall time through:

- ours: `TransformRetriever` with the shipped defaults (timeout and breaker on), sync
  ``retrieve`` and async ``aretrieve``;
- the built-in: core ``TransformRetriever`` + ``HyDEQueryTransform`` for HyDE, and
  ``QueryFusionRetriever`` (``use_async=True``; 5 queries for multi-query, 2 for
  step-back: the question and one rewrite) for the others;
- the floor: the same LLM call and searches scheduled as the physical limit allows
  (what does not depend on the LLM runs while it writes): HyDE LLM + 1 search; rerank
  max(LLM, question search); multi-query and step-back max(LLM, question search) + one
  round of the generated searches at once.

"target" is LLM + one search round, +10% (multi-query and rerank must be within it).
Every cell is the median over ``--rounds`` rounds, each running ``--queries`` queries
through ours (sync, async), the built-in and the floor in turn.

    uv run --frozen --all-extras python benchmarks/latency.py [--queries 10] [--rounds 5]
        [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llama_index.core.indices.query.query_transform.base import HyDEQueryTransform
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.retrievers import TransformRetriever as CoreTransformRetriever
from rich import box
from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus import HyDE, MultiQuery, StepBack, TransformRetriever
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

TEXTS = {f"d{i}": f"document number {i} about revenue, renewals and churn" for i in range(20)}
N = 4


class Setup:
    """The LLM and store delays of one run, and what each side is built from."""

    def __init__(self, llm_s: float, search_s: float) -> None:
        self.llm_s, self.search_s = llm_s, search_s

    def llm(self) -> ScriptedLLM:
        reply = "\n".join(f"{i}. why did revenue drop, take {i}?" for i in range(1, N + 1))
        return ScriptedLLM(respond=lambda prompt: reply, delay=self.llm_s, record=False)

    def store(self) -> StaticRetriever:
        return StaticRetriever(TEXTS, default=[f"d{i}" for i in range(10)], delay=self.search_s)

    def ours(self, kind: str) -> Any:
        transform: Any = {
            "hyde": lambda: HyDE(self.llm()),
            "hyde-rerank": lambda: HyDE(self.llm(), strategy="rerank"),
            "multi-query": lambda: MultiQuery(self.llm(), n=N),
            "step-back": lambda: StepBack(self.llm()),
        }[kind]()
        return TransformRetriever(self.store(), transform, embed_model=DeterministicEmbedding())

    def builtin(self, kind: str) -> Any:
        if kind.startswith("hyde"):
            return CoreTransformRetriever(self.store(), HyDEQueryTransform(llm=self.llm()))
        return QueryFusionRetriever(
            [self.store()],
            llm=self.llm(),
            num_queries=N + 1 if kind == "multi-query" else 2,
            use_async=True,
            mode="reciprocal_rerank",
            similarity_top_k=10,
        )

    def floor(self, kind: str) -> Callable[[str], Any]:
        """One query scheduled as the physical limit allows (see the module docstring)."""
        llm, store = self.llm(), self.store()
        pool = ThreadPoolExecutor(N + 1)
        rounds = {"hyde": 0, "hyde-rerank": 0, "multi-query": 1, "step-back": 1}[kind]

        def run(question: str) -> Any:
            if kind == "hyde":
                llm.complete(question)
                return store.retrieve(question)
            own = pool.submit(store.retrieve, question)  # while the LLM writes
            llm.complete(question)
            found = own.result()
            if rounds:
                width = N if kind == "multi-query" else 1
                searches = [pool.submit(store.retrieve, f"{question} {i}") for i in range(width)]
                found = [f.result() for f in searches]
            return found

        return run


def per_query(run: Callable[[str], Any], n: int, start: int) -> float:
    began = time.perf_counter()
    for i in range(n):
        run(f"question {start + i}")
    return (time.perf_counter() - began) / n


def per_query_async(retriever: Any, n: int, start: int) -> float:
    async def go() -> float:
        began = time.perf_counter()
        for i in range(n):
            await retriever.aretrieve(f"question {start + i}")
        return (time.perf_counter() - began) / n

    return asyncio.run(go())


def measure(setup: Setup, kind: str, n: int, rounds: int) -> dict[str, float]:
    """Median seconds per query of each side, over alternating rounds."""
    ours, builtin, floor = setup.ours(kind), setup.builtin(kind), setup.floor(kind)
    for warm in (ours.retrieve, builtin.retrieve, floor):
        warm("warm up")
    times: dict[str, list[float]] = {"sync": [], "async": [], "builtin": [], "floor": []}
    for r in range(rounds):
        start = (r + 1) * 1000  # fresh questions: no cache hit anywhere
        times["sync"].append(per_query(ours.retrieve, n, start))
        times["async"].append(per_query_async(ours, n, start + 500))
        times["builtin"].append(per_query(builtin.retrieve, n, start))
        times["floor"].append(per_query(floor, n, start))
    return {side: statistics.median(values) for side, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llm-ms", type=float, default=100.0)
    parser.add_argument("--search-ms", type=float, default=50.0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    logging.getLogger("llama_index_hyde_plus").setLevel(logging.ERROR)
    setup = Setup(args.llm_ms / 1000, args.search_ms / 1000)
    load = os.getloadavg()[0]
    target = (args.llm_ms + args.search_ms) * 1.1
    header = ("search", "sync", "async", "built-in", "floor", "/ floor", "target")
    rows = []
    for kind in ("hyde", "hyde-rerank", "multi-query", "step-back"):
        t = measure(setup, kind, args.queries, args.rounds)
        worst = max(t["sync"], t["async"]) * 1000
        check = ""
        if kind in ("hyde-rerank", "multi-query"):
            check = f"{'within' if worst <= target else 'OVER'} {target:.0f}"
        rows.append(
            (
                kind,
                *(f"{t[s] * 1000:.1f}" for s in ("sync", "async", "builtin", "floor")),
                f"{max(t['sync'], t['async']) / t['floor']:.2f}x",
                check,
            )
        )
    print(f"{os.cpu_count()} cores, load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- " + "| ---: " * (len(header) - 1) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    title = (
        f"ms per search (ours sync and async, the built-in, the floor): "
        f"LLM {args.llm_ms:g} ms, store {args.search_ms:g} ms a search"
    )
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in header:
        table.add_column(column, justify="left" if column == "search" else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
