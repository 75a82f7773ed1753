from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llama_index_hyde_plus import HyDE, MemoryCache, MultiQuery, SQLiteCache
from llama_index_hyde_plus.caching.cache import cache_key
from llama_index_hyde_plus.testing import ScriptedLLM

Q = "Why did revenue drop?"


def test_memory_cache_evicts_least_recently_used() -> None:
    cache = MemoryCache(max_entries=2)
    cache.set("a", {"v": 1})
    cache.set("b", {"v": 2})
    assert cache.get("a") == {"v": 1}  # a is now most recent
    cache.set("c", {"v": 3})
    assert cache.get("b") is None and cache.get("a") and cache.get("c") and len(cache) == 2


def test_memory_cache_is_thread_safe() -> None:
    cache = MemoryCache(max_entries=50)

    def work(i: int) -> None:
        for j in range(200):
            cache.set(f"{i}-{j}", {"j": j})
            cache.get(f"{i}-{j - 1}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50


def test_sqlite_cache_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    SQLiteCache(path).set("k", {"x": [1, 2]})
    assert SQLiteCache(path).get("k") == {"x": [1, 2]}
    assert len(SQLiteCache(path)) == 1


def test_sqlite_cache_ttl_expires_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("llama_index_hyde_plus.caching.cache.time.time", lambda: clock[0])
    cache = SQLiteCache(tmp_path / "c.sqlite", ttl_s=10)
    cache.set("k", {"x": 1})
    clock[0] += 5
    assert cache.get("k") == {"x": 1}
    clock[0] += 6
    assert cache.get("k") is None


def damage(path: Path) -> None:
    """A cache file as a crash or a bad disk leaves it: a SQLite header, garbage after."""
    path.unlink(missing_ok=True)
    cache = SQLiteCache(path)
    cache.set("k", {"x": 0})
    cache.close()  # checkpointed: everything is in the main file
    data = path.read_bytes()
    page = int.from_bytes(data[16:18], "big")
    path.write_bytes(data[:page] + b"\xa5" * (len(data) - page))  # the schema page kept


@pytest.mark.parametrize("content", [b"my notes, not a database" * 100, b"\x00" * 5000, "SQLITE"])
def test_a_file_that_is_not_this_caches_is_left_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes | str
) -> None:
    """A non-SQLite file, or another program's SQLite database, at the cache path is
    someone else's: never moved aside, renamed or written into; the cache is skipped."""
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    path = tmp_path / "transforms.sqlite"
    if content == "SQLITE":
        other = sqlite3.connect(path)
        other.execute("CREATE TABLE contacts (name TEXT)")
        other.commit()
        other.close()
    else:
        path.write_bytes(content)  # type: ignore[arg-type]
    before = path.read_bytes()
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") is None  # skipped, not failed
    cache.close()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transforms.sqlite"]
    assert any("left untouched" in r.getMessage() for r in caplog.records)


def test_corrupted_sqlite_file_is_moved_aside_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    path = tmp_path / "c.sqlite"
    damage(path)
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") == {"x": 1}
    assert list(tmp_path.glob("c.sqlite.corrupt-*"))
    assert any("corrupt" in r.getMessage() for r in caplog.records)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        MemoryCache(max_entries=0)
    with pytest.raises(ValueError, match="ttl_s"):
        SQLiteCache(":memory:", ttl_s=0)
    with pytest.raises(TypeError, match="cache"):
        HyDE(ScriptedLLM(), cache={})  # type: ignore[arg-type]


@pytest.mark.parametrize("make_cache", [lambda p: MemoryCache(), lambda p: SQLiteCache(p / "c")])
def test_a_hit_makes_no_llm_call_and_reports_zero_cost(make_cache, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM(["A passage."], model_name="gpt-4o-mini")
    hyde = HyDE(llm, cache=make_cache(tmp_path))
    first = hyde.transform(Q)
    second = hyde.transform(Q)
    assert len(llm.prompts) == 1
    assert not first.cached and first.usage.calls == 1 and first.usage.cost > 0
    assert second.cached and second.hypothetical == first.hypothetical
    assert second.usage.calls == 0 and second.usage.cost == 0 and second.usage.cached
    assert second.generation_usage == first.usage


async def test_async_hit_on_sqlite_never_calls_sync_llm(tmp_path: Path) -> None:
    cache = SQLiteCache(tmp_path / "c")
    HyDE(ScriptedLLM(["A passage."]), cache=cache).transform(Q)
    llm = ScriptedLLM(forbid_sync=True)
    result = await HyDE(llm, cache=cache).atransform(Q)
    assert result.cached and llm.sync_calls == llm.async_calls == 0


def test_key_covers_method_model_prompt_parameters_and_query() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM(respond=lambda p: "passage.")
    base = HyDE(llm, cache=cache)
    keys = {
        base.cache_key_for(Q),
        base.cache_key_for(Q + "!"),
        HyDE(llm, cache=cache, num_passages=2).cache_key_for(Q),
        HyDE(llm, cache=cache, max_characters=50).cache_key_for(Q),
        HyDE(llm, cache=cache, prompt="Doc: {query}").cache_key_for(Q),
        HyDE(ScriptedLLM(model_name="other"), cache=cache).cache_key_for(Q),
        MultiQuery(llm, cache=cache).cache_key_for(Q),
    }
    assert len(keys) == 7
    assert base.cache_key_for(Q) == HyDE(llm).cache_key_for(Q)
    # include_query changes how HyDE's passages are searched, not the passages
    assert base.cache_key_for(Q) == HyDE(llm, include_query=True).cache_key_for(Q)
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})


def test_a_hyde_hit_takes_the_include_query_of_the_asking_transform() -> None:
    cache = MemoryCache()
    llm = ScriptedLLM(["A passage."])
    HyDE(llm, cache=cache).transform(Q)
    hit = HyDE(llm, cache=cache, include_query=True).transform(Q)
    assert hit.cached and hit.include_query and hit.embedding_strs == ("A passage.", Q)


def test_fallbacks_are_not_cached() -> None:
    llm = ScriptedLLM([RuntimeError("down"), "A passage."])
    hyde = HyDE(llm, cache=MemoryCache())
    assert hyde.transform(Q).fallback
    assert hyde.transform(Q).hypothetical == ("A passage.",)


async def test_identical_concurrent_async_requests_share_one_call() -> None:
    llm = ScriptedLLM(["A passage."], delay=0.1)
    hyde = HyDE(llm, cache=MemoryCache())
    results = await asyncio.gather(*(hyde.atransform(Q) for _ in range(5)))
    assert len(llm.prompts) == 1
    assert sum(not r.cached for r in results) == 1
    assert all(r.hypothetical == ("A passage.",) for r in results)
    assert sum(r.usage.calls for r in results) == 1


def test_identical_concurrent_sync_requests_share_one_call() -> None:
    llm = ScriptedLLM(["A passage."], delay=0.2)
    hyde = HyDE(llm, cache=MemoryCache())
    results = []
    threads = [threading.Thread(target=lambda: results.append(hyde.transform(Q))) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(llm.prompts) == 1 and len(results) == 5
    assert sum(r.cached for r in results) == 4


async def test_a_leaders_provider_failure_is_the_waiters_own_fallback() -> None:
    """A waiter does not call the provider again (2 x timeout when it hangs)."""
    llm = ScriptedLLM([RuntimeError("down"), "p2.", "p3."], delay=0.05)
    hyde = HyDE(llm, cache=MemoryCache())
    results = await asyncio.gather(hyde.atransform(Q), hyde.atransform(Q))
    assert results[0].fallback and results[1].fallback
    assert results[1].error == results[0].error and not results[1].cached
    assert results[1].usage.calls == 0 and len(llm.prompts) == 1


async def test_cancelling_the_leader_cancels_only_it_and_the_follower_goes_alone() -> None:
    llm = ScriptedLLM(["A passage.", "A passage."], delay=0.2)
    hyde = HyDE(llm, cache=MemoryCache())
    leader = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.05)
    follower = asyncio.create_task(hyde.atransform(Q))
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    result = await follower
    assert result.hypothetical == ("A passage.",) and not result.cached


def _run(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)")
conn.execute("INSERT OR REPLACE INTO results VALUES ('k', '{\\"x\\": 1}', 1e12)")
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_cache_locked_by_another_process_is_a_quick_miss_not_corruption(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    path = tmp_path / "c.sqlite"
    holder = _run(HOLD_LOCK, str(path), "30")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        start = time.monotonic()
        cache = SQLiteCache(path, busy_timeout_s=0.2)
        assert cache.get("k") is None
        cache.set("k2", {"y": 2})
        assert time.monotonic() - start < 3
    finally:
        holder.kill()
        holder.wait()
    assert not list(tmp_path.glob("*.corrupt-*"))
    assert any("unavailable" in r.getMessage() for r in caplog.records)
    time.sleep(0.25)  # a failed file is tried again after one busy_timeout_s
    assert cache.get("k") == {"x": 1}  # the lock is gone: the same instance recovers
    cache.set("k2", {"y": 2})
    assert SQLiteCache(path).get("k2") == {"y": 2}


def test_a_read_only_cache_serves_hits_and_skips_writes(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    first = SQLiteCache(path)
    first.set("k", {"x": 1})
    first.close()
    if os.geteuid() == 0:  # root ignores file modes; an immutable file is read-only to root
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("cannot make a read-only file here")
    else:
        path.chmod(0o444)
    try:
        cache = SQLiteCache(path)
        assert cache.get("k") == {"x": 1}
        cache.set("k2", {"y": 2})  # skipped, logged, no exception
        assert cache.get("k2") is None
        assert not list(tmp_path.glob("*.corrupt-*")) and path.exists()
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o644)
    assert SQLiteCache(path).get("k") == {"x": 1}


WORKER = """
import importlib.util, sys, time, types
from pathlib import Path
from typing import Any
# cache.py and the stdlib-only modules it imports, none of the package's __init__
# (which imports LlamaIndex), so the processes start fast and race for real
root = Path(sys.argv[4]).parent.parent
for name, folder in (("", root), (".calls", root / "calls"), (".caching", root / "caching")):
    package = types.ModuleType("llama_index_hyde_plus" + name)
    package.__path__ = [str(folder)]
    sys.modules[package.__name__] = package
spec = importlib.util.spec_from_file_location("llama_index_hyde_plus.caching.cache", sys.argv[4])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
path, me, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
while not go.exists():
    time.sleep(0.001)
cache = mod.SQLiteCache(path, )
for i in range(5):
    cache.set(f"{me}-{i}", {"i": i})
    cache.get(f"{me}-{i}")
print("ok", flush=True)
"""


@pytest.mark.slow  # 40 interpreters
def test_processes_creating_one_cache_at_once_never_move_it_aside(tmp_path: Path) -> None:
    import llama_index_hyde_plus.caching.cache as module

    for round_ in range(5):  # the creation race is timing-dependent: run it a few times
        folder = tmp_path / str(round_)
        folder.mkdir()
        path, go = folder / "shared.sqlite", folder / "go"
        workers = [_run(WORKER, str(path), str(n), str(go), module.__file__) for n in range(8)]
        time.sleep(0.3)  # every interpreter starts and waits at the line
        go.touch()
        for w in workers:
            out, errors = w.communicate(timeout=60)
            assert w.returncode == 0 and out.strip() == "ok", errors
        assert not list(folder.glob("*.corrupt-*")), f"round {round_}"
        assert len(SQLiteCache(path)) == 8 * 5


def test_two_quarantines_in_one_second_keep_both_files(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    for _ in range(2):
        damage(path)
        cache = SQLiteCache(path)
        cache.set("k", {"x": 1})
        cache.close()
    assert len(list(tmp_path.glob("c.sqlite.corrupt-*"))) == 2


class _Recording:
    """A user's cache: remembers what it was given."""

    def __init__(self) -> None:
        self.data: dict[str, object] = {}

    def get(self, key: str) -> object:
        return self.data.get(key)

    def set(self, key: str, value: object) -> None:
        self.data[key] = value


class _InProcess(_Recording):
    holds_objects = True


def test_a_cache_gets_what_its_contract_says_dicts_by_default_objects_when_it_holds_them() -> None:
    from llama_index_hyde_plus import HyDE
    from llama_index_hyde_plus.testing import ScriptedLLM
    from llama_index_hyde_plus.transforms.base import TransformResult

    plain, in_process = _Recording(), _InProcess()
    for cache in (plain, in_process):
        t = HyDE(ScriptedLLM(["a passage."] * 2), cache=cache)  # type: ignore[arg-type]
        assert not t.transform("q").cached and t.transform("q").cached
    (stored,) = plain.data.values()
    assert isinstance(stored, dict) and stored["hypothetical"] == ["a passage."]
    (held,) = in_process.data.values()
    assert isinstance(held, TransformResult) and held.hypothetical == ("a passage.",)


@pytest.mark.parametrize("kind", ["other-columns", "user-version", "application-id"])
def test_another_programs_database_is_never_changed(tmp_path: Path, kind: str) -> None:
    """A SQLite file that is not this cache's (a ``results`` table of other columns, or
    an empty database a program has stamped) is not switched to WAL nor given a table."""
    path = tmp_path / "transforms.sqlite"
    other = sqlite3.connect(path)
    if kind == "other-columns":
        other.execute("CREATE TABLE results (run TEXT, score REAL)")
        other.execute("INSERT INTO results VALUES ('a', 1.0)")
    else:
        other.execute(f"PRAGMA {kind.replace('-', '_')} = 7")
    other.commit()
    other.close()
    before = path.read_bytes()
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") is None
    cache.close()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transforms.sqlite"]


_POISONS = {
    "queries-a-string": ("queries", "POISON"),
    "queries-not-strings": ("queries", [1, 2, None]),
    "passage-not-a-string": ("hypothetical", [{"text": "a passage."}]),
    "passages-a-string": ("hypothetical", "a passage."),
    "usage-not-counts": ("usage", {"calls": "one"}),
    "query-missing": ("query", None),
    "queries-missing": ("queries", None),
}


def _caches(tmp_path: Path) -> dict[str, Any]:
    from llama_index.core.storage.kvstore.simple_kvstore import SimpleKVStore

    from llama_index_hyde_plus.caching.kv_cache import KVStoreCache

    return {
        "memory": MemoryCache(),
        "sqlite": SQLiteCache(tmp_path / "c.sqlite"),
        "kv": KVStoreCache(SimpleKVStore()),
    }


@pytest.mark.parametrize("backend", ["memory", "sqlite", "kv"])
@pytest.mark.parametrize("poison", sorted(_POISONS))
@pytest.mark.parametrize("method", ["hyde", "multi-query"])
@pytest.mark.parametrize("is_async", [False, True])
def test_an_entry_of_another_shape_is_a_miss_and_the_next_generation_replaces_it(
    tmp_path: Path, backend: str, poison: str, method: str, is_async: bool
) -> None:
    """A stored record whose fields are missing or of another type (a string of
    queries, a list holding non-strings, a passage that is a dict) is never served:
    the LLM is called, and what it writes replaces the entry, served from then on."""
    cache = _caches(tmp_path)[backend]
    kind = HyDE if method == "hyde" else MultiQuery
    reply = "A passage." if method == "hyde" else "first query\nsecond query"
    llm = ScriptedLLM(respond=lambda p: reply)
    transform = kind(llm, cache=cache)
    good = kind(ScriptedLLM([reply])).transform(Q).to_dict()
    field, value = _POISONS[poison]
    record = {k: v for k, v in good.items() if k != field}
    if value is not None:
        record[field] = value
    cache.set(transform.cache_key_for(Q), record)

    def run() -> Any:
        return asyncio.run(transform.atransform(Q)) if is_async else transform.transform(Q)

    first = run()
    assert not first.cached and not first.fallback and len(llm.prompts) == 1
    assert all(isinstance(q, str) for q in (*first.queries, *first.hypothetical))
    second = run()
    assert second.cached and len(llm.prompts) == 1
    assert (second.queries, second.hypothetical) == (first.queries, first.hypothetical)


def _damaged_wal_database(path: Path, stamp: int | None) -> dict[str, bytes]:
    """A SQLite database in WAL mode with its ``-wal`` and ``-shm`` beside it (as a
    program that is running, or was killed, leaves them), whose schema page is damaged
    after the file header (kept: it names the owner). ``stamp``: its application id.
    Returns every file's bytes."""
    source = path.with_name("source.db")
    conn = sqlite3.connect(source)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    if stamp is not None:
        conn.execute(f"PRAGMA application_id = {stamp}")
    conn.execute("CREATE TABLE contacts (name TEXT)")
    conn.execute("INSERT INTO contacts VALUES ('Ada')")
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(FULL)")
    conn.execute("INSERT INTO contacts VALUES ('Grace')")  # this one only in the -wal
    conn.commit()
    for suffix in ("", "-wal", "-shm"):  # copied while open: the -wal and -shm exist
        Path(f"{path}{suffix}").write_bytes(Path(f"{source}{suffix}").read_bytes())
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{source}{suffix}").unlink(missing_ok=True)
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[100:page] = b"\xa5" * (page - 100)  # the schema's b-tree, not the header
    path.write_bytes(bytes(data))
    return {p.name: p.read_bytes() for p in path.parent.iterdir()}


@pytest.mark.parametrize("stamp", [None, 7], ids=["unmarked", "another-application-id"])
def test_another_programs_damaged_database_and_its_wal_are_left_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stamp: int | None
) -> None:
    """A damaged database the cache cannot show to be its own (no owner marker in its
    header) is never renamed, replaced or written, nor are its ``-wal`` and ``-shm``:
    the cache is off, with one warning."""
    caplog.set_level(logging.WARNING, logger="llama_index_hyde_plus")
    path = tmp_path / "app.db"
    before = _damaged_wal_database(path, stamp)
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") is None and len(cache) == 0
    cache.close()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "left untouched" in warnings[0], warnings


def test_serve_with_another_programs_damaged_database_as_cache_leaves_it_untouched(
    tmp_path: Path,
) -> None:
    import rcp

    from .conftest import Served, says

    path = tmp_path / "app.db"
    before = _damaged_wal_database(path, None)
    served = Served("--llm", "scripted", "--cache", str(path))
    try:
        reply = rcp.connect_http(served.url).transform(Q, "hyde")
        assert reply["hypothetical"]  # the search is answered without the cache
    finally:
        log = served.stop()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert says(log, "left untouched")


def test_a_damaged_database_marked_as_the_caches_own_is_moved_aside(tmp_path: Path) -> None:
    """The owner marker in the header is what makes a damaged database the cache's to
    move aside, whatever its tables: it is moved, and a fresh cache started."""
    from llama_index_hyde_plus.caching.cache import APPLICATION_ID

    path = tmp_path / "c.sqlite"
    _damaged_wal_database(path, APPLICATION_ID)
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") == {"x": 1}
    cache.close()
    aside = [p for p in tmp_path.glob("c.sqlite.corrupt-*") if not p.name.endswith(("wal", "shm"))]
    assert len(aside) == 1


def test_a_new_cache_carries_the_owner_marker_in_its_header(tmp_path: Path) -> None:
    from llama_index_hyde_plus.caching.cache import APPLICATION_ID

    path = tmp_path / "c.sqlite"
    SQLiteCache(path).set("k", {"x": 1})
    assert int.from_bytes(path.read_bytes()[68:72], "big") == APPLICATION_ID


def test_a_cache_written_before_the_marker_is_kept_and_marked(tmp_path: Path) -> None:
    """A healthy database holding only this cache's table and no marker (an older
    version's cache) is still the cache's: its entries are served, and it is marked."""
    from llama_index_hyde_plus.caching.cache import APPLICATION_ID

    path = tmp_path / "c.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE results (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
    )
    old.execute("INSERT INTO results VALUES ('k', '{\"x\": 1}', ?)", (time.time(),))
    old.commit()
    old.close()
    cache = SQLiteCache(path)
    assert cache.get("k") == {"x": 1}
    cache.close()
    assert int.from_bytes(path.read_bytes()[68:72], "big") == APPLICATION_ID


class _CountingLLM(ScriptedLLM):
    """An LLM that keeps mutable state of its own, as providers' wrappers do: a call
    counter and usage statistics, changed by every call."""

    calls_made: int = 0
    usage_stats: dict[str, int] = {}

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self._count(prompt)
        return super().complete(prompt, formatted=formatted, **kwargs)

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self._count(prompt)
        return await super().acomplete(prompt, formatted=formatted, **kwargs)

    def _count(self, prompt: str) -> None:
        self.calls_made += 1
        words = self.usage_stats.get("prompt_words", 0) + len(prompt.split())
        self.usage_stats = {**self.usage_stats, "prompt_words": words}


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("kind", [HyDE, MultiQuery])
async def test_an_llm_with_a_call_counter_gets_a_hit_on_a_repeated_question(
    use_async: bool, kind: type
) -> None:
    """The key reads the documented settings, not the LLM object's whole state: a
    counter or usage statistics the LLM updates on every call never make a miss."""
    llm = _CountingLLM(respond=lambda p: "first query\nsecond query")
    transform = kind(llm, cache=MemoryCache())
    run = transform.atransform if use_async else None
    first = await run(Q) if run else transform.transform(Q)
    again = await run(Q) if run else transform.transform(Q)
    assert not first.cached and again.cached and llm.calls_made == 1
    assert llm.usage_stats["prompt_words"] > 0


def test_the_key_holds_the_documented_settings_and_nothing_else_of_the_llm() -> None:
    """Each of a few documented settings changes the key; a field outside the list
    (the harness's own, a counter) does not; other models and classes never share."""
    from llama_index_hyde_plus.caching.keys import LLM_SETTINGS

    base = HyDE(ScriptedLLM()).cache_key_for(Q)
    for name, value in [("system_prompt", "Be brief."), ("stop_token", "\n")]:
        assert name in LLM_SETTINGS
        llm = ScriptedLLM()
        object.__setattr__(llm, name, value)
        assert HyDE(llm).cache_key_for(Q) != base, name
    assert HyDE(ScriptedLLM(delay=0.01, record=False)).cache_key_for(Q) == base
    assert HyDE(_CountingLLM(calls_made=9)).cache_key_for(Q) != base  # another class
    assert HyDE(_CountingLLM(calls_made=9)).cache_key_for(Q) == HyDE(_CountingLLM()).cache_key_for(
        Q
    )


def test_another_programs_database_with_its_tables_in_a_wal_journal_is_left_untouched(
    tmp_path: Path,
) -> None:
    """A healthy database whose tables are still only in its ``-wal`` (its program is
    running, or was killed) looks empty in its main file: it is not recovered,
    checkpointed or written, and the ``-wal`` and ``-shm`` stay as they are."""
    source, path = tmp_path / "src" / "app.db", tmp_path / "app.db"
    source.parent.mkdir()
    conn = sqlite3.connect(source)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE contacts (name TEXT)")
    conn.commit()
    for suffix in ("", "-wal", "-shm"):  # copied while open: the -wal holds the table
        Path(f"{path}{suffix}").write_bytes(Path(f"{source}{suffix}").read_bytes())
    conn.close()
    before = {p.name: p.read_bytes() for p in tmp_path.glob("app.db*")}
    cache = SQLiteCache(path)
    cache.set("k", {"x": 1})
    assert cache.get("k") is None
    cache.close()
    assert {p.name: p.read_bytes() for p in tmp_path.glob("app.db*")} == before
