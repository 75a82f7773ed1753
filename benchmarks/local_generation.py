"""Local generation benchmark: aggregate tokens/s of the local LLM with 1,
2, 4 and 8 requests in flight.

The real SmolLM2-135M-Instruct (Q4_1 GGUF) through `local_llm()`, called as the
transforms call it (``acomplete`` on one event loop). Every request asks for an essay
(one of eight fixed prompts), greedy (temperature 0), ``--max-tokens`` each, fixed seed,
so every row does comparable work. A row's tokens/s is the completion tokens of all its
requests over its wall time; latency is per request. Each row is the median of
``--repeat`` runs.

    uv run --frozen --all-extras python benchmarks/local_generation.py [--n-parallel 4]
        [--threads N] [--max-tokens 128] [--repeat 3] [--markdown]

With ``--hyde N`` it measures instead what stopping a generation once it holds what is
kept saves: HyDE at ``--max-characters`` (300) over N fixed questions, all
in flight at once, each reply generated whole (before: the cap of max_characters / 4
tokens) and stopped once it decides the kept passage (after): tokens written, tokens
saved, wall time, and how many kept passages are identical.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus import HyDE
from llama_index_hyde_plus.calls.llm import CallOptions
from llama_index_hyde_plus.local import LocalLLM, local_llm

TOPICS = ["rivers", "mountains", "bread", "bridges", "clocks", "birds", "libraries", "trains"]
PROMPTS = [f"Write a long, detailed essay about {t}." for t in TOPICS]
IN_FLIGHT = (1, 2, 4, 8)


@dataclass
class Row:
    in_flight: int
    tokens: int
    wall: float
    latency_p50: float
    latency_max: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall


async def one(llm: LocalLLM, prompt: str, max_tokens: int) -> tuple[int, float]:
    start = time.perf_counter()
    reply = await llm.acomplete(prompt, max_tokens=max_tokens, temperature=0.0)
    return int(reply.raw["usage"]["completion_tokens"]), time.perf_counter() - start


async def run(llm: LocalLLM, n: int, max_tokens: int) -> Row:
    start = time.perf_counter()
    results = await asyncio.gather(*(one(llm, PROMPTS[i % 8], max_tokens) for i in range(n)))
    wall = time.perf_counter() - start
    latencies = [latency for _, latency in results]
    return Row(n, sum(t for t, _ in results), wall, statistics.median(latencies), max(latencies))


def median_row(rows: list[Row]) -> Row:
    return sorted(rows, key=lambda r: r.tokens_per_second)[len(rows) // 2]


def table(rows: list[Row], title: str) -> Table:
    base = rows[0].tokens_per_second
    out = Table(title=title)
    for name in ("in flight", "tokens", "wall s", "tokens/s", "vs 1", "latency p50", "max"):
        out.add_column(name, justify="right")
    for r in rows:
        out.add_row(
            str(r.in_flight),
            str(r.tokens),
            f"{r.wall:.2f}",
            f"{r.tokens_per_second:.0f}",
            f"{r.tokens_per_second / base:.2f}x",
            f"{r.latency_p50:.2f} s",
            f"{r.latency_max:.2f} s",
        )
    return out


def markdown(rows: list[Row]) -> str:
    base = rows[0].tokens_per_second
    lines = [
        "| in flight | tokens | wall | tokens/s | vs 1 | latency p50 | latency max |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.in_flight} | {r.tokens} | {r.wall:.2f} s | {r.tokens_per_second:.0f} | "
            f"{r.tokens_per_second / base:.2f}x | {r.latency_p50:.2f} s | {r.latency_max:.2f} s |"
        )
    return "\n".join(lines)


QUESTIONS = [
    "What causes ocean tides?",
    "How do vaccines train the immune system?",
    "Why is the sky blue?",
    "What does a mitochondrion do?",
    "How does a lithium-ion battery store energy?",
    "Why do leaves change colour in autumn?",
    "What is the greenhouse effect?",
    "How do noise-cancelling headphones work?",
    "What makes bread rise?",
    "Why does ice float on water?",
]


class WholeReplyHyDE(HyDE):
    """HyDE generating every reply whole (up to its token cap): the behaviour before
    generations stopped once they held what is kept."""

    def _call_options(self) -> CallOptions:
        from dataclasses import replace

        return replace(super()._call_options(), enough=None)


async def hyde_row(llm: LocalLLM, hyde: HyDE, questions: list[str]) -> dict[str, float]:
    llm._seen.clear()  # the same seeds for both rows: the same samples
    start = time.perf_counter()
    results = await asyncio.gather(*(hyde.atransform(q) for q in questions))
    wall = time.perf_counter() - start
    return {
        "written": sum(r.usage.output_tokens for r in results),
        "saved": sum(r.usage.tokens_saved for r in results),
        "fallbacks": sum(r.fallback for r in results),
        "wall": wall,
        "passages": results,  # type: ignore[dict-item]
    }


def hyde_main(llm: LocalLLM, n: int, max_characters: int, markdown_out: bool) -> None:
    questions = (QUESTIONS * (n // len(QUESTIONS) + 1))[:n]
    options: dict[str, Any] = {"max_characters": max_characters, "breaker": None, "timeout": 600}
    before = asyncio.run(hyde_row(llm, WholeReplyHyDE(llm, **options), questions))
    after = asyncio.run(hyde_row(llm, HyDE(llm, **options), questions))
    same = sum(
        a.hypothetical == b.hypothetical
        for a, b in zip(before["passages"], after["passages"])  # type: ignore[call-overload]
    )
    title = (
        f"HyDE with {llm.model_name} at max_characters={max_characters}: {n} questions in "
        f"flight, n_parallel={llm.n_parallel}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; kept passages identical: {same} of {n}"
    )
    rows = [("whole reply (before)", before), ("stopped once kept (after)", after)]
    if markdown_out:
        print(f"{title}\n\n| generation | tokens written | tokens saved | wall |")
        print("| --- | ---: | ---: | ---: |")
        for name, r in rows:
            print(f"| {name} | {r['written']:.0f} | {r['saved']:.0f} | {r['wall']:.1f} s |")
        return
    out = Table(title=title)
    for column in ("generation", "tokens written", "tokens saved", "wall", "fallbacks"):
        out.add_column(column, justify="left" if column == "generation" else "right")
    for name, r in rows:
        out.add_row(
            name,
            f"{r['written']:.0f}",
            f"{r['saved']:.0f}",
            f"{r['wall']:.1f} s",
            f"{r['fallbacks']:.0f}",
        )
    Console(width=120).print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None, help="slots (default: ours)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--hyde", type=int, default=None, help="HyDE questions (see above)")
    parser.add_argument("--max-characters", type=int, default=300)
    args = parser.parse_args()
    kwargs: dict[str, int] = {"seed": 0, "max_tokens": args.max_tokens}
    if args.n_parallel is not None:
        kwargs["n_parallel"] = args.n_parallel
    if args.threads is not None:
        kwargs["threads"] = args.threads
    llm = local_llm(**kwargs)
    llm.warm_up()
    if args.hyde is not None:
        hyde_main(llm, args.hyde, args.max_characters, args.markdown)
        return
    asyncio.run(run(llm, 2, 8))  # first-call costs out of the way
    rows = [
        median_row([asyncio.run(run(llm, n, args.max_tokens)) for _ in range(args.repeat)])
        for n in IN_FLIGHT
    ]
    title = (
        f"{llm.model_name}: n_parallel={llm.n_parallel}, "
        f"threads={llm.threads or os.cpu_count()}, max_tokens={args.max_tokens}, "
        f"median of {args.repeat}, {os.cpu_count()} cores"
    )
    if args.markdown:
        print(f"{title}\n\n{markdown(rows)}")
    else:
        Console().print(table(rows, title))


if __name__ == "__main__":
    main()
