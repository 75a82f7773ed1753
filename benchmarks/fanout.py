"""Fan-out benchmark: wall time of transformed searches against LlamaIndex's built-ins.

A retriever that sleeps 50 ms per search and an LLM that sleeps 100 ms per call stand
in for a vector store and a provider, so the numbers measure orchestration: how much of
the waiting overlaps. Both libraries get the same LLM, retriever and work, in the same
run. Each cell is the median of ``--repeat`` runs.

    uv run --frozen python benchmarks/fanout.py [--repeat 5] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llama_index.core.indices.query.query_transform.base import HyDEQueryTransform
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.retrievers import TransformRetriever as CoreTransformRetriever
from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

LLM_S = 0.100
RETRIEVER_S = 0.050
N = 4
CONCURRENT = 32
TEXTS = {f"d{i}": f"document number {i}" for i in range(20)}


def llm() -> ScriptedLLM:
    return ScriptedLLM(
        respond=lambda prompt: "\n".join(
            f"{i}. paraphrase {i} of the question" for i in range(1, N + 1)
        ),
        delay=LLM_S,
    )


def retriever() -> StaticRetriever:
    return StaticRetriever(TEXTS, default=[f"d{i}" for i in range(10)], delay=RETRIEVER_S)


def ours_multi() -> TransformRetriever:
    return TransformRetriever(retriever(), MultiQuery(llm(), n=N))


def theirs_multi() -> QueryFusionRetriever:
    return QueryFusionRetriever(
        [retriever()],
        llm=llm(),
        num_queries=N + 1,
        use_async=True,
        mode="reciprocal_rerank",
        similarity_top_k=10,
    )


def theirs_multi_sync() -> QueryFusionRetriever:
    return QueryFusionRetriever(
        [retriever()],
        llm=llm(),
        num_queries=N + 1,
        use_async=False,
        mode="reciprocal_rerank",
        similarity_top_k=10,
    )


def ours_hyde() -> TransformRetriever:
    return TransformRetriever(retriever(), HyDE(llm()))


def theirs_hyde() -> CoreTransformRetriever:
    return CoreTransformRetriever(retriever(), HyDEQueryTransform(llm=llm()))


def timed(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def timed_async(make: Callable[[], Awaitable[Any]], repeat: int) -> float:
    return timed(lambda: asyncio.run(make()), repeat)  # type: ignore[arg-type, return-value]


def concurrent(build: Callable[[], Any], query: str) -> Callable[[], Awaitable[Any]]:
    async def run() -> Any:
        r = build()
        return await asyncio.gather(*(r.aretrieve(f"{query} {i}") for i in range(CONCURRENT)))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    q = "why did revenue drop"
    rows: list[tuple[str, float, float, str]] = []

    def add(name: str, ours: float, theirs: float, what: str) -> None:
        rows.append((name, ours, theirs, what))

    add(
        f"multi-query n={N}, one asearch",
        timed_async(lambda: ours_multi().aretrieve(q), args.repeat),
        timed_async(lambda: theirs_multi().aretrieve(q), args.repeat),
        "QueryFusionRetriever(use_async=True)",
    )
    add(
        f"multi-query n={N}, one sync search",
        timed(lambda: ours_multi().retrieve(q), args.repeat),
        timed(lambda: theirs_multi_sync().retrieve(q), args.repeat),
        "QueryFusionRetriever(use_async=False)",
    )
    add(
        f"multi-query n={N}, {CONCURRENT} concurrent asearch",
        timed_async(concurrent(ours_multi, q), args.repeat),
        timed_async(concurrent(theirs_multi, q), args.repeat),
        "QueryFusionRetriever(use_async=True)",
    )
    add(
        "HyDE, one asearch",
        timed_async(lambda: ours_hyde().aretrieve(q), args.repeat),
        timed_async(lambda: theirs_hyde().aretrieve(q), args.repeat),
        "TransformRetriever + HyDEQueryTransform",
    )
    add(
        f"HyDE, {CONCURRENT} concurrent asearch",
        timed_async(concurrent(ours_hyde, q), args.repeat),
        timed_async(concurrent(theirs_hyde, q), args.repeat),
        "TransformRetriever + HyDEQueryTransform",
    )

    if args.markdown:
        print("| scenario | hyde-plus | LlamaIndex built-in | speed-up | built-in |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, ours, theirs, what in rows:
            print(
                f"| {name} | {ours * 1000:.0f} ms | {theirs * 1000:.0f} ms | "
                f"{theirs / ours:.1f}x | {what} |"
            )
        return
    table = Table(
        title=f"Fan-out wall time (LLM {LLM_S * 1000:.0f} ms, retriever "
        f"{RETRIEVER_S * 1000:.0f} ms, median of {args.repeat})"
    )
    for col in ("scenario", "hyde-plus", "LlamaIndex", "speed-up", "built-in"):
        table.add_column(
            col, justify="right" if col in ("hyde-plus", "LlamaIndex", "speed-up") else "left"
        )
    for name, ours, theirs, what in rows:
        table.add_row(
            name, f"{ours * 1000:.0f} ms", f"{theirs * 1000:.0f} ms", f"{theirs / ours:.1f}x", what
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
