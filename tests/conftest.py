from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faiss
import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.core.vector_stores.types import VectorStoreQuery
from llama_index.vector_stores.faiss import FaissVectorStore

from llama_index_hyde_plus.testing import DeterministicEmbedding

if TYPE_CHECKING:  # not imported for every test module: some check what loads lazily
    from llama_index.core.base.base_retriever import BaseRetriever

    from llama_index_hyde_plus.search.retriever import SearchResult, TransformRetriever

DOCS = {
    "renewals": "Enterprise renewals slipped last quarter as three large accounts delayed signing.",
    "hiring": "The company hired forty engineers for the new platform team in Berlin.",
    "office": "The Lisbon office moved to a larger building near the river in March.",
    "pto": "Employees receive twenty five days of paid time off each year.",
    "security": "All laptops must use full disk encryption and a hardware security key.",
    "pricing": "List prices for the analytics add-on rise by five percent in January.",
    "lunch": "Revenue team members can drop by the Friday lunch in the main kitchen.",
}

Q = "Why did revenue drop?"
"""The question the guard tests ask of `DOCS` (its best match: "renewals")."""
P1 = "Revenue dropped because enterprise renewals slipped last quarter."
"""A passage answering `Q` (with DeterministicEmbedding: cosine(Q, P1) = 0.25)."""


def ids(nodes: list[NodeWithScore]) -> list[str]:
    """The node ids of ``nodes``, in order."""
    return [n.node.node_id for n in nodes]


def sync_within(call: Callable[[], Any], limit: float) -> tuple[Any, float]:
    """``call()``'s result and seconds, run on a daemon thread so that a test fails
    (rather than hangs) when it takes over ``limit`` seconds."""
    out: list[Any] = []
    start = time.perf_counter()
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(limit)
    assert out, f"the search was still running after {limit:g}s"
    return out[0], time.perf_counter() - start


async def search(retriever: TransformRetriever, query: str, use_async: bool) -> SearchResult:
    """``retriever``'s search of ``query`` on the async path or the sync one."""
    return await retriever.asearch(query) if use_async else retriever.search(query)


def says(output: str, text: str) -> bool:
    """Whether ``output`` holds ``text`` however the terminal wrapped it: a long path
    (a test's temporary folder) may break anywhere, so both are compared without
    whitespace."""
    return "".join(text.split()) in "".join(output.split())


def team_docs(folder: Path) -> Path:
    """``folder/docs``: 12 one-line documents, ``Team N owns service 7N.``, the corpus
    the question-writing tests' scripted models read their team from."""
    docs = folder / "docs"
    docs.mkdir()
    for team in range(1, 13):
        (docs / f"t{team}.txt").write_text(f"Team {team} owns service {team * 7}.")
    return docs


@pytest.fixture
def embed_model() -> DeterministicEmbedding:
    return DeterministicEmbedding(dim=256)


@pytest.fixture
def faiss_index(embed_model: DeterministicEmbedding) -> VectorStoreIndex:
    """A real FAISS (inner product) index over DOCS with the deterministic embedding."""
    store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(embed_model.dim))
    nodes = [TextNode(id_=nid, text=text) for nid, text in DOCS.items()]
    return VectorStoreIndex(
        nodes,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embed_model,
    )


@pytest.fixture
def top3(
    faiss_index: VectorStoreIndex, spy_queries: list[VectorStoreQuery]
) -> tuple[BaseRetriever, list[str]]:
    """``(retriever, ids)``: a top-3 retriever of `faiss_index` and its plain hits for
    `Q`; `spy_queries` is cleared after, so it holds only the searches under test."""
    base = faiss_index.as_retriever(similarity_top_k=3)
    plain = ids(base.retrieve(Q))
    spy_queries.clear()
    return base, plain


@pytest.fixture(scope="session")
def real_embedding():  # type: ignore[no-untyped-def]
    """The real local embedding model (fetched once into the user cache)."""
    from llama_index_hyde_plus.local import local_embedding

    return local_embedding()


@pytest.fixture(scope="session")
def real_llm():  # type: ignore[no-untyped-def]
    """The real local LLM, seeded so runs repeat."""
    from llama_index_hyde_plus.local import local_llm

    return local_llm(seed=0, temperature=0.7, max_tokens=100, n_parallel=4)


@pytest.fixture
def spy_queries(monkeypatch: pytest.MonkeyPatch) -> list[VectorStoreQuery]:
    """Every query the FAISS store receives (the vector a search really sent)."""
    seen: list[VectorStoreQuery] = []
    original = FaissVectorStore.query

    def query(self: FaissVectorStore, query: VectorStoreQuery, **kwargs: object):  # type: ignore[no-untyped-def]
        seen.append(query)
        return original(self, query, **kwargs)

    monkeypatch.setattr(FaissVectorStore, "query", query)
    return seen


class Served:
    """``hyde-plus serve --http 0`` in a subprocess; the URL from its banner."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_index_hyde_plus.cli", "serve", "--http", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert self.proc.stderr is not None
        banner = ""
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            banner += line
            match = re.search(r"RCP server on (\S+/rcp)", banner)
            if match:
                self.url = match.group(1)
                self.banner = banner
                self._lines: list[str] = []
                self._pump = threading.Thread(target=self._read_stderr, daemon=True)
                self._pump.start()
                return
        self.proc.kill()
        raise AssertionError(f"server did not start: {banner}")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._lines.append(line)

    def output(self) -> str:
        """What the server has written to stderr so far, its banner first."""
        return self.banner + "".join(self._lines)

    def stop(self) -> str:
        """Stop the server; everything it wrote to stderr."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # pragma: no cover - reported below
            self.proc.kill()
            self.proc.wait()
        self._pump.join(15)
        return self.output()


class LoopTicks:
    """``async with LoopTicks() as loop:`` counts how often the event loop ran a 10 ms
    sleeper while the block ran (``loop.ticks``). A block that blocks the loop leaves
    it at 0 or 1; a loaded 2-core machine may slow the loop, so assert a small number
    (`LoopTicks.FREE`), never one derived from the wall time."""

    FREE = 3
    """At least this many ticks means the loop kept running."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def __aenter__(self) -> LoopTicks:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)  # let the ticker start before the block runs
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


SLOW_MODULES = frozenset(
    {
        "test_cli",  # the CLI end to end, with the local embedder
        "test_cli_fast",  # fresh interpreters for --help and argument errors
        "test_cli_tune",
        "test_cli_usability",
        "test_docs_examples",  # every documentation page's code
        "test_examples",
        "test_indexing",  # builds killed in subprocesses
        "test_kv_cache",  # a real Redis server
        "test_milvus",  # Milvus Lite
        "test_question_set_writers",  # processes writing one question set at once
        "test_rcp_http",  # servers on loopback
        "test_rcp_l2",
        "test_rcp_sessions",
        "test_readme",
        "test_reuse_index",
    }
)
"""Test modules outside the fast tier (``pytest -m "not slow and not local"``, see
CONTRIBUTING.md): they start servers, subprocesses, Milvus Lite or the local models (a
slow test of another module carries ``@pytest.mark.slow``)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        # Under ``-n 2`` (pyproject's addopts) the tests that keep a core busy (the local
        # models, subprocesses, servers) run one at a time on one worker, beside the
        # others, which mostly wait on timeouts; never two local models at once.
        if item.get_closest_marker("slow") or item.get_closest_marker("local"):
            item.add_marker(pytest.mark.xdist_group("busy"))
