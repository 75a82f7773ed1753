"""A damaged cache file that was moved aside is not an outage: the read or write that
found it and the ones after it go to the fresh file at once; a real outage (a file
locked by another process) is still skipped, then probed once; what was moved aside
is kept as it was, and a file the cache cannot show to be its own is never replaced."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from llama_index_hyde_plus import HyDE, SQLiteCache
from llama_index_hyde_plus.testing import ScriptedLLM

Q = "Why did revenue drop?"


def _filled(path: Path, entries: int = 300) -> None:
    """A cache of several MB (more than one connection's page cache) at ``path``,
    checkpointed: every entry is in the main file."""
    cache = SQLiteCache(path)
    for i in range(entries):
        cache.set(f"k{i}", {"i": i, "pad": "x" * 3000})
    cache.close()


def _damage_second_half(path: Path) -> None:
    """The second half of the file overwritten with garbage (the header, with its owner
    marker, and the schema kept): what a bad disk or a torn copy leaves, found only
    when a read reaches those pages (the latest entries are there)."""
    data = path.read_bytes()
    half = len(data) // 2
    path.write_bytes(data[:half] + b"\xa5" * (len(data) - half))


def _damage_all_but_the_schema(path: Path) -> None:
    """Every page after the first (the header and the schema) overwritten: any
    lookup meets the damage."""
    data = path.read_bytes()
    page = int.from_bytes(data[16:18], "big")
    path.write_bytes(data[:page] + b"\xa5" * (len(data) - page))


def _truncate_to_half(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _aside(folder: Path) -> dict[str, bytes]:
    """The files moved aside (a damaged database, its ``-wal`` and ``-shm`` when
    there were any) and their bytes."""
    return {p.name: p.read_bytes() for p in folder.glob("*.corrupt-*")}


def _databases(aside: dict[str, bytes]) -> list[str]:
    return [name for name in aside if not name.endswith(("-wal", "-shm"))]


@pytest.mark.parametrize(
    "hurt", [_damage_second_half, _damage_all_but_the_schema, _truncate_to_half]
)
def test_after_a_read_finds_the_file_damaged_the_next_read_and_write_use_the_fresh_file(
    tmp_path: Path, hurt: Callable[[Path], None]
) -> None:
    path = tmp_path / "c.sqlite"
    _filled(path)
    cache = SQLiteCache(path, busy_timeout_s=5.0)  # an outage would skip it for 5 s
    assert cache.get("k0") == {"i": 0, "pad": "x" * 3000}  # its connection is open
    hurt(path)
    assert cache.get("k299") is None  # damaged: moved aside, the fresh file has nothing
    aside = _aside(tmp_path)
    assert len(_databases(aside)) == 1
    SQLiteCache(path).set("k299", {"i": "fresh"})  # another instance fills the fresh file
    assert cache.get("k299") == {"i": "fresh"}  # at once, not skipped as an outage
    cache.set("k1", {"i": "new"})
    assert cache.get("k1") == {"i": "new"}
    assert SQLiteCache(path).get("k1") == {"i": "new"}
    cache.close()
    assert _aside(tmp_path) == aside  # kept, never written


def test_a_search_after_a_damaged_read_is_served_from_the_fresh_file_without_the_llm(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite"
    _filled(path)
    llm = ScriptedLLM(respond=lambda p: "Enterprise renewals slipped.")
    HyDE(llm, cache=SQLiteCache(path)).transform(Q)  # stored last: in the second half
    cache = SQLiteCache(path, busy_timeout_s=5.0)  # an outage would skip it for 5 s
    hyde = HyDE(llm, cache=cache)
    _damage_all_but_the_schema(path)
    first = hyde.transform(Q)  # the read meets the damage: a miss, then written afresh
    assert not first.cached and len(llm.prompts) == 2
    assert len(_databases(_aside(tmp_path))) == 1
    second = hyde.transform(Q)
    assert second.cached and len(llm.prompts) == 2


def test_a_read_that_meets_the_file_another_instance_moved_aside_serves_the_fresh_file(
    tmp_path: Path,
) -> None:
    """Two instances (two processes) share the file; one finds it damaged, moves it
    aside and writes to the fresh one. The other's connection still has the old file
    open: its first read serves the fresh file, its writes land there, and the file
    moved aside is never written."""
    path = tmp_path / "c.sqlite"
    _filled(path)
    first, second = (SQLiteCache(path, busy_timeout_s=5.0) for _ in range(2))
    assert first.get("k0") is not None and second.get("k0") is not None
    _damage_second_half(path)
    assert first.get("k299") is None
    aside = _aside(tmp_path)
    assert len(_databases(aside)) == 1
    first.set("k299", {"i": "fresh"})
    assert second.get("k299") == {"i": "fresh"}
    second.set("k7", {"i": "second"})
    assert first.get("k7") == {"i": "second"}
    first.close()
    second.close()
    assert _aside(tmp_path) == aside


def test_an_instance_whose_file_was_moved_aside_by_another_uses_the_fresh_file(
    tmp_path: Path,
) -> None:
    """Another process moved the file aside (its damage lies where this instance never
    reads) and started a fresh one: this instance's next write lands in the fresh
    file, its reads no longer serve the file moved aside, and that file is not written."""
    path = tmp_path / "c.sqlite"
    _filled(path)
    cache = SQLiteCache(path)
    assert cache.get("k0") is not None
    aside = path.with_name("c.sqlite.corrupt-1-other")
    for suffix in ("", "-wal", "-shm"):  # as another process's quarantine does
        Path(f"{path}{suffix}").replace(f"{aside}{suffix}")
    kept = aside.read_bytes()
    SQLiteCache(path).set("k9", {"i": "fresh"})
    cache.set("k1", {"i": "new"})
    assert SQLiteCache(path).get("k1") == {"i": "new"}
    assert cache.get("k0") is None  # only in the file moved aside
    assert cache.get("k9") == {"i": "fresh"}
    cache.close()
    assert aside.read_bytes() == kept


def test_a_journal_cut_short_under_an_open_connection_is_reopened_by_the_probe(
    tmp_path: Path,
) -> None:
    """Another process's ``-wal`` truncated while this instance has it open: its reads
    fail with an I/O error (a short read) on that connection however often they are
    tried; the probe after the outage opens the file afresh, SQLite recovers what the
    journal still holds, and the cache serves and stores again."""
    path = tmp_path / "c.sqlite"
    cache = SQLiteCache(path, busy_timeout_s=0.2)
    assert cache.get("k0") is None  # its connection is open
    other = SQLiteCache(path)
    for i in range(50):
        other.set(f"k{i}", {"i": i, "pad": "y" * 2000})
    wal = Path(f"{path}-wal")
    with wal.open("r+b") as handle:
        handle.truncate(wal.stat().st_size // 2)
    assert cache.get("k49") is None  # an outage
    other.close()
    time.sleep(0.3)
    assert cache.get("k1") == {"i": 1, "pad": "y" * 2000}  # the probe, on a new connection
    cache.set("new", {"ok": 1})
    assert cache.get("new") == {"ok": 1}


def _foreign_damaged(path: Path) -> bytes:
    """Another program's database (its own tables, no owner marker) of a few MB, its
    second half damaged: its bytes."""
    source = path.with_name("notes.db")
    conn = sqlite3.connect(source)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.executemany("INSERT INTO notes VALUES (?)", [("n" * 3000,)] * 300)
    conn.commit()
    conn.close()
    _damage_second_half(source)
    data = source.read_bytes()
    source.unlink()
    return data


def test_a_damaged_file_without_the_owner_marker_found_by_a_read_is_left_untouched(
    tmp_path: Path,
) -> None:
    """The file under an open cache is overwritten by another program's damaged
    database: the calls that find it neither move it nor start a new file there, nor
    write it, and the cache is skipped."""
    path = tmp_path / "c.sqlite"
    _filled(path)
    cache = SQLiteCache(path)
    assert cache.get("k0") is not None
    path.write_bytes(_foreign_damaged(path))
    before = path.read_bytes()
    for i in (299, 150, 1):
        assert cache.get(f"k{i}") is None
        cache.set(f"k{i}", {"i": "new"})
    time.sleep(0.6)  # past the outage: probed again, still not ours
    assert cache.get("k1") is None
    cache.set("k2", {"i": "new"})
    cache.close()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sqlite"]


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)")
conn.execute("INSERT OR REPLACE INTO results VALUES ('k', '{\\"x\\": 1}', 1e12)")
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_file_locked_by_another_process_is_skipped_then_probed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.sqlite"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        cache = SQLiteCache(path, busy_timeout_s=0.2)
        tries = [0]
        opened = SQLiteCache._open

        def counted(self: SQLiteCache) -> sqlite3.Connection:
            tries[0] += 1
            return opened(self)

        monkeypatch.setattr(SQLiteCache, "_open", counted)
        assert cache.get("k") is None  # waited for the lock, failed: an outage
        assert tries[0] == 1
        assert cache.get("k") is None and cache.get("k") is None  # skipped
        assert tries[0] == 1
        time.sleep(0.3)
        assert cache.get("k") is None  # the one probe: still locked
        assert cache.get("k") is None  # skipped again
        assert tries[0] == 2
    finally:
        holder.stdin.close()
        holder.wait(10)
    time.sleep(0.3)
    assert cache.get("k") == {"x": 1}  # the lock is gone: the probe reads
    assert tries[0] == 3
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_fresh_file_another_instance_put_in_place_during_the_check_is_never_moved_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.sqlite"
    _filled(path)
    cache = SQLiteCache(path, busy_timeout_s=5.0)
    assert cache.get("k0") is not None  # its connection is open
    _damage_all_but_the_schema(path)
    checked = SQLiteCache._still_corrupt

    def another_repairs_it_meanwhile(self: SQLiteCache) -> bool:
        damaged = checked(self)
        path.replace(tmp_path / "c.sqlite.corrupt-by-the-other")  # as its _move_aside does
        SQLiteCache(path).set("k1", {"i": "fresh"})  # and its fresh file
        monkeypatch.setattr(SQLiteCache, "_still_corrupt", checked)
        return damaged

    monkeypatch.setattr(SQLiteCache, "_still_corrupt", another_repairs_it_meanwhile)
    assert cache.get("k1") == {"i": "fresh"}  # the read runs again on the fresh file
    assert list(tmp_path.glob("*.corrupt-1*")) == []  # this instance moved nothing aside
    assert SQLiteCache(path).get("k1") == {"i": "fresh"}


def test_another_programs_database_holding_only_a_view_is_never_taken_over(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite"
    own = sqlite3.connect(path)
    own.execute("CREATE VIEW answers AS SELECT 42 AS answer")
    own.commit()
    own.close()
    before = path.read_bytes()
    cache = SQLiteCache(path)
    cache.set("k", {"v": 1})
    assert cache.get("k") is None  # not this cache's file: skipped, never written
    cache.close()
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists()
