"""What a cache hit costs, by cache: in process, a SQLite file, a Redis server.

A HyDE search through `TransformRetriever.search` whose rewrite is already cached,
against the wrapped retriever's own search (the floor) and a miss with a 100 ms LLM.
The Redis rows start Debian's ``redis-server`` on a free loopback port (or use
``--redis URI``); they are left out, saying so, when neither is available.

    uv run --frozen --all-extras python benchmarks/cache_hits.py [--hits 500] [--markdown]

Every row is the median of ``--hits`` searches of one question, after one warm-up,
measured in blocks of 50 that alternate with blocks of the floor's search, so load
that comes and goes on a shared machine weighs on both; ``x floor`` is the median of
the blocks' ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llama_index.core.storage.kvstore import SimpleKVStore
from rich.console import Console
from rich.table import Table

from llama_index_hyde_plus import HyDE, MemoryCache, SQLiteCache, TransformRetriever
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

TEXTS = {f"d{i}": f"document number {i}" for i in range(20)}
QUESTION = "Why did revenue drop?"


def base() -> StaticRetriever:
    return StaticRetriever(TEXTS, default=[f"d{i}" for i in range(10)])


BLOCK = 50


def _block_us(run: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - start) / n * 1e6


def paired_us(run: Callable[[], Any], floor: Callable[[], Any], n: int) -> tuple[float, float]:
    """``(median µs of run, median ratio run / floor)`` over blocks of `BLOCK` searches
    of each, alternating (``n`` searches of each in all, at least one block)."""
    run()  # warm-up: the first search fills the cache
    floor()
    times, ratios = [], []
    for _ in range(max(1, n // BLOCK)):
        ours, base_us = _block_us(run, BLOCK), _block_us(floor, BLOCK)
        times.append(ours)
        ratios.append(ours / base_us)
    return statistics.median(times), statistics.median(ratios)


def searcher(cache: Any, delay: float = 0.0) -> Callable[[], Any]:
    llm = ScriptedLLM(respond=lambda prompt: "Renewals slipped last quarter.", delay=delay)
    retriever = TransformRetriever(base(), HyDE(llm, cache=cache, breaker=None))
    return lambda: retriever.search(QUESTION)


@contextlib.contextmanager
def redis(uri: str | None, folder: Path) -> Iterator[str | None]:
    if uri is not None:
        yield uri
        return
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hits", type=int, default=500)
    parser.add_argument("--redis", default=None, help="a Redis URI (default: start one)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp, redis(args.redis, Path(tmp)) as uri:
        floor_retriever = base()

        def floor() -> Any:
            return floor_retriever.retrieve(QUESTION)

        caches: list[tuple[str, Any]] = [
            ("hit: MemoryCache", MemoryCache()),
            ("hit: SQLiteCache", SQLiteCache(Path(tmp) / "c.sqlite")),
            ("hit: KVStoreCache(SimpleKVStore)", KVStoreCache(SimpleKVStore())),
        ]
        if uri is not None:
            caches.append(("hit: KVStoreCache(Redis)", KVStoreCache.from_uri(uri)))
        floor_us, _ = paired_us(floor, floor, args.hits)
        rows.append(("plain search (the floor)", floor_us, 1.0))
        for name, cache in caches:
            rows.append((name, *paired_us(searcher(cache), floor, args.hits)))
        miss_us, miss_ratio = paired_us(searcher(None, delay=0.1), floor, BLOCK)
        rows.append(("miss: 100 ms LLM, no cache", miss_us, miss_ratio))
    if args.markdown:
        print("| search | median | x floor |\n| --- | ---: | ---: |")
        for name, us, ratio in rows:
            print(f"| {name} | {us:,.0f} µs | {ratio:.1f}x |")
    else:
        table = Table(title="Cache hits through TransformRetriever.search (HyDE)")
        for column in ("search", "median", "x floor"):
            table.add_column(column, justify="left" if column == "search" else "right")
        for name, us, ratio in rows:
            table.add_row(name, f"{us:,.0f} µs", f"{ratio:.2f}x")
        Console().print(table)
    if uri is None:
        print("Redis rows left out: no redis-server on PATH and no --redis URI.")
    print(f"{os.cpu_count()} cores, load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
