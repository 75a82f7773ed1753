"""Load test of ``hyde-plus serve --http`` with the official ``rcp`` client.

Starts the server as a separate process on loopback with the scripted LLM (so the
numbers measure the server, not a model), then sends ``--requests`` ``query/transform``
calls (every method in turn, every query distinct, so each is a real transform and
not a cache hit) from ``--concurrency`` client threads. Prints throughput, latency
percentiles, the error count, and the server's resident memory as the run goes.

``--baseline DIR`` also runs the same load, in the same sitting, against the server of
another source tree (e.g. ``git archive 0c4cbdc | tar -x -C /tmp/old``), alternating the two
``--rounds`` times, and prints both side by side: on a noisy machine only numbers taken
together compare.

    uv run --frozen python benchmarks/rcp_load.py --requests 10000 --concurrency 32
    uv run --frozen python benchmarks/rcp_load.py --baseline /tmp/old --rounds 2
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import rcp
from rich.console import Console
from rich.table import Table

METHODS = ["hyde", "multi-query", "step-back", "decompose", "rewrite"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited during start-up")
        try:
            rcp.connect_http(url).ping()
            return
        except rcp.RcpError:
            time.sleep(0.2)
    raise TimeoutError("server did not start")


def run(args: argparse.Namespace, source: Path | None) -> tuple[list[tuple[str, str]], list[str]]:
    """One load test against the server of ``source`` (None: this tree); the table
    rows and the errors."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/rcp"
    cmd = [
        sys.executable,
        "-m",
        "llama_index_hyde_plus.cli",
        "serve",
        "--http",
        str(port),
        "--llm",
        f"scripted:{args.llm_delay_ms:g}",
    ]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=str(source) if source is not None else None,
    )
    try:
        wait_ready(url, proc)
        rss_start = rss_mb(proc.pid)
        memory: list[tuple[int, float]] = [(0, rss_start)]
        latencies: list[float] = []
        errors: list[str] = []
        done = 0
        lock = threading.Lock()
        counter = iter(range(args.requests))

        def worker() -> None:
            nonlocal done
            client = rcp.connect_http(url)
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                start = time.perf_counter()
                try:
                    result = client.call(
                        "query/transform",
                        {
                            "query": f"load test question number {i}",
                            "method": METHODS[i % len(METHODS)],
                            "n": 3,
                        },
                    )
                    if not result.get("queries"):
                        raise RuntimeError("empty result")
                except Exception as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                finally:
                    elapsed = time.perf_counter() - start
                    with lock:
                        latencies.append(elapsed)
                        done += 1
                        if done % max(args.requests // 4, 1) == 0:
                            memory.append((done, rss_mb(proc.pid)))

        wall = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - wall
        rss_end = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    cuts = statistics.quantiles(latencies, n=100)
    rows = [
        ("requests", f"{len(latencies):,}"),
        ("concurrency", str(args.concurrency)),
        ("errors", str(len(errors))),
        ("throughput", f"{len(latencies) / wall:,.0f} req/s"),
        ("latency p50", f"{cuts[49] * 1000:.1f} ms"),
        ("latency p99", f"{cuts[98] * 1000:.1f} ms"),
        ("server RSS before", f"{rss_start:.1f} MB"),
        ("server RSS after", f"{rss_end:.1f} MB"),
        ("server RSS by requests done", ", ".join(f"{n:,}: {mb:.0f} MB" for n, mb in memory)),
    ]
    return rows, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--llm-delay-ms", type=float, default=0.0)
    parser.add_argument(
        "--baseline", type=Path, help="source tree of a server to compare with, same sitting"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each server (alternated)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.requests < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--requests, --concurrency and --rounds must be >= 1")
    if args.baseline is not None and not (args.baseline / "llama_index_hyde_plus").is_dir():
        parser.error(f"--baseline {args.baseline} holds no llama_index_hyde_plus package")

    sources: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline is not None:
        sources.insert(0, (f"baseline ({args.baseline})", args.baseline))
    columns: list[tuple[str, list[tuple[str, str]]]] = []
    errors: list[str] = []
    for round_ in range(args.rounds):
        for label, source in sources:
            rows, errs = run(args, source)
            suffix = f" #{round_ + 1}" if args.rounds > 1 else ""
            columns.append((label + suffix, rows))
            errors += errs
            print(f"done: {label}{suffix}", file=sys.stderr)

    names = [name for name, _ in columns[0][1]]
    if args.markdown:
        print("| measure | " + " | ".join(label for label, _ in columns) + " |")
        print("| --- |" + " ---: |" * len(columns))
        for i, name in enumerate(names):
            print(f"| {name} | " + " | ".join(rows[i][1] for _, rows in columns) + " |")
    else:
        table = Table(title=f"RCP load test (scripted LLM, {args.llm_delay_ms:g} ms)")
        table.add_column("measure")
        for label, _ in columns:
            table.add_column(label, justify="right")
        for i, name in enumerate(names):
            table.add_row(name, *(rows[i][1] for _, rows in columns))
        Console().print(table)
    if errors:
        print("first errors:", *errors[:5], sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
