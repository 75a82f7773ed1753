"""Caches: one that cannot be created degrades instead of raising, only complete
generations are cached or shared, the key covers every option and LLM setting that
changes a generation, and the in-process caches are bounded by bytes."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import subprocess
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, TextNode
from pydantic import Field

from llama_index_hyde_plus import (
    Decompose,
    HyDE,
    MemoryCache,
    MultiQuery,
    Rewrite,
    SQLiteCache,
    StepBack,
    TransformRetriever,
)
from llama_index_hyde_plus.calls.reliability import NO_RETRY
from llama_index_hyde_plus.search.vectors import DocVectors, Embedder
from llama_index_hyde_plus.stores.row_keys import key_of
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever
from llama_index_hyde_plus.transforms.base import TransformResult
from llama_index_hyde_plus.transforms.registry import BUILTINS, Entry

Q = "Why did revenue drop?"
MiB = 1 << 20
LISTS = (MultiQuery, StepBack, Decompose, Rewrite)


async def _run(transform: Any, use_async: bool, query: str = Q) -> TransformResult:
    result: TransformResult = (
        await transform.atransform(query) if use_async else transform.transform(query)
    )
    return result


def _big_result(i: int, size: int = MiB) -> TransformResult:
    query = f"{i} " + "x" * size
    return TransformResult(query=query, method="hyde", queries=(query,), hypothetical=("p",))


# -- 5: a cache whose folder cannot be made never fails a search ------------------------
def _blocked_path(tmp_path: Path, how: str) -> Path:
    """A cache path whose folder cannot be created: a file where a folder must be
    (fails as root too), or a folder inside a read-only one."""
    if how == "file-in-the-way":
        (tmp_path / "blocker").write_text("not a folder")
        return tmp_path / "blocker" / "sub" / "cache.sqlite"
    if how == "file-as-parent":
        (tmp_path / "blocker").write_text("not a folder")
        return tmp_path / "blocker" / "cache.sqlite"
    if os.geteuid() == 0:
        pytest.skip("root ignores file modes (the file-in-the-way cases cover root)")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / "sub" / "cache.sqlite"


@pytest.fixture
def restore_modes(tmp_path: Path) -> Any:
    yield
    ro = tmp_path / "ro"
    if ro.exists():
        ro.chmod(0o755)


@pytest.mark.parametrize("how", ["file-in-the-way", "file-as-parent", "read-only-folder"])
def test_a_cache_whose_folder_cannot_be_created_is_skipped_with_one_warning(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture, restore_modes: Any
) -> None:
    path = _blocked_path(tmp_path, how)
    with caplog.at_level(logging.DEBUG, logger="llama_index_hyde_plus.caching.cache"):
        cache = SQLiteCache(path)
        assert cache.get("k") is None
        cache.set("k", {"x": 1})
        assert cache.get("k") is None
        assert len(cache) == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_search_with_an_uncreatable_cache_still_generates(
    tmp_path: Path, use_async: bool
) -> None:
    cache = SQLiteCache(_blocked_path(tmp_path, "file-in-the-way"))
    llm = ScriptedLLM(["A passage.", "Another passage."], forbid_sync=use_async)
    hyde = HyDE(llm, cache=cache)
    first = await _run(hyde, use_async)
    second = await _run(hyde, use_async)
    assert first.hypothetical == ("A passage.",) and not first.fallback
    assert second.hypothetical == ("Another passage.",) and not second.cached


# -- 6: only complete generations are cached or shared -----------------------------------
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_partly_failed_generation_is_not_cached(use_async: bool) -> None:
    replies: list[Any] = ["First one.", RuntimeError("down"), "Third one."]
    llm = ScriptedLLM([*replies, "Fresh one.", "Fresh two.", "Fresh three."], forbid_sync=use_async)
    hyde = HyDE(llm, num_passages=3, cache=MemoryCache())
    partial = await _run(hyde, use_async)
    assert partial.error and not partial.fallback and len(partial.hypothetical) == 2
    again = await _run(hyde, use_async)
    assert not again.cached and again.error is None and len(again.hypothetical) == 3
    assert len(llm.prompts) == 6
    hit = await _run(hyde, use_async)
    assert hit.cached and hit.hypothetical == again.hypothetical and hit.error is None


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("swap_to", ["none", "another"])
@pytest.mark.parametrize("first", ["memory", "sqlite"])
async def test_a_cache_replaced_during_a_generation_leaves_that_call_on_the_cache_it_read(
    tmp_path: Path, first: str, swap_to: str, use_async: bool
) -> None:
    read_from: Any = MemoryCache() if first == "memory" else SQLiteCache(tmp_path / "c.sqlite")
    other = None if swap_to == "none" else MemoryCache()

    def reply(prompt: str) -> str:
        hyde.cache = other  # replaced while this call's generation runs
        return "Revenue fell as prices rose."

    hyde = HyDE(ScriptedLLM([reply], forbid_sync=use_async), cache=read_from)
    result = await _run(hyde, use_async)
    assert not result.fallback and result.hypothetical == ("Revenue fell as prices rose.",)
    assert read_from.get(hyde.cache_key_for(Q)) is not None  # written where it was read
    assert other is None or len(other) == 0


def test_a_partly_failed_generation_is_not_written_to_sqlite(tmp_path: Path) -> None:
    llm = ScriptedLLM(["First one.", RuntimeError("down"), "Fresh one.", "Fresh two."])
    path = tmp_path / "c.sqlite"
    assert HyDE(llm, num_passages=2, cache=SQLiteCache(path)).transform(Q).error
    assert len(SQLiteCache(path)) == 0
    assert HyDE(llm, num_passages=2, cache=SQLiteCache(path)).transform(Q).error is None
    assert len(SQLiteCache(path)) == 1


async def test_a_partly_failed_generation_is_never_a_hit_for_waiters() -> None:
    """A waiter shares the leader's partial result as its own failure (it does not ask
    the provider again), never as a cached hit; the next request, once
    the leader is done, asks the provider afresh."""
    replies: list[Any] = ["First one.", RuntimeError("down"), "Fresh one.", "Fresh two."]
    llm = ScriptedLLM(replies, delay=0.05, forbid_sync=True)
    hyde = HyDE(llm, num_passages=2, cache=MemoryCache())
    leader, waiter = await asyncio.gather(hyde.atransform(Q), hyde.atransform(Q))
    assert leader.error and len(leader.hypothetical) == 1
    assert waiter.error == leader.error and not waiter.cached and waiter.usage.calls == 0
    assert len(llm.prompts) == 2
    later = await hyde.atransform(Q)
    assert later.error is None and not later.cached and len(later.hypothetical) == 2


# -- 7: the key holds every option and LLM setting that changes a generation --------------
class SettingsLLM(ScriptedLLM):
    """A scripted LLM with the generation and transport settings providers have."""

    temperature: float = Field(default=0.0)
    max_tokens: int | None = Field(default=None)
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)
    context_window: int = Field(default=4096)
    api_key: str = Field(default="sk-one")
    api_base: str = Field(default="https://one.example/v1")
    timeout: float = Field(default=60.0)
    max_retries: int = Field(default=3)
    default_headers: dict[str, str] = Field(default_factory=dict)


def _key(llm: Any, cls: type = HyDE, **options: Any) -> str:
    key: str = cls(llm, **options).cache_key_for(Q)
    return key


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 1.5},
        {"max_tokens": 64},
        {"additional_kwargs": {"top_p": 0.5}},
        {"additional_kwargs": {"seed": 7}},
        {"additional_kwargs": {"seed": np.int64(7)}},
        {"additional_kwargs": {"stop": ("\n",)}},
    ],
)
def test_llms_differing_in_a_generation_setting_get_different_keys(change: dict) -> None:
    assert _key(SettingsLLM()) != _key(SettingsLLM(**change))


@pytest.mark.parametrize(
    "change",
    [
        {"api_key": "sk-two"},
        {"timeout": 5.0},
        {"max_retries": 0},
        {"context_window": 128_000},
        {"default_headers": {"Authorization": "Bearer x"}},
    ],
)
def test_secrets_and_transport_settings_leave_the_key_alone(change: dict) -> None:
    assert _key(SettingsLLM()) == _key(SettingsLLM(**change))


def test_a_fresh_llm_with_the_same_settings_gets_the_same_key() -> None:
    settings = {"temperature": 0.3, "max_tokens": 99, "additional_kwargs": {"top_p": 0.9}}
    assert _key(SettingsLLM(**settings)) == _key(SettingsLLM(**settings))


def test_openais_generation_settings_are_in_the_key_and_its_key_is_not() -> None:
    from llama_index.llms.openai import OpenAI

    def key(**kw: Any) -> str:
        return _key(OpenAI(**{"model": "gpt-4o-mini", "api_key": "sk-a", **kw}))

    base = key()
    assert key(temperature=1.5) != base and key(max_tokens=50) != base
    assert key(additional_kwargs={"top_p": 0.1}) != base
    assert key(api_key="sk-b") == base == key(timeout=3.0, max_retries=0)
    # another endpoint may serve other weights under the same name
    assert key(api_base="http://localhost:1/v1") != base


_KEY_IN_A_SUBPROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.test_cache_guarantees import SettingsLLM
from llama_index_hyde_plus import HyDE, MultiQuery
llm = SettingsLLM(temperature=0.4, additional_kwargs={"top_p": 0.5})
print(HyDE(llm).cache_key_for("q"), MultiQuery(llm).cache_key_for("q"))
"""


@pytest.mark.slow  # a fresh interpreter
def test_the_key_is_the_same_in_another_process() -> None:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", _KEY_IN_A_SUBPROCESS, root],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    llm = SettingsLLM(temperature=0.4, additional_kwargs={"top_p": 0.5})
    assert out == [HyDE(llm).cache_key_for("q"), MultiQuery(llm).cache_key_for("q")]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_hot_model_is_not_served_a_cold_models_passage(use_async: bool) -> None:
    cache = MemoryCache()
    cold = SettingsLLM(["Cold passage."], temperature=0.0, forbid_sync=use_async)
    hot = SettingsLLM(["Hot passage."], temperature=1.5, forbid_sync=use_async)
    await _run(HyDE(cold, cache=cache), use_async)
    served = await _run(HyDE(hot, cache=cache), use_async)
    assert not served.cached and served.hypothetical == ("Hot passage.",)


@pytest.mark.parametrize("cls", LISTS)
def test_every_max_characters_change_misses(cls: type) -> None:
    llm = ScriptedLLM()
    keys = {_key(llm, cls, max_characters=m) for m in (10, 11, 200, 2000)}
    assert len(keys) == 4


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("cls", LISTS)
async def test_a_query_trimmed_for_a_small_limit_is_not_served_to_a_larger_one(
    cls: type, use_async: bool
) -> None:
    long = "what were the main reasons enterprise renewals slipped in the last quarter"
    reply = f"1. {long}" if cls.DEFAULT_N else long
    llm = ScriptedLLM([reply, reply], forbid_sync=use_async)
    cache = MemoryCache()
    short = await _run(cls(llm, cache=cache, max_characters=20), use_async)
    assert all(len(q) <= 20 for q in short.queries)
    full = await _run(cls(llm, cache=cache, max_characters=500), use_async)
    assert not full.cached and long in full.queries


def _generation_options(entry: Entry) -> set[str]:
    from llama_index_hyde_plus.transforms.llm_base import NOT_GENERATION_OPTIONS

    search = entry.cls.SEARCH_OPTIONS  # type: ignore[attr-defined]
    return set(entry.option_names()) - NOT_GENERATION_OPTIONS - search


LLM_ENTRIES = [e for e in BUILTINS if e.uses_llm]


@pytest.mark.parametrize("entry", LLM_ENTRIES, ids=[e.method for e in LLM_ENTRIES])
def test_every_option_but_the_declared_search_ones_is_in_the_key(entry: Entry) -> None:
    cls: Any = entry.cls
    params = cls(ScriptedLLM())._params()
    assert _generation_options(entry) == set(params) - {"parse_excludes_query"}
    assert not (cls.SEARCH_OPTIONS & set(params))
    assert set(entry.option_names()) >= cls.SEARCH_OPTIONS
    json.dumps(params)  # JSON only: no repr of an object in the key


@pytest.mark.parametrize("entry", LLM_ENTRIES, ids=[e.method for e in LLM_ENTRIES])
def test_the_tune_grid_sweeps_only_search_options(entry: Entry) -> None:
    # a sweep reuses one generation per question only if its options are not in the key
    cls: Any = entry.cls
    swept = {name for config in entry.grid for name in config}
    assert swept <= cls.SEARCH_OPTIONS
    keys = {cls(ScriptedLLM(), **config).cache_key_for(Q) for config in entry.grid}
    assert len(keys) == 1


# -- 10, in a transform: a kept result costs its question, once -------------------------
@pytest.mark.slow  # tens of MB
async def test_hyde_results_of_one_mb_questions_are_kept_without_their_searches() -> None:
    llm = ScriptedLLM(respond=lambda p: "A passage about revenue.")
    cache = MemoryCache(max_bytes=16 * MiB)
    hyde = HyDE(llm, cache=cache)
    questions = [f"{i} " + "why " * (MiB // 4) for i in range(40)]
    for question in questions:
        await hyde.atransform(question)
    # each result holds a 1 MB question and (HyDE) a keyword text repeating it: stored
    # without the searches (rebuilt on a hit), at most the budget is kept
    assert 12 <= len(cache) <= 16
    hit = await hyde.atransform(questions[-1])
    assert hit.cached and hit.specs and hit.specs[0].text.startswith(questions[-1])


# -- 10: the in-process caches are bounded by bytes ---------------------------------------
def test_memory_cache_evicts_the_least_recent_entries_to_stay_under_its_byte_budget() -> None:
    cache = MemoryCache(max_bytes=int(3.5 * MiB))
    for i in range(3):
        cache.set(str(i), _big_result(i))
    assert len(cache) == 3
    assert cache.get("0") is not None  # 0 is now the most recent
    cache.set("3", _big_result(3))
    assert cache.get("1") is None and len(cache) == 3
    assert cache.get("0") is not None and cache.get("3") is not None
    assert cache.max_bytes == int(3.5 * MiB) and cache.max_entries == 1024


def test_an_entry_bigger_than_the_whole_budget_is_not_stored() -> None:
    cache = MemoryCache(max_bytes=MiB)
    cache.set("small", _big_result(0, 1000))
    cache.set("huge", _big_result(1, 2 * MiB))
    assert cache.get("huge") is None and cache.get("small") is not None
    cache.set("small", _big_result(2, 2 * MiB))  # a replacement too big drops the old one
    assert cache.get("small") is None and len(cache) == 0


def test_a_results_children_count_towards_its_size() -> None:
    child = _big_result(0)
    parent = TransformResult(query="q", method="chain", queries=("q",), children=(child,) * 3)
    cache = MemoryCache(max_bytes=int(1.5 * MiB))
    cache.set("parent", parent)
    cache.set("other", _big_result(1, 1000))
    assert cache.get("other") is not None
    cache.set("second", parent)
    assert cache.get("parent") is None  # the child's 1 MB counted (once: it is shared)


@pytest.mark.slow  # 100 MB
def test_memory_cache_keeps_at_most_its_budget_of_100_one_mb_results() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = MemoryCache(max_bytes=8 * MiB)
        for i in range(100):
            cache.set(f"k{i}", _big_result(i))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 9 * MiB and 5 <= len(cache) <= 8


def test_the_default_budget_is_64_mib() -> None:
    assert MemoryCache().max_bytes == 64 * MiB


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1"])
def test_a_bad_byte_budget_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        MemoryCache(max_bytes=bad)
    with pytest.raises(ValueError, match="max_bytes"):
        Embedder(CountingEmbedding(), max_bytes=bad)


class CountingEmbedding(BaseEmbedding):
    """1536-d vectors, float32 values (as real models return), counting calls."""

    dim: int = 1536
    calls: int = 0
    exact32: bool = True

    def vector(self, text: str) -> list[float]:
        rng = np.random.default_rng(abs(hash(text)) % (2**32))
        v = rng.standard_normal(self.dim)
        return (v.astype(np.float32) if self.exact32 else v).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        self.calls += 1
        return self.vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        self.calls += 1
        return self.vector(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


@pytest.mark.parametrize("exact32", [True, False])
def test_embedder_hits_return_exactly_what_the_model_returned(exact32: bool) -> None:
    model = CountingEmbedding(exact32=exact32)
    embedder = Embedder(model)
    first = embedder.query("q one")
    assert isinstance(first, list) and first == model.vector("q one")
    hit = embedder.query("q one")
    assert hit == model.vector("q one") and model.calls == 1
    hit[0] = 99.0  # the caller's copy: the cache is not changed
    assert embedder.query("q one") == model.vector("q one")
    texts = embedder.texts(["a", "b", "a"])
    assert texts == [model.vector("a"), model.vector("b"), model.vector("a")]
    assert embedder.texts(["b"]) == [model.vector("b")] and model.calls == 3


def test_embedder_stores_float32_vectors_when_that_loses_nothing() -> None:
    embedder = Embedder(CountingEmbedding(exact32=True))
    embedder.query("q")
    stored = embedder._cache._lru.get(("q", "q"))
    assert stored.dtype == np.float32 and stored.flags.c_contiguous
    wide = Embedder(CountingEmbedding(exact32=False))
    wide.query("q")
    assert wide._cache._lru.get(("q", "q")).dtype == np.float64


@pytest.mark.parametrize("use_async", [False, True])
async def test_embedder_budget_counts_the_texts_it_is_keyed_by(use_async: bool) -> None:
    model = CountingEmbedding()
    embedder = Embedder(model, max_bytes=4 * MiB)
    texts = [f"{i} " + "y" * MiB for i in range(8)]
    for text in texts:
        await embedder.aquery(text) if use_async else embedder.query(text)
    assert model.calls == 8
    for text in texts[-3:]:  # the most recent three fit in 4 MiB
        await embedder.aquery(text) if use_async else embedder.query(text)
    assert model.calls == 8
    await embedder.aquery(texts[0]) if use_async else embedder.query(texts[0])
    assert model.calls == 9


def test_a_vector_the_model_got_wrong_is_returned_but_not_cached() -> None:
    class NaNEmbedding(CountingEmbedding):
        def vector(self, text: str) -> list[float]:
            return [float("nan"), 1.0]

    model = NaNEmbedding()
    embedder = Embedder(model)
    assert np.isnan(embedder.query("q")[0])
    embedder.query("q")
    assert model.calls == 2


class MilvusVectorStore:
    """Stands in for a collection ``hyde-plus index`` built on Milvus (DocVectors
    matches the class by name): rows of nodes ``d-<n>`` under their derived keys, each
    vector drawn from a generator seeded with ``n``."""

    collection_name = "docs"
    embedding_field = "embedding"

    def __init__(self, dim: int, rows: int = 2000) -> None:
        self.client = self
        self.dim = dim
        self.calls = 0
        self.seeds = {key_of(f"d-{j}", f"d-{j}"): j for j in range(rows)}

    def vector(self, seed: int) -> Any:
        return np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)

    def query(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.calls += 1
        keys = re.findall(r'"([^"]*)"', kwargs["filter"])
        return [{"id": k, "embedding": self.vector(self.seeds[k])} for k in keys if k in self.seeds]


def _nodes(start: int, count: int) -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(id_=f"d-{j}", text=""), score=0.0)
        for j in range(start, start + count)
    ]


@pytest.mark.slow  # tens of MB
def test_doc_vectors_keep_float32_vectors_within_their_byte_budget() -> None:
    retriever = StaticRetriever({}, default=[])
    store = MilvusVectorStore(1536)
    retriever._vector_store = store  # type: ignore[attr-defined]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        docs = DocVectors(retriever, None)
        for start in range(0, 2000, 500):
            got = docs.get(_nodes(start, 500))
            assert len(got) == 500 and len(got[0]) == 1536
            del got
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 2,000 x 1536 float32 = 11.7 MiB; as lists of Python floats it was about 95 MiB
    assert kept < 14 * MiB
    calls = store.calls
    assert docs.get(_nodes(0, 10))[3] == store.vector(3).tolist()
    assert store.calls == calls  # a hit: the store was not asked again


def test_doc_vectors_evict_beyond_their_byte_budget() -> None:
    retriever = StaticRetriever({}, default=[])
    store = MilvusVectorStore(256)
    retriever._vector_store = store  # type: ignore[attr-defined]
    docs = DocVectors(retriever, None, max_bytes=100 * 256 * 4)
    docs.get(_nodes(0, 200))
    calls = store.calls
    docs.get(_nodes(150, 50))  # the most recent fit
    assert store.calls == calls
    docs.get(_nodes(0, 1))
    assert store.calls == calls + 1


class _KeepingMemoryCache(MemoryCache):
    keeps_unusable_replies = True

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    def set(self, key: str, value: Any) -> None:
        self.keys.append(key)
        super().set(key, value)


class _KeepingSQLiteCache(SQLiteCache):
    keeps_unusable_replies = True


def _keeping_caches(tmp_path: Path) -> list[Any]:
    return [_KeepingMemoryCache(), _KeepingSQLiteCache(tmp_path / "keeping.sqlite")]


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("kind", [0, 1])
def test_a_cache_that_keeps_unusable_replies_serves_the_same_fallback_again(
    tmp_path: Path, kind: int, use_async: bool
) -> None:
    cache = _keeping_caches(tmp_path)[kind]
    llm = ScriptedLLM(["Sure! Here are some queries:", "1. renewals slipped"])
    base = StaticRetriever({"a": "x", "b": "y"}, results={Q: ["a"], "renewals slipped": ["b"]})
    retriever = TransformRetriever(base, MultiQuery(llm, n=1, cache=cache))

    def search() -> Any:
        return asyncio.run(retriever.asearch(Q)) if use_async else retriever.search(Q)

    first, second = search(), search()
    assert first.transform.fallback and not first.transform.cached
    assert second.transform.fallback and second.transform.cached
    assert second.transform.error == first.transform.error
    assert second.transform.usage.cached and second.transform.generation_usage is not None
    assert [n.node.node_id for n in second.nodes] == [n.node.node_id for n in first.nodes] == ["a"]
    assert len(llm.prompts) == 1  # the unusable reply was not asked for again


@pytest.mark.parametrize("use_async", [False, True])
def test_a_cache_that_keeps_unusable_replies_serves_a_partial_generation_as_it_was(
    tmp_path: Path, use_async: bool
) -> None:
    cache = _KeepingSQLiteCache(tmp_path / "keeping.sqlite")
    llm = ScriptedLLM(["A passage about renewals.", "   ", "Another passage."] * 2)
    hyde = HyDE(llm, num_passages=3, cache=cache, breaker=None)

    def transform() -> TransformResult:
        return asyncio.run(hyde.atransform(Q)) if use_async else hyde.transform(Q)

    first, second = transform(), transform()
    assert not first.fallback and (first.error or "").startswith("UnusableReplyError")
    assert second.cached and second.hypothetical == first.hypothetical
    assert second.error == first.error and len(llm.prompts) == 3


@pytest.mark.parametrize("use_async", [False, True])
def test_a_cache_that_keeps_unusable_replies_never_keeps_a_failed_call(
    tmp_path: Path, use_async: bool
) -> None:
    cache = _KeepingSQLiteCache(tmp_path / "keeping.sqlite")
    llm = ScriptedLLM([ConnectionError("refused"), "1. renewals slipped"])
    mq = MultiQuery(llm, n=1, cache=cache, retry=NO_RETRY, breaker=None)

    def transform() -> TransformResult:
        return asyncio.run(mq.atransform(Q)) if use_async else mq.transform(Q)

    first, second = transform(), transform()
    assert first.fallback and "ConnectionError" in (first.error or "")
    assert not second.fallback and not second.cached and second.queries[-1] == "renewals slipped"


@pytest.mark.parametrize("use_async", [False, True])
def test_other_caches_ask_again_after_an_unusable_reply(tmp_path: Path, use_async: bool) -> None:
    for cache in (MemoryCache(), SQLiteCache(tmp_path / f"plain-{use_async}.sqlite")):
        llm = ScriptedLLM(["Sure! Here are some queries:", "1. renewals slipped"])
        mq = MultiQuery(llm, n=1, cache=cache)
        first, second = [
            asyncio.run(mq.atransform(Q)) if use_async else mq.transform(Q) for _ in range(2)
        ]
        assert first.fallback and not second.fallback and len(llm.prompts) == 2


def test_a_kept_unusable_reply_serves_only_its_own_question_and_method(tmp_path: Path) -> None:
    cache = _KeepingMemoryCache()
    llm = ScriptedLLM(respond=lambda p: "Sure! Here are some queries:")
    MultiQuery(llm, n=1, cache=cache).transform(Q)
    key = cache.keys[0]  # the one entry, stored again as another question's or method's
    stored = cache.get(key)
    others = [replace(stored, query="Another question?"), replace(stored, method="x")]
    for asked, other in enumerate(others, start=2):
        cache.set(key, other)
        again = MultiQuery(llm, n=1, cache=cache).transform(Q)
        assert not again.cached and len(llm.prompts) == asked


@pytest.mark.parametrize("use_async", [False, True])
def test_a_failed_call_beside_unusable_replies_is_reported_and_never_kept(
    tmp_path: Path, use_async: bool
) -> None:
    cache = _KeepingSQLiteCache(tmp_path / "keeping.sqlite")
    llm = ScriptedLLM([RuntimeError("boom"), "Passage:", "Passage:", "A passage.", "B.", "C."])
    hyde = HyDE(llm, num_passages=3, cache=cache, breaker=None, retry=NO_RETRY)

    def transform() -> TransformResult:
        return asyncio.run(hyde.atransform(Q)) if use_async else hyde.transform(Q)

    first, second = transform(), transform()
    assert first.fallback and (first.error or "").startswith("RuntimeError: boom")
    assert not second.cached and not second.fallback and len(llm.prompts) == 6


def test_a_kept_fallback_holding_anything_to_search_is_never_served(tmp_path: Path) -> None:
    cache = _KeepingMemoryCache()
    llm = ScriptedLLM(respond=lambda p: "Sure! Here are some queries:")
    MultiQuery(llm, n=1, cache=cache).transform(Q)
    key, stored = cache.keys[0], cache.get(cache.keys[0])
    child = replace(stored, query="zzz", fallback=False, error=None, queries=("zzz",))
    forged = [
        replace(stored, queries=("evil",)),
        replace(stored, hypothetical=("evil",)),
        replace(stored, children=(child,)),
        replace(stored, fallback=False),  # "partial" with nothing generated
    ]
    for asked, entry in enumerate(forged, start=2):
        cache.set(key, entry)
        again = MultiQuery(llm, n=1, cache=cache).transform(Q)
        assert not again.cached and len(llm.prompts) == asked
