"""Machine instructions per search, counted by Valgrind's callgrind: ours against the
built-ins and the floor, with no timing noise.

The wall-clock rows of ``overhead.py`` move by 20-40% between runs on a shared VM;
an instruction count barely does (two runs of one configuration agree within 0.5%).
It measures work only: what a thread hand-off or an event-loop turn costs in
waiting, and how many cycles an instruction takes on the real CPU (caches, branch
prediction), are left out, which is why both tables are kept. The rows mirror
``overhead.py``'s: the same instant LLM and in-memory retriever, ours with the shipped
defaults (the timeout on) unless marked.

Each configuration runs in its own process under ``valgrind --tool=callgrind`` with
instrumentation off; after 20 warm-up searches it is switched on
(``callgrind_control``) for ``--queries`` searches only, so imports and start-up are
not counted. Every thread is counted (the LLM worker's too).

    uv run --frozen --all-extras python benchmarks/instructions.py [--queries 200] [--markdown]

Needs Valgrind (Debian: ``apt-get install valgrind``); says so and exits otherwise.
About 40 s per row.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROWS: list[tuple[str, str, str]] = [
    ("HyDE, sync, timeout=None", "hyde-untimed", "core-hyde"),
    ("HyDE, sync (shipped defaults)", "hyde", "core-hyde"),
    ("HyDE, async (shipped defaults)", "hyde-async", "core-hyde-async"),
    ("HyDE, sync, against the floor", "hyde", "floor"),
    ("HyDE, async, against the floor", "hyde-async", "floor-async"),
    ("cache hit (MemoryCache), against plain search", "hit", "plain-search"),
]


def _search(label: str) -> Callable[[], Any]:
    """One search of configuration ``label`` (run in the child process)."""
    sys.path.insert(0, str(HERE))
    import cache_hits
    import overhead

    from llama_index_hyde_plus import MemoryCache

    if label == "hit":
        return cache_hits.searcher(MemoryCache())
    if label == "plain-search":
        plain = cache_hits.base()
        return lambda: plain.retrieve(cache_hits.QUESTION)
    makers = {
        "hyde": overhead.ours_hyde,
        "hyde-untimed": overhead.ours_hyde_untimed,
        "core-hyde": overhead.core_hyde,
        "floor": overhead.Floor,
    }
    name = label.removesuffix("-async")
    retriever = makers[name]()
    if label.endswith("-async"):
        loop = asyncio.new_event_loop()
        return lambda: loop.run_until_complete(retriever.aretrieve("question 1"))
    return lambda: retriever.retrieve("question 1")


def child(label: str, queries: int) -> None:
    """Warm up, say ready, wait for the go (a line on stdin: blocked in a read, no
    instruction counted), search ``queries`` times, say done, wait to be let go."""
    logging.getLogger("llama_index_hyde_plus").setLevel(logging.ERROR)
    search = _search(label)
    for _ in range(20):
        search()
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(queries):
        search()
    print("done", flush=True)
    sys.stdin.readline()


def count(label: str, queries: int, folder: Path) -> float:
    """Instructions per search of ``label``, from one callgrind run."""
    out = folder / f"callgrind.{label}"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            label,
            "--queries",
            str(queries),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def expect(word: str) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != word:
            proc.kill()
            raise RuntimeError(f"{label}: expected {word!r}, got {line!r}")

    def instrument(state: str) -> None:
        subprocess.run(
            ["callgrind_control", "-i", state, str(proc.pid)], check=True, capture_output=True
        )
        time.sleep(1)  # taken up before the child runs again

    expect("ready")
    instrument("on")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    expect("done")
    instrument("off")
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    _, err = proc.communicate(timeout=120)
    found = re.search(r"Collected : (\d+)", err)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"{label}: callgrind failed:\n{err[-2000:]}")
    return int(found.group(1)) / queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.queries)
        return
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("needs valgrind and callgrind_control (Debian: apt-get install valgrind)")
    cache: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, ours, other in ROWS:
            for label in (ours, other):
                if label not in cache:
                    cache[label] = count(label, args.queries, Path(tmp))
                    print(f"  {label}: {cache[label]:,.0f} instructions a search", flush=True)
            rows.append((name, cache[ours], cache[other], cache[other] / cache[ours]))
    head = ("search", "hyde-plus", "other", "other / ours")
    if args.markdown:
        print(f"| {' | '.join(head)} |\n| --- | ---: | ---: | ---: |")
        for name, mine, theirs, ratio in rows:
            print(f"| {name} | {mine:,.0f} | {theirs:,.0f} | {ratio:.2f}x |")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Instructions per search (callgrind; the other side: built-in or floor)")
    for col in head:
        table.add_column(col, justify="left" if col == "search" else "right")
    for name, mine, theirs, ratio in rows:
        table.add_row(name, f"{mine:,.0f}", f"{theirs:,.0f}", f"{ratio:.2f}x")
    Console(width=80).print(table)


if __name__ == "__main__":
    main()
